"""report.html seen in real headless Chromium (issue 36): for a passing run, a failing run with a
failed check, an interrupted run and a fan-out, the outcome, every step row and every failed check
are on the page and seen, its pictures load, and the screenshot is not blank and shows the
outcome's colour. The runs are tests/picture_data's (report.json and events.tsv as a runbook
leaves them); tests/e2e/test_report_browser.py does the same for runbooks run on the lab.

Without chromium these skip, except with CI=true, where they fail (tests/browser.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rbview import draw as pictures

from tests import browser, picture_data


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    picture_data.write(out)
    return out


def drawn(runs: Path, name: str, tmp_path: Path, fanout: bool = False) -> Path:
    run = tmp_path / name
    shutil.copytree(runs / name, run)
    argv = [
        "--report",
        str(run / "report.json"),
        "--events",
        str(run / "events.tsv"),
        "--out",
        str(run),
    ]
    if fanout:
        argv += ["--fanout", str(run / "fanout" / "fanout.json")]
    assert pictures.main(argv) == 0
    return run


@pytest.mark.parametrize(
    "name, outcome",
    [("two-host-ok", "ok"), ("two-host", "failed"), ("two-host-interrupted", "interrupted")],
)
def test_a_run_is_seen_as_its_report_says(runs, tmp_path, name, outcome):
    run = drawn(runs, name, tmp_path)
    assert json.loads((run / "report.json").read_text())["outcome"] == outcome
    seen = browser.assert_seen(run)
    if outcome == "failed":
        row = seen.row("matmul", "L2", "fail")
        assert row and "kernel image not found" in row["cells"][4]
    if outcome == "interrupted":
        assert seen.row("transfer", "ct200->b300", "interrupted")["seen"]


def test_a_fanout_is_seen_with_its_odd_node(runs, tmp_path):
    run = drawn(runs, "fanout", tmp_path, fanout=True)
    fan = json.loads((run / "fanout" / "fanout.json").read_text())
    seen = browser.assert_seen(run, fanout=fan)
    assert {i["src"] for i in seen.images} == {"timeline.svg", "nodes.svg"}
    # the comparison's rows: one per group, the odd node's failed libraries check among them
    assert any(
        r["cells"][:1] == ["gpu05"] and "fail" in r["cells"] and r["seen"] for r in seen.rows
    ), seen.rows


def test_a_hidden_row_is_not_seen(runs, tmp_path):
    """The check itself: a step row hidden by the page's style is caught."""
    run = drawn(runs, "two-host-ok", tmp_path)
    page = run / "report.html"
    page.write_text(page.read_text().replace("</style>", "tr:nth-child(3){display:none}</style>"))
    with pytest.raises(AssertionError):
        browser.assert_seen(run)


def test_a_blank_screenshot_is_caught(tmp_path):
    """The PNG reader, on a one-colour picture and on one with a second colour."""
    import struct
    import zlib

    def png(rows: list[bytes], w: int) -> bytes:
        def chunk(kind: bytes, body: bytes) -> bytes:
            return (
                struct.pack(">I", len(body))
                + kind
                + body
                + struct.pack(">I", zlib.crc32(kind + body))
            )

        head = struct.pack(">IIBBBBB", w, len(rows), 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", head)
            + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b"")
        )

    white = b"\x00" + b"\xff" * 12
    assert browser.colours(png([white, white], 4)) == {(255, 255, 255): 8}
    # filter 2 (up) with a delta, filter 1 (sub): the second row decodes to another colour
    up = b"\x02" + bytes([0, 1, 1] + [0] * 9)
    assert browser.colours(png([white, up], 4)) == {(255, 255, 255): 7, (255, 0, 0): 1}
