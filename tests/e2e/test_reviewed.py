"""The runbook that runs is the runbook that was reviewed (issue #14, part 4): a runbook edited by
hand, or one whose spec changed since it was compiled, refuses to start; --allow-edited runs it and
says so. Also the two forms: the default pins the kit file beside it; --standalone carries it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from compiler import cli
from tests.e2e.test_local_runbook import SPEC

CHECKS = "  - imports: [json]\n"


def make(tmp_path: Path, src: Path, *extra: str) -> tuple[Path, Path]:
    spec = tmp_path / "rev.yaml"
    spec.write_text(SPEC.format(name="rev", src=src, dst=tmp_path / "dest" / "venv",
                                policy="replace", checks=CHECKS))
    out = tmp_path / "gen"
    assert cli.main([str(spec), "-o", str(out), *extra]) == 0
    return spec, out / "rev.sh"


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_hand_edited_runbook_refuses_to_run_unless_allowed(payload_small, tmp_path):
    _spec, script = make(tmp_path, payload_small.venv)
    text = script.read_text()
    assert "readonly RB_JOBS=2\n" in text
    script.write_text(text.replace("readonly RB_JOBS=2\n", "readonly RB_JOBS=3\n"))
    r = run(tmp_path, script)
    assert r.returncode == 2
    assert "this runbook was edited after it was compiled" in r.stderr
    assert not (tmp_path / "dest").exists() and not (tmp_path / "run").exists()
    r = run(tmp_path, script, "--allow-edited")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--allow-edited: this runbook was edited after it was compiled" in r.stderr
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["notes"]["allow_edited"] == "this runbook was edited after it was compiled"


def test_a_runbook_whose_spec_changed_refuses_to_run(payload_small, tmp_path):
    spec, script = make(tmp_path, payload_small.venv)
    spec.write_text(spec.read_text() + "# a comment is a change too\n")
    r = run(tmp_path, script, "--only", "preflight")
    assert r.returncode == 2
    assert f"{spec} changed since this runbook was compiled" in r.stderr
    assert f"compile {spec}" in r.stderr
    # read-only options still work
    assert run(tmp_path, script, "--list").returncode == 0
    assert "compiled by runbook-compiler" in run(tmp_path, script, "--version").stdout


def test_default_form_needs_its_pinned_kit_and_standalone_carries_it(payload_small, tmp_path):
    _spec, script = make(tmp_path, payload_small.venv)
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    shutil.copy(script, alone / "rev.sh")
    r = run(tmp_path, alone / "rev.sh", "--only", "preflight")
    # refused before anything runs (exit 2): the runtime itself comes from the kit
    assert r.returncode == 2 and "is not beside this runbook" in r.stderr
    assert "compile --standalone" in r.stderr
    _spec, script = make(tmp_path, payload_small.venv, "--standalone")
    shutil.copy(script, alone / "rev.sh")
    r = run(tmp_path, alone / "rev.sh")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "dest" / "venv" / "bin" / "python").exists()
    # --check compares each runbook with the form it was compiled in
    assert cli.main(["--check", str(tmp_path / "rev.yaml"), "-o", str(script.parent)]) == 0
