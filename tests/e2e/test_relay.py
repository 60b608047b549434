"""The real relay: runbooks moving a real venv between real sshd hosts (network namespaces).

src cannot reach dst; this machine reaches both. Destinations live on the loop-mounted ext4 scratch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from compiler import cli
from tests.e2e.test_local_runbook import big_source

HOST = """  {name}:
    ssh: root@{addr}
    identity_file: {identity}
    options: {{UserKnownHostsFile: {known_hosts}, GlobalKnownHostsFile: /dev/null}}
"""


def spec_text(
    lab,
    src: Path,
    dst: Path,
    *,
    name="relay",
    route="relay",
    policy="refuse",
    checks="",
    compression="auto",
    extra="",
) -> str:
    hosts = "".join(
        HOST.format(
            name=n, addr=lab.host(n).addr, identity=lab.identity, known_hosts=lab.known_hosts
        )
        for n in ("src", "dst")
    )
    return (
        f"name: {name}\nhosts:\n{hosts}transfer:\n  from: src:{src}\n  to: dst:{dst}\n"
        f"  route: {route}\n  compression: {compression}\n  on_existing: {policy}\n"
        f"  exclude: [__pycache__, '*.pyc']\n  jobs: 2\n{extra}{checks}"
    )


def build(tmp_path: Path, text: str, name: str = "relay") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(text)
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    return tmp_path / f"{name}.sh"


def run(
    tmp_path: Path, script: Path, *args: str, timeout: int = 900
) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "report.json").read_text())


def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (
            p.read_bytes()
            if p.is_file() and not p.is_symlink()
            else os.readlink(p)
            if p.is_symlink()
            else "d"
        )
        for p in sorted(root.rglob("*"))
    }


def cut_source(venv: Path, src: Path) -> int:
    """A copy of `venv` at `src` with 14 files of 50 MB in lib/big (700 MB: time to cut a relay
    at about half) and a hard link between two of them; returns the tree's bytes."""
    subprocess.run(["cp", "-a", str(venv), str(src)], check=True)
    big = src / "lib" / "big"
    big.mkdir()
    for i in range(14):
        (big / f"part{i:02d}.bin").write_bytes(bytes([i + 1]) * (50 << 20))
    os.link(big / "part00.bin", big / "part00-again.bin")
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())


def moved_once(lab, payload, tmp_path: Path, *, compression: str) -> tuple[Path, Path, Path]:
    """A copy of `payload`'s venv as the source, moved once to dst (on_existing replace), for a
    re-run after a change: (source, destination, runbook)."""
    src = tmp_path / "src" / "venv"
    src.parent.mkdir()
    subprocess.run(["cp", "-a", str(payload.venv), str(src)], check=True)
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(lab, src, dst, policy="replace", compression=compression))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    return src, dst, script


def remove_left_kits(err: str) -> dict[str, Path]:
    """The kit directories a run says it left on hosts that stopped answering, by host, each
    removed (the lab's hosts share this machine's /tmp, and a lab leaves nothing behind)."""
    left = {m[0]: Path(m[1]) for m in re.findall(r"\] left on (\w+): (/tmp/rbkit\.\w+) ", err)}
    for d in left.values():
        assert d.is_dir(), d
        shutil.rmtree(d)
    return left


CHECKS = """checks:
  - torch: {version: "2.13.0"}
  - imports: [torch, rb_payload]
  - command: {name: payload-check, run: "payload-check"}
"""


@pytest.mark.e2e
def test_relay_moves_a_torch_venv_and_the_console_script_runs_on_dst(
    clean_lab, payload_torch, ext4_dir, tmp_path
):
    lab = clean_lab
    dst = ext4_dir / "opt" / "venv"
    dst.parent.mkdir()
    script = build(tmp_path, spec_text(lab, payload_torch.venv, dst, checks=CHECKS))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-5000:]
    assert "route: relay through this machine" in r.stderr
    # compression: auto on the relay is measured (tests/e2e/test_compression_measured.py): the
    # log carries the link's rate and each compressor's
    assert "(auto, measured: link " in r.stderr
    doc = report(tmp_path)
    # the three checks of the spec and the relocation proof every probe runs
    assert doc["outcome"] == "ok" and doc["checks"]["fail"] == 0 and doc["checks"]["pass"] == 4
    # the moved console script, run on dst over ssh, imports torch from the new place
    out = lab.ssh("dst", [str(dst / "bin" / "payload-check")], check=True).stdout
    assert "2.13.0" in out and str(dst) in out
    assert (tmp_path / "run" / "probe-dst.json").exists()

    # a re-run finds the same tree on dst and sends nothing
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already holds this exact tree" in r.stderr


@pytest.mark.e2e
def test_auto_route_says_it_chose_relay_because_src_cannot_reach_dst(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, route="auto"))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "route: relay through this machine, because src cannot reach dst" in r.stderr
    assert (dst / "bin" / "payload-hello").exists()


@pytest.mark.e2e
def test_direct_route_when_src_reaches_dst(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    addr = lab.allow("src", "dst")
    dst = tmp_path / "dst" / "venv"
    hop = (
        f"  direct:\n    ssh: root@{addr}\n    identity_file: {lab.identity}\n"
        f"    options: {{UserKnownHostsFile: {lab.known_hosts}}}\n"
    )
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, route="auto", extra=hop))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "route: direct (src reaches dst over ssh itself)" in r.stderr
    assert "compression: none (auto: src dst run one kernel" in r.stderr
    # the receiving end's progress comes back through src's ssh too (the relay had pv, this none)
    assert "progress: " in r.stderr and "(100%)" in r.stderr, r.stderr[-3000:]
    out = lab.ssh("dst", [str(dst / "bin" / "payload-hello")], check=True).stdout
    assert str(dst) in out


@pytest.mark.e2e
def test_direct_route_moves_a_big_tree_in_streams_side_by_side(clean_lab, payload_small, tmp_path):
    """route direct, jobs 4, 300 MB to move: src opens one ssh connection to dst per stream (two),
    each receiving end hashes its own stream, verify reads no file, a hard link stays one, and
    the progress lines sum both streams."""
    lab = clean_lab
    addr = lab.allow("src", "dst")
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "dst" / "venv"
    hop = (
        f"  direct:\n    ssh: root@{addr}\n    identity_file: {lab.identity}\n"
        f"    options: {{UserKnownHostsFile: {lab.known_hosts}}}\n"
    )
    text = spec_text(lab, src, dst, route="direct", extra=hop).replace("  jobs: 2\n", "  jobs: 4\n")
    r = run(tmp_path, build(tmp_path, text))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "route: direct (src reaches dst over ssh itself)" in r.stderr
    # the last progress line sums both streams' ends: 300 MB of data, all of it (the hard link's
    # second name carries none, and the scan's bytes count it once)
    said = re.findall(r"progress: ([0-9.]+) MB of ([0-9.]+) MB \((\d+)%\)", r.stderr)
    assert said and float(said[-1][0]) >= 300 and said[-1][2] == "100", r.stderr[-3000:]
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert steps["transfer"]["detail"].endswith("2 streams side by side"), steps["transfer"]
    assert "checked by the stream's" in steps["verify"]["detail"], steps["verify"]
    assert "hashed again" not in steps["verify"]["detail"], steps["verify"]
    assert (dst / "lib" / "big" / "part1.bin").read_bytes() == bytes([2]) * (100 << 20)
    assert os.path.samefile(
        dst / "lib" / "big" / "part0.bin", dst / "lib" / "big" / "part0-again.bin"
    )


@pytest.mark.e2e
def test_both_ends_on_one_ssh_host_stream_there_without_this_machine(
    clean_lab, payload_small, tmp_path
):
    """from and to on the same ssh host (dst): the sending end starts the receiving ends there
    (send --local over one ssh session), two streams for 300 MB with jobs 4; nothing of the
    stream passes through this machine."""
    lab = clean_lab
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "dst" / "venv"
    text = (
        spec_text(lab, src, dst)
        .replace("  from: src:", "  from: dst:")
        .replace("  jobs: 2\n", "  jobs: 4\n")
    )
    r = run(tmp_path, build(tmp_path, text))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "route: one host (both ends on dst: the stream stays there)" in r.stderr
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert steps["transfer"]["detail"].endswith("2 streams side by side"), steps["transfer"]
    assert "checked by the stream's" in steps["verify"]["detail"], steps["verify"]
    assert "hashed again" not in steps["verify"]["detail"], steps["verify"]
    out = lab.ssh("dst", [str(dst / "bin" / "payload-hello")], check=True).stdout
    assert str(dst) in out


@pytest.mark.e2e
def test_existing_destination_survives_refuse_and_is_restored_from_backup(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    dst = tmp_path / "dst" / "venv"
    dst.mkdir(parents=True)
    (dst / "old-install").write_text("the previous venv")
    before = snapshot(dst.parent)
    r = run(tmp_path, build(tmp_path, spec_text(lab, payload_small.venv, dst, policy="refuse")))
    assert r.returncode == 1
    assert "in step preflight" in r.stderr and "on_existing is refuse" in r.stderr
    assert snapshot(dst.parent) == before

    script = build(tmp_path, spec_text(lab, payload_small.venv, dst, policy="backup"))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    backup = dst.parent / "venv.rb-backup.1"
    assert (backup / "old-install").read_text() == "the previous venv"
    assert (dst / "bin" / "payload-hello").exists()
    r = run(tmp_path, script, "--restore")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (dst / "old-install").read_text() == "the previous venv"


@pytest.mark.e2e
def test_a_file_changed_in_staging_is_caught_and_named(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst))
    assert run(tmp_path, script, "--only", "manifest").returncode == 0
    r = run(tmp_path, script, "--only", "transfer")
    assert r.returncode == 0, r.stderr[-3000:]
    staging = tmp_path / "dst" / ".venv.rb-staging"
    victim = next(staging.rglob("greeting.txt"))
    victim.write_text(victim.read_text().upper())
    r = run(tmp_path, script, "--from", "verify")
    assert r.returncode == 1
    assert "FAILED in step verify on host dst" in r.stderr
    assert "greeting.txt (content" in r.stderr
    assert not dst.exists()


@pytest.mark.e2e
def test_killing_the_source_sshd_mid_stream_fails_the_transfer_and_keeps_the_destination(
    clean_lab, payload_torch, ext4_dir, tmp_path
):
    lab = clean_lab
    dst = ext4_dir / "venv"
    dst.mkdir()
    (dst / "old-install").write_text("keep")
    before = snapshot(ext4_dir)
    script = build(
        tmp_path, spec_text(lab, payload_torch.venv, dst, policy="backup", compression="none")
    )
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = ext4_dir / ".venv.rb-staging"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and sum(1 for _ in staging.rglob("*")) > 500:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before the stream could be cut"
    lab.kill_sshd("src")
    _out, err = proc.communicate(timeout=300)
    # the source's kit could not be removed, and the log says where it is
    assert list(remove_left_kits(err)) == ["src"], err[-3000:]
    assert proc.returncode != 0
    assert "in step transfer" in err, err[-3000:]
    assert "pack on src exited" in err or "unpack on dst exited" in err
    now = snapshot(ext4_dir)
    assert {k: v for k, v in now.items() if not k.startswith(".venv.rb-staging")} == before
    assert report(tmp_path)["outcome"] == "failed"


@pytest.mark.e2e
def test_a_changed_host_key_is_refused_before_anything_moves(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    dst = tmp_path / "dst" / "venv"
    lab.replace_host_key("dst")
    r = run(tmp_path, build(tmp_path, spec_text(lab, payload_small.venv, dst)))
    assert r.returncode != 0
    assert "in step preflight on host dst" in r.stderr
    assert (
        "Host key verification failed" in r.stderr
        or "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    )
    assert not dst.parent.exists()
    # issue #18: exit 1 (not ssh's 255), the cause in words, how to fix it, the step once
    assert r.returncode == 1
    assert f"cannot reach dst (root@{lab.host('dst').addr})" in r.stderr
    # issue 45: a changed key gets its own advice: check the new key, then replace the old one;
    # never accept-new, which takes only keys no file knows
    assert "what to do: dst's host key is not the one" in r.stderr
    assert "ssh-keyscan" in r.stderr and "ssh-keygen -R" in r.stderr
    assert "accept-new" not in r.stderr
    assert r.stderr.count("FAILED in step") == 1
    assert [s["id"] for s in report(tmp_path)["steps"]] == ["preflight"]


@pytest.mark.e2e
def test_progress_lines_come_from_the_receiving_end(clean_lab, payload_small, tmp_path):
    """The receiving end says how much of the tar stream its tar has read (every 5 s and at the
    end): a log line with percent and rate, an event the timeline draws; no pv, no extra copy."""
    lab = clean_lab
    r = run(
        tmp_path,
        build(
            tmp_path,
            spec_text(lab, payload_small.venv, tmp_path / "d" / "venv", compression="zstd"),
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "progress: " in r.stderr and "(100%)" in r.stderr, r.stderr[-3000:]
    events = (tmp_path / "run" / "events.tsv").read_text().splitlines()
    assert any(e.startswith("progress\ttransfer\tdst\t") for e in events)


@pytest.mark.e2e
def test_a_rerun_after_a_source_change_streams_only_the_changed_files(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    src, dst, script = moved_once(lab, payload_small, tmp_path, compression="zstd")
    greeting = next(src.rglob("greeting.txt"))
    greeting.write_text("changed at the source, sent alone\n")
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "incremental:" in r.stderr and "linked from the current install" in r.stderr
    steps = {s["id"]: s for s in report(tmp_path)["steps"]}
    assert steps["manifest"]["facts"]["linked_files"] > 0
    assert steps["transfer"]["facts"]["files"] == steps["manifest"]["facts"]["send_files"]
    assert next(dst.rglob("greeting.txt")).read_text() == "changed at the source, sent alone\n"
    out = lab.ssh(
        "dst", [str(dst / "bin" / "python"), "-c", "import sys; print(sys.prefix)"], check=True
    ).stdout
    assert out.strip() == str(dst)


TAMPERING_SSH = r"""#!/usr/bin/env python3
# this machine's ssh, first on PATH: what the stream's sending end (a remote command that runs
# `rbkit engine send`) writes comes back through tamper() below; every other ssh is the real one
import os, subprocess, sys
REAL = %(real)r
args = sys.argv[1:]
if not any("'engine' 'send'" in a for a in args):
    os.execv(REAL, [REAL] + args)
p = subprocess.Popen([REAL] + args, stdout=subprocess.PIPE)
data = p.stdout.read()
rc = p.wait()
%(tamper)s
sys.stdout.buffer.write(tamper(data))
sys.stdout.flush()
sys.exit(rc)
"""


def tampering_ssh(bin_dir: Path, tamper: str) -> dict:
    """A link between the ends that changes what it carries: `tamper` defines tamper(bytes) ->
    bytes, applied to the whole stream as the source sent it. Returns the environment (PATH) for
    a run through it."""
    import shutil

    real = shutil.which("ssh")
    assert real, "ssh is installed by `make test` (system-packages)"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "ssh").write_text(TAMPERING_SSH % {"real": real, "tamper": tamper})
    (bin_dir / "ssh").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


# one byte of a file's content flipped in transit (the text of greeting.txt), the stream otherwise
# passed on unchanged
FLIP = """
def tamper(data):
    at = data.find(b"hello from rb_payload")
    return data if at < 0 else data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
"""


@pytest.mark.e2e
def test_a_byte_flipped_in_transit_is_caught_by_verify_and_nothing_is_installed(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    env = tampering_ssh(tmp_path / "bad-relay", FLIP)
    dst = tmp_path / "dst" / "venv"
    dst.mkdir(parents=True)
    (dst / "old-install").write_text("the previous venv")
    before = snapshot(dst)
    script = build(
        tmp_path, spec_text(lab, payload_small.venv, dst, policy="replace", compression="none")
    )
    env["RB_RUN_DIR"] = str(tmp_path / "run")
    r = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED in step verify on host dst" in r.stderr
    assert "greeting.txt (content" in r.stderr
    assert snapshot(dst) == before  # the previous install is untouched


def _receive_pids(lab, dst_host: str) -> list[int]:
    """The `rbkit engine receive` processes in dst's namespace (the stream's far end)."""
    from tests.lab.netlab import netns_pids

    found = []
    for pid in netns_pids(lab.host(dst_host).netns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine" in argv and b"receive" in argv:
            found.append(pid)
    return found


def _staged_bytes(staging: Path) -> int:
    total = 0
    for p in staging.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and not p.is_symlink():
            total += st.st_size
    return total


@pytest.mark.e2e
def test_a_relay_cut_at_half_is_resumed_sending_only_what_is_missing(
    clean_lab, payload_small, ext4_dir, tmp_path
):
    """Issue 34: the receiving end on dst is killed (kill -9) when about half of a 600 MB tree
    has arrived; the run fails naming the transfer, the destination is untouched, and the
    staging is kept: private, marked incomplete with the source it was for. The re-run says it
    resumes, sends at most 60% of the tree (the tar stream its receiving end read), verify
    passes, and the install is the source's tree; the mark is gone."""
    lab = clean_lab
    src = ext4_dir / "src"
    tree = cut_source(payload_small.venv, src)
    dst = ext4_dir / "opt" / "venv"
    dst.parent.mkdir()
    script = build(tmp_path, spec_text(lab, src, dst))
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
    mark = ext4_dir / "opt" / ".venv.rb-staging.incomplete"
    deadline = time.monotonic() + 240
    cut = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and _staged_bytes(staging) >= 0.5 * tree:
            pids = _receive_pids(lab, "dst")
            for pid in pids:
                os.kill(pid, 9)
            if pids:
                cut = _staged_bytes(staging)
                break
        time.sleep(0.02)
    _out, err = proc.communicate(timeout=300)
    assert cut, "the stream ended before it could be cut: " + err[-2000:]
    assert cut < 0.7 * tree, (cut, tree)
    assert proc.returncode == 1, err[-3000:]
    assert "FAILED in step transfer on host" in err, err[-3000:]
    assert not dst.exists()
    # kept: private, marked with the source it was for, never verified or installed
    assert staging.is_dir() and (staging.stat().st_mode & 0o777) == 0o700
    doc = json.loads(mark.read_text())
    assert doc["source"].endswith(f" src:{src}") and (mark.stat().st_mode & 0o777) == 0o600
    assert report(tmp_path)["outcome"] == "failed"
    # the cut left a file written part way (the right name, too few bytes)
    partial = [
        p.name
        for p in (staging / "lib" / "big").iterdir()
        if p.stat().st_size < (src / "lib" / "big" / p.name).stat().st_size
    ]
    assert partial, sorted((p.name, p.stat().st_size) for p in (staging / "lib" / "big").iterdir())

    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-5000:]
    line = next(ln for ln in r.stderr.splitlines() if "resuming: " in ln)
    assert "already staged" in line and "to send" in line, line
    doc = report(tmp_path)
    assert doc["outcome"] == "ok"
    steps = {s["id"]: s for s in doc["steps"]}
    receive = next(e for e in steps["transfer"]["engine"] if e["step"] == "receive")
    sent = receive["facts"]["stream_bytes"]
    assert sent <= 0.6 * tree, (sent, tree, line)
    assert "resumed" in steps["transfer"]["detail"], steps["transfer"]
    assert steps["verify"]["status"] == "ok", steps["verify"]
    moved = {
        k: v
        for k, v in snapshot(src / "lib").items()
        if "__pycache__" not in k and not k.endswith(".pyc")
    }  # the spec's excludes
    assert snapshot(dst / "lib") == moved
    assert not staging.exists() and not mark.exists()
    print(
        "cut at %d of %d bytes (%s part way); re-run: %s; stream %d bytes"
        % (cut, tree, partial, line, sent)
    )
    assert (dst.stat().st_mode & 0o777) == 0o755
