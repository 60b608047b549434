"""pytest fixtures of the e2e lab.

Load them from the root conftest with `pytest_plugins = ["tests.lab.fixtures"]` (preferred: one
registration, one session lab) or `from tests.lab.fixtures import *`.

Without root or `ip netns`, a fixture that needs them skips the test with the reason -- except when
the environment variable CI is set (CI=true), where it fails the test with the reason instead: CI
must never pass by skipping the end-to-end tests.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .deps import ensure_packages, lab_unavailable_reason
from .disk import Ext4Mount, TmpfsMount, cleanup_stale_mounts
from .errors import LabError
from .netlab import Lab
from .payload import Payload, build_payload

__all__ = [
    "LAB_HOSTS",
    "clean_lab",
    "ext4_dir",
    "ext4_scratch",
    "in_ci",
    "lab",
    "payload_many",
    "payload_small",
    "payload_torch",
    "require_lab",
    "tmpfs_factory",
]

LAB_HOSTS = ("src", "dst", "jump")  # src cannot reach dst (nor jump) until lab.allow(...)
EXT4_SCRATCH_MIB = int(os.environ.get("RB_EXT4_SCRATCH_MIB", "8192"))  # sparse image


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_lab() -> None:
    """Make sure the lab can run here: the packages installed and root with `ip netns`.
    Otherwise pytest.fail (CI set) or pytest.skip (elsewhere), with the reason."""
    reason = None
    if os.geteuid() == 0:
        try:
            ensure_packages()
        except LabError as exc:
            reason = f"cannot install the lab's packages: {exc}"
    reason = reason or lab_unavailable_reason()
    if reason is not None:
        if in_ci():
            pytest.fail(f"e2e lab unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"e2e lab unavailable: {reason}")


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """Three real ssh hosts (src, dst, jump) in network namespaces, for the whole session.

    Tests that inject faults use `clean_lab` instead, which resets them afterwards."""
    require_lab()
    with Lab(LAB_HOSTS) as the_lab:
        yield the_lab


@pytest.fixture
def clean_lab(lab: Lab) -> Iterator[Lab]:
    """The session lab, reset before and after the test (links up, no direct links, original host
    keys, every sshd running): a test may kill, cut or re-key hosts freely."""
    lab.reset()
    yield lab
    lab.reset()


@pytest.fixture(scope="session")
def payload_small() -> Payload:
    """A venv with the tiny rb-payload package (payload-hello, payload-check), cached on disk.
    Read-only: build a private one with build_payload("small", dest=...) to break it."""
    return build_payload("small")


@pytest.fixture(scope="session")
def payload_torch() -> Payload:
    """payload_small plus torch 2.13.0 (CPU), cached on disk; first build about a minute."""
    return build_payload("torch")


@pytest.fixture(scope="session")
def payload_many() -> Payload:
    """payload_small plus 20,000 small files under site-packages/rb_payload_many (benchmarks)."""
    return build_payload("many", many_files=20000)


@pytest.fixture(scope="session")
def ext4_scratch() -> Iterator[Path]:
    """Mount point of a session-wide, loop-mounted ext4 (RB_EXT4_SCRATCH_MIB, default 8 GiB sparse).
    Put big test destinations here, not on the unjournaled root file system."""
    require_lab()
    cleanup_stale_mounts()
    with Ext4Mount(EXT4_SCRATCH_MIB) as mnt:
        yield mnt.path


@pytest.fixture
def ext4_dir(ext4_scratch: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory for this test on the ext4 scratch, removed afterwards."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:80]
    d = ext4_scratch / f"t-{os.getpid()}-{safe}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tmpfs_factory() -> Iterator[Callable[..., TmpfsMount]]:
    """make(size_kib, inodes=None) -> a mounted TmpfsMount (a "disk full" target), all unmounted
    after the test."""
    require_lab()
    mounts: list[TmpfsMount] = []

    def make(size_kib: int, inodes: int | None = None) -> TmpfsMount:
        m = TmpfsMount(size_kib, inodes=inodes).mount()
        mounts.append(m)
        return m

    yield make
    for m in mounts:
        m.unmount()
