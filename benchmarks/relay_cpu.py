"""CPU seconds by process kind: the runbook's relay against the hand lz4 pipeline (issue 37).

    python -m benchmarks.relay_cpu [--shape 1gbit] [--rounds 3] [--rows runbook,hand] [--out FILE]

Builds the bench (benchmarks.env.Env: the lab's src and dst, the torch payload, the ext4 scratch
disk), shapes the links, then runs each row once a round, alternating: `runbook.relay.auto` (the
row of `python -m benchmarks`) and the hand pipeline `peer.seed.aes.lz4`. While a row runs, /proc
is sampled every 0.1 s and each process's new user+system ticks are charged to its machine and
kind (ssh, sshd, tar, lz4, zstd, python by the kit's command, bash, other). Only the row's
processes count: those of three cgroup v1 cpuacct groups, here (the row's command and all it
starts, the ssh masters that leave their parent included), src and dst (the lab's two sshds moved
into theirs, their sessions follow), so other work on the machine is not charged. The groups give
exact totals per machine; the samples' coverage is sampled / exact (a process that ends loses its
last interval; one that starts and ends between two samples is missed). For the runbook, the
transfer step is the window from the first sample of `engine relay` to the last of the stream's
and the source hash's processes.

Load-robust: CPU seconds do not stretch with other work the way wall time does (caches and
frequency aside); `uptime`'s load is printed with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CG = Path("/sys/fs/cgroup/cpuacct")
STREAM_KINDS = ("py engine relay", "py engine send", "py engine receive", "py engine hash")


def kind(argv: list[str]) -> str:
    if not argv:
        return "(ended)"
    name = os.path.basename(argv[0])
    if argv[0].startswith("ssh:"):
        return "ssh master"
    if name.startswith("python"):
        if "engine" in argv:
            i = argv.index("engine")
            return "py engine " + (argv[i + 1] if i + 1 < len(argv) else "?")
        if "rbkit" in argv:
            i = argv.index("rbkit")
            return "py rbkit " + (argv[i + 1] if i + 1 < len(argv) else "?")
        return "py other"
    if name.startswith("sshd"):
        return "sshd"
    if name in ("ssh", "tar", "lz4", "zstd", "bash", "sh", "cat", "head", "sync"):
        return name
    return "other (%s)" % name[:12]


def _stat(pid: str) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _argv(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class Sampler:
    """Charges the ticks of every process in the cpuacct groups (here, src, dst: what the row
    started, the ssh masters that left their parent, the hosts' sshd sessions) to "MACHINE kind",
    each tick's deltas kept with its time (windows cut later)."""

    def __init__(self, groups: "Groups", every: float = 0.1) -> None:
        self.groups, self.every = groups, every
        self.ours: dict[str, tuple[str, int]] = {}  # pid -> (kind, ticks so far)
        self.events: list[tuple[float, str, int]] = []
        self.seen: dict[str, list[float]] = {}  # kind -> [first, last] time seen
        self._stop = threading.Event()

    def start(self) -> None:
        for machine, pid in self.groups.procs():  # what runs before: only its ticks from now
            s = _stat(pid)
            if s is not None:
                self.ours[pid] = (f"{machine} {kind(_argv(pid))}", s[1])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        now = time.time()
        for machine, pid in self.groups.procs():
            s = _stat(pid)
            if s is None:
                continue
            t = s[1]
            k, last = self.ours.get(pid, ("", 0))
            if not k or " py" in k or k.endswith((" bash", " sh", " ")):
                k = f"{machine} {kind(_argv(pid))}"  # after an exec: its new kind
            if t > last:
                self.events.append((now, k, t - last))
            self.ours[pid] = (k, t)
            w = self.seen.setdefault(k.split(" ", 1)[1], [now, now])
            w[1] = now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._tick()

    def stop(self) -> None:
        self._tick()
        self._stop.set()
        self.thread.join()

    def sums(self, lo: float = 0.0, hi: float = 1e18) -> dict[str, float]:
        out: dict[str, float] = {}
        for t, k, d in self.events:
            if lo <= t <= hi:
                out[k] = out.get(k, 0.0) + d / TICK
        return out


class Groups:
    """cpuacct groups here/src/dst: exact CPU seconds per machine."""

    def __init__(self, lab) -> None:
        self.dirs = {}
        for name in ("here", "src", "dst"):
            d = CG / f"rbcpu-{os.getpid()}-{name}"
            d.mkdir(exist_ok=True)
            self.dirs[name] = d
        for name in ("src", "dst"):
            from tests.lab import netns_pids

            for pid in netns_pids(lab.host(name).netns):
                self._move(pid, self.dirs[name])

    def _move(self, pid: int, d: Path) -> None:
        try:
            (d / "tasks").write_text(str(pid))
        except OSError:
            pass

    def procs(self) -> list[tuple[str, str]]:
        out = []
        for name, d in self.dirs.items():
            try:
                out += [(name, pid) for pid in (d / "cgroup.procs").read_text().split()]
            except OSError:
                pass
        return out

    def usage(self) -> dict[str, float]:
        return {k: int((d / "cpuacct.usage").read_text()) / 1e9 for k, d in self.dirs.items()}

    def close(self) -> None:
        for d in self.dirs.values():
            try:
                for pid in (d / "tasks").read_text().split():
                    self._move(int(pid), CG)
                d.rmdir()
            except OSError:
                pass


def run_one(env, groups: Groups, argv: list[str], envv: dict[str, str], cwd: Path | None) -> dict:
    here = str(groups.dirs["here"] / "tasks")
    before = groups.usage()
    load = os.getloadavg()[0]
    sampler = Sampler(groups)

    def enter() -> None:
        with open(here, "w") as f:
            f.write(str(os.getpid()))

    t0 = time.time()
    p = subprocess.Popen(
        argv,
        env=envv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=enter,
    )
    sampler.start()
    out, err = p.communicate(timeout=600)
    wall = time.time() - t0
    sampler.stop()
    time.sleep(0.3)  # the far ends' sessions end after the clients
    after = groups.usage()
    exact = {k: after[k] - before[k] for k in after}
    res = {
        "rc": p.returncode,
        "wall": wall,
        "load": load,
        "exact": exact,
        "all": sampler.sums(),
        "err": err.decode(errors="replace")[-2000:],
    }
    starts = [sampler.seen[k][0] for k in STREAM_KINDS[:1] if k in sampler.seen]
    ends = [sampler.seen[k][1] for k in STREAM_KINDS if k in sampler.seen]
    if starts and ends:
        lo, hi = starts[0] - 0.1, max(ends)
        res["transfer_window"] = hi - lo
        res["transfer"] = sampler.sums(lo, hi)
        res["before"] = sampler.sums(0, lo)
        res["after"] = sampler.sums(hi + 1e-6)
        res["timeline"] = {
            k: [round(a - t0, 2), round(b - t0, 2)] for k, (a, b) in sampler.seen.items()
        }
    return res


TRACE = (
    "exec 7>\"$2\"; BASH_XTRACEFD=7; PS4='+ ${EPOCHREALTIME} ${FUNCNAME[0]:-main} '; "
    'source "$1"; set -x; main'
)


def phases(path: Path) -> list[tuple[str, float]]:
    """(command, seconds) of each command step_preflight ran itself, from the xtrace file: the
    time from its line to the next line of step_preflight (the last: to step_manifest's first)."""
    marks: list[tuple[float, str, str]] = []
    for line in path.read_text(errors="replace").splitlines():
        words = line.split(" ", 3)
        if len(words) < 4 or not words[0].startswith("+"):
            continue
        try:
            t = float(words[1])
        except ValueError:
            continue
        if words[0] == "+" and words[2] in ("step_preflight", "step_manifest"):
            marks.append((t, words[2], words[3][:70]))
    out = []
    for (t, fn, cmd), nxt in zip(marks, marks[1:]):
        if fn == "step_preflight":
            out.append((cmd, nxt[0] - t))
    return out


def compile_in(checkout: str, row, env) -> Path:
    """The row's runbook compiled by the compiler of another checkout (its templates, its kit:
    the kit's packages are found on sys.path, where this checkout's editable install puts its
    own hostkit/ unless the other's comes first)."""
    if row.script is None:
        d = env.work / row.id
        d.mkdir(parents=True, exist_ok=True)
        (d / "bench.yaml").write_text(row.spec(env))
        subprocess.run(
            [sys.executable, "-m", "compiler", str(d / "bench.yaml"), "-o", str(d)],
            cwd=checkout,
            check=True,
            stdout=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=f"{checkout}:{checkout}/hostkit"),
        )
        row.script = d / "bench.sh"
    return row.script


def table(runs: list[dict], part: str) -> list[str]:
    kinds: dict[str, list[float]] = {}
    for r in runs:
        for k in r.get(part, {}):
            kinds.setdefault(k, [])
    for k in kinds:
        kinds[k] = [r.get(part, {}).get(k, 0.0) for r in runs]
    rows = sorted(kinds.items(), key=lambda kv: -statistics.median(kv[1]))
    lines = [
        f"  {statistics.median(v):6.2f}  ({min(v):.2f}-{max(v):.2f})  {k}"
        for k, v in rows
        if max(v) >= 0.01
    ]
    tot = [sum(r.get(part, {}).values()) for r in runs]
    lines.append(
        f"  {statistics.median(tot):6.2f}  ({min(tot):.2f}-{max(tot):.2f})  = sampled total"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1gbit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="runbook,hand")
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--compression",
        default="auto",
        help="the runbook rows' compression (lz4: the same stream every round, "
        "whatever the load makes auto measure)",
    )
    ap.add_argument(
        "--base",
        default="",
        help="[NAME=]DIR,...: checkouts of other code; the row NAME (default base) "
        "is the runbook that checkout compiles",
    )
    ap.add_argument(
        "--trace",
        default="",
        help="DIR: run the runbook under xtrace (PS4 with "
        "EPOCHREALTIME and the function), a trace file a round there, and print "
        "the wall time of each command of step_preflight",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.env import Env, log
    from benchmarks.rows import AES, RunbookRow, Seed

    env = Env(kinds=("torch",)).start(install=False)
    groups = None
    results: dict[str, list[dict]] = {}
    try:
        if args.shape != "none":
            env.shape(args.shape)
        groups = Groups(env.lab)
        rb = RunbookRow("runbook.relay.auto", "runbook relay auto", compression=args.compression)
        others = {}
        for item in filter(None, args.base.split(",")):
            name, _, path = item.rpartition("=")
            name = name or "base"
            row = RunbookRow(
                f"{name}.relay.auto", f"{name} runbook relay", compression=args.compression
            )
            row.compile = lambda env, row=row, path=path: compile_in(path, row, env)
            row.setup(env)
            others[name] = row
        hand = Seed("peer.seed.aes.lz4", "hand aes128-gcm + lz4 -1", cipher=AES, comp="lz4")
        rb.setup(env)
        want = args.rows.split(",")
        for rnd in range(args.rounds + 1):  # round 0: the warm-up, not kept
            for name in want:
                row = rb if name == "runbook" else others.get(name, hand)
                row.prepare(env)
                if name != "hand":
                    script = row.compile(env)
                    run_dir = env.work / "runs" / row.dest_key
                    (run_dir / "report.json").unlink(missing_ok=True)
                    envv = dict(os.environ, RB_RUN_DIR=str(run_dir))
                    argv = ["bash", str(script)]
                    if args.trace:
                        tf = Path(args.trace) / f"trace.{rnd}"
                        argv = ["bash", "-c", TRACE, "trace", str(script), str(tf)]
                    res = run_one(env, groups, argv, envv, script.parent)
                    if args.trace:
                        res["phases"] = phases(tf)
                    rep = run_dir / "report.json"
                    if rep.exists():
                        doc = json.loads(rep.read_text())
                        res["steps"] = {s["id"]: s["duration_s"] for s in doc.get("steps", [])}
                        res["detail"] = {
                            s["id"]: str(s.get("detail", ""))[:120] for s in doc.get("steps", [])
                        }
                else:
                    res = run_one(
                        env,
                        groups,
                        ["bash", "-o", "pipefail", "-c", hand.command(env)],
                        dict(os.environ),
                        None,
                    )
                row.cleanup(env)
                exact = {k: round(v, 2) for k, v in res["exact"].items()}
                log(
                    f"round {rnd} {name}: rc {res['rc']} wall {res['wall']:.2f} s load "
                    f"{res['load']:.2f} exact {json.dumps(exact)} {res.get('steps', '')}"
                )
                if res["rc"] != 0:
                    log(res["err"])
                if rnd:
                    results.setdefault(name, []).append(res)
    finally:
        if groups is not None:
            groups.close()
        env.stop()
    for name, runs in results.items():
        print(
            f"== {name}: {len(runs)} runs, wall "
            + ", ".join(f"{r['wall']:.2f}" for r in runs)
            + "; load "
            + ", ".join(f"{r['load']:.2f}" for r in runs)
        )
        for m in ("here", "src", "dst"):
            v = [r["exact"][m] for r in runs]
            print(f"  exact cpu {m}: {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        tot = [sum(r["exact"].values()) for r in runs]
        print(f"  exact cpu total: {statistics.median(tot):.2f} ({min(tot):.2f}-{max(tot):.2f})")
        print(" whole run, sampled by kind:")
        print("\n".join(table(runs, "all")))
        if all("transfer" in r for r in runs):
            w = [r["transfer_window"] for r in runs]
            print(f" transfer window {statistics.median(w):.2f} s; by kind:")
            print("\n".join(table(runs, "transfer")))
            print(" before the transfer:")
            print("\n".join(table(runs, "before")))
            print(" after the transfer:")
            print("\n".join(table(runs, "after")))
        if runs and runs[0].get("timeline"):
            print(" when each kind was seen (s from the row's start; first round):")
            for k, (a, b) in sorted(runs[0]["timeline"].items(), key=lambda kv: kv[1]):
                print(f"  {a:6.2f} - {b:6.2f}  {k}")
        if runs and runs[0].get("phases"):
            print(" preflight, command by command (wall s, median of the rounds):")
            for i, (cmd, _) in enumerate(runs[0]["phases"]):
                v = [r["phases"][i][1] for r in runs if len(r.get("phases", [])) > i]
                if statistics.median(v) >= 0.005:
                    print(f"  {statistics.median(v):6.3f} ({min(v):.3f}-{max(v):.3f})  {cmd}")
        if runs and "steps" in runs[0]:
            for s in runs[0]["steps"]:
                v = [r["steps"].get(s, 0) for r in runs]
                print(
                    f"  step {s}: {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) "
                    f"{runs[0]['detail'].get(s, '')[:90]}"
                )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
