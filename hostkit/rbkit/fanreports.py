"""A fan-out node's report on the wire: `RBFAN NODE I/N CHUNK` lines (rbkit.fanout's docstring),
read back per node from the cluster engine's output, and node names folded (node[01-03,05]).

The low module both fan-out sides import: the node and its comparison (fanout.py) and the live
plan's fan-out (fanplan.py); it imports neither. stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Dict, List

MARK = "RBFAN "
CHUNK = 800
LINE = re.compile(r"RBFAN (\S+) (\d+)/(\d+) (.*)$")


def pending(reports: Dict[str, Dict[str, Any]], nodes: List[str]) -> List[str]:
    """Nodes whose report says the re-run's bundle was not enough (they need the whole one)."""
    return [n for n in nodes if (reports.get(n) or {}).get("needs_full")]


def emit(doc: Dict[str, Any], out=None) -> None:
    """Print a node's report as `RBFAN NODE I/N CHUNK` lines (see the module's docstring)."""
    out = out or sys.stdout
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    parts = [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)]
    for index, part in enumerate(parts, 1):
        out.write("%s%s %d/%d %s\n" % (MARK, doc["node"], index, len(parts), part))
        out.flush()


def parse_reports(lines) -> Dict[str, Dict[str, Any]]:
    """Node reports from engine output: the `RBFAN NODE I/N CHUNK` lines, whatever their prefix,
    put together per node. A report with a chunk missing or not JSON is no report."""
    chunks: Dict[str, Dict[int, str]] = {}
    counts: Dict[str, int] = {}
    for line in lines:
        at = line.find(MARK)
        match = LINE.match(line[at:].rstrip("\r\n")) if at >= 0 else None
        if not match:
            continue
        name, index, total = match.group(1), int(match.group(2)), int(match.group(3))
        if counts.setdefault(name, total) != total or not 1 <= index <= total:
            continue
        chunks.setdefault(name, {})[index] = match.group(4)
    out: Dict[str, Dict[str, Any]] = {}
    for name, got in chunks.items():
        if len(got) != counts[name]:
            continue
        try:
            doc = json.loads("".join(got[i] for i in range(1, counts[name] + 1)))
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("node") == name:
            out[name] = doc
    return out


def match_nodes(nodes: List[str], reports: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Reports keyed by the spec's node names: a node that reported its full hostname
    (node01.cluster.example) counts as node01 when the spec names node01; others are dropped."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, doc in reports.items():
        short = name.split(".", 1)[0]
        key = name if name in nodes else short if short in nodes else None
        if key is not None and key not in out:
            out[key] = dict(doc, node=key) if key != name else doc
    return out


def fold(names: List[str]) -> str:
    """node01,node02,node03,node05 -> node[01-03,05] (a common prefix and numeric suffix only)."""
    parsed = [re.match(r"^(.*?)(\d+)$", n) for n in names]
    if (
        len(names) < 2
        or not all(parsed)
        or len({m.group(1) for m in parsed}) != 1
        or len({len(m.group(2)) for m in parsed}) != 1
    ):
        return ",".join(names)
    prefix, width = parsed[0].group(1), len(parsed[0].group(2))
    nums = sorted(int(m.group(2)) for m in parsed)
    parts, start, prev = [], nums[0], nums[0]
    for number in nums[1:] + [None]:
        if number is not None and number == prev + 1:
            prev = number
            continue
        parts.append(
            ("%0*d" % (width, start))
            if start == prev
            else "%0*d-%0*d" % (width, start, width, prev)
        )
        if number is not None:
            start = prev = number
    return "%s[%s]" % (prefix, ",".join(parts))


def read_reports(nodes: List[str], paths: List[str]) -> Dict[str, Dict[str, Any]]:
    """Reports from engine output files, in order: a node's report in a later file (the whole
    bundle's round after a re-run's) replaces its earlier one."""
    reports: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            reports.update(match_nodes(nodes, parse_reports(fh)))
    return reports
