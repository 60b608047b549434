"""The engine's answer channel (serve.py's docstring has the protocol): `Answer` writes its lines
whole under a lock (the ping thread writes too), one field a line with nothing a terminal would
obey; `log`, a human line to the runbook's log; `Stop`, the end of a run where it is.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, List

from rbrules.shown import printable


class Stop(BaseException):
    """SIGTERM/SIGHUP, or the runbook gone: end the run where it is (never inside a rename)."""


class Answer:
    """The answer channel: lines as described above, written whole under a lock (the ping thread
    writes too)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.mutex = threading.Lock()
        self.events: List[dict] = []

    def line(self, *fields: Any) -> None:
        text = "\t".join(one_line(f) for f in fields) + "\n"
        with self.mutex:
            self.out.write(text)
            self.out.flush()

    def event(self, event: dict) -> None:
        for key, value in sorted(event["facts"].items()):
            if isinstance(value, (str, int, float)) or value is None:
                self.line("set", key, "" if value is None else value)
        self.line("event", json.dumps(event, sort_keys=True, separators=(",", ":")))
        self.events.append(event)

    def trace(self, text: str) -> None:
        """Lines for the run's log file only (a failure's traceback): `log` lines."""
        for part in text.splitlines():
            self.line("log", part)

    def done(self) -> int:
        """End the answer to one request: failed when one of its events failed."""
        events, self.events = self.events, []
        failed = [e for e in events if e["status"] == "failed"]
        last = failed[0] if failed else (events[0] if events else None)
        status = "failed" if failed else (last["status"] if last else "ok")
        self.line("done", status, last["detail"] if last else "")
        return 1 if failed else 0


def one_line(value: Any) -> str:
    """A field of the answer: one line, no tab, nothing a terminal would obey (rbrules.shown:
    a detail may name a file, and the runbook logs it)."""
    return printable(str(value).replace("\t", " ").replace("\n", " "))


def log(line: str) -> None:
    """A human line of the engine: to stderr (the runbook's log), indented under its step's;
    nothing a terminal would obey (rbrules.shown)."""
    for part in (line or "").splitlines():
        sys.stderr.write("    " + printable(part) + "\n")
    sys.stderr.flush()
