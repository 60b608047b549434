"""Time the probe step alone: per-check and total wall time of `rbprobes run` (issue #17).

Needs only the stdlib and the hostkit folder beside it (copy both to the GPU host and run it
there; no compiler, no jinja, no lab):

    python3 benchmarks/probe_time.py --python /opt/torch-moved/.venv/bin/python \\
        --env-file /opt/torch-moved/.venv.env.sh --config generated/h200.sh --rounds 3 --phases

--config takes a JSON file, a JSON string, or a runbook (generated/*.sh), whose
RB_PROBE_CONFIG line is read. The probe runs with --python (the venv's interpreter: the runbook
runs it with the moved venv's python) as `PYTHON -m rbprobes run`, hostkit/ on PYTHONPATH, in a
fresh process per round. Printed per round: each check's status, lane, start and end (seconds
from the probe's start, from the report's `schedule` when the runner writes one, else as if one
after the other) and duration; then the process's wall time and the runner's own. --phases adds
four processes that time the steps the serial checks share (python start, import torch, CUDA
init, the context, first matmul (cuBLAS), cuDNN, torch.distributed, the imports check's
modules), to tell where the first torch check's seconds go: two "plain", two "prewarm" (a thread
creates device 0's primary context through libcuda while torch imports; compare `ready_s`,
the time until cuDNN is loaded, to see what overlapping that would save). --json PATH writes
everything measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTKIT = os.path.join(os.path.dirname(HERE), "hostkit")

PHASES = r"""
import ctypes, json, sys, threading, time
t0, variant, mods = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
start = time.perf_counter()
out = {"variant": variant, "python_start_s": round(time.time() - t0, 3)}
def mark(name, fn):
    s = time.perf_counter()
    try:
        fn()
        out[name + "_s"] = round(time.perf_counter() - s, 3)
    except Exception as exc:
        out[name + "_error"] = "%s: %s" % (type(exc).__name__, exc)
def prewarm():  # the driver and device 0's primary context, through libcuda, GIL released
    s = time.perf_counter()
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = [cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
              cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)]
        out["prewarm_rc"] = rc
    except OSError as exc:
        out["prewarm_error"] = str(exc)
    out["prewarm_s"] = round(time.perf_counter() - s, 3)
if variant == "prewarm":
    threading.Thread(target=prewarm, daemon=True).start()
mark("import_torch", lambda: __import__("torch"))
import torch
if torch.cuda.is_available():
    mark("cuda_init", torch.cuda.init)
    def context():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    mark("context", context)
    def first_matmul():
        a = torch.ones((64, 64), device="cuda")
        (a @ a).sum().item()
    mark("first_matmul", first_matmul)
    mark("cudnn", torch.backends.cudnn.version)
else:
    out["cuda"] = "not available (torch %s)" % torch.__version__
out["ready_s"] = round(time.perf_counter() - start, 3)
mark("import_torch_distributed", lambda: __import__("torch.distributed"))
for mod in mods:
    mark("import_" + mod, lambda: __import__(mod))
print(json.dumps(out))
"""


def read_config(text: str) -> Dict[str, Any]:
    """A JSON file, a JSON string, or a runbook whose RB_PROBE_CONFIG='...' line holds one."""
    if os.path.exists(text):
        with open(text, encoding="utf-8") as fh:
            body = fh.read()
        # one key a line (compiler.plan.keyed): the quoted value spans lines
        m = re.search(r"^readonly RB_PROBE_CONFIG='(.*?)'$", body, re.M | re.S)
        if m:
            body = m.group(1).replace("'\\''", "'")
        return json.loads(body)
    return json.loads(text)


def with_env_file(argv: List[str], env_file: Optional[str]) -> List[str]:
    """argv run as the runbook's probe step runs it: the env file sourced by bash first."""
    if not env_file:
        return argv
    return ["bash", "-c", 'source "$1" && shift && exec "$@"', "rb", env_file] + argv


def one_round(
    python: str,
    config: Dict[str, Any],
    timeout_s: float,
    hostkit: str = HOSTKIT,
    env_file: Optional[str] = None,
) -> Dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = hostkit + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    tmp = tempfile.mkdtemp(prefix="probe-time-")
    path = os.path.join(tmp, "report.json")
    start = time.monotonic()
    argv = [python, "-m", "rbprobes", "run", "--config-json", "-", "--report", path]
    done = subprocess.run(
        with_env_file(argv, env_file),
        input=json.dumps(config),
        text=True,
        capture_output=True,
        env=env,
        timeout=timeout_s,
    )
    wall = time.monotonic() - start
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        sys.stderr.write(done.stderr)
        raise SystemExit("no report from the probe (exit %d)" % done.returncode) from exc
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.rmdir(tmp)
    sched = {s["id"]: s for s in doc.get("schedule") or []}
    rows, t = [], 0.0
    for c in doc["checks"]:
        s = sched.get(c["id"])
        if s:
            begin, end = s.get("start_s"), s.get("end_s")
        else:  # a runner without a schedule ran them one after the other
            begin, end = t, t + c["duration_s"]
            t = end
        rows.append(
            {
                "id": c["id"],
                "type": c["type"],
                "status": c["status"],
                "lane": (s or {}).get("lane", "-"),
                "start_s": begin,
                "end_s": end,
                "duration_s": c["duration_s"],
                "reason": c["reason"],
            }
        )
    return {
        "exit": done.returncode,
        "wall_s": round(wall, 3),
        "runner_s": doc.get("duration_s"),
        "checks": rows,
    }


def phases(
    python: str, variant: str, modules: List[str], timeout_s: float, env_file: Optional[str] = None
) -> Dict[str, Any]:
    argv = [python, "-c", PHASES, repr(time.time()), variant] + modules
    done = subprocess.run(
        with_env_file(argv, env_file), capture_output=True, text=True, timeout=timeout_s
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout)[-500:]}
    return json.loads(lines[-1])


def lane_spans(r: Dict[str, Any]) -> Dict[str, float]:
    """Each lane's last end (seconds from the probe's start): the serial lane's is the floor."""
    spans: Dict[str, float] = {}
    for c in r["checks"]:
        if c["end_s"] is not None:
            spans[c["lane"]] = max(spans.get(c["lane"], 0.0), c["end_s"])
    return spans


def print_round(n: int, r: Dict[str, Any]) -> None:
    spans = ", ".join("%s lane ends at %.2f s" % kv for kv in sorted(lane_spans(r).items()))
    print(
        "round %d: exit %d, wall %.2f s (runner %.2f s; %s)"
        % (n, r["exit"], r["wall_s"], r["runner_s"] or 0, spans)
    )
    width = max(len(c["id"]) for c in r["checks"]) if r["checks"] else 5
    print(
        "  %-*s  %-6s  %-12s %7s %7s %7s  %s"
        % (width, "check", "status", "lane", "start", "end", "secs", "detail")
    )
    for c in r["checks"]:
        print(
            "  %-*s  %-6s  %-12s %7s %7s %7.2f  %s"
            % (
                width,
                c["id"],
                c["status"],
                c["lane"][:12],
                "%.2f" % c["start_s"] if c["start_s"] is not None else "-",
                "%.2f" % c["end_s"] if c["end_s"] is not None else "-",
                c["duration_s"],
                " ".join(c["reason"].split())[:70],
            )
        )


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter to probe with (the venv's bin/python)",
    )
    ap.add_argument(
        "--config",
        required=True,
        help="a JSON file, a JSON string, or a runbook (its RB_PROBE_CONFIG)",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--hostkit",
        default=HOSTKIT,
        help="the folder holding rbprobes/ (default: ../hostkit beside this "
        "script); another kit, e.g. an older commit's, to compare",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also time import torch, CUDA init, cuBLAS, cuDNN in one process",
    )
    ap.add_argument(
        "--env-file",
        metavar="PATH",
        help="source this first, as the runbook does (its exports step writes "
        "DEST.env.sh, e.g. /opt/torch-moved/.venv.env.sh)",
    )
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--json", metavar="PATH", help="write what was measured here")
    a = ap.parse_args(argv)
    config = read_config(a.config)
    result: Dict[str, Any] = {
        "python": a.python,
        "hostkit": os.path.abspath(a.hostkit),
        "checks": [c.get("id") for c in config.get("checks", [])],
        "rounds": [],
    }
    for n in range(1, a.rounds + 1):
        r = one_round(a.python, config, a.timeout_s, os.path.abspath(a.hostkit), a.env_file)
        print_round(n, r)
        result["rounds"].append(r)
    walls = sorted(r["wall_s"] for r in result["rounds"])
    result["wall_median_s"] = walls[len(walls) // 2]
    print(
        "probe wall time: median %.2f s of %d round(s) (%s)"
        % (result["wall_median_s"], len(walls), ", ".join("%.2f" % w for w in walls))
    )
    if a.phases:
        mods = []
        for c in config.get("checks", []):
            if c.get("type") == "imports":
                mods += [
                    m
                    for m in (c.get("params") or {}).get("modules") or []
                    if m != "torch" and m not in mods
                ]
        result["phases"] = [
            phases(a.python, v, mods, a.timeout_s, a.env_file)
            for v in ("plain", "prewarm", "plain", "prewarm")
        ]
        for ph in result["phases"]:
            print("phases (one process): " + ", ".join("%s %s" % (k, v) for k, v in ph.items()))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
