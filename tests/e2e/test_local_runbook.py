"""The runbook executed for real on this machine (both ends local): the embedded default's path.

Each test compiles a small spec (source: the lab's cached `payload_small` venv), runs the generated
script with bash, and asserts what a user sees: exit status, the step named, files on the
destination, the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import cli

ROOT = Path(__file__).resolve().parents[2]

SPEC = """name: {name}
hosts:
  here: {{local: true}}
transfer:
  from: here:{src}
  to: here:{dst}
  exclude: ["__pycache__", "*.pyc"]
  on_existing: {policy}
  jobs: 2
checks:
{checks}
"""
CHECKS = """  - imports: [rb_payload, json]
  - command: {name: console script, run: "payload-hello"}
"""


def compile_and_run(tmp_path: Path, src: Path, dst: Path, *args: str, policy: str = "refuse",
                    checks: str = CHECKS, name: str = "e2e") -> subprocess.CompletedProcess:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, src=src, dst=dst, policy=policy, checks=checks))
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(["bash", str(tmp_path / f"{name}.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "report.json").read_text())


def tree_digest(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


def test_full_local_move_then_rerun_skips(payload_small, tmp_path):
    dst = tmp_path / "dest" / "venv"
    r = compile_and_run(tmp_path, payload_small.venv, dst)
    assert r.returncode == 0, r.stderr[-4000:]
    doc = report(tmp_path)
    assert doc["outcome"] == "ok"
    assert [s["id"] for s in doc["steps"]] == [
        "preflight", "manifest", "transfer", "verify", "relocate", "swap", "exports", "probe"]
    assert doc["checks"]["fail"] == 0 and doc["checks"]["pass"] >= 2
    # the run's pictures beside its report (issue #18)
    for name in ("timeline.svg", "report.html"):
        assert (tmp_path / "run" / name).is_file(), name
    assert "preflight" in (tmp_path / "run" / "timeline.svg").read_text()
    # the moved console script runs from the new place, through its rewritten shebang
    out = subprocess.run([str(dst / "bin" / "payload-hello")], capture_output=True, text=True)
    assert out.returncode == 0 and str(dst) in out.stdout
    assert str(payload_small.venv) not in (dst / "bin" / "payload-hello").read_text()
    env_file = Path(f"{dst}.env.sh")
    assert f"export VIRTUAL_ENV={dst}" in env_file.read_text()
    assert "outcome: ok" in r.stderr and "checks:" in r.stderr
    # a second run finds the same tree and sends nothing
    r2 = compile_and_run(tmp_path, payload_small.venv, dst)
    assert r2.returncode == 0, r2.stderr[-4000:]
    assert "already holds this exact tree" in r2.stderr
    transfer = next(s for s in report(tmp_path)["steps"] if s["id"] == "transfer")
    assert transfer["detail"].startswith("skipped")


def test_refuse_leaves_an_existing_destination_alone(payload_small, tmp_path):
    dst = tmp_path / "dest" / "venv"
    dst.mkdir(parents=True)
    (dst / "precious").write_text("keep me")
    before = tree_digest(dst.parent)
    r = compile_and_run(tmp_path, payload_small.venv, dst)
    assert r.returncode == 1
    assert "FAILED (rc=1) in step preflight" in r.stderr
    assert "exists and on_existing is refuse" in r.stderr
    assert tree_digest(dst.parent) == before
    assert report(tmp_path)["outcome"] == "failed"


def test_backup_keeps_the_previous_destination(payload_small, tmp_path):
    dst = tmp_path / "dest" / "venv"
    dst.mkdir(parents=True)
    (dst / "old").write_text("previous install")
    r = compile_and_run(tmp_path, payload_small.venv, dst, policy="backup")
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "dest" / "venv.rb-backup.1" / "old").read_text() == "previous install"
    assert (dst / "bin" / "payload-hello").exists()


def test_a_failing_check_fails_the_run_and_names_it(payload_small, tmp_path):
    checks = "  - imports: [rb_payload, no_such_module_xyz]\n"
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / "venv", checks=checks)
    assert r.returncode == 1
    assert "in step probe on host here" in r.stderr
    assert "no_such_module_xyz" in r.stderr
    doc = report(tmp_path)
    assert doc["checks"]["fail"] == 1
    probe = doc["probes"]["here"]
    failed = [c for c in probe["checks"] if c["status"] == "fail"]
    assert failed and "no_such_module_xyz" in json.dumps(failed)


def test_a_byte_changed_in_staging_is_caught_before_the_swap(payload_small, tmp_path):
    dst = tmp_path / "d" / "venv"
    r = compile_and_run(tmp_path, payload_small.venv, dst, "--only", "manifest")
    assert r.returncode == 0, r.stderr[-3000:]
    r = compile_and_run(tmp_path, payload_small.venv, dst, "--only", "transfer")
    assert r.returncode == 0, r.stderr[-3000:]
    staging = tmp_path / "d" / ".venv.rb-staging"
    target = next(p for p in sorted(staging.rglob("greeting.txt")))
    data = bytearray(target.read_bytes())
    data[0] ^= 0x20
    target.write_bytes(bytes(data))
    r = compile_and_run(tmp_path, payload_small.venv, dst, "--from", "verify")
    assert r.returncode == 1
    assert "FAILED (rc=1) in step verify on host here" in r.stderr
    assert "differs: " in r.stderr and "greeting.txt (content" in r.stderr
    assert not dst.exists(), "nothing may be installed from a copy that failed verification"


def test_dry_run_and_list_touch_nothing(payload_small, tmp_path):
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / "venv", "--dry-run")
    assert r.returncode == 0
    assert "transfer:" in r.stdout and "on here: tar -C" in r.stdout
    assert not (tmp_path / "run").exists() and not (tmp_path / "d").exists()


def test_rerun_after_a_source_change_sends_again_and_verifies(payload_small, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    assert compile_and_run(tmp_path, src, dst, policy="replace").returncode == 0
    r = compile_and_run(tmp_path, src, dst, policy="replace")
    assert "quick check of sizes, modes and mtimes" in r.stderr
    greeting = next(src.rglob("greeting.txt"))
    greeting.write_text("changed at the source\n")
    r = compile_and_run(tmp_path, src, dst, policy="replace")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "quick check: the source changed" in r.stderr
    assert next(dst.rglob("greeting.txt")).read_text() == "changed at the source\n"


def test_rerun_after_a_source_change_sends_only_what_changed(payload_small, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    greeting = next(src.rglob("greeting.txt"))
    site = greeting.parents[2]                                      # site-packages
    # a module no check uses (removing one the console script imports made the old runbook's
    # green a lie: its scripts still ran the original venv's interpreter, where the file was)
    gone = site / "rb_gone_module.py"
    gone.write_text("GONE = 1\n")
    gone_rel = gone.relative_to(src)
    r = compile_and_run(tmp_path, src, dst, policy="backup")
    assert r.returncode == 0, r.stderr[-3000:]
    old_greeting = greeting.read_text()
    greeting.write_text("changed at the source\n")                 # changed
    (site / "rb_new_module.py").write_text("VALUE = 7\n")           # new
    gone.unlink()                                                   # removed
    r = compile_and_run(tmp_path, src, dst, policy="backup")
    assert r.returncode == 0, r.stderr[-3000:]
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    facts = steps["manifest"]["facts"]
    # what is sent: the changed and the new file, and bin/ + pyvenv.cfg (relocation rewrites them)
    assert facts["send_files"] < 30 and facts["linked_files"] > 0, facts
    assert "incremental" in steps["transfer"]["detail"]
    assert "linked unchanged" in steps["verify"]["detail"]
    assert next(dst.rglob("greeting.txt")).read_text() == "changed at the source\n"
    assert (dst / (site / "rb_new_module.py").relative_to(src)).read_text() == "VALUE = 7\n"
    assert not (dst / gone_rel).exists()
    out = subprocess.run([str(dst / "bin" / "python"), "-c", "import sys, rb_new_module; "
                          "print(sys.prefix, rb_new_module.VALUE)"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == [str(dst), "7"], out
    # the previous install, kept as the backup, is as it was: links share content, nothing was
    # written through them
    backup = next(dst.parent.glob("venv.rb-backup.*"))
    assert next(backup.rglob("greeting.txt")).read_text() == old_greeting
    assert (backup / gone_rel).exists()
    # and a third run finds everything up to date
    r = compile_and_run(tmp_path, src, dst, policy="backup")
    assert r.returncode == 0 and "quick check: destination up to date" in r.stderr, r.stderr[-2000:]


def test_an_incremental_copy_that_fails_verification_leaves_the_install_alone(payload_small,
                                                                             tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    assert compile_and_run(tmp_path, src, dst, policy="replace").returncode == 0
    before = tree_digest(dst)
    next(src.rglob("greeting.txt")).write_text("changed at the source\n")
    r = compile_and_run(tmp_path, src, dst, "--only", "manifest", policy="replace")
    assert r.returncode == 0 and "incremental:" in r.stderr, r.stderr[-3000:]
    r = compile_and_run(tmp_path, src, dst, "--only", "transfer", policy="replace")
    assert r.returncode == 0, r.stderr[-3000:]
    staged = next((tmp_path / "d" / ".venv.rb-staging").rglob("greeting.txt"))
    staged.write_text("CHANGED AT THE SOURCE\n")                  # same size, other bytes
    r = compile_and_run(tmp_path, src, dst, "--from", "verify", policy="replace")
    assert r.returncode == 1 and "greeting.txt (content" in r.stderr, r.stderr[-3000:]
    assert tree_digest(dst) == before
