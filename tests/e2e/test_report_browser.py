"""report.html of runbooks run for real, seen in headless Chromium (issue 36): a passing run, a run
whose checks failed and a run interrupted mid-transfer each show their outcome, every step row and
every failed check, their timeline loads, and the screenshot is not blank (tests/browser.py). The
fan-out's page is seen from tests/picture_data's run (tests/hostkit/test_report_browser.py): a
fan-out run needs the Slurm or clush mini-cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests import browser
from tests.e2e.test_interrupt import interrupt
from tests.e2e.test_local_runbook import compile_, compile_and_run, old_install

pytestmark = pytest.mark.e2e


def copy(payload, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload.venv), str(src)], check=True)
    return src


def test_a_passing_run_is_seen_ok(payload_small, tmp_path):
    browser.chromium()
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    assert r.returncode == 0, r.stderr[-3000:]
    seen = browser.assert_seen(tmp_path / "run")
    assert [h["text"] for h in seen.h1] == ["runbook e2e: ok"]


def test_a_run_whose_checks_failed_shows_each_failed_check(payload_small, tmp_path):
    browser.chromium()
    checks = (
        "  - imports: [rb_payload, rb_no_such_module]\n"
        '  - command: {name: missing tool, run: "rb-no-such-tool --help"}\n'
    )
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / "venv", checks=checks)
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["outcome"] == "failed" and len(browser.failed_checks(doc)) == 2, doc
    seen = browser.assert_seen(tmp_path / "run")
    assert seen.row("imports", "L1", "fail")["seen"]


def test_an_interrupted_run_is_seen_interrupted_and_where(payload_small, tmp_path):
    browser.chromium()
    src = copy(payload_small, tmp_path)
    dst = tmp_path / "d" / "venv"
    old_install(dst)
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    # the stream's sending end, slowed (as tests/e2e/test_interrupt.py does)
    (slow / "tar").write_text(
        '#!/bin/sh\ncase " $* " in *" --null "*) sleep 30 ;; esac\n'
        f'exec {shutil.which("tar")} "$@"\n'
    )
    (slow / "tar").chmod(0o755)
    script = compile_(tmp_path, src, dst, policy="replace")
    rc, _, err = interrupt(
        tmp_path,
        script,
        signal.SIGINT,
        "] streaming ",
        env={"PATH": f"{slow}:{os.environ['PATH']}"},
        settle=0.5,
    )
    assert rc == 130, err[-3000:]
    seen = browser.assert_seen(tmp_path / "run")
    assert seen.row("transfer", "here", "interrupted")["seen"]
    page = (tmp_path / "run" / "report.html").read_text()
    assert "interrupted in step transfer" in page
