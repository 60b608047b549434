"""What a user reads when a run fails (issue 36, "Messages"): each message says who cannot do
what where, why, and the spec key to change; no Python exception text is the message, and each
is said once (plus the report's row)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from compiler import cli
from tests.e2e.test_local_runbook import compile_and_run
from tests.e2e.test_relay import build, run, spec_text

pytestmark = pytest.mark.e2e


def test_destination_not_writable_says_who_where_why_once(payload_small, tmp_path):
    """A destination whose parent is on a read-only mount (a bind mount of a tmp dir)."""
    parent = tmp_path / "ro"
    parent.mkdir()
    subprocess.run(["mount", "--bind", str(parent), str(parent)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(parent)], check=True)
        r = compile_and_run(tmp_path, payload_small.venv, parent / "venv")
    finally:
        subprocess.run(["umount", str(parent)], check=True)
    assert r.returncode == 1, r.stderr[-3000:]
    lock = parent / ".venv.rb-lock"
    lines = [x for x in r.stderr.splitlines() if str(lock) in x]
    # once in the log (the FAILED line) and once in the report's row
    assert len(lines) == 2, r.stderr[-3000:]
    failed = lines[0]
    assert "FAILED in step preflight on host here: root cannot create " + str(lock) in failed
    assert (
        "read-only file system (EROFS: the file system that holds it is mounted read-only)"
        in failed
    )
    assert f"keeps its lock and its staging beside the destination {parent / 'venv'}" in failed
    assert "set transfer.to to a destination whose parent directory root can write" in failed
    assert lines[1].startswith("preflight  here  failed")
    # no Python exception text; the traceback is in the log file only
    assert "Error:" not in r.stderr and "Errno" not in r.stderr and "Traceback" not in r.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    assert "Traceback (most recent call last)" in log and "[Errno 30]" in log
    # no checks ran: no line counting them
    assert "checks: 0 passed" not in r.stderr + r.stdout


def test_a_name_that_does_not_resolve_is_said_once_with_its_spec_key(payload_small, tmp_path):
    """`.invalid` never resolves (RFC 2606) and sends no traffic: ssh's own words show once, after
    the host's name; the cause says the name does not resolve, the hint names hosts.gpu.ssh."""
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        f"name: bad\nhosts:\n  here: {{local: true}}\n  gpu: {{ssh: root@new-gpu.invalid}}\n"
        f"transfer:\n  from: here:{payload_small.venv}\n  to: gpu:/opt/rbmsg/venv\n"
    )
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    r = subprocess.run(
        ["bash", str(tmp_path / "bad.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, RB_RUN_DIR=str(tmp_path / "run")),
    )
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr
    assert err.count("Could not resolve hostname new-gpu.invalid") == 1, err
    assert "[preflight] gpu: ssh: Could not resolve hostname new-gpu.invalid" in err
    assert (
        "FAILED in step preflight on host gpu: cannot reach gpu (root@new-gpu.invalid): the "
        "name new-gpu.invalid does not resolve on this machine"
    ) in err
    assert "what to do: check the host name in hosts.gpu.ssh in the spec" in err
    assert "sshd listens" not in err


def _both_with_known_hosts(lab, src: Path, dst: Path, kh: Path, host_keys: str) -> str:
    text = spec_text(lab, src, dst).replace(
        f"UserKnownHostsFile: {lab.known_hosts}", f"UserKnownHostsFile: {kh}"
    )
    for n in ("src", "dst"):
        block = f"  {n}:\n    ssh: root@{lab.host(n).addr}\n"
        text = text.replace(block, f"{block}    host_keys: {host_keys}\n", 1)
    return text


def test_every_untrusted_host_key_is_named_with_the_file_ssh_reads(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    kh = tmp_path / "keys" / "known_hosts"
    kh.parent.mkdir(mode=0o700)
    kh.write_text("")
    script = build(
        tmp_path,
        _both_with_known_hosts(lab, payload_small.venv, tmp_path / "d" / "venv", kh, "strict"),
    )
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    err = r.stderr
    failed = next(x for x in err.splitlines() if "FAILED in step preflight" in x)
    assert "this machine does not trust its host key; nor " in failed, err[-3000:]
    hint = next(x for x in err.splitlines() if "what to do:" in x)
    for n in ("src", "dst"):
        assert f"ssh-keyscan {lab.host(n).addr} >> {kh}" in hint, hint
    assert "~/.ssh/known_hosts" not in err
    assert err.count("FAILED in step") == 1


def test_accept_new_logs_the_fingerprint_it_took(clean_lab, payload_small, tmp_path):
    lab = clean_lab
    kh = tmp_path / "keys" / "known_hosts"
    kh.parent.mkdir(mode=0o700)
    script = build(
        tmp_path,
        _both_with_known_hosts(lab, payload_small.venv, tmp_path / "d" / "venv", kh, "accept-new"),
    )
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for n in ("src", "dst"):
        fp = subprocess.run(
            ["ssh-keygen", "-lF", lab.host(n).addr, "-f", str(kh)], capture_output=True, text=True
        ).stdout
        sha = next(w for w in fp.split() if w.startswith("SHA256:"))
        line = next(
            x
            for x in r.stderr.splitlines()
            if f"] {n}: its host key was accepted on first contact" in x
        )
        assert f"recorded in {kh}: " in line and sha in line, line
    # a second run takes nothing new: no such line
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 0 and "accepted on first contact" not in r.stderr, r.stderr[-3000:]


def test_a_clean_small_move_reads_right(payload_small, tmp_path):
    """The details of a good run say what happened: which static checks passed, what verify
    checked by the stream's digests, what the env file did to LD_LIBRARY_PATH, a rate for a
    transfer too small to measure in whole MB/s, a module without a version."""
    r = compile_and_run(
        tmp_path,
        payload_small.venv,
        tmp_path / "d" / "venv",
        checks="  - imports: [rb_payload, json]\n",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr
    assert (
        "static checks on the source: passed (nothing in it names a path outside the venv)" in err
    ), err[-3000:]
    assert "files checked by the stream's sha256" in err and "0 hashed" not in err
    assert "LD_LIBRARY_PATH: unchanged (the venv has no library directory to put first)" in err
    assert "LD_LIBRARY_PATH: -" not in err
    row = next(x for x in err.splitlines() if x.startswith("transfer "))
    assert " 0 MB/s" not in row and "<1 MB/s" in row, row


def test_a_long_fact_is_wrapped_and_prefixed(payload_small, tmp_path):
    """A venv whose .pth names 4 folders outside it, moved on one machine (said, not refused):
    the `outside:` fact is wrapped, every line of it indented like the engine's other lines."""
    import shutil

    src = tmp_path / "src" / "venv"
    shutil.copytree(payload_small.venv, src, symlinks=True)
    (site,) = list(src.glob("lib/python*/site-packages"))
    far = [tmp_path / "far-away-source-tree" / f"package-number-{i}" for i in range(4)]
    for d in far:
        d.mkdir(parents=True)
    (site / "zz_editable.pth").write_text("".join(f"{d}\n" for d in far))
    r = compile_and_run(tmp_path, src, tmp_path / "d" / "venv", checks="  - imports: [json]\n")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    at = next(i for i, x in enumerate(lines) if "reference(s) leave" in x)
    assert lines[at].startswith("    outside: "), lines[at]
    assert len(lines[at]) <= 100 and lines[at + 1].startswith("      "), lines[at : at + 3]


def test_every_host_that_could_not_be_prepared_is_named_in_one_line(payload_small, tmp_path):
    """Two hosts that fail in preflight's preparation (names that do not resolve): one line names
    both (before, only the first host's failure was named; the second was said only by its ssh
    lines); the FAILED line gives the first host's cause, once."""
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "name: two\nhosts:\n  src: {ssh: root@old-gpu.invalid}\n"
        "  dst: {ssh: root@new-gpu.invalid}\n"
        "transfer:\n  from: src:/opt/rbmsg/venv\n  to: dst:/opt/rbmsg/venv\n"
    )
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    r = subprocess.run(
        ["bash", str(tmp_path / "two.sh"), "--only", "preflight"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, RB_RUN_DIR=str(tmp_path / "run")),
    )
    assert r.returncode == 1, r.stderr[-3000:]
    named = [x for x in r.stderr.splitlines() if "hosts could not be prepared" in x]
    assert len(named) == 1, r.stderr[-3000:]
    assert "2 hosts could not be prepared: src (exit 255), dst (exit 255)" in named[0], named
    assert r.stderr.count("FAILED in step preflight on host src") == 1, r.stderr[-3000:]
