"""`python -m tests.lab measure [--torch]`: time the lab's parts on this machine (root needed).

Prints one JSON object: lab start/stop for 2 and 3 hosts, ssh connect times (fresh and through a
multiplexed master), ext4 scratch mkfs+mount, and payload builds (into a fresh cache dir, so they
are real builds; the torch one only with --torch, it takes a minute or more). Every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .deps import ensure_packages
from .disk import Ext4Mount
from .netlab import Lab
from .payload import build_payload


def _median_ssh(lab: Lab, name: str, n: int, options: list[str]) -> float:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        lab.ssh(name, "true", options=options, check=True)
        times.append(time.monotonic() - t0)
    return round(statistics.median(times), 3)


def measure(torch: bool) -> dict[str, object]:
    ensure_packages()
    out: dict[str, object] = {}
    for hosts in (("src", "dst"), ("src", "dst", "jump")):
        starts, stops = [], []
        for _ in range(3):
            lab = Lab(hosts, prefix="rblmeas")
            lab.start()
            starts.append(lab.start_seconds or 0.0)
            if len(hosts) == 3 and not stops:
                out["ssh_connect_s_median_of_10"] = _median_ssh(lab, "src", 10, [])
                with tempfile.TemporaryDirectory(prefix="rblmux-") as d:
                    mux = [
                        "-o",
                        "ControlMaster=auto",
                        "-o",
                        f"ControlPath={d}/%C",
                        "-o",
                        "ControlPersist=30",
                    ]
                    lab.ssh("src", "true", options=mux, check=True)
                    out["ssh_mux_command_s_median_of_10"] = _median_ssh(lab, "src", 10, mux)
                    lab.ssh("src", "", options=[*mux, "-O", "exit"])
            t0 = time.monotonic()
            lab.stop()
            stops.append(time.monotonic() - t0)
        out[f"lab_start_s_{len(hosts)}_hosts"] = [round(s, 3) for s in starts]
        out[f"lab_stop_s_{len(hosts)}_hosts"] = [round(s, 3) for s in stops]
    t0 = time.monotonic()
    with Ext4Mount(8192):
        out["ext4_8gib_mkfs_mount_s"] = round(time.monotonic() - t0, 3)
    with tempfile.TemporaryDirectory(prefix="rblmeas-cache-", dir="/var/tmp") as cache:
        for kind in ("small", "many", *(("torch",) if torch else ())):
            p = build_payload(kind, cache_dir=Path(cache))
            out[f"payload_{kind}_build_s"] = round(p.build_seconds or 0.0, 2)
            du = subprocess.run(
                ["du", "-sm", str(p.venv)], capture_output=True, text=True, check=True
            )
            n = subprocess.run(["find", str(p.venv)], capture_output=True, text=True, check=True)
            out[f"payload_{kind}_mib_entries"] = [
                int(du.stdout.split()[0]),
                len(n.stdout.splitlines()),
            ]
            t0 = time.monotonic()
            build_payload(kind, cache_dir=Path(cache))
            out[f"payload_{kind}_cached_s"] = round(time.monotonic() - t0, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time the lab, ssh, the ext4 scratch and payload builds")
    m.add_argument("--torch", action="store_true", help="also build the torch payload (a minute+)")
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        print(json.dumps(measure(args.torch), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
