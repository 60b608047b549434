"""Names from the source's files never reach root's terminal raw (issue 44 R8).

A file in the source venv is named with ESC, BEL and a newline: on 44a2c10 it rewrote the line
above on the `--plan` screen and printed a line of its own, `disk: all fine`, there and in
changes.txt. Every place a person reads a name (the plan's screen and changes.txt, the run's
terminal and run.log, the summary, report.html, a refusal that names the file) must show it
escaped, as `ls -b` or repr would (rbrules.shown); plan.json and the manifests keep it exact.
A local runbook (this machine is both ends): no lab needed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_

pytestmark = pytest.mark.e2e

EVIL = "evil\x1b[1A\x1b[2K\x07\ndisk: all fine\x1b[8m"
SHOWN = "evil\\x1b[1A\\x1b[2K\\x07\\ndisk: all fine\\x1b[8m"
RAW = [b"\x1b", b"\x07", b"\x9b", b"\xc2\x9b"]  # what a terminal obeys


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(
        ["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True, timeout=600
    )


def assert_clean(what: str, data: bytes) -> None:
    """No byte a terminal obeys, and no line that starts with the name's fake one."""
    for raw in RAW:
        assert raw not in data, (
            f"{what}: raw {raw!r} at {data.find(raw)}: "
            f"{data[max(0, data.find(raw) - 200) : data.find(raw) + 80]!r}"
        )
    assert not any(ln.lstrip().startswith(b"disk: all fine") for ln in data.splitlines()), what


def site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def test_a_file_name_with_control_characters_is_shown_escaped_everywhere(payload_small, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "dest" / "venv"
    script = compile_(tmp_path, src, dst, policy="backup")
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-4000:]
    # nobody's file (any user who can write the source) with a name that rewrites the screen
    (site(src) / EVIL).write_text("x\n")
    plan = run(tmp_path, script, "--plan")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 0, said[-4000:]
    assert_clean("--plan's screen", said)
    rel = str((site(src) / EVIL).relative_to(src)).replace(EVIL, SHOWN)
    assert f">f+++++++++ {rel}".encode() in plan.stdout, plan.stdout[-3000:]
    changes = next((tmp_path / "run").rglob("changes.txt"))
    assert_clean("changes.txt", changes.read_bytes())
    assert changes.read_text().splitlines() == [f">f+++++++++ {rel}"]
    # the run that moves it: its terminal, run.log and report.html; the name arrives exact
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (site(dst) / EVIL).read_text() == "x\n"
    for what, data in (
        ("the run's terminal", r.stdout + r.stderr),
        ("run.log", (tmp_path / "run" / "run.log").read_bytes()),
        ("report.html", (tmp_path / "run" / "report.html").read_bytes()),
    ):
        assert_clean(what, data)
    # a refusal that names it (world-writable: special_modes refuse), and a name that is not
    # UTF-8 at all (a lone \xff byte and a newline): both named, escaped, everywhere
    (site(src) / EVIL).chmod(0o666)
    bad = os.fsencode(site(src)) + b"/lone\xff\x1b]0;title\x07\nbyte"
    with open(bad, "wb") as f:
        f.write(b"y\n")
    for args in ((), ("--plan",)):
        r = run(tmp_path, script, *args)
        said = r.stdout + r.stderr
        assert r.returncode != 0, said[-3000:]
        assert_clean(f"the refusal ({' '.join(args) or 'run'})", said)
        assert SHOWN.encode() + b" (0666)" in said, said[-3000:]
        assert b"lone\\xff\\x1b]0;title\\x07\\nbyte" in said, said[-3000:]
    for what, data in (
        ("run.log", (tmp_path / "run" / "run.log").read_bytes()),
        ("report.json", (tmp_path / "run" / "report.json").read_bytes()),
        ("report.html", (tmp_path / "run" / "report.html").read_bytes()),
    ):
        assert_clean(what, data)
