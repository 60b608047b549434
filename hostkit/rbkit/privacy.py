"""Is a path private to the user the kit runs as? The one rule, and the refusal that names it.

The kit runs as root on hosts shared with other users. Whatever it writes beside the destination
(the lock, the staging, the backups a `--restore` puts back, the env file) is only as safe as the
directories along the way: whoever can write one of them can rename, replace or plant an entry
there between two of the kit's steps. So a path is private to `uid` when every component of it,
from `/` down (each symlink on the way too, and then its target's):

- is owned by `uid` or by root, and
- is not writable by group or others, unless it has the sticky bit (a root-owned sticky
  directory like /tmp lets others make new entries, but not rename or remove ours: each
  next component must be ours by the first rule).

A component that does not exist yet is not judged (the kit makes it, as `uid`).

`why_not_private(path, uid)` is the rule (None: private); `refusal(...)` the text preflight fails
with. Not covered: ACLs and capabilities that grant writes beyond the mode bits.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from typing import List, Optional, Tuple

MAX_LINKS = 40        # symlinks followed along one path (the kernel's own limit)
SPEC_KEY = "transfer.shared_parent"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def owner(st: os.stat_result) -> str:
    """`name (uid N)`, or `uid N` for a uid without a name."""
    name = user_name(st.st_uid)
    return name if name.startswith("uid ") else "%s (uid %d)" % (name, st.st_uid)


def _judge(path: str, st: os.stat_result, uid: int) -> Optional[str]:
    """Why this one component is not private (None: it is)."""
    mode = stat.S_IMODE(st.st_mode)
    kind = "the symlink" if stat.S_ISLNK(st.st_mode) else "directory" \
        if stat.S_ISDIR(st.st_mode) else "the file"
    if st.st_uid not in (uid, 0):
        return ("%s %s is owned by %s, mode %04o: that user can rename or replace what is in it%s"
                % (kind, path, owner(st), mode,
                   "" if not stat.S_ISLNK(st.st_mode) else " (and the link itself)"))
    if stat.S_ISLNK(st.st_mode):
        return None        # a link's own mode means nothing; its directory and target are judged
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "group and others" if mode & 0o022 == 0o022 else \
            "group" if mode & 0o020 else "others"
        return ("%s %s is owned by %s, mode %04o: writable by %s without the sticky bit, so "
                "another user can rename or replace what is in it"
                % (kind, path, owner(st), mode, who))
    return None


def first_not_private(path: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) of the first component of `path` that is not private to `uid`, from
    `/` down, links followed as the kernel would; None when there is none."""
    todo: List[str] = [p for p in os.path.abspath(path).split("/") if p]
    todo.reverse()                      # a stack: the next component is last
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
                return None               # not there yet: the kit makes it
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


def why_not_private(path: str, uid: int) -> Optional[str]:
    """Why `path` is not private to the user `uid` (see the module's rule), or None when it is."""
    found = first_not_private(path, uid)
    return found[1] if found else None


def refusal(dest: str, where: str, why: str, uid: int) -> str:
    """The preflight's refusal of `dest`, whose parent (or an ancestor of it) `where` is not
    private: what, why it matters, and the fixes."""
    runner = user_name(uid)
    return ("refusing to install %s as %s: %s. The lock, the staging, the backups that --restore "
            "puts back and the env file live beside the destination, in %s; whoever can write "
            "there can swap them between two steps of this run. Fix: make %s %s's and not "
            "writable by others (chown %s %s && chmod go-w %s), or choose a destination under a "
            "parent only %s can write, or, to accept it, set %s: allow in the spec"
            % (dest, runner, why, os.path.dirname(dest), where, runner, runner, where, where,
               runner, SPEC_KEY))


def check_parent(dest: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) when the parent of `dest` is not private to `uid`; else None."""
    return first_not_private(os.path.dirname(os.path.abspath(dest)) or "/", uid)
