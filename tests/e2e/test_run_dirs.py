"""Two runs at once, and a run directory per run (issue 34): each run writes its log, events and
report in a directory of its own (runs/NAME/<UTC time>-<pid>, runs/NAME/latest the newest); a
second run of the runbook waits for the first (RB_LOCK_WAIT), naming it, and writes nothing of the
first's. On 24efc9a both runs wrote runs/NAME/run.log, events.tsv and report.json: B's table showed
A's rows, and a locked-out run wiped A's log and report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_

pytestmark = pytest.mark.e2e


def slow_tar(tmp_path: Path, seconds: int) -> Path:
    """A tar whose sending end (the one given the scan's --null list) starts `seconds` late."""
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    tar = shutil.which("tar")
    assert tar
    (slow / "tar").write_text(
        f'#!/bin/sh\ncase " $* " in *" --null "*) sleep {seconds} ;; esac\nexec {tar} "$@"\n'
    )
    (slow / "tar").chmod(0o755)
    return slow


def start_slow_run(
    tmp_path: Path, script: Path, env: dict, seconds: int
) -> tuple[subprocess.Popen, Path]:
    """A run of `script` whose transfer starts `seconds` late (slow_tar), and its own directory
    once runs/e2e/latest names it."""
    slow = slow_tar(tmp_path, seconds)
    run = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=dict(env, PATH=f"{slow}:{env['PATH']}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    state = tmp_path / "runs" / "e2e"
    deadline = time.monotonic() + 60
    while not (state / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return run, (state / "latest").resolve()


def steps(report: dict) -> list[str]:
    return [s["id"] for s in report["steps"]]


def test_two_runs_at_once_each_keep_their_own_records(payload_small, tmp_path):
    """A (its transfer slowed) holds runs/e2e; B, started during A's transfer with
    RB_LOCK_WAIT=1, waits a second, names A, exits 1 and writes nothing. A's table and report
    are A's whole run; then C, after A, runs in a directory of its own and `latest` names it."""
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("RB_RUN_DIR", "RB_LOCK_WAIT")}
    a, a_dir = start_slow_run(tmp_path, script, env, 8)
    state = tmp_path / "runs" / "e2e"
    try:
        assert a_dir.name.endswith(f"-{a.pid}"), a_dir
        time.sleep(1)
        b = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            env=dict(env, RB_LOCK_WAIT="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert b.returncode == 1, b.stderr[-3000:]
        assert (
            f"waiting up to 1 s for another run of e2e (pid {a.pid}) that holds {state}" in b.stderr
        )
        assert (
            f"refusing to run: another run of e2e (pid {a.pid}) still holds {state} after 1 s"
            in b.stderr
        )
        assert "RB_LOCK_WAIT=SECONDS waits longer" in b.stderr
        assert sorted(p.name for p in state.iterdir() if p.name[0].isdigit()) == [a_dir.name]
    finally:
        _out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    doc = json.loads((a_dir / "report.json").read_text())
    assert doc["outcome"] == "ok"
    assert steps(doc)[:3] == ["preflight", "manifest", "transfer"]
    log = (a_dir / "run.log").read_text()
    assert "step preflight: ok" in log and "refusing to run" not in log
    assert f"report: {a_dir}/report.json" in err
    # C, after A: its own directory, the newest
    c = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert c.returncode == 0, c.stderr[-3000:]
    c_dir = (state / "latest").resolve()
    assert c_dir != a_dir
    assert json.loads((c_dir / "report.json").read_text())["outcome"] == "ok"
    assert json.loads((a_dir / "report.json").read_text()) == doc  # A's, as A left it
    assert "already holds this exact tree" in (c_dir / "run.log").read_text()
    assert oct((c_dir.stat().st_mode) & 0o777) == "0o700"
    assert not (state / ".run-lock").exists()


def test_only_the_newest_runs_are_kept(payload_small, tmp_path):
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = {k: v for k, v in os.environ.items() if k != "RB_RUN_DIR"}
    state = tmp_path / "runs" / "e2e"
    seen = []
    for _ in range(3):
        r = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            env=dict(env, RB_KEEP_RUNS="2"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        seen.append((state / "latest").resolve().name)
        time.sleep(1.1)  # a new second: a new name
    kept = sorted(p.name for p in state.iterdir() if p.name[0].isdigit())
    assert kept == sorted(seen[1:]), (kept, seen)


@pytest.mark.parametrize(
    "name,value,least",
    [
        ("RB_KEEP_RUNS", "0", 1),
        ("RB_KEEP_RUNS", "two", 1),
        ("RB_LOCK_WAIT", "-1", 0),
        ("RB_LOCK_WAIT", "1s", 0),
    ],
)
def test_a_count_that_is_not_one_is_refused_before_anything_is_written(
    payload_small, tmp_path, name, value, least
):
    """RB_KEEP_RUNS=0 would remove the run's own directory, `two` made bash compare a name: each is
    refused, exit 2, naming the variable, and nothing is written (no runs/ directory)."""
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("RB_RUN_DIR", name)}
    r = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        env=dict(env, **{name: value}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        f"refusing to run: {name}='{value}' is not a whole number of at least {least}" in r.stderr
    )
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "d").exists()
