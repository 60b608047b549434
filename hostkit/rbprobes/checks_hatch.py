"""Escape hatches: the spec author's own Python snippet or shell command, judged by exit status."""

from __future__ import annotations

import sys
from typing import Any, Dict

from . import proc
from .result import Context, failed, passed

DEFAULT_TIMEOUT_S = 300


def _judge(label: str, finished: proc.Finished, expect: int, timeout_s: float,
           values: Dict[str, Any]):
    values.update({"exit": finished.returncode, "output_tail": finished.output,
                   "seconds": round(finished.duration_s, 3)})
    last = finished.output.strip().splitlines()[-1:] or [""]
    if finished.timed_out:
        return failed("%s timed out after %gs" % (label, timeout_s), values)
    if finished.returncode != expect:
        return failed("%s exited %d, expected %d: %s" % (label, finished.returncode, expect,
                                                         last[0][:200]), values)
    return passed("%s exited %d%s" % (label, expect, (": " + last[0][:120]) if last[0] else ""),
                  values)


def python_check(params: Dict[str, Any], ctx: Context):
    """Run params.code with this interpreter in a child process; pass when it exits 0."""
    code = params.get("code")
    if not code:
        return failed("no code to run: give params.code")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    label = "python snippet %s" % (params.get("name") or "")
    finished = proc.run_bounded([sys.executable, "-c", code], timeout_s, env=proc.child_env())
    return _judge(label.strip(), finished, 0, timeout_s,
                  {"name": params.get("name"), "python": sys.executable})


def command_check(params: Dict[str, Any], ctx: Context):
    """Run params.run with /bin/sh -c; pass when it exits with params.expect_exit (0)."""
    command = params.get("run")
    if not command:
        return failed("no command to run: give params.run")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    expect = params.get("expect_exit", 0)
    label = "command %s" % (params.get("name") or "")
    finished = proc.run_bounded(["/bin/sh", "-c", command], timeout_s, env=proc.child_env())
    return _judge(label.strip(), finished, expect, timeout_s,
                  {"name": params.get("name"), "expect_exit": expect})
