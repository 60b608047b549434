"""The pictures' drawing: colours, the one escaper, numbers and text fitted to a width, and `Svg`,
elements written by hand (no plotting library: the controller has nothing more than the stdlib
either). Every text from the run goes through `esc`."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
CHAR = 0.6  # a character's width, in font sizes (a generous average for sans fonts)
COLOURS = {  # status -> (fill, text on it)
    "ok": ("#2e7d32", "#ffffff"),
    "pass": ("#2e7d32", "#ffffff"),
    "failed": ("#c62828", "#ffffff"),
    "fail": ("#c62828", "#ffffff"),
    "interrupted": ("#ef6c00", "#ffffff"),
    "skip": ("#90a4ae", "#000000"),
    "-": ("#eceff1", "#607d8b"),
    "missing": ("#ffffff", "#6d4c41"),
}
OTHER = ("#7e57c2", "#ffffff")
RATE = "#1565c0"
_BAD_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# every attribute is written in double quotes, so ' needs no reference
_REFS = (
    ("&", "&amp;"),
    ("<", "&lt;"),
    (">", "&gt;"),
    ('"', "&quot;"),
    ("\n", "&#10;"),
    ("\r", "&#13;"),
    ("\t", "&#9;"),
)


def clean(value: Any) -> str:
    """Any value as text XML can hold (control characters and lone surrogates replaced)."""
    return _BAD_XML.sub("\ufffd", str(value))


def esc(value: Any) -> str:
    """The one escaper: any value as text for SVG or HTML, inside an element or a double-quoted
    attribute (clean's characters, then & < > " and the whitespace an attribute would fold, as
    references). xml.sax.saxutils is not used: importing it loads urllib and ssl."""
    text = clean(value)
    for old, new in _REFS:
        text = text.replace(old, new)
    return text


def num(value: float) -> str:
    text = "%.1f" % value
    return text[:-2] if text.endswith(".0") else text


def fit(text: str, width: float, size: float) -> str:
    """TEXT cut to what fits in WIDTH pixels at font SIZE (an estimate), with an ellipsis."""
    text = clean(text)
    room = int(width / (size * CHAR))
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + "\u2026" if room > 0 else ""


def wrap(text: str, width: float, size: float, most: int) -> List[str]:
    """TEXT in lines that fit WIDTH at font SIZE, cut at spaces where it can, MOST lines at most
    (the last one ends with an ellipsis when text is left)."""
    room = max(8, int(width / (size * CHAR)))
    lines, rest = [], clean(text)
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
        lines[-1] = fit(lines[-1] + " " + rest, width, size)
    return lines


def secs(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    if seconds < 0.1:
        return "%d ms" % round(seconds * 1000)
    if seconds < 10:
        return "%.1f s" % seconds
    if seconds < 600:
        return "%d s" % round(seconds)
    return "%d min %02d s" % (int(seconds) // 60, int(round(seconds)) % 60)


def nice(span: float, ticks: int = 8) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most about TICKS ticks."""
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if raw <= multiple * mag:
            return multiple * mag
    return 10 * mag


def colour(status: str) -> Tuple[str, str]:
    return COLOURS.get(status, OTHER)


def status_word(status: str) -> str:
    return {
        "ok": "ok",
        "pass": "pass",
        "failed": "FAILED",
        "fail": "FAIL",
        "interrupted": "INTERRUPTED",
        "skip": "skip",
        "-": "not run",
    }.get(status, status)


class Svg:
    """Elements as text, in the order drawn."""

    def __init__(self) -> None:
        self.parts: List[str] = []

    def add(
        self,
        tag: str,
        attrs: Dict[str, Any],
        text: Optional[str] = None,
        title: Optional[str] = None,
    ) -> None:
        attributes = "".join(
            ' %s="%s"'
            % (k.rstrip("_").replace("_", "-"), esc(num(v) if isinstance(v, float) else v))
            for k, v in attrs.items()
            if v is not None
        )
        inner = ("<title>%s</title>" % esc(title) if title else "") + (esc(text) if text else "")
        self.parts.append(
            "<%s%s>%s</%s>" % (tag, attributes, inner, tag)
            if inner
            else "<%s%s/>" % (tag, attributes)
        )

    def rect(
        self,
        left: float,
        top: float,
        width: float,
        height: float,
        fill: str,
        title: Optional[str] = None,
        **kw: Any,
    ) -> None:
        self.add(
            "rect",
            dict(
                x=float(left),
                y=float(top),
                width=float(max(width, 0)),
                height=float(max(height, 0)),
                fill=fill,
                **kw,
            ),
            title=title,
        )

    def text(
        self,
        xpos: float,
        ypos: float,
        text: str,
        size: float = 12,
        anchor: str = "start",
        fill: str = "#212121",
        weight: Optional[str] = None,
        title: Optional[str] = None,
        **kw: Any,
    ) -> None:
        self.add(
            "text",
            dict(
                x=float(xpos),
                y=float(ypos),
                font_size=num(size),
                text_anchor=anchor if anchor != "start" else None,
                fill=fill,
                font_weight=weight,
                **kw,
            ),
            text,
            title,
        )

    def line(
        self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#b0bec5", **kw: Any
    ) -> None:
        self.add(
            "line",
            dict(x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2), stroke=stroke, **kw),
        )

    def render(self, width: float, height: float, title: str, desc: str) -> str:
        head = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" '
            'viewBox="0 0 %s %s" font-family="%s" role="img">\n<title>%s</title>\n'
            '<desc>%s</desc>\n<rect width="100%%" height="100%%" fill="#ffffff"/>\n'
            % (num(width), num(height), num(width), num(height), esc(FONT), esc(title), esc(desc))
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def legend(svg: Svg, xpos: float, ypos: float, items: List[Tuple[str, str, str]]) -> float:
    """Swatches with labels from XPOS on the line YPOS: (fill, stroke, label). Returns the end x."""
    for fill, stroke, label in items:
        svg.rect(xpos, ypos - 10, 14, 12, fill, stroke=stroke, stroke_width=1.0)
        svg.text(xpos + 19, ypos, label, 12)
        xpos += 19 + len(label) * 12 * CHAR + 18
    return xpos


def host_label(host: str) -> str:
    if not host:
        return "this machine"
    if "->" in host:
        return "hosts " + " \u2192 ".join(host.split("->"))
    return "host " + host
