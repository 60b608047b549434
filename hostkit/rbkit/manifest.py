"""Per-file manifests: made on the source, checked on the target, in parallel.

A manifest is built from a tree's walk (statwalk.py) and written as JSON lines (manifestfile.py:
the format, load and save); this module builds one, checks a tree against one (`verify`, the
quick stat-level `quick_check`), says what a re-run can link from the last install (`linkable`,
`delta`) and what the install records of its source (`relocated`, `source_of`).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, Optional

from rbrules import owners
from rbrules.shown import shown

from . import manifestfile, statwalk
from .filehash import digests


def relocatable(rel: str) -> bool:
    """What relocation may rewrite (bin/*, pyvenv.cfg): its installed content is not the source's,
    so an incremental install never reuses its digest nor links it from the previous install."""
    return rel == "pyvenv.cfg" or rel.startswith("bin/")


def linkable(old: Optional[dict], new: dict) -> bool:
    """Whether a file recorded as `old` (by an earlier install or an earlier source manifest) can
    stand for `new` unread: same digest, type, mode, size and mtime, and not relocatable."""
    # manifestfile.QUICK_KEYS written out: this runs once per file of a tree on every incremental
    # re-run
    return (
        old is not None
        and new["t"] == "f"
        and bool(new.get("h"))
        and old.get("h") == new["h"]
        and old.get("t") == "f"
        and old.get("m") == new.get("m")
        and old.get("s") == new.get("s")
        and old.get("mt") == new.get("mt")
        and not relocatable(new["p"])
    )


def delta(new: dict, base: dict) -> dict:
    """What a host whose install came from `base` (unchanged since) still needs to hold `new`:
    every directory, symlink and relocatable file, and each file not `linkable` from `base`. The
    same rule as `linkstage.stage`, so a host installed from `base` asks for a subset of this."""
    if new["header"].get("algo") != base["header"].get("algo") or new["header"]["algo"] == "none":
        return {
            "usable": False,
            "send": [e["p"] for e in new["entries"]],
            "why": "the last fan-out's manifest has digests of another algorithm (or none)",
        }
    before = {e["p"]: e for e in base["entries"]}
    send, same = [], []
    for entry in new["entries"]:
        (same if linkable(before.get(entry["p"]), entry) else send).append(entry)
    files = [e for e in send if e["t"] == "f"]
    return {
        "usable": True,
        "send": [e["p"] for e in send],
        "send_entries": len(send),
        "send_files": len(files),
        "send_bytes": sum(e["s"] for e in files),
        "unchanged_files": len(same),
        "unchanged_bytes": sum(e["s"] for e in same),
        "removed": len(set(before) - {e["p"] for e in new["entries"]}),
    }


def quick_check(root: str, installed: dict, source_stat: str, tree: Optional[dict] = None) -> dict:
    """Re-run check without reading file contents, like rsync's default: the source's stat
    fingerprint must equal the one recorded at install time, and every entry at `root` must still
    have the path, type, mode, size, link target and mtime the install recorded (`tree`: that
    check_tree result, when it was taken already)."""
    recorded = installed["header"].get("source_stat_fingerprint")
    if recorded != source_stat:
        return {"ok": False, "why": "the source changed since the install (or was never recorded)"}
    result = dict(tree) if tree is not None else check_tree(root, installed)
    if result["ok"]:
        result["why"] = "same source, destination unchanged (stat check)"
    return result


def check_tree(root: str, installed: dict) -> dict:
    """Whether every entry at `root` still has the path, type, mode, size, link target and mtime
    that `installed` (the manifest the install recorded) says, and is proven ours (owned by this
    user or root, writable by no other: rbrules.proven; `not_ours` says why not); no reading of
    contents."""
    patterns = installed["header"].get("excludes", ())
    want = {e["p"]: e for e in installed["entries"]}
    changed = []
    not_ours = []
    uid = os.geteuid()
    # in the order the directories give; what is compared is keyed by path
    for rel, st in statwalk.walk(root, patterns, ordered=False):
        wanted = want.pop(rel, None)
        stat_row = manifestfile.stat_values(root, rel, st)
        why = owners.why_not_ours(rel, st, uid)
        if why is not None:
            # another user owns it or can write it: whatever its stat says, not the install's
            not_ours.append(why)
            changed.append(rel)
        elif wanted is None or stat_row[1:] != (
            wanted.get("t"),
            wanted.get("m"),
            wanted.get("s"),
            wanted.get("l"),
            wanted.get("mt"),
        ):
            changed.append(rel)
    changed.extend(want)
    changed.sort()
    if changed:
        why = f"{len(changed)} entries changed at the destination"
        if not_ours:
            why += f" ({len(not_ours)} of them owned or writable by another user)"
        return {"ok": False, "why": why, "changed": changed[:20], "not_ours": sorted(not_ours)[:20]}
    return {"ok": True, "why": "unchanged since the install (stat check)"}


def build(
    root: str,
    patterns: Iterable[str] = (),
    algo: str = "sha256",
    jobs: int = 4,
    reuse: Optional[dict] = None,
    *,
    strip_special: bool = False,
    scanned: Optional[str] = None,
) -> dict:
    """Scan and hash `root`; returns {"header", "entries", "totals", "reused"}.

    With `reuse` (the manifest an earlier install recorded), a file whose type, mode, size and
    mtime equal its entry there takes that entry's digest unread (rsync's quick check: the same
    trust as `rerun: quick`); relocatable files are always read. With `strip_special`, modes are
    recorded without SPECIAL_BITS (transfer.special_modes: strip). With `scanned` (the scan
    record this run's preflight wrote, hostfs.scan), the entries are the ones that scan saw and
    listed for tar, not walked again (totals' disk_bytes is then None: the scan reported it); a
    file read with another size than seen raises Changed."""
    entries, disk = [], 0
    patterns = list(patterns)
    body = manifestfile.read_scan(scanned, root, patterns, strip_special) if scanned else None
    if body is not None:
        rows = body.split(b"\n")  # a name's newline is escaped in its JSON
        if rows[-1] == b"":
            rows.pop()
        values = json.loads(b"[" + b",".join(rows) + b"]")
        entries = [manifestfile.entry_from(v) for v in values]
        stat_fp = hashlib.sha256(body).hexdigest()
        disk = None
        del body, rows, values
    else:
        lines = []
        for rel, st in statwalk.walk(root, patterns):
            # the entry (without_special'd with strip_special) and its stat_line, from one set
            # of stat values: the install records the lines' sha256 as its source's stat
            stat_row = manifestfile.stat_values(root, rel, st, strip_special)
            lines.append(manifestfile.values_line(stat_row))
            entries.append(manifestfile.entry_from(stat_row))
            disk += st.st_blocks * 512
        stat_fp = hashlib.sha256(b"".join(lines)).hexdigest()
        del lines
    files = [e for e in entries if e["t"] == "f"]
    reused = 0
    if algo != "none":
        before = {}
        if reuse is not None and reuse["header"].get("algo") == algo:
            before = {e["p"]: e for e in reuse["entries"] if e.get("t") == "f" and e.get("h")}
        todo = []
        for file in files:
            old = before.get(file["p"])
            if (
                old
                and not relocatable(file["p"])
                and all(old.get(k) == file.get(k) for k in manifestfile.QUICK_KEYS)
            ):
                file["h"] = old["h"]
                reused += 1
            else:
                todo.append(file)
        for file, hexdigest in zip(
            todo, digests(root, [e["p"] for e in todo], algo, jobs, [e["s"] for e in todo])
        ):
            file["h"] = hexdigest
    totals = {
        "entries": len(entries),
        "files": len(files),
        "dirs": sum(1 for e in entries if e["t"] == "d"),
        "links": sum(1 for e in entries if e["t"] == "l"),
        "other": sum(1 for e in entries if e["t"] == "?"),
        "bytes": sum(e["s"] for e in files),
        "disk_bytes": disk,
    }
    header = {
        "schema": manifestfile.SCHEMA,
        "kind": "rb-manifest",
        "algo": algo,
        "excludes": list(patterns),
    }
    if strip_special:
        header["strip_special"] = True
    header["stat_fingerprint"] = stat_fp
    return {"header": header, "entries": entries, "totals": totals, "reused": reused}


def _is_inode(st: os.stat_result, path: str) -> bool:
    """Whether `path` (not followed) is the inode `st` describes (the walk's lstat of a staging
    file: one lstat less per linked file)."""
    try:
        other = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def verify(
    root: str,
    manifest: dict,
    jobs: int = 4,
    limit: int = 50,
    linked_from: Optional[str] = None,
    received: Optional[dict] = None,
    linked_inodes: Optional[dict] = None,
) -> dict:
    """Compare the tree at `root` with `manifest`; every difference is listed (up to `limit`).
    With `linked_from`, a file that is a hard link of the same path there (an incremental install's
    staging: unchanged files linked from the previous install) is checked by stat, not read;
    `linked_inodes` ({path: (st_dev, st_ino)}, what the stage that linked them recorded), a file
    that is still the inode linked is such a link without a look at `linked_from`.
    With `received` ({path: [digest, inode, ctime_ns, size]}: what the receiving end hashed from
    the stream and the inode it wrote), a file that still has that inode, ctime and size is
    checked by that digest, not read (`streamed`); any other file is read and hashed."""
    algo = manifest["header"]["algo"]
    want = {e["p"]: e for e in manifest["entries"]}
    received = received or {}
    extra: list[str] = []
    seen: set = set()
    differ: list[dict] = []
    to_hash = []
    linked = streamed = 0
    # one pass, in the order the directories give (what is compared is keyed by path); what the
    # move excluded (caches: __pycache__, *.pyc) may appear once the venv has run there
    for rel, st in statwalk.walk(root, manifest["header"].get("excludes", ()), ordered=False):
        wanted = want.get(rel)
        if wanted is None:
            extra.append(rel)
            continue
        seen.add(rel)
        stat_row = manifestfile.stat_values(root, rel, st)
        kind = stat_row[1]
        expected = (wanted.get("t"), wanted.get("m"), wanted.get("s"), wanted.get("l"))
        if expected != stat_row[1:5]:
            key, want_v, value = next(
                d for d in zip(("t", "m", "s", "l"), expected, stat_row[1:5]) if d[1] != d[2]
            )
            differ.append({"p": rel, "what": key, "want": want_v, "have": value})
        elif kind == "f" and algo != "none":
            if linked_from and (
                (st.st_dev, st.st_ino) == linked_inodes.get(rel)
                if linked_inodes is not None
                else _is_inode(st, os.path.join(linked_from, rel))
            ):
                linked += 1
                continue
            got = received.get(rel)
            if got and got[0] and got[1:] == [st.st_ino, st.st_ctime_ns, st.st_size]:
                streamed += 1
                if wanted.get("h") != got[0]:
                    differ.append(
                        {"p": rel, "what": "content", "want": wanted.get("h"), "have": got[0]}
                    )
                continue
            to_hash.append(wanted)
    if to_hash:
        for wanted, hexdigest in zip(to_hash, digests(root, [w["p"] for w in to_hash], algo, jobs)):
            if wanted.get("h") != hexdigest:
                differ.append(
                    {
                        "p": wanted["p"],
                        "what": "content",
                        "want": wanted.get("h"),
                        "have": hexdigest,
                    }
                )
    missing = sorted(set(want) - seen) if len(seen) != len(want) else []
    extra.sort()
    ok = not (missing or extra or differ)
    return {
        "ok": ok,
        "algo": algo,
        "checked": len(want),
        "hashed": len(to_hash),
        "linked": linked,
        "streamed": streamed,
        "missing": missing[:limit],
        "extra": extra[:limit],
        "differ": sorted(differ, key=lambda d: d["p"])[:limit],
        "counts": {"missing": len(missing), "extra": len(extra), "differ": len(differ)},
    }


def describe(result: dict) -> list[str]:
    """The differences of a check, a line each, for a person: names (and link targets) shown
    escaped (rbrules.shown)."""
    lines = []
    for rel in result["missing"]:
        lines.append(f"missing: {shown(rel)}")
    for rel in result["extra"]:
        lines.append(f"extra:   {shown(rel)}")
    for diff in result["differ"]:
        lines.append(
            f"differs: {shown(diff['p'])} ({diff['what']}: expected {shown(str(diff['want']))}, "
            f"found {shown(str(diff['have']))})"
        )
    counts = result["counts"]
    listed = len(lines)
    total = counts["missing"] + counts["extra"] + counts["differ"]
    if total > listed:
        lines.append(f"... and {total - listed} more")
    return lines


# what `relocated` adds to a source manifest's header; `source_of` takes them out again
INSTALLED_STAT = "installed_stat_fingerprint"
SOURCE_KEYS = ("source_fingerprint", "source_stat_fingerprint", "source_entries", INSTALLED_STAT)


def relocated(manifest: dict, changes: dict[str, dict], source_fingerprint: Optional[str]) -> dict:
    """The manifest of the installed tree: `manifest` with relocation's rewritten entries, and in
    its header what the source was (for re-runs): its fingerprints, and the source's own entries
    of the rewritten files, so that `source_of` can give back `manifest` itself; and the stat
    fingerprint of these entries (INSTALLED_STAT): the sha256 of `tree_stat`'s lines of the
    installed tree while it is as installed (relocation keeps each file's mtime), so that one
    walk proves an install unchanged without reading its entries (liveplan, EarlyCheck)."""
    entries = [dict(e, **changes.get(e["p"], {})) for e in manifest["entries"]]
    header = {k: v for k, v in manifest["header"].items() if k != "stat_fingerprint"}
    # the stat fingerprint `build` took of these entries, where it is there (it is theirs by
    # construction: the source's engine wrote both), else taken now
    stat_fp = manifest["header"].get("stat_fingerprint") or manifestfile.stat_fingerprint(
        manifest["entries"]
    )
    header.update(
        source_fingerprint=source_fingerprint,
        source_stat_fingerprint=stat_fp,
        source_entries=[e for e in manifest["entries"] if e["p"] in changes],
    )
    header[INSTALLED_STAT] = manifestfile.stat_fingerprint(entries)
    return {"header": header, "entries": entries, "totals": manifest["totals"]}


def source_of(installed: dict) -> Optional[dict]:
    """The source's manifest as of the install, from the install's own manifest: the rewritten
    files' source entries put back, the header without what `relocated` added. None when the
    install did not record them (an older kit). Whether it is that manifest is the caller's to
    check: its fingerprint (`fingerprint`, or what `save` returns) against the one recorded."""
    header = installed["header"]
    kept = header.get("source_entries")
    if not isinstance(kept, list) or not all(isinstance(e, dict) and "p" in e for e in kept):
        return None
    by_path = {e["p"]: e for e in kept}
    manifest = {
        "header": {k: v for k, v in header.items() if k not in SOURCE_KEYS},
        "entries": [by_path.get(e["p"], e) for e in installed["entries"]],
        "totals": installed["totals"],
    }
    return manifest
