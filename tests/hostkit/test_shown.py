"""rbrules.shown (issue 44 R8): how a name is shown to a person, and the runtime's rb::log, which
escapes a control character the same way. On 44a2c10 neither exists: names went out raw."""

from __future__ import annotations

import os
import subprocess

import pytest
from rbkit import channel
from rbrules.shown import printable, shown

EVIL = "evil\x1b[1A\x1b[2K\x07\ndisk: all fine"


@pytest.mark.parametrize(
    "name, want",
    [
        ("site-packages/ok.py", "site-packages/ok.py"),
        ("with space/é ü 字.py", "with space/é ü 字.py"),  # printable UTF-8 stays
        (EVIL, "evil\\x1b[1A\\x1b[2K\\x07\\ndisk: all fine"),
        ("tab\tcr\rdel\x7fnul\x00", "tab\\tcr\\rdel\\x7fnul\\x00"),
        ("c1 csi\x9b31m", "c1 csi\\x9b31m"),  # a terminal's 8-bit CSI
        ("rtl\u202egnp.exe", "rtl\\u202egnp.exe"),  # bidi override, not shown raw
        ("zero\u200bwidth\u2028line", "zero\\u200bwidth\\u2028line"),
        ("back\\slash", "back\\\\slash"),  # doubled: never ambiguous
        (b"lone\xff byte", "lone\\xff byte"),  # bytes that are not UTF-8
        (b"lone\xff".decode("utf-8", "surrogateescape"), "lone\\xff"),
        (b"caf\xc3\xa9", "café"),
    ],
)
def test_a_name_is_shown_as_ls_b_or_repr_would(name, want):
    assert shown(name) == want


def test_shown_is_printable_and_tells_names_apart():
    # (b"a\xff" is the file system's name that Python decodes as "a\udcff": one name)
    names = [EVIL, "a\\x1b", "a\x1b", "a\\\x1b", b"a\xff", "a\\xff", "a\u00ff", "a\\u00ff"]
    seen = [shown(n) for n in names]
    assert all(s.isprintable() for s in seen), seen
    assert len(set(seen)) == len(names), seen  # no two names shown alike


def test_printable_keeps_a_backslash_for_text_that_holds_shown_names():
    line = "differs: %s (s: expected 1, found 2)" % shown(EVIL + "\\")
    assert printable(line) == line
    assert printable("raw \x1b[2J and \\ kept\n") == "raw \\x1b[2J and \\ kept\\n"
    assert printable("plain text") == "plain text"


def test_rb_log_escapes_a_control_character_as_shown_does(tmp_path):
    """rb::log (the runtime's one log line: terminal and run.log): a message holding a raw name
    is written on one line, its control characters escaped as rbrules.shown.printable writes
    them; a message without one unchanged."""
    from compiler import kit

    runtime = tmp_path / "runtime.sh"
    runtime.write_text(kit.runtime_text())
    head = f"source {runtime}; RB_NAME=t; RB_STEP=s; "
    msg = "refusing " + EVIL + "\t\r\x7f and \\ kept"
    r = subprocess.run(
        ["bash", "-c", head + 'rb::log "$1"; rb::log "plain: $2"', "rb", msg, "a b\\c"],
        capture_output=True,
        timeout=30,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
    )
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 2, r.stderr
    assert lines[0].split(" ", 3)[3] == printable(msg)
    assert lines[1].endswith(" [s] plain: a b\\c")
    assert b"\x1b" not in r.stderr and b"\x07" not in r.stderr


def test_the_kits_engine_lines_never_carry_a_control_character(capsys):
    """The engine's human lines (stderr: the runbook's log) and its answer's fields (a detail the
    runbook logs) are printable."""

    channel.log("stripped " + EVIL + ": mode 0666 -> 0644")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b[1A" in err
    assert channel.one_line("failed: " + EVIL) == "failed: evil\\x1b[1A\\x1b[2K\\x07 disk: all fine"
