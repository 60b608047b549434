"""The source before anything is sent, in one engine process (`rbkit engine source`, issue #17):
the scan, then the static checks, skipped only when the source's stat fingerprint equals the one
the destination's install recorded; and what the destination's engine says it recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rbkit import sendside

from tests.hostkit.test_kit import make_tree

KIT = Path(__file__).resolve().parents[2] / "hostkit"


@pytest.fixture(autouse=True, params=["0", "1"], ids=["checks-after-scan", "checks-beside-scan"])
def beside(request, monkeypatch):
    """Every test both ways: the static checks in the engine's process after the scan (a host
    with few cores), and in a child Python begun before it (RBKIT_AUDIT_BESIDE=1)."""
    monkeypatch.setenv("RBKIT_AUDIT_BESIDE", request.param)
    return request.param


def source(src: Path, *extra: str, stdin: str = "") -> dict:
    """Run `rbkit engine source SRC EXTRA... --audit outside SRC`; its answer as a dict: set
    facts, events by step, status and detail."""
    env = dict(os.environ, PYTHONPATH=str(KIT), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit",
            "engine",
            "source",
            str(src),
            *extra,
            "--audit",
            "outside",
            str(src),
        ],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    facts, events, done = {}, {}, None
    for line in p.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "set":
            key, _, value = rest.partition("\t")
            facts[key] = value
        elif kind == "event":
            event = json.loads(rest)
            events[event["step"]] = event
        elif kind == "done":
            done = rest.split("\t", 1)
        else:
            raise AssertionError(f"not an answer line: {line!r} (stderr: {p.stderr})")
    return {"rc": p.returncode, "facts": facts, "events": events, "done": done, "err": p.stderr}


def test_the_scan_and_the_static_checks_answer_in_one_process(tmp_path):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    got = source(src)
    assert got["rc"] == 0 and got["done"][0] == "ok", got
    assert set(got["events"]) == {"scan", "audit"}
    assert got["facts"]["files"] and got["facts"]["stat_fingerprint"]
    assert got["facts"]["audit_rc"] == "0" and got["facts"]["audit_skipped"] == "0"


def test_a_failed_check_names_its_type_and_its_problems_reach_the_log(tmp_path):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    site = src / "lib" / "python3.11" / "site-packages"
    (site / "elsewhere.pth").write_text(f"{tmp_path / 'somewhere-else'}\n")
    got = source(src)
    assert got["done"][0] == "ok"  # the runbook judges it (--force, one machine)
    assert got["facts"]["audit_rc"] == "1" and got["facts"]["audit_failed"] == "outside"
    assert "somewhere-else" in got["err"]


def test_the_checks_are_skipped_only_for_the_stat_fingerprint_the_install_recorded(tmp_path):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    stat = source(src)["facts"]["stat_fingerprint"]
    same = source(src, "--installed-stat", stat)
    assert same["facts"]["audit_skipped"] == "1" and same["events"]["audit"]["status"] == "skipped"
    assert "same stat fingerprint" in same["events"]["audit"]["detail"]
    # from stdin (the runbook learns it from the destination's engine while the scan runs)
    assert source(src, "--installed-stat", "-", stdin=stat + "\n")["facts"]["audit_skipped"] == "1"
    other = source(src, "--installed-stat", "0" * 64)
    assert other["facts"]["audit_skipped"] == "0" and other["events"]["audit"]["status"] == "ok"
    assert source(src, "--installed-stat", "-", stdin="\n")["facts"]["audit_skipped"] == "0"
    # one file touched: the fingerprint differs, the checks run again
    os.utime(src / "bin" / "tool", (1, 1))
    again = source(src, "--installed-stat", stat)
    assert again["facts"]["audit_skipped"] == "0" and again["facts"]["stat_fingerprint"] != stat


def test_a_refused_source_fails_before_its_checks(tmp_path):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    got = source(src, "--exclude", "pyvenv.cfg", "--installed-stat", "-", stdin="\n")
    assert got["rc"] == 1 and got["done"][0] == "failed"
    assert "is not a venv after the excludes" in got["done"][1]
    assert "audit" not in got["events"]


def test_the_destination_says_what_its_install_recorded(tmp_path):
    dest = tmp_path / "venv"
    assert sendside.installed_stat(str(dest)) == ""
    dest.mkdir()
    (dest / ".rb-manifest.jsonl").write_text(
        json.dumps({"kind": "rb-manifest", "source_stat_fingerprint": "ab" * 32}) + "\n{}\n"
    )
    assert sendside.installed_stat(str(dest)) == "ab" * 32
    (dest / ".rb-manifest.jsonl").write_text('{"kind": "other", "source_stat_fingerprint": "x"}\n')
    assert sendside.installed_stat(str(dest)) == ""
    (dest / ".rb-manifest.jsonl").write_text("not json\n")
    assert sendside.installed_stat(str(dest)) == ""


def test_a_refused_source_has_no_static_checks_whichever_way_they_run(tmp_path, beside):
    got = source(tmp_path / "missing")
    assert got["done"][0] == "failed" and set(got["events"]) == {"scan"}, got
    assert "does not exist" in got["events"]["scan"]["detail"]


def test_a_rerun_runs_the_checks_after_the_scan_and_they_are_still_skipped_or_run(tmp_path):
    """--checks-beside no (the runbook's re-run with the same settings): the same answers."""
    src = tmp_path / "venv"
    make_tree(src, python=True)
    stat = source(src)["facts"]["stat_fingerprint"]
    same = source(src, "--checks-beside", "no", "--installed-stat", stat)
    assert same["facts"]["audit_skipped"] == "1", same
    other = source(src, "--checks-beside", "no", "--installed-stat", "0" * 64)
    assert other["facts"]["audit_skipped"] == "0" and other["facts"]["audit_rc"] == "0", other


def test_checks_held_for_a_possible_skip_still_run_when_the_runbook_says_none(tmp_path):
    """--checks-beside no with `-`: an empty line (no install, or no pass recorded here) starts
    the checks; they run and pass whichever way this host runs them."""
    src = tmp_path / "venv"
    make_tree(src, python=True)
    got = source(src, "--checks-beside", "no", "--installed-stat", "-", stdin="\n")
    assert got["facts"]["audit_skipped"] == "0" and got["facts"]["audit_rc"] == "0", got
    assert got["events"]["audit"]["status"] == "ok"
