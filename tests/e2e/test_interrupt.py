"""Ctrl-C, a closed terminal, a kill (issue 34): a runbook that gets SIGINT, SIGTERM or SIGHUP sent
to its whole process group (what a terminal's Ctrl-C, or its closing, does) mid-transfer or at a
step boundary ends with exit 130, one `interrupted ...` line, the summary and a report.json of
this run; nothing of the run is left running here or on the hosts; the destination is untouched;
and it is back at the prompt within 5 s.

Each run makes the transfer last: one host, a slowed `tar` on PATH (the stream's sending end);
the relay, the source host's link shaped to 4 Mbit/s (tc) under a 40 MB file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_, old_install, tree_digest
from tests.e2e.test_relay import build, spec_text

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
# when the signal is sent: the log line it waits for (mid-transfer: the stream has started; the
# boundary: the first step has just finished)
POINTS = {"mid-transfer": "] streaming ", "boundary": "step preflight: ok"}
SETTLE = {"mid-transfer": 0.5, "boundary": 0.0}
PROMPT_S = 5.0
# the pictures of an earlier run (ok) in the same run directory: the interrupted run's replace them
EARLIER = "an earlier run"
EARLIER_PICTURES = ("report.html", "timeline.svg")


def interrupt(
    tmp_path: Path,
    script: Path,
    sig: signal.Signals,
    after: str,
    env: dict | None = None,
    settle: float = 0.0,
    send=os.killpg,
) -> tuple[int, float, str]:
    """Run `script` in its own process group; once its log shows `after`, send `sig` to the whole
    group (`send(pgid, sig)`). Returns its exit status, the seconds from the signal to its exit,
    and its stderr."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    # the report of an earlier run: the interrupted one must replace it
    (run / "report.json").write_text('{"outcome": "ok", "earlier": true}\n')
    for name in EARLIER_PICTURES:
        (run / name).write_text(f"<p>runbook e2e: ok ({EARLIER})</p>\n")
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        # the signals the tests send at their defaults: a pytest started as a background job of
        # a non-interactive shell has SIGINT and SIGQUIT ignored, one under nohup SIGHUP, and bash
        # then traps none of them (the run never hears the test's signal: not the runbook's doing)
        p = subprocess.Popen(
            ["env", "--default-signal=HUP,INT,QUIT,TERM", "bash", str(script)],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env=dict(os.environ, RB_RUN_DIR=str(run), **(env or {})),
        )
    try:
        deadline = time.monotonic() + 120
        while after not in err_path.read_text() and p.poll() is None:
            assert time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.02)
        # the stream's processes started (a signal that lands while bash forks a pipeline misses
        # the stages forked after it, and bash runs the trap only once the pipeline ends: see
        # README, "Running a runbook")
        time.sleep(settle)
        assert p.poll() is None, f"ended before {after!r}: {err_path.read_text()[-3000:]}"
        sent = time.monotonic()
        send(p.pid, sig)
        rc = p.wait(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    # the log's copy (tee) writes the last lines as the shell exits
    deadline = time.monotonic() + 5
    while "re-run with --from" not in err_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    return rc, seconds, err_path.read_text()


def left_running(mark: str, seconds: float = 5.0) -> list[str]:
    """The processes (here and on the lab's hosts: namespaces of this machine) whose command line
    names `mark` (this test's directory), still there after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if mark in cmd:
                found.append(f"{pid}: {cmd.strip()}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def check(
    tmp_path: Path,
    sig: signal.Signals,
    point: str,
    route: str,
    rc: int,
    seconds: float,
    err: str,
    before: dict,
    dst: Path,
) -> None:
    print(f"\n{route} {point} {sig.name}: exit {rc}, {seconds:.2f} s from the signal to the prompt")
    name = sig.name
    assert rc == 130, err[-4000:]
    assert "Broken pipe" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if "] interrupted " in x and f"({name})" in x]
    assert len(lines) == 1, err[-4000:]
    if point == "mid-transfer":
        assert "interrupted in step transfer" in lines[0], lines
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["outcome"] == "interrupted" and "earlier" not in doc, doc
    # its pictures too, saying where it stopped (issue 36)
    for name in EARLIER_PICTURES:
        text = (tmp_path / "run" / name).read_text()
        assert EARLIER not in text and "interrupted" in text, (name, text[:400], err[-3000:])
    # the summary, and the step to go on from, named
    assert "outcome: interrupted" in err, err[-3000:]
    stopped = [s["id"] for s in doc["steps"] if s["status"] == "interrupted"]
    if stopped:
        assert stopped in (["manifest"], ["transfer"]), doc["steps"]
        assert f"re-run with --from {stopped[0]} to go on" in err, err[-2000:]
    else:
        assert "interrupted after step preflight, before the next" in lines[0], lines
        assert "re-run with --from manifest to go on" in err, err[-2000:]
    assert "<step>" not in err
    # nothing of this run still running, here or on a host; the destination as it was
    left = left_running(str(tmp_path))
    assert not left, left
    assert {k: v for k, v in tree_digest(dst.parent).items() if ".rb-" not in k} == before
    assert not (dst.parent / ".venv.rb-lock").exists()
    assert seconds < PROMPT_S, f"{seconds:.2f} s from the signal to the prompt"


def one_host_slowed(payload_small, tmp_path):
    """(script, destination, its old install, env): a one-host move over an old install whose
    stream's sending end (tar -c of the names the scan listed) sleeps 30 s first."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    before = old_install(dst)
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    tar = shutil.which("tar")
    (slow / "tar").write_text(
        f'#!/bin/sh\ncase " $* " in *" --null "*) sleep 30 ;; esac\nexec {tar} "$@"\n'
    )
    (slow / "tar").chmod(0o755)
    script = compile_(tmp_path, src, dst, policy="replace")
    return script, dst, before, {"PATH": f"{slow}:{os.environ['PATH']}"}


@pytest.mark.e2e
@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_one_host_run_interrupted(payload_small, tmp_path, sig, point):
    script, dst, before, env = one_host_slowed(payload_small, tmp_path)
    rc, seconds, err = interrupt(
        tmp_path, script, sig, POINTS[point], env=env, settle=SETTLE[point]
    )
    check(tmp_path, sig, point, "one-host", rc, seconds, err, before, dst)


@pytest.mark.e2e
@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_relay_run_interrupted(clean_lab, payload_small, tmp_path, sig, point):
    lab = clean_lab
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    (src / "lib" / "blob.bin").write_bytes(os.urandom(40 << 20))
    dst = tmp_path / "d" / "venv"
    before = old_install(dst)
    script = build(tmp_path, spec_text(lab, src, dst, policy="replace"))
    ns = lab.host("src").netns
    shape = [
        "tc",
        "-n",
        ns,
        "qdisc",
        "add",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        "4mbit",
        "burst",
        "32kb",
        "latency",
        "400ms",
    ]
    subprocess.run(shape, check=True)
    try:
        rc, seconds, err = interrupt(tmp_path, script, sig, POINTS[point], settle=SETTLE[point])
    finally:
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"], check=False)
    check(tmp_path, sig, point, "relay", rc, seconds, err, before, dst)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_run_interrupted_while_finishing_reports_so(payload_small, tmp_path, sig):
    """A signal once every step has finished, while the run stops its engine and writes its report
    (issue 36): the run reported `ok` and left the earlier run's report.html in place, exit 130.
    Now its report and pictures say interrupted, and where."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = tmp_path / "d" / "venv"
    old_install(dst)
    script = compile_(tmp_path, src, dst, policy="replace")
    rc, seconds, err = interrupt(tmp_path, script, sig, "step probe: ok")
    assert rc == 130, err[-3000:]
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["outcome"] == "interrupted", (doc["outcome"], err[-3000:])
    assert doc["where"].startswith(f"while finishing ({sig.name}), after step probe"), doc["where"]
    lines = [x for x in err.splitlines() if "] interrupted " in x]
    assert len(lines) == 1 and f"({sig.name})" in lines[0], err[-3000:]
    assert "nothing to go on with" in err and "re-run with --from" not in err, err[-2000:]
    for name in EARLIER_PICTURES:
        text = (tmp_path / "run" / name).read_text()
        assert EARLIER not in text and f"while finishing ({sig.name})" in text, (name, text[:600])
    assert not left_running(str(tmp_path))
    assert seconds < PROMPT_S


def all_but_the_shell(pgid: int, sig: signal.Signals) -> None:
    """`sig` to every process of the group but its leader, the runbook's shell: what a SIGINT that
    bash lost looks like to the run (bash 5.2 drops one that lands as it reaps a foreground child,
    between wait_for's check and the trap's handler put back: runtime/signals.sh.j2)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == pgid:
            continue
        try:
            if os.getpgid(int(pid)) == pgid:
                os.kill(int(pid), sig)
        except OSError:
            continue


@pytest.mark.e2e
@pytest.mark.parametrize("point", list(POINTS))
def test_a_sigint_bash_lost_is_acted_on(payload_small, tmp_path, point):
    """The flaky relay run (SIGINT at the step boundary, under load): the runbook's shell lost the
    SIGINT, its ssh clients died of it, and the run went on to fail in the next step (exit 1, no
    `interrupted` line). Made certain here: the signal reaches every process of the group but the
    shell. The witness (rb::witness) hears it and sends it again; exit 130, `interrupted`, once."""
    script, dst, before, env = one_host_slowed(payload_small, tmp_path)
    rc, seconds, err = interrupt(
        tmp_path,
        script,
        signal.SIGINT,
        POINTS[point],
        env=env,
        settle=SETTLE[point],
        send=all_but_the_shell,
    )
    check(tmp_path, signal.SIGINT, point, "one-host", rc, seconds, err, before, dst)
