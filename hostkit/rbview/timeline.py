"""timeline.svg: one row per step, grouped in one band per host, on a time axis in seconds (from
the step lines of the event log), each host's checks under its band, and the transfer rate over
time (from `progress` lines when the log has them, else the transfer's average rate)."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from rbrules.units import human

from .svg import (
    CHAR,
    RATE,
    Svg,
    colour,
    fit,
    host_label,
    legend,
    nice,
    num,
    secs,
    status_word,
    wrap,
)

Samples = Dict[Tuple[str, str], List[Tuple[int, int]]]  # (step, host) -> [(t_ms, bytes)]


def read_log(path: str) -> Tuple[List[Dict[str, Any]], Samples]:
    """Steps with their start and end (ms) and the progress samples per (step, host), in file
    order; lines that do not parse are skipped (a log cut short by a crash still draws)."""
    steps: List[Dict[str, Any]] = []
    samples: Samples = {}
    if not path or not os.path.exists(path):
        return steps, samples
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            try:
                if parts[0] == "step" and len(parts) >= 7:
                    steps.append(
                        {
                            "id": parts[1],
                            "status": parts[2],
                            "start": int(parts[3]),
                            "end": max(int(parts[3]), int(parts[4])),
                            "host": parts[5],
                            "detail": parts[6],
                        }
                    )
                elif parts[0] == "progress" and len(parts) >= 5:
                    samples.setdefault((parts[1], parts[2]), []).append(
                        (int(parts[3]), int(parts[4]))
                    )
            except ValueError:
                continue
    return steps, samples


def from_report(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """No event log: the report's steps one after the other, by their durations."""
    steps, at_ms = [], 0
    for step in report.get("steps", []):
        ms = int(round(float(step.get("duration_s") or 0) * 1000))
        steps.append(
            {
                "id": step.get("id", "?"),
                "status": step.get("status", "?"),
                "start": at_ms,
                "end": at_ms + ms,
                "host": step.get("host") or "",
                "detail": step.get("detail", ""),
            }
        )
        at_ms += ms
    return steps


def _check_rows(
    report: Dict[str, Any], host: str, steps: List[Dict[str, Any]]
) -> List[Dict[str, Any]]:
    """HOST's checks as rows with a start and end (ms) where they can be placed: one after the
    other from the probe's start, which is its own clock's; when that falls outside the step that
    ran the probe on HOST (clocks differ), from that step's start."""
    doc = (report.get("probes") or {}).get(host)
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        return []
    probe = [s for s in steps if s["host"] == host and "probe" in s["id"]]
    started = doc.get("started")
    at_ms: Optional[float] = None
    if isinstance(started, (int, float)):
        at_ms = float(started) * 1000
    if probe and (at_ms is None or not probe[-1]["start"] <= at_ms <= probe[-1]["end"]):
        at_ms = float(probe[-1]["start"])
    # where the probe says when each check ran (its `schedule`: checks overlap), each row is
    # placed there; else one after the other
    schedule = {}
    for item in doc.get("schedule") or []:
        if isinstance(item, dict) and all(
            isinstance(item.get(k), (int, float)) for k in ("start_s", "end_s")
        ):
            schedule[str(item.get("id"))] = (float(item["start_s"]), float(item["end_s"]))
    t0 = at_ms
    rows = []
    for check in doc["checks"]:
        if not isinstance(check, dict):
            continue
        seconds = check.get("duration_s")
        seconds = float(seconds) if isinstance(seconds, (int, float)) else None
        row = {
            "id": str(check.get("id", "?")),
            "status": str(check.get("status", "?")),
            "check": True,
            "detail": str(check.get("reason") or ""),
            "level": check.get("level"),
            "seconds": seconds,
            "start": None,
            "end": None,
        }
        at = schedule.get(row["id"])
        if t0 is not None and at is not None:
            row["start"], row["end"] = t0 + at[0] * 1000, t0 + at[1] * 1000
        elif at_ms is not None and seconds is not None:
            row["start"], row["end"] = at_ms, at_ms + seconds * 1000
            at_ms += seconds * 1000
        rows.append(row)
    return rows


def _rates(
    steps: List[Dict[str, Any]], report: Dict[str, Any], samples: Samples
) -> List[Dict[str, Any]]:
    """Rate series per transfer: from progress samples (MB/s between successive samples) when
    there are at least two, else the step's average (fact mb_s) over the step."""
    facts = {}
    for step in report.get("steps", []):
        if isinstance(step, dict) and step.get("facts"):
            facts.setdefault(step.get("id"), step["facts"])
    out = []
    for step in steps:
        got = sorted(set(samples.get((step["id"], step["host"]), [])))
        step_facts = facts.get(step["id"], {})
        if len(got) >= 2:
            pts = []
            for (t1, b1), (t2, b2) in zip(got, got[1:]):
                if t2 > t1:
                    pts.append((t1, t2, max(0.0, (b2 - b1) / (t2 - t1) / 1000.0)))
            if pts:
                total = (got[-1][1] - got[0][1]) / max(1, got[-1][0] - got[0][0]) / 1000.0
                out.append(
                    {
                        "step": step,
                        "points": pts,
                        "average": total,
                        "sampled": True,
                        "bytes": step_facts.get("bytes", got[-1][1]),
                    }
                )
                continue
        if isinstance(step_facts.get("mb_s"), (int, float)) and step["end"] > step["start"]:
            out.append(
                {
                    "step": step,
                    "points": [(step["start"], step["end"], float(step_facts["mb_s"]))],
                    "average": float(step_facts["mb_s"]),
                    "sampled": False,
                    "bytes": step_facts.get("bytes"),
                }
            )
    return out


class Axis:
    """Time (ms) to x, and the ticks of the time axis: 1, 2 or 5 times a power of ten seconds."""

    def __init__(self, t0: float, span: float, x0: float, x1: float) -> None:
        self.t0, self.x0, self.x1 = t0, x0, x1
        self.scale = (x1 - x0) / span
        step = nice(span / 1000.0) * 1000
        self.ticks = [n * step for n in range(int(span / step + 1e-9) + 1)]

    def x_at(self, ms: float) -> float:
        return self.x0 + (ms - self.t0) * self.scale

    def draw(self, svg: Svg, axis_y: float) -> None:
        svg.line(self.x0, axis_y, self.x1, axis_y, stroke="#546e7a", stroke_width=1.0)
        for tick in self.ticks:
            gx = self.x0 + tick * self.scale
            svg.line(gx, axis_y, gx, axis_y + 5, stroke="#546e7a", stroke_width=1.0)
            svg.text(
                gx, axis_y + 18, "%s s" % num(tick / 1000.0), 11, anchor="middle", fill="#37474f"
            )

    def grid(self, svg: Svg, top: float, bottom: float, colour: str) -> None:
        for tick in self.ticks:
            gx = self.x0 + tick * self.scale
            svg.line(gx, top, gx, bottom, stroke=colour, stroke_width=1.0)


def _bar(svg: Svg, axis: Axis, row: Dict[str, Any], host: str, mid: float) -> None:
    """One step's or check's bar at height MID, its time (and, when it did not pass, its status
    and detail) beside it, on the side with more room."""
    fill = colour(row["status"])[0]
    bx, bw = axis.x_at(row["start"]), max(3.0, (row["end"] - row["start"]) * axis.scale)
    height = 14.0 if not row["check"] else 10.0
    took = (row["end"] - row["start"]) / 1000.0
    tip = "%s %s on %s: %s, %s%s" % (
        "check" if row["check"] else "step",
        row["id"],
        host or "this machine",
        status_word(row["status"]),
        secs(took),
        (": " + row["detail"]) if row["detail"] else "",
    )
    svg.rect(bx, mid - height / 2, bw, height, fill, title=tip, rx=2.0)
    note = secs(took)
    if row["status"] not in ("ok", "pass"):
        note = "%s %s%s" % (
            status_word(row["status"]),
            note,
            (": " + row["detail"]) if row["detail"] else "",
        )
    weight = "bold" if row["status"] in ("failed", "fail", "interrupted") else None
    ink = {"ok": "#37474f", "pass": "#37474f", "skip": "#546e7a"}.get(row["status"], fill)
    after, before = axis.x1 - (bx + bw) - 6, bx - axis.x0 - 6
    if after >= before or after >= 200:
        svg.text(bx + bw + 6, mid + 4, fit(note, after, 11), 11, fill=ink, weight=weight, title=tip)
    else:
        svg.text(
            bx - 6,
            mid + 4,
            fit(note, before, 11),
            11,
            anchor="end",
            fill=ink,
            weight=weight,
            title=tip,
        )


def _rate_panel(svg: Svg, axis: Axis, rates: List[Dict[str, Any]], ypos: float) -> float:
    """The transfer rate (MB/s) on the timeline's time axis, from YPOS; returns the y below it.
    Sampled rates are a solid step curve, an average alone a dashed line over its step."""
    panel_h = 90.0
    top = max(p[2] for r in rates for p in r["points"]) or 1.0
    ystep = nice(top, 3)
    ymax = ystep * math.ceil(top * 1.25 / ystep)
    svg.text(16, ypos + 4, "transfer rate", 13, weight="bold", fill="#263238")
    ypos += 14

    def rate_y(rate: float) -> float:
        return ypos + panel_h - rate / ymax * panel_h

    for tick in range(int(ymax / ystep + 1e-9) + 1):
        svg.line(
            axis.x0,
            rate_y(tick * ystep),
            axis.x1,
            rate_y(tick * ystep),
            stroke="#eceff1",
            stroke_width=1.0,
        )
        svg.text(
            axis.x0 - 8,
            rate_y(tick * ystep) + 4,
            "%s MB/s" % num(tick * ystep),
            11,
            anchor="end",
            fill="#37474f",
        )
    axis.grid(svg, ypos, ypos + panel_h, "#eceff1")

    def xy(ms: float, rate: float) -> str:
        return "%s,%s" % (num(axis.x_at(ms)), num(rate_y(rate)))

    for series in rates:
        step, points = series["step"], series["points"]
        line = [xy(t, v) for a, b, v in points for t in (a, b)]
        first, last = points[0][0], points[-1][1]
        svg.add(
            "polygon",
            {
                "points": " ".join([xy(first, 0)] + line + [xy(last, 0)]),
                "fill": RATE,
                "fill-opacity": "0.15",
            },
        )
        svg.add(
            "polyline",
            {
                "points": " ".join(line),
                "fill": "none",
                "stroke": RATE,
                "stroke-width": "2",
                "stroke-dasharray": None if series["sampled"] else "6 3",
            },
            title="%s on %s: %s"
            % (
                step["id"],
                step["host"] or "this machine",
                "sampled" if series["sampled"] else "average only",
            ),
        )
        what = "%s%s: %s MB/s average%s" % (
            step["id"],
            (" " + human(series["bytes"])) if series["bytes"] is not None else "",
            num(series["average"]),
            "" if series["sampled"] else " (no progress samples: average only)",
        )
        lx, ly = axis.x_at(first), rate_y(max(p[2] for p in points)) - 6
        if lx + len(what) * 11 * CHAR > axis.x1:
            svg.text(min(axis.x1, axis.x_at(last)), ly, what, 11, anchor="end", fill=RATE)
        else:
            svg.text(lx, ly, what, 11, fill=RATE)
    axis.draw(svg, ypos + panel_h)
    return ypos + panel_h + 30


def timeline(
    report: Dict[str, Any], steps: List[Dict[str, Any]], samples: Samples, timed: bool = True
) -> str:
    """The timeline picture (see the module's docstring). TIMED: the steps have real start
    times (else they were laid one after the other from their durations)."""
    hosts: List[str] = []
    for step in steps:
        if step["host"] not in hosts:
            hosts.append(step["host"])
    bands = [
        (h, [dict(s, check=False) for s in steps if s["host"] == h] + _check_rows(report, h, steps))
        for h in hosts
    ]
    times = [r[k] for _, rows in bands for r in rows for k in ("start", "end") if r[k] is not None]
    t0 = min(times) if times else 0
    total = (max(times) - t0) / 1000.0 if times else 0.0
    rates = _rates(steps, report, samples)
    width = 1000.0
    labels = [("\u00b7 " + r["id"]) if r["check"] else r["id"] for _, rows in bands for r in rows]
    left = min(240.0, max(110.0, 40 + max([len(x) for x in labels] or [8]) * 12 * CHAR))
    axis = Axis(t0, max(1000.0, total * 1000), left, width - 24)

    svg = Svg()
    outcome = str(report.get("outcome", "?"))
    where = (" (%s)" % report["where"]) if report.get("where") else ""
    title = "runbook %s: %s%s, %s" % (report.get("runbook", "?"), outcome, where, secs(total))
    svg.text(
        16,
        26,
        fit(title, width - 32, 17),
        17,
        weight="bold",
        fill=colour("failed")[0] if outcome not in ("ok", "?") else "#212121",
    )
    counts = report.get("checks") or {}
    sub = "spec %s; %d step%s on %d host%s" % (
        report.get("spec", "?"),
        len(steps),
        "" if len(steps) == 1 else "s",
        len(hosts),
        "" if len(hosts) == 1 else "s",
    )
    if report.get("probes") or any(counts.get(k) for k in ("pass", "fail", "skip")):
        sub += "; checks %s passed, %s failed, %s skipped" % (
            counts.get("pass", 0),
            counts.get("fail", 0),
            counts.get("skip", 0),
        )
    if times and timed and t0 > 1e11:
        sub += "; started %s UTC" % time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 / 1000.0))
    if not timed:
        sub += "; no event log: steps laid end to end by duration"
    svg.text(16, 46, fit(sub, width - 32, 12), 12, fill="#455a64")
    statuses = ["ok", "failed"] + sorted(
        {r["status"] for _, rows in bands for r in rows} - {"ok", "failed", "pass", "fail"}
    )
    items = [(colour(s)[0], colour(s)[0], {"ok": "ok / pass"}.get(s, s)) for s in statuses]
    legend(svg, 16, 70, items + [(RATE, RATE, "transfer rate")] * bool(rates))

    # host bands (behind), the grid, then the rows: a label and a bar each
    ypos = top = 88.0
    failed: List[Dict[str, Any]] = []
    body = Svg()
    for index, (host, rows) in enumerate(bands):
        svg.rect(
            8, ypos, width - 16, 30 + 22 * len(rows), "#f5f7f8" if index % 2 == 0 else "#eef2f4"
        )
        body.text(16, ypos + 17, host_label(host), 13, weight="bold", fill="#263238")
        ypos += 24
        for row in rows:
            mid = ypos + 11
            label = ("\u00b7 " + row["id"]) if row["check"] else row["id"]
            body.text(
                left - 10,
                mid + 4,
                fit(label, left - 26, 12),
                12 if not row["check"] else 11,
                anchor="end",
                fill="#37474f" if row["check"] else "#212121",
                weight="bold" if row["status"] in ("failed", "fail") else None,
            )
            if row["start"] is None:
                body.text(
                    left + 4,
                    mid + 4,
                    "%s (no time)" % status_word(row["status"]),
                    11,
                    fill="#607d8b",
                )
            else:
                _bar(body, axis, row, host, mid)
                if row["status"] in ("failed", "interrupted", "fail"):
                    failed.append(dict(row, host=host))
            ypos += 22
        ypos += 6
    axis.grid(svg, top, ypos + 4, "#cfd8dc")
    svg.parts += body.parts
    axis.draw(svg, ypos + 4)
    svg.text(left - 22, ypos + 22, "time", 11, anchor="end", fill="#37474f")
    ypos += 34
    if rates:
        ypos = _rate_panel(svg, axis, rates, ypos + 10)

    # what failed, in words, under the picture
    for row in failed:
        ypos += 6
        line = "%s: %s %s on host %s after %s%s" % (
            status_word(row["status"]),
            "check" if row["check"] else "step",
            row["id"],
            row["host"] or "(this machine)",
            secs((row["end"] - row["start"]) / 1000.0),
            (": " + row["detail"]) if row["detail"] else "",
        )
        for part in wrap(line, width - 32, 12, 4):
            svg.text(
                16, ypos + 10, part, 12, weight="bold", fill=colour(row["status"])[0], title=line
            )
            ypos += 16
    desc = "; ".join(
        "%s on %s: %s %s"
        % (r["id"], h or "this machine", r["status"], secs((r["end"] - r["start"]) / 1000.0))
        for h, rows in bands
        for r in rows
        if not r["check"]
    )
    return svg.render(width, ypos + 12, title, desc)
