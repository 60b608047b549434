"""How fast each compressor packs this tree, on the host that will pack it (`compression: auto`).

    rbkit measure ROOT --tool lz4 --tool zstd [--exclude PAT]... [--bytes N] [--seconds S]
                       [--link RATE [--shared-cpu [--scanned NAMES.stat]] [--jobs J]
                        [--here-cpus TOKEN]]

reads a sample of the tree (sample_of: N bytes, rbrules.linkrate.MEASURE_SAMPLE by default, in
pieces spread evenly over the bytes of all its files, so each kind of file counts as much as it
weighs) into memory, packs it with each tool on one core (rbrules.compression.measured_words: lz4
-1, zstd -1 and -3 with -T1) and unpacks what it packed, and prints one JSON line: the sample's
size, the tree's, and per tool and level the rate it read the sample at (bytes a second, wall),
the bytes per CPU second packing and unpacking (the child's rusage) and the ratio (sample bytes /
packed bytes). A tool that is missing or fails is said with its reason, never measured.
Bounded: the walk stops after 200,000 entries, each tool after S seconds (default 5). With
--link (the relay's rate, rb::measure_link) it prints the choice instead: the move's model
(rbkit.model) of those figures, the link's, the relay's streams (the run's --jobs word) and the
CPUs each of the three machines may use (this host's, rbrules.cpus; the destination's from the
link's line; this machine's, --here-cpus); `--link -` reads that rate from stdin
(rb::measure_link's line, or `error WHY`) once the tools ran; with --shared-cpu (the machines'
CPU sets overlap: the link was measured alone on the CPUs, after the source's scan) it reads the
line first, and runs no tool when the link had no CPU to spare (spare_cpu); --scanned NAMES.stat:
the scan's record, the sample's files without a second walk.

    rbkit measure-link [--watch PID:START]...

is the link measurement's receiving end (`receive_link`): it says `ready`, times the zeros that
come on stdin and prints `RATE SECONDS IDLE BYTES CPUS` (IDLE: how many CPUs of this kernel were
idle meanwhile, or -; CPUS: the ones this end may use, rbrules.cpus.token) as soon as the rate
is stable (rbrules.linkrate.link_stable), at most LINK_SECONDS after the first byte; closing stdin
then ends the sending end (SIGPIPE). With --watch (the link's processes on these CPUs: this
machine's ssh masters) it adds their `CPU WAIT WALL COUNT` (ns) over its later windows, and
stops early when they show no CPU to spare (rbrules.linkrate.link_cpu_bound, after
LINK_CPU_SECONDS).
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import shutil
import stat
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rbrules import cpus
from rbrules.compression import COMPRESSION, measured_words
from rbrules.linkrate import (
    LINK_CPU_SECONDS,
    LINK_SECONDS,
    LINK_WINDOW,
    MEASURE_SAMPLE,
    link_cpu_bound,
    link_stable,
    link_tail,
)
from rbrules.streams import STREAMS_MIN_BYTES, relay_most, relay_streams

from . import model

MAX_ENTRIES = 200_000
PICK = 128 << 10  # the sample's pieces: MEASURE_SAMPLE / PICK of them, spread over the tree
PICK_FILES = 256  # a piece crosses at most this many (small) files


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
        for entrie in entries:
            seen += 1
            if any(fnmatch.fnmatch(entrie.name, p) for p in excludes):
                continue
            try:
                st = entrie.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(entrie.path)
            elif stat.S_ISREG(st.st_mode) and st.st_size > 0:
                out.append((entrie.path, st.st_size))
    return out


def _scanned(record: str, root: str, excludes: List[str]) -> Optional[List[Tuple[str, int]]]:
    """(path, size) of the regular files in this run's scan record (NAMES.stat: the source's scan
    wrote it, manifestfile.scan_header and a values_line an entry), in its walk's order; None when
    there is none or it is of another root or excludes (then the tree is walked)."""
    import json

    try:
        fd = os.open(record, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as fh:
        head, _, body = fh.read().partition(b"\n")
    try:
        said = json.loads(head)
        if (said.get("kind"), said.get("root"), said.get("excludes")) != (
            "rb-scan",
            root,
            list(excludes),
        ):
            return None
        rows = json.loads(b"[" + b",".join(body.splitlines()) + b"]")
    except ValueError:
        return None
    return [(os.path.join(root, r[0]), r[3]) for r in rows if r[1] == "f" and r[3]]


def sample(
    root: str, excludes: List[str], want: int = MEASURE_SAMPLE, scanned: Optional[str] = None
) -> bytes:
    """About `want` bytes of the tree, as its stream carries them (sample_of), from the scan's
    record `scanned` where it is this tree's, else from a walk."""
    return sample_of(listing(root, excludes, scanned), want)


def listing(root: str, excludes: List[str], scanned: Optional[str] = None) -> List[Tuple[str, int]]:
    """(path, size) of the tree's regular files in the stream's order: the scan's record where it
    is this tree's, else a walk."""
    return (_scanned(scanned, root, excludes) if scanned else None) or _files(root, excludes)


def sample_of(files: List[Tuple[str, int]], want: int = MEASURE_SAMPLE) -> bytes:
    """About `want` bytes that represent the tree by its bytes: the files' contents, one after the
    other in the stream's order (as tar sends them), cut into PICKS pieces spread evenly over
    that whole length, each piece read where it falls (in a big file at its offset, across as
    many small files as it takes, at most PICK_FILES). So each kind of file is in the sample as
    much as it is in the tree's bytes, wherever in the walk it lies (issue 47: the sample was the
    first 8 files of 1 MiB or more, the first part of the tree)."""
    total = sum(size for _p, size in files)
    if not files or total == 0:
        return b""
    if total <= want:
        return b"".join(_read_at(path, 0, size) for path, size in files)
    picks = max(1, want // PICK)
    piece = want // picks
    starts, at = [], 0
    for _p, size in files:
        starts.append(at)
        at += size
    parts: List[bytes] = []
    for pick in range(picks):
        pos = min(max(0, (2 * pick + 1) * total // (2 * picks) - piece // 2), total - piece)
        index = bisect.bisect_right(starts, pos) - 1
        need, opened = piece, 0
        while need > 0 and index < len(files) and opened < PICK_FILES:
            path, size = files[index]
            off = pos - starts[index] if opened == 0 else 0
            data = _read_at(path, off, min(need, size - off))
            parts.append(data)
            need -= len(data)
            index += 1
            opened += 1
    return b"".join(parts)


def _read_at(path: str, offset: int, length: int) -> bytes:
    """`length` bytes of the file the walk saw at `offset` (never a link put in its place since:
    read as root), fewer where it is shorter now, none where it cannot be read."""
    if length <= 0:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    try:
        return os.pread(fd, length, offset)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _run(words: List[str], data: bytes, seconds: float) -> Tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the child, the run) of `words` reading `data`."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        words,
        input=data,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=seconds,
        check=False,
        cwd="/",
    )
    took = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu, done


def rate(
    tool: str, data: bytes, seconds: float, words: Optional[List[str]] = None
) -> Dict[str, Any]:
    """{"rate": bytes/s read (wall), "cpu_rate": bytes per CPU second packing, "unpack_cpu_rate":
    bytes (unpacked) per CPU second unpacking, "ratio": in/out} of `tool` packing `data` with
    `words` (default its COMPRESSION words), or {"error": why}. The tool's own start (timed on one
    byte first) is not counted: the stream starts it once."""
    words = words or COMPRESSION[tool]["pack"]
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
        return {
            "error": "%s exited %d: %s"
            % (words[0], done.returncode, done.stderr.decode("utf-8", "replace")[-200:])
        }
    cpu = max(cpu - start_cpu, 1e-3)
    out = {
        "rate": int(len(data) / took),
        "cpu_rate": int(len(data) / cpu),
        "ratio": round(len(data) / len(done.stdout), 3),
        "seconds": round(took, 4),
    }
    if undone.returncode == 0 and len(undone.stdout) == len(data):
        out["unpack_cpu_rate"] = int(len(data) / max(un_cpu - start_cpu, 1e-3))
    return out


def cpu_times() -> Optional[Tuple[int, int]]:
    """(idle, total) jiffies of every CPU of this kernel (/proc/stat's `cpu` line: idle and
    iowait count as idle), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as fh:
            words = fh.readline().split()
    except OSError:
        return None
    if words[:1] != [b"cpu"] or len(words) < 6:
        return None
    ticks = [int(w) for w in words[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


def idle_cpus(
    before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]]
) -> Optional[float]:
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
            with open("/proc/%d/stat" % int(pid), "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[19] != start.encode():
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
            with open("/proc/%d/schedstat" % pid, "rb") as fh:
                words = fh.read().split()
            cpu, waited = cpu + int(words[0]), waited + int(words[1])
        except (OSError, ValueError, IndexError):
            return None
    return cpu, waited


def receive_link(
    fd: int = 0,
    cap: float = float(LINK_SECONDS),
    clock: Callable[[], float] = time.monotonic,
    watch: Optional[List[int]] = None,
) -> Dict[str, Any]:
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
    ends: List[Tuple[float, int]] = [(start, 0)]  # (time, bytes so far) at each window's end
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
            if (
                took
                and now - start >= LINK_CPU_SECONDS
                and len(windows) >= 4
                and link_cpu_bound(took[0] / 1e9, took[1] / 1e9, took[2] / 1e9, took[3], moved)
            ):
                bound = True
                break
    seconds = now - start
    if not windows:
        return {"error": "only %d bytes in %.3f s" % (total, seconds)}
    (t0, b0), (t1, b1) = ends[len(windows) - len(link_tail(windows))], ends[-1]
    # the CPUs the link left idle (one kernel: the ciphers of both legs and this reader are on
    # them): recorded, not used
    got = {
        "rate": int((b1 - b0) / (t1 - t0)),
        "seconds": round(seconds, 3),
        "bytes": total,
        "stable": stable,
        "idle_cpus": idle_cpus(cpu_start, cpu_times()),
    }
    took = _tail_cpu(windows, ends, used, len(watch))
    if took:
        got.update(cpu=took, cpu_bound=bound)
    return got


def _tail_cpu(
    windows: List[float],
    ends: List[Tuple[float, int]],
    used: List[Optional[Tuple[int, int]]],
    procs: int,
) -> Optional[Tuple[int, int, int, int]]:
    """(ns on a CPU, ns waiting for one, ns, processes) of the watched processes over
    link_tail's windows, or None."""
    first = len(windows) - len(link_tail(windows))
    before, after = used[first], used[-1]
    if not procs or before is None or after is None or not windows:
        return None
    return (
        after[0] - before[0],
        after[1] - before[1],
        int((ends[-1][0] - ends[first][0]) * 1e9),
        procs,
    )


def read_link(line: str) -> Tuple[int, float, str, Dict[str, Any]]:
    """(rate, seconds, "", what was seen beside the rate) from rb::measure_link's line on stdin
    (`RATE SECONDS IDLE BYTES CPUS` and this machine's ssh masters' `CPU_NS WAIT_NS WALL_NS COUNT`
    or `-`; IDLE `-` when unknown; CPUS the destination's, rbrules.cpus.token), or (0, 0.0, why,
    {}) from `error WHY` or anything else. Seen: idle_cpus, bytes, dst_cpus, and here_cpu_s,
    here_wait_s, here_wall_s, here_procs when read."""
    words = line.split()
    token = words.pop(4) if len(words) >= 5 and cpus.read_token(words[4]) else ""
    if len(words) >= 2 and words[0].isdigit():
        try:
            seen: Dict[str, Any] = {"idle_cpus": None}
            if token:
                seen["dst_cpus"] = token
            if len(words) >= 3 and words[2] != "-":
                seen["idle_cpus"] = float(words[2])
            if len(words) >= 4:
                seen["bytes"] = int(words[3])
            if len(words) == 8:
                cpu, waited, wall, procs = (int(w) for w in words[4:8])
                seen.update(
                    here_cpu_s=cpu / 1e9,
                    here_wait_s=waited / 1e9,
                    here_wall_s=wall / 1e9,
                    here_procs=procs,
                )
            return int(words[0]), float(words[1]), "", seen
        except ValueError:
            pass
    return 0, 0.0, " ".join(words[1:]) if words[:1] == ["error"] else "no link rate", {}


def spare_cpu(link: int, seen: Dict[str, Any]) -> Optional[bool]:
    """Whether the link (`link` bytes a second) had CPU to spare (rbrules.linkrate.link_cpu_bound
    on this machine's ssh masters' figures in `seen`, read_link's), or None where they were not
    read."""
    if "here_cpu_s" not in seen:
        return None
    return not link_cpu_bound(
        seen["here_cpu_s"],
        seen["here_wait_s"],
        seen["here_wall_s"],
        seen["here_procs"],
        link * seen["here_wall_s"],
    )


def said_cpu(seen: Dict[str, Any]) -> str:
    """The ssh masters' figures in words."""
    cpu, waited = seen["here_cpu_s"], seen["here_wait_s"]
    return "its ssh here busy %d%% of %.2f s, waiting for a CPU %.1fx their time on one" % (
        round(100 * (cpu + waited) / (seen["here_wall_s"] * seen["here_procs"])),
        seen["here_wall_s"],
        waited / cpu if cpu > 0 else 0.0,
    )


SMALL = 1 << 20  # a tree whose sample is smaller moves in a moment whatever its compression


def measure(
    root: str,
    tools: List[str],
    excludes: List[str],
    want: int = MEASURE_SAMPLE,
    seconds: float = 5.0,
    scanned: Optional[str] = None,
) -> Dict[str, Any]:
    """The sample's figures and each tool's (rate), on one core: lz4, zstd at each level
    (rbrules.compression.measured_words); the tree's bytes."""
    start = time.monotonic()
    files = listing(root, excludes, scanned)
    data = sample_of(files, want)
    doc: Dict[str, Any] = {
        "sample_bytes": len(data),
        "tree_bytes": sum(s for _p, s in files),
        "read_seconds": round(time.monotonic() - start, 4),
        "tools": {},
    }
    if not data:
        doc["error"] = "no file to sample under %s" % root
        return doc
    for tool in tools:
        if tool not in COMPRESSION or tool == "none":
            doc["tools"][tool] = {"error": "not a compressor the stream knows"}
            continue
        for name, words, threads in measured_words(tool):
            got = rate(tool, data, seconds, words)
            if "error" in got:
                doc["tools"][tool] = got  # said once a tool, not once a level
                break
            doc["tools"][name] = dict(got, threads=threads)
    return doc


def ends_of(here: str = "", dst: str = "") -> Dict[str, str]:
    """The three machines' CPUs as rbrules.cpus tokens: the source's (this process's), and the
    destination's and this machine's as they said them (`` where they did not: the source's)."""
    src = cpus.token(cpus.usable())
    return {"src": src, "dst": dst or src, "here": here or src}


def move_of(
    doc: Dict[str, Any],
    link: int,
    shared: bool,
    jobs: str,
    seen: Dict[str, Any],
    ends: Dict[str, str],
) -> model.Move:
    """The model's Move from the measured figures (`doc`'s tools), the link's rate and what was
    seen beside it, the run's jobs word and the three machines' CPUs (ends_of's tokens). Its
    streams: the relay's rule (rbrules.streams.relay_streams), and apart the most the model may
    choose (relay_most); one below STREAMS_MIN_BYTES."""
    use = {k: cpus.read_token(v) or cpus.read_token(ends["src"]) for k, v in ends.items()}
    fewest = min(cpus.jobs(jobs, u) for u in use.values())
    fewest_cpus = min(u.count for u in use.values())
    count = relay_streams(fewest, fewest_cpus)
    most = 0 if shared else relay_most(fewest, fewest_cpus)
    if doc.get("tree_bytes", STREAMS_MIN_BYTES) < STREAMS_MIN_BYTES:
        count, most = 1, 0
    tools = tuple(
        model.Tool(
            name,
            float(m.get("cpu_rate") or m["rate"]),
            float(m.get("unpack_cpu_rate") or 0) or float("inf"),
            float(m["ratio"]),
            bool(m.get("threads")),
        )
        for name, m in sorted(doc["tools"].items())
        if "ratio" in m
    )
    return model.Move(
        model.link_of(link, seen),
        model.End(use["src"].share),
        model.End(use["dst"].share),
        model.End(use["here"].share),
        count,
        tools,
        shared,
        most,
    )


def main_lines(
    doc: Dict[str, Any],
    link: int,
    shared: bool = False,
    jobs: str = "auto",
    no_link: str = "no link rate",
    seen: Optional[Dict[str, Any]] = None,
    ends: Optional[Dict[str, str]] = None,
) -> List[str]:
    """What `rbkit measure --link RATE` prints for the runbook: `choice WORD`, `why TEXT` (one
    line: model.said), where the model chose the relay's streams (machines apart) `streams N`,
    and the figures as one `json` line (tab-separated), from which the same
    choice is made again (the json holds the link, `seen`, the jobs and the three machines'
    CPUs, `ends`); `no_link`: why there is no rate (link 0). Where the machines share CPUs
    (`shared`), a link without CPU to spare (spare_cpu) is none, whatever the tools (not run)."""
    import json

    seen = seen or {}
    ends = ends or ends_of()
    decision = None
    if link > 0 and shared and spare_cpu(link, seen) is False:
        choice, why = (
            "none",
            "link %s (CPUs shared by both ends and this machine, no CPU to "
            "spare: %s): none, no compressor tried" % (mb(link), said_cpu(seen)),
        )
    elif doc.get("error") or link <= 0:
        return ["error\t%s" % (doc.get("error") or no_link)]
    elif doc["sample_bytes"] < SMALL:
        choice, why = (
            "none",
            "link %s; the tree is %d KB: nothing worth packing"
            % (mb(link), doc["sample_bytes"] // 1024),
        )
    else:
        decision = model.decide(move_of(doc, link, shared, jobs, seen, ends))
        choice = decision.choice
        why = model.said(
            decision,
            {
                k: m.get("error", "not measured")
                for k, m in doc["tools"].items()
                if "ratio" not in m
            },
        )
    # the CPUs the link left idle: recorded, not used (counting only those took none on the
    # capped 1 Gbit/s lab link in one run of two, the source's scan running beside the link then)
    doc = dict(
        doc,
        link_rate=link,
        choice=choice,
        jobs=jobs,
        link_idle_cpus=seen.get("idle_cpus"),
        link_seen=seen,
        ends=ends,
        shared=shared,
    )
    if decision is not None:
        doc.update(
            streams=decision.streams,
            options=[
                {"word": o.word, "rate": int(o.rate), "bound": o.bound} for o in decision.options
            ],
        )
    lines = ["choice\t" + choice, "why\t" + why]
    if decision is not None and decision.move.most > 0:
        lines.append("streams\t%d" % decision.streams)  # the relay runs that many (--streams)
    return lines + ["json\t" + json.dumps(doc, sort_keys=True)]


def mb(rate: float) -> str:
    return "%d MB/s" % round(rate / 1e6)
