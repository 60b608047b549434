"""How fast each compressor packs this tree, on the host that will pack it (`compression: auto`).

    rbkit measure ROOT --tool lz4 --tool zstd [--exclude PAT]... [--bytes N] [--seconds S]
                       [--link RATE [--shared-cpu] [--jobs J]]

reads a sample of the tree's files (spread over the whole tree by size: every file's chance is its
bytes, at most 1 MiB of each, N bytes in all, rbrules.common.MEASURE_SAMPLE by default) into
memory, packs it with each tool exactly as the stream packs (rbrules.common.COMPRESSION's `pack`
words: `zstd -1 -T0` uses every core, as the stream's does) and unpacks what it packed, and prints one JSON line: the sample's size, and
per tool the rate it read the sample at (bytes a second, wall), the bytes per CPU second packing
and unpacking (the child's rusage: what the tool takes from CPUs it shares) and the ratio (sample
bytes / packed bytes). A tool that is missing or fails is said with its reason, never measured.
Bounded: the walk stops after 200,000 entries, each tool after S seconds (default 5). With
--link (the relay's rate, rb::measure_link) it prints the choice instead (`through`, `choose`);
`--link -` reads that rate from stdin (`RATE SECONDS IDLE`, or `error WHY`): the sample is walked,
read and packed while the link is measured, unless --shared-cpu (then all that waits for the
line: it would take the CPUs the ssh ciphers are measured on).

    rbkit measure-link

is the link measurement's receiving end (`receive_link`): it says `ready`, times the zeros that
come on stdin and prints `RATE SECONDS IDLE` (IDLE: how many CPUs of this kernel were idle
meanwhile, or -) as soon as the rate is stable (rbrules.common.link_stable), at most
LINK_SECONDS after the first byte; closing stdin then ends the sending end (SIGPIPE).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rbrules.common import (COMPRESSION, LINK_SECONDS, LINK_WINDOW, MEASURE_SAMPLE, link_stable,
                            link_tail, stream_count)

MAX_ENTRIES = 200_000
PER_FILE = 1 << 20


def _files(root: str, excludes: List[str]) -> List[Tuple[str, int]]:
    """(path, size) of the regular files under root the excludes leave, up to MAX_ENTRIES entries
    seen, in walk order; links are not followed."""
    out: List[Tuple[str, int]] = []
    seen = 0
    todo = [root]
    while todo and seen < MAX_ENTRIES:
        here = todo.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            seen += 1
            if any(fnmatch.fnmatch(e.name, p) for p in excludes):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(e.path)
            elif stat.S_ISREG(st.st_mode) and st.st_size > 0:
                out.append((e.path, st.st_size))
    return out


def sample(root: str, excludes: List[str], want: int = MEASURE_SAMPLE) -> bytes:
    """About `want` bytes of the tree: files picked at even steps of the tree's cumulative size
    (a big file is picked as often as its bytes say), at most PER_FILE of each."""
    files = _files(root, excludes)
    total = sum(size for _p, size in files)
    if not files or total == 0:
        return b""
    picks = max(1, want // (128 << 10))
    step = max(1, total // picks)
    parts: List[bytes] = []
    have, at, mark = 0, 0, 0
    for path, size in files:
        at += size
        if at < mark:
            continue
        mark = at + step
        try:
            # the file the walk saw, never a link put in its place since (read as root)
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as f:
                data = f.read(min(PER_FILE, want - have))
        except OSError:
            continue
        parts.append(data)
        have += len(data)
        if have >= want:
            break
    return b"".join(parts)


def _run(words: List[str], data: bytes, seconds: float) -> Tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the child, the run) of `words` reading `data`."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(words, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=seconds, check=False, cwd="/")
    took = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu, done


def rate(tool: str, data: bytes, seconds: float) -> Dict[str, Any]:
    """{"rate": bytes/s read (wall), "cpu_rate": bytes per CPU second packing, "unpack_cpu_rate":
    bytes (unpacked) per CPU second unpacking, "ratio": in/out} of `tool` on `data`, or
    {"error": why}. The tool's own start (timed on one byte first) is not counted: the stream
    starts it once."""
    words = COMPRESSION[tool]["pack"]
    if shutil.which(words[0]) is None:
        return {"error": "%s is not installed here" % words[0]}
    try:
        start_s, start_cpu, _ = _run(words, b"\0", seconds)
        took, cpu, done = _run(words, data, seconds)
        if done.returncode == 0 and done.stdout:
            _s, un_cpu, undone = _run(COMPRESSION[tool]["unpack"], done.stdout, seconds)
    except subprocess.TimeoutExpired:
        return {"error": "%s took more than %ss for %d bytes" % (words[0], seconds, len(data))}
    took = max(took - start_s, 1e-3)
    if done.returncode != 0 or not done.stdout:
        return {"error": "%s exited %d: %s" % (words[0], done.returncode,
                                               done.stderr.decode("utf-8", "replace")[-200:])}
    cpu = max(cpu - start_cpu, 1e-3)
    out = {"rate": int(len(data) / took), "cpu_rate": int(len(data) / cpu),
           "ratio": round(len(data) / len(done.stdout), 3), "seconds": round(took, 4)}
    if undone.returncode == 0 and len(undone.stdout) == len(data):
        out["unpack_cpu_rate"] = int(len(data) / max(un_cpu - start_cpu, 1e-3))
    return out


def cpu_times() -> Optional[Tuple[int, int]]:
    """(idle, total) jiffies of every CPU of this kernel (/proc/stat's `cpu` line: idle and
    iowait count as idle), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            words = f.readline().split()
    except OSError:
        return None
    if words[:1] != [b"cpu"] or len(words) < 6:
        return None
    ticks = [int(w) for w in words[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


def idle_cpus(before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]]) -> Optional[float]:
    """How many of this kernel's CPUs were idle, on average, between two cpu_times."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1), 2)


def receive_link(fd: int = 0, cap: float = float(LINK_SECONDS),
                 clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """The link's rate where the zeros arrive: `ready` on stdout, then read fd, timed from the end
    of the first read, in LINK_WINDOW windows, until the rate is stable (link_stable), `cap`
    seconds went by or the stream ended. {"rate": bytes a second over link_tail's windows,
    "seconds", "bytes", "stable"}, or {"error": why} when it saw less than one window."""
    os.write(1, b"ready\n")
    if not os.read(fd, 1 << 20):
        return {"error": "no byte came"}
    start = now = clock()
    cpu_start = cpu_times()
    total = 0
    ends: List[Tuple[float, int]] = [(start, 0)]      # (time, bytes so far) at each window's end
    windows: List[float] = []
    stable = False
    while now - start < cap:
        chunk = os.read(fd, 1 << 20)
        now = clock()
        if not chunk:
            break
        total += len(chunk)
        if now - ends[-1][0] >= LINK_WINDOW:
            windows.append((total - ends[-1][1]) / (now - ends[-1][0]))
            ends.append((now, total))
            if link_stable(windows, now - start):
                stable = True
                break
    seconds = now - start
    if not windows:
        return {"error": "only %d bytes in %.3f s" % (total, seconds)}
    (t0, b0), (t1, b1) = ends[len(windows) - len(link_tail(windows))], ends[-1]
    # the CPUs the link left idle (one kernel: the ciphers of both legs and this reader are on
    # them): what compressing on the same machine can use beside the link (through)
    return {"rate": int((b1 - b0) / (t1 - t0)), "seconds": round(seconds, 3), "bytes": total,
            "stable": stable, "idle_cpus": idle_cpus(cpu_start, cpu_times())}


def read_link(line: str) -> Tuple[int, float, str, Optional[float]]:
    """(rate, seconds, "", idle CPUs or None) from rb::measure_link's line on stdin (`RATE
    SECONDS [IDLE|-]`), or (0, 0.0, why, None) from `error WHY` or anything else."""
    words = line.split()
    if len(words) in (2, 3) and words[0].isdigit():
        try:
            idle = float(words[2]) if len(words) == 3 and words[2] != "-" else None
            return int(words[0]), float(words[1]), "", idle
        except ValueError:
            pass
    return 0, 0.0, " ".join(words[1:]) if words[:1] == ["error"] else "no link rate", None


MARGIN = 1.1      # a compressor is taken when it is this much faster through than none
SMALL = 1 << 20   # a tree whose sample is smaller moves in a moment whatever its compression


def mb(rate: float) -> str:
    return "%d MB/s" % round(rate / 1e6)


def through(link: int, m: Dict[str, Any], shared: bool, streams: int = 1, cpus: float = 1
            ) -> float:
    """Bytes of the tree a second that `m` (a tool's figures) moves over a link of `link` bytes a
    second. Machines of their own (the stages side by side): the slowest of the link (its bytes
    are the tree's over the ratio), the packing on the source (one packer a stream) and the
    unpacking on the destination. One kernel (every machine of the stream on the same CPUs: the
    link's rate was measured with the ssh ciphers taking those CPUs): the link's time for the
    packed bytes plus the CPU time packing and unpacking them, spread over `cpus` (the run's
    jobs: the stages are processes side by side), and never faster than its slowest stage alone.
    With one CPU that is the stages taking turns: the lab's 1 Gbit/s link (2 cores), measured at
    118-125 MB/s once the measurement left out its slow start, then gave none (lz4 135 MB/s
    through, short of the margin): transfers of 8.1-8.4 s against 5.4-5.8 s with lz4."""
    moved = link * float(m["ratio"])
    pack = float(m.get("cpu_rate") or m["rate"])
    unpack = float(m.get("unpack_cpu_rate") or 0)
    if shared:
        turns = 1.0 / moved + 1.0 / pack + (1.0 / unpack if unpack else 0.0)
        alone = max(1.0 / moved, 1.0 / pack, 1.0 / unpack if unpack else 0.0)
        return 1.0 / max(alone, turns / max(1, cpus))
    rates = [moved, float(m["rate"]) * max(1, streams)] + ([unpack * streams] if unpack else [])
    return min(rates)


def choose(link: int, tools: Dict[str, Dict[str, Any]], shared: bool = False,
           streams: int = 1, cpus: float = 1) -> Tuple[str, str]:
    """(the compression to use, the reason in words) for a link of `link` bytes a second and the
    measured tools (rbkit measure's figures; `through` says how fast each moves the tree), in
    `streams` streams side by side, on `cpus` (the run's jobs). The fastest, when it beats none
    by MARGIN, else none."""
    best, best_rate, said = "none", float(link), []
    for tool, m in tools.items():
        if "rate" not in m:
            said.append("%s: %s" % (tool, m.get("error", "not measured")))
            continue
        rate_ = through(link, m, shared, streams, cpus)
        said.append("%s %s on this tree (ratio %.1f%s): %s through" % (
            tool, mb(m.get("cpu_rate") or m["rate"]), m["ratio"],
            ", unpacked at %s" % mb(m["unpack_cpu_rate"]) if m.get("unpack_cpu_rate") else "",
            mb(rate_)))
        if rate_ > best_rate * (MARGIN if best == "none" else 1.0):
            best, best_rate = tool, rate_
    why = "link %s%s; %s: %s" % (
        mb(link), " (one kernel: the compressor shares its CPUs)" if shared else "",
        "; ".join(said) if said else "no compressor to try", best)
    if best == "none":
        why += ", the link is as fast as any compressor"
    return best, why


def measure(root: str, tools: List[str], excludes: List[str], want: int = MEASURE_SAMPLE,
            seconds: float = 5.0, before: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """The sample's figures and each tool's (rate); `before`, when given, is called first (the
    link's rate read, where the walk and the tools would take the CPUs its ssh ciphers are
    measured on)."""
    if before is not None:
        before()
    start = time.monotonic()
    data = sample(root, excludes, want)
    doc: Dict[str, Any] = {"sample_bytes": len(data),
                           "read_seconds": round(time.monotonic() - start, 4), "tools": {}}
    if not data:
        doc["error"] = "no file to sample under %s" % root
        return doc
    for tool in tools:
        if tool not in COMPRESSION or tool == "none":
            doc["tools"][tool] = {"error": "not a compressor the stream knows"}
            continue
        doc["tools"][tool] = rate(tool, data, seconds)
    return doc


def main_lines(doc: Dict[str, Any], link: int, shared: bool = False, jobs: int = 1,
               no_link: str = "no link rate", idle: Optional[float] = None) -> List[str]:
    """What `rbkit measure --link RATE` prints for the runbook: `choice TOOL`, `why TEXT` and the
    figures as one `json` line (tab-separated); `no_link`: why there is no rate (link 0); `idle`:
    the CPUs the link left idle while it was measured (one kernel), kept in the figures."""
    import json
    if doc.get("error") or link <= 0:
        return ["error\t%s" % (doc.get("error") or no_link)]
    if doc["sample_bytes"] < SMALL:
        choice, why = "none", "link %s; the tree is %d KB: nothing worth packing" % (
            mb(link), doc["sample_bytes"] // 1024)
    else:
        choice, why = choose(link, doc["tools"], shared, stream_count(jobs), jobs)
    # recorded, not yet used: counting only the CPUs the link left idle took none on the capped
    # 1 Gbit/s lab link in one run of two (the source's scan runs beside the measurement and
    # takes CPU the transfer has to itself later: transfer 11.1 s against 7.2 s with lz4)
    doc = dict(doc, link_rate=link, choice=choice, jobs=jobs, link_idle_cpus=idle)
    return ["choice\t" + choice, "why\t" + why, "json\t" + json.dumps(doc, sort_keys=True)]
