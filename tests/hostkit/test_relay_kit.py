"""`rbkit engine relay` (issue 37) against stand-ins: an `ssh` that runs the far side's line here
and refuses connections as told, and ends that speak the gate (`ready` / `split N` / `go I N`)
without tar. What is checked: how many streams, the fall back to fewer when connections are
refused (the list split again for those that answered), which part each end is told, the one
answer, and a failed stream named with the others stopped. The real ends:
tests/e2e/test_relay_streams.py."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rbkit import relay
from rbrules import cpus, streams

FAKE_SSH = r"""#!/bin/sh
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
"""

# an end that speaks the gate: send writes "part I of N" as its stream; receive reads it, says
# progress and answers (or fails, for the part named in $FAIL_PART)
FAKE_KIT = r"""
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
print("gate\tready\t8" + os.environ.get("DST_CPUS", ""), flush=True)
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
"""


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
        # this machine of 16 usable CPUs, whatever the machine running the test (the ends say
        # none: their jobs alone count)
        return relay.Relay(
            src,
            dst,
            ["engine", "send", "/root", "/names"],
            ["engine", "receive"],
            str(tmp_path / "parts"),
            jobs,
            "none",
            most,
            here=cpus.Usable(16, 16.0, tuple(range(16)), 16, "16 of 16"),
        )

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
    assert (
        "stream 2: dst refused its own connection (ssh: connect to host dst port 22: "
        "Connection refused)" in err
    )
    assert (
        "3 streams side by side" in err
        and "3 streams instead of 4: 1 extra connection refused" in err
    ), err
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
    assert (
        "1 stream (the fewest jobs of the three machines is 3; CPUs usable: here 16 of 16)" in err
    ), err
    assert log.read_text().splitlines() == ["receive 0 1 got 'part 0 of 1\\n'"]
    assert out.splitlines()[-1] == "done\tok\td" and "streams" not in out, out


def test_an_end_that_may_use_one_cpu_gets_one_stream_and_the_relay_says_why(
    ends, capsys, monkeypatch
):
    """Issue 47: the destination says 8 jobs but may use 1 CPU of 16 (its gate line's CPUs): one
    stream, not four; said with each machine's CPUs (44a2c10 took four: jobs alone counted)."""
    make, _refuse, log = ends
    monkeypatch.setenv("DST_CPUS", "\t1:1.00:5:16")
    rc, out, err = run(make(jobs=8), capsys)
    assert rc == 0, err
    assert (
        "1 stream (no more streams than the fewest CPUs a machine may use, 1; CPUs usable: "
        "here 16 of 16, dst 1 of 16 (affinity 5))" in err
    ), err
    assert log.read_text().splitlines() == ["receive 0 1 got 'part 0 of 1\\n'"]


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
    assert relay.streams.stream_count is streams.stream_count
    assert [streams.stream_count(j) for j in (1, 3, 4, 16, 64)] == [1, 1, 2, 8, 8]
