"""How many processes a move runs side by side: the tar record both ends of a stream use, the
streams of one tree (`stream_count`, the relay's `relay_streams`), the workers of a tree's stat
walk (`walk_workers`). Shared by the compiler and the kit.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

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
    """The relay's streams where nothing measured them (rbkit.relay; compression auto's model on
    machines that share CPUs): stream_count of the fewest jobs of the three machines, and never
    more than the fewest CPUs any of them may use (rbrules.cpus: a stream's stages take a CPU at
    each end, its two ciphers one here)."""
    return max(1, min(stream_count(jobs), cpus))


def relay_most(jobs: int, cpus: int) -> int:
    """The most streams compression auto's model (rbkit.model) may give the relay where its
    machines run apart (their CPU sets do not overlap): one a job and a CPU of the fewest any of
    the three machines may use, at most MAX_STREAMS. The model takes fewer where more carry no
    more (issue 47: on three machines of 4 CPUs, 2 streams of the rule above left every CPU set
    under 60% busy, unshaped)."""
    return max(1, min(MAX_STREAMS, jobs, cpus))


# What the model counts for a stream's own ends beyond their cipher and compressor (issue 47;
# measured on the device's three machines, docs/benchmarks.md): the receiving end's reader
# between the decompressor and tar (rbkit.tarstream.Digester, one process a stream, hashing each
# file as it passes) carries about RECEIVER_RATE bytes of the tree a second; the source's tar and
# hashing cost SENDER_CPU CPU seconds a byte of the tree, the destination's reader and tar
# RECEIVER_CPU (each end's CPU seconds in the runbook's unshaped row less the null relay's, the
# mean of two calls).
RECEIVER_RATE = 500e6


SENDER_CPU = 1.5e-9


RECEIVER_CPU = 1.8e-9


# A tree's stat walk (statwalk.tree_stat: the live plan's destination state; hostfs.scan: the
# source's scan, the plan's and the run's preflight) forks workers over its subtrees where the
# host has the cores: one per two CPUs this process may use (the other host's walk may share the
# machine), at most WALK_WORKERS; on two CPUs or fewer none (the walk runs in the process itself).
WALK_WORKERS = 8


def walk_workers(cpus: int) -> int:
    return min(WALK_WORKERS, cpus // 2) if cpus > 2 else 1
