"""ClusterShell tree mode and per-node rollback on a real mini-cluster (tests/lab/cluster.py, on
its own /24 from tests/lab/subnets.py, so it can run beside the other fan-out tests).

Tree: this machine is the topology's root (ClusterShell calls it by its short hostname), node01
and node05 are gateways for node[02-04] and node[06-08]. A wrapper around clush (first on the
runbook's PATH) reads the bridge's tx_bytes before and after each clush call: what this machine
sent, per call. The gateways run their own ssh with the options clush hands them (`-F
ssh_config`: the same path, read on the gateway) and ClusterShell's gateway with
CLUSTERSHELL_GW_PYTHON_EXECUTABLE.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_fanout import require_cluster
from tests.lab import fanout, subnets
from tests.lab.cluster import Cluster
from tests.lab.payload import build_payload

DEST = "/tmp/rbtree-dest/venv"  # on each node: /tmp is private to the node
BLOB_MIB = 8  # random bytes in the payload: zstd cannot shrink them
HEAD = socket.gethostname().split(".")[0]  # what ClusterShell calls this machine


@pytest.fixture(scope="module")
def cluster():
    require_cluster()
    with Cluster(8, subnet=subnets.subnet("fanout_tree")) as c:
        yield c


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A private small payload venv with BLOB_MIB of random bytes and a version file, a clush
    wrapper that logs what this machine sends per call, the topology."""
    d = tmp_path_factory.mktemp("tree")
    venv = build_payload("small", dest=d / "src" / "venv").venv
    (venv / "rb_blob.bin").write_bytes(os.urandom(BLOB_MIB << 20))
    (venv / "rb_version.txt").write_text("1\n")
    (d / "bin").mkdir()
    return d


def wrap_clush(d: Path, bridge: str) -> Path:
    log = d / "clush-tx.log"
    stats = f"/sys/class/net/{bridge}/statistics/tx_bytes"
    (d / "bin" / "clush").write_text(
        "#!/bin/bash\n"
        f"a=$(cat {stats}); s=$SECONDS\n"
        '/usr/bin/clush "$@"; rc=$?\n'
        "what=command; [[ \" $* \" == *' --copy '* ]] && what=copy\n"
        f'printf \'%s %s %s %s\\n\' "$what" "$(( $(cat {stats}) - a ))" "$((SECONDS - s))" '
        f'"$rc" >>{log}\n'
        "exit $rc\n"
    )
    (d / "bin" / "clush").chmod(0o755)
    log.write_text("")
    return log


def topology(d: Path, head: str = HEAD) -> Path:
    p = d / "topology.conf"
    p.write_text(f"[routes]\n{head}: node[01,05]\nnode01: node[02-04]\nnode05: node[06-08]\n")
    return p


def spec(
    c: Cluster,
    venv: Path,
    name: str,
    *,
    topo: Path | None,
    on_existing="replace",
    success="all",
    extra="",
    dest: str = DEST,
) -> str:
    tree = f"  topology: {topo}\n  gateway_python: /usr/bin/python3\n" if topo else ""
    return fanout.spec(
        name,
        venv,
        dest,
        engine="clush",
        nodes=c.nodeset,
        on_existing=on_existing,
        success=success,
        extra=f"  ssh_config: {c.ssh_config}\n{tree}{extra}",
    )


def run(d: Path, text: str, name: str, timeout: float = 300) -> tuple[int, str, Path]:
    out = d / name
    out.mkdir()
    fanout.build(out, text, name)
    env = dict(os.environ, RB_RUN_DIR=str(out / "run"), PATH=f"{d / 'bin'}:{os.environ['PATH']}")
    p = subprocess.run(
        ["bash", str(out / f"{name}.sh")],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stderr, out / "run"


def calls(log: Path) -> list[tuple[str, int, int, int]]:
    rows = [ln.split() for ln in log.read_text().splitlines() if ln.strip()]
    log.write_text("")
    return [(w, int(b), int(s), int(rc)) for w, b, s, rc in rows]


def on_node(c: Cluster, name: str, path: str) -> str:
    return c.ssh(name, f"cat {path}", check=True).stdout.strip()


@pytest.mark.e2e
def test_tree_copy_sends_the_bundle_once_per_gateway_not_once_per_node(cluster, work):
    log = wrap_clush(work, cluster.bridge)
    rc, err, rundir = run(work, spec(cluster, work / "src" / "venv", "flat8", topo=None), "flat8")
    assert rc == 0, err[-6000:]
    flat = calls(log)
    bundle = (rundir / "fanout" / "rbfan-flat8.tar").stat().st_size
    assert bundle > BLOB_MIB << 20

    topo = topology(work)
    rc, err, rundir = run(work, spec(cluster, work / "src" / "venv", "tree8", topo=topo), "tree8")
    assert rc == 0, err[-6000:]
    tree = calls(log)
    fan = json.loads((rundir / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == cluster.names and not fan["missing"]
    for name in cluster.names:  # every node, behind a gateway or not, has its own copy
        out = cluster.ssh(name, f"{DEST}/bin/payload-hello", check=True).stdout
        assert json.loads(out)["prefix"] == DEST
    assert "CLUSTERSHELL_GW_PYTHON_EXECUTABLE=/usr/bin/python3 clush" in err

    flat_copy = [b for w, b, _s, rc in flat if w == "copy" and rc == 0]
    tree_copy = [b for w, b, _s, rc in tree if w == "copy" and rc == 0]
    assert len(flat_copy) == 1 and len(tree_copy) == 1, (flat, tree)
    flat_x, tree_x = flat_copy[0] / bundle, tree_copy[0] / bundle
    print(
        f"\nbundle {bundle / 1e6:.1f} MB; this machine sent: flat {flat_copy[0] / 1e6:.1f} MB "
        f"({flat_x:.2f} bundles), tree {tree_copy[0] / 1e6:.1f} MB ({tree_x:.2f} bundles); "
        f"calls flat {flat} tree {tree}"
    )
    assert 7.9 < flat_x < 8.3  # scp to each of the 8 nodes
    # 2 gateways: each gets the bundle by scp (it is a target too) and once more through
    # ClusterShell's channel (pickled, base64: 4/3); the 6 nodes behind them get nothing from here
    assert 4.4 < tree_x < 5.0
    assert tree[0][0] == "command"  # the preflight's `true` through the tree


@pytest.mark.e2e
def test_preflight_names_the_root_clustershell_expects(cluster, work):
    calls(wrap_clush(work, cluster.bridge))
    topo = topology(work, head="not-this-host")
    rc, err, _run = run(work, spec(cluster, work / "src" / "venv", "badroot", topo=topo), "badroot")
    assert rc == 1
    assert "fan_preflight" in err
    assert f'"{HEAD}" is not a valid root node' in err
    assert f"ClusterShell names this machine {HEAD}" in err


@pytest.mark.e2e
def test_a_gateway_without_the_ssh_config_loses_its_nodes_only(cluster, work):
    """clush hands its ssh options to the gateways: `-F PATH` is read on the gateway."""
    wrap_clush(work, cluster.bridge)
    topo = topology(work)
    try:
        cluster.restart_node("node01", binds=[("/dev/null", str(cluster.ssh_config))])
        rc, err, rundir = run(
            work, spec(cluster, work / "src" / "venv", "gwcfg", topo=topo, success=5), "gwcfg"
        )
    finally:
        cluster.restart_node("node01")
    fan = json.loads((rundir / "fanout" / "fanout.json").read_text())
    assert rc == 0, err[-6000:]
    assert set(fan["missing"]) == {"node02", "node03", "node04"}
    assert sorted(fan["ok_nodes"]) == ["node01", "node05", "node06", "node07", "node08"]
    assert any("Could not resolve hostname node02" in w for w in fan["missing"]["node02"])


@pytest.mark.e2e
def test_a_gateway_that_dies_mid_run_loses_only_the_nodes_behind_it(cluster, work):
    """node01 (gateway of node[02-04]) is killed while node03 extracts slowly: the run ends at
    once, the nodes whose reports came through node01 are named, node[05-08] pass."""
    slow = fanout.slow_tar(work / "slow-sbin", 15)
    dest = "/tmp/rbtree-gw/venv"  # a path no earlier test installed at
    out = work / "gwdies"
    out.mkdir()
    fanout.build(
        out,
        spec(cluster, work / "src" / "venv", "gwdies", topo=topology(work), success=4, dest=dest),
        "gwdies",
    )
    env = dict(os.environ, RB_RUN_DIR=str(out / "run"))
    try:
        cluster.restart_node("node03", binds=[(str(slow), "/usr/local/sbin")])
        p = subprocess.Popen(
            ["bash", str(out / "gwdies.sh")],
            cwd=out,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        staging = cluster.node_tmp("node03") / "rbtree-gw" / ".venv.rb-staging"
        deadline = time.monotonic() + 120
        while not staging.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert staging.exists(), "node03 never started its install"
        cluster.kill_node("node01")
        killed = time.monotonic()
        _out, err = p.communicate(timeout=300)
        after_kill = time.monotonic() - killed
    finally:
        cluster.restart_node("node01")
        cluster.restart_node("node03")
    assert p.returncode == 0, err[-6000:]  # success: 4, and node[05-08] passed
    fan = json.loads((out / "run" / "fanout" / "fanout.json").read_text())
    assert {"node05", "node06", "node07", "node08"} <= set(fan["ok_nodes"])
    # node03 for sure; node01 (its own install may have finished first) and node02/04 (their
    # reports travel through node01) as ClusterShell's gateway had forwarded them or not
    assert "node03" in fan["missing"]
    assert set(fan["missing"]) <= {"node01", "node02", "node03", "node04"}
    assert after_kill < 30, after_kill  # not clush's -u 120
    assert not (cluster.node_tmp("node03") / "rbtree-gw" / "venv").exists()
    print(
        f"\ngateway node01 killed: the run ended {after_kill:.1f} s later; no report from "
        f"{sorted(fan['missing'])}"
    )


@pytest.mark.e2e
def test_a_node_whose_checks_fail_is_rolled_back_the_others_keep_the_new_install(cluster, work):
    venv = work / "src" / "venv"
    wrap_clush(work, cluster.bridge)
    topo = topology(work)
    for n in cluster.names:  # no install from an earlier test: no backup yet
        cluster.ssh(n, f"rm -rf {Path(DEST).parent}", check=True)
    (venv / "rb_version.txt").write_text("1\n")
    rc, err, _rundir = run(work, spec(cluster, venv, "v1", topo=topo, on_existing="backup"), "v1")
    assert rc == 0, err[-6000:]
    assert {on_node(cluster, n, f"{DEST}/rb_version.txt") for n in cluster.names} == {"1"}

    (venv / "rb_version.txt").write_text("2\n")
    sqlite = fanout.sqlite_module()
    try:
        # node05 (a gateway) loses _sqlite3: `import sqlite3` fails there only, after the swap
        cluster.restart_node("node05", binds=[("/dev/null", sqlite)])
        rc, err, rundir = run(
            work,
            spec(
                cluster,
                venv,
                "v2",
                topo=topo,
                on_existing="backup",
                success=7,
                extra="on_failed_checks: rollback\n",
            ),
            "v2",
        )
    finally:
        cluster.restart_node("node05")
    assert rc == 0, err[-6000:]  # success: 7, and 7 passed
    fan = json.loads((rundir / "fanout" / "fanout.json").read_text())
    assert set(fan["odd"]) == {"node05"} and not fan["missing"]
    assert set(fan["rolled_back"]) == {"node05"}
    kept = fan["rolled_back"]["node05"]["kept_current_as"]
    assert kept == f"{DEST}.rb-failed"  # apart, never a backup (issue 34)
    assert on_node(cluster, "node05", f"{DEST}/rb_version.txt") == "1"  # the old one again
    assert on_node(cluster, "node05", f"{kept}/rb_version.txt") == "2"  # the failed one, kept
    for n in cluster.names:
        if n != "node05":
            assert on_node(cluster, n, f"{DEST}/rb_version.txt") == "2"
            assert on_node(cluster, n, f"{DEST}.rb-backup.1/rb_version.txt") == "1"
    node = json.loads((rundir / "fanout" / "node-node05.json").read_text())
    assert [s["id"] for s in node["steps"]][-2:] == ["probe", "rollback"]
    assert "rolled back node05" in err and "rollback" in err.split("odd node")[0]
    assert "rolled back: node05" in err
    print(
        "\n" + "\n".join(ln for ln in err.splitlines() if "rollback" in ln or "node" in ln)[-3000:]
    )
