"""Faults, end to end against real sshd hosts: each run fails non-zero naming the step and host, the
destination that existed before is byte-identical, and a re-run after the fault is fixed
completes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_relay import (
    build,
    remove_left_kits,
    report,
    run,
    snapshot,
    spec_text,
    tampering_ssh,
)

pytestmark = pytest.mark.e2e


def old_install(parent: Path) -> Path:
    dst = parent / "venv"
    dst.mkdir(parents=True)
    (dst / "old-install").write_text("the previous venv\n")
    return dst


def outside_staging(root: Path) -> dict:
    """What a failed run must leave as it was: all but its staging and its lock file (an engine
    cut off by a dead link still holds the lock until its ssh session is found gone)."""
    return {
        k: v
        for k, v in snapshot(root).items()
        if ".rb-staging" not in k and not k.endswith(".rb-lock")
    }


def test_target_link_down_mid_stream(clean_lab, payload_torch, ext4_dir, tmp_path):
    lab = clean_lab
    dst = old_install(ext4_dir)
    before = snapshot(ext4_dir)
    # short keepalives so the dead link is noticed in seconds (the spec's options win over the
    # runbook's defaults)
    text = spec_text(lab, payload_torch.venv, dst, policy="backup", compression="none").replace(
        "GlobalKnownHostsFile: /dev/null}",
        "GlobalKnownHostsFile: /dev/null, ServerAliveInterval: '1', ServerAliveCountMax: '3'}",
    )
    script = build(tmp_path, text)
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = ext4_dir / ".venv.rb-staging"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and sum(1 for _ in staging.rglob("*")) > 300:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before the link could be cut"
    lab.link_down("dst")
    try:
        _out, err = proc.communicate(timeout=120)
    finally:
        lab.link_up("dst")
    # the destination's kit could not be removed, and the log says where it is
    assert list(remove_left_kits(err)) == ["dst"], err[-3000:]
    assert proc.returncode != 0
    assert "in step transfer" in err, err[-3000:]
    assert outside_staging(ext4_dir) == before
    # fixed: a re-run completes (the staging debris is replaced, never installed as is)
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (ext4_dir / "venv.rb-backup.1" / "old-install").exists()


def test_target_filesystem_full_partway(clean_lab, payload_small, tmpfs_factory, tmp_path):
    lab = clean_lab
    disk = tmpfs_factory(4096, inodes=24)  # room for bytes, not for every file
    dst = old_install(disk.path)
    before = snapshot(disk.path)
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup"))
    r = run(tmp_path, script)
    assert r.returncode != 0
    assert "in step transfer" in r.stderr and "unpack on dst exited" in r.stderr
    assert "No space left on device" in r.stderr
    assert outside_staging(disk.path) == before
    assert report(tmp_path)["outcome"] == "failed"


def test_a_file_deleted_from_staging_is_named_as_missing(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    before = snapshot(dst.parent)
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup"))
    assert run(tmp_path, script, "--only", "manifest").returncode == 0
    assert run(tmp_path, script, "--only", "transfer").returncode == 0
    victim = next((dst.parent / ".venv.rb-staging").rglob("greeting.txt"))
    victim.unlink()
    r = run(tmp_path, script, "--from", "verify")
    assert r.returncode == 1
    assert "FAILED in step verify on host dst" in r.stderr
    assert "missing: " in r.stderr and "greeting.txt" in r.stderr
    assert outside_staging(dst.parent) == before
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]


def test_source_sshd_down_before_start_fails_in_preflight(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    before = snapshot(dst.parent)
    lab.stop_sshd("src")
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup"))
    r = run(tmp_path, script)
    assert r.returncode == 1  # issue #18: the documented status, not ssh's 255
    assert "in step preflight on host src" in r.stderr
    assert f"cannot reach src (root@{lab.host('src').addr}): " in r.stderr
    assert "Connection refused" in r.stderr and "what to do: check that" in r.stderr
    assert r.stderr.count("FAILED in step") == 1
    assert snapshot(dst.parent) == before
    lab.start_sshd("src")
    assert run(tmp_path, script).returncode == 0


def test_a_failing_check_after_the_swap_rolls_back_to_the_backup(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    checks = "checks:\n  - imports: [rb_payload, module_that_is_not_there]\n"
    script = build(
        tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup", checks=checks)
    )
    r = run(tmp_path, script)
    assert r.returncode == 1
    assert "in step probe on host dst" in r.stderr
    assert "rolled back" in r.stderr
    assert (dst / "old-install").read_text() == "the previous venv\n"
    kept = tmp_path / "d" / "venv.rb-failed"  # apart, never a backup (issue 34)
    assert (kept / "bin" / "payload-hello").exists(), "the install that failed is kept for a look"
    assert not (tmp_path / "d" / "venv.rb-backup.1").exists()


def test_keep_policy_leaves_the_new_install(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    checks = (
        "on_failed_checks: keep\nchecks:\n  - imports: [rb_payload, module_that_is_not_there]\n"
    )
    script = build(
        tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup", checks=checks)
    )
    r = run(tmp_path, script)
    assert r.returncode == 1
    assert "the new install stays in place" in r.stderr
    assert (dst / "bin" / "payload-hello").exists()


# What the stream meets between the ends: a link (this machine's ssh, tests.e2e.test_relay's
# tampering_ssh) that flips a byte of a file or cuts the stream short.
TAMPER = """
import io, tarfile
def tamper(data):
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    if os.environ["RB_TAMPER"] == "flip":
        at = next(t for t in members if t.name.endswith("greeting.txt")).offset_data
        return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
    return data[:members[len(members) // 2].offset]     # whole members only: tar says nothing
"""


def run_through(tmp_path: Path, script: Path, how: str) -> subprocess.CompletedProcess:
    env = tampering_ssh(tmp_path / "fake-bin", TAMPER)
    env.update(RB_RUN_DIR=str(tmp_path / "run"), RB_TAMPER=how)
    return subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_byte_flipped_in_the_stream_fails_verify_naming_the_file(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    before = snapshot(dst.parent)
    script = build(
        tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup", compression="none")
    )
    r = run_through(tmp_path, script, "flip")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step verify on host dst" in r.stderr
    assert "greeting.txt (content: expected" in r.stderr, r.stderr[-3000:]
    assert outside_staging(dst.parent) == before
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_stream_cut_between_two_files_fails_the_transfer(clean_lab, payload_small, tmp_path):
    """GNU tar takes a stream that stops between two members for a whole archive (exit 0); the
    run used to go on to verify, which found files missing. The receiving end says it was cut."""
    lab = clean_lab
    dst = old_install(tmp_path / "d")
    before = snapshot(dst.parent)
    script = build(
        tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup", compression="none")
    )
    r = run_through(tmp_path, script, "cut")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step transfer" in r.stderr and "unpack on dst exited" in r.stderr
    assert "before the end of the tar archive" in r.stderr, r.stderr[-3000:]
    assert outside_staging(dst.parent) == before
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
