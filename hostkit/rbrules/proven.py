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
import os
import stat
import sys
import tempfile
from typing import Iterator, List, Optional, Tuple

from .owners import owner, user_name, why_not_ours
from .private import why_not_private


class NotOurs(PermissionError):
    """A file or directory that is not proven ours (the message says why): never used."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.EPERM, why)
        self.why = why

    def __str__(self) -> str:
        return self.why


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
