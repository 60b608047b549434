"""Run checks: one (standalone) or the list of a config document, each under a deadline.

A check runs in a worker thread; if it does not finish by its deadline it is reported as failed
and the runner stops (a hung CUDA call cannot be interrupted; the caller exits the process).
Any exception a check raises becomes a failed result, never a crash of the runner.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import report
from .checks import CHECKS, deadline_for
from .result import FAIL, SKIP, Context, Outcome, ParamError, Unavailable, check_params


class ConfigError(ValueError):
    """The config document is unusable as a whole (a usage error: exit status 2)."""


def _call(fn, params: Dict[str, Any], ctx: Context, deadline_s: float) -> Tuple[str, Any]:
    """("ok", Outcome) | ("unavailable", exc) | ("error", text) | ("timeout", None)."""
    box: List[Tuple[str, Any]] = []

    def target() -> None:
        try:
            box.append(("ok", fn(params, ctx)))
        except Unavailable as exc:
            box.append(("unavailable", exc))
        except BaseException as exc:  # SystemExit from a snippet or import counts too
            tb = traceback.format_exc(limit=8)
            box.append(("error", ("%s: %s" % (type(exc).__name__, exc), tb)))

    worker = threading.Thread(target=target, name="rbprobes-check", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive() or not box:
        return "timeout", None
    return box[0]


def run_check(check: Dict[str, Any], ctx: Context) -> Dict[str, Any]:
    """Run one check given as {"id", "type", "params", "allow_skip", "timeout_s"?}; returns its
    report entry. The entry's values hold "timed_out": true when the deadline passed."""
    start = time.monotonic()
    check_type = check.get("type")
    check_id = str(check.get("id") or check_type)
    spec = CHECKS.get(check_type) if isinstance(check_type, str) else None
    if spec is None:
        return report.result(check_id, str(check_type), "L?", FAIL,
                             "unknown check type %r (known: %s)"
                             % (check_type, ", ".join(sorted(CHECKS))))
    try:
        params = check_params(check_type, check.get("params"), spec.params)
    except ParamError as exc:
        return report.result(check_id, check_type, spec.level, FAIL, str(exc))
    deadline_s = check.get("timeout_s") or deadline_for(check_type, params)
    kind, value = _call(spec.run, params, ctx, float(deadline_s))
    elapsed = time.monotonic() - start
    if kind == "ok" and isinstance(value, Outcome):
        return report.result(check_id, check_type, value.level or spec.level, value.status,
                             value.reason, value.values, elapsed)
    if kind == "unavailable":
        allow = check.get("allow_skip") is True
        status = SKIP if allow else FAIL
        reason = value.reason if allow else "%s (set allow_skip: true to skip)" % value.reason
        values = dict(value.values)
        values["precondition"] = value.reason
        return report.result(check_id, check_type, spec.level, status, reason, values, elapsed)
    if kind == "timeout":
        return report.result(check_id, check_type, spec.level, FAIL,
                             "timed out: still running after %gs" % deadline_s,
                             {"timed_out": True}, elapsed)
    if kind == "error":
        text, tb = value
        return report.result(check_id, check_type, spec.level, FAIL,
                             "unexpected error: %s" % text, {"traceback": tb}, elapsed)
    return report.result(check_id, check_type, spec.level, FAIL,
                         "check returned %r instead of an outcome" % (value,), {}, elapsed)


def context_of(config: Dict[str, Any]) -> Context:
    return Context(host=config.get("host"), venv=config.get("venv"), gpu=config.get("gpu"),
                   cuda=config.get("cuda"))


def validate_config(config: Any) -> List[Dict[str, Any]]:
    """The config's checks, each with an id; raises ConfigError for an unusable document."""
    if not isinstance(config, dict):
        raise ConfigError("the config must be a JSON object, got %s" % type(config).__name__)
    if config.get("schema") != 1:
        raise ConfigError("unsupported config schema %r (this probe reads schema 1)"
                          % (config.get("schema"),))
    for key, kind in (("gpu", dict), ("cuda", dict)):
        if config.get(key) is not None and not isinstance(config[key], kind):
            raise ConfigError("config %r must be an object or null" % key)
    checks = config.get("checks")
    if not isinstance(checks, list):
        raise ConfigError("config 'checks' must be a list")
    out = []
    seen = set()
    for i, check in enumerate(checks):
        if not isinstance(check, dict) or "type" not in check:
            raise ConfigError("checks[%d] must be an object with a 'type'" % i)
        check = dict(check)
        check["id"] = str(check.get("id") or "%s_%d" % (check["type"], i + 1))
        if check["id"] in seen:
            raise ConfigError("checks[%d]: duplicate id %r" % (i, check["id"]))
        seen.add(check["id"])
        out.append(check)
    return out


def run_config(config: Dict[str, Any], on_result=None) -> Tuple[Dict[str, Any], bool]:
    """Run every check of the config in order; returns (report, stopped_early). After a check
    times out the rest are not started and are reported as failed, "not run"."""
    checks = validate_config(config)
    ctx = context_of(config)
    started_wall = time.time()
    start = time.monotonic()
    results: List[Dict[str, Any]] = []
    stopped: Optional[str] = None
    for check in checks:
        if stopped:
            spec = CHECKS.get(check["type"])
            entry = report.result(check["id"], str(check["type"]),
                                  spec.level if spec else "L?", FAIL,
                                  "not run: check %s timed out and the runner stopped" % stopped,
                                  {"not_run": True})
        else:
            entry = run_check(check, ctx)
            if entry["values"].get("timed_out"):
                stopped = entry["id"]
        results.append(entry)
        if on_result:
            on_result(entry)
    doc = report.build(ctx.host, started_wall, time.monotonic() - start, results)
    return doc, stopped is not None
