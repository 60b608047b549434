"""Reading back a record a run wrote earlier (a saved plan, and the source's scan and the
destination's state beside it, which `--apply PLAN` trusts): proven this user's when it is read,
never trusted for its place (docs/design.md, "Other users of the same hosts"). A plan copied into
a directory another user owns and edited there installed what the reviewed plan never listed;
`/dev/zero` filled memory; a FIFO hung the run.

    read_own(path, cap) -> bytes    the file's bytes, or NotOurs naming why it is refused

The file's directory is private (rbrules.private.why_not_private: this user's, not writable by
others, nor any directory above it by anyone but this user or root), and the file itself, as
opened (O_NOFOLLOW, O_NONBLOCK: a link is refused, a FIFO does not block), is a regular file of
this user or root, not writable by a group or others who can reach it, with one link, of at
most `cap` bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

from rbrules import private

RECORD_MAX_BYTES = 256 << 20    # a plan's records: about a million source entries at most


class NotOurs(ValueError):
    """A record refused before it is read: the message says why (the file, its owner, mode)."""


def read_own(path: str, cap: int = RECORD_MAX_BYTES, uid: Optional[int] = None) -> bytes:
    """The bytes of the record `path`, read only once it is proven this user's (the module's
    rule), else NotOurs."""
    uid = os.geteuid() if uid is None else uid
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    why = private.why_not_private(folder, uid)
    if why:
        raise NotOurs(why)
    reach = stat.S_IMODE(os.stat(folder).st_mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOurs("%s is a symbolic link" % path) from None
        raise NotOurs("%s: %s" % (path, exc.strerror)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise NotOurs("%s is not a regular file" % path)
        if st.st_uid not in (uid, 0):
            raise NotOurs("the file %s is owned by %s, mode %04o, not by %s"
                          % (path, private.owner(st), mode, private.user_name(uid)))
        # writable by a group or others that can reach it through its folder (a run's own
        # folder is 0700: what the umask gave its files there matters to no one else)
        if mode & 0o020 and reach & 0o010 or mode & 0o002 and reach & 0o001:
            raise NotOurs("the file %s is writable by %s (mode %04o)"
                          % (path, "others" if mode & 0o002 else "its group", mode))
        if st.st_nlink != 1:
            raise NotOurs("%s has %d links: it can be changed through another name"
                          % (path, st.st_nlink))
        data = f.read(cap + 1) if st.st_size <= cap else b""
        if st.st_size > cap or len(data) > cap:
            raise NotOurs("%s is larger than a record can be (%d bytes at most)" % (path, cap))
    return data
