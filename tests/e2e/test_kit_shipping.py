"""The kit on ssh hosts (issue #15 C1): a private directory per run, its content checked by hash,
never a guessable /tmp path another user of the host can plant code in first."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_relay import build, report, run, spec_text
from tests.lab import kits

EVIL = "rbevil"


def unprivileged_user() -> str:
    try:
        pwd.getpwnam(EVIL)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", EVIL],
            check=True,
            capture_output=True,
            timeout=60,
        )
    return EVIL


def as_user(user: str, script: str) -> None:
    subprocess.run(
        ["runuser", "-u", user, "--", "sh", "-c", script],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.e2e
def test_a_kit_planted_in_tmp_by_another_user_is_never_run(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    user = unprivileged_user()
    dst = tmp_path / "dest" / "venv"
    dst.parent.mkdir()
    dst.parent.chmod(0o755)
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst))
    text = script.read_text()
    # where a runbook of 90eb1ef looked for its kit on each host, and the same from the pin
    ids = set(re.findall(r"^readonly RB_KIT_ID=([0-9a-f]+)$", text, re.M))
    ids |= {sha[:16] for sha in re.findall(r"^readonly RB_KIT_SHA256=([0-9a-f]{64})$", text, re.M)}
    canary = Path("/tmp") / f"rbevil-canary-{tmp_path.name}"
    planted = []
    for kit_id in ids:
        d = Path("/tmp") / f"rbkit-{kit_id}"
        shutil.rmtree(d, ignore_errors=True)
        as_user(
            user,
            f"mkdir -p {d}/rbkit && touch {d}/.complete && "
            f'printf \'open("{canary}", "w").write("ran")\\n\' >{d}/rbkit/__main__.py && '
            f"touch {d}/rbkit/__init__.py",
        )
        planted.append(d)
    before = kits.kit_dirs()
    try:
        r = run(tmp_path, script)
        assert r.returncode == 0, r.stderr[-4000:]
        assert not canary.exists(), "code another user planted in /tmp ran as root"
        assert report(tmp_path)["outcome"] == "ok"
        # each run's private kit directories are gone afterwards (other processes' may come)
        assert kits.sort_kits(kits.kit_dirs() - before, [tmp_path])[0] == []
    finally:
        for d in planted:
            shutil.rmtree(d, ignore_errors=True)
        canary.unlink(missing_ok=True)


@pytest.mark.e2e
def test_a_pinned_kit_file_that_changed_is_refused(clean_lab, payload_small, tmp_path):
    """generated/.kit/<sha>.tar is checked against the hash the runbook pins before anything runs
    (the second check, on each ssh host after the copy, is not planted here)."""
    lab = clean_lab
    dst = tmp_path / "dest" / "venv"
    dst.parent.mkdir()
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst))
    kit = next((tmp_path / ".kit").glob("*.tar"))
    data = bytearray(kit.read_bytes())
    data[1000] ^= 1
    kit.write_bytes(bytes(data))
    r = run(tmp_path, script)
    assert r.returncode != 0
    assert "not the" in r.stderr and "this runbook pins" in r.stderr
    assert not dst.exists()


@pytest.mark.e2e
def test_a_kit_directory_names_the_run_that_made_it(clean_lab, payload_small, tmp_path):
    """Each kit directory's `owner` file names its run as the destination's lock does (runbook,
    machine, pid, run directory): a kit a killed run left on a host says whose it was, and the
    tests' leftover check (tests/lab/kits.py) blames only its own session's runs for one."""
    lab = clean_lab
    script = build(tmp_path, spec_text(lab, payload_small.venv, tmp_path / "dest" / "venv"))
    before = kits.kit_dirs()
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script), "--only", "preflight"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    owners: dict[str, str] = {}
    while proc.poll() is None:
        # a kit seen before its owner file is written (or while it is) is read again next time
        for kit in kits.kit_dirs() - before - {k for k, o in owners.items() if o.endswith("\n")}:
            try:
                owners[kit] = (Path(kit) / "owner").read_text()
            except OSError:
                owners.setdefault(kit, "")
        time.sleep(0.02)
    err = proc.stderr.read()
    assert proc.returncode == 0, err[-3000:]
    mine = {k: o for k, o in owners.items() if f"run dir {tmp_path / 'run'})" in o}
    assert len(mine) == 2, owners  # src and dst, one kit each
    assert all(
        re.fullmatch(
            rf"runbook relay run from \S+ \(pid {proc.pid}, run dir "
            rf"{re.escape(str(tmp_path / 'run'))}\)\n",
            o,
        )
        for o in mine.values()
    )
    assert not any(Path(k).exists() for k in mine)  # removed at the end, owner and all


def test_the_leftover_check_blames_only_its_own_sessions_runs(tmp_path):
    def kit(name: str, owner: str | None) -> str:
        d = tmp_path / name
        d.mkdir()
        if owner is not None:
            (d / "owner").write_text(owner)
        return str(d)

    session = tmp_path / "session"
    ours = kit("rbkit.a", f"runbook x run from h (pid 1, run dir {session}/t0/run)\n")
    theirs = kit("rbkit.b", "runbook x run from h (pid 2, run dir /tmp/rbbench-q/runs/x/1)\n")
    unknown = kit("rbkit.c", None)
    gone = str(tmp_path / "rbkit.d")
    assert kits.sort_kits([ours, theirs, unknown, gone], [session]) == (
        [ours],
        [f"{theirs} (/tmp/rbbench-q/runs/x/1)"],
        [unknown],
    )
