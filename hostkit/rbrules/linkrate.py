"""Compression auto's measurement of the link on the relay: how long it runs, which windows give
its rate and when it stops (`link_tail`, `link_stable`), whether the CPUs rather than the wire set
it on one kernel (`link_cpu_bound`), and the compressors' sample. Shared by the compiler and the
kit.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

from typing import List

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
