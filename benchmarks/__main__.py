"""`python -m benchmarks [--quick] [--shape 1gbit] [--repeat N]`: run the benchmark, print the
table, store the result in benchmarks/results/, rewrite docs/benchmarks.md. Needs root (the
lab)."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import doc, machine, report, runner
from .env import Env, log
from .rows import catalogue

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument(
        "--quick", action="store_true", help="fewer rows, one timed round (about 3 min)"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed rounds after the warm-up (default 3; --quick: 1)",
    )
    ap.add_argument(
        "--shape",
        default="",
        metavar="RATE[,DELAY]",
        help="shape the lab links with tc (tbf; netem for a delay), e.g. 1gbit or 1gbit,5ms",
    )
    ap.add_argument(
        "--only",
        default="",
        metavar="GLOBS",
        help="comma-separated globs of row ids (see --list), e.g. 'limit.*,runbook.relay.*'",
    )
    ap.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help="stop starting rounds past this many minutes (default 20; --quick: 3)",
    )
    ap.add_argument(
        "--no-install", action="store_true", help="do not apt-get install rsync, b3sum, xxhash"
    )
    ap.add_argument(
        "--tag",
        default="",
        help="store the run as results/TAG.json (default: partial, quick or full, and the shape)",
    )
    ap.add_argument("--no-doc", action="store_true", help="print only; write no results or doc")
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument(
        "--doc-only",
        action="store_true",
        help="rewrite docs/benchmarks.md from benchmarks/results/*.json; run nothing",
    )
    a = ap.parse_args(argv)
    if a.repeat is None:
        a.repeat = 1 if a.quick else 3
    if not 1 <= a.repeat <= 20:
        ap.error("--repeat must be 1..20")
    if a.budget_min is None:
        a.budget_min = 3.0 if a.quick else 20.0
    return a


def select(a: argparse.Namespace):
    rows = catalogue()
    if a.only:
        globs = [g.strip() for g in a.only.split(",") if g.strip()]
        rows = [r for r in rows if any(fnmatch.fnmatchcase(r.id, g) for g in globs)]
    elif a.quick:
        rows = [r for r in rows if r.quick]
    else:
        rows = [r for r in rows if r.default]
    # the limit row of every chosen row runs too: ratios are measured in the same run
    ids = {r.id for r in rows}
    wanted = {r.limit for r in rows if r.limit} - ids
    rows = [r for r in catalogue() if r.id in ids or r.id in wanted]
    return rows


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.doc_only:
        doc.write(RESULTS, REPO / "docs" / "benchmarks.md")
        print("wrote docs/benchmarks.md", file=sys.stderr)
        return 0
    rows = select(a)
    if a.list:
        for r in rows:
            print(f"{r.id:28} {'quick ' if r.quick else '      '}{r.group:8} {r.label}")
        return 0
    if not rows:
        print("no rows selected (see --list)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(
            "python -m benchmarks needs root: the lab builds network namespaces and mounts",
            file=sys.stderr,
        )
        return 2
    command = "python -m benchmarks" + (
        ""
        if argv is None and len(sys.argv) <= 1
        else " " + shlex.join(sys.argv[1:] if argv is None else argv)
    )
    kinds = tuple(sorted({r.payload for r in rows if r.payload}))
    load_start = runner.loadavg()
    log(
        f"{len(rows)} rows, {a.repeat} timed round(s) after a warm-up; "
        f"budget {a.budget_min:.0f} min; load {' '.join(map(str, load_start))}"
    )
    env = Env(kinds=kinds)
    try:
        env.start(install=not a.no_install)
        mach = machine.describe()
        if a.shape:
            env.shape(a.shape)
            log(f"links shaped: {a.shape}")
        run = runner.run(
            env, rows, repeat=a.repeat, budget_s=a.budget_min * 60, light_warmup=a.quick
        )
    finally:
        env.stop()
    result = {
        "schema": 1,
        "command": command,
        "quick": a.quick,
        "repeat": a.repeat,
        "shape": a.shape,
        "machine": mach,
        "load_start": load_start,
        "load_end": runner.loadavg(),
        "scratch": f"{env.scratch_mib // 1024} GiB sparse image in /var/tmp",
        "payloads": {k: {**asdict(v), "root": str(v.root)} for k, v in env.payloads.items()},
        "run": run,
        "records": run["records"],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(report.render_result(result))
    if not a.no_doc:
        RESULTS.mkdir(exist_ok=True)
        tag = a.tag or ("partial" if a.only else "quick" if a.quick else "full") + (
            f"-{a.shape.replace(',', '-')}" if a.shape else ""
        )
        out = RESULTS / f"{tag}.json"
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        doc.write(RESULTS, REPO / "docs" / "benchmarks.md")
        log(f"wrote {out.relative_to(REPO)} and docs/benchmarks.md")
    failed = [r["id"] for r in run["records"] if report.stats(r)["failed"] and not r["skipped"]]
    if failed:
        log(f"rows with failed runs: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
