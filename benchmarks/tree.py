"""Is the copy right? Compare a destination tree with its source, with the project's own manifest
code.

Every entry must be there with the same type (a symlink stays a symlink), mode, link target, size
and sha256 of its contents. A runbook relocates its install (hostkit/rbkit/relocate.py rewrites bin/
scripts and pyvenv.cfg for the new path): for those files the expected contents are the source's,
rewritten exactly as relocation defines. Modification times are reported (a note), not judged.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rbkit import filehash, manifestfile, relocate, statwalk

_SOURCES: dict[tuple[str, tuple[str, ...]], dict] = {}


def scan(root: Path, excludes: tuple[str, ...] = (), jobs: int = 2) -> dict[str, dict]:
    """{relative path: manifest entry + "mtime"} with sha256 digests of regular files."""
    out: dict[str, dict] = {}
    for rel, st in statwalk.walk(str(root), excludes):
        e = manifestfile.entry_of(str(root), rel, st)
        if e["t"] == "f":
            e["mtime"] = int(st.st_mtime)
        out[rel] = e
    files = [e for e in out.values() if e["t"] == "f"]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for e, h in zip(
            files, pool.map(lambda e: filehash.digest(os.path.join(root, e["p"]), "sha256"), files)
        ):
            e["h"] = h
    return out


def source_manifest(root: Path, excludes: tuple[str, ...] = ()) -> dict:
    """The source's scan (cached: payloads are read-only) and its totals."""
    key = (str(root), excludes)
    if key not in _SOURCES:
        entries = scan(root, excludes)
        files = [e for e in entries.values() if e["t"] == "f"]
        _SOURCES[key] = {
            "entries": entries,
            "totals": {
                "entries": len(entries),
                "files": len(files),
                "bytes": sum(e["s"] for e in files),
                "links": sum(1 for e in entries.values() if e["t"] == "l"),
            },
        }
    return _SOURCES[key]


@dataclass
class Verdict:
    ok: bool
    text: str  # "yes" / "no: ..." for the table
    notes: list[str] = field(default_factory=list)


def _relocated_expectations(src: Path, old: str, new: str) -> dict[str, dict]:
    """Files relocation rewrites -> their expected size and sha256 (computed from the source)."""
    want: dict[str, dict] = {}
    candidates = (
        [f"bin/{n}" for n in sorted(os.listdir(src / "bin"))] if (src / "bin").is_dir() else []
    )
    candidates.append("pyvenv.cfg")
    for rel in candidates:
        full = src / rel
        if full.is_symlink() or not full.is_file():
            continue
        data = relocate.rewrite_file(str(full), old, new)
        if data is not None:
            want[rel] = {"s": len(data), "h": hashlib.sha256(data).hexdigest()}
    return want


def compare(
    src: Path,
    dst: Path,
    *,
    excludes: tuple[str, ...] = (),
    relocated_to: str | None = None,
    limit: int = 3,
) -> Verdict:
    """Does dst hold src (minus excludes)? relocated_to: the runbook's install path (relocation
    expected). Lists up to `limit` examples of each kind of difference."""
    if not dst.is_dir():
        return Verdict(False, f"no: {dst} does not exist")
    want = source_manifest(src, excludes)["entries"]
    have = scan(dst, excludes)
    special = _relocated_expectations(src, str(src), relocated_to) if relocated_to else {}
    problems: dict[str, list[str]] = {}

    def add(kind: str, rel: str) -> None:
        problems.setdefault(kind, []).append(rel)

    for rel in sorted(set(want) - set(have)):
        add("missing", rel)
    for rel in sorted(set(have) - set(want)):
        add("extra", rel)
    mtimes = 0
    for rel in sorted(set(want) & set(have)):
        w, h = want[rel], have[rel]
        if w["t"] != h["t"]:
            add({"l": "symlink became a copy"}.get(w["t"], f"{w['t']}->{h['t']}"), rel)
        elif w["t"] == "l" and w["l"] != h["l"]:
            add("link target", rel)
        elif w.get("m") != h.get("m"):
            add("mode", rel)
        elif w["t"] == "f":
            exp = special.get(rel, w)
            if exp["s"] != h["s"] or exp["h"] != h["h"]:
                add("content", rel)
            if w["mtime"] != h["mtime"] and rel not in special:
                mtimes += 1
    notes = []
    if mtimes:
        notes.append(f"mtime not kept on {mtimes} files")
    if not relocated_to and str(src) != str(dst):
        left = relocate.check(str(dst), str(src))
        if left:
            notes.append(f"{len(left)} bin/ scripts still name the source path")
    if not problems:
        text = "yes" if not special else f"yes ({len(special)} files relocated)"
        return Verdict(True, text, notes)
    parts = []
    for kind, rels in problems.items():
        shown = ", ".join(rels[:limit]) + (", ..." if len(rels) > limit else "")
        parts.append(f"{len(rels)} {kind} ({shown})")
    return Verdict(False, "no: " + "; ".join(parts), notes)
