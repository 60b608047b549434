"""The stat walk of a tree: every entry's (relative path, lstat), excludes pruned, in order, and
its stat lines made in forked workers (one per subtree: `StatWalk`, `ForkedWalk`).

Exclude patterns follow GNU tar's defaults for --exclude: a pattern matches the whole relative
path or any tail of it that starts at a component, and `*` matches `/` too. An excluded directory
is not entered. The lines' format is manifestfile.py's.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import fnmatch
import functools
import operator
import os
import re
import select
import stat
import struct
import threading
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

from rbrules import cpus, owners, paths
from rbrules.streams import walk_workers

from . import manifestfile


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
    for pattern in patterns:
        text = pattern[1:] if pattern.startswith("*") else pattern
        if "/" in pattern or any(c in text for c in "*?["):
            rest.append(pattern)
        elif pattern.startswith("*"):
            suffixes.append(text)
        else:
            names.add(pattern)
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
            if rel in paths.IN_INSTALL or (test is not None and test(rel, name)):
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
    """The stat line (manifestfile.values_line) of every entry below `root`, in the walk's order,
    and the bytes of its files: what an install's INSTALLED_STAT is the sha256 of, while the tree is
    as the install left it. A name (or link target) that is not UTF-8 has no line: no manifest
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
    walk, manifestfile.stat_values and manifestfile.values_line written out in one loop (the same
    order and bytes: a test holds them equal): this is the live plan's and the re-run's walk of
    every entry."""
    test = _exclusion(patterns) if patterns else None
    size = 0
    add = lines.append
    uid = os.geteuid()
    groups = owners.trusted_groups(uid)
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
            if rel in paths.IN_INSTALL or (test is not None and test(rel, name)):
                continue
            st = entry.stat(follow_symlinks=False)
            mode = st.st_mode
            try:
                if isreg(mode):
                    add(
                        (
                            '[%s, "f", %d, %d, null, %d]\n'
                            % (
                                manifestfile.encode_str(rel),
                                mode & 0o7777,
                                st.st_size,
                                int(st.st_mtime),
                            )
                        ).encode()
                    )
                    size += st.st_size
                elif isdir(mode):
                    subdirs.append(rel)
                    add(
                        (
                            '[%s, "d", %d, null, null, null]\n'
                            % (manifestfile.encode_str(rel), mode & 0o7777)
                        ).encode()
                    )
                elif islnk(mode):
                    add(
                        (
                            '[%s, "l", null, null, %s, null]\n'
                            % (
                                manifestfile.encode_str(rel),
                                manifestfile.encode_str(os.readlink(os.path.join(root, rel))),
                            )
                        ).encode()
                    )
                else:
                    add(
                        (
                            '[%s, "?", %d, null, null, null]\n'
                            % (manifestfile.encode_str(rel), mode & 0o7777)
                        ).encode()
                    )
            except UnicodeEncodeError:
                continue
            if (st.st_uid != uid and st.st_uid != 0) or (
                not islnk(mode) and (mode & 0o002 or (mode & 0o020 and st.st_gid not in groups))
            ):
                lines[-1] = _not_ours_line(lines[-1], rel, st)
        stack.extend(reversed(subdirs))
    return size


def _not_ours_line(line: bytes, rel: str, st: os.stat_result) -> bytes:
    """A destination entry's stat line with why it is not proven ours (rbrules.proven: another
    user owns it or can write it) as a seventh value: never a line an install recorded, so the
    walk's lines do not add up to its INSTALLED_STAT and the entry is compared, and found
    changed (check_tree); never trusted as unchanged, never linked."""
    why = owners.why_not_ours(rel, st) or "not proven ours"
    return line[:-2] + (", %s]\n" % manifestfile.encode_str(why)).encode()


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
        for rel_dir in frontier:
            kept: List[tuple] = []
            dirs: List[str] = []
            full = os.path.join(root, rel_dir) if rel_dir else root
            with os.scandir(full) as it:
                entries = sorted(it, key=operator.attrgetter("name"))
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if rel in paths.IN_INSTALL or (test is not None and test(rel, entry.name)):
                    continue
                st = entry.stat(follow_symlinks=False)
                kept.append((rel, st))
                if stat.S_ISDIR(st.st_mode):
                    dirs.append(rel)
            listed[rel_dir] = own(kept)
            subs[rel_dir] = dirs
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
        stat_row = manifestfile.stat_values(root, rel, st)
        try:
            lines.append(manifestfile.values_line(stat_row))
        except UnicodeEncodeError:
            continue
        if owners.why_not_ours(rel, st) is not None:
            lines[-1] = _not_ours_line(lines[-1], rel, st)
        if stat_row[1] == "f":
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
    for read_fd in started["reads"]:
        os.close(read_fd)
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
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the caller's code
            code = 1
            try:
                os.close(read_fd)
                while True:
                    packed = os.read(task_r, 4)
                    if len(packed) < 4:
                        break
                    index = struct.unpack("<I", packed)[0]
                    data, size = unit(units[index])
                    view = memoryview(_UNIT.pack(index, len(data), size) + data)
                    while view:
                        view = view[os.write(write_fd, view) :]
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        started["pids"].append(pid)
        started["reads"][read_fd] = []


def _finish(started: dict) -> Optional[Tuple[List[bytes], int]]:
    """StatWalk's second half: the workers' answers read and put together in the walk's order;
    None when a worker failed (the caller walks again itself)."""
    units, reads, pids = started["units"], started["reads"], started["pids"]
    done: List[Optional[Tuple[bytes, int]]] = [None] * len(units)
    try:
        answers = []
        while reads:
            for read_fd in select.select(list(reads), [], [])[0]:
                chunk = os.read(read_fd, 1 << 20)
                if chunk:
                    reads[read_fd].append(chunk)
                else:
                    answers.append(b"".join(reads.pop(read_fd)))
                    os.close(read_fd)
        ok = True
        while pids:
            ok = os.waitpid(pids.pop(), 0)[1] == 0 and ok
        for data in answers if ok else ():
            at = 0
            while at + _UNIT.size <= len(data):
                index, length, size = _UNIT.unpack_from(data, at)
                at += _UNIT.size
                if index < len(done):
                    done[index] = (data[at : at + length], size)
                at += length
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
        rel_dir = stack.pop()
        if rel_dir in at_unit:
            got = done[at_unit[rel_dir]]
            assert got is not None
            out.append(got[0])
            total += got[1]
            continue
        out.append(own[rel_dir][0])
        total += own[rel_dir][1]
        stack.extend(reversed(subs[rel_dir]))
    return out, total
