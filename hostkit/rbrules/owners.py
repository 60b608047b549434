"""Whose an entry is: its owner in words, who besides the owner may write it (`writers`), and the
rule of what is proven ours (`why_not_ours`: owned by root or this user, writable by no one
else). The low module of the trust rules: private.py (a private directory) and proven.py (a file
opened, read or walked as ours) both judge an entry by it.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from typing import Optional


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def owner(st: os.stat_result) -> str:
    """`name (uid N)`, or `uid N` for a uid without a name."""
    name = user_name(st.st_uid)
    return name if name.startswith("uid ") else "%s (uid %d)" % (name, st.st_uid)


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
