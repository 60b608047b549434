"""The live plan of a fan-out runbook (issue 36) on the lab's ClusterShell mini-cluster: `--plan`
asks every node through clush, read-only, and groups them; `--apply PLAN` runs it, and refuses
when a node moved since the plan."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_liveplan import plan_dir
from tests.lab import fanout, subnets
from tests.lab.cluster import Cluster, cluster_unavailable_reason
from tests.lab.slurm import SlurmCluster, slurm_unavailable_reason

DEST = "/tmp/rbdest-fanplan/venv"


@pytest.fixture(scope="module")
def cluster():
    fanout.require(cluster_unavailable_reason(), "fan-out cluster")
    with Cluster(4, subnet=subnets.subnet("fanplan")) as c:
        yield c


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    """A run in a directory of its own (runs/NAME/<UTC>-<pid>, as a user's)."""
    return subprocess.run(
        ["bash", str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )


def leftovers(c: Cluster) -> list[str]:
    """What a plan may not leave on a node: its kit (the scratch), or anything beside DEST
    but what a run leaves there (its exports file)."""
    out = []
    for name in c.names:
        out += [str(p) for p in c.node_tmp(name).glob("rbfan-*")]
        parent = c.node_tmp(name) / "rbdest-fanplan"
        if parent.exists():
            out += [str(p) for p in parent.iterdir() if p.name not in ("venv", "venv.env.sh")]
    return out


@pytest.mark.e2e
def test_fanout_plan_groups_the_nodes_and_apply_refuses_a_node_that_moved(
    cluster, payload_small, tmp_path
):
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    script = fanout.build(
        tmp_path,
        fanout.spec(
            "fanplan",
            src,
            DEST,
            engine="clush",
            nodes=cluster.nodeset,
            extra=f"  ssh_config: {cluster.ssh_config}\n",
        ),
        "fanplan",
    )
    rel = next(Path(p).relative_to(src) for p in src.glob("lib/python3*/site-packages"))

    # a first plan: every node needs everything, one group; nothing left on a node
    t0 = time.monotonic()
    r = run(tmp_path, script, "--plan", "--markdown")
    took = {"first plan": time.monotonic() - t0}
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "group 1:     node[01-04] (4 nodes): needs everything" in r.stdout, r.stdout
    assert "nodes:       4 answered, 0 unreachable" in r.stdout
    assert "static:      passed" in r.stdout and "enough room" in r.stdout
    assert leftovers(cluster) == [] and not any(
        (cluster.node_tmp(n) / "rbdest-fanplan").exists() for n in cluster.names
    )
    d = plan_dir(r)
    plan = json.loads((d / "plan.json").read_text())
    assert [g["folded"] for g in plan["groups"]] == ["node[01-04]"]
    assert sorted(plan["destination"]["nodes"]) == cluster.names
    assert (d / "plan.md").read_text().startswith("# Live plan: fanplan")

    # applied as planned: every node installs
    t0 = time.monotonic()
    r = run(tmp_path, script, "--apply", str(d / "plan.json"))
    took["apply"] = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-4000:]
    assert "the plan holds" in r.stderr

    # after the run, node02's copy of one file changed: node02 is a group of its own, the file
    # in its itemized list; the others hold exactly this install
    changed = (
        cluster.node_tmp("node02") / "rbdest-fanplan" / "venv" / rel / "rb_payload" / "__init__.py"
    )
    changed.write_text(changed.read_text() + "# edited on node02\n")
    t0 = time.monotonic()
    r = run(tmp_path, script, "--plan")
    took["re-plan"] = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert (
        "node[01,03-04] (3 nodes): holds exactly this source's install: nothing to send" in r.stdout
    ), r.stdout
    assert "node02 (1 node): holds an older install" in r.stdout, r.stdout
    d = plan_dir(r)
    plan = json.loads((d / "plan.json").read_text())
    older = [g for g in plan["groups"] if g["nodes"] == ["node02"]][0]
    listing = Path(older["listing"]).read_text()
    assert f"{rel}/rb_payload/__init__.py" in listing, listing
    assert older["changes"]["changed"] == 1 and older["changes"]["added"] == 0
    # a node with a file changed there takes the whole bundle in a re-run: the whole tree
    assert "1 changed there since the install: these nodes take the whole tree" in r.stdout
    assert older["send_bytes"] == plan["source"]["bytes"]
    assert leftovers(cluster) == []

    # node03 moved after that plan: --apply refuses, names it and the path, sends nothing
    moved = cluster.node_tmp("node03") / "rbdest-fanplan" / "venv" / "added-after-the-plan.txt"
    moved.write_text("x")
    r = run(tmp_path, script, "--apply", str(d / "plan.json"))
    assert r.returncode == 1, r.stderr[-4000:]
    assert "refusing to apply" in r.stderr and "node node03: 1 paths" in r.stderr, r.stderr[-3000:]
    assert "added-after-the-plan.txt (new)" in r.stderr
    assert "node node02" not in r.stderr
    assert changed.read_text().endswith("# edited on node02\n")  # nothing was sent
    moved.unlink()

    # one node down: named, exit 1, the others still planned
    cluster.kill_node("node04")
    try:
        r = run(tmp_path, script, "--plan")
    finally:
        cluster.restart_node("node04")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "nodes:       3 answered, 1 unreachable" in r.stdout, r.stdout
    assert "unreachable: node04: " in r.stdout and "BLOCKED:     unreachable: node04" in r.stdout
    print("\nclush fan-out plan, 4 nodes: " + ", ".join("%s %.1f s" % kv for kv in took.items()))


@pytest.mark.e2e
def test_slurm_fanout_plan_asks_the_nodes_through_srun(payload_small, tmp_path):
    fanout.require(slurm_unavailable_reason(), "slurm mini-cluster")
    with SlurmCluster(2, subnet=subnets.subnet("fanplan_slurm")) as c:
        script = fanout.build(
            tmp_path,
            fanout.spec(
                "fanplansl",
                payload_small.venv,
                DEST,
                engine="slurm",
                nodes=c.nodeset,
                connect_timeout=10,
            ),
            "fanplansl",
        )

        def plan() -> subprocess.CompletedProcess:
            return subprocess.run(
                c.salloc(["bash", str(script), "--plan"]),
                cwd=tmp_path,
                env=c.env,
                capture_output=True,
                text=True,
                timeout=300,
            )

        r = plan()
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        assert "group 1:     node[01-02] (2 nodes): needs everything" in r.stdout, r.stdout
        assert "srun -N 2 -n 2" in r.stderr
        assert not [p for n in c.names for p in c.node_tmp(n).glob("rbfan-*")]
        d = plan_dir(r)
        r = subprocess.run(
            c.salloc(["bash", str(script), "--apply", str(d / "plan.json")]),
            cwd=tmp_path,
            env=c.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        r = plan()
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        assert (
            "node[01-02] (2 nodes): holds exactly this source's install: nothing to send"
            in r.stdout
        ), r.stdout
