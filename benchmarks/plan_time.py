"""Where the live plan's seconds go (issue 36, "Cost"). Needs root (the lab).

    python -m benchmarks.plan_time [--payload small|torch|many] [--src TREE] [--repeat 5]
                                   [--baseline DIR]

On the lab's two hosts (src cannot reach dst: the relay), a runbook of the payload (or of a copy
of --src TREE, e.g. a bigger stand-in venv on a tmpfs) is compiled; `plan-first`: `--plan` with no
destination yet (a first move), timed N times; then the runbook runs once (the install: its
preflight and manifest steps' seconds are the `cold preflight+manifest` row), then timed, N times
each:

- `plan-rerun`: `--plan` with nothing to send (the source is the tree the install recorded);
- `plan-changed`: `--plan` after one file of the source changed (a re-run's plan with one change);
- `preflight`: `--only preflight` (what the issue compares the plan with), on the re-run.

Each kind of `--plan` also runs once more (--traced N: N times, alternating) traced (bash
xtrace, `$EPOCHREALTIME` in PS4, into a file; the trace costs a little, so the phases are read
from the traced runs, medians, and the totals from the untraced ones): the seconds from the
runbook's start to the live plan, preparing the hosts (kit shipping), the route, the source scan
with the destination's state meanwhile, and the composition here.
Prints a table of medians (min-max); --json PATH writes every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compiler import cli
from tests.lab import Lab, build_payload, ensure_packages

HOST = """  {name}:
    ssh: root@{addr}
    identity_file: {identity}
    options: {{UserKnownHostsFile: {known_hosts}, GlobalKnownHostsFile: /dev/null}}
"""

# (phase, the first trace line that starts it): in the order the live plan reaches them
MARKS = (
    ("runbook start", r"^"),  # the kit unpacked here, the run's directories
    ("hosts prepared", r" rb::hosts_prepare "),  # ssh to each, the kit shipped (both at once)
    ("route, compression", r" rb::preflight_route"),
    ("dest state", r" rb::source_start "),  # the source's scan started, meanwhile
    ("scan's end", r" rb::source_finish "),
    ("scan fetched", r" cat \S+\.names\.stat"),
    ("compose", r" liveplan compose "),
    ("cleanup", r" rb::cleanup"),  # kits removed, ssh masters closed
)


def spec(lab: Lab, src: Path, dst: Path) -> str:
    hosts = "".join(
        HOST.format(
            name=n, addr=lab.host(n).addr, identity=lab.identity, known_hosts=lab.known_hosts
        )
        for n in ("src", "dst")
    )
    return (
        f"name: plancost\nhosts:\n{hosts}transfer:\n  from: src:{src}\n  to: dst:{dst}\n"
        "  route: relay\n  compression: auto\n  on_existing: replace\n"
        "  exclude: [__pycache__, '*.pyc']\n  jobs: 2\n"
        "checks:\n  - imports: [rb_payload]\n"
    )


def runbook(work: Path, script: Path, *args: str, trace: Path | None = None) -> float:
    argv = ["bash", str(script), *args]
    if trace is not None:
        traced = work / "traced.sh"
        text = script.read_text().split("\n", 1)
        # set after the shebang: PS4 is not taken from the environment when root
        traced.write_text(
            text[0]
            + "\nexec {RB_TRACE_FD}>>"
            + str(trace)
            + "; BASH_XTRACEFD=${RB_TRACE_FD}; PS4='+${EPOCHREALTIME} '; set -x\n"
            + text[1]
        )
        argv = ["bash", str(traced), *args, "--allow-edited"]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(
            f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}"
        )
    return took


def phases(trace: Path) -> dict[str, float]:
    """Seconds of each phase of MARKS, from the trace's first line to its last."""
    stamps: list[tuple[float, str]] = []
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"^\++(\d+\.\d+) (.*)$", line)
        if m:
            stamps.append((float(m.group(1)), m.group(2)))
    if not stamps:
        return {}
    at: dict[str, float] = {}
    i = 0
    for name, pattern in MARKS:
        while i < len(stamps) and not re.search(pattern, " " + stamps[i][1]):
            i += 1
        if i < len(stamps):
            at[name] = stamps[i][0]
    names = [n for n, _ in MARKS if n in at]
    out = {}
    for a, b in zip(names, names[1:] + ["end"]):
        out[a] = round((at[b] if b in at else stamps[-1][0]) - at[a], 3)
    return out


def traced(work: Path, scripts: dict, names: list, kind: str, times: int, out: dict) -> None:
    """`--plan` traced `times` times, the runbooks alternating: each phase's median into out."""
    got: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(times):
        for n in names:
            trace = work / n / f"{kind}-{i}.trace"
            runbook(work / n, scripts[n], "--plan", trace=trace)
            got[n].append(phases(trace))
    for n in names:
        keys = [k for k, _ in MARKS if all(k in ph for ph in got[n])]
        out[f"{n} {kind}"] = {k: round(statistics.median(ph[k] for ph in got[n]), 3) for k in keys}


def compile_in(work: Path, checkout: Path | None, standalone: bool = False) -> Path:
    """The runbook of work/plancost.yaml, compiled by this checkout's compiler or another's
    (standalone: compile --standalone, the kit embedded, as the device's runbook is)."""
    spec_path = work / "plancost.yaml"
    extra = ["--standalone"] if standalone else []
    if checkout is None:
        assert cli.main([str(spec_path), "-o", str(work)] + extra) == 0
    else:
        env = dict(os.environ, PYTHONPATH=f"{checkout}:{checkout}/hostkit")
        subprocess.run(
            [sys.executable, "-m", "compiler", str(spec_path), "-o", str(work)] + extra,
            cwd=checkout,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return work / "plancost.sh"


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.plan_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--payload", default="small", choices=("small", "torch", "many"))
    ap.add_argument("--src", type=Path, help="copy this venv as the source (not the payload)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also time the runbook another checkout compiles (e.g. `git archive "
        "COMMIT | tar -x -C DIR`), run by run alternating with this one's, so "
        "the machine's load hits both alike",
    )
    ap.add_argument(
        "--traced",
        type=int,
        default=1,
        metavar="N",
        help="trace each kind of plan N times (the phases: medians)",
    )
    ap.add_argument(
        "--standalone",
        action="store_true",
        help="compile the runbooks --standalone (the kit embedded, as on the device)",
    )
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install anything")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (the traces)")
    a = ap.parse_args()
    if not a.no_install:
        ensure_packages()
    payload = None if a.src else build_payload(a.payload)
    work = Path(tempfile.mkdtemp(prefix="rbplancost."))
    names = ["this"] + (["baseline"] if a.baseline else [])
    samples: dict[str, dict[str, list]] = {
        n: {
            "plan-first": [],
            "cold preflight+manifest": [],
            "plan-rerun": [],
            "preflight": [],
            "plan-changed": [],
        }
        for n in names
    }
    traces: dict[str, dict] = {}
    try:
        with Lab(("src", "dst"), prefix="rbplan") as lab:
            src = work / "src"
            subprocess.run(["cp", "-a", str(a.src or payload.venv), str(src)], check=True)
            scripts = {}
            for n in names:
                (work / n / "dst").mkdir(parents=True)
                (work / n / "plancost.yaml").write_text(spec(lab, src, work / n / "dst" / "venv"))
                scripts[n] = compile_in(
                    work / n, a.baseline if n == "baseline" else None, a.standalone
                )
                runbook(work / n, scripts[n], "--plan")  # warm-up
            for _ in range(a.repeat):
                for n in names:
                    samples[n]["plan-first"].append(runbook(work / n, scripts[n], "--plan"))
            traced(work, scripts, names, "plan-first", a.traced, traces)
            for n in names:
                runbook(
                    work / n, scripts[n], "--report", str(work / n / "cold.json")
                )  # the install
                steps = json.loads((work / n / "cold.json").read_text())["steps"]
                samples[n]["cold preflight+manifest"].append(
                    round(
                        sum(s["duration_s"] for s in steps if s["id"] in ("preflight", "manifest")),
                        3,
                    )
                )
                runbook(work / n, scripts[n], "--plan")  # warm-up
            for _ in range(a.repeat):
                for n in names:
                    samples[n]["plan-rerun"].append(runbook(work / n, scripts[n], "--plan"))
                    samples[n]["preflight"].append(
                        runbook(work / n, scripts[n], "--only", "preflight")
                    )
            traced(work, scripts, names, "plan-rerun", a.traced, traces)
            mod = next(src.glob("lib/python3*/site-packages/rb_payload/__init__.py"))
            with mod.open("a") as f:
                f.write("# changed for benchmarks.plan_time\n")
            for _ in range(a.repeat):
                for n in names:
                    samples[n]["plan-changed"].append(runbook(work / n, scripts[n], "--plan"))
            traced(work, scripts, names, "plan-changed", a.traced, traces)
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    what = f"source {a.src}" if a.src else f"payload {a.payload}"
    what += ", standalone" if a.standalone else ""
    print(f"{what}, {a.repeat} runs each, load {load:.1f} at the end")
    for n in names:
        for kind, got in samples[n].items():
            print(
                f"{n:8} {kind:13} {statistics.median(got):6.2f} s  ({min(got):.2f}-{max(got):.2f})"
            )
    for name, ph in traces.items():
        print(
            f"{name} (traced, median of {a.traced}): "
            + ", ".join(f"{k} {v:.2f}" for k, v in ph.items())
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "payload": str(a.src or a.payload),
                    "load": load,
                    "standalone": a.standalone,
                    "baseline": str(a.baseline or ""),
                    "samples": samples,
                    "phases": traces,
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
