"""Whether a path that root executes from or writes to is private (docs/design.md, "Threat
model": other users of the same hosts), and the directory made so.

A directory is private to user U when U owns it and neither its group nor others may write it,
and every directory above it (each link along the way followed, each checked where it lies) can
be changed only by U or root: a directory another user may write is refused, except a sticky one
(/tmp) whose next entry U or root owns, since the sticky bit stops others renaming that entry.

    python -I -S -B KIT/rbrules/start.py rbrules.private [--make] [--what TEXT] [--fix TEXT] DIR

checks DIR (with --make: creates what is missing first, the last directory 0700; with --file: DIR
is a file whose content is obeyed, see why_not_private_file) and exits 2 with the refusal, naming
the directory (or file), its owner and mode, and the fix, when it is not private.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from typing import List, Optional, Tuple

from .owners import owner, user_name, why_not_ours

MAX_LINKS = 40  # symlinks followed along one path (the kernel's own limit)


def _judge(path: str, st: os.stat_result, uid: int) -> Optional[str]:
    """Why this one component is not private (None: it is)."""
    mode = stat.S_IMODE(st.st_mode)
    kind = (
        "the symlink"
        if stat.S_ISLNK(st.st_mode)
        else "directory"
        if stat.S_ISDIR(st.st_mode)
        else "the file"
    )
    if st.st_uid not in (uid, 0):
        return (
            "%s %s is owned by %s, mode %04o: that user can rename or replace what is in it%s"
            % (
                kind,
                path,
                owner(st),
                mode,
                "" if not stat.S_ISLNK(st.st_mode) else " (and the link itself)",
            )
        )
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode means nothing; its directory and target are judged
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
        return (
            "%s %s is owned by %s, mode %04o: writable by %s without the sticky bit, so "
            "another user can rename or replace what is in it" % (kind, path, owner(st), mode, who)
        )
    return None


def first_not_private(path: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) of the first component of `path` that is not private to `uid`, from
    `/` down, links followed as the kernel would; None when there is none. A `..` is taken where
    the walk is, as the kernel takes it: after a link, in the folder the link led to (never the
    text's own parent: os.path.abspath would undo `link/..` as text and judge another path)."""
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    todo: List[str] = [p for p in path.split("/") if p]
    todo.reverse()  # a stack: the next component is last
    cur = "/"
    why = _judge(cur, os.lstat(cur), uid)
    if why:
        return cur, why
    links = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None  # not there yet: the kit makes it
            raise
        why = _judge(nxt, st, uid)
        if why:
            return nxt, why
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return nxt, "more than %d symlinks along %s" % (MAX_LINKS, path)
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend(reversed([p for p in target.split("/") if p]))
            continue
        cur = nxt
    return None


def why_not_private(path: str, uid: Optional[int] = None, *, parent: bool = False) -> Optional[str]:
    """None when the directory `path` is private to `uid` (default: this process's effective
    user), else why not: the first directory along it that another user can change, named with
    its owner and mode (first_not_private), or the directory itself when it is missing, not a
    directory, not `uid`'s, or writable by its group or others.
    parent=True: `path` is where private entries are to be made: the walk alone is the rule
    (root may own it; others may write it when it is sticky; what is missing the kit makes)."""
    uid = os.geteuid() if uid is None else uid
    try:
        found = first_not_private(path, uid)
    except OSError as exc:
        return "%s: %s" % (exc.filename or path, exc.strerror)
    if found is not None:
        return found[1]
    if parent:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        return "%s: %s" % (path, exc.strerror)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % path
    if st.st_uid != uid:
        return "directory %s is owned by %s, mode %04o, not by %s" % (
            path,
            owner(st),
            mode,
            user_name(uid),
        )
    if mode & 0o022:
        return "directory %s is writable by %s (mode %04o)" % (
            path,
            "others" if mode & 0o002 else "its group",
            mode,
        )
    return None


def why_not_private_file(path: str, uid: Optional[int] = None) -> Optional[str]:
    """None when `path` is a regular file that only `uid` (default: this process's effective user)
    or root can change, nor any directory along it (first_not_private), else why not: for a file
    whose content a program run by `uid` obeys (an ssh config: ProxyCommand, Match exec). The
    file itself is judged by rbrules.proven's rule for a file read on its own (owner, no write
    for group or others, one link)."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.stat(path)
        found = first_not_private(path, uid)
        # the walk judges each directory, and each link, along the way; the file is judged below
        if found is not None and stat.S_ISREG(os.lstat(found[0]).st_mode):
            found = None
    except OSError as exc:
        return "%s: %s" % (exc.filename or path, exc.strerror)
    path = os.path.realpath(path)  # named where the kernel found it (`..`, links resolved)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % path
    if found is not None:
        return found[1]
    return why_not_ours("the file " + path, st, uid, alone=True)


def make_private(path: str) -> Optional[str]:
    """Create the directory `path` where it is missing (the directories above it 0755, itself
    0700, none through a link another user made: each is checked before the next is made), then
    check it; None when it is private, else why not. A `..` in it is refused: the directories
    are made by name, and after a link `..` is not the text's parent (first_not_private)."""
    if ".." in path.split("/"):
        return "%s has a `..` in it; name the directory without one" % path
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    path = os.path.normpath(path)  # `.` and doubled slashes only: no `..` is left to undo
    missing: List[str] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for directory in reversed(missing):
        why = why_not_private(os.path.dirname(directory), parent=True)
        if why is not None:
            return why
        try:
            os.mkdir(directory, 0o700 if directory == path else 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            return "cannot make %s: %s" % (directory, exc.strerror)
    return why_not_private(path)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rbrules.private",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir")
    parser.add_argument("--make", action="store_true", help="create what is missing, the last 0700")
    parser.add_argument("--what", default="the directory", help="what DIR is, for the refusal")
    parser.add_argument("--fix", default="", help="what to do instead, for the refusal")
    parser.add_argument(
        "--file",
        action="store_true",
        help="DIR is a file whose content is obeyed (why_not_private_file)",
    )
    args = parser.parse_args(argv)
    why = (
        why_not_private_file(args.dir)
        if args.file
        else make_private(args.dir)
        if args.make
        else why_not_private(args.dir)
    )
    if why is None:
        return 0
    fix = (": " + args.fix) if args.fix else ""
    # a file is named where the kernel finds it (a `..` after a link is not the text's parent)
    shown = os.path.realpath(args.dir) if args.file else args.dir
    sys.stderr.write(
        "refusing %s %s: %s; another user could replace what is run or written "
        "there%s\n" % (args.what, shown, why, fix)
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
