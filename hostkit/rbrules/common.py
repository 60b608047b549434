"""The rules that the compiler (which renders them into a runbook's settings, bash and prose) and
the kit (which acts on them) both state, each written once here: stdlib only, no I/O.

    COMPRESSION     the compression table: each one's tool, how it packs, how it unpacks
    compressors     which compressions a host has, by the tools found on its PATH
    LINK_SECONDS, LINK_SEND_SECONDS, LINK_MIN_SECONDS, LINK_WINDOW, LINK_STABLE, LINK_MIN_BYTES,
    link_tail, link_stable, MEASURE_SAMPLE   compression auto's measurement: the link's (how
                    long, which windows give its rate, when it stops), and the sample's
    LINK_BUSY, LINK_WAITED, LINK_CPU_SECONDS, link_cpu_bound   on one kernel: whether the link had
                    CPU to spare, and when that stops its measurement
    TAR_RECORD      tar's record size on both ends of a stream
    WALK_WORKERS, walk_workers   how many processes a tree's stat walk forks
    MAX_STREAMS,    several streams side by side: at most this many, none below this size,
    STREAMS_MIN_BYTES, stream_count   one per two of the run's jobs
    relay_streams   the relay's: also no more than the fewest CPUs of its three machines
    ZSTD_LEVELS, measured_words, compression, compression_word   what compression auto
                    measures, and the words its model may choose (`zstd-3-T2`)
    ENGINE_STEPS    the install engine's steps, in order
    PROVE_TIMEOUT   seconds for the staged (and the installed) interpreter to answer
    LOCK_WAIT_S     seconds a second run waits for the destination's lock (RB_LOCK_WAIT's default)
    SPECIAL_MODES, OUTSIDE_LINKS, ON_EXISTING, SHARED_PARENT, SWAP_ATOMIC, RERUN, ALGOS,
    ON_FAILED_CHECKS   the choices of the spec fields the engine takes
    human           a byte count in words (`786.4 MB`)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

# The compression table, the only one: the stream's sending end packs with `pack`, its receiving
# end unpacks with `unpack`; `tool` is what a host must have (None: nothing).
COMPRESSION: Dict[str, Dict[str, Any]] = {
    "none": {"tool": None, "pack": None, "unpack": None},
    "zstd": {
        "tool": "zstd",
        "pack": ["zstd", "-q", "-1", "-T0"],
        "unpack": ["zstd", "-q", "-d", "-c"],
    },
    "lz4": {"tool": "lz4", "pack": ["lz4", "-q", "-1", "-c"], "unpack": ["lz4", "-q", "-d", "-c"]},
    "gzip": {"tool": "gzip", "pack": ["gzip", "-1"], "unpack": ["gzip", "-d", "-c"]},
}
# the tools a host is asked for, sorted (the runbook's bash asks `command -v` for each)
COMPRESSOR_TOOLS = tuple(sorted(c["tool"] for c in COMPRESSION.values() if c["tool"]))

# compression auto measures each tool on one core (the stream's words with one thread): lz4 -1,
# zstd at each of ZSTD_LEVELS with -T1; its model (rbkit.model) may then choose zstd at a level
# with -T threads a stream: the word `zstd-LEVEL-TTHREADS` (`zstd-3-T2`), read by `compression`
ZSTD_LEVELS = (1, 3)
ZSTD_MOST_THREADS = 64


def zstd_pack(level: int, threads: int) -> List[str]:
    return ["zstd", "-q", "-%d" % level, "-T%d" % threads]


def measured_words(tool: str) -> List[tuple]:
    """(the measurement's name, the packing words on one core, whether -T applies) of each way
    compression auto measures `tool`."""
    if tool == "zstd":
        return [("zstd-%d" % lv, zstd_pack(lv, 1), True) for lv in ZSTD_LEVELS]
    return [(tool, COMPRESSION[tool]["pack"], False)]


def compression(word: str) -> Optional[Dict[str, Any]]:
    """The table's entry of a compression word: a name of COMPRESSION, or `zstd-LEVEL-TN`
    (level 1-19, 1-ZSTD_MOST_THREADS threads); None for anything else."""
    if word in COMPRESSION:
        return COMPRESSION[word]
    parts = word.split("-")
    if (
        len(parts) == 3
        and parts[0] == "zstd"
        and parts[1].isdigit()
        and parts[2][:1] == "T"
        and parts[2][1:].isdigit()
    ):
        level, threads = int(parts[1]), int(parts[2][1:])
        if (
            1 <= level <= 19
            and 1 <= threads <= ZSTD_MOST_THREADS
            and word == "zstd-%d-T%d" % (level, threads)
        ):
            return dict(COMPRESSION["zstd"], pack=zstd_pack(level, threads))
    return None


def compression_word(word: str) -> str:
    """An argparse type: the word where `compression` knows it, else ValueError."""
    if compression(word) is None:
        raise ValueError("not a compression: %r" % word)
    return word


def compressors(found: Callable[[str], Optional[str]]) -> List[str]:
    """The compressions a host has, sorted: none, and each whose tool `found` finds (on the host:
    shutil.which; the runbook's bash asks `command -v` for COMPRESSOR_TOOLS)."""
    return [
        name for name, c in sorted(COMPRESSION.items()) if c["tool"] is None or found(c["tool"])
    ]


# compression auto on the relay measures the link (zeros through this machine, timed on the
# receiving end in LINK_WINDOW windows; its rate is the later half of them, link_tail: the first
# ones are the connections' start and the pipes filling): it stops once LINK_MIN_SECONDS went by,
# the last two windows are each within LINK_STABLE of that rate and those windows carried at
# least LINK_MIN_BYTES (link_stable), else at LINK_SECONDS (a word for `timeout`); against each
# compressor packing MEASURE_SAMPLE bytes of the source
LINK_SECONDS = "0.6"
LINK_SEND_SECONDS = "2"  # the sending end's own bound (the receiving end ends it sooner)
LINK_MIN_SECONDS = 0.25
LINK_WINDOW = 0.05
LINK_STABLE = 0.05
LINK_MIN_BYTES = 8 << 20
"""The bytes the stable windows must carry: a stall under load (the lab's 2 cores at load 6-8:
4-6 MB/s in two runs of 16, steady enough to look stable) is not taken for the link; a slower
link is measured for LINK_SECONDS, as before."""


def link_tail(windows: List[float]) -> List[float]:
    """The windows the link's rate is taken from (rates in bytes a second, oldest first): the
    later half, at least the last one."""
    return windows[len(windows) // 2 :] if len(windows) > 1 else windows


def link_stable(windows: List[float], seconds: float) -> bool:
    """Whether the link's measurement may stop: `seconds` (since its first byte) past
    LINK_MIN_SECONDS, each of the last two windows' rates within LINK_STABLE of the rate over
    link_tail, and link_tail's windows about LINK_MIN_BYTES or more."""
    if seconds < LINK_MIN_SECONDS or len(windows) < 4:
        return False
    tail = link_tail(windows)
    rate = sum(tail) / len(tail)
    return rate * len(tail) * LINK_WINDOW >= LINK_MIN_BYTES and all(
        abs(w - rate) <= LINK_STABLE * rate for w in windows[-2:]
    )


MEASURE_SAMPLE = 8 << 20
"""The compressors' sample, 8 MiB (16 before): the lab's torch venv packs 2.57x with lz4 -1 over
its whole tar stream; its 8 MiB sample said 2.50, the 16 MiB one 2.3, and the tools' part of the
measurement is about half as long (lz4 and zstd packing and unpacking it: 0.03-0.11 s each)."""

# On one kernel (every machine of the relay on the same CPUs: rb::shared_cpus) the link is
# measured alone on them, once the source's scan is done, and this machine's ssh masters (one
# cipher process a leg) say whether it had CPU to spare: their time on a CPU and waiting for one
# (/proc/PID/schedstat) while it was measured. Busy (either) LINK_BUSY of the time or more, and
# waiting LINK_WAITED of their time on a CPU or more, while the link carried LINK_MIN_BYTES or
# more (a stall, e.g. the stream's first windows on a loaded machine, says nothing of the link):
# the CPUs, not the wire, set the link's rate, and a compressor would take its CPU from the
# ciphers: none (the tools are not even run).
LINK_BUSY = 0.5
LINK_WAITED = 0.8
# where the receiving end sees those processes too (one kernel, one pid namespace), a link they
# show without CPU to spare over link_tail's windows stops this many seconds after its first byte
LINK_CPU_SECONDS = 0.2


def link_cpu_bound(cpu_s: float, wait_s: float, wall_s: float, procs: int, moved: float) -> bool:
    """Whether the link's processes (`procs` of them: `cpu_s` seconds on a CPU, `wait_s` waiting
    for one, over `wall_s`, while the link carried `moved` bytes) had no CPU to spare
    (LINK_BUSY, LINK_WAITED, LINK_MIN_BYTES)."""
    if cpu_s <= 0 or wall_s <= 0 or procs <= 0 or moved < LINK_MIN_BYTES:
        return False
    return (cpu_s + wait_s) / (wall_s * procs) >= LINK_BUSY and wait_s >= LINK_WAITED * cpu_s


# tar's record on both ends of a stream, in 512-byte blocks: 256 (128 KiB) instead of tar's
# default 20 (measured: docs/h200.md). Either end reads the other's records whatever their size (GNU
# tar reblocks a pipe's short reads).
TAR_BLOCKS = 256
TAR_RECORD = ["-b", str(TAR_BLOCKS)]

# Several streams side by side, where the sending end starts the receiving ends (one host, or the
# direct route; measured: docs/h200.md): one per two of the cores the run may use (its jobs), at
# most MAX_STREAMS, none for a tree below STREAMS_MIN_BYTES.
MAX_STREAMS = 8
STREAMS_MIN_BYTES = 256 << 20


def stream_count(jobs: int) -> int:
    return max(1, min(MAX_STREAMS, jobs // 2))


def relay_streams(jobs: int, cpus: int) -> int:
    """The relay's streams (rbkit.relay, and compression auto's model of it): stream_count of the
    fewest jobs of the three machines, and never more than the fewest CPUs any of them may use
    (rbrules.cpus: a stream's stages take a CPU at each end, its two ciphers one here)."""
    return max(1, min(stream_count(jobs), cpus))


# A tree's stat walk (statwalk.tree_stat: the live plan's destination state; hostfs.scan: the
# source's scan, the plan's and the run's preflight) forks workers over its subtrees where the
# host has the cores: one per two CPUs this process may use (the other host's walk may share the
# machine), at most WALK_WORKERS; on two CPUs or fewer none (the walk runs in the process itself).
WALK_WORKERS = 8


def walk_workers(cpus: int) -> int:
    return min(WALK_WORKERS, cpus // 2) if cpus > 2 else 1


# the install engine's steps, in order: a single-host runbook runs them one by one on the
# destination, a fan-out node all in one process
ENGINE_STEPS = ("stage", "receive", "verify", "relocate", "prove", "swap", "exports", "probe")

PROVE_TIMEOUT = 120  # seconds for the staged (and the installed) interpreter to answer

# seconds a second run waits for the lock a first run holds on a destination, whoever takes it: the
# single-host engine (serve/run, and the runbook's RB_LOCK_WAIT default) and a fan-out node alike.
# A wait is for a run that is ending, which takes as long whatever route took the lock.
LOCK_WAIT_S = 30

# the choices of the spec's fields that the engine takes (transfer.*, and the manifest's digest)
SPECIAL_MODES = ("refuse", "strip", "keep")  # transfer.special_modes
OUTSIDE_LINKS = ("refuse", "keep")  # transfer.outside_links
ON_EXISTING = ("refuse", "backup", "replace")  # transfer.on_existing
SHARED_PARENT = ("refuse", "allow")  # transfer.shared_parent
SWAP_ATOMIC = ("require", "allow")  # transfer.swap_atomic
RERUN = ("quick", "digest")  # transfer.rerun
ALGOS = ("sha256", "blake2b", "none")  # transfer.verify
ON_FAILED_CHECKS = ("rollback", "keep")  # on_failed_checks


def human(n: Any) -> str:
    """`n` bytes in decimal units (`512 B`, `1.5 KB`, `786.4 MB`, up to TB); `-` for what is not a
    number (a size not measured)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1000.0
    return "%.1f TB" % n
