"""`rbkit engine relay` (issue 37) against stand-ins: an `ssh` that runs the far side's line here
and refuses connections as told, and ends that speak the gate (`ready` / `split N` / `go I N`)
without tar. What is checked: how many streams, the fall back to fewer when connections are
refused (the list split again for those that answered), which part each end is told, the one
answer, and a failed stream named with the others stopped. The real ends: tests/e2e/test_relay_streams.py."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from rbkit import relay, stream

FAKE_SSH = r'''#!/bin/sh
# ssh stand-in: the last word is the far side's line, run here; a connection of its own
# (ControlPath=none) to a host named by a file $REFUSE_DIR/HOST is refused, the first one only
for last; do :; done
case " $* " in
  *" ControlPath=none "*)
    for host in src dst; do
      case " $* " in *" -- $host "*)
        if [ -e "$REFUSE_DIR/$host" ] && mkdir "$REFUSE_DIR/$host.taken" 2>/dev/null; then
          echo "ssh: connect to host $host port 22: Connection refused" >&2
          exit 255
        fi ;;
      esac
    done ;;
esac
exec sh -c "$last"
'''

# an end that speaks the gate: send writes "part I of N" as its stream; receive reads it, says
# progress and answers (or fails, for the part named in $FAIL_PART)
FAKE_KIT = r'''
import json, os, sys
from rbkit.relay import read_line
args = sys.argv[1:]
log = open(os.environ["LOG"], "a")
if args[:2] == ["engine", "send"]:
    sys.stderr.write("rbkit-gate ready 8\n"); sys.stderr.flush()
    while True:
        words = read_line(0).split()
        if words[:1] == ["split"]:
            sys.stderr.write("rbkit-gate parts %s\n" % words[1]); sys.stderr.flush()
            continue
        if words[:1] != ["go"]:
            sys.exit(3)
        sys.stdout.write("part %s of %s\n" % (words[1], words[2])); sys.exit(0)
print("gate\tready\t8", flush=True)
words = read_line(0).split()
if words[:1] != ["go"]:
    sys.exit(3)
data = sys.stdin.read()
log.write("receive %s %s got %r\n" % (words[1], words[2], data)); log.flush()
if words[1] == os.environ.get("FAIL_PART"):
    print("done\tfailed\ttar: Unexpected EOF in archive", flush=True); sys.exit(1)
print("progress\t%d" % len(data))
facts = {"streamed": 1, "staging": "/s"}
print("event\t" + json.dumps({"step": "receive", "status": "ok", "detail": "d", "duration_s": 1,
                              "facts": facts}))
print("done\tok\td", flush=True)
'''


@pytest.fixture
def ends(tmp_path, monkeypatch):
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    kit = tmp_path / "kit.py"
    kit.write_text(FAKE_KIT)
    refuse = tmp_path / "refuse"
    refuse.mkdir()
    monkeypatch.setenv("REFUSE_DIR", str(refuse))
    monkeypatch.setenv("LOG", str(tmp_path / "log"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2] / "hostkit"))
    words = relay.shq(sys.executable) + " " + relay.shq(str(kit))

    def make(jobs: int = 8, most: int = 8) -> relay.Relay:
        src = relay.End("src", "%s -o BatchMode=yes -- src" % ssh, str(tmp_path), words)
        dst = relay.End("dst", "%s -o BatchMode=yes -- dst" % ssh, str(tmp_path), words)
        return relay.Relay(src, dst, ["engine", "send", "/root", "/names"],
                           ["engine", "receive"], str(tmp_path / "parts"), jobs, "none", most)
    return make, refuse, tmp_path / "log"


def run(r: relay.Relay, capsys) -> tuple:
    out = io.StringIO()
    old = sys.stdout
    sys.stdout = out
    try:
        rc = r.run()
    finally:
        sys.stdout = old
    return rc, out.getvalue(), capsys.readouterr().err


def test_four_streams_with_one_connection_refused_go_in_three(ends, capsys):
    make, refuse, log = ends
    (refuse / "dst").write_text("once\n")
    rc, out, err = run(make(jobs=8, most=4), capsys)
    assert rc == 0, err
    assert "stream 2: dst refused its own connection (ssh: connect to host dst port 22: " \
           "Connection refused)" in err
    assert "3 streams side by side" in err and "3 streams instead of 4: 1 extra connection " \
           "refused" in err, err
    got = sorted(line for line in log.read_text().splitlines())
    assert got == ["receive %d 3 got 'part %d of 3\\n'" % (i, i) for i in range(3)], got
    lines = out.splitlines()
    assert "set\tstreams\t3" in lines and lines[-1].startswith("done\tok\t"), out
    event = json.loads(next(ln for ln in lines if ln.startswith("event\t")).split("\t", 1)[1])
    assert event["facts"]["streamed"] == 3, event


def test_one_stream_when_the_fewest_jobs_is_below_four_and_its_answer_is_passed_on(ends, capsys):
    make, _refuse, log = ends
    rc, out, err = run(make(jobs=3), capsys)
    assert rc == 0, err
    assert "1 stream (the fewest jobs of the three machines is 3)" in err, err
    assert log.read_text().splitlines() == ["receive 0 1 got 'part 0 of 1\\n'"]
    assert out.splitlines()[-1] == "done\tok\td" and "streams" not in out, out


def test_the_relay_leaves_no_thread_behind(ends, capsys):
    """Once the relay is over, none of its threads is left (its watch on the runbook polled on
    in the process, which then could not fork: test_engine's early-check walk, run after it)."""
    import signal
    import threading

    # run() sets its own handlers: put back after
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    make, _refuse, _log = ends
    before = set(threading.enumerate())
    try:
        rc, _out, err = run(make(jobs=3), capsys)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert rc == 0, err
    assert set(threading.enumerate()) <= before


def test_a_failed_stream_is_named_and_the_others_are_stopped_or_done(ends, capsys, monkeypatch):
    make, _refuse, _log = ends
    monkeypatch.setenv("FAIL_PART", "1")
    rc, out, err = run(make(jobs=4), capsys)
    assert rc == 1
    assert out.splitlines()[-1] == "done\tfailed\tstream 2 of 2: tar: Unexpected EOF in archive"
    assert "rbkit engine relay: " in err and "stream 2/2: unpack on dst exited 1" in err, err


def test_the_relays_stream_count_is_the_other_routes_rule():
    assert relay.stream.stream_count is stream.stream_count
    assert [stream.stream_count(j) for j in (1, 3, 4, 16, 64)] == [1, 1, 2, 8, 8]


# ------------------------------------------------------------ the compression choice (measure.py)
# figures as `rbkit measure` reported them on the lab's torch venv (2 cores, one kernel):
# bytes per CPU second packing and unpacking, and the ratio
LAB = {"lz4": {"rate": 390_000_000, "cpu_rate": 390_000_000, "unpack_cpu_rate": 820_000_000,
               "ratio": 2.23},
       "zstd": {"rate": 280_000_000, "cpu_rate": 280_000_000, "unpack_cpu_rate": 670_000_000,
                "ratio": 3.0}}


@pytest.mark.parametrize("link,want", [(350_000_000, "none"),     # the lab's unlimited link
                                       (112_000_000, "lz4"),      # 1 Gbit/s
                                       (24_000_000, "zstd")])     # 200 Mbit/s
def test_one_kernel_choice_counts_the_unpacking_and_the_cpu_the_tools_take(link, want):
    """On one kernel the stages take turns on the CPUs: the link's time for the packed bytes plus
    the CPU time packing and unpacking them. At 1 Gbit/s lz4 (the packing and unpacking cheaper)
    beats zstd's better ratio; the serial model without the unpacking took zstd (8.32 s, against
    the hand lz4 pipeline's 4.38 s)."""
    from rbkit import measure
    choice, why = measure.choose(link, LAB, shared=True)
    assert choice == want, why
    assert why.startswith("link %d MB/s (one kernel" % round(link / 1e6)), why
    assert "lz4 390 MB/s on this tree (ratio 2.2, unpacked at 820 MB/s)" in why, why
    assert why.endswith(": " + want) or why.endswith(
        ": none, the link is as fast as any compressor"), why


@pytest.mark.parametrize("link,want", [(124_000_000, "lz4"),      # 1 Gbit/s, measured now
                                       (200_000_000, "lz4"),      # the unlimited link, loaded
                                       (400_000_000, "none"),
                                       (24_000_000, "zstd")])
def test_one_kernel_of_two_cores_runs_the_stages_side_by_side(link, want):
    """The run's 2 jobs: the stages' time spread over 2 CPUs, no faster than the slowest alone.
    At 124 MB/s (the 1 Gbit/s link as the measurement now sees it) the turns model (one CPU) said
    none: transfers of 8.1-8.4 s against 5.4-5.8 s with lz4 (lab, loaded)."""
    from rbkit import measure
    assert measure.choose(link, LAB, shared=True, cpus=2)[0] == want
    assert measure.through(124_000_000, LAB["lz4"], True, 1, 2) == pytest.approx(270e6, rel=0.01)


def test_machines_of_their_own_take_the_slowest_stage_and_count_the_streams():
    """Separate machines: the slowest of link x ratio, the packers (one a stream) and the
    unpackers; a fast link with one lz4 of 390 MB/s is none, with four streams (four packers) lz4."""
    from rbkit import measure
    one = {"lz4": dict(LAB["lz4"])}
    assert measure.choose(1_000_000_000, one, streams=1)[0] == "none"
    assert measure.choose(1_000_000_000, one, streams=4)[0] == "lz4"
    assert measure.through(100_000_000, one["lz4"], False, 4) == pytest.approx(223_000_000)


def test_a_tool_that_failed_is_said_and_not_chosen():
    from rbkit import measure
    choice, why = measure.choose(24_000_000, {"zstd": {"error": "zstd is not installed here"},
                                              "lz4": LAB["lz4"]}, shared=True)
    assert choice == "lz4" and "zstd: zstd is not installed here" in why, why


# ------------------------------------------------------------ the link's measurement (measure.py)
def _link_from(monkeypatch, reads, watch=None):
    """receive_link on a pipe of (seconds after the first byte, bytes) reads, its clock those
    times: what it printed and returned, and how many reads it took."""
    import os
    from rbkit import measure
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(w, b"\0")                    # the first byte: the clock starts when it is read
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
    first window past 0.25 s whose last two windows agree with the later half's rate (0.3 s), and that
    rate is the link's, not the slow start's. On 0f29d88 the link was always measured for 0.6 s
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
    from rbrules import common
    assert not common.link_stable([1e8, 1e8, 1e8, 1e8], 0.2)       # too soon
    assert common.link_stable([1e7, 1e7, 1e8, 1e8, 1e8], 0.25)
    assert not common.link_stable([1e8, 1e8, 1e8, 1e8, 9e7], 0.3)  # the last one 8% off
    assert not common.link_stable([4e6] * 8, 0.4)                  # 4.8 MB in the later half
    assert common.link_tail([1.0, 2.0, 3.0, 4.0, 5.0]) == [3.0, 4.0, 5.0]
    assert measure.read_link("115507864 0.483 1.2 40000000 -\n") == (
        115507864, 0.483, "", {"idle_cpus": 1.2, "bytes": 40000000})
    assert measure.read_link("115507864 0.483 - 40000000 200000000 100000000 500000000 2\n") == (
        115507864, 0.483, "", {"idle_cpus": None, "bytes": 40000000, "here_cpu_s": 0.2,
                               "here_wait_s": 0.1, "here_wall_s": 0.5, "here_procs": 2})
    assert measure.read_link("error the link's rate could not be measured (no answer)\n") == (
        0, 0.0, "the link's rate could not be measured (no answer)", {})
    assert measure.read_link("")[0] == 0


# this machine's ssh masters while the link was measured (`CPU WAIT WALL COUNT`, ns): the lab's
# 1 Gbit/s link alone on its 2 cores (busy 37%, waited 0.3x their CPU time) and the unlimited one
# (busy 58%, waited 1.4x), both at load 2-3 (other work on the machine)
WIRE = "119000000 0.42 0.5 50000000 150000000 45000000 530000000 2"
CPUS = "230000000 0.6 0.0 138000000 280000000 392000000 580000000 2"


@pytest.mark.parametrize("line,tools", [(WIRE, ["link", "sample", "tool"]), (CPUS, ["link"])])
def test_one_kernel_reads_the_link_first_and_tries_no_tool_without_cpu_to_spare(
        line, tools, monkeypatch, tmp_path, capsys):
    """`rbkit measure --link - --shared-cpu`: the link was measured alone on the CPUs (after the
    source's scan): its line is read first; a link that left CPU to spare is compared with the
    tools, one that had none (rbrules.common.link_cpu_bound) is none, and no tool runs (the
    lab's unlimited link took lz4 before: transfer 4.63 s against 4.17 s with none)."""
    from rbkit import __main__ as cli, measure
    order = []
    real_sample = measure.sample
    monkeypatch.setattr(measure, "sample", lambda *a: order.append("sample") or real_sample(*a))
    monkeypatch.setattr(measure, "rate", lambda tool, data, s: order.append("tool") or dict(
        LAB["lz4"]))
    monkeypatch.setattr(sys, "stdin", type("In", (), {"readline": lambda self: order.append(
        "link") or line + "\n"})())
    (tmp_path / "f").write_bytes(b"x" * (2 << 20))
    assert cli.main(["measure", str(tmp_path), "--tool", "lz4", "--link", "-", "--shared-cpu",
                     "--jobs", "2"]) == 0
    assert order == tools
    out = dict(ln.split("\t", 1) for ln in capsys.readouterr().out.splitlines())
    if line is WIRE:
        assert out["choice"] == "lz4", out
    else:
        assert out["choice"] == "none" and out["why"] == (
            "link 230 MB/s (one kernel, no CPU to spare: its ssh here busy 58% of 0.58 s, "
            "waiting for a CPU 1.4x their time on one): none, no compressor tried"), out
    assert '"link_seconds": 0.' in out["json"]


def test_apart_the_tools_run_while_the_link_is_measured(monkeypatch, tmp_path, capsys):
    """Machines of their own: the sample is walked, read and packed while the link is measured;
    its line is read after the tools."""
    from rbkit import __main__ as cli, measure
    order = []
    monkeypatch.setattr(measure, "rate", lambda tool, data, s: order.append("tool") or dict(
        LAB["lz4"]))
    monkeypatch.setattr(sys, "stdin", type("In", (), {"readline": lambda self: order.append(
        "link") or "24000000 0.3 - 7000000 -\n"})())
    (tmp_path / "f").write_bytes(b"x" * (2 << 20))
    assert cli.main(["measure", str(tmp_path), "--tool", "lz4", "--link", "-"]) == 0
    assert order == ["tool", "link"]
    out = capsys.readouterr().out
    assert out.startswith("choice\tlz4\n") and '"link_seconds": 0.3' in out, out


def test_no_cpu_to_spare_needs_busy_waiting_ssh_and_a_link_that_moved():
    """rbrules.common.link_cpu_bound: busy (on a CPU or waiting for one) LINK_BUSY of the time,
    waiting LINK_WAITED of their CPU time, over LINK_MIN_BYTES moved. A single cipher saturated
    on a machine of many idle cores (busy, no wait) has CPU to spare; so has a stall (the
    stream's first windows on a loaded machine: 1 Gbit/s at 3 MB/s, busy 53%, took none)."""
    from rbrules import common
    assert common.link_cpu_bound(0.28, 0.39, 0.58, 2, 138e6)              # the unlimited link
    assert not common.link_cpu_bound(0.15, 0.045, 0.53, 2, 63e6)          # 1 Gbit/s
    assert not common.link_cpu_bound(0.55, 0.01, 0.58, 1, 200e6)          # one cipher, spare cores
    assert not common.link_cpu_bound(0.03, 0.06, 0.11, 2, 330_000)        # a stall
    assert not common.link_cpu_bound(0, 0, 0, 0, 0)


def test_the_masters_figures_in_the_reason_and_the_json():
    from rbkit import measure
    link, _s, _w, seen = measure.read_link(CPUS)
    doc = {"sample_bytes": 16 << 20, "tools": {}}
    lines = dict(ln.split("\t", 1) for ln in measure.main_lines(doc, link, True, 2, seen=seen))
    assert lines["choice"] == "none" and '"here_wait_s": 0.392' in lines["json"]
    # machines of their own: the figures are kept, the rule is the stages' (not one kernel's)
    doc = {"sample_bytes": 16 << 20, "tools": {"lz4": dict(LAB["lz4"])}}
    lines = dict(ln.split("\t", 1) for ln in measure.main_lines(doc, 24_000_000, False, 2,
                                                                 seen=seen))
    assert lines["choice"] == "lz4"


def test_the_cpus_the_link_left_idle_are_kept_in_the_figures():
    """Recorded beside the link's rate (the choice does not use them: see main_lines)."""
    from rbkit import measure
    doc = {"sample_bytes": 16 << 20, "tools": {"lz4": dict(LAB["lz4"])}}
    lines = dict(ln.split("\t", 1) for ln in measure.main_lines(doc, 124_000_000, True, 2,
                                                                 seen={"idle_cpus": 0.7}))
    assert lines["choice"] == "lz4" and '"link_idle_cpus": 0.7' in lines["json"]


def test_the_sample_comes_from_the_scans_record_when_it_is_this_trees(tmp_path, monkeypatch):
    """On one kernel the tools run after the source's scan: its record (NAMES.stat) lists the
    files, no second walk (0.06 s against 0.17-0.27 s to read the lab's torch sample, loaded)."""
    from rbkit import manifest, measure
    root = tmp_path / "venv"
    root.mkdir()
    (root / "a").write_bytes(b"a" * (3 << 20))
    (root / "b").write_bytes(b"b" * 100)
    record = tmp_path / "names.stat"
    rows = b'["a", "f", 420, 3145728, null, 1]\n["b", "f", 420, 100, null, 1]\n'
    record.write_bytes(manifest.scan_header(str(root), ["*.pyc"], False) + rows)
    monkeypatch.setattr(measure, "_files", lambda *a: pytest.fail("walked"))
    data = measure.sample(str(root), ["*.pyc"], 2 << 20, str(record))
    assert data == b"a" * (1 << 20), len(data)          # at most PER_FILE of one file
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
    monkeypatch.setattr(measure, "proc_times", lambda pids: (lambda k: (40_000_000 * k,
                                                                         60_000_000 * k))(next(ticks)))
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
    assert measure.watched(["%d:1" % os.getpid()]) == []              # another process
    assert measure.watched(["999999999:1"]) == []
    cpu, waited = measure.proc_times([os.getpid()])
    assert cpu > 0 and waited >= 0


def test_the_cpu_left_idle_is_read_from_proc_stat():
    from rbkit import measure
    before = measure.cpu_times()
    assert before is not None and before[1] > 0
    assert measure.idle_cpus((0, 100), (50, 200)) == round(0.5 * (__import__("os").cpu_count() or 1), 2)
    assert measure.idle_cpus(None, before) is None and measure.idle_cpus(before, before) is None
