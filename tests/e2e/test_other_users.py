"""Other users of the same host (issue 33): root runs the runbook where another user, `nobody`,
could plant code or links. Nothing planted is run, and nothing is written through a name another
user controls: the run either goes on untouched by it or is refused, naming what to fix.

Each test plants as `nobody` (setpriv: the planting has exactly nobody's rights) in a directory
under /tmp that nobody can reach, and fails on the commit before the rule (24efc9a).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from compiler import kit
from tests.e2e.test_local_runbook import compile_, report

pytestmark = pytest.mark.e2e

NOBODY = 65534
SETPRIV = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# what a planted module does when imported: say so, as which user
PLANTED = (
    "import os\n"
    "open(os.path.join({marker!r}, 'ran-' + __name__ + '-uid' + str(os.geteuid())), 'w')"
    ".close()\n"
)
MODULES = (
    "hashlib",
    "json",
    "runpy",
    "argparse",
    "tempfile",
    "subprocess",
    "shlex",
    "sitecustomize",
    "usercustomize",
    "threading",
    "typing",
    "stat",
    "re",
)
PACKAGES = kit.HOST_PACKAGES  # the kit shipped to hosts: one list, compiler/kit.py


def as_nobody(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*SETPRIV, *argv], check=True, capture_output=True, text=True, **kw)


@pytest.fixture
def shared():
    """A directory under /tmp that nobody can reach (0755, root's): tests make their hostile
    places inside."""
    base = Path(tempfile.mkdtemp(prefix="rb-others-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def world_writable(path: Path, sticky: bool = True) -> Path:
    path.mkdir()
    path.chmod(0o1777 if sticky else 0o777)
    return path


def plant_modules(where: Path, marker: Path) -> None:
    """As nobody: every module a start of the kit imports early, and the kit's own packages, in
    `where`, each leaving a file in `marker` when it runs."""
    script = (
        "import os, sys\n"
        "where, body = sys.argv[1], sys.argv[2]\n"
        f"for m in {MODULES!r}:\n"
        "    open(os.path.join(where, m + '.py'), 'w').write(body)\n"
        f"for p in {PACKAGES!r}:\n"
        "    os.mkdir(os.path.join(where, p))\n"
        "    for m in ('__init__', '__main__', 'fanout', 'start', 'cli', 'serve'):\n"
        "        open(os.path.join(where, p, m + '.py'), 'w').write(body)\n"
    )
    as_nobody(
        "/usr/bin/python3", "-I", "-c", script, str(where), PLANTED.format(marker=str(marker))
    )


def test_a_runbook_started_from_a_world_writable_directory_runs_nothing_planted_there(
    payload_small, shared, tmp_path
):
    """N2: root runs `bash /path/to/x.sh` from a directory nobody has filled with hashlib.py,
    json.py, rbkit/, rbrules/, ... (and PYTHONPATH, from a shared login profile, names it). Every
    Python the run starts (the kit's boot and seal, the engine, the scan, the audit, the
    relocation's child, the probe with the venv's interpreter, the report) imports none of it."""
    cwd = world_writable(shared / "cwd")
    marker = world_writable(shared / "marker")
    plant_modules(cwd, marker)
    dst = tmp_path / "d" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst)
    env = dict(
        os.environ,
        RB_RUN_DIR=str(tmp_path / "run"),
        PYTHONPATH=str(cwd),
        PYTHONSTARTUP=str(cwd / "json.py"),
        PYTHONUSERBASE=str(cwd),
    )
    r = subprocess.run(
        ["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert sorted(os.listdir(marker)) == [], r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert report(tmp_path)["outcome"] == "ok"
    assert (dst / "bin" / "payload-hello").exists()


def test_the_default_run_directory_in_a_world_writable_directory_is_refused(
    payload_small, shared, tmp_path
):
    """N3: with no RB_RUN_DIR, the run directory is runs/NAME where the runbook was started; in a
    directory anyone can write, nobody could have made runs/ a link to anywhere. Refused, naming
    the directory and the fix, before anything is written there."""
    cwd = world_writable(shared / "cwd")
    bait = tmp_path / "bait"
    bait.mkdir()
    as_nobody("ln", "-s", str(bait), str(cwd / "runs"))
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = {k: v for k, v in os.environ.items() if k != "RB_RUN_DIR"}
    r = subprocess.run(
        ["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"refusing the run directory {cwd}/runs/e2e:" in r.stderr
    assert "set RB_RUN_DIR to a directory only root can write" in r.stderr
    assert os.listdir(bait) == [] and not (tmp_path / "d").exists()


def test_a_run_directory_another_user_owns_is_refused_and_nothing_is_written_through_it(
    payload_small, shared, tmp_path
):
    """N3: RB_RUN_DIR is a directory nobody owns; nobody has put run.log -> a root-only file
    and kit/ there. The run refuses it (exit 2, owner and mode named) and the file is intact."""
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    run = world_writable(shared / "drop") / "run"
    as_nobody("mkdir", "-m", "755", str(run))
    as_nobody("ln", "-s", str(secret), str(run / "run.log"))
    as_nobody("ln", "-s", str(secret), str(run / "events.tsv"))
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = dict(os.environ, RB_RUN_DIR=str(run))
    r = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        f"refusing the run directory {run}: directory {run} is owned by nobody (uid {NOBODY}), "
        "mode 0755: that user can rename or replace what is in it" in r.stderr
    )
    assert secret.read_text() == "root only\n"
    assert not (tmp_path / "d").exists()


def test_a_run_directory_under_a_directory_others_can_write_is_refused(
    payload_small, shared, tmp_path
):
    """N3: RB_RUN_DIR is root's and 0700, but its parent is 0777 (not sticky): anyone can rename
    it away and put their own in its place between two writes. Refused, the parent named."""
    parent = world_writable(shared / "open", sticky=False)
    (parent / "run").mkdir(mode=0o700)
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    r = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        env=dict(os.environ, RB_RUN_DIR=str(parent / "run")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        f"directory {parent} is owned by root (uid 0), mode 0777: writable by group and "
        "others without the sticky bit" in r.stderr
    )
    assert os.listdir(parent / "run") == []


def test_a_report_in_a_directory_anyone_can_write_is_refused(payload_small, shared, tmp_path):
    """N3: --report /shared/report.json in a 1777 directory where nobody has put
    report.json.tmp -> a root-only file (the name the report was written under). Refused; the
    file is intact."""
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    drop = world_writable(shared / "drop")
    as_nobody("ln", "-s", str(secret), str(drop / "report.json.tmp"))
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    r = subprocess.run(
        ["bash", str(script), "--report", str(drop / "report.json")],
        cwd=tmp_path,
        env=dict(os.environ, RB_RUN_DIR=str(tmp_path / "run")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        f"refusing the directory of --report {drop}: directory {drop} is writable by others "
        "(mode 1777)" in r.stderr
    )
    assert secret.read_text() == "root only\n"


def test_a_run_locked_out_of_the_run_directory_leaves_the_other_runs_records_alone(
    payload_small, tmp_path
):
    """N7: a second run of the runbook while one holds the run directory stops before it writes
    anything there (the holder's log, events and report stay as they are), naming the holder; a
    lock whose holder is gone is taken over."""
    run = tmp_path / "run"
    script = compile_(tmp_path, payload_small.venv, tmp_path / "d" / "venv")
    env = dict(os.environ, RB_RUN_DIR=str(run))
    r = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    records = {p: (run / p).read_bytes() for p in ("run.log", "events.tsv", "report.json")}
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (run / ".run-lock").mkdir(mode=0o700)
        (run / ".run-lock" / "holder").write_text(f"{holder.pid} elsewhere\n")
        r = subprocess.run(
            ["bash", str(script)],
            cwd=tmp_path,
            env=dict(env, RB_LOCK_WAIT="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1, r.stderr[-3000:]
        assert (
            f"waiting up to 1 s for another run of e2e (pid {holder.pid}) that holds {run}"
            in r.stderr
        )
        assert f"another run of e2e (pid {holder.pid}) still holds {run} after 1 s" in r.stderr
        assert {p: (run / p).read_bytes() for p in records} == records
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: the next run takes the directory over, and lets go at its end
    r = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already holds this exact tree" in r.stderr
    assert not (run / ".run-lock").exists()
    assert json.loads((run / "report.json").read_text())["outcome"] == "ok"
