"""Ours means proven, never placed (docs/design.md, "Other users of the same hosts"): the checks
every use of a file or directory root installs, restores, sources, reads or links goes through.

Something is ours in one of two ways:

(a) made by this run, with mkdtemp or O_EXCL, in a directory where no other user can rename or
    replace it (rbrules.private's walk: every directory above it private, or sticky for an entry
    we own): `fresh_dir`;
(b) found there, and judged at the moment of use through the very inode used (fstat on a
    descriptor opened O_NOFOLLOW, or the lstat of a walk that follows no link): owned by root or
    the runner, and writable by no one else (`why_not_ours`; a file read on its own must also be
    a regular file of one link: `open_ours`); or its content matches a digest the run already
    holds (the kit's sha256, a manifest's digests: their callers compare those).

A directory other users can add entries to, sticky or not (/tmp), is not private for what lies in
it (`why_shared`): the sticky bit stops them renaming our entries, not putting their own at the
names we read. A refusal stops the use: the caller never reads, links or runs what was refused.

Write access by group: a file read on its own (an env file, a mark, a journal, a config) is
refused when its group may write it. Inside an install (`alone=False`: the files and directories
of a tree, judged entry by entry) a group write bit is accepted for root's group (gid 0) and for
the runner's own private group (named as the user, no other members), since extraction keeps the
source's group write bits (umask 002) and gives the runner's group; any other group is another
user. ACLs and capabilities beyond the mode bits are not judged.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
import sys
import tempfile
from typing import Iterator, List, Optional, Tuple

from .private import owner, user_name, why_not_private


class NotOurs(PermissionError):
    """A file or directory that is not proven ours (the message says why): never used."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.EPERM, why)
        self.why = why

    def __str__(self) -> str:
        return self.why


_GROUPS: dict = {}


def trusted_groups(uid: int) -> frozenset:
    """The groups whose write bit inside an install is not another user's: root's (0), and the
    user's own private group (its name, no other member)."""
    got = _GROUPS.get(uid)
    if got is not None:
        return got
    groups = {0}
    try:
        pw = pwd.getpwuid(uid)
        gr = grp.getgrgid(pw.pw_gid)
        if gr.gr_name == pw.pw_name and set(gr.gr_mem) <= {pw.pw_name}:
            groups.add(pw.pw_gid)
    except KeyError:
        pass
    _GROUPS[uid] = frozenset(groups)
    return _GROUPS[uid]


def _group(gid: int) -> str:
    try:
        return "%s (gid %d)" % (grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return "gid %d" % gid


def writers(st: os.stat_result, uid: int, alone: bool = True, reach: int = 0o7777) -> str:
    """Who besides the owner may write the entry whose stat is `st`: "" (no one), "others",
    or its group ("its group", or with `alone=False` "its group NAME (gid N)", and not at all
    when that group is one of trusted_groups'). `reach`: the mode of the directory it lies in,
    where that directory is private: a group or others that may not enter it cannot reach the
    entry to write it (a umask's group bit on a file in a 0700 run directory)."""
    if stat.S_ISLNK(st.st_mode):
        return ""  # a link's mode means nothing
    mode = st.st_mode
    if mode & 0o002 and reach & 0o001:
        return "others"
    if mode & 0o020 and alone and reach & 0o010:
        return "its group"
    if mode & 0o020 and st.st_gid not in trusted_groups(uid):
        return "its group " + _group(st.st_gid)
    return ""


def why_not_ours(
    path: str,
    st: os.stat_result,
    uid: Optional[int] = None,
    *,
    alone: bool = False,
    reach: int = 0o7777,
) -> Optional[str]:
    """Why the entry at `path`, whose stat (lstat, or fstat of the descriptor it is used through)
    is `st`, is not proven ours; None when it is: owned by root or `uid` (default: this process's
    effective user) and writable by no one else (`writers`). `alone`: a file read or obeyed on
    its own, which must also be a regular file of one link, its group unable to write it."""
    uid = os.geteuid() if uid is None else uid
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (uid, 0):
        if alone:
            return "%s is owned by %s, mode %04o: that user can change what it says" % (
                path,
                owner(st),
                mode,
            )
        return "%s is owned by %s, not by %s" % (
            path,
            owner(st),
            "root" if uid == 0 else user_name(uid) + " or root",
        )
    if alone and not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % path
    who = writers(st, uid, alone, reach)
    if who:
        return "%s is writable by %s (mode %04o)" % (path, who, mode)
    if alone and st.st_nlink != 1:
        return "%s has %d links: another name of it may lie where another user can reach it" % (
            path,
            st.st_nlink,
        )
    return None


def open_ours(
    name: str, dir_fd: Optional[int] = None, uid: Optional[int] = None, shown: str = ""
) -> Tuple[int, os.stat_result]:
    """(descriptor, its fstat) of the file `name` (in `dir_fd`), opened for reading without
    following a link, never blocking on a FIFO, and judged through that descriptor
    (why_not_ours, alone): NotOurs when it is not ours, FileNotFoundError when it is not there.
    `shown`: the name said in a refusal (default `name`)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    shown = shown or name
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOurs("%s is not a regular file (a symlink)" % shown) from None
        if exc.errno == errno.ENXIO:
            raise NotOurs("%s is not a regular file" % shown) from None
        raise
    try:
        st = os.fstat(fd)
        why = why_not_ours(shown, st, uid, alone=True)
        if why:
            raise NotOurs(why)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_ours(
    name: str,
    dir_fd: Optional[int] = None,
    limit: int = 1 << 20,
    uid: Optional[int] = None,
    shown: str = "",
) -> Optional[Tuple[bytes, os.stat_result]]:
    """(content, stat) of the file `name` (in `dir_fd`) when it is ours (open_ours), None when
    it is not there; NotOurs when it is there and not ours, or larger than `limit`."""
    try:
        fd, st = open_ours(name, dir_fd, uid, shown)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if st.st_size > limit:
            raise NotOurs("%s is larger than %d bytes" % (shown or name, limit))
        return read_all(fd), st
    finally:
        os.close(fd)


RECORD_MAX_BYTES = 256 << 20  # a saved plan's records: about a million source entries at most


def read_record(path: str, cap: int = RECORD_MAX_BYTES, uid: Optional[int] = None) -> bytes:
    """The bytes of a record a run wrote earlier and reads back (a saved plan, the source's scan
    and the destination's state beside it, which `--apply PLAN` trusts), read only once proven
    this user's, else NotOurs. A plan copied into another user's directory and edited there
    installed what the reviewed plan never listed; `/dev/zero` filled memory; a FIFO hung a run.
    Its directory is private (why_not_private), and the file, as opened (open_ours: no link, no
    FIFO blocking), is a regular file of this user or root with one link, writable by no group
    or others that can enter that directory, of at most `cap` bytes."""
    uid = os.geteuid() if uid is None else uid
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    why = why_not_private(folder, uid)
    if why:
        raise NotOurs(why)
    reach = stat.S_IMODE(os.stat(folder).st_mode)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOurs("%s is a symbolic link" % path) from None
        raise NotOurs("%s: %s" % (path, exc.strerror)) from None
    try:
        st = os.fstat(fd)
        why = why_not_ours(path, st, uid, alone=True, reach=reach)
        if why:
            raise NotOurs(why)
        if st.st_size > cap:
            raise NotOurs("%s is larger than a record can be (%d bytes at most)" % (path, cap))
        data = os.read(fd, cap + 1)
        while data and len(data) <= cap:
            more = os.read(fd, cap + 1 - len(data))
            if not more:
                break
            data += more
        if len(data) > cap:
            raise NotOurs("%s is larger than a record can be (%d bytes at most)" % (path, cap))
        return data
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    """What is left to read of the open file `fd` (rbkit.safefs reads its files so too)."""
    chunks = []
    while True:
        block = os.read(fd, 1 << 20)
        if not block:
            break
        chunks.append(block)
    return b"".join(chunks)


def why_shared(directory: str, uid: Optional[int] = None) -> Optional[str]:
    """Why the directory `directory` is not private for what lies in it: its owner is another
    user, or another user may add entries to it (group or others may write it, sticky or not: the
    sticky bit stops them renaming our entries, not putting theirs at the names we read); None
    when only root and `uid` can. The directories above it are rbrules.private's walk's."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None  # not there yet: the kit makes it, 0755
    except OSError as exc:
        return "%s: %s" % (directory, exc.strerror)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (uid, 0):
        return (
            "directory %s is owned by %s, mode %04o: that user can rename or replace what "
            "is in it" % (directory, owner(st), mode)
        )
    if mode & 0o022:
        who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
        return (
            "directory %s is owned by %s, mode %04o: writable by %s%s, so another user can "
            "put their own entries at the names kept there (the sticky bit only stops them "
            "renaming ours)"
            % (directory, owner(st), mode, who, " (sticky)" if mode & stat.S_ISVTX else "")
        )
    return None


def tree_entries(root: str) -> Iterator[Tuple[str, os.stat_result]]:
    """(path, lstat) of `root` itself and of every entry below it, no link followed."""
    yield root, os.lstat(root)
    stack = [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            entries = list(it)
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)


def not_ours_in_tree(root: str, uid: Optional[int] = None, limit: int = 20) -> List[str]:
    """Why each entry of the tree `root` (itself included: a real directory) is not ours
    (why_not_ours, as an install's entries), the first `limit` of them; [] when every one is."""
    uid = os.geteuid() if uid is None else uid
    found: List[str] = []
    try:
        top = os.lstat(root)
    except OSError as exc:
        return ["%s: %s" % (root, exc.strerror)]
    if not stat.S_ISDIR(top.st_mode):
        return ["%s is not a directory" % root]
    for path, st in tree_entries(root):
        why = why_not_ours(path, st, uid)
        if why:
            found.append(why)
            if len(found) >= limit:
                break
    return found


def fresh_dir(prefix: str, parent: Optional[str] = None) -> str:
    """A directory made by this run (mkdtemp: 0700, a new name) where no other user can rename
    or replace it: in `parent`, by default the temp directory (TMPDIR), when rbrules.private's
    walk finds it private (a sticky directory is, for an entry of ours); else, saying so on
    stderr, in the first of /tmp and /var/tmp that is; PermissionError when none is."""
    first = parent or tempfile.gettempdir()
    tried = []
    for where in [first] + ([] if parent else ["/tmp", "/var/tmp"]):
        why = why_not_private(where, parent=True)
        if why is None:
            if tried:
                sys.stderr.write(
                    "refusing %s for this run's private directory (%s); made in %s "
                    "instead\n" % (first, tried[0], where)
                )
            return tempfile.mkdtemp(prefix=prefix, dir=where)
        tried.append(why)
    raise PermissionError(
        "refusing %s for this run's private directory: %s; set TMPDIR to a "
        "directory only %s can write" % (first, tried[0], user_name(os.geteuid()))
    )
