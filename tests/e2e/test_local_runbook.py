"""The runbook executed for real on this machine (both ends local): the embedded default's path.

Each test compiles a small spec (source: the lab's cached `payload_small` venv), runs the generated
script with bash, and asserts what a user sees: exit status, the step named, files on the
destination, the report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

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


def compile_and_run(
    tmp_path: Path,
    src: Path,
    dst: Path,
    *args: str,
    policy: str = "refuse",
    checks: str = CHECKS,
    name: str = "e2e",
    extra: str = "",
    exclude: str = '["__pycache__", "*.pyc"]',
    env: dict | None = None,
    jobs: int = 2,
) -> subprocess.CompletedProcess:
    script = compile_(
        tmp_path,
        src,
        dst,
        policy=policy,
        checks=checks,
        name=name,
        extra=extra,
        exclude=exclude,
        jobs=jobs,
    )
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"), **(env or {}))
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def compile_(
    tmp_path: Path,
    src: Path,
    dst: Path,
    *,
    policy: str = "refuse",
    checks: str = CHECKS,
    name: str = "e2e",
    extra: str = "",
    exclude: str = '["__pycache__", "*.pyc"]',
    jobs: int = 2,
) -> Path:
    spec = tmp_path / f"{name}.yaml"
    text = SPEC.format(name=name, src=src, dst=dst, policy=policy, checks=checks)
    # other excludes, and more of the spec (transfer keys, then top-level ones) after jobs:
    text = text.replace('  exclude: ["__pycache__", "*.pyc"]\n', f"  exclude: {exclude}\n")
    spec.write_text(text.replace("  jobs: 2\n", f"  jobs: {jobs}\n" + extra))
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    return tmp_path / f"{name}.sh"


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
        "preflight",
        "manifest",
        "transfer",
        "verify",
        "relocate",
        "prove",
        "swap",
        "exports",
        "probe",
    ]
    assert doc["checks"]["fail"] == 0 and doc["checks"]["pass"] >= 2
    assert "compression: none (both ends are this machine: no link to save)" in r.stderr
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
    assert "static checks on the source: skipped" in r2.stderr
    # the skip needs this machine's record that the checks passed for that tree with the same
    # settings (another gpu arch or audit option is another record): with another, they run again
    record = tmp_path / "run" / "audit-passed"
    stat = record.read_text().split(" ", 1)[0]
    assert record.read_text() == f"{stat} here outside {payload_small.venv}\n"
    record.write_text(f"{stat} here preflight --venv {payload_small.venv} --arch sm_103\n")
    r3 = compile_and_run(tmp_path, payload_small.venv, dst)
    assert r3.returncode == 0, r3.stderr[-4000:]
    assert "static checks on the source: passed" in r3.stderr, r3.stderr[-3000:]


def test_refuse_leaves_an_existing_destination_alone(payload_small, tmp_path):
    dst = tmp_path / "dest" / "venv"
    dst.mkdir(parents=True)
    (dst / "precious").write_text("keep me")
    before = tree_digest(dst.parent)
    r = compile_and_run(tmp_path, payload_small.venv, dst)
    assert r.returncode == 1
    assert "FAILED in step preflight" in r.stderr
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
    assert "FAILED in step verify on host here" in r.stderr
    assert "differs: " in r.stderr and "greeting.txt (content" in r.stderr
    assert not dst.exists(), "nothing may be installed from a copy that failed verification"


def test_dry_run_and_list_touch_nothing(payload_small, tmp_path):
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / "venv", "--dry-run")
    assert r.returncode == 0
    assert "transfer:" in r.stdout and "on here: tar -C" in r.stdout
    # issue #18: the dry-run states the choices the run makes (the run's own log says the same:
    # test_full_local_move_then_rerun_skips), and the checks the probe really runs
    assert "compression: none (both ends are this machine: no link to save)" in r.stdout
    assert "rbprobes run: relocation, imports, command" in r.stdout
    assert "on here: rbprobes outside " in r.stdout
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
    site = greeting.parents[2]  # site-packages
    # a module no check uses (removing one the console script imports made the old runbook's
    # green a lie: its scripts still ran the original venv's interpreter, where the file was)
    gone = site / "rb_gone_module.py"
    gone.write_text("GONE = 1\n")
    gone_rel = gone.relative_to(src)
    r = compile_and_run(tmp_path, src, dst, policy="backup")
    assert r.returncode == 0, r.stderr[-3000:]
    old_greeting = greeting.read_text()
    greeting.write_text("changed at the source\n")  # changed
    (site / "rb_new_module.py").write_text("VALUE = 7\n")  # new
    gone.unlink()  # removed
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
    out = subprocess.run(
        [
            str(dst / "bin" / "python"),
            "-c",
            "import sys, rb_new_module; print(sys.prefix, rb_new_module.VALUE)",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.split() == [str(dst), "7"], out
    # the previous install, kept as the backup, is as it was: links share content, nothing was
    # written through them
    backup = next(dst.parent.glob("venv.rb-backup.*"))
    assert next(backup.rglob("greeting.txt")).read_text() == old_greeting
    assert (backup / gone_rel).exists()
    # and a third run finds everything up to date
    r = compile_and_run(tmp_path, src, dst, policy="backup")
    assert r.returncode == 0 and "quick check: destination up to date" in r.stderr, r.stderr[-2000:]


def test_an_incremental_copy_that_fails_verification_leaves_the_install_alone(
    payload_small, tmp_path
):
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
    staged.write_text("CHANGED AT THE SOURCE\n")  # same size, other bytes
    r = compile_and_run(tmp_path, src, dst, "--from", "verify", policy="replace")
    assert r.returncode == 1 and "greeting.txt (content" in r.stderr, r.stderr[-3000:]
    assert tree_digest(dst) == before


def old_install(dst: Path) -> dict:
    dst.mkdir(parents=True)
    (dst / "old-install").write_text("the working install\n")
    return tree_digest(dst.parent)


def test_a_failed_step_fails_the_run_once_and_puts_back_what_was_there(payload_small, tmp_path):
    """H1: exports fails (its env file's folder does not exist; a library dir the venv lacks is
    refused in preflight since issue 45): the run used to exit 0 with `outcome: ok` and the step
    listed twice (the kit's status was lost in `parse "$(kit ...)"`)."""
    dst = tmp_path / "d" / "venv"
    old_install(dst)
    env_file = tmp_path / "no-such-dir" / "venv.env.sh"
    cuda = f'cuda:\n  version: "12.4"\n  home: /usr/local/cuda\n  env_file: {env_file}\n'
    r = compile_and_run(tmp_path, payload_small.venv, dst, policy="backup", extra=cuda)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step exports on host here" in r.stderr
    assert f"{env_file.parent}: no such file or directory" in r.stderr, r.stderr[-3000:]
    doc = report(tmp_path)
    assert doc["outcome"] == "failed"
    ids = [s["id"] for s in doc["steps"]]
    assert ids.count("exports") == 1 and ids[-1] == "exports", ids
    assert doc["steps"][-1]["status"] == "failed"
    assert not env_file.exists() and not Path(f"{dst}.env.sh").exists()
    # a failure past the swap puts back what was there; the failed install is kept beside it
    assert (dst / "old-install").read_text() == "the working install\n"
    assert "rolled back" in r.stderr
    assert (tmp_path / "d" / "venv.rb-failed" / "bin" / "payload-hello").exists()
    assert "rolled back: step exports failed; failed install kept at" in r.stderr


def test_only_swap_after_a_failed_verify_is_refused(payload_small, tmp_path):
    """H2: `--only swap` after a failed verify installed the unverified staging (and `replace`
    deleted the working install), exit 0."""
    dst = tmp_path / "d" / "venv"
    before = old_install(dst)
    assert (
        compile_and_run(
            tmp_path, payload_small.venv, dst, "--only", "manifest", policy="replace"
        ).returncode
        == 0
    )
    assert (
        compile_and_run(
            tmp_path, payload_small.venv, dst, "--only", "transfer", policy="replace"
        ).returncode
        == 0
    )
    staged = next((tmp_path / "d" / ".venv.rb-staging").rglob("greeting.txt"))
    staged.write_text("truncated")
    r = compile_and_run(tmp_path, payload_small.venv, dst, "--from", "verify", policy="replace")
    assert r.returncode == 1 and "in step verify" in r.stderr, r.stderr[-3000:]
    for args in (["--only", "swap"], ["--from", "relocate"], ["--from", "prove"]):
        r = compile_and_run(tmp_path, payload_small.venv, dst, *args, policy="replace")
        assert r.returncode == 1, r.stderr[-3000:]
        assert "was not verified in this run" in r.stderr, r.stderr[-3000:]
        assert {
            k: v for k, v in tree_digest(tmp_path / "d").items() if ".rb-staging" not in k
        } == before
        assert report(tmp_path)["outcome"] == "failed"


def test_a_second_run_into_the_same_destination_is_refused_naming_the_first(
    payload_small, tmp_path
):
    """H2: two runs at once shared the staging and installed a mix; now the destination's lock
    (held by the first run's engine for its whole run) refuses the second, naming the first."""
    dst = tmp_path / "d" / "venv"
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    tar = shutil.which("tar")
    assert tar
    # the stream's sending end (tar -c of the names the scan listed), slowed
    (slow / "tar").write_text(
        f'#!/bin/sh\ncase " $* " in *" --null "*) sleep 15 ;; esac\nexec {tar} "$@"\n'
    )
    (slow / "tar").chmod(0o755)
    first = compile_(tmp_path, payload_small.venv, dst, name="first")
    env = dict(
        os.environ, RB_RUN_DIR=str(tmp_path / "run-first"), PATH=f"{slow}:{os.environ['PATH']}"
    )
    p = subprocess.Popen(
        ["bash", str(first)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = tmp_path / "d" / ".venv.rb-lock"
        deadline = time.monotonic() + 120
        while not lock.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lock.exists(), "the first run never took the lock"
        r = compile_and_run(
            tmp_path, payload_small.venv, dst, name="second", env={"RB_LOCK_WAIT": "1"}
        )
        assert r.returncode == 1, r.stderr[-3000:]
        assert "FAILED in step preflight" in r.stderr
        assert "is locked by another run: runbook first run from" in r.stderr, r.stderr[-3000:]
        assert str(tmp_path / "run-first") in r.stderr  # its run directory, named
    finally:
        _out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert (dst / "bin" / "payload-hello").exists() and not lock.exists()


def test_a_source_the_excludes_empty_is_refused_before_anything_is_replaced(
    payload_small, tmp_path
):
    """M3: `exclude: ["*"]` passed preflight as "0 files", and replace swapped the working install
    for an empty tree."""
    dst = tmp_path / "d" / "venv"
    before = old_install(dst)
    r = compile_and_run(tmp_path, payload_small.venv, dst, policy="replace", exclude='["*"]')
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step preflight" in r.stderr
    assert "is not a venv after the excludes: transfer.exclude leaves out pyvenv.cfg" in r.stderr
    assert tree_digest(tmp_path / "d") == before


def test_a_venv_whose_interpreter_is_missing_at_the_destination_is_refused_before_the_swap(
    payload_small, tmp_path
):
    """M3: a venv whose base interpreter does not exist on the target: bin/python names it by a
    relative path that resolves beside the source and nowhere beside the destination. It used
    to be swapped in (replace: the working install deleted) and fail after."""
    src = tmp_path / "a" / "src" / "venv"
    src.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    base = tmp_path / "a" / "src" / "base"
    base.mkdir()
    (base / "python").symlink_to(os.path.realpath(src / "bin" / "python"))
    (src / "bin" / "python").unlink()
    (src / "bin" / "python").symlink_to("../../base/python")
    dst = tmp_path / "a" / "dst" / "venv"
    before = old_install(dst)
    r = compile_and_run(tmp_path, src, dst, policy="replace")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step prove on host here" in r.stderr
    assert "does not exist on this host" in r.stderr
    assert {k: v for k, v in tree_digest(dst.parent).items() if ".rb-staging" not in k} == before
    assert [s["id"] for s in report(tmp_path)["steps"]][-1] == "prove"


def test_a_destination_inside_the_source_is_refused_in_preflight(payload_small, tmp_path):
    """The threat model's preflight (hostfs.identity on each end, same_or_nested), wired in the
    destination's engine: the install would move or remove what it copies."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    (tmp_path / "alias").symlink_to(tmp_path)  # the spec's paths do not show it
    r = compile_and_run(
        tmp_path,
        tmp_path / "alias" / "src",
        src / "inner" / "venv",
        policy="replace",
        exclude='["__pycache__", "*.pyc", "inner"]',
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step preflight" in r.stderr
    assert "is inside the source" in r.stderr
    assert not (src / "inner").exists()


def test_a_setuid_file_is_refused_unless_the_spec_strips_it(payload_small, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    victim = next(src.rglob("greeting.txt"))
    victim.chmod(0o4755)
    dst = tmp_path / "d" / "venv"
    r = compile_and_run(tmp_path, src, dst, policy="replace")
    assert r.returncode == 1 and "FAILED in step preflight" in r.stderr, r.stderr[-3000:]
    assert "setuid" in r.stderr and not dst.exists()
    r = compile_and_run(tmp_path, src, dst, policy="replace", extra="  special_modes: strip\n")
    assert r.returncode == 0, r.stderr[-3000:]
    installed = dst / victim.relative_to(src)
    assert installed.stat().st_mode & 0o7777 == 0o755


def big_source(venv: Path, src: Path) -> Path:
    """A copy of `venv` with 300 MB more in lib/big: three files of 100 MB (part0..2.bin, of
    bytes 1, 2 and 3), and part0-again.bin, a hard link of part0.bin. Enough to move in streams
    side by side (from 256 MB)."""
    subprocess.run(["cp", "-a", str(venv), str(src)], check=True)
    big = src / "lib" / "big"
    big.mkdir()
    for i in range(3):
        (big / f"part{i}.bin").write_bytes(bytes([i + 1]) * (100 << 20))
    os.link(big / "part0.bin", big / "part0-again.bin")
    return src


def test_one_host_moves_a_big_tree_in_streams_side_by_side(payload_small, tmp_path):
    """Both ends on this machine, 300 MB to move and jobs 4: the sending end starts two receiving
    ends (two tar pairs side by side); verify takes both streams' digests and reads no file; the
    two names of one inode arrive as one inode."""
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "d" / "venv"
    r = compile_and_run(tmp_path, src, dst, policy="replace", jobs=4)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert steps["transfer"]["detail"].endswith("2 streams side by side"), steps["transfer"]
    receive = next(e for e in steps["transfer"]["engine"] if e["step"] == "receive")
    assert receive["facts"]["streams"] == 2, receive
    assert "checked by the stream's" in steps["verify"]["detail"], steps["verify"]
    assert "hashed again" not in steps["verify"]["detail"], steps["verify"]
    assert (dst / "lib" / "big" / "part2.bin").read_bytes() == bytes([3]) * (100 << 20)
    assert os.path.samefile(
        dst / "lib" / "big" / "part0.bin", dst / "lib" / "big" / "part0-again.bin"
    )
