"""Which threads were busy while a row ran (issue 47: the one stream's limit), from /proc, every
--every seconds until SIGTERM or --most seconds (bounded), then one line a thread with a CPU
second or more, busiest first, to stdout:

    CPU-s  busy  peak  machine  comm  (the process's command line, its first words)

`busy` is the thread's CPU seconds over the time it was seen, `peak` its most over any one
--window seconds; `machine` the CPU set (--set NAME=LIST, e.g. src=0-3) of the CPU it last ran
on. A thread at a peak near 1.00 held one CPU: a stage that cannot go faster in one stream.

    python3 busy.py --set src=0-3 --set dst=4-7 --set here=8-11 >busy.txt & ... ; kill %1

stdlib only.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Dict, List, Tuple

TICK = os.sysconf("SC_CLK_TCK")


def cpu_list(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def read_tasks() -> Dict[Tuple[int, int], Tuple[str, float, int]]:
    """(pid, tid) -> (comm, CPU seconds, the CPU it last ran on) of every thread now."""
    out: Dict[Tuple[int, int], Tuple[str, float, int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir("/proc/%s/task" % pid)
        except OSError:
            continue
        for tid in tids:
            try:
                with open("/proc/%s/task/%s/stat" % (pid, tid), "rb") as fh:
                    raw = fh.read().decode("ascii", "replace")
            except OSError:
                continue
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2 :].split()
            # fields[0] is stat's third field (state): utime 14, stime 15, processor 39
            used = (int(fields[11]) + int(fields[12])) / TICK
            out[(int(pid), int(tid))] = (comm, used, int(fields[36]))
    return out


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode("utf-8", "replace") for w in words if w)[:90]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", action="append", default=[], help="NAME=CPU-LIST")
    parser.add_argument("--every", type=float, default=0.25)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--most", type=float, default=300.0)
    args = parser.parse_args()
    machine_of: Dict[int, str] = {}
    for item in args.set:
        name, _, cpus = item.partition("=")
        for cpu in cpu_list(cpus):
            machine_of[cpu] = name
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    first: Dict[Tuple[int, int], Tuple[float, float]] = {}  # task -> (when seen, its CPU then)
    history: Dict[Tuple[int, int], List[Tuple[float, float]]] = {}
    last: Dict[Tuple[int, int], Tuple[str, float, int, float]] = {}
    names: Dict[int, str] = {}
    start = time.monotonic()
    while not stop and time.monotonic() - start < args.most:
        now = time.monotonic()
        for key, (comm, used, cpu) in read_tasks().items():
            if key not in first:
                first[key] = (now, used)
                if key[0] not in names:
                    names[key[0]] = cmdline(key[0])
            history.setdefault(key, []).append((now, used))
            last[key] = (comm, used, cpu, now)
        time.sleep(args.every)
    rows = []
    for key, (comm, used, cpu, seen) in last.items():
        since, base = first[key]
        spent = used - base
        if spent < 1.0:
            continue
        points = history[key]
        peak = 0.0
        j = 0
        for i in range(len(points)):
            while points[i][0] - points[j][0] > args.window:
                j += 1
            took = points[i][0] - points[j][0]
            if took >= args.window * 0.75:
                peak = max(peak, (points[i][1] - points[j][1]) / took)
        busy = spent / max(seen - since, args.every)
        rows.append((spent, busy, peak, machine_of.get(cpu, "cpu%d" % cpu), comm, names[key[0]]))
    for spent, busy, peak, machine, comm, line in sorted(rows, reverse=True)[:25]:
        print("%6.2f  %4.2f  %4.2f  %-5s %-15s %s" % (spent, busy, peak, machine, comm, line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
