"""Fan-out through ClusterShell to a real mini-cluster: 8 nodes, each its own network namespace,
hostname, sshd and private /tmp (tests/lab/cluster.py). The small payload venv goes to every node,
is verified, relocated, swapped in and probed there; the reports come back and are compared.
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

from tests import browser
from tests.lab import fanout, subnets
from tests.lab.cluster import Cluster, cluster_unavailable_reason


def dest(name: str) -> str:
    """Where test NAME installs on each node (/tmp is private to the node): a path of its own, so
    a node never holds another test's install (it would keep it: already up to date)."""
    return f"/tmp/rbdest-{name}/venv"


def require_cluster() -> None:
    fanout.require(cluster_unavailable_reason(), "fan-out cluster")


@pytest.fixture(scope="module")
def cluster():
    require_cluster()
    with Cluster(8, subnet=subnets.subnet("fanout")) as c:
        yield c


def spec(c: Cluster, venv: Path, *, name="fan8", success="all", engine="clush") -> str:
    return fanout.spec(
        name,
        venv,
        dest(name),
        engine=engine,
        nodes=c.nodeset,
        success=success,
        extra=f"  ssh_config: {c.ssh_config}\n",
    )


def build(tmp_path: Path, text: str, name: str) -> Path:
    return fanout.build(tmp_path, text, name)


def start(tmp_path: Path, script: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.Popen(
        ["bash", str(script), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, err


@pytest.mark.e2e
def test_clush_fanout_installs_and_probes_every_node(cluster, payload_small, tmp_path):
    script = build(tmp_path, spec(cluster, payload_small.venv), "fan8")
    # issue #15 C1: what another user planted at the scratch name a runbook of 90eb1ef used on
    # every node (/tmp/rbfan-NAME, unpacked into with mkdir -p, its kit run as root) is never run
    canary = tmp_path / "planted-kit-ran"
    for name in cluster.names:
        planted = cluster.node_tmp(name) / "rbfan-fan8" / "kit" / "rbkit"
        planted.mkdir(parents=True, exist_ok=True)
        (planted / "__init__.py").write_text("")
        (planted / "fanout.py").write_text(f"open({str(canary)!r}, 'w').write('ran')\n")
    t0 = time.monotonic()
    rc, err = finish(start(tmp_path, script))
    took = time.monotonic() - t0
    assert rc == 0, err[-6000:]
    assert not canary.exists(), "a kit planted at the old scratch path ran"
    for name in cluster.names:
        shutil.rmtree(cluster.node_tmp(name) / "rbfan-fan8")
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == cluster.names and not fan["odd"] and not fan["missing"]
    assert len(fan["groups"]) == 1  # all eight folded into one row
    assert "node[01-08]" in err
    # progress as the nodes finish (issue #18): each node's verdict and the count, up to 8/8
    assert re.search(r"node0\d ok: 1/8 nodes done, 7 running", err), err[-3000:]
    assert re.search(r"node0\d ok: 8/8 nodes done, \d+ s", err), err[-3000:]
    for name in cluster.names:  # each node has its own, working copy
        out = cluster.ssh(name, f"{dest('fan8')}/bin/payload-hello", check=True).stdout
        assert json.loads(out)["prefix"] == dest("fan8")
        assert (cluster.node_tmp(name) / "rbdest-fan8" / "venv" / "pyvenv.cfg").exists()
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["outcome"] == "ok" and set(doc["probes"]) == set(cluster.names)
    print(f"\nclush fan-out to 8 nodes: {took:.1f} s")
    # its report.html, seen in a browser (issue 36): the nodes picture loads beside the timeline
    seen = browser.assert_seen(tmp_path / "run", fanout=fan)
    assert {i["src"] for i in seen.images} == {"timeline.svg", "nodes.svg"}


@pytest.mark.e2e
def test_odd_nodes_are_named_and_a_node_down_mid_run_is_reported(cluster, payload_small, tmp_path):
    bad = fanout.corrupting_tar(tmp_path / "bad-sbin")  # node03: a disk that corrupts a file
    slow = fanout.slow_tar(tmp_path / "slow-sbin", 20)  # node07: time to take it down mid-install
    sqlite = fanout.sqlite_module()
    try:
        cluster.restart_node("node03", binds=[(str(bad), "/usr/local/sbin")])
        # node05: a system library missing: `import sqlite3` fails there only
        cluster.restart_node("node05", binds=[("/dev/null", sqlite)])
        cluster.restart_node("node07", binds=[(str(slow), "/usr/local/sbin")])
        script = build(
            tmp_path, spec(cluster, payload_small.venv, name="fanodd", success=5), "fanodd"
        )
        p = start(tmp_path, script)
        staging = cluster.node_tmp("node07") / "rbdest-fanodd" / ".venv.rb-staging"
        deadline = time.monotonic() + 120
        while not staging.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert staging.exists(), "node07 never started its install"
        cluster.kill_node("node07")  # mid-run: during its extract
        rc, err = finish(p)
    finally:
        for name in ("node03", "node05", "node07"):
            cluster.restart_node(name)
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert rc == 0, err[-6000:]  # success: 5, and 5 passed
    assert sorted(fan["ok_nodes"]) == ["node01", "node02", "node04", "node06", "node08"]
    assert set(fan["odd"]) == {"node03", "node05"} and set(fan["missing"]) == {"node07"}
    assert any("verify: fail" in d and "pyvenv.cfg" in d for d in fan["odd"]["node03"])
    assert any("imports" in d and "sqlite3" in d for d in fan["odd"]["node05"])
    assert "odd node node03" in err and "odd node node05" in err and "no report from node07" in err
    assert "node[01-02,04,06,08]" in err
    assert re.search(r"node03 failed in verify: \d/8 nodes done \(\d not ok\)", err), err[-3000:]
    # node07 was killed: it never reports, and the last count says so
    assert "7/8 nodes done (2 not ok), 1 running when the round ended" in err, err[-3000:]


@pytest.mark.e2e
def test_policy_all_fails_the_run_when_a_node_is_down(cluster, payload_small, tmp_path):
    cluster.kill_node("node08")
    try:
        script = build(tmp_path, spec(cluster, payload_small.venv, name="fanall"), "fanall")
        rc, err = finish(start(tmp_path, script))
    finally:
        cluster.restart_node("node08")
    assert rc == 1
    assert "no report from node08" in err and "success policy all not met" in err
    assert "7/8 nodes passed" in err


@pytest.mark.e2e
def test_a_rerun_sends_only_the_change_and_the_whole_bundle_only_where_it_is_needed(
    cluster, tmp_path
):
    venv = fanout.payload_with_blob(tmp_path / "src" / "venv")
    script = build(tmp_path, spec(cluster, venv, name="fanre"), "fanre")
    rc, err = finish(start(tmp_path, script))
    assert rc == 0, err[-6000:]
    whole = int(fanout.step_facts(tmp_path / "run", "fan_pack")["bundle_bytes"])
    line = fanout.change_one_file(venv)
    rel = "rbdest-fanre/venv/" + str(fanout.site_packages(venv).relative_to(venv))
    shutil.rmtree(cluster.node_tmp("node04") / "rbdest-fanre" / "venv")  # node04: no install now
    (cluster.node_tmp("node06") / rel / "rb_blob.bin").write_bytes(b"changed on node06")
    before = fanout.tx_bytes(cluster.bridge)
    t0 = time.monotonic()
    rc, err = finish(start(tmp_path, script))
    took = time.monotonic() - t0
    sent = fanout.tx_bytes(cluster.bridge) - before
    (tmp_path / "rerun.err").write_text(err)  # to read later
    assert rc == 0, err[-6000:]
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == cluster.names and not fan["odd"] and not fan["missing"]
    pack = fanout.step_facts(tmp_path / "run", "fan_pack")
    delta = int(pack["bundle_bytes"])
    # the 8 MiB blob stayed home (the kit, ~0.45 MB uncompressed, travels in both bundles)
    assert delta < whole - (7 << 20), (delta, whole)
    assert "2 nodes could not take the changes alone (node04,node06" in err
    for name in cluster.names:
        node = json.loads((tmp_path / "run" / "fanout" / f"node-{name}.json").read_text())
        assert ("delta" in node) == (name not in ("node04", "node06")), node
        assert (
            (cluster.node_tmp(name) / rel / "rb_payload" / "__init__.py").read_text().endswith(line)
        )
        assert (cluster.node_tmp(name) / rel / "rb_blob.bin").stat().st_size == 8 << 20
    # flat clush: the whole bundle to the two nodes that needed it, the changes to all eight
    print(
        f"\nre-run: {took:.1f} s; bundle {whole / 1e6:.1f} MB whole, {delta / 1e3:.1f} kB "
        f"changes only; this machine sent {sent / 1e6:.1f} MB"
    )
    assert sent < 2 * whole + 8 * delta + (2 << 20)
    # --from fan_compare: the whole-bundle round's reports still replace the first round's
    rc, err = finish(start(tmp_path, script, "--from", "fan_compare"))
    assert rc == 0 and "8/8 nodes passed" in err, err[-4000:]
    for name in cluster.names:  # installed: no bundle left in scratch
        assert not list(cluster.node_tmp(name).glob("rbfan-fanre*"))
    # --from fan_copy (fan_preflight runs too: it sets what the rest use): the same changes-only
    # bundle again, and every node, holding that tree now, keeps its install
    rc, err = finish(start(tmp_path, script, "--from", "fan_copy"))
    assert rc == 0 and "could not take" not in err, err[-4000:]
    for name in cluster.names:
        node = json.loads((tmp_path / "run" / "fanout" / f"node-{name}.json").read_text())
        assert node["up_to_date"] == "up to date (quick check)", node


@pytest.mark.e2e
def test_a_node_whose_destination_is_the_source_is_refused_and_the_source_untouched(
    cluster, tmp_path
):
    """Issue 33 (known open): a node that shares the source's file system, where the spec's
    destination is the source under another name. The source lies outside /tmp (the nodes' /tmp
    is their own, the rest of the file system is this machine's), and on node03 the destination's
    parent /tmp/rbdest-fansame is a symlink to the source's parent. node03 must refuse with the
    single-host route's message (its first step, before the lock), the other seven install, the
    run passes (success: 7) and the source is untouched (every entry's inode and bytes, nothing
    beside it). On 24efc9a the node had no such check: it staged beside the source, swapped its
    copy in and (on_existing: replace) removed the original: the source's inode changes, an
    .rb-manifest.jsonl appears in it, and node03 passes."""
    from tests.hostkit.test_fanout_source import state
    from tests.lab.payload import build_payload

    src = build_payload("small", dest=cluster.dir / "srcsame" / "venv").venv
    link = cluster.node_tmp("node03") / "rbdest-fansame"
    link.symlink_to(src.parent)
    before, beside = state(src), sorted(os.listdir(src.parent))
    try:
        script = build(tmp_path, spec(cluster, src, name="fansame", success=7), "fansame")
        rc, err = finish(start(tmp_path, script))
    finally:
        link.unlink()
    assert state(src) == before, "the source changed"
    assert sorted(os.listdir(src.parent)) == beside
    assert rc == 0, err[-6000:]
    fan = json.loads((tmp_path / "run" / "fanout" / "fanout.json").read_text())
    assert fan["failed_nodes"] == ["node03"] and not fan["missing"]
    assert sorted(fan["ok_nodes"]) == [n for n in cluster.names if n != "node03"]
    said = (
        "preflight: fail (others: pass): refusing to install /tmp/rbdest-fansame/venv: source "
        f"and destination are the same directory under two names ({src}, {src}: one device "
        "and inode)"
    )
    assert fan["odd"]["node03"][0] == said, fan["odd"]
    assert said in err and "node03 failed in preflight" in err
    node = json.loads((tmp_path / "run" / "fanout" / "node-node03.json").read_text())
    assert [s["id"] for s in node["steps"]] == ["preflight"]  # no lock, nothing staged
    assert (cluster.node_tmp("node01") / "rbdest-fansame" / "venv" / "pyvenv.cfg").exists()


@pytest.mark.e2e
def test_a_bundle_another_user_left_at_a_scratch_name_is_never_unpacked(
    cluster, payload_small, tmp_path
):
    """Issue 44 R3 (ClusterShell): after a run, nobody writes a tar of its own at every scratch
    name the run showed (`rbfan-NAME-<random>.tar`, in each node's /tmp), its kit's start.py and
    rules leaving a mark as whoever runs them; then `--from fan_install`, which docs/fanout.md
    advises after a node failure. Nothing of nobody's may run, and every node installs from a
    bundle of this run. On 44a2c10 the --from run reused the saved name without a new copy, and
    every node unpacked nobody's tar and ran its start.py as root (the node script tested only
    -f and -L: no owner, no sha256)."""
    script = build(tmp_path, spec(cluster, payload_small.venv, name="fanbundle"), "fanbundle")
    rc, err = finish(start(tmp_path, script))
    assert rc == 0, err[-6000:]
    fanout.assert_planted_bundles_never_run(
        cluster.node_tmp,
        cluster.names,
        "fanbundle",
        tmp_path / "run",
        err,
        lambda: finish(start(tmp_path, script, "--from", "fan_install")),
    )
