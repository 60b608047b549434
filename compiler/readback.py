"""A compiled runbook's settings read back (the inverse of plan.py's settings block), for the
benchmarks and the tests that need a runbook's values: one reader, stdlib only (a benchmark may
run where the compiler's packages are not installed).
"""

from __future__ import annotations

import re
import shlex


def read_settings(text: str) -> dict[str, str | list[str]]:
    """The settings block read back from a runbook's text: each `readonly NAME=value` (a string)
    and `readonly -a NAME=(...)` (its words), as the shell reads them; a quoted value may span
    lines (the JSON documents, one key a line: plan.keyed; the fan-out's node script)."""
    out: dict[str, str | list[str]] = {}
    lines = text.splitlines()
    at = 0
    while at < len(lines):
        found = re.match(r"^readonly (-a )?(RB_[A-Z0-9_]+)=(.*)$", lines[at])
        at += 1
        if not found:
            continue
        value = found.group(3)
        while True:
            try:
                words = shlex.split(value.strip("()") if found.group(1) else value)
                break
            except ValueError:
                if at >= len(lines) or not value.startswith("'"):
                    words = None  # not a value read here
                    break
                value += "\n" + lines[at]
                at += 1
        if words is not None:
            out[found.group(2)] = words if found.group(1) else (words[0] if words else "")
    return out
