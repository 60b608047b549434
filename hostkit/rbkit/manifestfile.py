"""A manifest's file: JSON lines, a header, one line per entry (sorted by path), and a totals line.

Entries: {"p": path, "t": "f"|"d"|"l", "m": mode, "s": size, "h": digest} (files),
{"p", "t": "d", "m"} (dirs), {"p", "t": "l", "l": link target} (symlinks); the stat lines of a
scan (`stat_line`, `values_line`: what a walk writes, what the live plan compares), the names
lists, a manifest's fingerprint. With `strip_special` a manifest records modes without the
setuid, setgid, sticky and world-write bits (SPECIAL_BITS): what the install will hold after they
are stripped (`hostfs.strip_special`). The walk that makes the lines is statwalk.py; the
manifest built from them and checked against a tree is manifest.py.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from typing import Iterable, Optional, Tuple

from . import safefs

SCHEMA = 1
# written into an install by the install itself (its manifest, its versioned env file, the mark
# of a build whose checks failed, its record (installs.INFO)): never compared, never sent


# what an install never carries unless the spec says so out loud (transfer.special_modes: keep)
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH


QUICK_KEYS = ("t", "m", "s", "mt")  # what a stat-level comparison of two file entries uses
SCAN_SUFFIX = ".stat"  # the scan record beside a names list (hostfs.scan)
LINKS_SUFFIX = ".links"  # its files of more than one link: [index, st_dev, st_ino]


def read_header(path: str) -> Optional[dict]:
    """The header of the manifest at `path` (its first line; the rest is not read), None when it
    is not a manifest's. Opened without following a link, never a FIFO or a device."""
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        line = fh.readline()
    try:
        head = json.loads(line)
    except ValueError:
        return None
    return head if isinstance(head, dict) and head.get("kind") == "rb-manifest" else None


def entry_of(root: str, rel: str, st: os.stat_result) -> dict:
    return entry_from(stat_values(root, rel, st))


def entry_from(values: tuple) -> dict:
    """The entry whose STAT_KEYS values are `values` (stat_values): a file's mtime in whole seconds
    (what tar restores: its default format keeps seconds), no mode for a link."""
    if values[1] == "f":
        return {"p": values[0], "t": "f", "m": values[2], "s": values[3], "mt": values[5]}
    if values[1] == "l":
        return {"p": values[0], "t": "l", "l": values[4]}
    return {"p": values[0], "t": values[1], "m": values[2]}


def without_special(entry: dict) -> dict:
    """`entry` with its mode's SPECIAL_BITS cleared (links have no mode of their own)."""
    if entry.get("t") == "l" or "m" not in entry or not entry["m"] & SPECIAL_BITS:
        return entry
    return dict(entry, m=entry["m"] & ~SPECIAL_BITS)


STAT_KEYS = ("p", "t", "m", "s", "l", "mt")
# one encoder each, made once: json.dumps with options makes a new one per call (a manifest's
# lines are encoded 22k at a time); their output is json.dumps's with the same options
_ENTRY = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


_STAT = json.JSONEncoder(ensure_ascii=False)
encode_str = json.encoder.encode_basestring  # what _STAT writes for a str (ensure_ascii off)
_FILE_KEYS = frozenset(("h", "m", "mt", "p", "s", "t"))


def entry_line(entry: dict) -> str:
    """An entry as a manifest's line holds it (without the newline): json.dumps with sorted keys,
    put together here for a hashed file's usual values (str and int: faster than the encoder on a
    big tree, and every install writes two manifests of every entry)."""
    if entry.keys() == _FILE_KEYS:
        digest, mode, mtime, rel, size = entry["h"], entry["m"], entry["mt"], entry["p"], entry["s"]
        if (
            type(digest) is str
            and type(rel) is str
            and type(mode) is int
            and type(mtime) is int
            and type(size) is int
            and entry["t"] == "f"
        ):
            return '{"h": %s, "m": %s, "mt": %s, "p": %s, "s": %s, "t": "f"}' % (
                encode_str(digest),
                int.__repr__(mode),
                int.__repr__(mtime),
                encode_str(rel),
                int.__repr__(size),
            )
    return _ENTRY.encode(entry)


def stat_line(entry: dict) -> bytes:
    """JSON of the entry's STAT_KEYS values as a list, and a newline: the bytes the json module
    writes (stat fingerprints compare with those of earlier installs), put together here for the
    usual values (str, int, None: faster than the encoder on a big tree)."""
    parts = []
    for key in STAT_KEYS:
        value = entry.get(key)
        if value is None:
            parts.append("null")
        elif type(value) is str:
            parts.append(encode_str(value))
        elif type(value) is int:
            parts.append(int.__repr__(value))
        else:
            return _STAT.encode([entry.get(k) for k in STAT_KEYS]).encode() + b"\n"
    return ("[" + ", ".join(parts) + "]\n").encode()


def stat_values(root: str, rel: str, st: os.stat_result, strip: bool = False) -> tuple:
    """An entry's STAT_KEYS values as a tuple (its modes `without_special` with `strip`), from
    the walk's lstat: what entry_of, a scan and a verify of every entry of a tree take."""
    raw_mode = st.st_mode
    fmt = stat.S_IFMT(raw_mode)
    if fmt == stat.S_IFLNK:
        return (rel, "l", None, None, os.readlink(os.path.join(root, rel)), None)
    mode = raw_mode & ~SPECIAL_BITS & 0o7777 if strip else raw_mode & 0o7777
    if fmt == stat.S_IFREG:
        return (rel, "f", mode, st.st_size, None, int(st.st_mtime))
    return (rel, "d" if fmt == stat.S_IFDIR else "?", mode, None, None, None)


def values_line(values: tuple) -> bytes:
    """stat_line of the entry whose STAT_KEYS values are `values` (from stat_values): the same
    bytes."""
    if values[1] == "f":
        return (
            '[%s, "f", %d, %d, null, %d]\n'
            % (encode_str(values[0]), values[2], values[3], values[5])
        ).encode()
    if values[1] == "l":
        return (
            '[%s, "l", null, null, %s, null]\n' % (encode_str(values[0]), encode_str(values[4]))
        ).encode()
    return (
        '[%s, "%s", %d, null, null, null]\n' % (encode_str(values[0]), values[1], values[2])
    ).encode()


def stat_fingerprint(entries: Iterable[dict]) -> str:
    """sha256 over what a quick check compares (path, type, mode, size, link, mtime): no reading."""
    digester = hashlib.sha256()
    for entry in entries:
        digester.update(stat_line(entry))
    return digester.hexdigest()


def scan_header(root: str, patterns: Iterable[str], strip_special: bool) -> bytes:
    """The first line of a scan record (hostfs.scan): what the walk was of, and how."""
    return (
        json.dumps(
            {
                "kind": "rb-scan",
                "root": root,
                "excludes": list(patterns),
                "strip_special": bool(strip_special),
            },
            sort_keys=True,
        )
        + "\n"
    ).encode()


def read_scan(
    path: str, root: str, patterns: Iterable[str], strip_special: bool
) -> Optional[bytes]:
    """The stat lines (values_line's, in the walk's order) of a scan record hostfs.scan wrote
    for this very walk (same root, excludes and strip rule); None when there is none, or it is of
    another walk."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as fh:
        data = fh.read()
    head, _, body = data.partition(b"\n")
    if head + b"\n" != scan_header(root, patterns, strip_special):
        return None
    return body


def _body(entries: list) -> str:
    """The entry lines of a manifest, each ended by a newline: what its fingerprint is of."""
    lines = [entry_line(e) for e in entries]
    return "\n".join(lines) + "\n" if lines else ""


def dump(manifest: dict, out) -> str:
    """Write `manifest` as JSON lines to `out`; returns its fingerprint (of the lines written)."""
    body = _body(manifest["entries"])
    out.write(json.dumps(manifest["header"], sort_keys=True) + "\n")
    out.write(body)
    out.write(json.dumps({"totals": manifest["totals"]}, sort_keys=True) + "\n")
    return hashlib.sha256(body.encode()).hexdigest()


def save(manifest: dict, path: str, mode: int = 0o644, *, sync: bool = True) -> str:
    """Write `manifest` to `path` (e.g. an install's `.rb-manifest.jsonl`) through a new temp
    file and one rename: a link at `path` is replaced, never written through (`sync`: flushed to
    disk before the rename; a run's private copy need not be). Returns its fingerprint."""
    buf = io.StringIO()
    fp = dump(manifest, buf)
    safefs.write_file(path, buf.getvalue().encode("utf-8"), mode, sync=sync)
    return fp


def load(path: str) -> dict:
    return load_fingerprinted(path)[0]


def load_fingerprinted(path: str) -> Tuple[dict, str]:
    """`load`, and the manifest's fingerprint taken from its entry lines as they are written: for
    a file `dump` wrote (every manifest the kit writes) that is `fingerprint` of its entries,
    without encoding each entry again; for one written otherwise, the fingerprint of its bytes
    (equal fingerprints still mean equal entries)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    rows = [line for line in text.split("\n") if line.strip()]
    # one parse of all the lines (cheaper than a call per line); a line that holds more or less
    # than one value is refused: the count of values differs from the count of lines
    lines = json.loads("[" + ",".join(rows) + "]") if rows else []
    if (
        len(lines) != len(rows)
        or not lines
        or not isinstance(lines[0], dict)
        or not isinstance(lines[-1], dict)
        or lines[0].get("kind") != "rb-manifest"
        or "totals" not in lines[-1]
    ):
        raise ValueError(f"{path}: not a complete manifest (header or totals line missing)")
    fp = hashlib.sha256("".join(row + "\n" for row in rows[1:-1]).encode()).hexdigest()
    return {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}, fp


def fingerprint(manifest: dict) -> str:
    """sha256 over the entries: equal fingerprints mean equal trees (for the chosen algo)."""
    return hashlib.sha256(_body(manifest["entries"]).encode()).hexdigest()


def names(manifest: dict, out) -> None:
    """NUL-separated relative paths for `tar --null --no-recursion -T -`, parents first."""
    write_names((e["p"] for e in manifest["entries"]), out)


def write_names(paths: Iterable[str], out) -> None:
    """Relative paths as a NUL-separated list (a binary file), the form `tar -T` and
    `read_names` take."""
    for rel in paths:
        out.write(rel.encode("utf-8", "surrogateescape") + b"\0")


def read_names(path: str) -> list[str]:
    with open(path, "rb") as fh:
        return [n.decode("utf-8", "surrogateescape") for n in fh.read().split(b"\0") if n]
