"""CPU time by process kind while a command runs (benchmarks/device_relay.sh, PROFILE=1).

    python3 cpu_sample.py OUT -- COMMAND...

Samples /proc every 0.2 s and charges each process's new user+system ticks to its kind: the
executable's name and, for python, the module or script it runs, for ssh/sshd the peer. A process
that starts and ends between two samples is missed; one that ends loses its last interval (the
table says the samples' coverage against the command's own children's total from os.times)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def kind(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    name = os.path.basename(argv[0])
    if name.startswith("python"):
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if "-m" in argv:
            i = argv.index("-m")
            rest = argv[i + 1 : i + 3]
        return "python " + " ".join(os.path.basename(a)[:24] for a in rest[:4])
    if name.startswith("sshd"):
        return argv[0][:40]
    if name == "ssh":
        return "ssh " + " ".join(a for a in argv[1:] if "@" in a and "openssh.com" not in a)[:40]
    if name in ("bash", "sh"):
        return name
    return name


def ticks(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return -1


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[3:]
    seen: dict[str, tuple[str, int]] = {}
    total: dict[str, int] = {}
    me = str(os.getpid())
    for pid in os.listdir("/proc"):  # what ran before the command: only its ticks from now
        if pid.isdigit():
            seen[pid] = ("-", max(ticks(pid), 0))
    t0 = time.monotonic()
    child = subprocess.Popen(cmd)
    while child.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            t = ticks(pid)
            if t < 0:
                continue
            k, last = seen.get(pid, ("", 0))
            if k == "-":
                k = "(running before) " + kind(pid)
            elif not k:
                k = kind(pid)
                if not k:
                    continue
            total[k] = total.get(k, 0) + t - last
            seen[pid] = (k, t)
        time.sleep(0.2)
    wall = time.monotonic() - t0
    c = os.times()
    with open(out, "w") as f:
        f.write(
            f"wall {wall:.2f} s; children's cpu (os.times) "
            f"{c.children_user + c.children_system:.2f} s; "
            f"sampled {sum(total.values()) / TICK:.2f} s "
            "(all processes; those running before the command marked)\n"
        )
        for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:40]:
            if v:
                f.write(f"{v / TICK:8.2f} s  {k}\n")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
