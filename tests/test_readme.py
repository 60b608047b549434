"""Every number the README states about the runbooks and the tools is checked here against what
makes it true (issue 35, item 5): a number that drifts fails this test instead of misleading a
reader. Examples of output (a log line, a resume message) are examples, not claims, and are not
checked; the ssh options the README lists are checked in test_input_hints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from rbkit import stream
from rbrules import common

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEMPLATES = ROOT / "templates"


def said(pattern: str) -> re.Match:
    """The README's words that state a number (whitespace in `pattern` matches any run of it, a
    line break included)."""
    m = re.search(pattern.replace(" ", r"\s+"), README)
    assert m, f"the README no longer says {pattern!r}: update this test with it"
    return m


def in_templates(pattern: str) -> str:
    """The one value `pattern`'s group takes in the templates, wherever they set it."""
    found = {
        m.group(1)
        for path in sorted(TEMPLATES.rglob("*.j2"))
        for m in re.finditer(pattern, path.read_text(encoding="utf-8"))
    }
    assert len(found) == 1, f"templates: {pattern!r} gives {sorted(found) or 'nothing'}"
    return found.pop()


def about(n: int, stated: int) -> bool:
    """`about N`: within a quarter of it."""
    return 0.75 * stated <= n <= 1.25 * stated


def test_a_runbook_is_at_most_350_lines_and_a_fan_out_about_800():
    said(
        r"in at most 350 lines \(a fan-out runbook, which writes its engine's steps and node script"
        r" in place, about 800; `wc -l generated/\*\.sh`\)"
    )
    runbooks = sorted((ROOT / "generated").glob("*.sh"))
    assert runbooks
    for path in runbooks:
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if "\nreadonly RB_FAN_ENGINE=" in text:
            assert about(lines, 800), f"{path.name}: {lines} lines"
        else:
            assert lines <= 350, f"{path.name}: {lines} lines"


def test_a_standalone_runbook_is_as_long_as_the_readme_says(tmp_path):
    stated = int(said(r"\(one file, about ([0-9,]+) lines\)").group(1).replace(",", ""))
    done = subprocess.run(
        [sys.executable, "-m", "compiler", "--standalone", "specs/b300.yaml", "-o", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = len((tmp_path / "b300.sh").read_text(encoding="utf-8").splitlines())
    assert about(lines, stated), f"--standalone b300.sh: {lines} lines, the README says {stated}"


def test_the_run_directories_defaults():
    keep = said(r"the newest ([0-9]+) are kept, `RB_KEEP_RUNS`").group(1)
    assert keep == in_templates(r"\$\{RB_KEEP_RUNS:-([0-9]+)\}")
    # the one lock wait (rbrules.common.LOCK_WAIT_S): RB_LOCK_WAIT's default and the usage text
    assert (
        in_templates(r"\$\{RB_LOCK_WAIT:-\{\{ (rules\.lock_wait)\|num \}\}\}") == "rules.lock_wait"
    )
    wait = str(common.LOCK_WAIT_S)
    assert (
        in_templates(r"RB_LOCK_WAIT \(seconds, default \{\{ (rules\.lock_wait)\|num \}\}\)")
        == "rules.lock_wait"
    )
    assert said(r"`RB_LOCK_WAIT` seconds \(default ([0-9]+)\)").group(1) == wait
    assert said(r"saying `waiting up to ([0-9]+) s for another").group(1) == wait
    assert said(r"still holds runs/NAME after ([0-9]+) s;").group(1) == wait


def test_an_interrupted_run():
    assert said(r"cleanup waits ([0-9]+) s for all").group(1) == in_templates(
        r'rb::wait_bounded ([0-9]+) "\$\{ends\[@\]\}"'
    )
    prompt = re.search(
        r"^PROMPT_S = ([0-9.]+)$",
        (ROOT / "tests/e2e/test_interrupt.py").read_text(encoding="utf-8"),
        re.M,
    ).group(1)
    stated = said(
        r"test_interrupt\.py holds the time from the signal to the prompt under "
        r"([0-9.]+) s"
    ).group(1)
    assert float(stated) == float(prompt)
    assert said(r"([0-9]+) interrupted\.").group(1) == in_templates(r"\bexit (1[0-9]{2})\b")


def test_streams_side_by_side():
    assert (
        int(said(r"a tree of ([0-9]+) MB or more goes in streams").group(1)) << 20
        == stream.STREAMS_MIN_BYTES
    )
    said(r"one per two of `transfer\.jobs`")
    stated = int(said(r"at most ([0-9]+):").group(1))
    assert stated == stream.MAX_STREAMS
    assert [stream.stream_count(j) for j in (1, 2, 4, 6, 2 * stated, 4 * stated)] == [
        1,
        1,
        2,
        3,
        stated,
        stated,
    ]
    assert said(r"a progress line every ([0-9]+) s").group(1) == in_templates(
        r"--progress ([0-9]+)\b"
    )


@pytest.mark.parametrize(
    "code, error", [(2, "SpecError"), (3, "LintError"), (4, "DriftError"), (64, "UsageError")]
)
def test_the_compilers_exit_codes(code, error):
    from compiler import errors

    said(r"\| %d \| " % code)
    assert getattr(errors, error).exit_code == code


def test_the_compilers_own_exit_codes():
    from compiler import cli

    said(r"\| 0 \| ok \|")
    said(r"\| 70 \| internal error")
    assert (cli.EXIT_OK, cli.EXIT_INTERNAL) == (0, 70)
