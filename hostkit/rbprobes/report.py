"""The report document (schema 1) and the human table printed on stderr."""

from __future__ import annotations

import json
import os
import platform
import socket
from typing import Any, Dict, List, Optional

from rbrules.shown import printable

SCHEMA = 1
LEVELS = ("L0", "L1", "L2")


def result(
    check_id: str,
    check_type: str,
    level: str,
    status: str,
    reason: str,
    values: Optional[Dict[str, Any]] = None,
    duration_s: float = 0.0,
) -> Dict[str, Any]:
    """One entry of the report's `checks` list (also what a standalone check prints)."""
    return {
        "id": check_id,
        "type": check_type,
        "level": level,
        "status": status,
        "reason": reason,
        "values": values or {},
        "duration_s": round(duration_s, 3),
    }


def build(
    host: Optional[str],
    started: float,
    duration_s: float,
    checks: List[Dict[str, Any]],
    schedule: Optional[List[Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """The report; `schedule` (run_config's) lists, in the checks' order, each check's lane and
    its start and end in seconds from `started` (null for a check that was not run)."""
    ran = {c["level"] for c in checks if not c["values"].get("not_run")}
    summary = {"pass": 0, "fail": 0, "skip": 0}
    for check in checks:
        summary[check["status"]] = summary.get(check["status"], 0) + 1
    doc = {
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "started": started,
        "duration_s": round(duration_s, 3),
        "levels_run": [lv for lv in LEVELS if lv in ran],
        "checks": checks,
        "summary": summary,
    }
    if schedule is not None:
        doc["schedule"] = schedule
    return doc


def write(path: str, doc: Dict[str, Any]) -> None:
    """Write atomically: a temp file in the same directory, then rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "w", encoding="utf-8") as fh:  # umask applies, unlike mkstemp's 0600
            json.dump(doc, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _one_line(text: str, width: int) -> str:
    """One line of at most `width`, nothing a terminal would obey (a reason may name a file:
    rbrules.shown)."""
    text = printable(" ".join(str(text).split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def table(checks: List[Dict[str, Any]], width: int = 140) -> str:
    """Aligned columns: check, level, status, seconds, detail."""
    rows = [("check", "level", "status", "secs", "detail")]
    for check in checks:
        rows.append(
            (
                check["id"],
                check["level"],
                check["status"].upper(),
                "%.2f" % check["duration_s"],
                check["reason"],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for row in rows:
        head = "  ".join(
            row[i].ljust(widths[i]) if i != 3 else row[i].rjust(widths[i]) for i in range(4)
        )
        lines.append(head + "  " + _one_line(row[4], max(20, width - len(head) - 2)))
    return "\n".join(lines)


def summary_line(doc: Dict[str, Any]) -> str:
    summary = doc["summary"]
    return "%s: %d passed, %d failed, %d skipped (levels %s) in %.1fs" % (
        doc["host"],
        summary.get("pass", 0),
        summary.get("fail", 0),
        summary.get("skip", 0),
        "+".join(doc["levels_run"]) or "none",
        doc["duration_s"],
    )
