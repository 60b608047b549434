"""Backups and rollback that keep the good install (issue 34), on the one-host local route (the
same install engine as a remote destination).

The issue's scenario, planted with real runs: keep_backups: 2, two good backups and a good install
in place (three runs that passed their checks), then a run whose `command:` check exits 1. The good
backups must all survive it, the failed install is kept apart as `NAME.rb-failed`, the summary's
swap row says what happened; `--list-backups` says what each backup is; `--restore` picks the
newest good one, says why, and runs the checks on what it put back; every hint names the runbook
as it was invoked (`bash generated/e2e.sh`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from compiler import cli
from tests.e2e.test_local_runbook import CHECKS, SPEC

GEN = "generated/e2e.sh"


def compile_into_generated(tmp_path: Path, src: Path, dst: Path, flag: Path, top: str = "") -> None:
    checks = CHECKS + f'  - command: {{name: release gate, run: "test ! -e {flag}"}}\n'
    text = SPEC.format(name="e2e", src=src, dst=dst, policy="backup", checks=checks) + top
    spec = tmp_path / "e2e.yaml"
    spec.write_text(text.replace("  jobs: 2\n", "  jobs: 2\n  keep_backups: 2\n"))
    assert cli.main([str(spec), "-o", str(tmp_path / "generated")]) == 0


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(
        ["bash", GEN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def generation(root: Path) -> str:
    return next(root.rglob("greeting.txt")).read_text()


def test_a_failed_check_keeps_every_good_backup_and_restore_checks_what_it_puts_back(
    payload_small, tmp_path
):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    flag = tmp_path / "fail-the-gate"
    compile_into_generated(tmp_path, src, dst, flag)
    greeting = next(src.rglob("greeting.txt"))
    for gen in (1, 2, 3):
        greeting.write_text(f"generation {gen}\n")
        r = run(tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
    assert f"to put the previous destination back: bash {GEN} --restore" in r.stderr
    backup = {n: dst.parent / f"venv.rb-backup.{n}" for n in (1, 2, 3, 4)}
    assert [generation(backup[1]), generation(backup[2]), generation(dst)] == [
        "generation 1\n",
        "generation 2\n",
        "generation 3\n",
    ]

    # the run whose check fails: nothing good is evicted, the failed install is kept apart
    flag.touch()
    greeting.write_text("generation 4\n")
    r = run(tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "removed an older backup" not in r.stderr, r.stderr[-3000:]
    assert [generation(backup[1]), generation(backup[2]), generation(dst)] == [
        "generation 1\n",
        "generation 2\n",
        "generation 3\n",
    ]
    failed = dst.parent / "venv.rb-failed"
    assert generation(failed) == "generation 4\n"
    assert not backup[3].exists()
    row = next(line for line in r.stderr.splitlines() if line.startswith("swap "))
    want = f"rolled back: release gate failed; failed install kept at {failed}"
    assert want in row, row
    swap = next(
        s
        for s in json.loads((tmp_path / "run" / "report.json").read_text())["steps"]
        if s["id"] == "swap"
    )
    assert swap["detail"] == want
    assert f"After fixing it run every step again: bash {GEN}" in r.stderr

    # --from probe now would probe the install put back, not the one this spec made: refused
    r = run(tmp_path, "--from", "probe")
    assert r.returncode == 1
    assert (
        f"the install at {dst} is the previous one, put back after release gate failed" in r.stderr
    ), r.stderr[-3000:]
    assert f"bash {GEN}" in r.stderr

    # --list-backups: when, which spec and source digest, passed or failed, size
    r = run(tmp_path, "--list-backups")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()

    def line_of(path: Path) -> str:
        return next(ln for ln in lines if ln.rstrip().endswith(str(path)) or f" {path} " in ln)

    for n in (1, 2):
        ln = line_of(backup[n])
        assert " passed " in ln and "runbook e2e (e2e.yaml)" in ln, ln
        # its size in the one way the kit says bytes (rbrules.units.human: decimal units)
        assert re.search(r" \d+\.\d (KB|MB|GB) ", ln), ln
        assert re.search(r" 20[0-9-]+T[0-9:]+Z .* source [0-9a-f]{12} ", ln), ln
    assert " failed " in line_of(failed)
    assert "why: release gate failed after the swap" in r.stderr
    in_place = next(i for i, ln in enumerate(lines) if ln.strip().startswith("in place "))
    assert lines[in_place].rstrip().endswith(str(dst))
    assert "put back after release gate failed" in lines[in_place + 1]
    assert r.stderr.count("put back after release gate failed") == 1, "only the install put back"
    assert f"bash {GEN} --restore N" in r.stderr

    # --restore: the newest good backup (2), why, and its checks run on what was put back
    flag.unlink()
    r = run(tmp_path, "--restore")
    assert r.returncode == 0, r.stderr[-3000:]
    assert generation(dst) == "generation 2\n"
    assert (
        f"restored {backup[2]}: the newest backup whose checks passed (skipped: none)" in r.stderr
    ), r.stderr[-3000:]
    assert f"the install that was in place is now {backup[3]}" in r.stderr
    assert "checks on the restored install: 4 passed" in r.stderr, r.stderr[-3000:]
    assert generation(backup[3]) == "generation 3\n" and generation(backup[1]) == "generation 1\n"
    assert generation(failed) == "generation 4\n"

    # the next good run evicts only after its checks passed, and only good backups count
    greeting.write_text("generation 5\n")
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    probe_at = r.stderr.index("[probe]")
    removed = r.stderr.index(f"removed an older backup (keep_backups: 2): {backup[1]}")
    assert removed > probe_at, "evicted only after the checks passed"
    assert not backup[1].exists() and generation(backup[3]) == "generation 3\n"
    assert generation(backup[4]) == "generation 2\n" and generation(failed) == "generation 4\n"


def test_an_install_that_failed_its_checks_never_becomes_a_backup_and_a_bad_restore_fails(
    payload_small, tmp_path
):
    """on_failed_checks: keep: the install whose checks failed stays in place, marked; the next
    swap keeps it apart as NAME.rb-failed, not as a backup. A --restore whose checks fail on what
    it put back exits 1 and says so."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    flag = tmp_path / "fail-the-gate"
    compile_into_generated(tmp_path, src, dst, flag, top="on_failed_checks: keep\n")
    greeting = next(src.rglob("greeting.txt"))
    greeting.write_text("generation 1\n")
    assert run(tmp_path).returncode == 0
    flag.touch()
    greeting.write_text("generation 2\n")
    r = run(tmp_path)
    assert r.returncode == 1 and "the new install stays in place" in r.stderr, r.stderr[-3000:]
    assert generation(dst) == "generation 2\n"
    flag.unlink()
    greeting.write_text("generation 3\n")
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = dst.parent / "venv.rb-failed"
    assert generation(failed) == "generation 2\n"
    assert f"the previous destination had failed its checks: kept apart at {failed}" in r.stderr
    assert sorted(p.name for p in dst.parent.glob("venv.rb-backup.*")) == ["venv.rb-backup.1"]
    assert generation(dst.parent / "venv.rb-backup.1") == "generation 1\n"

    flag.touch()
    r = run(tmp_path, "--restore")
    assert r.returncode == 1, r.stderr[-3000:]
    assert generation(dst) == "generation 1\n"
    assert "the restored install failed its checks on here" in r.stderr, r.stderr[-3000:]
    assert f"bash {GEN} --list-backups" in r.stderr
