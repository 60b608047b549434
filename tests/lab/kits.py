"""Whose run made a kit directory on a lab host (the lab's hosts share this machine's /tmp).

A runbook ships its kit to each ssh host into `mktemp -d /tmp/rbkit.XXXXXXXXXX` and, first thing,
writes there an `owner` file naming its run (runtime/prepare.sh.j2): `runbook NAME run from HOST
(pid PID, run dir DIR)`, as the destination's lock names its holder. The tests' check that a run
leaves no kit behind (tests/conftest.py) blames a test only for the kits of its own session's runs
(run directories under the session's temporary root or the checkout): another process on this
machine (a benchmark, another pytest) makes and removes kits in the same /tmp meanwhile.
"""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

PATTERN = "/tmp/rbkit.*"
_OWNER = re.compile(r"\(pid \d+, run dir (.+)\)\s*$")
_WRITING_S = 0.5  # a kit seen between its mktemp and its owner file: the owner comes next


def kit_dirs() -> set[str]:
    """The kit directories on this machine (and so on every lab host) now."""
    return set(glob.glob(PATTERN))


def run_dir_of(kit: str) -> Optional[str]:
    """The run directory a kit's `owner` file names; None when it has none (a kit made before the
    owner file, or cut between its mktemp and the owner's line: the check cannot tell whose)."""
    deadline = time.monotonic() + _WRITING_S
    while True:
        try:
            found = _OWNER.search(Path(kit, "owner").read_text(errors="replace"))
            return found.group(1) if found else None
        except FileNotFoundError:
            if time.monotonic() >= deadline or not os.path.isdir(kit):
                return None
            time.sleep(0.05)
        except OSError:
            return None


def sort_kits(
    kits: Iterable[str], roots: Sequence[Path | str]
) -> tuple[list[str], list[str], list[str]]:
    """(this session's, other runs', unknown) of `kits` that are still there: a kit is this
    session's when the run directory its owner names lies under one of `roots` (with links
    resolved), another run's when it lies elsewhere, unknown without an owner."""
    where = [os.path.realpath(r) for r in roots]
    ours, theirs, unknown = [], [], []
    for kit in sorted(kits):
        run = run_dir_of(kit)
        if not os.path.isdir(kit):
            continue  # removed meanwhile: not left behind
        if run is None:
            unknown.append(kit)
            continue
        real = os.path.realpath(run)
        mine = any(real == r or real.startswith(r.rstrip("/") + "/") for r in where)
        (ours if mine else theirs).append(f"{kit} ({run})" if not mine else kit)
    return ours, theirs, unknown


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def other_kit_makers() -> list[int]:
    """Pids of what else on this machine may make kits in /tmp now: another pytest (not this one
    nor its parents), or the sshd of a lab this process did not start (a benchmark's)."""
    me = os.getpid()
    above = set()
    pid = me
    while pid > 1:
        above.add(pid)
        pid = _parent(pid)
    others = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in above:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pytest = any(a.endswith(b"pytest") or a == b"pytest" for a in argv[:3])
        lab_sshd = (
            b"sshd" in argv[0] and b"/sshd_config" in b" ".join(argv) and b"-D" in b" ".join(argv)
        )
        if not (pytest or lab_sshd):
            continue
        pid = int(entry.name)
        while pid > 1 and pid != me:  # a lab this session started is not another's
            pid = _parent(pid)
        if pid != me:
            others.append(int(entry.name))
    return others
