"""Run the rows: a warm-up round, then N timed rounds, every row once per round (so a change of load
during the run hits every row alike), each bounded in time; stop early when the budget is spent."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import asdict

from .env import Env, log
from .rows import Row, Sample


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def _new_record(row: Row, env: Env) -> dict:
    return {
        "id": row.id,
        "group": row.group,
        "label": row.label,
        "payload": row.payload,
        "bytes": row.nbytes(env),
        "limit": row.limit,
        "samples": [],
        "warmup": [],
        "verdicts": [],
        "notes": [],
        "skipped": "",
    }


def _one(env: Env, row: Row, rec: dict, warm: bool) -> str:
    try:
        row.prepare(env)
        samples = row.run(env)
    except Exception as exc:  # a row's failure is a result, never the end of the run
        samples = [Sample(0.0, False, f"{type(exc).__name__}: {exc}")]
        log(traceback.format_exc(limit=3).strip().splitlines()[-1])
    verdict = None
    if all(s.ok for s in samples):
        try:
            verdict = row.check(env)
        except Exception as exc:
            verdict = None
            samples[-1].ok, samples[-1].error = False, f"check failed: {type(exc).__name__}: {exc}"
    try:
        row.cleanup(env)
    except Exception as exc:
        log(f"{row.id}: cleanup: {exc}")
    rec["warmup" if warm else "samples"].extend(asdict(s) for s in samples)
    for s in samples:
        if s.note and s.note not in rec["notes"]:
            rec["notes"].append(s.note)
    if verdict is not None:
        rec["verdicts"].append({"ok": verdict.ok, "text": verdict.text, "warmup": warm})
        for n in verdict.notes:
            if n not in rec["notes"]:
                rec["notes"].append(n)
    t = "+".join(f"{s.seconds:.2f}" for s in samples)
    status = (
        "ok"
        if all(s.ok for s in samples)
        else "FAILED " + next(s.error for s in samples if not s.ok)
    )
    correct = f"; correct: {verdict.text}" if verdict is not None else ""
    return f"{t} s {status}{correct}"


def run(
    env: Env, rows: list[Row], *, repeat: int, budget_s: float, light_warmup: bool = False
) -> dict:
    """Returns {"records": [...], "rounds": [...], "stopped": reason or ""}. light_warmup: warm up
    only the limit rows (ssh and the page cache; --quick)."""
    t0 = time.monotonic()
    records = {r.id: _new_record(r, env) for r in rows}
    for r in rows:
        missing = [env.missing[t] for t in r.needs if t in env.missing]
        if missing:
            records[r.id]["skipped"] = "; ".join(missing)
    for r in rows:
        if records[r.id]["skipped"]:
            continue
        try:
            r.setup(env)
        except Exception as exc:
            records[r.id]["skipped"] = f"setup failed: {type(exc).__name__}: {exc}"
            log(f"{r.id}: {records[r.id]['skipped']}")
    rounds: list[dict] = []
    stopped = ""
    last_round_s = 0.0
    for rnd in range(0, repeat + 1):
        elapsed = time.monotonic() - t0
        if rnd > 1 and elapsed + last_round_s > budget_s:
            stopped = (
                f"stopped after {rnd - 1} timed round(s): another would end at about "
                f"{(elapsed + last_round_s) / 60:.1f} min, past the {budget_s / 60:.0f} min budget"
            )
            log(stopped)
            break
        r0 = time.monotonic()
        name = "warm-up" if rnd == 0 else f"round {rnd}/{repeat}"
        rounds.append({"round": rnd, "load_start": loadavg()})
        log(f"--- {name} (load {' '.join(map(str, loadavg()))}, {elapsed / 60:.1f} min in)")
        for row in rows:
            rec = records[row.id]
            if rec["skipped"]:
                continue
            if rnd == 0 and (not row.warmup or (light_warmup and row.group != "limit")):
                continue
            if rnd > 0 and row.repeat is not None and len(rec["samples"]) >= row.repeat:
                continue
            if rnd > 0 and time.monotonic() - t0 > budget_s * 1.2:
                if not stopped:
                    stopped = f"round {rnd} cut short: past 1.2x the {budget_s / 60:.0f} min budget"
                    log(stopped)
                continue
            t_row = time.monotonic()
            line = _one(env, row, rec, rnd == 0)
            log(f"{row.id} [{name}] {line} ({time.monotonic() - t_row:.1f} s with prepare/check)")
        rounds[-1]["load_end"] = loadavg()
        rounds[-1]["seconds"] = round(time.monotonic() - r0, 1)
        if rnd > 0:
            last_round_s = time.monotonic() - r0
        if stopped.startswith("round"):
            break
    return {
        "records": list(records.values()),
        "rounds": rounds,
        "stopped": stopped,
        "seconds": round(time.monotonic() - t0, 1),
        "pid": os.getpid(),
    }
