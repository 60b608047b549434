"""compression: auto's measurement and its model of the move (rbkit.measure, rbkit.model;
issues 37 and 47): the choice from given figures (rates, ratios, the CPUs each machine may use,
the link), the link's measurement, the tree's sample; rbrules.cpus, the CPUs a process may use."""

from __future__ import annotations

import sys

import pytest
from rbrules import linkrate, streams

# ------------------------------------------------------------ the model of the move (model.py)
# figures as `rbkit measure` reported them on the lab's torch venv (2 cores, one kernel):
# bytes per CPU second packing and unpacking, and the ratio
LAB = {
    "lz4": {
        "rate": 390_000_000,
        "cpu_rate": 390_000_000,
        "unpack_cpu_rate": 820_000_000,
        "ratio": 2.23,
    },
    "zstd-1": {
        "rate": 280_000_000,
        "cpu_rate": 280_000_000,
        "unpack_cpu_rate": 670_000_000,
        "ratio": 3.0,
        "threads": True,
    },
}


def tools(figures):
    from rbkit import model

    return tuple(
        model.Tool(
            k,
            float(m["cpu_rate"]),
            float(m["unpack_cpu_rate"]),
            float(m["ratio"]),
            bool(m.get("threads")),
        )
        for k, m in sorted(figures.items())
    )


def move(
    link,
    figures=None,
    shared=False,
    src=4.0,
    dst=4.0,
    here=4.0,
    streams=2,
    cipher=None,
    per_stream=False,
):
    from rbkit import model

    return model.Move(
        model.Link(float(link), cipher, per_stream),
        model.End(src),
        model.End(dst),
        model.End(here),
        streams,
        tools(LAB if figures is None else figures),
        shared,
    )


@pytest.mark.parametrize(
    "link,want",
    [
        (350_000_000, "none"),  # the lab's unlimited link
        (112_000_000, "lz4"),  # 1 Gbit/s
        (24_000_000, "zstd-1-T1"),
    ],
)  # 200 Mbit/s
def test_shared_cpus_choice_counts_the_unpacking_and_the_cpu_the_tools_take(link, want):
    """Where the machines share their CPUs the stages take turns on them: the link's time for
    the packed bytes plus the CPU time packing and unpacking them. At 1 Gbit/s lz4 (the packing
    and unpacking cheaper) beats zstd's better ratio; the serial model without the unpacking took
    zstd (8.32 s, against the hand lz4 pipeline's 4.38 s)."""
    from rbkit import model

    d = model.decide(move(link, shared=True, src=1.0))
    assert d.choice == want, model.said(d)
    why = model.said(d)
    assert why.startswith(
        "link %d MB/s (CPUs shared by both ends and this machine: 1 of them)" % round(link / 1e6)
    ), why
    assert "lz4 " in why and "(ratio 2.2, packs 390, unpacks 820 a CPU; " in why, why
    assert why.endswith(": " + want.replace("zstd-1-T1", "zstd -1 -T1")) or why.endswith(
        ": none, the link is as fast as any compressor"
    ), why
    assert "\n" not in why


@pytest.mark.parametrize(
    "link,want",
    [
        (124_000_000, "lz4"),  # 1 Gbit/s, measured now
        (200_000_000, "lz4"),  # the unlimited link, loaded
        (400_000_000, "none"),
        (24_000_000, "zstd-1-T1"),
    ],
)
def test_shared_cpus_of_two_cores_run_the_stages_side_by_side(link, want):
    """The run's 2 CPUs: the stages' time spread over 2 CPUs, no faster than the slowest alone.
    At 124 MB/s (the 1 Gbit/s link as the measurement now sees it) the turns model (one CPU) said
    none: transfers of 8.1-8.4 s against 5.4-5.8 s with lz4 (lab, loaded)."""
    from rbkit import model

    assert model.decide(move(link, shared=True, src=2.0)).choice == want
    lz4 = next(o for o in model.options(move(124_000_000, shared=True, src=2.0)) if o.word == "lz4")
    assert lz4.rate == pytest.approx(270e6, rel=0.01) and lz4.bound == "turns"


# the figures (device, 16 cores): the lz4 and zstd of its log, per core, and a 1 Gbit/s
# link that one stream fills with its ssh here 12% busy (the wire, not the cipher)
def _figures(lz4, zstd1, zstd3):
    """Each tool's (packing, unpacking bytes a CPU second, ratio) as measure's figures."""
    keys = ("cpu_rate", "unpack_cpu_rate", "ratio")
    return {
        "lz4": dict(zip(keys, lz4)),
        "zstd-1": dict(zip(keys, zstd1), threads=True),
        "zstd-3": dict(zip(keys, zstd3), threads=True),
    }


DEVICE = _figures((700e6, 2_500e6, 2.4), (330e6, 1_200e6, 4.2), (160e6, 1_100e6, 4.6))
GBIT = 118_000_000


def test_three_machines_of_4_cpus_at_1_gbit_take_zstd_for_its_ratio_within_the_sources_cpus():
    """Issue 47: three machines of 4 usable CPUs each (of 16), the relay in 2 streams, the wire
    at 1 Gbit/s: the link is the limit, so a better ratio wins where the source's CPUs can pack
    it: zstd -3 at 160 MB/s a core on 4 cores, with the source's own tar and hashing
    (rbrules.streams.SENDER_CPU), moves 502 MB/s, not PAYS more than zstd -1's ratio 4.2 on the
    link, 496: zstd -1, with 2 threads a stream (the source's CPUs over the streams);
    on 44a2c10 the figures of one process each against the link took lz4 (2.4 against 4.2)."""
    from rbkit import model

    d = model.decide(move(GBIT, DEVICE, src=4, dst=4, here=4, streams=2, cipher=1e9))
    assert d.choice == "zstd-1-T2" and d.streams == 2, model.said(d)
    by = {o.word: o for o in d.options}
    assert by["lz4"].bound == "link" and by["lz4"].rate == pytest.approx(GBIT * 2.4)
    assert by["zstd-3-T2"].bound == "src"
    assert by["zstd-1-T2"].rate < by["zstd-3-T2"].rate < by["zstd-1-T2"].rate * model.PAYS
    assert by["none"].rate == pytest.approx(GBIT)
    # 4 CPUs over 2 streams: 2 threads a stream, neither fewer nor more
    assert {w for w in by if w.startswith("zstd")} == {"zstd-1-T2", "zstd-3-T2"}
    why = model.said(d)
    assert why.startswith(
        "link 118 MB/s a stream (the wire: its ssh here 12% of a CPU); 2 "
        "streams, CPUs src 4, dst 4, here 4; MB/s through: zstd -3 -T2 502 "
        "(ratio 4.6, packs 160, unpacks 1100 a CPU; the source's CPUs), zstd -1 -T2 496 "
        "(ratio 4.2, packs 330, unpacks 1200 a CPU; the link), "
    ), why
    assert why.endswith(": zstd -1 -T2"), why


# the device's venv (7.65 GB, 2026-12-07, an H100 host; docs/benchmarks.md): the ratios of the
# kit's 8 MiB sample, the per-core rates of the whole tree packed on 4 CPUs
TREE = _figures((581e6, 1_520e6, 1.67), (440e6, 1_180e6, 1.965), (351e6, 1_240e6, 2.044))


def test_apart_at_1_gbit_the_model_takes_one_stream_where_more_carry_no_more():
    """The wire (one stream's ssh here 12% busy) carries what it carries however many streams
    share it: zstd -3 in one stream moves as much as in four, so one (the relay's rule took 2)."""
    from rbkit import model

    m = move(GBIT, TREE, src=4, dst=4, here=4, streams=2, cipher=1e9)._replace(most=4)
    d = model.decide(m)
    assert d.choice.startswith("zstd-3-T") and d.streams == 1, model.said(d)
    assert max(o.rate for o in d.options) == pytest.approx(GBIT * 2.044)
    why = model.said(d)
    assert "1 to 4 streams, CPUs src 4" in why and why.endswith(" in 1 stream"), why


def test_one_stream_packs_with_every_cpu_of_the_source_not_the_fewest_that_suffice():
    """Issue 47 (the device, 2026-12-07): at 1 Gbit/s by hand zstd -3 -T2 and -T4 took the
    same time and CPU seconds, -T2's threads 94% busy at their busiest where the tree packs
    slower than its average: a thread with nothing to pack costs nothing, a spare one is
    headroom. zstd gets the source's CPUs over the streams, -T4 in one stream of 4 CPUs, -T2 in
    two, -T1 in four; on 1 CPU -T1."""
    from rbkit import model

    m = move(GBIT, TREE, src=4, dst=4, here=4, streams=2, cipher=1e9)._replace(most=4)
    d = model.decide(m)
    assert d.choice == "zstd-3-T4" and d.streams == 1, model.said(d)
    words = {(o.word, o.streams) for o in d.options if o.word.startswith("zstd-3")}
    assert words == {("zstd-3-T4", 1), ("zstd-3-T2", 2), ("zstd-3-T1", 3), ("zstd-3-T1", 4)}
    one = model.decide(move(GBIT, TREE, src=1, dst=4, here=4, streams=1, cipher=1e9))
    assert all(o.word.endswith("-T1") for o in one.options if o.word.startswith("zstd"))


def test_apart_unshaped_the_model_takes_the_streams_the_destination_can_take():
    """Unshaped, one stream's cipher was its limit (1042 MB/s, its ssh here 70% busy): N streams
    carry N times it, each stream's reader about RECEIVER_RATE, the destination's 4 CPUs over
    the cipher, the reader and tar 1.62 GB/s: none in 4 streams, not the rule's 2 (1.0)."""
    from rbkit import model
    from rbrules import streams

    link = model.link_of(1_042_000_000, {"here_cpu_s": 0.7, "here_wall_s": 1.0, "here_procs": 1})
    m = model.Move(link, model.End(4.0), model.End(4.0), model.End(4.0), 2, tools(TREE), False, 4)
    d = model.decide(m)
    assert d.choice == "none" and d.streams == 4, model.said(d)
    by = {(o.word, o.streams): o for o in d.options}
    assert by[("none", 2)].rate == pytest.approx(2 * streams.RECEIVER_RATE)
    assert by[("none", 2)].bound == by[("none", 3)].bound == "receivers"
    assert by[("none", 4)].bound == "dst" and by[("none", 4)].rate == pytest.approx(1.62e9, 0.01)
    assert model.said(d).endswith(": none in 4 streams, the link is as fast as any compressor")


def test_on_shared_cpus_the_model_keeps_the_relays_streams():
    """Where the machines share CPUs (the lab) the streams stay the relay's rule: no `most`."""
    from rbkit import measure

    doc = {"sample_bytes": 8 << 20, "tree_bytes": 7 << 30, "tools": {"lz4": dict(LAB["lz4"])}}
    two = _ends("2:2.00:0-1:2")
    assert measure.move_of(doc, GBIT, True, "auto", {}, two).most == 0
    lines = dict(ln.split("\t", 1) for ln in measure.main_lines(doc, GBIT, True, "2", ends=two))
    assert "streams" not in lines
    four = _ends("4:4.00:0-3:16", "4:4.00:4-7:16", "4:4.00:8-11:16")
    apart = dict(
        ln.split("\t", 1) for ln in measure.main_lines(doc, GBIT, False, "auto", ends=four)
    )
    assert apart["streams"] in {"1", "2", "3", "4"}


def test_the_same_move_counting_16_cpus_an_end_is_not_the_move_of_4():
    """Counted with 16 CPUs at each end (os.cpu_count, 44a2c10), 8 streams: zstd -3 packs its
    better ratio with two threads a stream there; the 4 each end may use cannot pack it as fast
    as the link carries zstd -1's."""
    from rbkit import model

    wide = model.decide(move(GBIT, DEVICE, src=16, dst=16, here=16, streams=8, cipher=1e9))
    narrow = model.decide(move(GBIT, DEVICE, src=4, dst=4, here=4, streams=2, cipher=1e9))
    assert wide.choice == "zstd-3-T2" and narrow.choice == "zstd-1-T2"


def test_a_slow_source_of_one_cpu_keeps_lz4_where_zstd_cannot_pack_fast_enough():
    """The source may use 1 CPU (a quota): zstd -1 packs 330 MB/s there, its threads have no core
    to run on, lz4 700 MB/s; beside the source's own tar and hashing its one CPU moves 282 MB/s
    with lz4, 201 with zstd -1; the link at 150 MB/s: lz4."""
    from rbkit import model

    d = model.decide(move(150_000_000, DEVICE, src=1, dst=4, here=4, streams=1, cipher=1e9))
    assert d.choice == "lz4", model.said(d)
    assert {o.word for o in d.options} >= {"zstd-1-T1", "zstd-3-T1"}
    assert not any(o.word.endswith("-T2") for o in d.options)


def test_a_link_faster_than_every_option_is_none():
    """The link (measured unshaped: 2 GB/s a stream, its cipher not the limit) moves the tree
    faster than any compressor can pack it on the source's 4 CPUs: none."""
    from rbkit import model

    d = model.decide(move(2_000_000_000, DEVICE, src=4, dst=4, here=4, streams=2, cipher=8e9))
    assert d.choice == "none", model.said(d)
    assert model.said(d).endswith(": none, the link is as fast as any compressor")
    assert all(o.rate < 2e9 * model.MARGIN for o in d.options if o.tool)


def test_a_cipher_bound_stream_scales_with_the_streams():
    """One stream at 900 MB/s with its ssh here busy 90% of a CPU: the cipher was its limit, so 2
    streams carry 1.8 GB/s, not 900 MB/s (where lz4's ratio would look worth it): none, the
    streams' readers its bound (2 x RECEIVER_RATE)."""
    from rbkit import model

    link = model.link_of(900_000_000, {"here_cpu_s": 0.9, "here_wall_s": 0.5, "here_procs": 2})
    assert link.per_stream and link.cipher == pytest.approx(1e9)
    m = move(900_000_000, DEVICE, src=4, dst=4, here=8, streams=2, cipher=1e9, per_stream=True)
    assert model.link_for(m.link, 2) == 1.8e9
    by = {o.word: o for o in model.options(m)}
    assert by["none"].rate == pytest.approx(1e9) and by["none"].bound == "receivers"
    assert model.decide(m).choice == "none"
    wire = model.link_of(118_000_000, {"here_cpu_s": 0.03, "here_wall_s": 0.5, "here_procs": 2})
    assert not wire.per_stream


def test_this_machines_cpus_bound_the_ciphers():
    """Two ciphers a packed byte here: 2 CPUs at 1 GB/s a cipher carry 1 GB/s of packed bytes."""
    from rbkit import model

    m = move(5_000_000_000, {}, src=8, dst=8, here=2, streams=4, cipher=1e9)
    none = model.options(m)[0]
    assert none.word == "none" and none.rate == pytest.approx(1e9) and none.bound == "here"


def test_a_tool_that_failed_is_said_and_not_chosen():
    from rbkit import measure

    doc = {
        "sample_bytes": 16 << 20,
        "tree_bytes": 1 << 30,
        "tools": {"zstd": {"error": "zstd is not installed here"}, "lz4": dict(LAB["lz4"])},
    }
    lines = dict(
        ln.split("\t", 1)
        for ln in measure.main_lines(doc, 24_000_000, True, "2", ends=_ends("2:2.00:0-1:2"))
    )
    assert lines["choice"] == "lz4" and "zstd: zstd is not installed here" in lines["why"], lines


def _ends(src, dst=None, here=None):
    return {"src": src, "dst": dst or src, "here": here or src}


def test_the_streams_the_model_counts_are_the_relays():
    """rbrules.streams.relay_streams for the jobs word and the three machines' CPUs; one below
    STREAMS_MIN_BYTES: the relay splits no smaller tree."""
    from rbkit import measure

    doc = {"sample_bytes": 8 << 20, "tree_bytes": 7 << 30, "tools": {"lz4": dict(LAB["lz4"])}}
    narrow = _ends("4:4.00:0-3:16", "4:4.00:4-7:16", "4:4.00:8-11:16")
    wide = _ends("16:16.00:0-15:16")
    # the relay's rule, and the most the model may choose apart: one a CPU of the fewest, <= 8
    counted = [measure.move_of(doc, GBIT, False, "auto", {}, e) for e in (narrow, wide)]
    assert [(m.streams, m.most) for m in counted] == [(2, 4), (8, 8)]
    one = _ends("16:16.00:0-15:16", "1:1.00:4:16")
    assert measure.move_of(doc, GBIT, False, "8", {}, one).streams == 1
    assert (
        measure.move_of(
            dict(doc, tree_bytes=100 << 20), GBIT, False, "auto", {}, _ends("16:16.00:0-15:16")
        ).streams
        == 1
    )
    assert [
        streams.relay_streams(j, c) for j, c in ((4, 16), (16, 4), (16, 1), (2, 2), (4, 2))
    ] == [
        2,
        4,
        1,
        1,
        2,
    ]


# ------------------------------------------------------------ the link's measurement (measure.py)
def _link_from(monkeypatch, reads, watch=None):
    """receive_link on a pipe of (seconds after the first byte, bytes) reads, its clock those
    times: what it printed and returned, and how many reads it took."""
    import os

    from rbkit import measure

    r, w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(w, b"\0")  # the first byte: the clock starts when it is read
    times = iter([0.0] + [t for t, _n in reads])
    taken = []
    real_read = os.read

    def read(fd, n):
        if fd != r:
            return real_read(fd, n)
        if len(taken) == 0:
            taken.append(0)
            return real_read(fd, n)
        if len(taken) > len(reads):
            return b""
        taken.append(1)
        return b"\0" * reads[len(taken) - 2][1]

    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "write", lambda fd, b: len(b) if fd == 1 else os.write(fd, b))
    got = measure.receive_link(r, cap=0.6, clock=lambda: next(times), watch=watch)
    for fd in (r, w, out_r, out_w):
        os.close(fd)
    return got, len(taken) - 1


def test_the_link_measurement_stops_once_its_rate_is_stable(monkeypatch):
    """A steady 100 MB/s after a slow start (the connections' and the pipes'): it stops at the
    first window past 0.25 s whose last two windows agree with the later half's rate (0.3 s), and
    that rate is the link's, not the slow start's. On 0f29d88 the link was always measured for 0.6 s
    (`timeout 0.6 cat /dev/zero`), from its first byte (the slow start counted in)."""
    reads = [(0.0501 * k, 500_000 if k <= 3 else 5_010_000) for k in range(1, 13)]
    got, taken = _link_from(monkeypatch, reads)
    assert got["stable"] and got["seconds"] == 0.301 and taken == 6, (got, taken)
    assert got["rate"] == pytest.approx(100_000_000, rel=0.01), got


def test_a_link_that_never_settles_is_measured_for_link_seconds(monkeypatch):
    """Windows alternating 60 and 140 MB/s: never stable, so it reads until LINK_SECONDS (0.6 s)
    and the rate is the later half's average."""
    reads = [(0.0501 * k, 3_006_000 if k % 2 else 7_014_000) for k in range(1, 20)]
    got, taken = _link_from(monkeypatch, reads)
    assert not got["stable"] and got["seconds"] == 0.601 and taken == 12, got
    assert got["rate"] == pytest.approx(100_000_000, rel=0.01), got


def test_a_steady_trickle_is_not_taken_for_a_stable_link(monkeypatch):
    """4 MB/s in every window (a stall under load looks as steady): the windows after 0.25 s carry
    less than LINK_MIN_BYTES, so it reads until LINK_SECONDS. Before LINK_MIN_BYTES it stopped at
    0.3 s and the lab's unlimited link went with zstd at a measured 4 MB/s."""
    reads = [(0.0501 * k, 200_400) for k in range(1, 20)]
    got, taken = _link_from(monkeypatch, reads)
    assert not got["stable"] and got["seconds"] == 0.601 and taken == 12, got


def test_the_link_rule_and_its_line(monkeypatch):
    from rbkit import measure

    assert not linkrate.link_stable([1e8, 1e8, 1e8, 1e8], 0.2)  # too soon
    assert linkrate.link_stable([1e7, 1e7, 1e8, 1e8, 1e8], 0.25)
    assert not linkrate.link_stable([1e8, 1e8, 1e8, 1e8, 9e7], 0.3)  # the last one 8% off
    assert not linkrate.link_stable([4e6] * 8, 0.4)  # 4.8 MB in the later half
    assert linkrate.link_tail([1.0, 2.0, 3.0, 4.0, 5.0]) == [3.0, 4.0, 5.0]
    assert measure.read_link("115507864 0.483 1.2 40000000 -\n") == (
        115507864,
        0.483,
        "",
        {"idle_cpus": 1.2, "bytes": 40000000},
    )
    assert measure.read_link("115507864 0.483 - 40000000 200000000 100000000 500000000 2\n") == (
        115507864,
        0.483,
        "",
        {
            "idle_cpus": None,
            "bytes": 40000000,
            "here_cpu_s": 0.2,
            "here_wait_s": 0.1,
            "here_wall_s": 0.5,
            "here_procs": 2,
        },
    )
    assert measure.read_link("error the link's rate could not be measured (no answer)\n") == (
        0,
        0.0,
        "the link's rate could not be measured (no answer)",
        {},
    )
    assert measure.read_link("")[0] == 0


# this machine's ssh masters while the link was measured (`CPU WAIT WALL COUNT`, ns): the lab's
# 1 Gbit/s link alone on its 2 cores (busy 37%, waited 0.3x their CPU time) and the unlimited one
# (busy 58%, waited 1.4x), both at load 2-3 (other work on the machine)
WIRE = "119000000 0.42 0.5 50000000 150000000 45000000 530000000 2"
CPUS = "230000000 0.6 0.0 138000000 280000000 392000000 580000000 2"


@pytest.mark.parametrize("line,tools", [(WIRE, ["link", "sample", "tool"]), (CPUS, ["link"])])
def test_one_kernel_reads_the_link_first_and_tries_no_tool_without_cpu_to_spare(
    line, tools, monkeypatch, tmp_path, capsys
):
    """`rbkit measure --link - --shared-cpu`: the link was measured alone on the CPUs (after the
    source's scan): its line is read first; a link that left CPU to spare is compared with the
    tools, one that had none (rbrules.linkrate.link_cpu_bound) is none, and no tool runs (the
    lab's unlimited link took lz4 before: transfer 4.63 s against 4.17 s with none)."""
    from rbkit import __main__ as cli
    from rbkit import measure

    order = []
    real_sample = measure.sample_of
    monkeypatch.setattr(measure, "sample_of", lambda *a: order.append("sample") or real_sample(*a))
    monkeypatch.setattr(
        measure, "rate", lambda tool, data, s, words: order.append("tool") or dict(LAB["lz4"])
    )
    monkeypatch.setattr(
        sys,
        "stdin",
        type("In", (), {"readline": lambda self: order.append("link") or line + "\n"})(),
    )
    (tmp_path / "f").write_bytes(b"x" * (2 << 20))
    assert (
        cli.main(
            [
                "measure",
                str(tmp_path),
                "--tool",
                "lz4",
                "--link",
                "-",
                "--shared-cpu",
                "--jobs",
                "2",
            ]
        )
        == 0
    )
    assert order == tools
    out = dict(ln.split("\t", 1) for ln in capsys.readouterr().out.splitlines())
    if line is WIRE:
        assert out["choice"] == "lz4", out
    else:
        assert out["choice"] == "none" and out["why"] == (
            "link 230 MB/s (CPUs shared by both ends and this machine, no CPU to spare: its "
            "ssh here busy 58% of 0.58 s, "
            "waiting for a CPU 1.4x their time on one): none, no compressor tried"
        ), out
    assert '"link_seconds": 0.' in out["json"]


def test_apart_the_tools_run_while_the_link_is_measured(monkeypatch, tmp_path, capsys):
    """Machines of their own: the sample is walked, read and packed while the link is measured;
    its line is read after the tools."""
    from rbkit import __main__ as cli
    from rbkit import measure

    order = []
    monkeypatch.setattr(
        measure, "rate", lambda tool, data, s, words: order.append("tool") or dict(LAB["lz4"])
    )
    monkeypatch.setattr(
        sys,
        "stdin",
        type(
            "In",
            (),
            {
                "readline": lambda self: (
                    order.append("link") or "24000000 0.3 - 7000000 2:2.00:0-1:2 -\n"
                )
            },
        )(),
    )
    (tmp_path / "f").write_bytes(b"x" * (2 << 20))
    assert cli.main(["measure", str(tmp_path), "--tool", "lz4", "--link", "-"]) == 0
    assert order == ["tool", "link"]
    out = capsys.readouterr().out
    assert out.startswith("choice\tlz4\n") and '"link_seconds": 0.3' in out, out
    assert '"dst": "2:2.00:0-1:2"' in out, out  # the destination's CPUs, as it said


def test_no_cpu_to_spare_needs_busy_waiting_ssh_and_a_link_that_moved():
    """rbrules.linkrate.link_cpu_bound: busy (on a CPU or waiting for one) LINK_BUSY of the time,
    waiting LINK_WAITED of their CPU time, over LINK_MIN_BYTES moved. A single cipher saturated
    on a machine of many idle cores (busy, no wait) has CPU to spare; so has a stall (the
    stream's first windows on a loaded machine: 1 Gbit/s at 3 MB/s, busy 53%, took none)."""

    assert linkrate.link_cpu_bound(0.28, 0.39, 0.58, 2, 138e6)  # the unlimited link
    assert not linkrate.link_cpu_bound(0.15, 0.045, 0.53, 2, 63e6)  # 1 Gbit/s
    assert not linkrate.link_cpu_bound(0.55, 0.01, 0.58, 1, 200e6)  # one cipher, spare cores
    assert not linkrate.link_cpu_bound(0.03, 0.06, 0.11, 2, 330_000)  # a stall
    assert not linkrate.link_cpu_bound(0, 0, 0, 0, 0)


def test_the_masters_figures_in_the_reason_and_the_json():
    from rbkit import measure

    link, _s, _w, seen = measure.read_link(CPUS)
    doc = {"sample_bytes": 16 << 20, "tools": {}}
    lines = dict(ln.split("\t", 1) for ln in measure.main_lines(doc, link, True, "2", seen=seen))
    assert lines["choice"] == "none" and '"here_wait_s": 0.392' in lines["json"]
    # machines of their own: the figures are kept, the rule is the stages' (not one kernel's)
    doc = {"sample_bytes": 16 << 20, "tools": {"lz4": dict(LAB["lz4"])}}
    lines = dict(
        ln.split("\t", 1) for ln in measure.main_lines(doc, 24_000_000, False, "2", seen=seen)
    )
    assert lines["choice"] == "lz4"


def test_the_cpus_the_link_left_idle_are_kept_in_the_figures():
    """Recorded beside the link's rate (the choice does not use them: see main_lines)."""
    from rbkit import measure

    doc = {"sample_bytes": 16 << 20, "tools": {"lz4": dict(LAB["lz4"])}}
    lines = dict(
        ln.split("\t", 1)
        for ln in measure.main_lines(
            doc, 124_000_000, True, "2", seen={"idle_cpus": 0.7}, ends=_ends("2:2.00:0-1:2")
        )
    )
    assert lines["choice"] == "lz4" and '"link_idle_cpus": 0.7' in lines["json"]


def test_the_sample_comes_from_the_scans_record_when_it_is_this_trees(tmp_path, monkeypatch):
    """On one kernel the tools run after the source's scan: its record (NAMES.stat) lists the
    files, no second walk (0.06 s against 0.17-0.27 s to read the lab's torch sample, loaded)."""
    from rbkit import manifestfile, measure

    root = tmp_path / "venv"
    root.mkdir()
    (root / "a").write_bytes(b"a" * (3 << 20))
    (root / "b").write_bytes(b"b" * 100)
    record = tmp_path / "names.stat"
    rows = b'["a", "f", 420, 3145728, null, 1]\n["b", "f", 420, 100, null, 1]\n'
    record.write_bytes(manifestfile.scan_header(str(root), ["*.pyc"], False) + rows)
    monkeypatch.setattr(measure, "_files", lambda *a: pytest.fail("walked"))
    data = measure.sample(str(root), ["*.pyc"], 2 << 20, str(record))
    assert len(data) == 2 << 20 and set(data) <= {ord("a"), ord("b")}, len(data)
    # another walk's record (other excludes): the tree is walked
    monkeypatch.undo()
    assert measure._scanned(str(record), str(root), []) is None
    assert len(measure.sample(str(root), [], 2 << 20, str(record))) > 0


def test_a_link_without_cpu_to_spare_stops_early_where_its_processes_are_seen(monkeypatch):
    """measure-link --watch (one kernel, one pid namespace): the masters' figures read each
    window; busy and waiting over the later windows past LINK_CPU_SECONDS, with LINK_MIN_BYTES
    moved: it stops there (0.2 s) rather than at LINK_SECONDS, since the rate of a link whose
    CPUs set it never settles (the lab's unlimited link: 0.6 s every time)."""
    from rbkit import measure

    ticks = iter(range(100))
    # each window: 40 ms on a CPU, 60 ms waiting, for the two masters together
    monkeypatch.setattr(
        measure,
        "proc_times",
        lambda pids: (lambda k: (40_000_000 * k, 60_000_000 * k))(next(ticks)),
    )
    reads = [(0.0501 * k, 3_006_000 if k % 2 else 7_014_000) for k in range(1, 20)]
    got, taken = _link_from(monkeypatch, reads, watch=[1, 2])
    assert got["cpu_bound"] and not got["stable"] and got["seconds"] == 0.2, got
    assert got["cpu"][3] == 2 and got["cpu"][1] > got["cpu"][0], got
    # without --watch the same windows are read until LINK_SECONDS (the test above)


def test_a_watched_pid_must_be_the_same_process():
    import os

    from rbkit import measure

    with open("/proc/self/stat", "rb") as f:
        start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    assert measure.watched(["%d:%s" % (os.getpid(), start)]) == [os.getpid()]
    assert measure.watched(["%d:1" % os.getpid()]) == []  # another process
    assert measure.watched(["999999999:1"]) == []
    cpu, waited = measure.proc_times([os.getpid()])
    assert cpu > 0 and waited >= 0


def test_the_cpu_left_idle_is_read_from_proc_stat():
    from rbkit import measure

    before = measure.cpu_times()
    assert before is not None and before[1] > 0
    assert measure.idle_cpus((0, 100), (50, 200)) == round(
        0.5 * (__import__("os").cpu_count() or 1), 2
    )
    assert measure.idle_cpus(None, before) is None and measure.idle_cpus(before, before) is None


def test_the_sample_represents_the_tree_by_its_bytes_not_its_first_files(tmp_path):
    """Issue 47: half the tree's bytes incompressible (its first files in the walk's order), half
    text that packs well: the sample holds both halves about equally, so its ratio is the tree's;
    on 44a2c10 it was the first two files of 1 MiB, all incompressible (ratio 1.0)."""
    import random

    from rbkit import measure

    rnd = random.Random(47)
    root = tmp_path / "venv"
    (root / "a").mkdir(parents=True)
    (root / "z").mkdir()  # the walk's first directory (its stack's last)
    for i in range(8):
        (root / "z" / ("lib%d.so" % i)).write_bytes(rnd.randbytes(1 << 20))
    text = b"".join(b"def f%d(x):\n    return x + %d\n" % (k, k) for k in range(40000))
    for i in range(64):
        (root / "a" / ("m%d.py" % i)).write_bytes(text[: 128 << 10])
    assert measure._files(str(root), [])[0][0].endswith("lib0.so")
    data = measure.sample(str(root), [], 2 << 20)
    assert len(data) == 2 << 20
    rand = sum(1 for k in range(0, len(data), 4096) if b"def f" not in data[k : k + 4096])
    assert 0.4 <= rand / (len(data) // 4096) <= 0.6, rand


def test_a_small_tree_is_sampled_whole(tmp_path):
    from rbkit import measure

    (tmp_path / "a").write_bytes(b"a" * 1000)
    (tmp_path / "b").write_bytes(b"b" * 10)
    assert sorted(measure.sample(str(tmp_path), [], 1 << 20)) == sorted(b"a" * 1000 + b"b" * 10)
