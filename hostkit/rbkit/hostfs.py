"""Small facts about paths on a host: what is there, how big, how much room, and the atomic swap.

The host side runs as root over trees other users wrote (see docs/design.md, "Threat model"):
`scan` reports what must not be moved silently (setuid/setgid/world-writable entries, links that
leave the tree, device nodes) and refuses it unless the spec allows it; `strip_special` removes
those mode bits from an extracted tree; `identity`/`same_or_nested` (rbkit.pathid) tell whether
the destination is the source under another name; `swap` and `restore` (rbkit.swapfs) never
replace a link with a directory, journal a swap that cannot be one rename, keep each backup
independent of the live install (rbkit.installs), and bring back an install's own env file.
"""

from __future__ import annotations

import errno
import hashlib
import marshal
import os
import shutil
import stat
from typing import List, Optional, Tuple

from rbrules import links, paths
from rbrules.choices import OUTSIDE_LINKS, SPECIAL_MODES
from rbrules.shown import shown

from . import manifestfile, safefs, statwalk


def _octal(mode: int) -> str:
    return "%04o" % mode


def link_escapes(root: str, rel: str, target: str, max_hops: int = links.MAX_HOPS) -> bool:
    """Whether the symlink `rel` (target `target`) in the tree `root` leads outside it
    (rbrules.links.leaves, the tree read here). An absolute target always does: at the
    destination it names the source's path or the host's files."""
    return links.leaves(rel, target, links.tree_lookup(root), max_hops=max_hops)


def scan(
    root: str,
    patterns,
    names_path: Optional[str] = None,
    *,
    special_modes: str = "refuse",
    outside_links: str = "refuse",
    limit: int = 50,
    workers: Optional[int] = None,
    begun: Optional["ScanWalk"] = None,
) -> dict:
    """Is `root` a venv, and how many files/bytes (apparent and on disk) after the excludes.
    With `names_path`, also write the entries as a NUL-separated list for `tar -T` (the same walk
    and order as a manifest's), and beside it (NAMES.stat: manifestfile.SCAN_SUFFIX) their stat
    lines: the scan record a manifest build of this run takes instead of walking again; and
    (NAMES.links: manifestfile.LINKS_SUFFIX) the files of more than one link, a JSON line each of
    its index in the list and its inode (sender.split_names keeps one inode's names in one stream).

    Also what must not be moved silently: `special_modes` (entries with setuid, setgid, sticky or
    world-write bits: refused unless the spec says `strip` or `keep`), `outside_links` (symlinks
    that leave the tree, the venv's bin/python* excepted: refused unless `keep`) and `devices`
    (never moved); `refusal` is the text preflight fails with, "" when nothing is refused.
    `need_bytes` is the room the copy takes: each file at the larger of its apparent size and its
    blocks (tar writes a sparse file's holes out). `bytes` counts the data of an inode the tree
    names twice (a hard link) once, as `du --apparent-size` does and as the stream carries it
    (tar sends the second name as a link): the transfer's progress runs to 100% on it.

    The walk is split as the live plan's (ScanWalk, statwalk.ForkedWalk: `workers` processes over
    the subtrees, by default rbrules' walk_workers of this process's CPUs, in a process of one
    thread); every answer and record is the same bytes as one process's walk, which is also
    what a failed worker leaves. `begun`: a ScanWalk of this scan begun earlier (before the
    caller started a thread); one of other arguments is closed and a walk made here."""
    try:
        return _scan(
            root, list(patterns), names_path, special_modes, outside_links, limit, workers, begun
        )
    finally:
        if begun is not None:
            begun.close()  # taken, or not this scan's: its workers ended


def _scan(
    root: str,
    patterns: List[str],
    names_path: Optional[str],
    special_modes: str,
    outside_links: str,
    limit: int,
    workers: Optional[int],
    begun: Optional["ScanWalk"],
) -> dict:
    if special_modes not in SPECIAL_MODES:
        raise ValueError(f"special_modes must be one of {SPECIAL_MODES}, not {special_modes!r}")
    if outside_links not in OUTSIDE_LINKS:
        raise ValueError(f"outside_links must be one of {OUTSIDE_LINKS}, not {outside_links!r}")
    out: dict = {"path": root, "exists": os.path.lexists(root), "refusal": ""}
    if not out["exists"]:
        return out
    out["is_link"] = os.path.islink(root)
    if out["is_link"]:
        out["link_target"] = os.readlink(root)
    out["is_dir"] = os.path.isdir(root)
    cfg = os.path.join(root, "pyvenv.cfg")
    out["is_venv"] = os.path.isfile(cfg) and os.path.exists(os.path.join(root, "bin", "python"))
    got = safefs.read_in(root, "pyvenv.cfg", limit=1 << 20) if out["is_dir"] else None
    if got is not None:
        for line in got[0].decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info", "home"):
                out[f"pyvenv_{key.strip()}"] = value.strip()
    if out["is_dir"]:
        strip = special_modes == "strip"
        walk = (
            begun
            if begun is not None and begun.key == (root, tuple(patterns), strip, bool(names_path))
            else None
        )
        if walk is None:
            walk = ScanWalk(root, patterns, strip, bool(names_path), workers)
        try:
            tally = walk.tally()
        finally:
            walk.close()
        if names_path:
            tally.write(names_path, patterns)
        out.update(tally.values(limit, special_modes))
        out["refusal"] = _refusal(
            tally.special,
            special_modes,
            tally.outside,
            outside_links,
            tally.devices,
            tally.not_utf8,
        )
    out["installed_manifest"] = os.path.isfile(os.path.join(root, paths.INSTALLED_MANIFEST))
    return out


class _Records:
    """The counts, sizes and records a walk of `scan` gathers, a piece's (_Part) or the whole's
    (_Tally): one set of fields for both."""

    def __init__(self, root: str, strip: bool, names: bool):
        self.root, self.strip, self.keep_names = root, strip, names
        self.count = self.files = self.dirs = self.links = 0
        self.apparent = self.disk = self.need = 0
        self.names: List[bytes] = []
        # the stat fingerprint's lines as manifestfile.stat_line writes them, hashed once at the end
        self.lines: List[bytes] = []
        self.special: List[dict] = []
        self.outside: List[dict] = []
        self.devices: List[str] = []
        self.sparse: List[tuple] = []  # (index in the piece or the walk, rel)
        self.not_utf8: List[str] = []


class _Part(_Records):
    """What one piece of `scan`'s walk gathers (a directory listed near the root, or a worker's
    subtree; the whole tree in one process): its entries' records, in the walk's order. A file
    of more than one link is only noted (`multi`): whether its data is counted is the whole
    walk's question (its first name in the walk's order), answered by _Tally.merge."""

    def __init__(self, root: str, strip: bool, names: bool, lookup: links.Lookup):
        super().__init__(root, strip, names)
        self.lookup = lookup
        # (index in the piece, st_dev, st_ino, size, blocks, rel when sparse else "")
        self.multi: List[tuple] = []

    def add(self, rel: str, st: os.stat_result) -> None:
        values = manifestfile.stat_values(self.root, rel, st, self.strip)
        try:
            self.lines.append(manifestfile.values_line(values))
        except UnicodeEncodeError:
            # a name (or link target) of bytes that are not UTF-8: no manifest records it
            self.not_utf8.append(shown(rel))
        if self.keep_names:
            self.names.append(rel.encode("utf-8", "surrogateescape") + b"\0")
        index = self.count
        self.count += 1
        blocks = st.st_blocks * 512
        self.disk += blocks
        mode = stat.S_IMODE(st.st_mode)
        if values[1] == "l":
            self.links += 1
            self.need += blocks
            if not links.interpreter_link(rel) and links.leaves(rel, values[4], self.lookup):
                self.outside.append({"p": rel, "l": values[4]})
            return
        if mode & manifestfile.SPECIAL_BITS:
            self.special.append({"p": rel, "m": _octal(mode)})
        if stat.S_ISREG(st.st_mode):
            self.files += 1
            sparse = blocks + 4096 <= st.st_size
            if st.st_nlink > 1:
                self.multi.append(
                    (index, st.st_dev, st.st_ino, st.st_size, blocks, rel if sparse else "")
                )
                return
            self.apparent += st.st_size
            self.need += max(blocks, -(-st.st_size // 4096) * 4096)
            if sparse:
                self.sparse.append((index, rel))
        elif stat.S_ISDIR(st.st_mode):
            self.dirs += 1
            self.need += max(blocks, 4096)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            self.devices.append(rel)

    def dump(self) -> tuple:
        return (
            self.count,
            self.files,
            self.dirs,
            self.links,
            self.apparent,
            self.disk,
            self.need,
            b"".join(self.names),
            b"".join(self.lines),
            self.multi,
            self.special,
            self.outside,
            self.devices,
            self.sparse,
            self.not_utf8,
        )


def _walked(root: str, patterns: tuple, top: str, strip: bool, names: bool) -> bytes:
    """A worker's piece of `scan`'s walk: the subtree `top`'s _Part, marshalled."""
    part = _Part(root, strip, names, links.tree_lookup(root))
    for rel, st in statwalk.walk(root, patterns, top=top):
        part.add(rel, st)
    return marshal.dumps(part.dump())


class ScanWalk:
    """`scan`'s walk of `root`, begun (statwalk.ForkedWalk: the directories near the root listed
    and the workers forked, by the calling thread) before `scan` takes it: `engine source`
    begins it before its thread that reads the runbook's line starts. `tally` walks in this
    process what was not forked, or what a failed worker left."""

    def __init__(
        self, root: str, patterns, strip: bool, names: bool, workers: Optional[int] = None
    ) -> None:
        self.key = (root, tuple(patterns), strip, names)
        self.lookup = links.tree_lookup(root)
        self._forked = statwalk.ForkedWalk(root, patterns, workers, self._own, self._unit)

    def _part(self) -> "_Part":
        root, _patterns, strip, names = self.key
        return _Part(root, strip, names, self.lookup)

    def _own(self, kept: List[tuple]) -> Tuple[bytes, int]:
        part = self._part()
        for rel, st in kept:
            part.add(rel, st)
        return marshal.dumps(part.dump()), 0

    def _unit(self, top: str) -> Tuple[bytes, int]:
        root, patterns, strip, names = self.key
        return _walked(root, patterns, top, strip, names), 0

    def tally(self) -> "_Tally":
        root, patterns, strip, names = self.key
        tally = _Tally(root, strip, names)
        pieces = self._forked.pieces()
        if pieces is not None:
            for piece in pieces:
                tally.merge(marshal.loads(piece))
            return tally
        part = self._part()
        for rel, st in statwalk.walk(root, patterns):
            part.add(rel, st)
        tally.merge(part.dump())
        return tally

    def close(self) -> None:
        self._forked.close()


class _Tally(_Records):
    """What `scan` gathers over one walk of `root` (its _Parts merged in the walk's order): the
    counts and sizes it reports, what it refuses on (special modes, outside links, devices,
    names that are not UTF-8), and, when `names` is set, the records it writes for `tar -T` and
    the manifest build."""

    def __init__(self, root: str, strip: bool, names: bool):
        super().__init__(root, strip, names)
        self.multi: List[bytes] = []  # [index in names, st_dev, st_ino] of multi-link files
        self.inodes: set = set()  # (st_dev, st_ino) of the files of more than one link

    def merge(self, piece: tuple) -> None:
        """The next piece of the walk (a _Part's dump) added: its records after those before it,
        and each file of more than one link counted at its first name in the walk's order."""
        (
            count,
            files,
            dirs,
            nlinks,
            apparent,
            disk,
            need,
            names,
            lines,
            multi,
            special,
            outside,
            devices,
            sparse,
            not_utf8,
        ) = piece
        base = self.count
        self.count += count
        self.files += files
        self.dirs += dirs
        self.links += nlinks
        self.apparent += apparent
        self.disk += disk
        self.need += need
        self.names.append(names)
        self.lines.append(lines)
        for index, dev, ino, size, blocks, sparse_rel in multi:
            if self.keep_names:
                self.multi.append(b"[%d, %d, %d]\n" % (base + index, dev, ino))
            if (dev, ino) in self.inodes:
                self.disk -= blocks  # its data is counted (and sent, and stored) once
                continue
            self.inodes.add((dev, ino))
            self.apparent += size
            self.need += max(blocks, -(-size // 4096) * 4096)
            if sparse_rel:
                self.sparse.append((base + index, sparse_rel))
        self.sparse.extend((base + index, rel) for index, rel in sparse)
        self.special.extend(special)
        self.outside.extend(outside)
        self.devices.extend(devices)
        self.not_utf8.extend(not_utf8)

    def write(self, names_path: str, patterns: List[str]) -> None:
        """The names for `tar -T`, the scan record (NAMES.stat) and the multi-link files
        (NAMES.links): this run's private files, no fsync."""
        safefs.write_file(names_path, b"".join(self.names), 0o600, sync=False)
        safefs.write_file(
            names_path + manifestfile.SCAN_SUFFIX,
            manifestfile.scan_header(self.root, patterns, self.strip) + b"".join(self.lines),
            0o600,
            sync=False,
        )
        safefs.write_file(
            names_path + manifestfile.LINKS_SUFFIX, b"".join(self.multi), 0o600, sync=False
        )

    def values(self, limit: int, special_modes: str) -> dict:
        """scan's answer: the counts, and the first `limit` of each list."""
        sparse = [rel for _index, rel in sorted(self.sparse)]
        return dict(
            files=self.files,
            dirs=self.dirs,
            links=self.links,
            bytes=self.apparent,
            disk_bytes=self.disk,
            need_bytes=self.need,
            stat_fingerprint=hashlib.sha256(b"".join(self.lines)).hexdigest(),
            special_modes=self.special[:limit],
            special_modes_count=len(self.special),
            special_modes_action=special_modes,
            outside_links=self.outside[:limit],
            outside_links_count=len(self.outside),
            devices=self.devices[:limit],
            sparse_files=sparse[:limit],
            sparse_count=len(sparse),
        )


def _count(items: list, one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def _refusal(
    special: list,
    special_action: str,
    outside: list,
    outside_action: str,
    devices: list,
    not_utf8: List[str],
    at_most: int = 10,
) -> str:
    why = []

    def some(items: list) -> str:
        more = f", and {len(items) - at_most} more" if len(items) > at_most else ""
        return ", ".join(items[:at_most]) + more

    if special and special_action == "refuse":
        why.append(
            f"{_count(special, 'entry', 'entries')} with setuid, setgid, sticky or "
            "world-write bits (moved by root, a setuid file of another user arrives as a "
            "setuid-root file): "
            + some([f"{shown(e['p'])} ({e['m']})" for e in special])
            + "; set transfer.special_modes: strip to install them without those bits, "
            "or keep to move them as they are"
        )
    if outside and outside_action == "refuse":
        why.append(
            f"{_count(outside, 'symlink points', 'symlinks point')} outside the tree: "
            + some([f"{shown(e['p'])} -> {shown(e['l'])}" for e in outside])
            + "; set transfer.outside_links: keep to move them as they are"
        )
    if devices:
        why.append(
            f"{_count(devices, 'device node', 'device nodes')} in the tree (never moved): "
            + some([shown(d) for d in devices])
        )
    if not_utf8:
        why.append(
            f"{_count(not_utf8, 'entry', 'entries')} whose name or link target is "
            "not UTF-8 (a manifest records paths as UTF-8 text, so it could not be "
            "verified): " + some(not_utf8) + "; rename them, or leave them out "
            "with transfer.exclude"
        )
    return "; ".join(why)


def _chmod_nofollow(root: str, rel: str, st: os.stat_result, mode: int) -> None:
    """chmod `rel` in the tree `root` to `mode` through a descriptor of the very inode the walk
    saw (opened without following a link); FIFOs and devices through O_PATH, never opened."""
    head, name = os.path.split(rel)
    dir_fd = safefs.open_dir(root, head)
    try:
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(
                name, flags | (os.O_DIRECTORY if stat.S_ISDIR(st.st_mode) else 0), dir_fd=dir_fd
            )
            path_fd = False
        else:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            path_fd = True
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "changed while the tree was walked", rel)
            if path_fd:
                os.chmod(f"/proc/self/fd/{fd}", mode)
            else:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def strip_special(root: str, racing: bool = False) -> List[dict]:
    """Remove the setuid, setgid, sticky and world-write bits (manifestfile.SPECIAL_BITS) from every
    entry of the tree `root` (an extracted staging), links never followed. Returns what it
    changed, [{"p", "was", "now"}]: empty when the extraction created none (the recommended tar
    flags), so the caller can say what it stripped, or fail when it expected nothing.
    `racing`: other streams' tars may still write the tree (each stream strips it once its own
    tar ended): an entry gone or replaced while walked is theirs to strip (the stream whose tar
    ends last walks the finished tree), not a failure. Issue 45: tar makes a placeholder file for
    each symlink it delays and swaps it for the link at its end; a walk beside that failed with
    ENOENT, which failed the stream (one-host, 4 streams: `exited 247`)."""
    changed = []
    for rel, st in statwalk.walk(root, gone_ok=racing):
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & manifestfile.SPECIAL_BITS:
            now = mode & ~manifestfile.SPECIAL_BITS
            try:
                _chmod_nofollow(root, rel, st, now)
            except OSError as exc:
                if not racing or exc.errno not in (errno.ENOENT, errno.ESTALE):
                    raise
                continue
            changed.append({"p": rel, "was": _octal(mode), "now": _octal(now)})
    return changed


def free_bytes(path: str) -> dict:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    usage = shutil.disk_usage(probe)
    return {
        "path": path,
        "measured_at": probe,
        "free_bytes": usage.free,
        "total_bytes": usage.total,
    }
