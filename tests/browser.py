"""A run's report.html as a person sees it: opened in real headless Chromium (Debian's `chromium`,
installed by `make system-packages`), screenshotted, and its rendered DOM read back.

`look(run_dir)` opens RUN_DIR/report.html twice, each under a time limit:
- `chromium --headless --screenshot`: the page as drawn, decoded here (zlib and struct, no image
  library) to say how many colours it shows and whether the outcome's colour is among them;
- `chromium --headless --dump-dom` of a copy beside it (so its pictures load the same) with one
  script added at its end: the script writes, into the DOM that is dumped, each table row's cells
  and whether the row is seen (laid out with a size, not `display: none`, `visibility: hidden` or
  transparent, inside the page), the heading's, and whether each picture loaded. The report itself
  carries no script.

`assert_seen(run_dir)` then holds the page to its report.json: the outcome in the heading, where the
run stopped (when the report says), every step's row, every failed check's row (host, id, reason),
every picture loaded, the screenshot not one colour and showing the outcome's colour.

Without chromium the tests that need it skip, except in CI (`CI=true`), where they fail.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SECONDS = 60  # each chromium start, at most (about 3 s here)
WINDOW = (1000, 1000)
# the page's colours for an outcome (pictures' COLOURS): drawn in the heading and the timeline
OUTCOME_RGB = {
    "ok": (0x2E, 0x7D, 0x32),
    "failed": (0xC6, 0x28, 0x28),
    "interrupted": (0xEF, 0x6C, 0x00),
}
PROBE_ID = "rb-browser-probe"
# run in the page once it has loaded; its answer goes into the dumped DOM as JSON
PROBE = (
    """<script>
window.addEventListener("load", function () {
  function seen(el) {
    var r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0 || r.right <= 0 || r.bottom <= 0) return false;
    for (var e = el; e && e.nodeType === 1; e = e.parentElement) {
      var s = getComputedStyle(e);
      if (s.display === "none" || s.visibility !== "visible" || parseFloat(s.opacity) === 0)
        return false;
    }
    return true;
  }
  var out = {h1: [], p: [], rows: [], images: []};
  document.querySelectorAll("h1").forEach(function (h) {
    out.h1.push({text: h.innerText, seen: seen(h)});
  });
  document.querySelectorAll("p").forEach(function (p) {
    out.p.push({text: p.innerText, seen: seen(p)});
  });
  document.querySelectorAll("tr").forEach(function (tr) {
    var cells = [];
    tr.querySelectorAll("td,th").forEach(function (c) { cells.push(c.innerText); });
    var h = tr.closest("table").previousElementSibling;
    out.rows.push({cells: cells, seen: seen(tr), under: h ? h.innerText : ""});
  });
  document.querySelectorAll("img").forEach(function (i) {
    out.images.push({src: i.getAttribute("src"), width: i.naturalWidth, seen: seen(i)});
  });
  var pre = document.createElement("pre");
  pre.id = "%s";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
    % PROBE_ID
)


def chromium() -> str:
    """The chromium binary; skips the test without one, fails it in CI."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    why = "no chromium on PATH (make system-packages installs Debian's chromium)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why + "; CI=true: a browser test may not skip")
    pytest.skip(why)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    home = tempfile.mkdtemp(prefix="rb-chromium-")
    try:
        return subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-extensions",
                "--user-data-dir=" + home,
                "--window-size=%d,%d" % WINDOW,
                "--virtual-time-budget=5000",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=SECONDS,
            env=dict(os.environ, HOME=home),
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- PNG, read with the stdlib -----------------------------------------------------------------


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, the unfiltered pixel rows concatenated) of an 8-bit RGB
    or RGBA PNG without interlacing (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    assert head is not None, "a PNG without IHDR"
    width, height, depth, colour, _, _, interlace = head
    assert depth == 8 and colour in (2, 6) and not interlace, head
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    out = bytearray()
    # each row with bpp zero bytes before it: the byte to the left of the first pixel's is 0
    prev = bytearray(stride + bpp)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = bytearray(bpp) + raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        if kind == 1:
            for i in range(bpp, stride + bpp):
                row[i] = (row[i] + row[i - bpp]) & 0xFF
        elif kind == 2:
            row = bytearray((a + b) & 0xFF for a, b in zip(row, prev))
        elif kind == 3:
            for i in range(bpp, stride + bpp):
                row[i] = (row[i] + ((row[i - bpp] + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(bpp, stride + bpp):
                a, b, c = row[i - bpp], prev[i], prev[i - bpp]
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - c - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out += row[bpp:]
        prev = row
    return width, height, bpp, bytes(out)


def colours(data: bytes) -> dict[tuple[int, int, int], int]:
    """Pixel count per RGB colour of a PNG."""
    width, height, bpp, px = png_pixels(data)
    counts: dict[tuple[int, int, int], int] = {}
    for i in range(0, len(px), bpp):
        key = (px[i], px[i + 1], px[i + 2])
        counts[key] = counts.get(key, 0) + 1
    return counts


# -- the page ----------------------------------------------------------------------------------


@dataclass
class Seen:
    h1: list[dict]
    p: list[dict]
    rows: list[dict]
    images: list[dict]
    colours: dict = field(repr=False)
    screenshot: Path

    def row(self, *cells: str) -> dict | None:
        """The first row whose cells begin with CELLS."""
        for r in self.rows:
            if [c.strip() for c in r["cells"][: len(cells)]] == list(cells):
                return r
        return None


def look(run_dir: Path, out: Path | None = None) -> Seen:
    """RUN_DIR/report.html opened in headless Chromium (see the module's docstring); the
    screenshot is written to OUT (default RUN_DIR/report.png)."""
    page = run_dir / "report.html"
    assert page.is_file(), f"no report.html in {run_dir}"
    shot = out or (run_dir / "report.png")
    r = _run(["--screenshot=" + str(shot), page.as_uri()])
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    probe = run_dir / ".report-probe.html"
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text.lower(), "report.html carries a script"
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        r = _run(["--dump-dom", probe.as_uri()])
    finally:
        probe.unlink()
    assert r.returncode == 0, r.stderr[-2000:]
    start = r.stdout.find('<pre id="%s">' % PROBE_ID)
    assert start >= 0, "the probe did not run: " + r.stdout[-2000:]
    text = r.stdout[start:].split(">", 1)[1].split("</pre>", 1)[0]
    doc = json.loads(html.unescape(text))
    return Seen(doc["h1"], doc["p"], doc["rows"], doc["images"], colours(shot.read_bytes()), shot)


def failed_checks(report: dict) -> list[tuple[str, dict]]:
    out = []
    for host, doc in sorted((report.get("probes") or {}).items()):
        for c in doc.get("checks") or []:
            if c.get("status") == "fail":
                out.append((host, c))
    return out


def assert_seen(run_dir: Path, fanout: dict | None = None) -> Seen:
    """Open RUN_DIR's report.html and hold what is seen to RUN_DIR/report.json."""
    report = json.loads((run_dir / "report.json").read_text())
    seen = look(run_dir)
    outcome = report["outcome"]
    # the outcome, in the heading, seen
    assert [h for h in seen.h1 if h["seen"] and outcome in h["text"]], (outcome, seen.h1)
    # where a run that did not pass stopped
    if report.get("where"):
        said = "%s %s" % (outcome, report["where"])
        assert [p for p in seen.p if p["seen"] and p["text"].strip() == said], (said, seen.p)
    # every step's row
    for s in report["steps"]:
        row = seen.row(s["id"], s.get("host") or "-", s["status"])
        assert row and row["seen"], (s, seen.rows)
    # every failed check's row, with its reason, under its host's (or its node group's) heading
    for host, c in failed_checks(report):
        rows = [
            r
            for r in seen.rows
            if [x.strip() for x in r["cells"][:3]] == [c["id"], c.get("level", ""), "fail"]
            and r["seen"]
        ]
        if fanout is None:
            rows = [r for r in rows if r["under"].strip() == "host " + host]
        else:
            # one table per group of identical rows, its heading naming the group's first node
            first = next(str(g[0]) for g in fanout["groups"] if host in g)
            rows = [
                r for r in rows if r["under"].strip().startswith("node") and first in r["under"]
            ]
        assert rows, (host, c, seen.rows)
        assert any((c.get("reason") or "") in r["cells"][4] for r in rows), (c, rows)
    # every picture loaded
    assert seen.images, "no picture on the page"
    for img in seen.images:
        assert img["width"] > 0 and img["seen"], img
    # the screenshot shows something, and the outcome's colour
    assert len(seen.colours) > 16, f"the screenshot has {len(seen.colours)} colours"
    background = max(seen.colours.values())
    assert background < 0.99 * sum(seen.colours.values()), "the screenshot is (nearly) one colour"
    if outcome in OUTCOME_RGB:
        assert seen.colours.get(OUTCOME_RGB[outcome], 0) > 20, (
            f"no pixel of the {outcome} colour in {seen.screenshot}"
        )
    return seen
