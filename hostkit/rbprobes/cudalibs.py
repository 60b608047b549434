"""Which CUDA library a file is, and which CUDA major version it belongs to.

The CUDA major of a library is read, in this order, from:
1. the file name for libraries whose soname major *is* the CUDA major (libcudart.so.12,
   libcublas.so.13, libcublasLt, libnvJitLink, libnvrtc, libcupti);
2. the pip distribution that installed the file (RECORD of `nvidia_*_cu12-*.dist-info`);
3. a `cuNN` path component (the CUDA 13 wheels' `nvidia/cu13/lib/` layout);
4. the DT_SONAME inside the file (a plain `libcudart.so` whose soname is libcudart.so.12).
Other libraries carry their own version in the soname (libcufft.so.11 is CUDA 12, libnccl.so.2
and libcudnn.so.9 exist for both), so for them only 2-3 can tell.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

from . import elf

# (family, basename pattern); an auditwheel hash (libcudart-d0da41ae.so.12) is allowed.
_TRACKED = [
    ("libcudart", "libcudart"),
    ("libcublasLt", "libcublasLt"),
    ("libcublas", "libcublas"),
    ("libnvJitLink", "libnvJitLink"),
    ("libnccl", "libnccl"),
    ("libcudnn", r"libcudnn(?:_[a-z_]+)?"),
    ("libnvrtc", "libnvrtc"),
    ("libcusparse", "libcusparse"),
    ("libcufft", "libcufft"),
    ("libcurand", "libcurand"),
    ("libcusolver", "libcusolver"),
    ("libcupti", "libcupti"),
]
_PATTERNS = [
    (family, re.compile(r"^%s(?:-[0-9a-f]{8})?\.so((?:\.[0-9]+)*)$" % stem))
    for family, stem in _TRACKED
]
# The libraries every report names, found or not.
MAIN = ["libcudart", "libcublas", "libcublasLt", "libnvJitLink", "libnccl", "libcudnn"]
# Families whose soname major equals the CUDA major.
SONAME_IS_CUDA = {"libcudart", "libcublas", "libcublasLt", "libnvJitLink", "libnvrtc", "libcupti"}

_CU_COMPONENT = re.compile(r"(?:^|[/_.-])cu([0-9]{2})(?=[/_.-]|$)")
_DIST_CU = re.compile(r"[-_]cu([0-9]{2})$")


def family(basename: str) -> Optional[str]:
    """'libcublasLt.so.13' -> 'libcublasLt'; None for anything not tracked."""
    for fam, pat in _PATTERNS:
        if pat.match(basename):
            return fam
    return None


def _soname_major(fam: str, name: str) -> Optional[int]:
    if fam not in SONAME_IS_CUDA:
        return None
    for pattern_family, pat in _PATTERNS:
        if pattern_family == fam:
            match = pat.match(name)
            if match and match.group(1):
                major = int(match.group(1).split(".")[1])
                # CUPTI went to year versions (libcupti.so.2025.1.1): not a CUDA major
                return major if major < 100 else None
    return None


def site_packages_of(path: str) -> Optional[str]:
    """The `.../site-packages` (or dist-packages) directory above `path`, if any."""
    parts = path.split(os.sep)
    for index in range(len(parts) - 1, 0, -1):
        if parts[index] in ("site-packages", "dist-packages"):
            return os.sep.join(parts[: index + 1])
    return None


_DIST_CACHE: Dict[str, Dict[str, Tuple[str, str]]] = {}


def dist_index(site_packages: str) -> Dict[str, Tuple[str, str]]:
    """realpath of each tracked library file -> (distribution name, version), from the RECORD
    files of the `nvidia*` distributions in one site-packages directory."""
    if site_packages in _DIST_CACHE:
        return _DIST_CACHE[site_packages]
    index: Dict[str, Tuple[str, str]] = {}
    for info in glob.glob(os.path.join(site_packages, "nvidia*.dist-info")):
        stem = os.path.basename(info)[: -len(".dist-info")]
        name, _, version = stem.partition("-")
        try:
            with open(os.path.join(info, "RECORD"), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    rel = line.split(",", 1)[0]
                    if family(os.path.basename(rel)):
                        full = os.path.realpath(os.path.join(site_packages, rel))
                        index[full] = (name, version)
        except OSError:
            continue
    _DIST_CACHE[site_packages] = index
    return index


def cuda_major(path: str, fam: Optional[str] = None) -> Tuple[Optional[int], str]:
    """(CUDA major, how it was found) for a library file; (None, "unknown") when nothing tells."""
    name = os.path.basename(path)
    fam = fam or family(name)
    if fam is None:
        return None, "unknown"
    major = _soname_major(fam, name)
    if major is not None:
        return major, "soname"
    real = os.path.realpath(path)
    site = site_packages_of(real)
    if site:
        dist = dist_index(site).get(real)
        if dist:
            match = _DIST_CU.search(dist[0].lower())
            if match:
                return int(match.group(1)), "dist:%s-%s" % dist
    # A `cuNN` directory: below site-packages when the file is in one (so a venv that happens
    # to be called /opt/app-cu12 does not count), else anywhere in its directory.
    where = os.path.dirname(real)[len(site) :] if site else os.path.dirname(path)
    match = _CU_COMPONENT.search(where)
    if match:
        return int(match.group(1)), "path"
    soname = _read_soname(path)
    if soname:
        major = _soname_major(fam, soname)
        if major is not None:
            return major, "elf-soname"
    return None, "unknown"


def _read_soname(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(64)
            if not data.startswith(elf.MAGIC):
                return None
            fh.seek(0)
            import mmap

            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                image = elf.parse(mm)
                return elf.soname(mm, image) if image else None
    except (OSError, ValueError):
        return None


def find_in_tree(root: str) -> List[Tuple[str, str]]:
    """(family, path) for every tracked library file under root (symlinks skipped: a real file
    is reported once, under its own name)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            fam = family(name)
            full = os.path.join(dirpath, name)
            if fam and not os.path.islink(full):
                out.append((fam, full))
    return out


def loaded_libraries(maps_text: str) -> List[Tuple[str, str]]:
    """(family, path) of each tracked library mapped into a process, from /proc/PID/maps text."""
    seen = set()
    out = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5]
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        fam = family(os.path.basename(path))
        if fam and path not in seen:
            seen.add(path)
            out.append((fam, path))
    return out
