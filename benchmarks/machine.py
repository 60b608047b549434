"""What machine the numbers came from: CPU, memory, kernel, tool versions, disks, load."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _first_line(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    out = (r.stdout or r.stderr).strip().splitlines()
    return out[0].strip() if out else "?"


def _version(argv: list[str]) -> str:
    """The first version number a tool prints about itself, e.g. "rsync 3.2.7"."""
    line = _first_line(argv)
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?(?:p\d+)?)", line)
    return f"{argv[0]} {m.group(1)}" if m and line != "not installed" else f"{argv[0]}: {line}"


def _git() -> str:
    """The commit measured, and whether the working tree had uncommitted changes (read-only git)."""
    head = _first_line(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"])
    try:
        r = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "compiler",
                "templates",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        dirty = sorted(
            {
                ln[3:].split("/")[0] + "/" + (ln[3:].split("/")[1] if "/" in ln[3:] else "")
                for ln in r.stdout.splitlines()
                if ln.strip()
            }
        )
    except (OSError, subprocess.TimeoutExpired):
        dirty = []
    return head + (
        f" + uncommitted changes in {len(dirty)} compiler/template paths" if dirty else ""
    )


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _mem_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return 0.0


def _root_fs() -> str:
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype, opts = line.split()[:4]
            if mnt == "/":
                name = os.path.basename(dev)
                try:
                    journals = os.listdir("/proc/fs/jbd2")
                except OSError:
                    return f"{fstype} on {dev}"
                has = any(j.startswith(f"{name}-") for j in journals)
                return f"{fstype} on {dev}, {'with' if has else 'no'} journal (/proc/fs/jbd2)"
    return "?"


def describe() -> dict:
    flags = open("/proc/cpuinfo").read()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "cpu_flags": " ".join(
            f
            for f in ("aes", "sha_ni", "avx2", "avx512f", "vaes")
            if f" {f} " in flags or f" {f}\n" in flags
        ),
        "mem_gib": round(_mem_gib(), 1),
        "kernel": platform.release(),
        "ssh": _first_line(["ssh", "-V"]),
        "tools": ", ".join(
            _version(a)
            for a in (
                ["tar", "--version"],
                ["rsync", "--version"],
                ["zstd", "--version"],
                ["lz4", "--version"],
                ["pv", "--version"],
                ["b3sum", "--version"],
                ["xxh128sum", "--version"],
            )
        ),
        "git": _git(),
        "python": platform.python_version(),
        "root_fs": _root_fs(),
    }
