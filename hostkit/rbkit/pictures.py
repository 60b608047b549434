"""Pictures of a run: timeline.svg, nodes.svg (fan-out) and report.html beside report.json.

`write_all(report, events_path, out_dir, fanout=None)` draws
- timeline.svg: one row per step, grouped in one band per host, on a time axis in seconds (from the
  step lines of the event log), each host's checks under its band, and the transfer rate over time
  (from `progress` lines when the log has them, else the transfer's average rate);
- nodes.svg, for a fan-out: nodes x steps and checks, a cell per status with its seconds, odd and
  missing nodes named;
- report.html: the pictures, the steps, each host's checks, the fan-out comparison.

Event log lines read here (tab-separated; `report.read_events` reads the first two):
    step STEP STATUS START_MS END_MS HOST DETAIL
    fact STEP KEY VALUE
    progress STEP HOST T_MS BYTES        (optional: BYTES of the stream STEP moved so far, at T_MS,
                                          same clock; the transfer's: what the destination's tar read)

The SVG is written by hand: no plotting library, as the kit runs on hosts where nothing can be
installed. The output depends only on its inputs (no clock, stable order), so the same run gives
the same bytes; every text from the run (hosts, details, reasons) is escaped.

`python -m rbkit.pictures --report R --events E --out DIR [--fanout F]` writes them from files (F:
the fan-out's fanout.json; the node-*.json beside it give the seconds per cell).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple


FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
CHAR = 0.6            # a character's width, in font sizes (a generous average for sans fonts)
COLOURS = {           # status -> (fill, text on it)
    "ok": ("#2e7d32", "#ffffff"), "pass": ("#2e7d32", "#ffffff"),
    "failed": ("#c62828", "#ffffff"), "fail": ("#c62828", "#ffffff"),
    "interrupted": ("#ef6c00", "#ffffff"),
    "skip": ("#90a4ae", "#000000"),
    "-": ("#eceff1", "#607d8b"),
    "missing": ("#ffffff", "#6d4c41"),
}
OTHER = ("#7e57c2", "#ffffff")
RATE = "#1565c0"
Samples = Dict[Tuple[str, str], List[Tuple[int, int]]]    # (step, host) -> [(t_ms, bytes)]
_BAD_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# -- reading ---------------------------------------------------------------------------------------

def read_log(path: str) -> Tuple[List[Dict[str, Any]], Samples]:
    """Steps with their start and end (ms) and the progress samples per (step, host), in file
    order; lines that do not parse are skipped (a log cut short by a crash still draws)."""
    steps: List[Dict[str, Any]] = []
    samples: Samples = {}
    if not path or not os.path.exists(path):
        return steps, samples
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            try:
                if parts[0] == "step" and len(parts) >= 7:
                    steps.append({"id": parts[1], "status": parts[2], "start": int(parts[3]),
                                  "end": max(int(parts[3]), int(parts[4])),
                                  "host": parts[5], "detail": parts[6]})
                elif parts[0] == "progress" and len(parts) >= 5:
                    samples.setdefault((parts[1], parts[2]), []).append(
                        (int(parts[3]), int(parts[4])))
            except ValueError:
                continue
    return steps, samples


def _from_report(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """No event log: the report's steps one after the other, by their durations."""
    steps, t = [], 0
    for s in report.get("steps", []):
        ms = int(round(float(s.get("duration_s") or 0) * 1000))
        steps.append({"id": s.get("id", "?"), "status": s.get("status", "?"), "start": t,
                      "end": t + ms, "host": s.get("host") or "", "detail": s.get("detail", "")})
        t += ms
    return steps


# -- text and numbers ------------------------------------------------------------------------------

def _clean(value: Any) -> str:
    """Any value as text XML can hold (control characters and lone surrogates replaced)."""
    return _BAD_XML.sub("\ufffd", str(value))


def _escape(text: str) -> str:
    """&, < and > as entities (xml.sax.saxutils.escape's bytes: importing it costs a report
    ~30 ms, through urllib and ssl)."""
    return text.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")


def _quoteattr(text: str) -> str:
    """An attribute value with its quotes (xml.sax.saxutils.quoteattr's bytes)."""
    text = _escape(text).replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    if '"' not in text:
        return '"%s"' % text
    if "'" not in text:
        return "'%s'" % text
    return '"%s"' % text.replace('"', "&quot;")


def fold(names: List[str]) -> str:
    """fanout.fold, imported only for a fan-out's pictures (the engine behind it is not needed
    to draw a single host's run)."""
    from .fanout import fold as fold_names
    return fold_names(names)


def _t(value: Any) -> str:
    return _escape(_clean(value))


def _a(value: Any) -> str:
    return _quoteattr(_clean(value))


def _num(v: float) -> str:
    text = "%.1f" % v
    return text[:-2] if text.endswith(".0") else text


def _fit(text: str, width: float, size: float) -> str:
    """TEXT cut to what fits in WIDTH pixels at font SIZE (an estimate), with an ellipsis."""
    text = _clean(text)
    room = int(width / (size * CHAR))
    if len(text) <= room:
        return text
    return text[:max(0, room - 1)] + "\u2026" if room > 0 else ""


def _wrap(text: str, width: float, size: float, most: int) -> List[str]:
    """TEXT in lines that fit WIDTH at font SIZE, cut at spaces where it can, MOST lines at most
    (the last one ends with an ellipsis when text is left)."""
    room = max(8, int(width / (size * CHAR)))
    lines, rest = [], _clean(text)
    while rest and len(lines) < most:
        if len(rest) <= room:
            lines.append(rest)
            rest = ""
            break
        cut = rest.rfind(" ", room // 2, room)
        cut = cut if cut > 0 else room
        lines.append(rest[:cut])
        rest = rest[cut:].lstrip(" ")
    if rest:
        lines[-1] = _fit(lines[-1] + " " + rest, width, size)
    return lines


def _secs(s: Optional[float]) -> str:
    if s is None:
        return ""
    if s < 0.1:
        return "%d ms" % round(s * 1000)
    if s < 10:
        return "%.1f s" % s
    if s < 600:
        return "%d s" % round(s)
    return "%d min %02d s" % (int(s) // 60, int(round(s)) % 60)


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1000.0
    return str(n)


def _nice(span: float, ticks: int = 8) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most about TICKS ticks."""
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _colour(status: str) -> Tuple[str, str]:
    return COLOURS.get(status, OTHER)


def _status_word(status: str) -> str:
    return {"ok": "ok", "pass": "pass", "failed": "FAILED", "fail": "FAIL",
            "interrupted": "INTERRUPTED", "skip": "skip", "-": "not run"}.get(status, status)


# -- SVG -------------------------------------------------------------------------------------------

class Svg:
    """Elements as text, in the order drawn."""

    def __init__(self) -> None:
        self.parts: List[str] = []

    def add(self, tag: str, attrs: Dict[str, Any], text: Optional[str] = None,
            title: Optional[str] = None) -> None:
        a = "".join(" %s=%s" % (k.rstrip("_").replace("_", "-"),
                                _a(_num(v) if isinstance(v, float) else v))
                    for k, v in attrs.items() if v is not None)
        inner = ("<title>%s</title>" % _t(title) if title else "") + (_t(text) if text else "")
        self.parts.append("<%s%s>%s</%s>" % (tag, a, inner, tag) if inner else "<%s%s/>" % (tag, a))

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: Optional[str] = None,
             **kw: Any) -> None:
        self.add("rect", dict(x=float(x), y=float(y), width=float(max(w, 0)),
                              height=float(max(h, 0)), fill=fill, **kw), title=title)

    def text(self, x: float, y: float, text: str, size: float = 12, anchor: str = "start",
             fill: str = "#212121", weight: Optional[str] = None, title: Optional[str] = None,
             **kw: Any) -> None:
        self.add("text", dict(x=float(x), y=float(y), font_size=_num(size),
                              text_anchor=anchor if anchor != "start" else None, fill=fill,
                              font_weight=weight, **kw), text, title)

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#b0bec5",
             **kw: Any) -> None:
        self.add("line", dict(x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2),
                              stroke=stroke, **kw))

    def render(self, width: float, height: float, title: str, desc: str) -> str:
        head = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" '
                'viewBox="0 0 %s %s" font-family=%s role="img">\n<title>%s</title>\n'
                '<desc>%s</desc>\n<rect width="100%%" height="100%%" fill="#ffffff"/>\n'
                % (_num(width), _num(height), _num(width), _num(height), _a(FONT), _t(title),
                   _t(desc)))
        return head + "\n".join(self.parts) + "\n</svg>\n"


def _legend(svg: Svg, x: float, y: float, items: List[Tuple[str, str, str]]) -> float:
    """Swatches with labels from X on the line Y: (fill, stroke, label). Returns the end x."""
    for fill, stroke, label in items:
        svg.rect(x, y - 10, 14, 12, fill, stroke=stroke, stroke_width=1.0)
        svg.text(x + 19, y, label, 12)
        x += 19 + len(label) * 12 * CHAR + 18
    return x


def _host_label(host: str) -> str:
    if not host:
        return "this machine"
    if "->" in host:
        return "hosts " + " \u2192 ".join(host.split("->"))
    return "host " + host


# -- the timeline ----------------------------------------------------------------------------------

def _check_rows(report: Dict[str, Any], host: str, steps: List[Dict[str, Any]]
                ) -> List[Dict[str, Any]]:
    """HOST's checks as rows with a start and end (ms) where they can be placed: one after the
    other from the probe's start, which is its own clock's; when that falls outside the step that
    ran the probe on HOST (clocks differ), from that step's start."""
    doc = (report.get("probes") or {}).get(host)
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        return []
    probe = [s for s in steps if s["host"] == host and "probe" in s["id"]]
    started = doc.get("started")
    t: Optional[float] = None
    if isinstance(started, (int, float)):
        t = float(started) * 1000
    if probe and (t is None or not probe[-1]["start"] <= t <= probe[-1]["end"]):
        t = float(probe[-1]["start"])
    # where the probe says when each check ran (its `schedule`: checks overlap), each row is
    # placed there; else one after the other
    schedule = {}
    for item in doc.get("schedule") or []:
        if isinstance(item, dict) and all(isinstance(item.get(k), (int, float))
                                          for k in ("start_s", "end_s")):
            schedule[str(item.get("id"))] = (float(item["start_s"]), float(item["end_s"]))
    t0 = t
    rows = []
    for c in doc["checks"]:
        if not isinstance(c, dict):
            continue
        d = c.get("duration_s")
        d = float(d) if isinstance(d, (int, float)) else None
        row = {"id": str(c.get("id", "?")), "status": str(c.get("status", "?")), "check": True,
               "detail": str(c.get("reason") or ""), "level": c.get("level"), "seconds": d,
               "start": None, "end": None}
        at = schedule.get(row["id"])
        if t0 is not None and at is not None:
            row["start"], row["end"] = t0 + at[0] * 1000, t0 + at[1] * 1000
        elif t is not None and d is not None:
            row["start"], row["end"] = t, t + d * 1000
            t += d * 1000
        rows.append(row)
    return rows


def _rates(steps: List[Dict[str, Any]], report: Dict[str, Any],
           samples: Samples) -> List[Dict[str, Any]]:
    """Rate series per transfer: from progress samples (MB/s between successive samples) when
    there are at least two, else the step's average (fact mb_s) over the step."""
    facts = {}
    for s in report.get("steps", []):
        if isinstance(s, dict) and s.get("facts"):
            facts.setdefault(s.get("id"), s["facts"])
    out = []
    for s in steps:
        got = sorted(set(samples.get((s["id"], s["host"]), [])))
        f = facts.get(s["id"], {})
        if len(got) >= 2:
            pts = []
            for (t1, b1), (t2, b2) in zip(got, got[1:]):
                if t2 > t1:
                    pts.append((t1, t2, max(0.0, (b2 - b1) / (t2 - t1) / 1000.0)))
            if pts:
                total = (got[-1][1] - got[0][1]) / max(1, got[-1][0] - got[0][0]) / 1000.0
                out.append({"step": s, "points": pts, "average": total, "sampled": True,
                            "bytes": f.get("bytes", got[-1][1])})
                continue
        if isinstance(f.get("mb_s"), (int, float)) and s["end"] > s["start"]:
            out.append({"step": s, "points": [(s["start"], s["end"], float(f["mb_s"]))],
                        "average": float(f["mb_s"]), "sampled": False, "bytes": f.get("bytes")})
    return out


class Axis:
    """Time (ms) to x, and the ticks of the time axis: 1, 2 or 5 times a power of ten seconds."""

    def __init__(self, t0: float, span: float, x0: float, x1: float) -> None:
        self.t0, self.x0, self.x1 = t0, x0, x1
        self.scale = (x1 - x0) / span
        step = _nice(span / 1000.0) * 1000
        self.ticks = [n * step for n in range(int(span / step + 1e-9) + 1)]

    def x(self, t: float) -> float:
        return self.x0 + (t - self.t0) * self.scale

    def draw(self, svg: Svg, y: float) -> None:
        svg.line(self.x0, y, self.x1, y, stroke="#546e7a", stroke_width=1.0)
        for t in self.ticks:
            gx = self.x0 + t * self.scale
            svg.line(gx, y, gx, y + 5, stroke="#546e7a", stroke_width=1.0)
            svg.text(gx, y + 18, "%s s" % _num(t / 1000.0), 11, anchor="middle", fill="#37474f")

    def grid(self, svg: Svg, top: float, bottom: float, colour: str) -> None:
        for t in self.ticks:
            gx = self.x0 + t * self.scale
            svg.line(gx, top, gx, bottom, stroke=colour, stroke_width=1.0)


def _bar(svg: Svg, axis: Axis, r: Dict[str, Any], host: str, mid: float) -> None:
    """One step's or check's bar at height MID, its time (and, when it did not pass, its status
    and detail) beside it, on the side with more room."""
    fill = _colour(r["status"])[0]
    bx, bw = axis.x(r["start"]), max(3.0, (r["end"] - r["start"]) * axis.scale)
    h = 14.0 if not r["check"] else 10.0
    secs = (r["end"] - r["start"]) / 1000.0
    tip = "%s %s on %s: %s, %s%s" % ("check" if r["check"] else "step", r["id"],
                                     host or "this machine", _status_word(r["status"]),
                                     _secs(secs), (": " + r["detail"]) if r["detail"] else "")
    svg.rect(bx, mid - h / 2, bw, h, fill, title=tip, rx=2.0)
    note = _secs(secs)
    if r["status"] not in ("ok", "pass"):
        note = "%s %s%s" % (_status_word(r["status"]), note,
                            (": " + r["detail"]) if r["detail"] else "")
    weight = "bold" if r["status"] in ("failed", "fail", "interrupted") else None
    colour = {"ok": "#37474f", "pass": "#37474f", "skip": "#546e7a"}.get(r["status"], fill)
    after, before = axis.x1 - (bx + bw) - 6, bx - axis.x0 - 6
    if after >= before or after >= 200:
        svg.text(bx + bw + 6, mid + 4, _fit(note, after, 11), 11, fill=colour, weight=weight,
                 title=tip)
    else:
        svg.text(bx - 6, mid + 4, _fit(note, before, 11), 11, anchor="end", fill=colour,
                 weight=weight, title=tip)


def _rate_panel(svg: Svg, axis: Axis, rates: List[Dict[str, Any]], y: float) -> float:
    """The transfer rate (MB/s) on the timeline's time axis, from Y; returns the y below it.
    Sampled rates are a solid step curve, an average alone a dashed line over its step."""
    panel_h = 90.0
    top = max(p[2] for r in rates for p in r["points"]) or 1.0
    ystep = _nice(top, 3)
    ymax = ystep * math.ceil(top * 1.25 / ystep)
    svg.text(16, y + 4, "transfer rate", 13, weight="bold", fill="#263238")
    y += 14

    def Y(v: float) -> float:
        return y + panel_h - v / ymax * panel_h

    for k in range(int(ymax / ystep + 1e-9) + 1):
        svg.line(axis.x0, Y(k * ystep), axis.x1, Y(k * ystep), stroke="#eceff1",
                 stroke_width=1.0)
        svg.text(axis.x0 - 8, Y(k * ystep) + 4, "%s MB/s" % _num(k * ystep), 11, anchor="end",
                 fill="#37474f")
    axis.grid(svg, y, y + panel_h, "#eceff1")

    def xy(t: float, v: float) -> str:
        return "%s,%s" % (_num(axis.x(t)), _num(Y(v)))

    for r in rates:
        s, points = r["step"], r["points"]
        line = [xy(t, v) for a, b, v in points for t in (a, b)]
        first, last = points[0][0], points[-1][1]
        svg.add("polygon", {"points": " ".join([xy(first, 0)] + line + [xy(last, 0)]),
                            "fill": RATE, "fill-opacity": "0.15"})
        svg.add("polyline", {"points": " ".join(line), "fill": "none", "stroke": RATE,
                             "stroke-width": "2",
                             "stroke-dasharray": None if r["sampled"] else "6 3"},
                title="%s on %s: %s" % (s["id"], s["host"] or "this machine",
                                        "sampled" if r["sampled"] else "average only"))
        what = "%s%s: %s MB/s average%s" % (
            s["id"], (" " + _bytes(r["bytes"])) if r["bytes"] is not None else "",
            _num(r["average"]), "" if r["sampled"] else " (no progress samples: average only)")
        lx, ly = axis.x(first), Y(max(p[2] for p in points)) - 6
        if lx + len(what) * 11 * CHAR > axis.x1:
            svg.text(min(axis.x1, axis.x(last)), ly, what, 11, anchor="end", fill=RATE)
        else:
            svg.text(lx, ly, what, 11, fill=RATE)
    axis.draw(svg, y + panel_h)
    return y + panel_h + 30


def timeline(report: Dict[str, Any], steps: List[Dict[str, Any]],
             samples: Samples, timed: bool = True) -> str:
    """The timeline picture (see the module's docstring). TIMED: the steps have real start
    times (else they were laid one after the other from their durations)."""
    hosts: List[str] = []
    for s in steps:
        if s["host"] not in hosts:
            hosts.append(s["host"])
    bands = [(h, [dict(s, check=False) for s in steps if s["host"] == h] +
              _check_rows(report, h, steps)) for h in hosts]
    times = [r[k] for _, rows in bands for r in rows for k in ("start", "end")
             if r[k] is not None]
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
    title = "runbook %s: %s%s, %s" % (report.get("runbook", "?"), outcome, where, _secs(total))
    svg.text(16, 26, _fit(title, width - 32, 17), 17, weight="bold",
             fill=_colour("failed")[0] if outcome not in ("ok", "?") else "#212121")
    c = report.get("checks") or {}
    sub = "spec %s; %d step%s on %d host%s" % (
        report.get("spec", "?"), len(steps), "" if len(steps) == 1 else "s", len(hosts),
        "" if len(hosts) == 1 else "s")
    if report.get("probes") or any(c.get(k) for k in ("pass", "fail", "skip")):
        sub += "; checks %s passed, %s failed, %s skipped" % (
            c.get("pass", 0), c.get("fail", 0), c.get("skip", 0))
    if times and timed and t0 > 1e11:
        sub += "; started %s UTC" % time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 / 1000.0))
    if not timed:
        sub += "; no event log: steps laid end to end by duration"
    svg.text(16, 46, _fit(sub, width - 32, 12), 12, fill="#455a64")
    statuses = ["ok", "failed"] + sorted({r["status"] for _, rows in bands for r in rows} -
                                         {"ok", "failed", "pass", "fail"})
    items = [(_colour(s)[0], _colour(s)[0], {"ok": "ok / pass"}.get(s, s)) for s in statuses]
    _legend(svg, 16, 70, items + [(RATE, RATE, "transfer rate")] * bool(rates))

    # host bands (behind), the grid, then the rows: a label and a bar each
    y = top = 88.0
    failed: List[Dict[str, Any]] = []
    body = Svg()
    for i, (host, rows) in enumerate(bands):
        svg.rect(8, y, width - 16, 30 + 22 * len(rows), "#f5f7f8" if i % 2 == 0 else "#eef2f4")
        body.text(16, y + 17, _host_label(host), 13, weight="bold", fill="#263238")
        y += 24
        for r in rows:
            mid = y + 11
            label = ("\u00b7 " + r["id"]) if r["check"] else r["id"]
            body.text(left - 10, mid + 4, _fit(label, left - 26, 12), 12 if not r["check"] else 11,
                      anchor="end", fill="#37474f" if r["check"] else "#212121",
                      weight="bold" if r["status"] in ("failed", "fail") else None)
            if r["start"] is None:
                body.text(left + 4, mid + 4, "%s (no time)" % _status_word(r["status"]), 11,
                          fill="#607d8b")
            else:
                _bar(body, axis, r, host, mid)
                if r["status"] in ("failed", "interrupted", "fail"):
                    failed.append(dict(r, host=host))
            y += 22
        y += 6
    axis.grid(svg, top, y + 4, "#cfd8dc")
    svg.parts += body.parts
    axis.draw(svg, y + 4)
    svg.text(left - 22, y + 22, "time", 11, anchor="end", fill="#37474f")
    y += 34
    if rates:
        y = _rate_panel(svg, axis, rates, y + 10)

    # what failed, in words, under the picture
    for r in failed:
        y += 6
        line = "%s: %s %s on host %s after %s%s" % (
            _status_word(r["status"]), "check" if r["check"] else "step", r["id"],
            r["host"] or "(this machine)",
            _secs((r["end"] - r["start"]) / 1000.0), (": " + r["detail"]) if r["detail"] else "")
        for part in _wrap(line, width - 32, 12, 4):
            svg.text(16, y + 10, part, 12, weight="bold", fill=_colour(r["status"])[0],
                     title=line)
            y += 16
    desc = "; ".join("%s on %s: %s %s" % (r["id"], h or "this machine", r["status"],
                                          _secs((r["end"] - r["start"]) / 1000.0))
                     for h, rows in bands for r in rows if not r["check"])
    return svg.render(width, y + 12, title, desc)


# -- the nodes x steps heatmap ---------------------------------------------------------------------

def _node_seconds(doc: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """Column -> seconds, from one node's report (its steps, its checks)."""
    out: Dict[str, float] = {}
    if not isinstance(doc, dict):
        return out
    for s in doc.get("steps") or []:
        if isinstance(s, dict) and isinstance(s.get("seconds"), (int, float)):
            out[str(s.get("id"))] = float(s["seconds"])
    for c in (doc.get("probe") or {}).get("checks") or []:
        if isinstance(c, dict) and isinstance(c.get("duration_s"), (int, float)):
            out["check:" + str(c.get("id"))] = float(c["duration_s"])
    return out


def nodes_picture(fanout: Dict[str, Any], name: str = "") -> str:
    """Nodes x columns of the comparison: a cell per status with its seconds (when the node
    reports are in `fanout["reports"]`), odd and missing nodes named beside their row."""
    nodes = [str(n) for n in fanout.get("nodes") or []]
    cols = [str(c) for c in fanout.get("columns") or []]
    rows = fanout.get("rows") or {}
    odd = fanout.get("odd") or {}
    missing = fanout.get("missing") or {}
    reports = fanout.get("reports") or {}
    secs = {n: _node_seconds(reports.get(n)) for n in nodes}

    label_w = min(200.0, max(90.0, 30 + max([len(n) for n in nodes] or [6]) * 12 * CHAR))
    heads = [c[6:] if c.startswith("check:") else c for c in cols]
    need = max([len(h) for h in heads] or [4]) * 11 * CHAR + 10
    cell_w, cell_h, slant = max(58.0, min(96.0, need)), 20.0, need > 96
    head_h = 36 + (need * 0.6 if slant else 0)
    note_w = 420.0
    x0 = 16 + label_w
    width = max(760.0, x0 + cell_w * len(cols) + 16 + note_w)
    svg = Svg()
    ok = len(fanout.get("ok_nodes") or [])
    title = "fan-out%s: %d/%d nodes passed; %d odd, %d missing; success policy %s: %s" % (
        (" " + name) if name else "", ok, len(nodes), len(odd), len(missing),
        fanout.get("success", "?"), "met" if fanout.get("passed") else "NOT met")
    svg.text(16, 26, _fit(title, width - 32, 16), 16, weight="bold",
             fill="#212121" if fanout.get("passed") else _colour("failed")[0])
    groups = fanout.get("groups") or []
    sub = "%d group%s of identical rows: %s" % (
        len(groups), "" if len(groups) == 1 else "s",
        "; ".join("%s (%d)" % (fold([str(n) for n in g]), len(g)) for g in groups) or "none")
    svg.text(16, 46, _fit(sub, width - 32, 12), 12, fill="#455a64")
    _legend(svg, 16, 70, [(_colour("pass")[0], _colour("pass")[0], "pass"),
                          (_colour("fail")[0], _colour("fail")[0], "fail"),
                          (_colour("skip")[0], _colour("skip")[0], "skip"),
                          (_colour("-")[0], "#b0bec5", "not run"),
                          ("url(#nohatch)", "#8d6e63", "no report"),
                          ("#ffffff", "#ef6c00", "odd node (differs from the majority)")])
    svg.parts.insert(0, '<defs><pattern id="nohatch" width="6" height="6" '
                        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
                        '<rect width="6" height="6" fill="#fbe9e7"/>'
                        '<line x1="0" y1="0" x2="0" y2="6" stroke="#bcaaa4" stroke-width="2"/>'
                        '</pattern></defs>')
    y = 84 + head_h
    # column heads, slanted; steps and checks apart
    for j, h in enumerate(heads):
        cx = x0 + j * cell_w + cell_w / 2
        if slant:
            svg.add("text", {"x": _num(cx), "y": _num(y - 6), "font-size": "11", "fill": "#212121",
                             "transform": "rotate(-35 %s %s)" % (_num(cx), _num(y - 6))},
                    h, cols[j])
        else:
            svg.text(cx, y - 6, h, 11, anchor="middle", title=cols[j])
    first_check = next((j for j, c in enumerate(cols) if c.startswith("check:")), None)
    for lo, hi, what in ((0, first_check if first_check is not None else len(cols), "steps"),
                         (first_check, len(cols), "checks")):
        if lo is None or hi <= lo:
            continue
        svg.text(x0 + (lo + hi) * cell_w / 2, 84 + 14, what, 12, anchor="middle",
                 weight="bold", fill="#455a64")
        svg.line(x0 + lo * cell_w + 4, 84 + 19, x0 + hi * cell_w - 4, 84 + 19,
                 stroke="#90a4ae", stroke_width=1.0)
    for i, n in enumerate(nodes):
        ry = y + i * cell_h
        if i % 2 == 0:
            svg.rect(8, ry, width - 16, cell_h, "#f5f7f8")
        is_odd, is_missing = n in odd, n in missing
        svg.text(x0 - 10, ry + 14, _fit(n, label_w - 10, 12), 12, anchor="end",
                 weight="bold" if is_odd or is_missing else None,
                 fill="#ef6c00" if is_odd else "#6d4c41" if is_missing else "#212121")
        if is_missing:
            why = " | ".join(str(w) for w in missing[n]) or "no report"
            svg.rect(x0, ry + 1, cell_w * len(cols), cell_h - 2, "url(#nohatch)",
                     title="%s: no report: %s" % (n, why), stroke="#8d6e63", stroke_width=1.0)
            svg.text(x0 + 8, ry + 14, "no report", 11, fill="#4e342e", weight="bold")
            note = "no report: " + why
            svg.text(x0 + cell_w * len(cols) + 12, ry + 14,
                     _fit(note, width - (x0 + cell_w * len(cols) + 20), 11), 11, fill="#6d4c41",
                     title=note)
            continue
        row = rows.get(n) or {}
        for j, c in enumerate(cols):
            st = str(row.get(c, "-"))
            fill, ink = _colour(st)
            s = secs[n].get(c)
            word = _secs(s).replace(" ", "") if s is not None and st != "-" else (
                "" if st == "-" else _status_word(st))
            if st == "fail":
                word = "\u2717 " + word if s is not None else "\u2717 fail"
            tip = "%s %s: %s%s" % (n, heads[j], _status_word(st),
                                   (", " + _secs(s)) if s is not None else "")
            svg.rect(x0 + j * cell_w + 1, ry + 1, cell_w - 2, cell_h - 2, fill, title=tip,
                     stroke="#b0bec5" if st == "-" else None)
            if word:
                svg.text(x0 + j * cell_w + cell_w / 2, ry + 14, word, 10.5, anchor="middle",
                         fill=ink, weight="bold" if st == "fail" else None)
        if is_odd:
            svg.rect(x0 - 0.5, ry + 0.5, cell_w * len(cols) + 1, cell_h - 1, "none",
                     stroke="#ef6c00", stroke_width=2.0)
            diffs = [str(d) for d in odd[n]] or ["differs"]
            note = "odd: " + "; ".join(diffs)
            svg.text(x0 + cell_w * len(cols) + 12, ry + 14,
                     _fit(note, width - (x0 + cell_w * len(cols) + 20), 11), 11, fill="#e65100",
                     title=note)
    y += cell_h * len(nodes)
    if first_check:
        sx = x0 + first_check * cell_w
        svg.line(sx, 84 + 22, sx, y, stroke="#546e7a", stroke_width=1.0,
                 stroke_dasharray="3 3")
    y += 18
    if reports:
        svg.text(16, y, "Cells give each node's seconds per step and check.", 11,
                 fill="#607d8b")
        y += 14
    for n in nodes:
        if n in odd:
            line = "odd node %s: %s" % (n, "; ".join(str(d) for d in odd[n]) or "differs")
            svg.text(16, y + 4, _fit(line, width - 32, 11), 11, fill="#e65100", title=line)
            y += 16
    for n in nodes:
        if n in missing:
            line = "no report from %s: %s" % (n, " | ".join(str(w) for w in missing[n]))
            svg.text(16, y + 4, _fit(line, width - 32, 11), 11, fill="#6d4c41", title=line)
            y += 16
    desc = "; ".join("%s: %s" % (n, "no report" if n in missing else ", ".join(
        "%s %s" % (h, (rows.get(n) or {}).get(c, "-")) for h, c in zip(heads, cols)))
        for n in nodes)
    return svg.render(width, y + 12, title, desc)


# -- the page --------------------------------------------------------------------------------------

CSS = """body{font-family:%s;margin:24px;color:#212121;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}img{max-width:100%%;border:1px solid #cfd8dc}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}td.num{text-align:right}.ok,.pass{color:#2e7d32;font-weight:bold}
.failed,.fail{color:#c62828;font-weight:bold}.skip{color:#607d8b}.interrupted{color:#ef6c00}
code{font-size:12px}""" % FONT


def _h(value: Any) -> str:
    return html.escape(_clean(value), quote=True)


def page(report: Dict[str, Any], pictures: List[str], fanout: Optional[Dict[str, Any]]) -> str:
    name = str(report.get("runbook", "?"))
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>runbook %s: %s</title>" % (_h(name), _h(report.get("outcome", "?"))),
           "<style>%s</style></head><body>" % CSS,
           "<h1>runbook %s: <span class=%s>%s</span></h1>" % (
               _h(name), _a(report.get("outcome", "?")),
               _h(report.get("outcome", "?"))),
           "<p>spec <code>%s</code> (sha256 <code>%s</code>); <a href=\"report.json\">report.json"
           "</a></p>" % (_h(report.get("spec", "?")), _h(str(report.get("spec_sha256", ""))[:12]))]
    if report.get("where"):
        # where a run that did not pass stopped, under the heading
        out.insert(5, "<p class=%s>%s %s</p>" % (_a(report.get("outcome")),
                                                _h(report.get("outcome")), _h(report["where"])))
    for p in pictures:
        out.append('<p><a href="%s"><img src="%s" alt="%s"></a></p>' % (
            _h(p), _h(p), _h(p.rsplit(".", 1)[0])))
    out.append("<h2>Steps</h2><table><tr><th>step</th><th>host</th><th>status</th>"
               "<th>seconds</th><th>detail</th></tr>")
    for s in report.get("steps") or []:
        f = s.get("facts") or {}
        said = []
        if "bytes" in f:
            said.append(_bytes(f["bytes"]) + (" in %s files" % f["files"] if "files" in f else ""))
        if "mb_s" in f:
            said.append("%s MB/s" % f["mb_s"])
        detail = "; ".join([", ".join(said)] * bool(said) + [str(s.get("detail") or "")] *
                           bool(s.get("detail")))
        d = s.get("duration_s")
        out.append("<tr><td>%s</td><td>%s</td><td class=%s>%s</td><td class=num>%s</td>"
                   "<td>%s</td></tr>" % (
                       _h(s.get("id")), _h(s.get("host") or "-"), _a(s.get("status", "")),
                       _h(s.get("status")), "%.1f" % d if isinstance(d, (int, float)) else "-",
                       _h(detail)))
    out.append("</table>")
    if fanout:
        out.append(_fanout_html(fanout))
    c = report.get("checks") or {}
    out.append("<h2>Checks</h2><p>%s passed, %s failed, %s skipped</p>" % (
        _h(c.get("pass", 0)), _h(c.get("fail", 0)), _h(c.get("skip", 0))))
    probes = report.get("probes") or {}
    if fanout:
        # one table per group of identical rows (a node of each): a table per node does not
        # scale to a cluster, and the nodes of a group passed and failed the same checks
        reports = fanout.get("reports") or {}
        for g in fanout.get("groups") or []:
            g = [str(n) for n in g]
            doc = probes.get(g[0]) or (reports.get(g[0]) or {}).get("probe")
            out.append("<h3>node %s</h3>" % _h(g[0]) if len(g) == 1 else
                       "<h3>nodes %s (%d; seconds of %s)</h3>" % (_h(fold(g)), len(g), _h(g[0])))
            out.append(_checks_table(doc))
    else:
        for host in sorted(probes):
            out.append("<h3>host %s</h3>" % _h(host))
            out.append(_checks_table(probes[host]))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _checks_table(doc: Any) -> str:
    """One host's checks: id, level, status, seconds, reason."""
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        why = doc.get("error") if isinstance(doc, dict) and doc.get("error") else "no checks ran"
        return "<p>%s</p>" % _h(why)
    out = ["<table><tr><th>check</th><th>level</th><th>status</th><th>seconds</th>"
           "<th>reason</th></tr>"]
    for chk in doc["checks"]:
        if not isinstance(chk, dict):
            continue
        d = chk.get("duration_s")
        out.append("<tr><td>%s</td><td>%s</td><td class=%s>%s</td><td class=num>%s</td>"
                   "<td>%s</td></tr>" % (
                       _h(chk.get("id")), _h(chk.get("level", "")), _a(chk.get("status", "")),
                       _h(chk.get("status")), "%.2f" % d if isinstance(d, (int, float)) else "-",
                       _h(chk.get("reason") or "")))
    out.append("</table>")
    return "\n".join(out)


def _fanout_html(fanout: Dict[str, Any]) -> str:
    cols = [str(c) for c in fanout.get("columns") or []]
    rows = fanout.get("rows") or {}
    out = ["<h2>Fan-out comparison</h2><p>%d/%d nodes passed; success policy %s needs %s: %s</p>"
           % (len(fanout.get("ok_nodes") or []), len(fanout.get("nodes") or []),
              _h(fanout.get("success", "?")), _h(fanout.get("needed", "?")),
              "met" if fanout.get("passed") else "<b class=failed>NOT met</b>")]
    out.append("<table><tr><th>nodes</th><th>count</th>%s</tr>" % "".join(
        "<th>%s</th>" % _h(c[6:] if c.startswith("check:") else c) for c in cols))
    for g in fanout.get("groups") or []:
        r = rows.get(g[0]) or {}
        out.append("<tr><td>%s</td><td class=num>%d</td>%s</tr>" % (
            _h(fold([str(n) for n in g])), len(g), "".join(
                "<td class=%s>%s</td>" % (_a(r.get(c, "-")), _h(r.get(c, "-"))) for c in cols)))
    out.append("</table>")
    odd = fanout.get("odd") or {}
    if odd:
        out.append("<h3>Odd nodes</h3><ul>")
        for n in fanout.get("nodes") or []:
            if n in odd:
                out.append("<li><b>%s</b>: %s</li>" % (_h(n), _h("; ".join(
                    str(d) for d in odd[n]) or "differs")))
        out.append("</ul>")
    missing = fanout.get("missing") or {}
    if missing:
        out.append("<h3>Missing nodes</h3><ul>")
        for n in fanout.get("nodes") or []:
            if n in missing:
                out.append("<li><b>%s</b>: %s</li>" % (_h(n), _h(" | ".join(
                    str(w) for w in missing[n]))))
        out.append("</ul>")
    return "\n".join(out)


# -- writing ---------------------------------------------------------------------------------------

def _write(out_dir: str, name: str, text: str) -> str:
    path = os.path.join(out_dir, name)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_all(report: dict, events_path: str, out_dir: str,
              fanout: Optional[dict] = None) -> list[str]:
    """Write timeline.svg, nodes.svg (when FANOUT is given) and report.html into OUT_DIR; return
    their paths. FANOUT is `fanout.compare()`'s result, with the node reports under "reports"
    (node -> report) when the cells should carry seconds."""
    steps, samples = read_log(events_path)
    timed = bool(steps)
    if not steps:
        steps = _from_report(report)
    written = [_write(out_dir, "timeline.svg", timeline(report, steps, samples, timed))]
    names = ["timeline.svg"]
    if fanout:
        written.append(_write(out_dir, "nodes.svg",
                              nodes_picture(fanout, str(report.get("runbook", "")))))
        names.append("nodes.svg")
    written.append(_write(out_dir, "report.html", page(report, names, fanout)))
    return written


def draw(report: dict, events: str, out: str, fanout: str = "") -> List[str]:
    """Every picture of a run into `out`, from its report (a dict), events.tsv and fanout.json
    (node-*.json beside it are read too); returns the paths written."""
    fan = None
    if fanout:
        with open(fanout, encoding="utf-8") as f:
            fan = json.load(f)
        where = os.path.dirname(os.path.abspath(fanout))
        reports = {}
        for n in fan.get("nodes") or []:
            path = os.path.join(where, "node-%s.json" % n)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        reports[n] = json.load(f)
                except (OSError, ValueError):
                    pass
        fan = dict(fan, reports=reports)
    os.makedirs(out, exist_ok=True)
    return write_all(report, events, out, fan)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rbkit.pictures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", required=True, help="the run's report.json")
    p.add_argument("--events", default="", help="the run's events.tsv")
    p.add_argument("--out", required=True, help="directory to write the pictures into")
    p.add_argument("--fanout", default="", help="fanout.json; node-*.json beside it are read too")
    a = p.parse_args(argv)
    with open(a.report, encoding="utf-8") as f:
        report = json.load(f)
    for path in draw(report, a.events, a.out, a.fanout):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
