"""Every lab on a busy machine (issue #13): a start that fails halfway leaves nothing behind (no
namespace, process, bridge, dir or lock), a daemon that comes up late is waited for, one that
exits fails the wait at once, and what a killed run left is removed when the next session starts.
Real namespaces and daemons, like the other e2e tests: without root they skip here and fail in CI.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.lab import Lab, LabError, fanout, list_netns, subnets
from tests.lab import cluster as cluster_mod
from tests.lab.cluster import Cluster, cluster_unavailable_reason, run_pids
from tests.lab.fixtures import require_lab
from tests.lab.slurm import SlurmCluster, slurm_unavailable_reason
from tests.lab.stale import cleanup_all_stale

pytestmark = pytest.mark.e2e

SUBNET = subnets.subnet("lab_teardown")


def _links() -> str:
    return subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a killed daemon waits there for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _dead(pids: list[int]) -> bool:
    return not any(_running(p) for p in pids)


def assert_lab_gone(lab: Lab, pids: list[int]) -> None:
    assert not [n for n in list_netns() if n.startswith(f"{lab.prefix}-{lab.runid}-")]
    assert f"rbl{lab.runid}h" not in _links()
    assert lab.dir is not None and not lab.dir.exists()
    assert not lab.lock_file.exists()
    assert pids and _dead(pids)


def assert_cluster_gone(c: Cluster, pids: list[int]) -> None:
    assert not [n for n in list_netns() if n.startswith(f"rbfan-{c.runid}-")]
    assert c.bridge not in _links() and f"rbf{c.runid}" not in _links()
    assert not c.dir.exists() and not c.lock_file.exists()
    assert run_pids(c.runid) == []
    assert pids and _dead(pids)


def test_a_lab_start_that_fails_halfway_leaves_nothing(monkeypatch):
    require_lab()
    spawn = Lab._spawn_sshd
    pids: list[int] = []

    def spawn_or_fail(self, h):
        if h.name == "b":  # a's sshd runs, every namespace exists
            raise LabError("injected: b's sshd cannot start")
        spawn(self, h)
        pids.append(h.proc.pid)

    monkeypatch.setattr(Lab, "_spawn_sshd", spawn_or_fail)
    lab = Lab(("a", "b", "c"), prefix="rblhalf")
    with pytest.raises(LabError, match="injected"):
        lab.start()
    assert len(pids) == 1
    assert_lab_gone(lab, pids)
    lab.stop()  # idempotent after a failed start


def test_a_lab_waits_for_an_sshd_that_starts_late(monkeypatch, caplog):
    require_lab()
    caplog.set_level(logging.INFO, logger="tests.lab")
    spawn = Lab._spawn_sshd
    late: list[threading.Thread] = []

    def spawn_late(self, h):
        if h.name != "b":
            return spawn(self, h)
        t = threading.Thread(target=lambda: (time.sleep(4), spawn(self, h)), daemon=True)
        late.append(t)
        t.start()

    monkeypatch.setattr(Lab, "_spawn_sshd", spawn_late)
    try:
        with Lab(("a", "b"), prefix="rbllate") as lab:
            assert lab.ready_seconds["b"] >= 4
            assert lab.ssh("b", "hostname", check=True).stdout.strip() == "b"
            pids = [h.proc.pid for h in lab.hosts.values() if h.proc]
    finally:
        for t in late:
            t.join(timeout=30)
    assert_lab_gone(lab, pids)
    lines = [r.getMessage() for r in caplog.records if r.name == "tests.lab"]
    assert any(
        f"rbllate-{lab.runid} b: listening after" in m and "ssh ok after" in m for m in lines
    ), lines


def test_ssh_refused_at_first_is_retried_until_it_works(monkeypatch, caplog):
    require_lab()
    caplog.set_level(logging.INFO, logger="tests.lab")
    spawn = Lab._spawn_sshd
    later: list[threading.Thread] = []

    def spawn_keys_late(self, h):
        spawn(self, h)
        if h.name == "a":  # sshd listens at once but refuses the key for 3 s
            keys = self.dir / "authorized_keys"
            keys.rename(keys.with_name("keys.later"))
            t = threading.Thread(
                target=lambda: (time.sleep(3), keys.with_name("keys.later").rename(keys)),
                daemon=True,
            )
            later.append(t)
            t.start()

    monkeypatch.setattr(Lab, "_spawn_sshd", spawn_keys_late)
    try:
        with Lab(("a",), prefix="rblkeys") as lab:
            assert lab.ready_seconds["a"] >= 3
            assert lab.ssh("a", "hostname", check=True).stdout.strip() == "a"
    finally:
        for t in later:
            t.join(timeout=30)
    msg = next(
        r.getMessage() for r in caplog.records if f"rblkeys-{lab.runid} a:" in r.getMessage()
    )
    assert "tries)" in msg and "(1 try)" not in msg, msg


def test_an_sshd_that_exits_fails_the_wait_at_once(monkeypatch):
    require_lab()
    write = Lab._write_sshd_config

    def bad_config(self, h):
        write(self, h)
        if h.name == "b":
            with open(h.sshd_config, "a") as f:
                f.write("NoSuchOption yes\n")

    monkeypatch.setattr(Lab, "_write_sshd_config", bad_config)
    lab = Lab(("a", "b"), prefix="rblexit", ready_timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(LabError, match=r"sshd of b exited rc=255[\s\S]*NoSuchOption"):
        lab.start()
    assert time.monotonic() - t0 < 30  # not the minute (or more, under load) it may wait
    assert_lab_gone(lab, [h.proc.pid for h in lab.hosts.values() if h.proc])


def test_a_cluster_start_that_fails_halfway_leaves_nothing(monkeypatch):
    fanout.require(cluster_unavailable_reason(), "fan-out cluster")
    start_sshd = Cluster._start_sshd
    pids: list[int] = []

    def start_or_fail(self, name, binds=()):
        if name == "node03":  # node01 and node02 run their sshd
            raise LabError("injected: node03's sshd cannot start")
        start_sshd(self, name, binds)
        pids.append(self.procs[name].pid)

    monkeypatch.setattr(Cluster, "_start_sshd", start_or_fail)
    c = Cluster(3, subnet=SUBNET)
    with pytest.raises(LabError, match="injected"):
        c.start()
    assert len(pids) == 2
    assert_cluster_gone(c, pids)
    c.stop()


def test_a_cluster_waits_for_a_node_whose_sshd_starts_late():
    fanout.require(cluster_unavailable_reason(), "fan-out cluster")
    c = Cluster(2, subnet=SUBNET)
    c.node_start = ["if [ {name} = node02 ]; then sleep 6; fi"]  # before node02's sshd
    with c:
        assert c.ready_seconds["node02"] >= 6
        assert c.ssh("node02", "hostname", check=True).stdout.strip() == "node02"
        pids = [p.pid for p in c.procs.values()]
    assert_cluster_gone(c, pids)


def test_a_slurm_cluster_whose_slurmctld_fails_leaves_nothing(monkeypatch):
    fanout.require(slurm_unavailable_reason(), "slurm mini-cluster")
    seen: dict[str, list[int]] = {}

    def ctld_fails(self):
        seen["run"] = run_pids(self.runid)  # munged here, slurmd and sshd in the nodes
        seen["munged"] = [int((self.dir / "munge" / "munged.pid").read_text())]
        raise LabError("injected: slurmctld cannot start")

    monkeypatch.setattr(SlurmCluster, "_start_ctld", ctld_fails)
    c = SlurmCluster(2, subnet=SUBNET)
    with pytest.raises(LabError, match="injected"):
        c.start()
    assert len(seen["run"]) >= 5  # munged, 2 x (slurmd, sshd)
    assert_cluster_gone(c, seen["run"] + seen["munged"])


def test_leftovers_of_killed_runs_are_removed_at_session_start():
    fanout.require(cluster_unavailable_reason(), "fan-out cluster")
    runid = secrets.token_hex(3)
    gone_pid = subprocess.Popen(["true"])  # its owner: a process that is gone
    gone_pid.wait()
    run_dir = cluster_mod.RUN_ROOT / f"rbfan-{runid}"
    run_dir.mkdir()
    (run_dir / "owner").write_text(str(gone_pid.pid))
    ns, lab_ns, bridge = f"rbfan-{runid}-node01", f"rblghost-{runid}-a", f"rbfb{runid}"
    daemons = []
    try:
        for name in (ns, lab_ns):
            subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        daemons.append(
            subprocess.Popen(  # a munged-like daemon naming the run's dir
                [
                    sys.executable,
                    "-c",
                    "import time; time.sleep(300)",
                    f"{run_dir}/munge/munged.pid",
                ]
            )
        )
        daemons.append(
            subprocess.Popen(  # a process left in the node's namespace
                ["nsenter", f"--net=/run/netns/{ns}", "sleep", "300"]
            )
        )
        time.sleep(0.2)
        removed = cleanup_all_stale()
        assert f"cluster {runid}" in removed and f"namespace {lab_ns}" in removed, removed
        assert ns not in list_netns() and lab_ns not in list_netns()
        assert bridge not in _links() and not run_dir.exists()
        for d in daemons:
            assert d.wait(timeout=10) == -9
    finally:
        for d in daemons:
            if d.poll() is None:
                d.kill()
                d.wait()
        for name in (ns, lab_ns):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        shutil.rmtree(run_dir, ignore_errors=True)
