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
    spec.write_text(
        SPEC.format(
            name="rev", src=src, dst=tmp_path / "dest" / "venv", policy="replace", checks=CHECKS
        )
    )
    out = tmp_path / "gen"
    assert cli.main([str(spec), "-o", str(out), *extra]) == 0
    return spec, out / "rev.sh"


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


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
    # named as from the project (the folder above gen/), whatever compile was given
    assert "rev.yaml changed since this runbook was compiled" in r.stderr
    assert "compile rev.yaml" in r.stderr
    # read-only options still work
    assert run(tmp_path, script, "--list").returncode == 0
    assert "compiled by runbook-compiler" in run(tmp_path, script, "--version").stdout


def make_here(tmp_path: Path, src: Path, monkeypatch) -> tuple[Path, Path]:
    """make(), compiled the usual way: in the project, by relative paths (`compile rev.yaml -o
    gen`, as `compile specs/x.yaml` writes generated/x.sh)."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "rev.yaml"
    spec.write_text(
        SPEC.format(
            name="rev", src=src, dst=tmp_path / "dest" / "venv", policy="replace", checks=CHECKS
        )
    )
    assert cli.main(["rev.yaml", "-o", "gen"]) == 0
    return spec, tmp_path / "gen" / "rev.sh"


def test_the_spec_is_checked_from_the_runbooks_folder_not_the_working_directory(
    payload_small, tmp_path, monkeypatch
):
    """Issue 33 N6: the spec's path was recorded relative to where compile ran, so a run started
    from another directory skipped the check without a word. It is found from the runbook's own
    folder now: an edited spec is refused whatever the working directory."""
    spec, script = make_here(tmp_path, payload_small.venv, monkeypatch)
    assert "readonly -a RB_SPEC_FILES=(rev.yaml ../rev.yaml " in script.read_text()
    spec.write_text(spec.read_text() + "# a comment is a change too\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, runbook in ((elsewhere, script), (script.parent, Path("rev.sh")), (Path("/"), script)):
        env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
        r = subprocess.run(
            ["bash", str(runbook), "--only", "preflight"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 2, (cwd, r.stderr[-2000:])
        assert "rev.yaml changed since this runbook was compiled" in r.stderr, cwd
        assert "spec not checked" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_spec_not_found_from_the_runbook_is_said_in_one_line_and_the_run_goes_on(
    payload_small, tmp_path, monkeypatch
):
    """Issue 33 N6: a spec moved away (or a runbook copied without it) cannot be checked; the run
    says so, once, and goes on (the runbook's own hash is still checked)."""
    spec, script = make_here(tmp_path, payload_small.venv, monkeypatch)
    spec.rename(tmp_path / "moved.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run(elsewhere, script, "--only", "preflight")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if "not checked" in line]
    assert lines == ["spec not checked: rev.yaml not found from here"], r.stderr[-3000:]
    assert "changed since" not in r.stderr
    # the runbook's own seal is checked all the same
    script.write_text(script.read_text().replace("readonly RB_JOBS=2\n", "readonly RB_JOBS=3\n"))
    r = run(elsewhere, script, "--only", "preflight")
    assert r.returncode == 2 and "this runbook was edited after it was compiled" in r.stderr
    assert "spec not checked: rev.yaml not found from here" in r.stderr


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
