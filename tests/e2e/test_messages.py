"""What a user reads when a run fails (issue 36, "Messages"): each message says who cannot do
what where, why, and the spec key to change; no Python exception text is the message, and each
is said once (plus the report's row)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_and_run

pytestmark = pytest.mark.e2e


def test_destination_not_writable_says_who_where_why_once(payload_small, tmp_path):
    """A destination whose parent is on a read-only mount (a bind mount of a tmp dir)."""
    parent = tmp_path / "ro"
    parent.mkdir()
    subprocess.run(["mount", "--bind", str(parent), str(parent)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(parent)], check=True)
        r = compile_and_run(tmp_path, payload_small.venv, parent / "venv")
    finally:
        subprocess.run(["umount", str(parent)], check=True)
    assert r.returncode == 1, r.stderr[-3000:]
    lock = parent / ".venv.rb-lock"
    lines = [x for x in r.stderr.splitlines() if str(lock) in x]
    # once in the log (the FAILED line) and once in the report's row
    assert len(lines) == 2, r.stderr[-3000:]
    failed = lines[0]
    assert "FAILED in step preflight on host here: root cannot create " + str(lock) in failed
    assert "read-only file system (EROFS: the file system that holds it is mounted read-only)" \
        in failed
    assert f"keeps its lock and its staging beside the destination {parent / 'venv'}" in failed
    assert "set transfer.to to a destination whose parent directory root can write" in failed
    assert lines[1].startswith("preflight  here  failed")
    # no Python exception text; the traceback is in the log file only
    assert "Error:" not in r.stderr and "Errno" not in r.stderr and "Traceback" not in r.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    assert "Traceback (most recent call last)" in log and "[Errno 30]" in log
    # no checks ran: no line counting them
    assert "checks: 0 passed" not in r.stderr + r.stdout
