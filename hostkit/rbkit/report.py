"""The run report: the runbook's event log + each host's probe report -> one JSON and a table.

The event log (events.tsv) has tab-separated records: `step ID STATUS START_MS END_MS HOST DETAIL`
(the runbook's steps), `fact STEP KEY VALUE`, and `engine STEP JSON` (an event of the install
engine, rbkit/engine.py, during that step). Each step is reported once (a step recorded twice
keeps its worst status), with the engine's events of it; the outcome is the worse of what the
runbook said and what the steps' records say."""

from __future__ import annotations

import json
import os

from rbrules.shown import printable
from rbrules.units import human

SCHEMA = 1


RANK = {"ok": 0, "skipped": 0, "interrupted": 1, "failed": 2}


def read_events(path: str) -> tuple[list[dict], dict, dict]:
    """(steps, facts by step, engine events by step) from the event log."""
    steps: dict = {}
    facts: dict = {}
    engine: dict = {}
    if not os.path.exists(path):
        return [], facts, engine
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "step" and len(parts) >= 7:
                _, sid, status, start, end, host, detail = parts[:7]
                entry = {
                    "id": sid,
                    "status": status,
                    "host": host or None,
                    "duration_s": round((int(end) - int(start)) / 1000.0, 3),
                    "detail": detail,
                }
                # once per step: a second record (never written by a sound run) keeps the worse
                if sid not in steps or RANK.get(status, 2) >= RANK.get(steps[sid]["status"], 2):
                    steps[sid] = entry
            elif parts[0] == "fact" and len(parts) >= 4:
                _, sid, key, value = parts[:4]
                facts.setdefault(sid, {})[key] = _number(value)
            elif parts[0] == "engine" and len(parts) >= 3:
                try:
                    event = json.loads(parts[2])
                except ValueError:
                    continue
                engine.setdefault(parts[1], []).append(event)
    return list(steps.values()), facts, engine


def outcome_of(said: str, steps: list[dict]) -> str:
    """The worse of what the runbook said and what its steps' records say."""
    worst = max([said] + [s["status"] for s in steps], key=lambda s: RANK.get(s, 2))
    return "ok" if RANK.get(worst, 2) == 0 else worst


def _number(value: str):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


GPU_CHECKS = ("devices", "matmul", "nccl", "libraries", "torch")


def gpu_verdict(probe_docs: dict) -> dict:
    """For a spec that declares gpu:, whether the checks proved a GPU: a GPU check that was
    skipped (allow_skip) or a host without a probe report leaves it unproven, said as such."""
    unproven = []
    proven = False
    for host, doc in sorted(probe_docs.items()):
        if "checks" not in doc:
            unproven.append(f"{host}: no probe report")
            continue
        for check in doc["checks"]:
            if check.get("type") in GPU_CHECKS and check.get("status") == "skip":
                unproven.append(f"{host}: {check.get('id')} skipped")
            elif check.get("type") in ("devices", "matmul") and check.get("status") == "pass":
                proven = True
    if not probe_docs:
        unproven.append("no checks ran")
    return {"declared": True, "proven": proven and not unproven, "unproven": unproven}


def gpu_words(doc: dict) -> str:
    """`GPU NOT PROVEN: ...` for a report whose spec declares gpu: and whose checks did not
    prove one; "" otherwise. The terminal's summary and report.html's headline say it alike."""
    gpu = doc.get("gpu")
    if not gpu or gpu.get("proven"):
        return ""
    return (
        "GPU NOT PROVEN: the spec declares gpu:, but "
        + ("; ".join(gpu.get("unproven") or []) or "no GPU check passed")
        + " (a skip the spec allowed is not a pass)"
    )


def build(
    name: str,
    spec: str,
    sha: str,
    events: str,
    probes: dict,
    outcome: str,
    gpu: bool = False,
    where: str = "",
) -> dict:
    """The report; WHERE: where a run that did not pass stopped (`in step transfer`), kept unless
    its outcome is ok."""
    steps, facts, engine = read_events(events)
    # a swap undone later in the run (a check or step failed): its row says so, not "installed"
    undone = [
        e
        for events_of in engine.values()
        for e in events_of
        if e.get("step") == "rollback"
        and e.get("status") == "ok"
        and str(e.get("detail", "")).startswith("rolled back:")
    ]
    for step in steps:
        if step["id"] == "swap" and undone:
            step["detail"] = undone[-1]["detail"]
        if step["id"] in facts:
            step["facts"] = facts[step["id"]]
        if step["id"] in engine:
            step["engine"] = engine.pop(step["id"])
    probe_docs = {}
    for host, path in probes.items():
        try:
            with open(path, encoding="utf-8") as fh:
                probe_docs[host] = json.load(fh)
        except (OSError, ValueError) as exc:
            probe_docs[host] = {"error": f"no readable probe report at {path}: {exc}"}
    checks = {"pass": 0, "fail": 0, "skip": 0}
    for doc in probe_docs.values():
        for key in checks:
            checks[key] += int(doc.get("summary", {}).get(key, 0))
    outcome = outcome_of(outcome, steps)
    return {
        "schema": SCHEMA,
        "kind": "rb-run-report",
        "runbook": name,
        "spec": spec,
        "spec_sha256": sha,
        "outcome": outcome,
        **({"where": where} if where and outcome != "ok" else {}),
        "steps": steps,
        "checks": checks,
        "probes": probe_docs,
        "notes": facts.get("main", {}),
        # engine events outside any step: the end of the run (replace: the old install removed)
        "engine": [e for events in engine.values() for e in events],
        **({"gpu": gpu_verdict(probe_docs)} if gpu else {}),
    }


def _rate(mb_s) -> str:
    """A transfer's rate: `<1 MB/s` for a small or fast one whose figure rounds to 0."""
    if not isinstance(mb_s, (int, float)):
        return f"{mb_s} MB/s"
    return f"{mb_s:g} MB/s" if mb_s >= 1 else "<1 MB/s"


def moved_words(facts: dict) -> str:
    """What a step moved, from its facts, for the terminal's table and report.html alike: `7.2
    GB in 49421 files, 240 MB/s, 3.2 GB on the wire (2.28x)`; the wire's part where the stream
    was packed (packed_bytes: what the receiving end's decompressor read; its ratio to the tar
    stream's bytes). "" where the step moved nothing (no bytes fact)."""
    if "bytes" not in facts:
        return ""
    words = f"{human(facts['bytes'])} in {facts.get('files', '?')} files"
    if "mb_s" in facts:
        words += f", {_rate(facts['mb_s'])}"
    packed, carried = facts.get("packed_bytes"), facts.get("stream_bytes") or facts["bytes"]
    if isinstance(packed, int) and packed > 0 and isinstance(carried, (int, float)):
        words += f", {human(packed)} on the wire ({carried / packed:.2f}x)"
    return words


def table(doc: dict) -> str:
    rows = [("step", "host", "status", "time", "detail")]
    for step in doc["steps"]:
        facts = step.get("facts", {})
        detail = step["detail"]
        moved = moved_words(facts)
        if moved:
            detail = moved + (f"; {detail}" if detail else "")
        rows.append(
            (step["id"], step["host"] or "-", step["status"], f"{step['duration_s']:.1f}s", detail)
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    out = []
    for row in rows:
        out.append("  ".join(str(row[i]).ljust(widths[i]) for i in range(4)) + "  " + str(row[4]))
    checks = doc["checks"]
    if doc.get("probes") or any(checks.values()):  # no line for checks that never ran
        out.append(
            f"checks: {checks['pass']} passed, {checks['fail']} failed, {checks['skip']} skipped"
        )
    if gpu_words(doc):
        out.append(gpu_words(doc))
    out.append(f"outcome: {doc['outcome']}" + (f" ({doc['where']})" if doc.get("where") else ""))
    # a detail may name a file: never raw to a terminal (rbrules.shown)
    return "\n".join(printable(line) for line in out)
