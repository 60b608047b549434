"""The relay counts the CPUs each machine may use (issue 47), not the machine's: dst's sshd pinned
with taskset to one CPU (its sessions inherit the affinity, as a Slurm job's or a container's
processes do), a tree of 300 MB with jobs 4 goes in one stream, not the two the same run takes
with dst unpinned (tests/e2e/test_relay_streams.py), and the run says why in the relay's line.
On 44a2c10 each end counted its jobs alone: two streams, dst's one CPU shared by both."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.e2e.test_local_runbook import big_source
from tests.e2e.test_relay import build, report, run, snapshot
from tests.e2e.test_relay_streams import streams_spec

pytestmark = pytest.mark.e2e


def _pin(pid: int, cpus: str) -> None:
    """Every thread of `pid` onto `cpus` (taskset -a -p -c): its children from now on inherit it."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


def test_a_destination_pinned_to_one_cpu_gets_one_stream_and_the_run_says_why(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to pin dst's sshd to one of them")
    first = min(os.sched_getaffinity(0))
    pid = int(lab.host("dst").pid_file.read_text().split()[0])
    was = sorted(os.sched_getaffinity(pid))
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "dst" / "venv"
    _pin(pid, str(first))
    try:
        r = run(tmp_path, build(tmp_path, streams_spec(lab, src, dst, jobs=4)))
    finally:
        _pin(pid, ",".join(str(c) for c in was))
    assert r.returncode == 0, r.stderr[-3000:]
    said = re.search(
        r"relay: 1 stream \(no more streams than the fewest CPUs a machine may use, "
        r"1; CPUs usable: here (\d+) of (\d+)[^,]*, src \d+ of \d+[^,]*, "
        r"dst 1 of (\d+) \(affinity (\d+)\)\)",
        r.stderr,
    )
    assert said, r.stderr[-3000:]
    assert said.group(4) == str(first) and int(said.group(3)) >= 2, said.group(0)
    assert "streams side by side" not in r.stderr
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert not steps["transfer"]["detail"].endswith("streams side by side"), steps["transfer"]
    moved = {
        k: v for k, v in snapshot(src).items() if "__pycache__" not in k and not k.endswith(".pyc")
    }
    got = snapshot(dst)
    assert all(got[k] == moved[k] for k in moved if k.startswith("lib/")), sorted(
        set(moved) ^ set(got)
    )
