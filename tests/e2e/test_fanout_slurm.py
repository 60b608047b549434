"""Fan-out through Slurm to a real mini-cluster: 8 namespace nodes running slurmd, slurmctld and a
private munged here (tests/lab/slurm.py). The runbook runs inside `salloc`, as a user would run it:
sbcast carries the bundle (as a tree: TreeWidth=2, so this machine sends it to few nodes), one srun
task per node installs and probes, the reports come back through srun's output and are compared.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from compiler.fanout import SBCAST_FANOUT
from tests.lab import fanout, subnets
from tests.lab.slurm import SlurmCluster, slurm_unavailable_reason


def dest(name: str) -> str:
    """Where test NAME installs on each node (/tmp is private to the node): a path of its own, so
    a node never holds another test's install (it would keep it: already up to date)."""
    return f"/tmp/rbdest-{name}/venv"


@pytest.fixture(scope="module")
def slurm():
    fanout.require(slurm_unavailable_reason(), "slurm mini-cluster")
    with SlurmCluster(8, subnet=subnets.subnet("fanout_slurm")) as c:
        yield c


@pytest.fixture(autouse=True)
def settled(slurm):
    """Every node idle before each test: what one test left behind (a node down, one Slurm still
    holds `completing`) must not fail the next test's salloc."""
    slurm.settle()


def spec(
    c: SlurmCluster, venv: Path, *, name: str, success="all", nodes=None, extra: str = ""
) -> str:
    return fanout.spec(
        name,
        venv,
        dest(name),
        engine="slurm",
        nodes=nodes or c.nodeset,
        success=success,
        connect_timeout=10,
        extra=extra,
    )


def build(tmp_path: Path, text: str, name: str) -> Path:
    return fanout.build(tmp_path, text, name)


def start(c: SlurmCluster, tmp_path: Path, argv: list[str]) -> subprocess.Popen:
    env = dict(c.env, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _out, err = p.communicate(timeout=30)
        pytest.fail(f"runbook still running after {timeout} s: {err[-4000:]}")
    script = next(a for a in reversed(p.args) if a.endswith(".sh"))
    Path(script).with_suffix(".err").write_text(err)  # beside the runbook, to read later
    return p.returncode, err


@pytest.mark.e2e
def test_slurm_fanout_installs_and_probes_every_node(slurm, payload_small, tmp_path):
    script = build(tmp_path, spec(slurm, payload_small.venv, name="slurm8"), "slurm8")
    t0 = time.monotonic()
    rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
    took = time.monotonic() - t0
    assert rc == 0, err[-6000:]
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == slurm.names and not fan["odd"] and not fan["missing"]
    assert len(fan["groups"]) == 1
    # sbcast never -f: a file already at the new name is never written through (issue 44 R3)
    assert "$ sbcast -t" in err and "sbcast -f" not in err and "srun -N 8 -n 8" in err
    for name in slurm.names:  # each node has its own working copy
        out = slurm.ssh(name, f"{dest('slurm8')}/bin/payload-hello", check=True).stdout
        assert json.loads(out)["prefix"] == dest("slurm8")
        assert (slurm.node_tmp(name) / "rbdest-slurm8" / "venv" / "pyvenv.cfg").exists()
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["outcome"] == "ok" and set(doc["probes"]) == set(slurm.names)
    print(f"\nslurm fan-out to 8 nodes: {took:.1f} s")


@pytest.mark.e2e
def test_outside_an_allocation_the_runbook_says_how_to_get_one(slurm, payload_small, tmp_path):
    script = build(tmp_path, spec(slurm, payload_small.venv, name="slurmnoalloc"), "slurmnoalloc")
    rc, err = finish(start(slurm, tmp_path, ["bash", str(script)]))
    assert rc != 0
    assert "salloc -N 8 -w node[01-08] --no-kill" in err


@pytest.mark.e2e
def test_an_allocation_without_every_node_is_refused_before_anything_moves(
    slurm, payload_small, tmp_path
):
    script = build(tmp_path, spec(slurm, payload_small.venv, name="slurmpart"), "slurmpart")
    argv = slurm.salloc(["bash", str(script)], nodes="node[01-04]")
    rc, err = finish(start(slurm, tmp_path, argv))
    assert rc != 0
    assert "node[05-08]" in err and "not in this allocation" in err
    assert not (tmp_path / "run" / "fanout" / "copy.out").exists()


@pytest.mark.e2e
def test_slurm_odd_node_named_and_node_down_mid_run_reported(slurm, payload_small, tmp_path):
    bad = fanout.corrupting_tar(tmp_path / "bad-sbin")  # node02: a disk that corrupts a file
    slow = fanout.slow_tar(tmp_path / "slow-sbin", 30)  # node06: time to take it down mid-install
    sqlite = fanout.sqlite_module()
    try:
        slurm.restart_node("node02", binds=[(str(bad), "/usr/local/sbin")])
        slurm.restart_node("node04", binds=[("/dev/null", sqlite)])  # import sqlite3 fails
        slurm.restart_node("node06", binds=[(str(slow), "/usr/local/sbin")])
        script = build(
            tmp_path, spec(slurm, payload_small.venv, name="slurmodd", success=5), "slurmodd"
        )
        p = start(slurm, tmp_path, slurm.salloc(["bash", str(script)]))
        staging = slurm.node_tmp("node06") / "rbdest-slurmodd" / ".venv.rb-staging"
        deadline = time.monotonic() + 120
        while not staging.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert staging.exists(), "node06 never started its install"
        slurm.kill_node("node06")  # mid-run: slurmd, sshd and the task
        t_kill = time.monotonic()
        rc, err = finish(p)
        after_kill = time.monotonic() - t_kill
    finally:
        for name in ("node02", "node04", "node06"):
            slurm.restart_node(name)
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert rc == 0, err[-6000:]  # success: 5, and 5 passed
    assert sorted(fan["ok_nodes"]) == ["node01", "node03", "node05", "node07", "node08"]
    assert set(fan["odd"]) == {"node02", "node04"} and set(fan["missing"]) == {"node06"}
    assert any("verify: fail" in d and "pyvenv.cfg" in d for d in fan["odd"]["node02"])
    assert any("imports" in d and "sqlite3" in d for d in fan["odd"]["node04"])
    assert "no report from node06" in err
    print(f"\nslurm: the run ended {after_kill:.1f} s after node06 went down")


@pytest.mark.e2e
def test_sbcast_carries_the_bundle_as_a_tree_not_once_per_node(slurm, tmp_path):
    venv = fanout.payload_with_blob(tmp_path / "big" / "venv")
    script = build(tmp_path, spec(slurm, venv, name="slurmtree"), "slurmtree")
    before = fanout.tx_bytes(slurm.bridge)
    rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
    sent = fanout.tx_bytes(slurm.bridge) - before
    assert rc == 0, err[-6000:]
    bundle = fanout.step_facts(tmp_path / "run", "fan_pack")["bundle_bytes"]
    ratio = sent / int(bundle)
    print(
        f"\nbundle {int(bundle) / 1e6:.1f} MB; this machine sent {sent / 1e6:.1f} MB into the "
        f"cluster for 8 nodes: {ratio:.2f} bundles (sbcast --fanout={SBCAST_FANOUT})"
    )
    assert ratio < SBCAST_FANOUT + 1  # flat, it would be 8 bundles


@pytest.mark.e2e
def test_a_rerun_sends_only_the_change_and_the_whole_bundle_where_needed(slurm, tmp_path):
    venv = fanout.payload_with_blob(tmp_path / "src" / "venv")
    script = build(tmp_path, spec(slurm, venv, name="slurmre"), "slurmre")
    rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
    assert rc == 0, err[-6000:]
    whole = int(fanout.step_facts(tmp_path / "run", "fan_pack")["bundle_bytes"])
    line = fanout.change_one_file(venv)
    rel = "rbdest-slurmre/venv/" + str(fanout.site_packages(venv).relative_to(venv))
    shutil.rmtree(slurm.node_tmp("node03") / "rbdest-slurmre" / "venv")  # node03: no install now
    t0 = time.monotonic()
    rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
    took = time.monotonic() - t0
    assert rc == 0, err[-6000:]
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == slurm.names and not fan["odd"] and not fan["missing"]
    delta = int(fanout.step_facts(tmp_path / "run", "fan_pack")["bundle_bytes"])
    # the 8 MiB blob stayed home (the kit, ~0.45 MB uncompressed, travels in both bundles)
    assert delta < whole - (7 << 20), (delta, whole)
    assert "1 nodes could not take the changes alone (node03" in err
    assert "srun -N 1 -n 1 --ntasks-per-node=1 -w node03" in err
    for name in slurm.names:
        assert (
            (slurm.node_tmp(name) / rel / "rb_payload" / "__init__.py").read_text().endswith(line)
        )
        assert (slurm.node_tmp(name) / rel / "rb_blob.bin").stat().st_size == 8 << 20
    for name in slurm.names:  # installed: no bundle left (sbcast's second copy removed too)
        assert not list(slurm.node_tmp(name).glob("rbfan-slurmre*.tar")), name
    assert "srun -N 7 -n 7 --ntasks-per-node=1 -w node01,node02,node04" in err
    print(
        f"\nslurm re-run: {took:.1f} s; bundle {whole / 1e6:.1f} MB whole, "
        f"{delta / 1e3:.1f} kB changes only"
    )


# Python files another user of a node can leave in its /tmp (the scratch base: srun's --chdir on
# 24efc9a, where `python3 -S -m rbkit.fanout` put the working directory first on sys.path): the
# kit's own modules and stdlib modules the node's start imports. Each writes its euid into MARKS.
PLANTED = (
    "rbkit/__init__.py",
    "rbkit/fanout.py",
    "rbkit/__main__.py",
    "rbrules/__init__.py",
    "rbrules/start.py",
    "rbprobes/__init__.py",
    "rbprobes/__main__.py",
    "rbprobes/cli.py",
    "hashlib.py",
    "json.py",
    "runpy.py",
    "argparse.py",
    "sitecustomize.py",
)
MARKS = "rbplant-marks"  # on each node's /tmp, 1777: whoever runs a planted file writes here

PLANT = r"""
import os, sys
tmp, marks, names = sys.argv[1], sys.argv[2], sys.argv[3:]
os.mkdir(os.path.join(tmp, marks))
os.chmod(os.path.join(tmp, marks), 0o1777)
for rel in names:
    path = os.path.join(tmp, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("import os\n"
                "with open(os.path.join('/tmp', %r, '%%s-euid%%d-pid%%d' %% (%r, os.geteuid(),"
                " os.getpid())), 'w') as _f:\n"
                "    _f.write(str(os.geteuid()))\n" % (marks, rel.replace('/', '.')))
"""


def plant_as_nobody(tmp: Path) -> None:
    """As nobody (65534, no groups), the files of PLANTED in `tmp` (a node's /tmp seen from here)
    and the 1777 marks directory they write to."""
    subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-I",
            "-c",
            PLANT,
            str(tmp),
            MARKS,
            *PLANTED,
        ],
        cwd="/",
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert (tmp / "rbkit" / "fanout.py").stat().st_uid == 65534


@pytest.mark.e2e
def test_modules_planted_in_a_nodes_tmp_never_run(slurm, payload_small, tmp_path):
    """Issue 33 N1, a Slurm fan-out node with a planted /tmp: nobody leaves rbkit/fanout.py (and
    the kit's other entry modules, hashlib.py, json.py, runpy.py, ...) in every node's /tmp, each
    writing its euid into a 1777 marks directory there. The run must pass on every node and no
    planted file may run. On 24efc9a it fails: srun ran each task with --chdir=/tmp (the scratch
    base) and the node started `python3 -S -m rbkit.fanout` (PYTHONPATH=kit), so /tmp came first
    on sys.path and nobody's rbkit/fanout.py ran as root (run there: rbkit/__init__.py and
    rbkit/fanout.py wrote euid 0 on all eight nodes; the stdlib names did not run). Now
    the task starts in /, the node script cds into its own 0700 scratch directory and starts
    `python3 -I -S -B KIT/rbrules/start.py rbkit.fanout node` (no working directory on sys.path)."""
    for name in slurm.names:
        plant_as_nobody(slurm.node_tmp(name))
    try:
        script = build(tmp_path, spec(slurm, payload_small.venv, name="slurmplant"), "slurmplant")
        rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
        ran = {
            name: sorted(p.name for p in (slurm.node_tmp(name) / MARKS).iterdir())
            for name in slurm.names
        }
    finally:
        for name in slurm.names:
            tmp = slurm.node_tmp(name)
            for top in {rel.split("/")[0] for rel in PLANTED} | {MARKS}:
                p = tmp / top
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    assert not any(ran.values()), f"planted files ran on the nodes: {ran}"
    assert rc == 0, err[-6000:]
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == slurm.names and not fan["odd"] and not fan["missing"]
    for name in slurm.names:
        assert (slurm.node_tmp(name) / "rbdest-slurmplant" / "venv" / "pyvenv.cfg").exists()


@pytest.mark.e2e
def test_a_bundle_another_user_left_at_a_scratch_name_is_never_unpacked(
    slurm, payload_small, tmp_path
):
    """Issue 44 R3 (Slurm, the same node script as clush): after a run, nobody writes a tar of its
    own at every scratch name the run showed, in every node's /tmp; then `--from fan_install`
    inside a new allocation. Nothing of nobody's may run; every node installs from a bundle of
    this run. On 44a2c10 the --from run reused the saved name without a new copy and each srun
    task unpacked nobody's tar and ran its start.py as root."""
    script = build(tmp_path, spec(slurm, payload_small.venv, name="slurmbundle"), "slurmbundle")
    rc, err = finish(start(slurm, tmp_path, slurm.salloc(["bash", str(script)])))
    assert rc == 0, err[-6000:]
    fanout.assert_planted_bundles_never_run(
        slurm.node_tmp,
        slurm.names,
        "slurmbundle",
        tmp_path / "run",
        err,
        lambda: finish(
            start(slurm, tmp_path, slurm.salloc(["bash", str(script), "--from", "fan_install"]))
        ),
    )
