"""Every picture of a run written beside its report (atomically), from files or a report dict; and
`python -m rbview`."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import List, Optional

import rbview

from .nodes import nodes_picture
from .page import page
from .timeline import from_report, read_log, timeline


def _write(out_dir: str, name: str, text: str) -> str:
    path = os.path.join(out_dir, name)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_all(
    report: dict, events_path: str, out_dir: str, fanout: Optional[dict] = None
) -> list[str]:
    """Write timeline.svg, nodes.svg (when FANOUT is given) and report.html into OUT_DIR; return
    their paths. FANOUT is `fanout.compare()`'s result, with the node reports under "reports"
    (node -> report) when the cells should carry seconds."""
    steps, samples = read_log(events_path)
    timed = bool(steps)
    if not steps:
        steps = from_report(report)
    written = [_write(out_dir, "timeline.svg", timeline(report, steps, samples, timed))]
    names = ["timeline.svg"]
    if fanout:
        written.append(
            _write(out_dir, "nodes.svg", nodes_picture(fanout, str(report.get("runbook", ""))))
        )
        names.append("nodes.svg")
    written.append(_write(out_dir, "report.html", page(report, names, fanout)))
    return written


def draw(report: dict, events: str, out: str, fanout: str = "") -> List[str]:
    """Every picture of a run into `out`, from its report (a dict), events.tsv and fanout.json
    (node-*.json beside it are read too); returns the paths written."""
    fan = None
    if fanout:
        with open(fanout, encoding="utf-8") as fh:
            fan = json.load(fh)
        where = os.path.dirname(os.path.abspath(fanout))
        reports = {}
        for node in fan.get("nodes") or []:
            path = os.path.join(where, "node-%s.json" % node)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as fh:
                        reports[node] = json.load(fh)
                except (OSError, ValueError):
                    pass
        fan = dict(fan, reports=reports)
    os.makedirs(out, exist_ok=True)
    return write_all(report, events, out, fan)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rbview",
        description=rbview.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--report", required=True, help="the run's report.json")
    parser.add_argument("--events", default="", help="the run's events.tsv")
    parser.add_argument("--out", required=True, help="directory to write the pictures into")
    parser.add_argument(
        "--fanout", default="", help="fanout.json; node-*.json beside it are read too"
    )
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as fh:
        report = json.load(fh)
    for path in draw(report, args.events, args.out, args.fanout):
        print(path)
    return 0
