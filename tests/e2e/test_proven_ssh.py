"""Issue 44, round three: what root hands to ssh, runs from its scratch directory or reads back
from a saved plan is proven ours when it is used, never trusted for its place; a file the run
refused is never used afterwards, in any mode. Real sshd hosts (the lab) where ssh is involved;
each case plants as `nobody` (setpriv) or as another run would, and failed on 44a2c10.

R2: a refused ssh_config still ran (`--plan` went on past the refusal; cleanup's `ssh -O exit`
read the file). R4: the scratch directory in a TMPDIR others can write. R5: host keys judged from
what ssh will do (`ssh -G`), and known_hosts files another user can change. R6: `--apply` of a plan
another user could have written. R7: a plan pruned a running run's directory. Issue 45: host-key
failures name each host's own address, and a changed key gets its own advice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_
from tests.e2e.test_other_users import NOBODY, SETPRIV, shared, world_writable
from tests.e2e.test_relay import build, run, spec_text
from tests.e2e.test_run_dirs import start_slow_run
from tests.e2e.test_ssh_config import aliased, team_config

__all__ = ["shared"]  # the fixture, used by name

pytestmark = pytest.mark.e2e


def failed_line(r: subprocess.CompletedProcess, start: str) -> str:
    return next((x for x in r.stderr.splitlines() if start in x), "")


def planted_config(lab, shared: Path, fault: str, extra: str) -> Path:
    """dst's team config with `extra` (what ssh would run here), made another user's: the file
    nobody's, or root's file in a directory nobody owns."""
    team = shared / "team"
    config = team_config(lab, team / "ssh_config", extra=extra)
    team.chmod(0o755)
    if fault == "the file is nobody's":
        os.chown(config, NOBODY, NOBODY)
    else:
        os.chown(team, NOBODY, NOBODY)
    return config


@pytest.mark.parametrize("fault", ["the file is nobody's", "its directory is nobody's"])
def test_a_plan_stops_at_a_refused_ssh_config_and_runs_nothing_it_names(
    clean_lab, payload_small, shared, tmp_path, fault
):
    """R2: the plan refused the file, then went on (`|| true` around the hosts' preparation):
    ssh read it, its ProxyCommand ran as root, and the plan said `reachable`, exit 0. Now the
    plan ends at the refusal, names the host, and nothing the file names ran."""
    lab = clean_lab
    marker = world_writable(shared / "marker")
    config = planted_config(
        lab,
        shared,
        fault,
        f"  ProxyCommand sh -c 'id -u >{marker}/proxy-ran; exec nc %h %p'\n"
        f'Match exec "id -u >{marker}/match-ran"\n',
    )
    script = build(tmp_path, aliased(lab, payload_small.venv, tmp_path / "dst" / "venv", config))
    r = subprocess.run(
        ["bash", str(script), "--plan"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert sorted(os.listdir(marker)) == [], r.stderr[-3000:]
    assert r.returncode != 0, r.stdout + r.stderr[-3000:]
    assert "reachable" not in r.stdout
    failed = failed_line(r, "FAILED in step plan on host dst")
    assert f"refusing hosts.dst.ssh_config {config}:" in failed, r.stderr[-3000:]


def test_a_run_refused_for_its_ssh_config_never_hands_the_file_to_ssh_when_it_cleans_up(
    clean_lab, payload_small, shared, tmp_path
):
    """R2: a run refused dst's file in preflight, then cleanup's `ssh -F FILE -O exit` read it:
    its `Match exec` ran as root. Now a file the run refused is never given to ssh."""
    lab = clean_lab
    marker = world_writable(shared / "marker")
    config = planted_config(
        lab, shared, "its directory is nobody's", f'Match exec "id -u >{marker}/match-ran"\n'
    )
    script = build(tmp_path, aliased(lab, payload_small.venv, tmp_path / "dst" / "venv", config))
    r = run(tmp_path, script, timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    assert f"refusing hosts.dst.ssh_config {config}:" in r.stderr, r.stderr[-3000:]
    assert sorted(os.listdir(marker)) == [], r.stderr[-3000:]


def watch_as_nobody(where: Path, seen: Path) -> subprocess.Popen:
    """As nobody: every name that appears in `where`, written to `seen` (what nobody could
    rename aside and replace), until the file `where/.stop` is there."""
    script = (
        "import os, sys, time\n"
        "where, seen = sys.argv[1], sys.argv[2]\n"
        "names = set()\n"
        "while not os.path.exists(os.path.join(where, '.stop')):\n"
        "    names.update(n for n in os.listdir(where) if n != '.ready')\n"
        "    open(os.path.join(where, '.ready'), 'a').close()\n"
        "    time.sleep(0.002)\n"
        "open(seen, 'w').write('\\n'.join(sorted(names)))\n"
    )
    proc = subprocess.Popen(
        [*SETPRIV, "/usr/bin/python3", "-I", "-c", script, str(where), str(seen)]
    )
    deadline = time.monotonic() + 30
    while not (where / ".ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def test_the_scratch_directory_is_never_made_where_another_user_can_swap_it(
    payload_small, shared, tmp_path
):
    """R4: root's TMPDIR 0777 without the sticky bit: nobody renamed root's new rb.XXXXXX aside,
    made its own under that name with a kit of its own, and its start.py ran as root. The
    scratch directory's parent is now checked like the run directory's: the run says TMPDIR is
    not private and makes its scratch directory in /tmp, and nobody sees nothing of it."""
    tmpdir = world_writable(shared / "tmp", sticky=False)
    seen = world_writable(shared / "watch") / "seen"
    watcher = watch_as_nobody(tmpdir, seen)
    dst = tmp_path / "d" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst)
    try:
        r = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"), TMPDIR=str(tmpdir)),
        )
    finally:
        (tmpdir / ".stop").touch()
        watcher.wait(timeout=30)
    assert seen.read_text() == "", r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        f"TMPDIR {tmpdir} is not private: directory {tmpdir} is owned by root (uid 0), mode "
        "0777: writable by group and others without the sticky bit" in r.stderr
    ), r.stderr[-3000:]
    assert "this run's scratch directory is in /tmp instead" in r.stderr
    assert (dst / "bin" / "payload-hello").exists()


def test_known_hosts_from_the_ssh_config_that_turn_checking_off_are_refused(
    clean_lab, payload_small, tmp_path
):
    """R5a: `UserKnownHostsFile /dev/null` inside the spec's ssh_config with host_keys:
    accept-new: every run took any key (the same under `options:` is refused by compile). What
    ssh will do is judged (ssh -G, after -F and the alias) before it connects."""
    lab = clean_lab
    config = team_config(lab, tmp_path / "team" / "ssh_config")
    config.write_text(config.read_text().replace(str(lab.known_hosts), "/dev/./null"))
    text = aliased(lab, payload_small.venv, tmp_path / "dst" / "venv", config)
    text = text.replace("    ssh_config:", "    host_keys: accept-new\n    ssh_config:")
    script = build(tmp_path, text)
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    failed = failed_line(r, "FAILED in step preflight on host dst")
    assert "UserKnownHostsFile /dev/null" in failed and "turns host key checking off" in failed, (
        r.stderr[-3000:]
    )
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("fault", ["its directory is nobody's", "writable by all"])
def test_a_known_hosts_file_another_user_can_change_is_refused(
    clean_lab, payload_small, shared, tmp_path, fault
):
    """R5b: a known_hosts file in a directory nobody owns, 0666: accepted without a word, so
    nobody decided which keys root trusts. Checked with the private-file rule before ssh reads
    it (it holds dst's real key: the run would have gone on)."""
    lab = clean_lab
    keys = shared / "keys"
    keys.mkdir(mode=0o755)
    kh = keys / "known_hosts"
    shutil.copy(lab.known_hosts, kh)
    if fault == "writable by all":
        kh.chmod(0o666)
        said = f"the file {kh} is writable by others (mode 0666)"
    else:
        os.chown(keys, NOBODY, NOBODY)
        said = f"directory {keys} is owned by nobody (uid {NOBODY}), mode 0755"
    text = spec_text(lab, payload_small.venv, tmp_path / "dst" / "venv")
    at = text.index("  dst:\n")
    text = text[:at] + text[at:].replace(str(lab.known_hosts), str(kh), 1)
    script = build(tmp_path, text)
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    failed = failed_line(r, "FAILED in step preflight on host dst")
    assert f"refusing UserKnownHostsFile {kh} of hosts.dst: {said}" in failed, r.stderr[-3000:]
    assert not (tmp_path / "dst").exists()


def plan_then(tmp_path: Path, script: Path) -> Path:
    r = subprocess.run(
        ["bash", str(script), "--plan"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("plan: ")][-1]
    return Path(line.split()[1].rstrip(";,")).parent


@pytest.mark.parametrize(
    "fault", ["a copy in nobody's directory", "a FIFO", "/dev/zero", "a hard link"]
)
def test_apply_reads_only_a_plan_this_user_made_where_no_one_else_can_write(
    payload_small, shared, tmp_path, fault
):
    """R6: `--apply` read any file: a plan copied into a directory nobody owns and edited there
    installed what the reviewed plan never listed; /dev/zero filled memory; a FIFO hung. The plan
    (and the scan and state beside it) is checked before it is read: a regular file of this user,
    one link, not writable by others, of a bounded size, in a private directory."""
    dst = tmp_path / "d" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst)
    made = plan_then(tmp_path, script)
    if fault == "a copy in nobody's directory":
        theirs = shared / "plan"
        shutil.copytree(made, theirs)
        os.chown(theirs, NOBODY, NOBODY)
        plan, said = theirs / "plan.json", f"directory {theirs} is owned by nobody (uid {NOBODY})"
    elif fault == "a FIFO":
        plan = made / "fifo.json"
        os.mkfifo(plan, 0o600)
        said = f"{plan} is not a regular file"
    elif fault == "/dev/zero":
        plan, said = Path("/dev/zero"), "/dev/zero is not a regular file"
    else:
        plan = made / "linked.json"
        os.link(made / "plan.json", plan)
        said = f"{plan} has 2 links"
    # a bound on memory: /dev/zero read whole filled it
    r = subprocess.run(
        [
            "bash",
            "-c",
            'ulimit -v 4000000 && exec bash "$@"',
            "rb",
            str(script),
            "--apply",
            str(plan),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"refusing to apply {plan}: {said}" in r.stderr, r.stderr[-3000:]
    assert not dst.exists()


def test_a_plan_leaves_the_directories_of_running_runs_alone(payload_small, tmp_path):
    """R7: with RB_KEEP_RUNS=1 a plan (which holds no lock) removed the directory of a run that
    was running, and that run failed. A plan prunes nothing; a run prunes no directory whose run
    is still going."""
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("RB_RUN_DIR", "RB_KEEP_RUNS")}
    a, a_dir = start_slow_run(tmp_path, script, env, 6)
    try:
        time.sleep(1.1)  # a new second: a new name
        p = subprocess.run(
            ["bash", str(script), "--plan"],
            cwd=tmp_path,
            env=dict(env, RB_KEEP_RUNS="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        assert a_dir.is_dir()
    finally:
        _out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    assert json.loads((a_dir / "report.json").read_text())["outcome"] == "ok"


def test_two_hosts_with_untrusted_keys_are_each_named_with_their_own_address(
    clean_lab, payload_small, tmp_path
):
    """Issue 45: with two hosts failing on their keys, the cause named the first with the other's
    address. A changed key gets its own advice (check the new key with the host's owner, then
    replace the old line), never `accept-new`, which takes only keys no file knows."""
    lab = clean_lab
    kh = tmp_path / "keys" / "known_hosts"
    kh.parent.mkdir(mode=0o700)
    # src unknown; dst known under another key (src's): a changed key
    dst_addr, src_addr = lab.host("dst").addr, lab.host("src").addr
    theirs = subprocess.run(
        ["ssh-keygen", "-F", src_addr, "-f", str(lab.known_hosts)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in theirs.splitlines() if x and not x.startswith("#"))
    kh.write_text(dst_addr + " " + line.split(" ", 1)[1] + "\n")
    text = spec_text(lab, payload_small.venv, tmp_path / "d" / "venv").replace(
        f"UserKnownHostsFile: {lab.known_hosts}", f"UserKnownHostsFile: {kh}"
    )
    script = build(tmp_path, text)
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    failed = next(x for x in r.stderr.splitlines() if "FAILED in step preflight" in x)
    assert (
        f"cannot reach src (root@{src_addr}): this machine does not trust its host key" in failed
    ), r.stderr[-3000:]
    assert "dst's host key changed" in failed, failed
    hint = next(x for x in r.stderr.splitlines() if "what to do:" in x)
    src_part, dst_part = hint.split(". For dst: ") if ". For dst: " in hint else (hint, "")
    assert f"ssh-keyscan {src_addr} >> {kh}" in src_part and "accept-new" in src_part, hint
    assert "accept-new" not in dst_part and f"ssh-keygen -R {dst_addr} -f {kh}" in dst_part, hint
    assert "an attack" in dst_part, hint
