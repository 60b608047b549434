"""The NVIDIA driver on this host: its version, the CUDA version it supports, and from that the
newest PTX ISA its JIT compiler accepts.

Read, in this order: libcuda's `cuDriverGetVersion` (exact: 13000 is CUDA 13.0; also what a
forward-compatibility libcuda on LD_LIBRARY_PATH reports), else the kernel driver's version
(`/proc/driver/nvidia/version`, else `nvidia-smi`) through DRIVER_TO_CUDA. No GPU and no
torch are needed; a host without a driver gives None.
"""

from __future__ import annotations

import subprocess
from typing import Dict, NamedTuple, Optional, Tuple

from . import arch

# The first Linux driver of each CUDA release (CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions"): a driver at least this new supports that CUDA version.
DRIVER_TO_CUDA = [
    ("590.44.01", "13.1"),
    ("580.65.06", "13.0"),
    ("575.51.03", "12.9"),
    ("570.26", "12.8"),
    ("565.57.01", "12.7"),  # the 565 branch reports CUDA 12.7 (no 12.7 toolkit was released)
    ("560.28.03", "12.6"),
    ("555.42.02", "12.5"),
    ("550.54.14", "12.4"),
    ("545.23.06", "12.3"),
    ("535.54.03", "12.2"),
    ("530.30.02", "12.1"),
    ("525.60.13", "12.0"),
    ("520.61.05", "11.8"),
    ("515.43.04", "11.7"),
    ("510.39.01", "11.6"),
    ("495.29.05", "11.5"),
    ("470.42.01", "11.4"),
    ("465.19.01", "11.3"),
    ("460.27.03", "11.2"),
    ("455.23", "11.1"),
    ("450.36.06", "11.0"),
]


def _tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split(".") if p.isdigit())


def cuda_for_driver(version: str) -> Optional[str]:
    """ "580.159.04" -> "13.0"; None for a driver older than CUDA 11.0 or not a version."""
    try:
        have = _tuple(version)
    except ValueError:
        return None
    if not have:
        return None
    have = have + (0,) * (3 - len(have))
    for first, cuda in DRIVER_TO_CUDA:
        if have >= _tuple(first):
            return cuda
    return None


def ptx_max_for_cuda(cuda: str) -> Optional[Tuple[int, int]]:
    """The newest PTX ISA a CUDA version's JIT accepts ("13.0" -> (9, 0), "12.6" -> (8, 5));
    None when the version is newer than the table (then it accepts at least the newest ISA
    listed, and anything newer is unknown here) or older than all of it."""
    want = arch.parse_version(cuda)
    newest_cuda = max(arch.parse_version(c) for c in arch.PTX_ISA_TO_CUDA.values())
    if want > newest_cuda:
        return None
    best = None
    for isa, first in sorted(arch.PTX_ISA_TO_CUDA.items()):
        if arch.parse_version(first) <= want:
            best = isa
    return best


def driver_version() -> Optional[str]:
    """The NVIDIA kernel driver version (580.95.05), from /proc or nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            for word in fh.readline().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def driver_cuda_version() -> Optional[str]:
    """The CUDA version the driver supports ("13.0"), from libcuda's cuDriverGetVersion."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(out)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return "%d.%d" % (out.value // 1000, (out.value % 1000) // 10)


class HostDriver(NamedTuple):
    version: Optional[str]  # kernel driver, "580.159.04"
    cuda: Optional[str]  # CUDA version it supports, "13.0"
    cuda_source: Optional[str]  # "libcuda" or "driver version table"
    ptx_max: Optional[Tuple[int, int]]  # newest PTX ISA its JIT accepts

    def describe(self) -> str:
        if not self.cuda:
            return "no NVIDIA driver found on this host"
        text = "driver %s, CUDA %s (%s)" % (self.version or "?", self.cuda, self.cuda_source)
        if self.ptx_max:
            text += ", JIT accepts PTX ISA <= %d.%d" % self.ptx_max
        else:
            text += ", newest PTX ISA it accepts not in the table"
        return text

    def as_dict(self) -> Dict[str, object]:
        return {
            "version": self.version,
            "cuda": self.cuda,
            "cuda_source": self.cuda_source,
            "ptx_max": "%d.%d" % self.ptx_max if self.ptx_max else None,
        }


def host_driver() -> HostDriver:
    """What this host's driver supports (all None without a driver)."""
    version = driver_version()
    cuda = driver_cuda_version()
    source = "libcuda" if cuda else None
    if cuda is None and version:
        cuda = cuda_for_driver(version)
        source = "driver version table" if cuda else None
    return HostDriver(version, cuda, source, ptx_max_for_cuda(cuda) if cuda else None)


def cuda_device_count() -> Tuple[Optional[int], str]:
    """(devices, how it was found) through libcuda (cuInit, cuDeviceGetCount) without torch;
    (None, why) when libcuda is missing or cuInit fails."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, "libcuda.so.1 cannot be loaded (%s)" % exc
    try:
        rc = lib.cuInit(0)
        if rc != 0:
            return None, "cuInit failed with CUDA error %d" % rc
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != 0:
            return None, "cuDeviceGetCount failed with CUDA error %d" % rc
    except AttributeError as exc:
        return None, "libcuda.so.1 lacks %s" % exc
    return count.value, "libcuda cuDeviceGetCount"
