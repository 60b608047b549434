"""compression: auto's model of the move it makes (issue 47): given the measured figures, which
compression moves the tree fastest, and why in one line. Pure: no I/O, no clock; `rbkit measure`
measures (measure.py) and calls `decide`, the tests give figures.

The move: N streams side by side, each `tar | PACK | ssh` on the source, two ssh cipher
processes here, `ssh | UNPACK | reader | tar` on the destination. Where the machines run apart
(their CPU sets do not overlap) the model chooses N too, from 1 to Move.most
(rbrules.streams.relay_most: one a job and a CPU of the fewest), and the relay runs that many;
where they share CPUs N is the relay's own rule (Move.streams, rbrules.streams.relay_streams).
For each option (none, lz4, zstd at each measured level with -T the source's CPUs over the N
streams, in N streams) its throughput in bytes of the tree a second is the smallest of:

    the link        the link's rate x the option's ratio; the link's rate for N streams is the
                    measured one stream's x N where that stream's cipher was its limit (this
                    machine's ssh busy on a CPU, Link.per_stream), else the one stream's (the wire)
    the packers     the per-core packing rate x the cores they get: min(N x threads, the
                    source's CPUs)
    the source      its CPUs over what a byte costs there: tar and its hashing
                    (rbrules.streams.SENDER_CPU), packing, and the cipher for the packed bytes
                    (where the cipher's cost was measured)
    the unpackers   the per-core unpacking rate x min(N, the destination's CPUs)
    the receivers   N x what one stream's reader and tar carry (rbrules.streams.RECEIVER_RATE)
    the destination its CPUs over unpacking, the reader and tar (RECEIVER_CPU) and the cipher
    here            this machine's CPUs over its two ciphers a packed byte

Where the machines share CPUs (their CPU sets overlap on one kernel: `Move.shared`), the stages
take turns on one pool of CPUs: the link's time for the packed bytes (measured with the ciphers
on those CPUs) plus the packing and the unpacking, spread over the pool, never faster than the
slowest stage alone (the lab: issue 37's measurements). The options are listed cheapest first
(fewer streams, then none, the tools); the fastest is taken where it beats none by
MARGIN (a compressor) and a cheaper option by PAYS; else the cheaper (none where the link is
faster than every option).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from rbrules.streams import RECEIVER_CPU, RECEIVER_RATE, SENDER_CPU

MARGIN = 1.1  # a compressor is taken when it moves the tree this much faster than none
PAYS = 1.03  # a costlier option (more streams, a higher level) over a cheaper one
STREAM_BUSY = 0.6  # this machine's ssh busy this much of a CPU: one stream's cipher was its limit


class End(NamedTuple):
    """One machine of the move: the CPU seconds a second it may use (rbrules.cpus.Usable.share)."""

    cpus: float


class Link(NamedTuple):
    """The link as measured through one stream: `rate` bytes a second; `cipher` bytes a CPU
    second of one ssh cipher process (this machine's masters while it was measured), None where
    not read; `per_stream`: that stream was its cipher's limit, so N streams carry N times it."""

    rate: float
    cipher: Optional[float] = None
    per_stream: bool = False


class Tool(NamedTuple):
    """A measured packing: its word for the stream (`lz4`, `zstd-3`: with -T added), the bytes a
    CPU second packing (one core) and unpacking, the ratio; `threads`: whether -T applies."""

    name: str
    pack: float
    unpack: float
    ratio: float
    threads: bool = False


class Move(NamedTuple):
    link: Link
    src: End
    dst: End
    here: End
    streams: int  # the relay's own count (rbrules.streams.relay_streams)
    tools: Tuple[Tool, ...]
    shared: bool = False  # the machines' CPU sets overlap: one pool of `src.cpus` CPUs
    most: int = 0  # apart: the model chooses 1..most streams (0: `streams`, as the relay would)


class Option(NamedTuple):
    word: str  # the stream's compression: none, lz4, zstd-1-T2
    rate: float  # bytes of the tree a second
    bound: str  # the stage that sets it: link, packers, src, unpackers, receivers, dst, here, turns
    tool: Optional[Tool]
    streams: int = 1  # side by side


class Decision(NamedTuple):
    choice: str
    options: Tuple[Option, ...]  # every option tried, the fastest first
    move: Move
    streams: int = 1  # the relay's streams for the choice


def zstd_word(level: int, threads: int) -> str:
    """The stream's word for zstd at `level` with `threads` (rbrules.compression.compression reads
    it)."""
    return "zstd-%d-T%d" % (level, threads)


def link_for(link: Link, streams: int) -> float:
    """The link's bytes a second in `streams` streams side by side."""
    return link.rate * (max(1, streams) if link.per_stream else 1)


def stream_counts(move: Move) -> List[int]:
    """The stream counts the model weighs: 1..most where the machines run apart and the relay
    lets it choose, else the relay's own."""
    if move.most > 0 and not move.shared:
        return list(range(1, move.most + 1))
    return [max(1, move.streams)]


def _apart(move: Move, tool: Optional[Tool], threads: int, count: int) -> Tuple[float, str]:
    """(bytes of the tree a second, the stage that sets it) on machines of their own, in `count`
    streams."""
    ratio = tool.ratio if tool else 1.0
    packed = 1.0 / ratio  # bytes on the wire a byte of the tree
    cipher = 1.0 / move.link.cipher if move.link.cipher else 0.0  # CPU-s a wire byte, an end
    limits = [(link_for(move.link, count) * ratio, "link"), (count * RECEIVER_RATE, "receivers")]
    if cipher:
        limits.append((move.here.cpus / (2 * cipher * packed), "here"))
    src_cost, dst_cost = cipher * packed + SENDER_CPU, cipher * packed + RECEIVER_CPU
    if tool is not None:
        limits.append((tool.pack * min(count * threads, move.src.cpus), "packers"))
        limits.append((tool.unpack * min(count, move.dst.cpus), "unpackers"))
        src_cost += 1.0 / tool.pack
        dst_cost += 1.0 / tool.unpack
    limits.append((move.src.cpus / src_cost, "src"))
    limits.append((move.dst.cpus / dst_cost, "dst"))
    return min(limits)


def _shared(move: Move, tool: Optional[Tool]) -> Tuple[float, str]:
    """(bytes of the tree a second, its bound) where the machines share `src.cpus` CPUs: the
    link's time for the packed bytes plus the CPU time packing and unpacking them, spread over
    the CPUs, never faster than the slowest stage alone. With one CPU that is the stages taking
    turns (the lab's figures: docs/benchmarks.md)."""
    moved = move.link.rate * (tool.ratio if tool else 1.0)
    if tool is None:
        return moved, "link"
    stages = [(1.0 / moved, "link"), (1.0 / tool.pack, "packers"), (1.0 / tool.unpack, "unpackers")]
    alone = max(stages)
    turns = sum(s for s, _ in stages) / max(1.0, move.src.cpus)
    return (1.0 / alone[0], alone[1]) if alone[0] >= turns else (1.0 / turns, "turns")


def options(move: Move) -> List[Option]:
    """Every option the move may run, cheapest first: for each stream count (stream_counts,
    fewest first) none, then each tool; zstd with -T the source's CPUs over the streams (on
    shared CPUs one). A thread with nothing to pack costs nothing (issue 47, the device,
    2026-12-07: by hand at 1 Gbit/s zstd -3 -T2 and -T4 took 27.39 and 27.24 s, 37.7 and 37.4
    CPU-s), and the spare ones are headroom where the tree packs slower than the sample's
    average (-T2's threads 94% busy at their busiest 2 s there), so the model weighs no
    fewer."""
    out: List[Option] = []
    for count in stream_counts(move):
        if move.shared:
            out.append(Option("none", *_shared(move, None), None, count))
        else:
            out.append(Option("none", *_apart(move, None, 1, count), None, count))
        for tool in move.tools:
            threads = 1
            if tool.threads and not move.shared:
                threads = max(1, int(move.src.cpus // count))
            rate, bound = _shared(move, tool) if move.shared else _apart(move, tool, threads, count)
            word = zstd_word(int(tool.name.split("-")[1]), threads) if tool.threads else tool.name
            out.append(Option(word, rate, bound, tool, count))
    return out


def decide(move: Move) -> Decision:
    """The option that moves the tree fastest: a compressor beats none by MARGIN, any option a
    cheaper one (fewer streams, a lower level: listed before it) by PAYS; ties
    stay with the cheaper."""
    tried = options(move)
    best = tried[0]
    for option in tried[1:]:
        factor = MARGIN if best.word == "none" and option.word != "none" else PAYS
        if option.rate > best.rate * factor:
            best = option
    ranked = sorted(tried, key=lambda o: -o.rate)
    return Decision(best.word, tuple(ranked), move, best.streams)


def mb(rate: float) -> str:
    return "%d" % round(rate / 1e6)


BOUND_WORDS = {
    "link": "the link",
    "here": "this machine's CPUs",
    "packers": "its packers",
    "src": "the source's CPUs",
    "unpackers": "its unpackers",
    "receivers": "its streams' readers",
    "dst": "the destination's CPUs",
    "turns": "the shared CPUs",
}


def said(decision: Decision, failed: Optional[Dict[str, str]] = None) -> str:
    """The decision's deciding figures in one line (the runbook logs `compression: CHOICE (auto,
    measured: THIS)`): the link and what limited it, the streams and each end's CPUs, then per
    option its MB/s through (the fastest stream count of each tool and level, and none), its
    ratio and per-core rates and its bound; `failed`: a tool that could not be measured, why."""
    move = decision.move
    link = move.link
    if move.shared:
        head = "link %s MB/s (CPUs shared by both ends and this machine: %s of them)" % (
            mb(link.rate),
            _cpus(move.src.cpus),
        )
    else:
        head = "link %s MB/s a stream (%s)" % (mb(link.rate), _limit(link))
        counts = stream_counts(move)
        head += "; %s, CPUs src %s, dst %s, here %s" % (
            _streams(counts[-1]) if len(counts) == 1 else "1 to %d streams" % counts[-1],
            _cpus(move.src.cpus),
            _cpus(move.dst.cpus),
            _cpus(move.here.cpus),
        )
    several = len(stream_counts(move)) > 1
    shown: List[str] = []
    seen = set()
    for option in decision.options:  # the fastest first: one entry a tool and level
        key = option.word.rsplit("-T", 1)[0]
        if key in seen:
            continue
        seen.add(key)
        name = _spaced(option.word) + (" in " + _streams(option.streams) if several else "")
        if option.tool is None:
            shown.append("%s %s (%s)" % (name, mb(option.rate), BOUND_WORDS[option.bound]))
            continue
        shown.append(
            "%s %s (ratio %.1f, packs %s, unpacks %s a CPU; %s)"
            % (
                name,
                mb(option.rate),
                option.tool.ratio,
                mb(option.tool.pack),
                mb(option.tool.unpack) if option.tool.unpack != float("inf") else "?",
                BOUND_WORDS[option.bound],
            )
        )
    for tool, why in sorted((failed or {}).items()):
        shown.append("%s: %s" % (tool, why))
    text = "%s; MB/s through: %s: %s" % (head, ", ".join(shown), _spaced(decision.choice))
    if several:
        text += " in " + _streams(decision.streams)
    if decision.choice == "none":
        text += ", the link is as fast as any compressor"
    return text


def _spaced(word: str) -> str:
    """`zstd-1-T2` as the command reads it: `zstd -1 -T2`; other words as they are."""
    if word.startswith("zstd-"):
        return "zstd " + " ".join("-" + w for w in word.split("-")[1:])
    return word


def _streams(count: int) -> str:
    return "%d stream%s" % (count, "s" if count != 1 else "")


def _cpus(count: float) -> str:
    return "%d" % count if count == int(count) else "%.1f" % count


def _limit(link: Link) -> str:
    if link.cipher is None:
        return "its ssh here not read"
    busy = link.rate / link.cipher
    return "%s: its ssh here %d%% of a CPU" % (
        "its cipher, N streams carry N times" if link.per_stream else "the wire",
        round(100 * busy),
    )


def link_of(rate: float, seen: Dict[str, Any]) -> Link:
    """The Link of a measured rate and what measure.read_link saw beside it (this machine's ssh
    masters: CPU seconds over the wall, how many)."""
    cpu, wall, procs = seen.get("here_cpu_s"), seen.get("here_wall_s"), seen.get("here_procs")
    if not cpu or not wall or not procs or rate <= 0:
        return Link(float(rate))
    cipher = rate * wall * procs / cpu  # each master carries every byte of its leg
    return Link(float(rate), cipher, cpu / (wall * procs) >= STREAM_BUSY)
