"""nodes.svg, for a fan-out: nodes x steps and checks, a cell per status with its seconds, odd and
missing nodes named."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .svg import CHAR, Svg, colour, fit, legend, num, secs, status_word


def fold(names: List[str]) -> str:
    """rbkit.fanreports.fold, imported only for a fan-out's pictures (the engine behind it is not
    needed to draw a single host's run)."""
    from rbkit import fanreports

    return fanreports.fold(names)


def _node_seconds(doc: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """Column -> seconds, from one node's report (its steps, its checks)."""
    out: Dict[str, float] = {}
    if not isinstance(doc, dict):
        return out
    for step in doc.get("steps") or []:
        if isinstance(step, dict) and isinstance(step.get("seconds"), (int, float)):
            out[str(step.get("id"))] = float(step["seconds"])
    for check in (doc.get("probe") or {}).get("checks") or []:
        if isinstance(check, dict) and isinstance(check.get("duration_s"), (int, float)):
            out["check:" + str(check.get("id"))] = float(check["duration_s"])
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
    seconds = {n: _node_seconds(reports.get(n)) for n in nodes}

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
        (" " + name) if name else "",
        ok,
        len(nodes),
        len(odd),
        len(missing),
        fanout.get("success", "?"),
        "met" if fanout.get("passed") else "NOT met",
    )
    svg.text(
        16,
        26,
        fit(title, width - 32, 16),
        16,
        weight="bold",
        fill="#212121" if fanout.get("passed") else colour("failed")[0],
    )
    groups = fanout.get("groups") or []
    sub = "%d group%s of identical rows: %s" % (
        len(groups),
        "" if len(groups) == 1 else "s",
        "; ".join("%s (%d)" % (fold([str(n) for n in g]), len(g)) for g in groups) or "none",
    )
    svg.text(16, 46, fit(sub, width - 32, 12), 12, fill="#455a64")
    legend(
        svg,
        16,
        70,
        [
            (colour("pass")[0], colour("pass")[0], "pass"),
            (colour("fail")[0], colour("fail")[0], "fail"),
            (colour("skip")[0], colour("skip")[0], "skip"),
            (colour("-")[0], "#b0bec5", "not run"),
            ("url(#nohatch)", "#8d6e63", "no report"),
            ("#ffffff", "#ef6c00", "odd node (differs from the majority)"),
        ],
    )
    svg.parts.insert(
        0,
        '<defs><pattern id="nohatch" width="6" height="6" '
        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#fbe9e7"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#bcaaa4" stroke-width="2"/>'
        "</pattern></defs>",
    )
    ypos = 84 + head_h
    # column heads, slanted; steps and checks apart
    for column, head in enumerate(heads):
        cx = x0 + column * cell_w + cell_w / 2
        if slant:
            svg.add(
                "text",
                {
                    "x": num(cx),
                    "y": num(ypos - 6),
                    "font-size": "11",
                    "fill": "#212121",
                    "transform": "rotate(-35 %s %s)" % (num(cx), num(ypos - 6)),
                },
                head,
                cols[column],
            )
        else:
            svg.text(cx, ypos - 6, head, 11, anchor="middle", title=cols[column])
    first_check = next((j for j, c in enumerate(cols) if c.startswith("check:")), None)
    for lo, hi, what in (
        (0, first_check if first_check is not None else len(cols), "steps"),
        (first_check, len(cols), "checks"),
    ):
        if lo is None or hi <= lo:
            continue
        svg.text(
            x0 + (lo + hi) * cell_w / 2,
            84 + 14,
            what,
            12,
            anchor="middle",
            weight="bold",
            fill="#455a64",
        )
        svg.line(
            x0 + lo * cell_w + 4,
            84 + 19,
            x0 + hi * cell_w - 4,
            84 + 19,
            stroke="#90a4ae",
            stroke_width=1.0,
        )
    for index, node in enumerate(nodes):
        ry = ypos + index * cell_h
        if index % 2 == 0:
            svg.rect(8, ry, width - 16, cell_h, "#f5f7f8")
        is_odd, is_missing = node in odd, node in missing
        svg.text(
            x0 - 10,
            ry + 14,
            fit(node, label_w - 10, 12),
            12,
            anchor="end",
            weight="bold" if is_odd or is_missing else None,
            fill="#ef6c00" if is_odd else "#6d4c41" if is_missing else "#212121",
        )
        if is_missing:
            why = " | ".join(str(w) for w in missing[node]) or "no report"
            svg.rect(
                x0,
                ry + 1,
                cell_w * len(cols),
                cell_h - 2,
                "url(#nohatch)",
                title="%s: no report: %s" % (node, why),
                stroke="#8d6e63",
                stroke_width=1.0,
            )
            svg.text(x0 + 8, ry + 14, "no report", 11, fill="#4e342e", weight="bold")
            note = "no report: " + why
            svg.text(
                x0 + cell_w * len(cols) + 12,
                ry + 14,
                fit(note, width - (x0 + cell_w * len(cols) + 20), 11),
                11,
                fill="#6d4c41",
                title=note,
            )
            continue
        row = rows.get(node) or {}
        for column, col_id in enumerate(cols):
            st = str(row.get(col_id, "-"))
            fill, ink = colour(st)
            took = seconds[node].get(col_id)
            word = (
                secs(took).replace(" ", "")
                if took is not None and st != "-"
                else ("" if st == "-" else status_word(st))
            )
            if st == "fail":
                word = "\u2717 " + word if took is not None else "\u2717 fail"
            tip = "%s %s: %s%s" % (
                node,
                heads[column],
                status_word(st),
                (", " + secs(took)) if took is not None else "",
            )
            svg.rect(
                x0 + column * cell_w + 1,
                ry + 1,
                cell_w - 2,
                cell_h - 2,
                fill,
                title=tip,
                stroke="#b0bec5" if st == "-" else None,
            )
            if word:
                svg.text(
                    x0 + column * cell_w + cell_w / 2,
                    ry + 14,
                    word,
                    10.5,
                    anchor="middle",
                    fill=ink,
                    weight="bold" if st == "fail" else None,
                )
        if is_odd:
            svg.rect(
                x0 - 0.5,
                ry + 0.5,
                cell_w * len(cols) + 1,
                cell_h - 1,
                "none",
                stroke="#ef6c00",
                stroke_width=2.0,
            )
            diffs = [str(d) for d in odd[node]] or ["differs"]
            note = "odd: " + "; ".join(diffs)
            svg.text(
                x0 + cell_w * len(cols) + 12,
                ry + 14,
                fit(note, width - (x0 + cell_w * len(cols) + 20), 11),
                11,
                fill="#e65100",
                title=note,
            )
    ypos += cell_h * len(nodes)
    if first_check:
        sx = x0 + first_check * cell_w
        svg.line(sx, 84 + 22, sx, ypos, stroke="#546e7a", stroke_width=1.0, stroke_dasharray="3 3")
    ypos += 18
    if reports:
        svg.text(16, ypos, "Cells give each node's seconds per step and check.", 11, fill="#607d8b")
        ypos += 14
    for node in nodes:
        if node in odd:
            line = "odd node %s: %s" % (node, "; ".join(str(d) for d in odd[node]) or "differs")
            svg.text(16, ypos + 4, fit(line, width - 32, 11), 11, fill="#e65100", title=line)
            ypos += 16
    for node in nodes:
        if node in missing:
            line = "no report from %s: %s" % (node, " | ".join(str(w) for w in missing[node]))
            svg.text(16, ypos + 4, fit(line, width - 32, 11), 11, fill="#6d4c41", title=line)
            ypos += 16
    desc = "; ".join(
        "%s: %s"
        % (
            n,
            "no report"
            if n in missing
            else ", ".join(
                "%s %s" % (h, (rows.get(n) or {}).get(c, "-")) for h, c in zip(heads, cols)
            ),
        )
        for n in nodes
    )
    return svg.render(width, ypos + 12, title, desc)
