"""Per-file manifests: made on the source, checked on the target, in parallel.

A manifest is JSON lines: a header, one line per entry (sorted by path), and a totals line.
Entries: {"p": path, "t": "f"|"d"|"l", "m": mode, "s": size, "h": digest} (files),
{"p", "t": "d", "m"} (dirs), {"p", "t": "l", "l": link target} (symlinks).
With `strip_special` a manifest records modes without the setuid, setgid, sticky and world-write
bits (SPECIAL_BITS): what the install will hold after they are stripped (`hostfs.strip_special`).
Exclude patterns follow GNU tar's defaults for --exclude: a pattern matches the whole relative
path or any tail of it that starts at a component, and `*` matches `/` too. An excluded directory
is not entered.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import io
import json
import operator
import os
import re
import select
import stat
import struct
import threading
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

from rbrules import cpus, proven
from rbrules.common import walk_workers
from rbrules.shown import shown

from . import safefs

# public here (what callers use as manifest.NAME): a file's digest, many files' in parallel
from .filehash import CHUNK, Changed, digest, digests, hasher  # noqa: F401

SCHEMA = 1
# written into an install by the install itself (its manifest, its versioned env file, the mark
# of a build whose checks failed, its record (installs.INFO)): never compared, never sent
SKIP_NAMES = (".rb-manifest.jsonl", ".rb-env.sh", ".rb-failed", ".rb-install.json")
# what an install never carries unless the spec says so out loud (transfer.special_modes: keep)
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH
QUICK_KEYS = ("t", "m", "s", "mt")  # what a stat-level comparison of two file entries uses
SCAN_SUFFIX = ".stat"  # the scan record beside a names list (hostfs.scan)
LINKS_SUFFIX = ".links"  # its files of more than one link: [index, st_dev, st_ino]


def relocatable(rel: str) -> bool:
    """What relocation may rewrite (bin/*, pyvenv.cfg): its installed content is not the source's,
    so an incremental install never reuses its digest nor links it from the previous install."""
    return rel == "pyvenv.cfg" or rel.startswith("bin/")


def linkable(old: Optional[dict], new: dict) -> bool:
    """Whether a file recorded as `old` (by an earlier install or an earlier source manifest) can
    stand for `new` unread: same digest, type, mode, size and mtime, and not relocatable."""
    # QUICK_KEYS written out: this runs once per file of a tree on every incremental re-run
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
    same rule as `hostfs.stage`, so a host installed from `base` asks for a subset of this."""
    if new["header"].get("algo") != base["header"].get("algo") or new["header"]["algo"] == "none":
        return {
            "usable": False,
            "send": [e["p"] for e in new["entries"]],
            "why": "the last fan-out's manifest has digests of another algorithm (or none)",
        }
    before = {e["p"]: e for e in base["entries"]}
    send, same = [], []
    for e in new["entries"]:
        (same if linkable(before.get(e["p"]), e) else send).append(e)
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


def excluded(rel: str, patterns: Iterable[str]) -> bool:
    """Whether a pattern matches `rel` or one of its tails (the path from any of its components
    on: `__pycache__` excludes `a/__pycache__`, `*.pyc` every .pyc), fnmatch rules."""
    if not patterns:
        return False
    return _exclusion(tuple(patterns))(rel)


@functools.lru_cache(maxsize=64)
def _exclusion(patterns: tuple) -> Callable[..., bool]:
    """The test `excluded` makes. A pattern without "/" or a wildcard matches a tail only as the
    last component, and `*` then such a text only a last component that ends with it (the text
    has no "/"): a set and a tuple of suffixes, for the usual excludes (`__pycache__`, `*.pyc`).
    Any other pattern goes into one regex: each (fnmatch.translate, anchored at the end) may
    start at the beginning or after any "/", which is matching it against every tail. The test
    takes the path and, optionally, its last component (a walk has it: one slice less)."""
    names, suffixes, rest = set(), [], []
    for p in patterns:
        text = p[1:] if p.startswith("*") else p
        if "/" in p or any(c in text for c in "*?["):
            rest.append(p)
        elif p.startswith("*"):
            suffixes.append(text)
        else:
            names.add(p)
    ends = tuple(suffixes)
    regex = (
        re.compile(r"(?:\A|(?<=/))(?:%s)" % "|".join(fnmatch.translate(p) for p in rest)).search
        if rest
        else None
    )

    def test(rel: str, name: Optional[str] = None) -> bool:
        if name is None:
            name = rel[rel.rfind("/") + 1 :]
        return (
            name in names or name.endswith(ends) or (regex is not None and regex(rel) is not None)
        )

    return test


def walk(
    root: str,
    patterns: Iterable[str] = (),
    ordered: bool = True,
    top: str = "",
    gone_ok: bool = False,
) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry below root (below its directory `top`, given
    relative to root: that subtree's part of the whole walk, in the same order), sorted (unless
    not `ordered`: the order the directories give), excludes pruned. `gone_ok`: an entry (or a
    directory below the top) that is gone by the time it is looked at is left out, for a tree
    another process still writes (the staging beside another stream's tar, which replaces the
    placeholder file of each symlink it delays by the link itself when it ends)."""
    patterns = tuple(patterns)
    test = _exclusion(patterns) if patterns else None  # looked up once, not per entry
    stack = [top]
    while stack:
        rel_dir = stack.pop()
        full = os.path.join(root, rel_dir) if rel_dir else root
        try:
            with os.scandir(full) as it:
                entries = sorted(it, key=lambda e: e.name) if ordered else list(it)
        except FileNotFoundError:
            if not gone_ok or rel_dir == top:
                raise
            continue
        subdirs = []
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if rel in SKIP_NAMES or (test is not None and test(rel, name)):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                if not gone_ok:
                    raise
                continue
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))


def tree_stat(
    root: str, patterns: Iterable[str] = (), workers: Optional[int] = None
) -> Tuple[List[bytes], int]:
    """The stat line (values_line) of every entry below `root`, in the walk's order, and the
    bytes of its files: what an install's INSTALLED_STAT is the sha256 of, while the tree is as
    the install left it. A name (or link target) that is not UTF-8 has no line: no manifest
    records one. With `workers` > 1 (default: rbrules' walk_workers of this process's CPUs, in
    a process of one thread only) the subtrees are walked by that many forked processes
    (StatWalk); the answer is the same bytes."""
    return StatWalk(root, patterns, workers).result()


class StatWalk:
    """tree_stat in two halves: begun by the constructor, on the calling thread (with workers,
    the directories near the root listed and the workers forked: a process forks only while it
    has one thread, so the engine's early check begins it before its own thread starts), and
    its answer taken by `result`, from any thread, once."""

    def __init__(
        self, root: str, patterns: Iterable[str] = (), workers: Optional[int] = None
    ) -> None:
        self.root, self.patterns = root, tuple(patterns)
        if workers is None:
            workers = walk_workers(_cpus()) if threading.active_count() == 1 else 1
        self._started: Optional[dict] = None
        if workers > 1:
            try:
                self._started = _start(root, self.patterns, workers)
            except OSError:
                self._started = None  # result() walks here, and meets the error itself

    def result(self) -> Tuple[List[bytes], int]:
        started, self._started = self._started, None
        got = _finish(started) if started is not None else None
        if got is not None:
            return [b"".join(got[0])], got[1]
        lines: List[bytes] = []
        size = _stat_lines(self.root, self.patterns, "", lines)
        return lines, size


def _cpus() -> int:
    return cpus.count()


def _stat_lines(root: str, patterns: tuple, top: str, lines: List[bytes]) -> int:
    """tree_stat's lines of the entries below `top` appended to `lines`; their files' bytes.
    walk, stat_values and values_line written out in one loop (the same order and bytes: a
    test holds them equal): this is the live plan's and the re-run's walk of every entry."""
    test = _exclusion(patterns) if patterns else None
    size = 0
    add = lines.append
    uid = os.geteuid()
    groups = proven.trusted_groups(uid)
    name_of = operator.attrgetter("name")
    isreg, isdir, islnk = stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK
    stack = [top]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
            entries = sorted(it, key=name_of)
        subdirs = []
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if rel in SKIP_NAMES or (test is not None and test(rel, name)):
                continue
            st = entry.stat(follow_symlinks=False)
            m = st.st_mode
            try:
                if isreg(m):
                    add(
                        (
                            '[%s, "f", %d, %d, null, %d]\n'
                            % (_STR(rel), m & 0o7777, st.st_size, int(st.st_mtime))
                        ).encode()
                    )
                    size += st.st_size
                elif isdir(m):
                    subdirs.append(rel)
                    add(('[%s, "d", %d, null, null, null]\n' % (_STR(rel), m & 0o7777)).encode())
                elif islnk(m):
                    add(
                        (
                            '[%s, "l", null, null, %s, null]\n'
                            % (_STR(rel), _STR(os.readlink(os.path.join(root, rel))))
                        ).encode()
                    )
                else:
                    add(('[%s, "?", %d, null, null, null]\n' % (_STR(rel), m & 0o7777)).encode())
            except UnicodeEncodeError:
                continue
            if (st.st_uid != uid and st.st_uid != 0) or (
                not islnk(m) and (m & 0o002 or (m & 0o020 and st.st_gid not in groups))
            ):
                lines[-1] = _not_ours_line(lines[-1], rel, st)
        stack.extend(reversed(subdirs))
    return size


def _not_ours_line(line: bytes, rel: str, st: os.stat_result) -> bytes:
    """A destination entry's stat line with why it is not proven ours (rbrules.proven: another
    user owns it or can write it) as a seventh value: never a line an install recorded, so the
    walk's lines do not add up to its INSTALLED_STAT and the entry is compared, and found
    changed (check_tree); never trusted as unchanged, never linked."""
    why = proven.why_not_ours(rel, st) or "not proven ours"
    return line[:-2] + (", %s]\n" % _STR(why)).encode()


_UNIT = struct.Struct("<IQQ")  # a worker's answer for one subtree: its index, bytes, size


def _start(
    root: str,
    patterns: tuple,
    workers: int,
    own: Optional[Callable] = None,
    unit: Optional[Callable] = None,
) -> dict:
    """StatWalk's first half: the directories near the root are listed here, breadth first,
    until there are 4 subtrees a worker (or none is left: a small tree is walked here alone);
    then at most `workers` processes are forked, each taking the next subtree's index from one
    pipe and sending back its lines through its own (_finish puts them in the walk's order).
    `own(entries)` makes a listed directory's piece of the answer from its (rel, lstat) entries
    and `unit(top)` a worker's from its subtree, each (bytes, size): by default their stat
    lines (ForkedWalk gives other walks, the source's scan, the same split)."""
    own = own or functools.partial(_own_lines, root)
    unit = unit or functools.partial(_unit_lines, root, patterns)
    test = _exclusion(patterns) if patterns else None
    listed: dict = {}  # a directory listed here -> its piece (bytes, size)
    subs: dict = {}  # a directory listed here -> its subdirectories, in order
    frontier = [""]
    while frontier and len(frontier) < 4 * workers:
        deeper = []
        for d in frontier:
            kept: List[tuple] = []
            dirs: List[str] = []
            full = os.path.join(root, d) if d else root
            with os.scandir(full) as it:
                entries = sorted(it, key=operator.attrgetter("name"))
            for entry in entries:
                rel = f"{d}/{entry.name}" if d else entry.name
                if rel in SKIP_NAMES or (test is not None and test(rel, entry.name)):
                    continue
                st = entry.stat(follow_symlinks=False)
                kept.append((rel, st))
                if stat.S_ISDIR(st.st_mode):
                    dirs.append(rel)
            listed[d] = own(kept)
            subs[d] = dirs
            deeper.extend(dirs)
        frontier = deeper
    started = {"own": listed, "subs": subs, "units": frontier, "pids": [], "reads": {}, "task": -1}
    if frontier:
        try:
            _fork(unit, frontier, min(workers, len(frontier)), started)
        except OSError:
            _reap(started)
            raise
    return started


def _own_lines(root: str, kept: List[tuple]) -> Tuple[bytes, int]:
    """A listed directory's stat lines (of its entries `kept`) and its files' bytes."""
    lines: List[bytes] = []
    size = 0
    for rel, st in kept:
        v = stat_values(root, rel, st)
        try:
            lines.append(values_line(v))
        except UnicodeEncodeError:
            continue
        if proven.why_not_ours(rel, st) is not None:
            lines[-1] = _not_ours_line(lines[-1], rel, st)
        if v[1] == "f":
            size += st.st_size
    return b"".join(lines), size


def _unit_lines(root: str, patterns: tuple, top: str) -> Tuple[bytes, int]:
    """A worker's subtree: its stat lines (_stat_lines) and its files' bytes."""
    lines: List[bytes] = []
    size = _stat_lines(root, patterns, top, lines)
    return b"".join(lines), size


class ForkedWalk:
    """The walk of `root` split as tree_stat's is (StatWalk), for another walk's answer, in two
    halves: begun by the constructor, on the calling thread (a process forks only while it has
    one thread), and its pieces taken by `pieces`, once. `own(entries)` gives the piece of each
    directory listed near the root (its (rel, lstat) entries, excludes pruned, sorted) and
    `unit(top)` that of each subtree below, in a forked worker, each (bytes, size)."""

    def __init__(
        self,
        root: str,
        patterns: Iterable[str],
        workers: Optional[int],
        own: Callable[[List[tuple]], Tuple[bytes, int]],
        unit: Callable[[str], Tuple[bytes, int]],
    ) -> None:
        if workers is None:
            workers = walk_workers(_cpus()) if threading.active_count() == 1 else 1
        self._started: Optional[dict] = None
        if workers > 1:
            try:
                self._started = _start(root, tuple(patterns), workers, own, unit)
            except OSError:
                self._started = None  # the caller walks, and meets the error itself

    def pieces(self) -> Optional[List[bytes]]:
        """The pieces in the walk's order; None where nothing was forked (`workers` of 1, the
        default rule's walk_workers saying 1, a thread besides the one that began it) or a
        worker failed: the caller walks in this process."""
        started, self._started = self._started, None
        got = _finish(started) if started is not None else None
        return got[0] if got is not None else None

    def close(self) -> None:
        """Whatever was forked and not taken: its workers ended and waited for."""
        started, self._started = self._started, None
        if started is not None:
            _reap(started)


def _reap(started: dict) -> None:
    """What _start opened and forked: closed, every worker waited for."""
    for r in started["reads"]:
        os.close(r)
    started["reads"].clear()
    while started["pids"]:
        os.waitpid(started["pids"].pop(), 0)
    if started["task"] >= 0:
        os.close(started["task"])
        started["task"] = -1


def _fork(
    unit: Callable[[str], Tuple[bytes, int]], units: List[str], workers: int, started: dict
) -> None:
    """The workers of `started` (_start), forked here; every index queued before the first."""
    queue = b"".join(struct.pack("<I", i) for i in range(len(units)))
    if len(queue) > 60000:  # the pipe takes every index at once: never a blocked write
        raise OSError("too many subtrees for one pipe")
    task_r, task_w = os.pipe()
    started["task"] = task_r
    try:
        os.write(task_w, queue)
    finally:
        os.close(task_w)
    for _ in range(workers):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the caller's code
            code = 1
            try:
                os.close(r)
                while True:
                    b = os.read(task_r, 4)
                    if len(b) < 4:
                        break
                    i = struct.unpack("<I", b)[0]
                    data, size = unit(units[i])
                    view = memoryview(_UNIT.pack(i, len(data), size) + data)
                    while view:
                        view = view[os.write(w, view) :]
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        started["pids"].append(pid)
        started["reads"][r] = []


def _finish(started: dict) -> Optional[Tuple[List[bytes], int]]:
    """StatWalk's second half: the workers' answers read and put together in the walk's order;
    None when a worker failed (the caller walks again itself)."""
    units, reads, pids = started["units"], started["reads"], started["pids"]
    done: List[Optional[Tuple[bytes, int]]] = [None] * len(units)
    try:
        answers = []
        while reads:
            for r in select.select(list(reads), [], [])[0]:
                chunk = os.read(r, 1 << 20)
                if chunk:
                    reads[r].append(chunk)
                else:
                    answers.append(b"".join(reads.pop(r)))
                    os.close(r)
        ok = True
        while pids:
            ok = os.waitpid(pids.pop(), 0)[1] == 0 and ok
        for data in answers if ok else ():
            at = 0
            while at + _UNIT.size <= len(data):
                i, n, size = _UNIT.unpack_from(data, at)
                at += _UNIT.size
                if i < len(done):
                    done[i] = (data[at : at + n], size)
                at += n
        if not ok or not all(d is not None for d in done):
            return None
    finally:
        _reap(started)
    at_unit = {u: i for i, u in enumerate(units)}
    own, subs = started["own"], started["subs"]
    out: List[bytes] = []
    total = 0
    stack = [""]
    while stack:  # the walk's order: a directory's entries, then each subtree
        d = stack.pop()
        if d in at_unit:
            got = done[at_unit[d]]
            assert got is not None
            out.append(got[0])
            total += got[1]
            continue
        out.append(own[d][0])
        total += own[d][1]
        stack.extend(reversed(subs[d]))
    return out, total


def read_header(path: str) -> Optional[dict]:
    """The header of the manifest at `path` (its first line; the rest is not read), None when it
    is not a manifest's. Opened without following a link, never a FIFO or a device."""
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        line = f.readline()
    try:
        head = json.loads(line)
    except ValueError:
        return None
    return head if isinstance(head, dict) and head.get("kind") == "rb-manifest" else None


def entry_of(root: str, rel: str, st: os.stat_result) -> dict:
    return entry_from(stat_values(root, rel, st))


def entry_from(v: tuple) -> dict:
    """The entry whose STAT_KEYS values are `v` (stat_values): a file's mtime in whole seconds
    (what tar restores: its default format keeps seconds), no mode for a link."""
    if v[1] == "f":
        return {"p": v[0], "t": "f", "m": v[2], "s": v[3], "mt": v[5]}
    if v[1] == "l":
        return {"p": v[0], "t": "l", "l": v[4]}
    return {"p": v[0], "t": v[1], "m": v[2]}


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
_STR = json.encoder.encode_basestring  # what _STAT writes for a str (ensure_ascii off)


_FILE_KEYS = frozenset(("h", "m", "mt", "p", "s", "t"))


def entry_line(entry: dict) -> str:
    """An entry as a manifest's line holds it (without the newline): json.dumps with sorted keys,
    put together here for a hashed file's usual values (str and int: faster than the encoder on a
    big tree, and every install writes two manifests of every entry)."""
    if entry.keys() == _FILE_KEYS:
        h, m, mt, p, s = entry["h"], entry["m"], entry["mt"], entry["p"], entry["s"]
        if (
            type(h) is str
            and type(p) is str
            and type(m) is int
            and type(mt) is int
            and type(s) is int
            and entry["t"] == "f"
        ):
            return '{"h": %s, "m": %s, "mt": %s, "p": %s, "s": %s, "t": "f"}' % (
                _STR(h),
                int.__repr__(m),
                int.__repr__(mt),
                _STR(p),
                int.__repr__(s),
            )
    return _ENTRY.encode(entry)


def stat_line(entry: dict) -> bytes:
    """JSON of the entry's STAT_KEYS values as a list, and a newline: the bytes the json module
    writes (stat fingerprints compare with those of earlier installs), put together here for the
    usual values (str, int, None: faster than the encoder on a big tree)."""
    parts = []
    for k in STAT_KEYS:
        v = entry.get(k)
        if v is None:
            parts.append("null")
        elif type(v) is str:
            parts.append(_STR(v))
        elif type(v) is int:
            parts.append(int.__repr__(v))
        else:
            return _STAT.encode([entry.get(k) for k in STAT_KEYS]).encode() + b"\n"
    return ("[" + ", ".join(parts) + "]\n").encode()


def stat_values(root: str, rel: str, st: os.stat_result, strip: bool = False) -> tuple:
    """An entry's STAT_KEYS values as a tuple (its modes `without_special` with `strip`), from
    the walk's lstat: what entry_of, a scan and a verify of every entry of a tree take."""
    m = st.st_mode
    fmt = stat.S_IFMT(m)
    if fmt == stat.S_IFLNK:
        return (rel, "l", None, None, os.readlink(os.path.join(root, rel)), None)
    mode = m & ~SPECIAL_BITS & 0o7777 if strip else m & 0o7777
    if fmt == stat.S_IFREG:
        return (rel, "f", mode, st.st_size, None, int(st.st_mtime))
    return (rel, "d" if fmt == stat.S_IFDIR else "?", mode, None, None, None)


def values_line(v: tuple) -> bytes:
    """stat_line of the entry whose STAT_KEYS values are `v` (from stat_values): the same bytes."""
    if v[1] == "f":
        return ('[%s, "f", %d, %d, null, %d]\n' % (_STR(v[0]), v[2], v[3], v[5])).encode()
    if v[1] == "l":
        return ('[%s, "l", null, null, %s, null]\n' % (_STR(v[0]), _STR(v[4]))).encode()
    return ('[%s, "%s", %d, null, null, null]\n' % (_STR(v[0]), v[1], v[2])).encode()


def stat_fingerprint(entries: Iterable[dict]) -> str:
    """sha256 over what a quick check compares (path, type, mode, size, link, mtime): no reading."""
    h = hashlib.sha256()
    for e in entries:
        h.update(stat_line(e))
    return h.hexdigest()


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
    for rel, st in walk(root, patterns, ordered=False):
        w = want.pop(rel, None)
        v = stat_values(root, rel, st)
        why = proven.why_not_ours(rel, st, uid)
        if why is not None:
            # another user owns it or can write it: whatever its stat says, not the install's
            not_ours.append(why)
            changed.append(rel)
        elif w is None or v[1:] != (w.get("t"), w.get("m"), w.get("s"), w.get("l"), w.get("mt")):
            changed.append(rel)
    changed.extend(want)
    changed.sort()
    if changed:
        why = f"{len(changed)} entries changed at the destination"
        if not_ours:
            why += f" ({len(not_ours)} of them owned or writable by another user)"
        return {"ok": False, "why": why, "changed": changed[:20], "not_ours": sorted(not_ours)[:20]}
    return {"ok": True, "why": "unchanged since the install (stat check)"}


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
    with open(fd, "rb") as f:
        data = f.read()
    head, _, body = data.partition(b"\n")
    if head + b"\n" != scan_header(root, patterns, strip_special):
        return None
    return body


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
    body = read_scan(scanned, root, patterns, strip_special) if scanned else None
    if body is not None:
        rows = body.split(b"\n")  # a name's newline is escaped in its JSON
        if rows[-1] == b"":
            rows.pop()
        values = json.loads(b"[" + b",".join(rows) + b"]")
        entries = [entry_from(v) for v in values]
        stat_fp = hashlib.sha256(body).hexdigest()
        disk = None
        del body, rows, values
    else:
        lines = []
        for rel, st in walk(root, patterns):
            # the entry (without_special'd with strip_special) and its stat_line, from one set
            # of stat values: the install records the lines' sha256 as its source's stat
            v = stat_values(root, rel, st, strip_special)
            lines.append(values_line(v))
            entries.append(entry_from(v))
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
        for e in files:
            old = before.get(e["p"])
            if old and not relocatable(e["p"]) and all(old.get(k) == e.get(k) for k in QUICK_KEYS):
                e["h"] = old["h"]
                reused += 1
            else:
                todo.append(e)
        for e, h in zip(
            todo, digests(root, [e["p"] for e in todo], algo, jobs, [e["s"] for e in todo])
        ):
            e["h"] = h
    totals = {
        "entries": len(entries),
        "files": len(files),
        "dirs": sum(1 for e in entries if e["t"] == "d"),
        "links": sum(1 for e in entries if e["t"] == "l"),
        "other": sum(1 for e in entries if e["t"] == "?"),
        "bytes": sum(e["s"] for e in files),
        "disk_bytes": disk,
    }
    header = {"schema": SCHEMA, "kind": "rb-manifest", "algo": algo, "excludes": list(patterns)}
    if strip_special:
        header["strip_special"] = True
    header["stat_fingerprint"] = stat_fp
    return {"header": header, "entries": entries, "totals": totals, "reused": reused}


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
    with open(path, encoding="utf-8") as f:
        text = f.read()
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
    for rel, st in walk(root, manifest["header"].get("excludes", ()), ordered=False):
        w = want.get(rel)
        if w is None:
            extra.append(rel)
            continue
        seen.add(rel)
        v = stat_values(root, rel, st)
        kind = v[1]
        expected = (w.get("t"), w.get("m"), w.get("s"), w.get("l"))
        if expected != v[1:5]:
            key, want_v, value = next(
                d for d in zip(("t", "m", "s", "l"), expected, v[1:5]) if d[1] != d[2]
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
                if w.get("h") != got[0]:
                    differ.append({"p": rel, "what": "content", "want": w.get("h"), "have": got[0]})
                continue
            to_hash.append(w)
    if to_hash:
        for w, h in zip(to_hash, digests(root, [w["p"] for w in to_hash], algo, jobs)):
            if w.get("h") != h:
                differ.append({"p": w["p"], "what": "content", "want": w.get("h"), "have": h})
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
    for d in result["differ"]:
        lines.append(
            f"differs: {shown(d['p'])} ({d['what']}: expected {shown(str(d['want']))}, "
            f"found {shown(str(d['have']))})"
        )
    c = result["counts"]
    listed = len(lines)
    total = c["missing"] + c["extra"] + c["differ"]
    if total > listed:
        lines.append(f"... and {total - listed} more")
    return lines


def names(manifest: dict, out) -> None:
    """NUL-separated relative paths for `tar --null --no-recursion -T -`, parents first."""
    write_names((e["p"] for e in manifest["entries"]), out)


def write_names(paths: Iterable[str], out) -> None:
    """Relative paths as a NUL-separated list (a binary file), the form `tar -T` and
    `read_names` take."""
    for rel in paths:
        out.write(rel.encode("utf-8", "surrogateescape") + b"\0")


def read_names(path: str) -> list[str]:
    with open(path, "rb") as f:
        return [n.decode("utf-8", "surrogateescape") for n in f.read().split(b"\0") if n]


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
    stat_fp = manifest["header"].get("stat_fingerprint") or stat_fingerprint(manifest["entries"])
    header.update(
        source_fingerprint=source_fingerprint,
        source_stat_fingerprint=stat_fp,
        source_entries=[e for e in manifest["entries"] if e["p"] in changes],
    )
    header[INSTALLED_STAT] = stat_fingerprint(entries)
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
    m = {
        "header": {k: v for k, v in header.items() if k not in SOURCE_KEYS},
        "entries": [by_path.get(e["p"], e) for e in installed["entries"]],
        "totals": installed["totals"],
    }
    return m
