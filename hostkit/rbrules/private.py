"""Whether a path that root executes from or writes to is private (docs/design.md, "Threat
model": other users of the same hosts), and the directory made so.

A directory is private to user U when U owns it and neither its group nor others may write it,
and every directory above it (each link along the way followed, each checked where it lies) can
be changed only by U or root: a directory another user may write is refused, except a sticky one
(/tmp) whose next entry U or root owns, since the sticky bit stops others renaming that entry.

    python -I -S -B KIT/rbrules/start.py rbrules.private [--make] [--what TEXT] [--fix TEXT] DIR

checks DIR (with --make: creates what is missing first, the last directory 0700) and exits 2 with
the refusal, naming the directory, its owner and mode, and the fix, when it is not private.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import List, Optional

MAX_LINKS = 40


def _owner(uid: int) -> str:
    try:
        import pwd
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except (ImportError, KeyError):
        return "uid %d" % uid


def describe(path: str, st: os.stat_result) -> str:
    """`/x (owner nobody (uid 65534), mode 0777)`"""
    return "%s (owner %s, mode %04o)" % (path, _owner(st.st_uid), stat.S_IMODE(st.st_mode))


def why_not_private(path: str, uid: Optional[int] = None, *, parent: bool = False) -> Optional[str]:
    """None when the directory `path` is private to `uid` (default: this process's effective
    user), else why not: the first directory along it that another user can change, named with
    its owner and mode. A path that does not exist, or is not a directory, is not private.
    parent=True: `path` is where a private entry is to be made: root may own it, and others may
    write it when it is sticky (the entry made there is then this user's alone)."""
    uid = os.geteuid() if uid is None else uid
    trusted = (uid, 0)
    todo: List[str] = [p for p in os.path.abspath(path).split("/") if p]
    here, hops = "/", 0
    try:
        st = os.lstat(here)
        while True:
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in trusted:
                return "%s belongs to another user" % describe(here, st)
            if not todo:
                break
            name = todo.pop(0)
            if name == ".":
                continue
            nxt = os.path.dirname(here) if name == ".." else os.path.join(here, name)
            nst = os.lstat(nxt)
            if mode & 0o022 and not mode & stat.S_ISVTX:
                return "%s can be written by %s" % (
                    describe(here, st), "others" if mode & 0o002 else "its group")
            if mode & 0o022 and nst.st_uid not in trusted:
                return "%s belongs to another user, in %s" % (describe(nxt, nst), here)
            if stat.S_ISLNK(nst.st_mode):
                hops += 1
                if hops > MAX_LINKS:
                    return "%s: too many links" % path
                if nst.st_uid not in trusted:
                    return "the link %s belongs to another user" % describe(nxt, nst)
                target = os.readlink(nxt)
                todo = [p for p in target.split("/") if p] + todo
                if target.startswith("/"):
                    here, st = "/", os.lstat("/")
                continue
            here, st = nxt, nst
    except OSError as exc:
        return "%s: %s" % (exc.filename or path, exc.strerror)
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % here
    if parent and (st.st_mode & stat.S_ISVTX or not st.st_mode & 0o022):
        return None
    if st.st_uid != uid:
        return "%s is not yours" % describe(here, st)
    if stat.S_IMODE(st.st_mode) & 0o022:
        return "%s can be written by %s" % (
            describe(here, st), "others" if st.st_mode & 0o002 else "its group")
    return None


def make_private(path: str) -> Optional[str]:
    """Create the directory `path` where it is missing (the directories above it 0755, itself
    0700, none through a link another user made: each is checked before the next is made), then
    check it; None when it is private, else why not."""
    path = os.path.abspath(path)
    missing: List[str] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for d in reversed(missing):
        why = why_not_private(os.path.dirname(d), parent=True)
        if why is not None:
            return why
        try:
            os.mkdir(d, 0o700 if d == path else 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            return "cannot make %s: %s" % (d, exc.strerror)
    return why_not_private(path)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rbrules.private", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--make", action="store_true", help="create what is missing, the last 0700")
    p.add_argument("--what", default="the directory", help="what DIR is, for the refusal")
    p.add_argument("--fix", default="", help="what to do instead, for the refusal")
    a = p.parse_args(argv)
    why = make_private(a.dir) if a.make else why_not_private(a.dir)
    if why is None:
        return 0
    fix = (": " + a.fix) if a.fix else ""
    sys.stderr.write("refusing %s %s: %s; another user could replace what is run or written "
                     "there%s\n" % (a.what, os.path.abspath(a.dir), why, fix))
    return 2


if __name__ == "__main__":
    sys.exit(main())
