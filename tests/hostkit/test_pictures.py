"""The pictures of a run (rbview): well-formed SVG and HTML, every step, host and node
named, failures drawn as failures, hostile text escaped, the same bytes for the same run."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rbview import draw as pictures
from rbview import timeline
from rbview.svg import COLOURS

from tests import picture_data

SVG = "{http://www.w3.org/2000/svg}"
RED = COLOURS["failed"][0]
HOSTILE = "<script>alert(\"x\")</script> & 'q' ]]> \x01"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    picture_data.write(tmp_path / "in")
    return tmp_path / "in"


def draw(run: Path, out: Path, fanout: bool = False) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        "--report",
        str(run / "report.json"),
        "--events",
        str(run / "events.tsv"),
        "--out",
        str(out),
    ]
    if fanout:
        argv += ["--fanout", str(run / "fanout" / "fanout.json")]
    assert pictures.main(argv) == 0
    return sorted(p.name for p in out.iterdir())


def svg(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def texts(root: ET.Element) -> list[str]:
    """What each <text> shows (its tooltip left out)."""
    return [(t.text or "") + "".join(c.tail or "" for c in t) for t in root.iter(SVG + "text")]


def titled(root: ET.Element, tag: str) -> list[tuple[dict, str]]:
    """(attributes, tooltip) of every TAG element that has a <title>."""
    out = []
    for el in root.iter(SVG + tag):
        t = el.find(SVG + "title")
        if t is not None:
            out.append((el.attrib, t.text or ""))
    return out


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def page(path: Path) -> Tags:
    p = Tags()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_timeline_names_every_step_host_and_check(runs, tmp_path):
    assert draw(runs / "two-host", tmp_path / "o") == ["report.html", "timeline.svg"]
    root = svg(tmp_path / "o" / "timeline.svg")
    words = texts(root)
    for step in (
        "preflight",
        "manifest",
        "transfer",
        "verify",
        "relocate",
        "swap",
        "exports",
        "probe",
    ):
        assert step in words
    for host in ("hosts ct200 \u2192 b300", "host ct200", "host b300"):
        assert host in words
    for check in ("torch", "devices", "matmul", "imports"):
        assert "\u00b7 " + check in words
    assert "0 s" in words and "25 s" in words  # the axis, in seconds
    assert {"ok / pass", "failed", "transfer rate"} <= set(words)  # the legend


def test_a_failed_step_is_red_and_named(runs, tmp_path):
    draw(runs / "two-host", tmp_path / "o")
    root = svg(tmp_path / "o" / "timeline.svg")
    red = [tip for attrs, tip in titled(root, "rect") if attrs.get("fill") == RED]
    assert any(tip.startswith("step probe on b300: FAILED") for tip in red)
    assert any(tip.startswith("check matmul on b300: FAIL") for tip in red)
    assert not any("verify" in tip for tip in red)
    words = texts(root)
    assert (
        "FAILED: step probe on host b300 after 6.4 s: rc=1: 1 check failed on b300: matmul" in words
    )
    assert root.find(SVG + "title").text == "runbook b300: failed, 26 s"


def test_progress_samples_draw_a_curve_else_the_average(runs, tmp_path):
    draw(runs / "two-host", tmp_path / "o")
    curve = [a for a, tip in titled(svg(tmp_path / "o" / "timeline.svg"), "polyline")]
    assert len(curve) == 1 and "stroke-dasharray" not in curve[0]
    assert len(curve[0]["points"].split()) > 20  # a point pair per sample interval
    events = runs / "two-host" / "events.tsv"
    events.write_text(
        "".join(ln for ln in events.read_text().splitlines(True) if not ln.startswith("progress"))
    )
    draw(runs / "two-host", tmp_path / "p")
    root = svg(tmp_path / "p" / "timeline.svg")
    ((flat, tip),) = titled(root, "polyline")
    assert flat["stroke-dasharray"] == "6 3" and len(flat["points"].split()) == 2
    assert "transfer 3.2 GB: 333 MB/s average (no progress samples: average only)" in texts(root)


def test_fanout_heatmap_names_odd_and_missing_nodes(runs, tmp_path):
    names = draw(runs / "fanout", tmp_path / "o", fanout=True)
    assert names == ["nodes.svg", "report.html", "timeline.svg"]
    root = svg(tmp_path / "o" / "nodes.svg")
    words = texts(root)
    for n in picture_data.NODES:
        assert n in words
    for col in ("receive", "verify", "prove", "swap", "torch", "libraries", "imports"):
        assert col in words
    cells = {tip.split(":")[0]: (a["fill"], tip) for a, tip in titled(root, "rect")}
    assert cells["gpu05 libraries"][0] == COLOURS["fail"][0]
    assert cells["gpu05 libraries"][1] == "gpu05 libraries: FAIL, 0.1 s"
    assert cells["gpu01 libraries"][0] == COLOURS["pass"][0]
    assert cells["gpu01 receive"][1] == "gpu01 receive: pass, 6.3 s"  # seconds from node-*.json
    assert cells["gpu07"][0] == "url(#nohatch)" and "closed by remote host" in cells["gpu07"][1]
    assert not any(k.startswith("gpu07 ") for k in cells)
    assert "no report" in words
    assert any(w.startswith("odd node gpu05: check:libraries: fail (others: pass)") for w in words)
    assert any(w.startswith("no report from gpu07: gpu07: Connection") for w in words)
    assert root.find(SVG + "title").text.startswith(
        "fan-out cluster8: 6/8 nodes passed; 1 odd, 1 missing; success policy 7: NOT met"
    )


def test_the_page_links_the_pictures_and_shows_checks_and_comparison(runs, tmp_path):
    draw(runs / "fanout", tmp_path / "f", fanout=True)
    p = page(tmp_path / "f" / "report.html")
    imgs = [a["src"] for t, a in p.tags if t == "img"]
    links = [a["href"] for t, a in p.tags if t == "a"]
    assert imgs == ["timeline.svg", "nodes.svg"] and {"timeline.svg", "nodes.svg"} <= set(links)
    text = " ".join(p.text)
    assert "gpu[01-04,06,08]" in text and "libcudart.so.12 loaded from" in text
    assert "Odd nodes" in text and "Missing nodes" in text and "closed by remote host" in text
    draw(runs / "two-host", tmp_path / "t")
    p = page(tmp_path / "t" / "report.html")
    assert [a["src"] for t, a in p.tags if t == "img"] == ["timeline.svg"]
    rows = [d.strip() for d in p.text if d.strip()]
    i = rows.index("matmul")  # id, level, status, seconds, reason
    assert rows[i : i + 5] == [
        "matmul",
        "L2",
        "fail",
        "1.30",
        "sm_103 kernel image not found (torch built for sm_90): no kernel image is available",
    ]


def rename(value, old: str, new: str):
    """VALUE with OLD replaced by NEW in every string and key."""
    if isinstance(value, dict):
        return {rename(k, old, new): rename(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [rename(v, old, new) for v in value]
    return value.replace(old, new) if isinstance(value, str) else value


def test_hostile_text_is_escaped_everywhere(runs, tmp_path):
    run = runs / "two-host"
    (run / "events.tsv").write_text(
        (run / "events.tsv")
        .read_text()
        .replace("\tb300\t", "\t" + HOSTILE + "\t")
        .replace("25 files rewritten", HOSTILE)
    )
    doc = json.loads((run / "report.json").read_text())
    doc["runbook"] = HOSTILE
    doc["probes"][HOSTILE] = doc["probes"]["b300"]
    doc["probes"][HOSTILE]["checks"][0]["reason"] = HOSTILE
    fan = json.loads((runs / "fanout" / "fanout" / "fanout.json").read_text())
    fan = rename(fan, "gpu05", HOSTILE)
    written = pictures.write_all(doc, str(run / "events.tsv"), str(tmp_path), fan)
    assert [Path(p).name for p in written] == ["timeline.svg", "nodes.svg", "report.html"]
    for name in ("timeline.svg", "nodes.svg"):
        raw = (tmp_path / name).read_text(encoding="utf-8")
        assert "<script" not in raw and "\x01" not in raw
        root = svg(tmp_path / name)
        assert not [e for e in root.iter() if "script" in e.tag]
        assert any("<script>alert(\"x\")</script> & 'q'" in w for w in texts(root))
    p = page(tmp_path / "report.html")
    assert "script" not in [t for t, _ in p.tags]
    assert "<script" not in (tmp_path / "report.html").read_text(encoding="utf-8")
    assert any("<script>alert(\"x\")</script> & 'q'" in d for d in p.text)


def test_same_run_same_bytes(runs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    draw(runs / "fanout", a, fanout=True)
    draw(runs / "fanout", b, fanout=True)
    for name in ("timeline.svg", "nodes.svg", "report.html"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert sorted(p.name for p in a.iterdir()) == ["nodes.svg", "report.html", "timeline.svg"]


def test_no_event_log_lays_steps_end_to_end_and_bad_lines_are_skipped(runs, tmp_path):
    doc = json.loads((runs / "two-host" / "report.json").read_text())
    pictures.write_all(doc, str(tmp_path / "absent.tsv"), str(tmp_path))
    root = svg(tmp_path / "timeline.svg")
    assert any("no event log" in w for w in texts(root)) and "swap" in texts(root)
    log = tmp_path / "events.tsv"
    log.write_text(
        "step\tverify\tok\tnot-a-time\t5\th\t\nprogress\tx\n"
        "step\tswap\tinterrupted\t1000\t1500\th\t\n"
    )
    steps, samples = timeline.read_log(str(log))
    assert [s["id"] for s in steps] == ["swap"] and samples == {}
    pictures.write_all({"runbook": "r", "outcome": "interrupted"}, str(log), str(tmp_path))
    words = texts(svg(tmp_path / "timeline.svg"))
    assert "INTERRUPTED: step swap on host h after 0.5 s" in words


def test_the_readme_fanout_example_is_what_the_code_draws(runs, tmp_path, golden):
    draw(runs / "fanout", tmp_path / "o", fanout=True)
    golden(
        Path(__file__).resolve().parents[2] / "docs" / "img" / "nodes.svg",
        (tmp_path / "o" / "nodes.svg").read_text(encoding="utf-8"),
    )


def test_overlapping_checks_are_placed_where_the_probe_says_they_ran():
    """The probe runs independent checks at once and reports when each ran (`schedule`): the
    timeline places each check there, not one after the other."""

    steps = [{"id": "probe", "host": "dst", "start": 1000.0, "end": 9000.0}]
    report = {
        "probes": {
            "dst": {
                "started": 1.5,
                "checks": [
                    {"id": "libraries", "status": "pass", "duration_s": 5.0},
                    {"id": "nccl", "status": "pass", "duration_s": 4.0},
                    {"id": "matmul", "status": "pass", "duration_s": 1.0},
                ],
                "schedule": [
                    {"id": "libraries", "lane": "serial", "start_s": 0.0, "end_s": 5.0},
                    {"id": "nccl", "lane": "parallel", "start_s": 0.0, "end_s": 4.0},
                    {"id": "matmul", "lane": "serial", "start_s": 5.0, "end_s": 6.0},
                ],
            }
        }
    }
    rows = {r["id"]: (r["start"], r["end"]) for r in timeline._check_rows(report, "dst", steps)}
    assert rows == {
        "libraries": (1500.0, 6500.0),
        "nccl": (1500.0, 5500.0),
        "matmul": (6500.0, 7500.0),
    }
    # without a schedule (an older probe): one after the other, as before
    del report["probes"]["dst"]["schedule"]
    rows = {r["id"]: (r["start"], r["end"]) for r in timeline._check_rows(report, "dst", steps)}
    assert rows["nccl"] == (6500.0, 10500.0)


def test_the_report_draws_the_pictures_in_its_own_process_and_a_drawing_never_fails_it(
    runs, tmp_path, monkeypatch, capsys
):
    """`rbview report --pictures DIR`: what a runbook's end runs (one Python start, not two)."""
    from rbview import runreport as kit_cli

    run = runs / "two-host"
    out = tmp_path / "run"
    argv = [
        "--name",
        "bench",
        "--spec",
        "s.yaml",
        "--sha",
        "0" * 64,
        "--events",
        str(run / "events.tsv"),
        "--outcome",
        "ok",
        "--out",
        str(out / "report.json"),
        "--pictures",
        str(out),
    ]
    out.mkdir()
    assert kit_cli.main(argv) == 0
    drawn = capsys.readouterr().out.split()
    assert {"timeline.svg", "report.html"} <= {Path(p).name for p in drawn if p != "drawn"}
    assert (out / "report.json").is_file() and (out / "timeline.svg").is_file()

    def broken(*args, **kw):
        raise ValueError("a drawing bug")

    monkeypatch.setattr(pictures, "write_all", broken)
    (out / "report.json").unlink()
    assert kit_cli.main(argv) == 0  # the report stands
    captured = capsys.readouterr()
    assert "drawn" not in captured.out and "could not draw the pictures: ValueError" in captured.err
    assert json.loads((out / "report.json").read_text())["steps"]
