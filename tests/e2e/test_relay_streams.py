"""The relay in streams side by side (issue 37): src cannot reach dst; this machine runs one pair of
ssh clients a stream (`rbkit engine relay`), stream 0 over the run's connections, every other
over connections of its own. 300 MB (big_source) with jobs 4: two streams."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import big_source
from tests.e2e.test_relay import _staged_bytes, build, cut_source, report, run, snapshot, spec_text


def accepted(lab, name: str) -> int:
    """The connections the host's sshd accepted so far (its log: one line per authentication)."""
    return lab.host(name).log.read_text(errors="replace").count("Accepted publickey")


def streams_spec(lab, src: Path, dst: Path, jobs: int = 4) -> str:
    return spec_text(lab, src, dst, compression="none").replace("  jobs: 2\n", f"  jobs: {jobs}\n")


def _gated_ends(lab, host: str, what: bytes) -> list[int]:
    """The pids of `rbkit engine send`/`receive` ends (`what`) in host's namespace."""
    from tests.lab.netlab import netns_pids

    found = []
    for pid in netns_pids(lab.host(host).netns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine" in argv and what in argv and b"--gate" in argv:
            found.append(pid)
    return found


@pytest.mark.e2e
def test_a_relay_of_300_mb_goes_in_two_streams_each_over_its_own_connections(
    clean_lab, payload_small, tmp_path
):
    """jobs 4, 300 MB: two streams through this machine; src's and dst's sshd each accept a
    second connection for the second stream (the run's own is one); the tree arrives whole, the
    two names of one inode as one inode, verify takes both streams' digests (reads no file),
    the progress lines sum both streams."""
    lab = clean_lab
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "dst" / "venv"
    before = {h: accepted(lab, h) for h in ("src", "dst")}
    r = run(tmp_path, build(tmp_path, streams_spec(lab, src, dst)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "relay: 2 streams side by side" in r.stderr, r.stderr[-3000:]
    for h in ("src", "dst"):
        # the run's connection (preflight's master) and the second stream's own
        assert accepted(lab, h) - before[h] >= 2, (h, lab.host(h).log.read_text()[-2000:])
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert steps["transfer"]["detail"].endswith("2 streams side by side"), steps["transfer"]
    receive = next(e for e in steps["transfer"]["engine"] if e["step"] == "receive")
    assert receive["facts"]["streams"] == 2, receive
    # every file by the streams' digests, none read again
    verify = next(e for e in steps["verify"]["engine"] if e["step"] == "verify")
    assert verify["facts"]["hashed"] == 0 and verify["facts"]["streamed"] > 0, verify
    assert "checked by the stream's sha256" in steps["verify"]["detail"], steps["verify"]
    said = re.findall(r"progress: ([0-9.]+) MB of ([0-9.]+) MB \((\d+)%\)", r.stderr)
    assert said and float(said[-1][0]) >= 300 and said[-1][2] == "100", r.stderr[-3000:]
    moved = {
        k: v for k, v in snapshot(src).items() if "__pycache__" not in k and not k.endswith(".pyc")
    }
    got = snapshot(dst)
    got.pop(".rb-manifest.jsonl", None)
    assert set(got) >= set(moved) and all(
        got[k] == moved[k] for k in moved if k.startswith("lib/")
    ), sorted(set(moved) ^ set(got))
    assert os.path.samefile(
        dst / "lib" / "big" / "part0.bin", dst / "lib" / "big" / "part0-again.bin"
    )
    out = lab.ssh("dst", [str(dst / "bin" / "payload-hello")], check=True).stdout
    assert str(dst) in out


@pytest.mark.e2e
def test_a_relay_stream_whose_receiving_end_is_killed_is_named_and_nothing_is_installed(
    clean_lab, payload_small, tmp_path
):
    """Two streams; the receiving end of one (`engine receive --part`) killed (-9) mid-stream:
    the run fails in transfer naming that stream, the other is stopped, the destination is
    untouched."""
    lab = clean_lab
    src = big_source(payload_small.venv, tmp_path / "src")
    for i in range(3, 6):  # 300 MB more: time to find and kill one end
        (src / "lib" / "big" / f"part{i}.bin").write_bytes(bytes([i + 1]) * (100 << 20))
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, streams_spec(lab, src, dst))
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    staging = tmp_path / "dst" / ".venv.rb-staging"
    killed = []
    while time.monotonic() < deadline and proc.poll() is None and not killed:
        ends = _gated_ends(lab, "dst", b"receive")
        if len(ends) == 2 and staging.is_dir() and _staged_bytes(staging) > 100 << 20:
            os.kill(ends[1], 9)
            killed.append(ends[1])
        time.sleep(0.02)
    _out, err = proc.communicate(timeout=300)
    assert killed, "no two receiving ends were seen: " + err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    assert "FAILED in step transfer" in err, err[-3000:]
    assert re.search(r"FAILED in step transfer on host dst: .*stream [12] of 2: ", err), err[-3000:]
    assert "stopped here (another stream failed)" in err, err[-3000:]
    assert re.search(
        r"rbkit engine relay: .*stream [12]/2: (pack on src exited \d+; )?unpack on dst "
        r"exited \d+",
        err,
    ), err[-3000:]
    assert not dst.exists()
    assert report(tmp_path)["outcome"] == "failed"


@pytest.mark.e2e
def test_a_destination_that_refuses_new_connections_gets_one_stream_and_the_run_succeeds(
    clean_lab, payload_small, tmp_path
):
    """dst's listening sshd is stopped once the transfer starts (its open connection, the run's,
    goes on): the second stream's own connection to dst is refused; the relay says so and goes
    in one stream over the run's connection; the run succeeds."""
    lab = clean_lab
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, streams_spec(lab, src, dst))
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "run" / "run.log"
    deadline = time.monotonic() + 240
    stopped = False
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and " streaming src:" in log.read_text(errors="replace"):
            lab.stop_sshd("dst")
            stopped = True
            break
        time.sleep(0.01)
    _out, err = proc.communicate(timeout=300)
    assert stopped, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert re.search(
        r"relay: stream 2: dst refused its own connection \(.*[Cc]onnection refused", err
    ), err[-3000:]
    assert "relay: 1 stream instead of 2: 1 extra connection refused" in err, err[-3000:]
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert "streams side by side" not in steps["transfer"]["detail"], steps["transfer"]
    assert steps["verify"]["status"] == "ok", steps["verify"]
    assert (dst / "lib" / "big" / "part2.bin").read_bytes() == bytes([3]) * (100 << 20)
    assert os.path.samefile(
        dst / "lib" / "big" / "part0.bin", dst / "lib" / "big" / "part0-again.bin"
    )


@pytest.mark.e2e
def test_a_relay_in_two_streams_cut_at_half_is_resumed(
    clean_lab, payload_small, ext4_dir, tmp_path
):
    """Issue 34 with streams: a 700 MB relay in two streams, both receiving ends killed (-9) when
    half the tree is staged: the run fails in transfer, the destination untouched, the staging
    kept. The re-run resumes (sends only what the staging lacks), verify passes, and the install
    is the source's tree with its hard link one inode."""
    lab = clean_lab
    src = ext4_dir / "src"
    tree = cut_source(payload_small.venv, src)
    dst = ext4_dir / "opt" / "venv"
    dst.parent.mkdir()
    script = build(tmp_path, streams_spec(lab, src, dst))
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = ext4_dir / "opt" / ".venv.rb-staging"
    deadline = time.monotonic() + 240
    cut = 0
    while time.monotonic() < deadline and proc.poll() is None and not cut:
        ends = _gated_ends(lab, "dst", b"receive")
        if len(ends) == 2 and staging.is_dir() and _staged_bytes(staging) >= 0.5 * tree:
            for pid in ends:
                os.kill(pid, 9)
            cut = _staged_bytes(staging)
        time.sleep(0.02)
    _out, err = proc.communicate(timeout=300)
    assert cut, "the stream ended before it could be cut: " + err[-2000:]
    assert "relay: 2 streams side by side" in err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    assert "FAILED in step transfer on host dst" in err, err[-3000:]
    assert not dst.exists() and staging.is_dir()

    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-5000:]
    line = next(ln for ln in r.stderr.splitlines() if "resuming: " in ln)
    assert "already staged" in line, line
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert "resumed" in steps["transfer"]["detail"], steps["transfer"]
    receive = next(e for e in steps["transfer"]["engine"] if e["step"] == "receive")
    # at most what was not staged, and the two files the two streams were writing when cut
    sent = receive["facts"]["stream_bytes"]
    assert sent <= tree - cut + 2 * (50 << 20) + (4 << 20) and sent < 0.75 * tree, (sent, cut, tree)
    assert steps["verify"]["status"] == "ok", steps["verify"]
    moved = {
        k: v
        for k, v in snapshot(src / "lib").items()
        if "__pycache__" not in k and not k.endswith(".pyc")
    }
    assert snapshot(dst / "lib") == moved
    assert os.path.samefile(
        dst / "lib" / "big" / "part00.bin", dst / "lib" / "big" / "part00-again.bin"
    )
    assert not staging.exists()
