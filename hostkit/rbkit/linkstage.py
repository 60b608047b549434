"""The staging of a re-run: the files unchanged since the current install hard-linked (or cloned)
from it into a fresh staging beside the destination, so the stream carries only what changed
(`stage`: the same rule as manifest.delta, so a host installed from a manifest asks for a subset
of what that manifest's delta sends). The engine's stage step (staging.py) calls it.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from rbrules import owners

from . import manifest, safefs
from .installs import (
    remove,
)


def stage(dest: str, staging: str, new: dict, installed: dict, names_path: str) -> dict:
    """An incremental install's staging: a fresh `staging` with every directory of `new`, and each
    unchanged file hard-linked from the previous install at `dest` (same digest, mode, size and
    mtime in both manifests, and the inode linked still has the recorded stat and is proven ours:
    _link_unchanged); writes the
    NUL-separated names tar must still send (changed and new files, relocatable files, every
    directory and symlink: tar restores their modes and targets). `dest` is never written.
    A staging path that is a link is removed as a link (its target is not touched).

    Each directory is reached through descriptors, one component at a time without following a
    link (safefs.open_dir), and each file is linked by name in its directory (linkat without
    AT_SYMLINK_FOLLOW: a link planted at the name is linked as the link, never what it names);
    the stat check is made on the staging's new name after the link, so it is of the very inode
    linked. One directory's descriptors are open at a time (a manifest lists a directory's
    entries together, parents first)."""
    if (
        new["header"].get("algo") != installed["header"].get("algo")
        or new["header"]["algo"] == "none"
    ):
        raise ValueError("an incremental install needs digests of one algorithm in both manifests")
    before = {e["p"]: e for e in installed["entries"]}
    if os.path.lexists(staging):
        remove(staging)
    os.makedirs(staging)
    send: list[str] = []
    inodes: dict = {}
    linked = linked_bytes = send_bytes = send_files = 0
    here = _DirPair(dest, staging)
    try:
        for entry in new["entries"]:  # parents come before their children
            rel = entry["p"]
            head, _, name = rel.rpartition("/")
            here.enter(head)
            if entry["t"] == "d":
                os.mkdir(name, 0o777, dir_fd=here.dst)
                send.append(rel)
                continue
            old = before.get(rel)
            if (
                here.src is not None
                and manifest.linkable(old, entry)
                and _link_unchanged(here.src, here.dst, name, old, inodes, rel)
            ):
                linked += 1
                linked_bytes += entry["s"]
                continue
            send.append(rel)
            if entry["t"] == "f":
                send_files += 1
                send_bytes += entry["s"]
    finally:
        here.close()
    buf = bytearray()
    for rel in send:
        buf += rel.encode("utf-8", "surrogateescape") + b"\0"
    safefs.write_file(names_path, bytes(buf), 0o600)
    return {
        "linked": linked,
        "linked_bytes": linked_bytes,
        "send_files": send_files,
        "send_bytes": send_bytes,
        "send_entries": len(send),
        "inodes": inodes,
        "removed": len(set(before) - {e["p"] for e in new["entries"]}),
    }


class _DirPair:
    """The descriptors of one directory in the install (`src`: None when it is not a directory
    reached without following a link) and in the staging (`dst`), for `stage`. Its ancestors'
    stay open while the walk is below them, so each directory is opened once, from its parent,
    with O_NOFOLLOW (safefs.open_dir of one component)."""

    def __init__(self, src_root: str, dst_root: str) -> None:
        self.stack = [("", safefs.open_dir(src_root), safefs.open_dir(dst_root))]
        self.src: Optional[int] = self.stack[0][1]
        self.dst: int = self.stack[0][2]

    def enter(self, rel: str) -> None:
        if rel == self.stack[-1][0]:
            return
        while len(self.stack) > 1 and not (
            rel == self.stack[-1][0] or rel.startswith(self.stack[-1][0] + "/")
        ):
            self._pop()
        at, src, dst = self.stack[-1]
        for part in [p for p in rel[len(at) :].split("/") if p]:
            at = at + "/" + part if at else part
            try:
                src = safefs.open_dir_at(src, part) if src is not None else None
            except OSError:
                src = None  # gone, or a link now: nothing is linked here
            try:
                dst = safefs.open_dir_at(dst, part)
            except BaseException:
                if src is not None:
                    os.close(src)
                raise
            self.stack.append((at, src, dst))
        self.src, self.dst = src, dst

    def _pop(self) -> None:
        _rel, src, dst = self.stack.pop()
        for fd in (src, dst):
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        while self.stack:
            self._pop()


def _link_unchanged(
    src_dir: int, dst_dir: int, name: str, old: dict, inodes: dict, rel: str
) -> bool:
    """Hard-link `name` from the install's directory into the staging's when the inode linked is
    a regular file with the recorded mode, size and mtime, proven ours (owned by this user or
    root, writable by no other: rbrules.proven) (its (st_dev, st_ino) go in `inodes` under
    `rel`); else nothing is left at `name`."""
    try:
        os.link(name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    except OSError:
        return False  # gone, another file system, not allowed: send
    st = os.stat(name, dir_fd=dst_dir, follow_symlinks=False)
    # the very inode linked: the install's manifest says what it was, not whose it is now (a
    # file another user owns or can write is never taken into root's new install)
    if (
        stat.S_ISREG(st.st_mode)
        and stat.S_IMODE(st.st_mode) == old.get("m")
        and st.st_size == old.get("s")
        and int(st.st_mtime) == old.get("mt")
        and owners.why_not_ours(rel, st) is None
    ):
        inodes[rel] = (st.st_dev, st.st_ino)
        return True
    os.unlink(name, dir_fd=dst_dir)
    return False
