"""report.html: the pictures, where a run that did not pass stopped, the steps, each host's checks
(each group of identical nodes' for a fan-out) and the fan-out comparison."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from rbkit.report import gpu_words, moved_words

from .nodes import fold
from .svg import FONT, esc

CSS = (
    """body{font-family:%s;margin:24px;color:#212121;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}img{max-width:100%%;border:1px solid #cfd8dc}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}td.num{text-align:right}.ok,.pass{color:#2e7d32;font-weight:bold}
.failed,.fail{color:#c62828;font-weight:bold}.skip{color:#607d8b}.interrupted{color:#ef6c00}
code{font-size:12px}"""
    % FONT
)


def page(report: Dict[str, Any], pictures: List[str], fanout: Optional[Dict[str, Any]]) -> str:
    name = str(report.get("runbook", "?"))
    outcome = str(report.get("outcome", "?"))
    # a spec that declares gpu: whose checks proved none: the headline says so, as the terminal's
    # summary does (an `ok` beside skipped GPU checks alone would be untrue)
    unproven = gpu_words(report)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>runbook %s: %s%s</title>"
        % (esc(name), esc(outcome), ", GPU NOT PROVEN" if unproven else ""),
        "<style>%s</style></head><body>" % CSS,
        '<h1>runbook %s: <span class="%s">%s</span>%s</h1>'
        % (
            esc(name),
            esc(outcome),
            esc(outcome),
            ', <span class="failed">GPU NOT PROVEN</span>' if unproven else "",
        ),
        '<p>spec <code>%s</code> (sha256 <code>%s</code>); <a href="report.json">report.json'
        "</a></p>" % (esc(report.get("spec", "?")), esc(str(report.get("spec_sha256", ""))[:12])),
    ]
    if report.get("where"):
        # where a run that did not pass stopped, under the heading
        out.insert(
            5,
            '<p class="%s">%s %s</p>'
            % (esc(report.get("outcome")), esc(report.get("outcome")), esc(report["where"])),
        )
    if unproven:
        out.insert(5, '<p class="failed">%s</p>' % esc(unproven))
    # what hosts that stopped answering keep of this run (the runbook's notes: left_on_HOST)
    notes = report.get("notes") or {}
    for key in sorted(k for k in notes if str(k).startswith("left_on_")):
        out.append(
            "<p>left on %s: <code>%s</code>: remove it there</p>"
            % (esc(key[len("left_on_") :]), esc(notes[key]))
        )
    for picture in pictures:
        out.append(
            '<p><a href="%s"><img src="%s" alt="%s"></a></p>'
            % (esc(picture), esc(picture), esc(picture.rsplit(".", 1)[0]))
        )
    out.append(
        "<h2>Steps</h2><table><tr><th>step</th><th>host</th><th>status</th>"
        "<th>seconds</th><th>detail</th></tr>"
    )
    for step in report.get("steps") or []:
        facts = step.get("facts") or {}
        moved = moved_words(facts)
        detail = "; ".join(
            [moved] * bool(moved) + [str(step.get("detail") or "")] * bool(step.get("detail"))
        )
        seconds = step.get("duration_s")
        out.append(
            '<tr><td>%s</td><td>%s</td><td class="%s">%s</td><td class=num>%s</td>'
            "<td>%s</td></tr>"
            % (
                esc(step.get("id")),
                esc(step.get("host") or "-"),
                esc(step.get("status", "")),
                esc(step.get("status")),
                "%.1f" % seconds if isinstance(seconds, (int, float)) else "-",
                esc(detail),
            )
        )
    out.append("</table>")
    if fanout:
        out.append(_fanout_html(fanout))
    counts = report.get("checks") or {}
    out.append(
        "<h2>Checks</h2><p>%s passed, %s failed, %s skipped</p>"
        % (esc(counts.get("pass", 0)), esc(counts.get("fail", 0)), esc(counts.get("skip", 0)))
    )
    probes = report.get("probes") or {}
    if fanout:
        # one table per group of identical rows (a node of each): a table per node does not
        # scale to a cluster, and the nodes of a group passed and failed the same checks
        reports = fanout.get("reports") or {}
        for members in fanout.get("groups") or []:
            group = [str(n) for n in members]
            doc = probes.get(group[0]) or (reports.get(group[0]) or {}).get("probe")
            out.append(
                "<h3>node %s</h3>" % esc(group[0])
                if len(group) == 1
                else "<h3>nodes %s (%d; seconds of %s)</h3>"
                % (esc(fold(group)), len(group), esc(group[0]))
            )
            out.append(_checks_table(doc))
    else:
        for host in sorted(probes):
            out.append("<h3>host %s</h3>" % esc(host))
            out.append(_checks_table(probes[host]))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _checks_table(doc: Any) -> str:
    """One host's checks: id, level, status, seconds, reason."""
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        why = doc.get("error") if isinstance(doc, dict) and doc.get("error") else "no checks ran"
        return "<p>%s</p>" % esc(why)
    out = [
        "<table><tr><th>check</th><th>level</th><th>status</th><th>seconds</th><th>reason</th></tr>"
    ]
    for chk in doc["checks"]:
        if not isinstance(chk, dict):
            continue
        seconds = chk.get("duration_s")
        out.append(
            '<tr><td>%s</td><td>%s</td><td class="%s">%s</td><td class=num>%s</td>'
            "<td>%s</td></tr>"
            % (
                esc(chk.get("id")),
                esc(chk.get("level", "")),
                esc(chk.get("status", "")),
                esc(chk.get("status")),
                "%.2f" % seconds if isinstance(seconds, (int, float)) else "-",
                esc(chk.get("reason") or ""),
            )
        )
    out.append("</table>")
    return "\n".join(out)


def _fanout_html(fanout: Dict[str, Any]) -> str:
    cols = [str(c) for c in fanout.get("columns") or []]
    rows = fanout.get("rows") or {}
    out = [
        "<h2>Fan-out comparison</h2><p>%d/%d nodes passed; success policy %s needs %s: %s</p>"
        % (
            len(fanout.get("ok_nodes") or []),
            len(fanout.get("nodes") or []),
            esc(fanout.get("success", "?")),
            esc(fanout.get("needed", "?")),
            "met" if fanout.get("passed") else "<b class=failed>NOT met</b>",
        )
    ]
    out.append(
        "<table><tr><th>nodes</th><th>count</th>%s</tr>"
        % "".join("<th>%s</th>" % esc(c[6:] if c.startswith("check:") else c) for c in cols)
    )
    for group in fanout.get("groups") or []:
        row = rows.get(group[0]) or {}
        out.append(
            "<tr><td>%s</td><td class=num>%d</td>%s</tr>"
            % (
                esc(fold([str(n) for n in group])),
                len(group),
                "".join(
                    '<td class="%s">%s</td>' % (esc(row.get(c, "-")), esc(row.get(c, "-")))
                    for c in cols
                ),
            )
        )
    out.append("</table>")
    odd = fanout.get("odd") or {}
    if odd:
        out.append("<h3>Odd nodes</h3><ul>")
        for node in fanout.get("nodes") or []:
            if node in odd:
                out.append(
                    "<li><b>%s</b>: %s</li>"
                    % (esc(node), esc("; ".join(str(d) for d in odd[node]) or "differs"))
                )
        out.append("</ul>")
    missing = fanout.get("missing") or {}
    if missing:
        out.append("<h3>Missing nodes</h3><ul>")
        for node in fanout.get("nodes") or []:
            if node in missing:
                out.append(
                    "<li><b>%s</b>: %s</li>"
                    % (esc(node), esc(" | ".join(str(w) for w in missing[node])))
                )
        out.append("</ul>")
    return "\n".join(out)
