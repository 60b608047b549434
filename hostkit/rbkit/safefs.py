"""Writes and reads inside trees we did not make: never through a link, never a guessable name.

The kit runs as root over trees other users wrote (the source venv, the host's /tmp, a shared
parent directory). A tree may hold a link where the kit would write (`bin/activate.rb-tmp ->
/etc/...`), a `bin/` that is a link out of the tree, or a file that is a link to a secret. So:

- a directory inside a tree is reached from the tree's root one component at a time, each opened
  with O_NOFOLLOW|O_DIRECTORY (`open_dir`); the root path itself is the caller's;
- a write goes to a temp file made with O_CREAT|O_EXCL|O_NOFOLLOW and a random name in the
  target's own directory, gets its mode with fchmod on the descriptor (and its times with futimens),
  is fsync'd, and replaces the target with one rename (`write_at`, `write_in`, `write_file`): a link
  at the target's name is replaced, never written through;
- a read opens the final component with O_NOFOLLOW and reads only a regular file (`read_at`).

Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import Optional, Tuple

from rbrules.proven import read_all

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MAX_NAME = 200  # of the target's name inside a temp name (NAME_MAX is 255)


def open_dir(root: str, rel: str = "") -> int:
    """A descriptor of the directory `root`/`rel`. `root` is opened as given (links in the path
    the caller chose are the caller's); each component of `rel` is opened without following a
    link, so `rel` cannot lead out of the tree. OSError (ELOOP, ENOTDIR, ENOENT) otherwise."""
    fd = os.open(root or ".", _DIR_FLAGS)
    try:
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EPERM, "'..' in a path inside a tree", rel)
            nfd = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir_at(dir_fd: int, name: str) -> int:
    """A descriptor of the directory `name` in `dir_fd`, not following a link (one component of
    `open_dir`, for a walk that keeps its parent open)."""
    if not name or name in (".", "..") or "/" in name:
        raise OSError(errno.EINVAL, "not one component of a path", name)
    return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dir_fd)


def fsync_dir(dir_fd: int) -> None:
    try:
        os.fsync(dir_fd)
    except OSError as exc:  # some file systems cannot fsync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def create_excl(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """Open a new file `name` in `dir_fd` for writing: O_CREAT|O_EXCL|O_NOFOLLOW (an existing file
    or link of that name is an error, never opened), mode set with fchmod."""
    fd = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def temp_name(name: str) -> str:
    return f".{name[:_MAX_NAME]}.rb-tmp.{secrets.token_hex(8)}"


def make_temp(dir_fd: int, name: str, mode: int = 0o600) -> Tuple[int, str]:
    """A new temp file beside `name` (a random name, O_EXCL|O_NOFOLLOW): (fd, temp name)."""
    for _ in range(16):
        tmp = temp_name(name)
        try:
            return create_excl(dir_fd, tmp, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp name", name)


def write_at(
    dir_fd: int,
    name: str,
    data: bytes,
    mode: int,
    *,
    times_ns: Optional[Tuple[int, int]] = None,
    sync: bool = True,
) -> None:
    """Replace `name` in the directory `dir_fd` with `data`, mode `mode` (and atime/mtime
    `times_ns`), through a temp file and one rename. A link named `name` is replaced, not
    followed."""
    fd, tmp = make_temp(dir_fd, name, 0o600)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            if times_ns is not None:
                os.utime(fd, ns=times_ns)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    if sync:
        fsync_dir(dir_fd)


def write_in(
    root: str,
    rel: str,
    data: bytes,
    mode: int,
    *,
    times_ns: Optional[Tuple[int, int]] = None,
    sync: bool = True,
) -> None:
    """`write_at` for the file `rel` inside the tree `root` (no link followed below `root`)."""
    head, name = os.path.split(rel)
    if not name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name", rel)
    dir_fd = open_dir(root, head)
    try:
        write_at(dir_fd, name, data, mode, times_ns=times_ns, sync=sync)
    finally:
        os.close(dir_fd)


def write_file(path: str, data: bytes, mode: int = 0o644, *, sync: bool = True) -> None:
    """`write_at` for a file whose directory the caller chose (an env file, a names list): the
    directory path is taken as given, the file itself is never followed."""
    head, name = os.path.split(path)
    write_in(head or ".", name, data, mode, sync=sync)


def write_private(path: str, text: str) -> None:
    """A text file of this run's private directory (a plan, its listing): a new file and one
    rename, never through a link."""
    write_file(path, text.encode("utf-8"), 0o600, sync=False)


def read_at(
    dir_fd: int, name: str, limit: Optional[int] = None
) -> Optional[Tuple[bytes, os.stat_result]]:
    """(content, stat) of `name` in `dir_fd` if it is a regular file (not a link, a FIFO, a
    device); None otherwise. With `limit`, a larger file is None too."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (
            errno.ELOOP,
            errno.ENOENT,
            errno.ENOTDIR,
            errno.ENXIO,
            errno.EISDIR,
            errno.EACCES,
            errno.EPERM,
        ):
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
            return None
        return read_all(fd), st
    finally:
        os.close(fd)


def read_in(
    root: str, rel: str, limit: Optional[int] = None
) -> Optional[Tuple[bytes, os.stat_result]]:
    """`read_at` for `rel` inside the tree `root`; None when a component is a link or missing."""
    head, name = os.path.split(rel)
    try:
        dir_fd = open_dir(root, head)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    try:
        return read_at(dir_fd, name, limit)
    finally:
        os.close(dir_fd)
