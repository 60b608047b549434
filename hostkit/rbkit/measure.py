"""How fast each compressor packs this tree, on the host that will pack it (`compression: auto`).

    rbkit measure ROOT --tool lz4 --tool zstd [--exclude PAT]... [--bytes N] [--seconds S]
                       [--link RATE [--shared-cpu [--scanned NAMES.stat]] [--jobs J]]

reads a sample of the tree's files (spread over the whole tree by size: every file's chance is its
bytes, at most 1 MiB of each, N bytes in all, rbrules.common.MEASURE_SAMPLE by default) into
memory, packs it with each tool exactly as the stream packs (rbrules.common.COMPRESSION's `pack`
words: `zstd -1 -T0` uses every core, as the stream's does) and unpacks what it packed, and prints one JSON line: the sample's size, and
per tool the rate it read the sample at (bytes a second, wall), the bytes per CPU second packing
and unpacking (the child's rusage: what the tool takes from CPUs it shares) and the ratio (sample
bytes / packed bytes). A tool that is missing or fails is said with its reason, never measured.
Bounded: the walk stops after 200,000 entries, each tool after S seconds (default 5). With
--link (the relay's rate, rb::measure_link) it prints the choice instead (`through`, `choose`);
`--link -` reads that rate from stdin (rb::measure_link's line, or `error WHY`) once the tools
ran; with --shared-cpu (one kernel: the link was measured alone on the CPUs, after the source's
scan) it reads the line first, and runs no tool when the link had no CPU to spare (spare_cpu);
--scanned NAMES.stat: the scan's record, the sample's files without a second walk.

    rbkit measure-link [--watch PID:START]...

is the link measurement's receiving end (`receive_link`): it says `ready`, times the zeros that
come on stdin and prints `RATE SECONDS IDLE BYTES` (IDLE: how many CPUs of this kernel were idle
meanwhile, or -) as soon as the rate is stable (rbrules.common.link_stable), at most
LINK_SECONDS after the first byte; closing stdin then ends the sending end (SIGPIPE). With
--watch (the link's processes on this kernel: this machine's ssh masters) it adds their
`CPU WAIT WALL COUNT` (ns) over its later windows, and stops early when they show no CPU to
spare (rbrules.common.link_cpu_bound, after LINK_CPU_SECONDS).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rbrules.common import (COMPRESSION, LINK_CPU_SECONDS, LINK_SECONDS, LINK_WINDOW,
                            MEASURE_SAMPLE, link_cpu_bound, link_stable, link_tail, stream_count)

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


def _scanned(record: str, root: str, excludes: List[str]) -> Optional[List[Tuple[str, int]]]:
    """(path, size) of the regular files in this run's scan record (NAMES.stat: the source's scan
    wrote it, manifest.scan_header and a values_line an entry), in its walk's order; None when
    there is none or it is of another root or excludes (then the tree is walked)."""
    import json
    try:
        fd = os.open(record, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as f:
        head, _, body = f.read().partition(b"\n")
    try:
        said = json.loads(head)
        if (said.get("kind"), said.get("root"), said.get("excludes")) != ("rb-scan", root,
                                                                         list(excludes)):
            return None
        rows = json.loads(b"[" + b",".join(body.splitlines()) + b"]")
    except ValueError:
        return None
    return [(os.path.join(root, r[0]), r[3]) for r in rows if r[1] == "f" and r[3]]


def sample(root: str, excludes: List[str], want: int = MEASURE_SAMPLE,
           scanned: Optional[str] = None) -> bytes:
    """About `want` bytes of the tree: files picked at even steps of the tree's cumulative size
    (a big file is picked as often as its bytes say), at most PER_FILE of each; the files from
    the scan's record `scanned` where it is this tree's, else from a walk."""
    files = (_scanned(scanned, root, excludes) if scanned else None) or _files(root, excludes)
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


def watched(pairs: List[str]) -> List[int]:
    """The pids of `PID:START` words (this machine's ssh masters, on one kernel) that name the
    same process here (its start time, /proc/PID/stat's 22nd field, the same): none where one is
    gone or another (another pid namespace)."""
    pids = []
    for word in pairs:
        pid, _, start = word.partition(":")
        try:
            with open("/proc/%d/stat" % int(pid), "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[19] != start.encode():
                    return []
        except (OSError, ValueError, IndexError):
            return []
        pids.append(int(pid))
    return pids


def proc_times(pids: List[int]) -> Optional[Tuple[int, int]]:
    """(ns on a CPU, ns waiting for one) of `pids` so far, summed (/proc/PID/schedstat), or None."""
    cpu = waited = 0
    for pid in pids:
        try:
            with open("/proc/%d/schedstat" % pid, "rb") as f:
                words = f.read().split()
            cpu, waited = cpu + int(words[0]), waited + int(words[1])
        except (OSError, ValueError, IndexError):
            return None
    return cpu, waited


def receive_link(fd: int = 0, cap: float = float(LINK_SECONDS),
                 clock: Callable[[], float] = time.monotonic,
                 watch: Optional[List[int]] = None) -> Dict[str, Any]:
    """The link's rate where the zeros arrive: `ready` on stdout, then read fd, timed from the end
    of the first read, in LINK_WINDOW windows, until the rate is stable (link_stable), `cap`
    seconds went by or the stream ended; with `watch` (the link's processes, on one kernel), also
    once they had no CPU to spare over link_tail's windows (link_cpu_bound) past
    LINK_CPU_SECONDS. {"rate": bytes a second over link_tail's windows, "seconds", "bytes",
    "stable", "idle_cpus", and with `watch` "cpu" (ns on a CPU, ns waiting, ns, processes over
    those windows) and "cpu_bound"}, or {"error": why} when it saw less than one window."""
    os.write(1, b"ready\n")
    if not os.read(fd, 1 << 20):
        return {"error": "no byte came"}
    watch = watch or []
    start = now = clock()
    cpu_start = cpu_times()
    total = 0
    ends: List[Tuple[float, int]] = [(start, 0)]      # (time, bytes so far) at each window's end
    used: List[Optional[Tuple[int, int]]] = [proc_times(watch) if watch else None]
    windows: List[float] = []
    stable = bound = False
    while now - start < cap:
        chunk = os.read(fd, 1 << 20)
        now = clock()
        if not chunk:
            break
        total += len(chunk)
        if now - ends[-1][0] >= LINK_WINDOW:
            windows.append((total - ends[-1][1]) / (now - ends[-1][0]))
            ends.append((now, total))
            used.append(proc_times(watch) if watch else None)
            if link_stable(windows, now - start):
                stable = True
                break
            took = _tail_cpu(windows, ends, used, len(watch))
            moved = ends[-1][1] - ends[len(windows) - len(link_tail(windows))][1]
            if took and now - start >= LINK_CPU_SECONDS and len(windows) >= 4 and \
                    link_cpu_bound(took[0] / 1e9, took[1] / 1e9, took[2] / 1e9, took[3], moved):
                bound = True
                break
    seconds = now - start
    if not windows:
        return {"error": "only %d bytes in %.3f s" % (total, seconds)}
    (t0, b0), (t1, b1) = ends[len(windows) - len(link_tail(windows))], ends[-1]
    # the CPUs the link left idle (one kernel: the ciphers of both legs and this reader are on
    # them): recorded, not used
    got = {"rate": int((b1 - b0) / (t1 - t0)), "seconds": round(seconds, 3), "bytes": total,
           "stable": stable, "idle_cpus": idle_cpus(cpu_start, cpu_times())}
    took = _tail_cpu(windows, ends, used, len(watch))
    if took:
        got.update(cpu=took, cpu_bound=bound)
    return got


def _tail_cpu(windows: List[float], ends: List[Tuple[float, int]],
              used: List[Optional[Tuple[int, int]]], procs: int
              ) -> Optional[Tuple[int, int, int, int]]:
    """(ns on a CPU, ns waiting for one, ns, processes) of the watched processes over
    link_tail's windows, or None."""
    first = len(windows) - len(link_tail(windows))
    a, b = used[first], used[-1]
    if not procs or a is None or b is None or not windows:
        return None
    return b[0] - a[0], b[1] - a[1], int((ends[-1][0] - ends[first][0]) * 1e9), procs


def read_link(line: str) -> Tuple[int, float, str, Dict[str, Any]]:
    """(rate, seconds, "", what was seen beside the rate) from rb::measure_link's line on stdin
    (`RATE SECONDS IDLE BYTES` and this machine's ssh masters' `CPU_NS WAIT_NS WALL_NS COUNT` or
    `-`; IDLE `-` when unknown), or (0, 0.0, why, {}) from `error WHY` or anything else. Seen:
    idle_cpus, bytes, and here_cpu_s, here_wait_s, here_wall_s, here_procs when read."""
    words = line.split()
    if len(words) >= 2 and words[0].isdigit():
        try:
            seen: Dict[str, Any] = {"idle_cpus": None}
            if len(words) >= 3 and words[2] != "-":
                seen["idle_cpus"] = float(words[2])
            if len(words) >= 4:
                seen["bytes"] = int(words[3])
            if len(words) == 8:
                cpu, waited, wall, procs = (int(w) for w in words[4:8])
                seen.update(here_cpu_s=cpu / 1e9, here_wait_s=waited / 1e9,
                            here_wall_s=wall / 1e9, here_procs=procs)
            return int(words[0]), float(words[1]), "", seen
        except ValueError:
            pass
    return 0, 0.0, " ".join(words[1:]) if words[:1] == ["error"] else "no link rate", {}


def spare_cpu(link: int, seen: Dict[str, Any]) -> Optional[bool]:
    """Whether the link (`link` bytes a second) had CPU to spare (rbrules.common.link_cpu_bound
    on this machine's ssh masters' figures in `seen`, read_link's), or None where they were not
    read."""
    if "here_cpu_s" not in seen:
        return None
    return not link_cpu_bound(seen["here_cpu_s"], seen["here_wait_s"], seen["here_wall_s"],
                              seen["here_procs"], link * seen["here_wall_s"])


def said_cpu(seen: Dict[str, Any]) -> str:
    """The ssh masters' figures in words."""
    cpu, waited = seen["here_cpu_s"], seen["here_wait_s"]
    return "its ssh here busy %d%% of %.2f s, waiting for a CPU %.1fx their time on one" % (
        round(100 * (cpu + waited) / (seen["here_wall_s"] * seen["here_procs"])),
        seen["here_wall_s"], waited / cpu if cpu > 0 else 0.0)


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
            seconds: float = 5.0, scanned: Optional[str] = None) -> Dict[str, Any]:
    """The sample's figures and each tool's (rate)."""
    start = time.monotonic()
    data = sample(root, excludes, want, scanned)
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
               no_link: str = "no link rate", seen: Optional[Dict[str, Any]] = None) -> List[str]:
    """What `rbkit measure --link RATE` prints for the runbook: `choice TOOL`, `why TEXT` and the
    figures as one `json` line (tab-separated); `no_link`: why there is no rate (link 0); `seen`:
    what was seen beside the link's rate (read_link's), kept in the figures. On one kernel
    (`shared`) a link without CPU to spare (spare_cpu) is none, whatever the tools (not run)."""
    import json
    seen = seen or {}
    if link > 0 and shared and spare_cpu(link, seen) is False:
        choice, why = "none", "link %s (one kernel, no CPU to spare: %s): none, no compressor " \
            "tried" % (mb(link), said_cpu(seen))
    elif doc.get("error") or link <= 0:
        return ["error\t%s" % (doc.get("error") or no_link)]
    elif doc["sample_bytes"] < SMALL:
        choice, why = "none", "link %s; the tree is %d KB: nothing worth packing" % (
            mb(link), doc["sample_bytes"] // 1024)
    else:
        choice, why = choose(link, doc["tools"], shared, stream_count(jobs), jobs)
    # the CPUs the link left idle: recorded, not used (counting only those took none on the
    # capped 1 Gbit/s lab link in one run of two, the source's scan running beside the link then)
    doc = dict(doc, link_rate=link, choice=choice, jobs=jobs, link_idle_cpus=seen.get("idle_cpus"),
               link_seen=seen)
    return ["choice\t" + choice, "why\t" + why, "json\t" + json.dumps(doc, sort_keys=True)]
