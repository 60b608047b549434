"""GPU architecture names and NVIDIA's rules for which code runs on which device.

A *device* has a compute capability (major, minor), e.g. 10.3 for a B300, named sm_103.
*Code* is either SASS (machine code, `sm_XY[a|f]`) or PTX (`compute_XY[a|f]`, compiled by the
driver's JIT on first use). The rules (CUDA programming guide, "Binary compatibility" and
"Family-specific / architecture-specific features", CUDA 12.9+):

| code            | runs on a device of capability D when                                  |
|-----------------|-------------------------------------------------------------------------|
| sm_XY           | D.major == X and D.minor >= Y                                            |
| sm_XYf (family) | D.major == X and D.minor >= Y  (sm_100f: 10.0 and 10.3; sm_103f: 10.3)   |
| sm_XYa          | D == X.Y exactly                                                         |
| compute_XY      | D >= X.Y (any later major too), if the driver accepts the PTX ISA version|
| compute_XYf     | D.major == X and D.minor >= Y, driver permitting                         |
| compute_XYa     | D == X.Y exactly, driver permitting                                      |

Capabilities and arch numbers: sm_XY with a two-digit number means X.Y (sm_90 -> 9.0);
three digits mean XX.Y (sm_103 -> 10.3, sm_120 -> 12.0).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

_ARCH = re.compile(r"^(sm|compute|lto)_([0-9]{2,3})([af]?)$")
_CAP = re.compile(r"^([0-9]{1,2})\.([0-9])$")

# PTX ISA version -> first CUDA release that accepts it (driver side, the JIT). Used only to
# explain a PTX version in words; the comparison itself is on the PTX ISA version.
PTX_ISA_TO_CUDA = {
    (7, 0): "11.0",
    (7, 1): "11.1",
    (7, 2): "11.2",
    (7, 3): "11.3",
    (7, 4): "11.4",
    (7, 5): "11.5",
    (7, 6): "11.6",
    (7, 7): "11.7",
    (7, 8): "11.8",
    (8, 0): "12.0",
    (8, 1): "12.1",
    (8, 2): "12.2",
    (8, 3): "12.3",
    (8, 4): "12.4",
    (8, 5): "12.5",
    (8, 6): "12.7",
    (8, 7): "12.8",
    (8, 8): "12.9",
    (9, 0): "13.0",
    (9, 1): "13.1",
}


def arch_number_to_capability(number: int) -> Tuple[int, int]:
    """90 -> (9, 0); 103 -> (10, 3); 120 -> (12, 0)."""
    return number // 10, number % 10


def capability_to_arch(cap: Tuple[int, int]) -> str:
    return "sm_%d%d" % cap


def parse_capability(text: str) -> Tuple[int, int]:
    """ "10.3" -> (10, 3). Raises ValueError."""
    match = _CAP.match(text.strip())
    if not match:
        raise ValueError("%r is not a compute capability like '10.3'" % (text,))
    return int(match.group(1)), int(match.group(2))


def parse_arch(text: str) -> Tuple[str, int, int, str]:
    """ "sm_100a" -> ("sm", 10, 0, "a"); "compute_90" -> ("compute", 9, 0, "")."""
    match = _ARCH.match(text.strip().lower())
    if not match:
        raise ValueError("%r is not an architecture name like 'sm_103' or 'compute_90a'" % (text,))
    major, minor = arch_number_to_capability(int(match.group(2)))
    return match.group(1), major, minor, match.group(3)


def parse_target(text: str) -> Tuple[int, int]:
    """A device to run on, as "sm_103" or "10.3" -> (10, 3). A suffix on sm_ is ignored:
    a device is a capability, `a`/`f` only qualify code."""
    if _CAP.match(text.strip()):
        return parse_capability(text)
    kind, major, minor, _suffix = parse_arch(text)
    if kind != "sm":
        raise ValueError("%r: a target device is named sm_XY (or X.Y), not %s_" % (text, kind))
    return major, minor


def code_name(kind: str, number: int, suffix: str) -> str:
    """("sass", 100, "a") -> "sm_100a"; ("ptx", 90, "") -> "compute_90"."""
    return "%s_%d%s" % ("sm" if kind == "sass" else "compute", number, suffix)


def runs_on(
    kind: str,
    number: int,
    suffix: str,
    device: Tuple[int, int],
    ptx_version: Optional[Tuple[int, int]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
) -> bool:
    """Whether code of `kind` ("sass" or "ptx") for arch `number` (90, 103, ...) with `suffix`
    ("", "a", "f") can run on a device of capability `device`.

    For PTX, `ptx_version` is the PTX ISA version of the code and `driver_ptx_max` the newest PTX
    ISA the driver's JIT accepts; when either is unknown the version is not held against it.
    """
    code = arch_number_to_capability(number)
    if suffix == "a":
        ok = device == code
    elif suffix == "f" or kind == "sass":
        ok = device[0] == code[0] and device[1] >= code[1]
    else:  # plain PTX: forward to any later device
        ok = device >= code
    if ok and kind == "ptx" and ptx_version and driver_ptx_max:
        ok = ptx_version <= driver_ptx_max
    return ok


def name_runs_on(name: str, device: Tuple[int, int]) -> bool:
    """Same rule for a name as torch.cuda.get_arch_list() gives them ("sm_90", "compute_120")."""
    kind, major, minor, suffix = parse_arch(name)
    return runs_on("ptx" if kind == "compute" else "sass", major * 10 + minor, suffix, device)


def parse_version(text: str) -> Tuple[int, int]:
    """ "9.0" -> (9, 0) (a PTX ISA or CUDA version)."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ValueError("%r is not a version like '9.0'" % (text,)) from None
