"""Run checks: one (standalone) or the list of a config document, each under a deadline.

A check runs in a worker thread; if it does not finish by its deadline it is reported as failed
(a hung CUDA call cannot be interrupted; the caller exits the process without waiting for it).
Any exception a check raises becomes a failed result, never a crash of the runner.

A config's checks run in two lanes (checks.py says which check goes where): the serial lane, in
this process, one after another in the config's order (torch, devices, imports, matmul,
libraries: they share torch, the CUDA context and what the process has loaded); and the
parallel lane, up to PARALLEL_MAX at a time, started at once (checks that read files or run
their own processes: kernel_audit, relocation, outside, command, python, nccl). A check that
times out stops the serial checks after it (they would share its stuck process); the others run
on. The report lists the checks in the config's order whatever order they finished in.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import report
from .checks import CHECKS, SERIAL, deadline_for, lane_for
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
        return report.result(
            check_id,
            str(check_type),
            "L?",
            FAIL,
            "unknown check type %r (known: %s)" % (check_type, ", ".join(sorted(CHECKS))),
        )
    try:
        params = check_params(check_type, check.get("params"), spec.params)
    except ParamError as exc:
        return report.result(check_id, check_type, spec.level, FAIL, str(exc))
    deadline_s = check.get("timeout_s") or deadline_for(check_type, params)
    kind, value = _call(spec.function(), params, ctx, float(deadline_s))
    elapsed = time.monotonic() - start
    if kind == "ok" and isinstance(value, Outcome):
        return report.result(
            check_id,
            check_type,
            value.level or spec.level,
            value.status,
            value.reason,
            value.values,
            elapsed,
        )
    if kind == "unavailable":
        allow = check.get("allow_skip") is True
        status = SKIP if allow else FAIL
        reason = value.reason if allow else "%s (set allow_skip: true to skip)" % value.reason
        values = dict(value.values)
        values["precondition"] = value.reason
        return report.result(check_id, check_type, spec.level, status, reason, values, elapsed)
    if kind == "timeout":
        return report.result(
            check_id,
            check_type,
            spec.level,
            FAIL,
            "timed out: still running after %gs" % deadline_s,
            {"timed_out": True},
            elapsed,
        )
    if kind == "error":
        text, tb = value
        return report.result(
            check_id,
            check_type,
            spec.level,
            FAIL,
            "unexpected error: %s" % text,
            {"traceback": tb},
            elapsed,
        )
    return report.result(
        check_id,
        check_type,
        spec.level,
        FAIL,
        "check returned %r instead of an outcome" % (value,),
        {},
        elapsed,
    )


def context_of(config: Dict[str, Any]) -> Context:
    return Context(
        host=config.get("host"),
        venv=config.get("venv"),
        gpu=config.get("gpu"),
        cuda=config.get("cuda"),
    )


def validate_config(config: Any) -> List[Dict[str, Any]]:
    """The config's checks, each with an id; raises ConfigError for an unusable document."""
    if not isinstance(config, dict):
        raise ConfigError("the config must be a JSON object, got %s" % type(config).__name__)
    if config.get("schema") != 1:
        raise ConfigError(
            "unsupported config schema %r (this probe reads schema 1)" % (config.get("schema"),)
        )
    for key, kind in (("gpu", dict), ("cuda", dict)):
        if config.get(key) is not None and not isinstance(config[key], kind):
            raise ConfigError("config %r must be an object or null" % key)
    checks = config.get("checks")
    if not isinstance(checks, list):
        raise ConfigError("config 'checks' must be a list")
    out = []
    seen = set()
    for index, check in enumerate(checks):
        if not isinstance(check, dict) or "type" not in check:
            raise ConfigError("checks[%d] must be an object with a 'type'" % index)
        check = dict(check)
        check["id"] = str(check.get("id") or "%s_%d" % (check["type"], index + 1))
        if check["id"] in seen:
            raise ConfigError("checks[%d]: duplicate id %r" % (index, check["id"]))
        seen.add(check["id"])
        out.append(check)
    return out


# Parallel checks running at once, at most: each is a thread waiting on a child process or
# reading files; more than this many children at once (a spec with many commands) would only
# compete for the same cores.
PARALLEL_MAX = 8


def _not_run(check: Dict[str, Any], stopped: str) -> Dict[str, Any]:
    spec = CHECKS.get(check["type"])
    return report.result(
        check["id"],
        str(check["type"]),
        spec.level if spec else "L?",
        FAIL,
        "not run: check %s timed out in the probe's process, which the "
        "serial checks after it share" % stopped,
        {"not_run": True},
    )


def run_config(config: Dict[str, Any], on_result=None) -> Tuple[Dict[str, Any], bool]:
    """Run every check of the config; returns (report, stopped_early). The serial checks run in
    the config's order in this process; after one of them times out, the serial checks behind it
    are not started and are reported as failed, "not run". The parallel checks start at once and
    each runs to its own end or deadline. `on_result(entry)` is called, in this thread, as each
    check finishes (in the order they finish); the report holds them in the config's order, and
    its `schedule` says when each ran and in which lane. stopped_early: a check timed out (its
    thread may still be running)."""
    checks = validate_config(config)
    ctx = context_of(config)
    started_wall = time.time()
    start = time.monotonic()
    lanes = [lane_for(c["type"], c.get("params")) for c in checks]
    results: List[Optional[Dict[str, Any]]] = [None] * len(checks)
    schedule: List[Dict[str, Any]] = [
        {"id": c["id"], "lane": lane, "start_s": None, "end_s": None}
        for c, lane in zip(checks, lanes)
    ]
    finished: "queue.Queue[int]" = queue.Queue()

    def run_one(index: int) -> Dict[str, Any]:
        schedule[index]["start_s"] = round(time.monotonic() - start, 3)
        try:
            entry = run_check(checks[index], ctx)
        except BaseException as exc:  # run_check catches what a check raises; this is a bug
            entry = report.result(
                checks[index]["id"],
                str(checks[index]["type"]),
                "L?",
                FAIL,
                "runner error: %s: %s" % (type(exc).__name__, exc),
            )
        schedule[index]["end_s"] = round(time.monotonic() - start, 3)
        results[index] = entry
        finished.put(index)
        return entry

    serial = [i for i, lane in enumerate(lanes) if lane == SERIAL]
    parallel = [i for i, lane in enumerate(lanes) if lane != SERIAL]
    todo: "queue.Queue[int]" = queue.Queue()
    for check_index in parallel:
        todo.put(check_index)

    def parallel_worker() -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            run_one(index)

    def serial_lane() -> None:
        stopped: Optional[str] = None
        for index in serial:
            if stopped:
                results[index] = _not_run(checks[index], stopped)
                finished.put(index)
                continue
            if run_one(index)["values"].get("timed_out"):
                stopped = checks[index]["id"]

    # Daemon threads: each returns by its checks' deadlines (run_check does not wait for a
    # stuck check), so they are joined through `finished`, never left behind waiting.
    threads = [
        threading.Thread(target=parallel_worker, name="rbprobes-parallel-%d" % n, daemon=True)
        for n in range(min(PARALLEL_MAX, len(parallel)))
    ]
    if serial:
        threads.insert(0, threading.Thread(target=serial_lane, name="rbprobes-serial", daemon=True))
    for thread in threads:
        thread.start()
    for _ in checks:
        check_index = finished.get()
        if on_result:
            on_result(results[check_index])
    entries = [r for r in results if r is not None]
    stopped = any(e["values"].get("timed_out") for e in entries)
    doc = report.build(ctx.host, started_wall, time.monotonic() - start, entries, schedule)
    return doc, stopped
