"""Walking a venv we did not write: os.scandir without following links, regular files only;
pyvenv.cfg; which installed distribution owns a file."""

from __future__ import annotations

import csv
import glob
import io
import os
import stat
from typing import Dict, Iterator, List, Optional, Tuple

from rbrules import links


def walk(root: str, skip_dirs=("__pycache__",)) -> Iterator[Tuple[str, "os.DirEntry"]]:
    """(directory path, entry) for every entry below root, depth first in name order. Never
    follows a symbolic link (a link to a directory is yielded as an entry, not entered)."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            yield top, entry
            try:
                if entry.is_dir(follow_symlinks=False) and entry.name not in skip_dirs:
                    subdirs.append(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def is_regular(entry: "os.DirEntry") -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def lstat_kind(path: str) -> str:
    """ "file", "dir", "link", "missing" or "special" (FIFO, socket, device)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "special"


def read_small(path: str, limit: int = 1 << 20) -> Optional[bytes]:
    """The first `limit` bytes of a regular file (not through a link, never blocking on a
    FIFO); None for anything else."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = limit
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def pyvenv_cfg(venv: str) -> Optional[Dict[str, str]]:
    """pyvenv.cfg as {key: value} (keys lower-cased), or None when there is none."""
    data = read_small(os.path.join(venv, "pyvenv.cfg"), 1 << 16)
    if data is None:
        return None
    out: Dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def site_packages(venv: str) -> List[str]:
    """The venv's site-packages directories (lib/pythonX.Y/site-packages, lib64 too)."""
    found = []
    for pattern in (
        "lib/python*/site-packages",
        "lib64/python*/site-packages",
        "lib/site-packages",
        "Lib/site-packages",
    ):
        for site_dir in sorted(glob.glob(os.path.join(venv, pattern))):
            real = os.path.realpath(site_dir)
            if os.path.isdir(site_dir) and real not in {os.path.realpath(f) for f in found}:
                found.append(site_dir)
    return found


def site_packages_of(path: str) -> Optional[str]:
    parts = path.split(os.sep)
    for index in range(len(parts) - 1, 0, -1):
        if parts[index] in ("site-packages", "dist-packages"):
            return os.sep.join(parts[: index + 1])
    return None


_OWNERS: Dict[str, Dict[str, str]] = {}


def owner(path: str) -> Optional[str]:
    """The distribution ("torch 2.11.0") whose RECORD lists `path`, or None."""
    site = site_packages_of(os.path.abspath(path))
    if not site:
        return None
    if site not in _OWNERS:
        index: Dict[str, str] = {}
        for info in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
            stem = os.path.basename(info)[: -len(".dist-info")]
            name, _, version = stem.partition("-")
            data = read_small(os.path.join(info, "RECORD"), 64 << 20)
            if data is None:
                continue
            for row in csv.reader(io.StringIO(data.decode("utf-8", "replace"))):
                if row and row[0]:
                    index[os.path.normpath(os.path.join(site, row[0]))] = "%s %s" % (name, version)
        _OWNERS[site] = index
    return _OWNERS[site].get(os.path.normpath(os.path.abspath(path)))


# rbrules.links' view of the tree `root` (one function for the scan and the checks)
link_lookup = links.tree_lookup


def inside(path: str, roots: List[str]) -> bool:
    """Whether `path` (absolute, normalised) lies in one of `roots` (or is one)."""
    for listed in roots:
        root = listed.rstrip(os.sep) or os.sep
        if path == root or path.startswith(root + os.sep) or root == os.sep:
            return True
    return False
