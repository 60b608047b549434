"""Shared test setup: the golden-file flag, and the lab fixtures (real test hosts, real venvs)."""

from __future__ import annotations

import difflib
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
def _no_kit_left_on_a_lab_host(request, tmp_path_factory):
    """A run against the lab's hosts removes the kit directory it made on each of them (they share
    this machine's /tmp): a test after which one of this session's runs left one fails, naming it.
    (A run that cannot reach a host says what it left there; such a test removes it itself.) Whose
    run made a kit, its `owner` file says (tests/lab/kits.py): other processes' kits (benchmarks,
    another pytest) are named, not blamed; one without an owner (a runbook compiled before the
    owner file) is blamed unless another pytest or another lab's sshd runs on this machine."""
    if request.node.get_closest_marker("e2e") is None and "lab" not in request.fixturenames:
        yield
        return
    from tests.lab import kits

    before = kits.kit_dirs()
    yield
    left = kits.kit_dirs() - before
    roots = (tmp_path_factory.getbasetemp(), ROOT)
    ours, theirs, unknown = kits.sort_kits(left, roots)
    if theirs:
        print(
            f"kit directories of other processes' runs appeared during this test (not "
            f"checked): {theirs}",
            file=sys.stderr,
        )
    if unknown and kits.other_kit_makers():
        # another pytest or lab on this machine makes and removes kits in the same /tmp
        print(
            f"kit directories without an owner appeared during this test while another test "
            f"run or lab was going (not checked): {unknown}",
            file=sys.stderr,
        )
        unknown = []
    assert not ours + unknown, f"kit directories left behind on a lab host: {ours + unknown}"


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


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
            diff = "".join(
                difflib.unified_diff(
                    want.splitlines(True), text.splitlines(True), str(path), "actual", n=2
                )
            )
            pytest.fail(
                f"{path} differs from the output (if the change is intended, run "
                f"`make regen`, i.e. pytest {request.node.nodeid.split('::')[0]} "
                f"--update-golden):\n{diff[:6000]}"
            )

    return check
