"""Golden pairs: each valid case compiles to its .sh, each invalid case fails with its .err."""

from __future__ import annotations

import io
import os
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from compiler import cli

CASES = Path(__file__).resolve().parents[1] / "cases"
VALID = sorted((CASES / "valid").glob("*.yaml"))
INVALID = sorted((CASES / "invalid").glob("*.yaml"))
KIT_FILE = re.compile(r"(<<'(RB_PY_\w+)'\n).*?\n(\2\n)", re.S)
KIT_ID = re.compile(
    r"^(readonly RB_KIT_SHA256=|readonly RB_KIT_FILE='?\.kit/|# sha256 of this file with "
    r"these 64 digits zeroed: )[0-9a-f]{64}",
    re.M,
)


def without_kit(text: str) -> str:
    """The kit (hostkit/rbkit + hostkit/rbprobes, thousands of lines) is the same in every runbook
    and has its own tests; goldens keep each heredoc's first and last line, so they show what a case
    changes and not what the kit does."""
    text = KIT_ID.sub(r"\1<kit hash>", text)
    return KIT_FILE.sub(lambda m: f"{m.group(1)}<kit file>\n{m.group(3)}", text)


def run_compile(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", VALID, ids=[p.stem for p in VALID])
def test_valid_case_compiles_to_its_golden_runbook(case, tmp_path, monkeypatch, golden):
    monkeypatch.chdir(CASES.parent.parent)
    rel = case.relative_to(CASES.parent.parent)
    code, _out, err = run_compile([str(rel), "-o", str(tmp_path)])
    assert code == 0, err
    text = (tmp_path / f"{case.stem}.sh").read_text()
    # the seal finds the spec from the runbook's folder (tmp_path here): the way there, not the
    # checkout's place, is what a case shows
    up = os.path.relpath(os.path.realpath(CASES.parent.parent), os.path.realpath(tmp_path))
    golden(case.with_suffix(".sh"), without_kit(text).replace(f" {up}/", " <checkout>/"))


@pytest.mark.parametrize("case", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_case_fails_with_its_golden_errors(case, tmp_path, monkeypatch, golden):
    monkeypatch.chdir(CASES.parent.parent)
    rel = case.relative_to(CASES.parent.parent)
    code, out, err = run_compile([str(rel), "-o", str(tmp_path)])
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == [], "nothing may be written for an invalid spec"
    golden(case.with_suffix(".err"), err)


def test_there_are_cases():
    assert len(VALID) >= 3 and len(INVALID) >= 10


def test_the_runtime_in_the_kit_is_its_golden(golden):
    """A default runbook reads its runtime (the same bash in every runbook) from the pinned kit's
    runtime.sh: its text is a golden of its own, so a change to it shows in review as a diff."""
    from compiler import kit

    golden(CASES / "runtime.sh", kit.runtime_text())
    assert kit.runtime_text() in cli.render.render(
        cli.plan.lint_view(_view(str(CASES / "valid" / "minimal_local.yaml")))
    )


def _view(spec: str) -> dict:
    from compiler import loader, resolve, validate

    source = loader.load(spec)
    return resolve.resolve(validate.validate_with_warnings(source)[0], source, "x.sh")
