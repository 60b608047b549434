"""Shared test setup: the golden-file flag, and the lab fixtures (real test hosts, real venvs)."""

from __future__ import annotations

import difflib
import glob
import os
import sys
from pathlib import Path

import pytest

from tests.lab.fixtures import *  # noqa: F401,F403 - lab, payload_small, payload_torch, ext4_scratch

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_sessionstart(session):
    """Remove what killed lab runs left (network namespaces, daemons, bridges, mounts) before any
    test builds a lab; live runs, this session's or another's, are never touched."""
    from tests.lab.stale import cleanup_all_stale

    removed = cleanup_all_stale()
    if removed:
        print(f"lab leftovers of dead runs removed: {', '.join(removed)}", file=sys.stderr)


@pytest.fixture(autouse=True)
def _no_kit_left_on_a_lab_host(request):
    """A run against the lab's hosts removes the kit directory it made on each of them (they share
    this machine's /tmp): a test after which one is left fails, naming it. (A run that cannot reach
    a host says what it left there; such a test removes it itself.)"""
    if request.node.get_closest_marker("e2e") is None and "lab" not in request.fixturenames:
        yield
        return
    before = set(glob.glob("/tmp/rbkit.*"))
    yield
    left = sorted(set(glob.glob("/tmp/rbkit.*")) - before)
    if left and _other_test_runs():
        # another pytest on this machine makes and removes kit directories in the same /tmp:
        # whose these are cannot be told, so they are named, not failed (CI runs one pytest)
        print(f"kit directories appeared during this test while another test run was going "
              f"(not checked): {left}", file=sys.stderr)
        return
    assert not left, f"kit directories left behind on a lab host: {left}"


def _other_test_runs() -> list[int]:
    """The pids of pytest processes on this machine other than this one and its parents."""
    mine = set()
    pid = os.getpid()
    while pid > 1:
        mine.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    others = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"pytest") or a == b"pytest" for a in argv[:3]):
            others.append(int(entry.name))
    return others


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite golden files from the current output instead of comparing")


@pytest.fixture
def golden(request):
    """golden(path, text): compare `text` with the file, or rewrite it with --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(path: Path, text: str) -> None:
        if update or not path.exists():
            if not update and IN_CI:
                pytest.fail(f"golden file {path} is missing; run: make regen")
            path.write_text(text, encoding="utf-8")
            return
        want = path.read_text(encoding="utf-8")
        if want != text:
            diff = "".join(difflib.unified_diff(
                want.splitlines(True), text.splitlines(True), str(path), "actual", n=2))
            pytest.fail(f"{path} differs from the output (if the change is intended, run "
                        f"`make regen`, i.e. pytest {request.node.nodeid.split('::')[0]} "
                        f"--update-golden):\n{diff[:6000]}")

    return check
