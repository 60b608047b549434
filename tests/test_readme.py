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
from rbrules import compression, enginerules, streams

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
    # the one lock wait (rbrules.enginerules.LOCK_WAIT_S): RB_LOCK_WAIT's default and the usage text
    assert (
        in_templates(r"\$\{RB_LOCK_WAIT:-\{\{ (rules\.lock_wait)\|num \}\}\}") == "rules.lock_wait"
    )
    wait = str(enginerules.LOCK_WAIT_S)
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
        == streams.STREAMS_MIN_BYTES
    )
    said(r"one per two of `transfer\.jobs`")
    stated = int(said(r"at most ([0-9]+):").group(1))
    assert stated == streams.MAX_STREAMS
    assert [streams.stream_count(j) for j in (1, 2, 4, 6, 2 * stated, 4 * stated)] == [
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


def auto_order(runbook: str) -> list[str]:
    """The order `compression: auto` takes unmeasured, as the compiled runbook holds it."""
    text = (ROOT / "generated" / runbook).read_text(encoding="utf-8")
    m = re.search(r"RB_AUTO_COMPRESSION=\(\s*([^)]*)\)", text)
    assert m, f"{runbook}: no RB_AUTO_COMPRESSION"
    return m.group(1).split()


def test_compression_auto():
    from rbkit import model

    # what the relay measures: lz4 -1, zstd at each of ZSTD_LEVELS
    said(r"lz4 -1 and zstd -1/-3 packing a sample of the tree")
    assert [w for tool in ("lz4", "zstd") for w, _, _ in compression.measured_words(tool)] == [
        "lz4",
        "zstd-1",
        "zstd-3",
    ]
    assert compression.measured_words("lz4")[0][1][2] == "-1"
    margin = int(said(r"a compressor only where it beats none by ([0-9]+)%").group(1))
    assert round((model.MARGIN - 1) * 100) == margin
    # unmeasured: lz4, else zstd, else none; a fan-out bundle zstd first
    said(r"else lz4 where both ends have it, else zstd, else none")
    assert auto_order("b300.sh") == ["lz4", "zstd"]
    said(r"a fan-out bundle, copied to every node, takes zstd first")
    assert "fanout:" in (ROOT / "specs/cluster8.yaml").read_text(encoding="utf-8")
    assert auto_order("cluster8.sh") == ["zstd", "lz4"]


def test_a_failed_install_is_never_a_backup():
    from rbkit import installs

    # issue 46: the README said both "never a backup" and "keeps the failed one as a backup"
    assert not re.search(r"failed (one|install) as a backup", README.replace("\n", " "))
    said(
        r"the failed one is kept apart as `NAME\.rb-failed` \(one only, replaced by the next "
        r"failure; never a backup, never restored by `--restore`\)"
    )
    said(r"keeps the failed one apart as `NAME\.rb-failed` \(never a backup")
    assert installs.failed_path("/opt/NAME") == "/opt/NAME.rb-failed"


def test_the_pictures_command_runs(tmp_path):
    """The README's command that draws a run's pictures by hand runs as written (issue 46: it
    named `rbkit report --pictures`, which does not exist)."""
    assert "rbkit report" not in README
    said(r"`python -m rbview report \.\.\. --pictures DIR`")
    usage = subprocess.run(
        [sys.executable, "-m", "rbview", "report", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 0 and "--pictures" in usage.stdout, usage.stderr
    words = (
        said(
            r"python -m rbview (--report runs/NAME/latest/report\.json --events "
            r"runs/NAME/latest/events\.tsv \\\n\s*--out runs/NAME/latest) \[--fanout "
            r"runs/NAME/fanout/fanout\.json\]"
        )
        .group(1)
        .replace("\\\n", " ")
        .split()
    )
    run = tmp_path / "runs/NAME/latest"
    run.mkdir(parents=True)
    (run / "report.json").write_text("{}\n", encoding="utf-8")
    (run / "events.tsv").write_text("", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-I", "-m", "rbview", *words],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in run.glob("*.*")) == [
        "events.tsv",
        "report.html",
        "report.json",
        "timeline.svg",
    ]


def test_every_option_the_readme_gives_a_command_is_one_it_takes():
    """`bash generated/X.sh --FLAG`, `compile --FLAG` and `make TARGET` as the README writes
    them: each flag is in the runbook's or the compiler's --help, each target in the Makefile."""
    runbook = subprocess.run(
        ["bash", "generated/b300.sh", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert runbook.returncode == 0, runbook.stderr
    compiler = subprocess.run(
        [sys.executable, "-m", "compiler", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert compiler.returncode == 0, compiler.stderr
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text("utf-8"), re.M))
    seen = {"runbook": set(), "compile": set(), "make": set()}
    for m in re.finditer(r"\bbash generated/[a-z0-9-]+\.sh((?: --[a-z-]+)+)", README):
        seen["runbook"].update(m.group(1).split())
    for m in re.finditer(r"(?:^|`|\$ )compile((?: --[a-z-]+(?: [^\s`-][^\s`]*)*)+)", README, re.M):
        seen["compile"].update(w for w in m.group(1).split() if w.startswith("--"))
    for m in re.finditer(r"(?:^|`)make ([a-z-]+)\b", README, re.M):
        seen["make"].add(m.group(1))
    assert {"--plan", "--apply", "--discard-staging", "--list-backups"} <= seen["runbook"]
    assert {"--check", "--kit-diff", "--standalone", "--new", "--from"} <= seen["compile"]
    for flag in sorted(seen["runbook"]):
        assert re.search(r"^\s+%s\b" % re.escape(flag), runbook.stdout, re.M), flag
    for flag in sorted(seen["compile"]):
        assert re.search(r"[\s\[]%s\b" % re.escape(flag), compiler.stdout), flag
    assert {"run", "test", "regen", "reliability"} <= seen["make"]
    assert seen["make"] <= targets, seen["make"] - targets
