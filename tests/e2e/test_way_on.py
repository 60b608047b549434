"""Issue 45: every failure leaves a way on, and the terminal says only what is true. Each test
plants one fault (a disk that fills mid-stream, a Ctrl-C, a killed sshd, a step that cannot
apply) and asserts what the operator reads: the cause in words, what was kept, and the one
command that goes on, on the terminal and in report.json alike."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import big_source, compile_, compile_and_run, old_install
from tests.e2e.test_local_runbook import report as local_report
from tests.e2e.test_relay import build, remove_left_kits, report, run, spec_text

pytestmark = pytest.mark.e2e


def big_tree(venv: Path, src: Path, parts: int, mib: int) -> int:
    """A copy of `venv` at `src` with `parts` files of `mib` MiB in lib/big; the tree's bytes."""
    subprocess.run(["cp", "-a", str(venv), str(src)], check=True)
    big = src / "lib" / "big"
    big.mkdir()
    for i in range(parts):
        (big / f"part{i:02d}.bin").write_bytes(bytes([i + 1]) * (mib << 20))
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())


def fill_when_staged(proc: subprocess.Popen, staging: Path, ballast: Path, leave: int) -> bool:
    """Once the staging appears, fill its file system but `leave` bytes (a ballast file): the
    disk fills while the stream runs. False when the run ended first."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir():
            st = os.statvfs(staging)
            size = st.f_bavail * st.f_frsize - leave
            fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
            return True
        time.sleep(0.01)
    return False


def test_a_disk_that_fills_mid_stream_is_named_and_a_rerun_after_freeing_it_resumes(
    clean_lab, payload_small, tmpfs_factory, tmp_path
):
    """A 160 MB tmpfs destination that fills while a 126 MB tree streams into it (a ballast
    file takes its room once the staging appears). The run fails with the cause in words (no
    space left on dst, the file system, what is free and what is still to come), not `tar exited
    2`, the same in report.json and report.html; tar's line a file is capped on the terminal (all
    in run.log); the way on is named. `--plan` then counts what is staged; once the ballast is
    gone, a re-run (before: refused, the kept staging not counted) resumes and lands."""
    lab = clean_lab
    src = tmp_path / "src" / "venv"
    src.parent.mkdir()
    tree = big_tree(payload_small.venv, src, 12, 10)  # about 126 MB
    disk = tmpfs_factory(int(tree * 1.25) >> 10)  # room for the whole tree and a bit
    dst = disk.path / "venv"
    script = build(tmp_path, spec_text(lab, src, dst, compression="none"))
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ballast = disk.path / "ballast"
    assert fill_when_staged(proc, disk.path / ".venv.rb-staging", ballast, int(tree * 0.6))
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    cause = next(ln for ln in err.splitlines() if "FAILED in step transfer" in ln)
    assert "on host dst: no space left on dst: " in cause, cause
    assert f"{disk.path} (tmpfs)" in cause and " free of " in cause, cause
    assert "more needed to finish" in cause and "staged" in cause, cause
    assert "exited 2" not in cause, cause
    # tar's one line a file: a few on the terminal, every one in run.log
    shown = err.count("No space left on device")
    assert 1 <= shown <= 4, err[-3000:]
    assert "more lines of tar's in the run's log" in err, err[-3000:]
    log = (tmp_path / "run" / "run.log").read_text()
    assert log.count("Cannot write: No space left on device") > shown, log[-2000:]
    hint = next(ln for ln in err.splitlines() if "what to do:" in ln)
    assert "free at least" in hint and f"bash {script}" in hint, hint
    assert "it resumes" in hint and f"bash {script} --discard-staging" in hint, hint
    doc = report(tmp_path)
    row = next(s for s in doc["steps"] if s["id"] == "transfer")
    assert row["detail"].startswith("no space left on dst: "), row
    html = (tmp_path / "run" / "report.html").read_text()
    assert "no space left on dst: " in html
    assert (disk.path / ".venv.rb-staging.incomplete").is_file()

    # the plan counts what is staged; with the ballast still there, it cannot fit
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "resumable:" in r.stdout and "staged" in r.stdout, r.stdout
    assert "NOT ENOUGH ROOM" in r.stdout and "--discard-staging" in r.stdout, r.stdout

    ballast.unlink()
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "enough room" in r.stdout, r.stdout
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resumable: " in r.stderr and "resuming: " in r.stderr, r.stderr[-4000:]
    assert (dst / "lib" / "big" / "part11.bin").read_bytes() == bytes([12]) * (10 << 20)
    assert not (disk.path / ".venv.rb-staging").exists()


def staged_bytes(staging: Path) -> int:
    return sum(p.lstat().st_size for p in staging.rglob("*") if p.is_file() and not p.is_symlink())


def receiving_ends(mark: str) -> list[int]:
    """The pids of `rbkit engine receive` processes whose command line names `mark`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine" in argv and b"receive" in argv and any(mark.encode() in a for a in argv):
            found.append(int(pid))
    return found


def cut_local_move(tmp_path: Path, payload) -> tuple[Path, Path, int]:
    """A one-host move of a 300 MB tree whose receiving end is killed (-9) once about a third of
    it is staged: (runbook, destination, the tree's bytes); the run failed in transfer."""
    src = big_source(payload.venv, tmp_path / "src")
    tree = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    dst = tmp_path / "d" / "venv"
    script = compile_(tmp_path, src, dst, policy="replace")
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = dst.parent / ".venv.rb-staging"
    deadline = time.monotonic() + 240
    cut = 0
    while time.monotonic() < deadline and proc.poll() is None and not cut:
        if staging.is_dir() and staged_bytes(staging) >= tree // 3:
            for pid in receiving_ends(str(dst.parent)):
                os.kill(pid, 9)
                cut = staged_bytes(staging)
        time.sleep(0.02)
    _out, err = proc.communicate(timeout=300)
    assert cut, "the stream ended before it could be cut: " + err[-2000:]
    assert proc.returncode == 1 and "FAILED in step transfer" in err, err[-3000:]
    return script, dst, tree


def test_from_transfer_resumes_what_a_cut_stream_staged_and_the_plan_says_so(
    payload_small, tmp_path
):
    """Issue 45: the hint after a cut or interrupted transfer is `--from transfer`, which re-sent
    the whole tree (a plain re-run resumed). `--plan` says what is staged; `--from transfer`
    resumes: it keeps what arrived whole and sends the rest."""
    script, dst, tree = cut_local_move(tmp_path, payload_small)
    plan = run(tmp_path, script, "--plan")
    assert plan.returncode == 0, plan.stdout + plan.stderr[-2000:]
    line = next((ln for ln in plan.stdout.splitlines() if "resumable:" in ln), "")
    assert " staged (" in line and " to send" in line, plan.stdout
    r = run(tmp_path, script, "--from", "transfer")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resuming: " in r.stderr, r.stderr[-4000:]
    sent = next(s for s in local_report(tmp_path)["steps"] if s["id"] == "transfer")
    assert sent["facts"]["bytes"] < 0.8 * tree, sent
    assert (dst / "lib" / "big" / "part2.bin").read_bytes() == bytes([3]) * (100 << 20)


# -- a clean local run into `.venv` on a spec that declares a GPU this machine lacks ------------


@pytest.fixture(scope="module")
def gpu_run(payload_small, tmp_path_factory):
    """One local run into `d/.venv`, `gpu: {model: H100}` declared, the devices check allowed to
    skip (this machine has no GPU): (its folder, the finished process)."""
    tmp_path = tmp_path_factory.mktemp("gpu_run")
    r = compile_and_run(
        tmp_path,
        payload_small.venv,
        tmp_path / "d" / ".venv",
        policy="replace",
        checks="  - imports: [rb_payload]\n  - devices: {allow_skip: true}\n",
        extra='gpu: {model: H100}\ncuda: {version: "13.0", '
        "home: /usr/local/cuda-13.0, library_path_first: []}\n",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path, r


def test_no_killed_line_after_a_run(gpu_run):
    """`line 1: NNNN Killed rb::witness "${fifo}"` after every run read like a crash."""
    _, r = gpu_run
    assert "Killed" not in r.stderr and "rb::witness" not in r.stderr, r.stderr[-1500:]


def test_the_staging_of_a_hidden_venv_has_one_dot(gpu_run):
    _, r = gpu_run
    assert "/d/.venv.rb-staging" in r.stderr, r.stderr[-3000:]
    assert "..venv" not in r.stderr


def test_ld_library_path_names_a_cuda_dir_as_cuda_homes_not_the_venvs(gpu_run):
    """Issue 45: `LD_LIBRARY_PATH: the venv's /usr/local/cuda-13.0/lib64 first`."""
    _, r = gpu_run
    line = next(ln for ln in r.stderr.splitlines() if "LD_LIBRARY_PATH:" in ln)
    assert "CUDA_HOME's /usr/local/cuda-13.0/lib64 first" in line, line
    assert "the venv's /usr" not in line, line


def test_discard_staging_drops_what_a_cut_stream_kept(payload_small, tmp_path):
    """The one command the disk-full hint names: what a cut stream kept beside the destination
    is removed (its mark too), the destination untouched; a second time there is nothing."""
    script, dst, _tree = cut_local_move(tmp_path, payload_small)
    staging = dst.parent / ".venv.rb-staging"
    assert staging.is_dir()
    r = run(tmp_path, script, "--discard-staging")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"discarded the staging {staging}: " in r.stderr, r.stderr[-3000:]
    assert not staging.exists() and not (dst.parent / ".venv.rb-staging.incomplete").exists()
    assert not dst.exists()
    again = run(tmp_path, script, "--discard-staging")
    assert again.returncode == 0 and "nothing to discard" in again.stderr, again.stderr[-2000:]


def test_report_html_headline_says_gpu_not_proven_as_the_terminal_does(gpu_run):
    tmp_path, r = gpu_run
    assert "GPU NOT PROVEN" in r.stderr
    html = (tmp_path / "run" / "report.html").read_text()
    head = html[html.index("<h1>") : html.index("</h1>")]
    assert "GPU NOT PROVEN" in head, head
    assert "GPU NOT PROVEN: the spec declares gpu:" in html


@pytest.mark.parametrize(
    "args, step", [(["--from", "verify"], "verify"), (["--only", "swap"], "swap")]
)
def test_a_from_that_cannot_apply_says_what_to_run_instead(gpu_run, args, step):
    """Issue 45: `--from verify` on a finished install failed `staging does not exist` and said
    `re-run with --from verify`: a loop. It names what to run instead, and that runs."""
    tmp_path, _ = gpu_run
    script = tmp_path / "e2e.sh"
    r = run(tmp_path, script, *args)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"FAILED in step {step} on host here: nothing to {step}" in r.stderr, r.stderr[-3000:]
    hint = next(ln for ln in r.stderr.splitlines() if "what to do:" in ln)
    assert f"bash {script} checks it" in hint and f"bash {script} --only probe" in hint, hint
    assert "--from verify" not in r.stderr.splitlines()[-1], r.stderr[-1000:]
    assert r.stderr.splitlines()[-1].endswith(f"go on with: bash {script}"), r.stderr[-1000:]
    again = run(tmp_path, script)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing will be sent" in again.stderr, again.stderr[-3000:]


LIBS_SPEC = """cuda:
  version: "13.0"
  home: /usr/local/cuda-13.0
  library_path_first: [nvidia/cu13/lib]
"""


def test_library_dirs_the_source_lacks_are_refused_before_anything_moves(payload_small, tmp_path):
    """Issue 45: `library_path_first: [nvidia/cu13/lib]` passed --plan (`static: passed`), the
    run swapped the venv in and failed in exports (`library dirs do not exist in the venv`).
    They are checked against the source's scan: --plan is blocked, the run fails in preflight,
    nothing is installed."""
    dst = tmp_path / "d" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst, policy="backup", extra=LIBS_SPEC)
    plan = run(tmp_path, script, "--plan")
    assert plan.returncode == 1, plan.stdout + plan.stderr[-2000:]
    blocked = next((ln for ln in plan.stdout.splitlines() if "BLOCKED" in ln), "")
    assert "nvidia/cu13/lib" in blocked and "library_path_first" in blocked, plan.stdout
    r = run(tmp_path, script)
    assert r.returncode == 1, r.stderr[-3000:]
    assert (
        "FAILED in step preflight on host here: the exports step would refuse this source: "
        "it has no nvidia/cu13/lib" in r.stderr
    ), r.stderr[-3000:]
    assert "cuda.library_path_first" in r.stderr
    assert not dst.exists()


@pytest.mark.parametrize("keep", [False, True], ids=["first-install", "on_failed_checks-keep"])
def test_an_install_that_stays_after_a_failed_step_is_said_last_with_the_way_back(
    payload_small, tmp_path, keep
):
    """Issue 45: an install whose check fails stays (a first one: nothing was there to put back;
    or `on_failed_checks: keep`), and only report.json said so. The terminal's last lines say
    it stays, and how to go back."""
    dst = tmp_path / "d" / "venv"
    if keep:
        old_install(dst)
    r = compile_and_run(
        tmp_path,
        payload_small.venv,
        dst,
        policy="backup",
        checks="  - command: {name: fails, run: 'false'}\n",
        extra="on_failed_checks: keep\n" if keep else "",
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert (dst / "bin" / "python").exists()
    last = r.stderr.splitlines()[-2:]
    assert f"the new install stays at {dst}, unproven" in last[0], last
    if keep:
        assert f"bash {tmp_path / 'e2e.sh'} --restore" in last[1], last
    else:
        assert f"rm -rf -- {dst}" in last[1] or f"rm -rf -- '{dst}'" in last[1], last


def test_a_killed_sshd_is_named_in_words_and_what_it_keeps_before_the_report_lines(
    clean_lab, payload_small, tmp_path
):
    """Issue 45: the source's sshd killed mid-relay said `pack on src exited 243; unpack on dst
    exited 255`, and the kit left on src was named after the report lines. The cause is the
    closed connection, in words; what is left on the host is named before the report lines,
    and in report.json's notes."""
    lab = clean_lab
    src = tmp_path / "src" / "venv"
    src.parent.mkdir()
    tree = big_tree(payload_small.venv, src, 30, 10)  # about 315 MB
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(lab, src, dst, compression="none"))
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = dst.parent / ".venv.rb-staging"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and staged_bytes(staging) > tree // 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the stream could be cut"
    lab.kill_sshd("src")
    try:
        _out, err = proc.communicate(timeout=300)
    finally:
        lab.start_sshd("src")
    left = remove_left_kits(err)
    assert list(left) == ["src"], err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    cause = next(ln for ln in err.splitlines() if "FAILED in step transfer" in ln)
    assert cause.endswith(
        "on host src: the connection to src closed (ssh exited 255) during the transfer"
    ), cause
    lines = err.splitlines()
    at = next(i for i, ln in enumerate(lines) if "] left on src: " in ln)
    report_line = next(i for i, ln in enumerate(lines) if "] report: " in ln)
    assert at < report_line, err[-3000:]
    assert report(tmp_path)["notes"]["left_on_src"] == str(left["src"])
    row = next(s for s in report(tmp_path)["steps"] if s["id"] == "transfer")
    assert row["detail"].startswith("the connection to src closed"), row


@pytest.mark.parametrize("ignored", [False, True], ids=["job-control", "sigint-ignored"])
def test_ctrl_c_into_a_relay_of_streams_says_only_what_is_true(
    clean_lab, payload_small, tmp_path, ignored
):
    """Issue 45: a SIGINT to the run's group in a relay of streams. As a terminal sends it (job
    control): exit 130 and `interrupted`, but a Python traceback of the relay on the terminal.
    Launched with SIGINT ignored (nohup, cron, a script's background job): bash cannot trap it,
    the multiplexed ssh clients died of it, and the run blamed the receiving end (`no answer`).
    Now: no traceback; the ignored case ends interrupted, saying why the runbook could not trap
    the signal."""
    lab = clean_lab
    src = big_source(payload_small.venv, tmp_path / "src")
    dst = tmp_path / "d" / "venv"
    script = build(
        tmp_path, spec_text(lab, src, dst, compression="none").replace("  jobs: 2\n", "  jobs: 4\n")
    )
    ns = lab.host("src").netns
    subprocess.run(
        [
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
            "200mbit",
            "burst",
            "256kb",
            "latency",
            "400ms",
        ],
        check=True,
    )
    err_path = tmp_path / "stderr.txt"
    try:
        with open(err_path, "w") as err:
            start = (
                ["env", "--ignore-signal=INT"]
                if ignored
                else ["env", "--default-signal=HUP,INT,QUIT,TERM"]
            )
            p = subprocess.Popen(
                [*start, "bash", str(script)],
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                env=dict(os.environ, RB_RUN_DIR=str(tmp_path / "run")),
            )
        deadline = time.monotonic() + 120
        while "streams side by side" not in err_path.read_text() and p.poll() is None:
            assert time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.02)
        time.sleep(1.0)
        assert p.poll() is None, err_path.read_text()[-3000:]
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=120)
    finally:
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"], check=False)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    err = err_path.read_text()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-4000:]
    assert rc == 130, err[-3000:]
    assert "interrupted in step transfer (SIGINT)" in err, err[-3000:]
    assert "no answer" not in err, err[-3000:]
    if ignored:
        assert "bash cannot trap a signal ignored on entry" in err, err[-3000:]
    assert report(tmp_path)["outcome"] == "interrupted"
    assert not dst.exists()


def test_a_failed_restore_has_its_own_time_and_a_way_on(gpu_run):
    """Issue 45: the `--restore` row's time read `1796600526.5s` (from the epoch), and its last
    line said `re-run with --from restore`, which is no step."""
    tmp_path, _ = gpu_run
    script = tmp_path / "e2e.sh"
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "restore-run"))
    r = subprocess.run(
        ["bash", str(script), "--restore", "9"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads((tmp_path / "restore-run" / "report.json").read_text())
    row = next(s for s in doc["steps"] if s["id"] == "restore")
    assert 0 <= row["duration_s"] < 600, row
    assert "--from restore" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].endswith(f"bash {script} --list-backups"), r.stderr[-1000:]


def test_no_message_holds_a_literal_tab(payload_small, tmp_path):
    """Issue 45: messages with literal tabs. A console script whose name holds a tab is named by
    the relocate step's line: as `\\t`, never a tab on the terminal or in run.log."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    odd = src / "bin" / "odd\tname"
    odd.write_text(f"#!{src}/bin/python\nprint('hi')\n")
    odd.chmod(0o755)
    r = compile_and_run(
        tmp_path,
        src,
        tmp_path / "d" / "venv",
        policy="replace",
        checks="  - imports: [rb_payload]\n",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bin/odd\\tname" in r.stderr, r.stderr[-3000:]
    assert "\t" not in r.stderr, [ln for ln in r.stderr.splitlines() if "\t" in ln]
    log = (tmp_path / "run" / "run.log").read_text()
    assert "\t" not in log, [ln for ln in log.splitlines() if "\t" in ln]
