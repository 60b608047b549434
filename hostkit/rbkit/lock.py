"""One lock per destination, held for a whole run: flock on `.<name>.rb-lock` beside it.

The file is opened with O_NOFOLLOW and must be a regular file of ours with one link, writable by
no other user (rbrules.proven: a symlink or a hard link planted there is refused, never written
through); the holder (host, pid, what
runs, since when) is written into it, so a run that finds it taken names who holds it. The lock
is the kernel's: it goes with the holder's process, however that ends. The holder removes the
file when it lets go (a file whose lock is free is taken over by the next run; one replaced
while we waited for it is opened again).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from typing import Callable, List, Optional

from rbrules import owners, paths


def lock_path(dest: str) -> str:
    """`.<name>.rb-lock` beside the destination: rbrules.paths.lock, the one rule."""
    return paths.lock(dest)


class Taken(Exception):
    """The lock is held by another run (the message names it), or cannot be trusted."""


class Lock:
    def __init__(
        self, dest: str, holder: str, wait: float = 0.0, log: Optional[Callable[[str], None]] = None
    ) -> None:
        self.path = lock_path(dest)
        self.holder, self.wait = holder, wait
        self.log = log or (lambda line: None)
        self.fd: Optional[int] = None
        self.made: List[str] = []  # parent directories this lock made (removed when empty)

    def acquire(self) -> None:
        self._parents()
        deadline = time.monotonic() + self.wait
        said = False
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                who = _read(fd)
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise Taken(
                        "%s is locked by another run: %s. Two runs must not install "
                        "into one destination at once; wait for it to end (the lock goes "
                        "with its process)" % (os.path.dirname(self.path) or ".", who)
                    ) from None
                if not said:
                    self.log(
                        "waiting up to %.0f s for the lock %s, held by %s"
                        % (self.wait, self.path, who)
                    )
                    said = True
                time.sleep(0.5)
                continue
            # the file may have been removed (or replaced) by its last holder since we opened it
            try:
                same = _ident(os.lstat(self.path)) == _ident(os.fstat(fd))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
            doc = {
                "holder": self.holder,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(doc, sort_keys=True) + "\n").encode(), 0)
            return

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _ident(os.lstat(self.path)) == _ident(os.fstat(self.fd)):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        for directory in reversed(self.made):
            try:
                os.rmdir(directory)
            except OSError:
                break

    def _parents(self) -> None:
        """The destination's parent directory, made if missing (the staging will be there too)."""
        parent = os.path.dirname(self.path) or "."
        missing = []
        while parent and not os.path.lexists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            os.mkdir(directory, 0o755)
            self.made.append(directory)

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Taken(
                    "the lock path %s is a symlink: refusing to follow it (remove it if "
                    "you put it there)" % self.path
                ) from None
            raise
        st = os.fstat(fd)
        # proven ours through the descriptor (rbrules.proven: a file read on its own), and this
        # user's: a lock another user made, or can write, is never taken for ours
        why = owners.why_not_ours(self.path, st, alone=True)
        if why or st.st_uid != os.geteuid():
            os.close(fd)
            raise Taken(
                "the lock path %s is not a lock file of this user (type %o, %d links, "
                "owner uid %d, mode %04o): refusing to use it%s"
                % (
                    self.path,
                    stat.S_IFMT(st.st_mode),
                    st.st_nlink,
                    st.st_uid,
                    stat.S_IMODE(st.st_mode),
                    " (%s)" % why if why else "",
                )
            )
        return fd


def _ident(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino)


def _read(fd: int) -> str:
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except ValueError:
        doc = {}
    if not doc:
        return "a run that has not written its name yet"
    return "%s (engine pid %s on %s, since %s)" % (
        doc.get("holder", "?"),
        doc.get("pid", "?"),
        doc.get("host", "?"),
        doc.get("since", "?"),
    )
