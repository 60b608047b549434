"""rbkit.fanplan without a cluster: each node's read-only state as its report (the engine's
output), the nodes grouped by what a run would do there, the unreachable named, and the drift
check of --apply per node."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rbkit import fanout, fanplan, hostfs, manifest, manifestfile
from rbrules.choices import Choices

from tests.hostkit.test_liveplan import tree

CHOICES = '{"schema": 1, "on_existing": "replace"}'


def install(src: Path, dst: Path) -> None:
    """An install of `src` at `dst` as the engine leaves it: the tree with its stats, and the
    install's manifest recording the source."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    m = manifest.build(str(src), algo="sha256", jobs=1)
    manifestfile.save(
        manifest.relocated(m, {}, manifestfile.fingerprint(m)),
        str(dst / ".rb-manifest.jsonl"),
        sync=False,
    )
    st = src.stat()
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def report(tmp_path: Path, node: str, dest: Path, out, monkeypatch) -> None:
    """`rbkit.fanout node --state` on NODE, its report appended to the engine's output."""
    kit = tmp_path / ("kit-" + node)
    kit.mkdir()
    (kit / fanout.BUNDLE).write_bytes(b"")  # where the node script moved the bundle
    monkeypatch.setenv("SLURMD_NODENAME", node)
    a = argparse.Namespace(dir=str(kit), dest=str(dest), choices=Choices.from_json(CHOICES))
    monkeypatch.setattr("sys.stdout", out)
    assert fanplan.node_state(a) == 0
    monkeypatch.undo()
    assert not kit.exists()


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    """Five nodes: n1 without an install, n2 and n4 holding exactly this source's, n3 an older
    one (a file changed there), n5 down (no report). The run dir holds the source's scan."""
    src = tree(
        tmp_path / "src", {"pyvenv.cfg": "home = /usr/bin", "bin/python": "x", "lib/a.py": "a"}
    )
    dests = {n: tmp_path / n / "venv" for n in ("n1", "n2", "n3", "n4", "n5")}
    for n, d in dests.items():
        d.parent.mkdir()
        if n in ("n2", "n3", "n4"):
            install(src, d)
    (dests["n3"] / "lib" / "a.py").write_text("edited on n3")
    run = tmp_path / "run"
    run.mkdir()
    hostfs.scan(str(src), [], str(tmp_path / "names"))
    (run / "source.scan").write_bytes((tmp_path / "names.stat").read_bytes())
    engine_out = tmp_path / "state.out"
    with open(engine_out, "w") as out:
        for n in ("n1", "n2", "n3", "n4"):
            report(tmp_path, n, dests[n], out, monkeypatch)
    (tmp_path / "state.err").write_text("n5: ssh: connect to host n5 port 22: Connection refused\n")
    return {"run": run, "out": engine_out, "err": tmp_path / "state.err", "dests": dests}


def compose(nodes, *extra: str) -> int:
    return fanplan.main(
        [
            "compose",
            "--dir",
            str(nodes["run"]),
            "--nodes",
            "n1,n2,n3,n4,n5",
            "--engine-out",
            str(nodes["out"]),
            "--engine-err",
            str(nodes["err"]),
            "--name",
            "t",
            "--choices",
            CHOICES,
            "--dest",
            "/x/venv",
            "--engine",
            "clush",
            "--source-bytes",
            "20",
            "--need-bytes",
            "8192",
            "--audit-rc",
            "0",
            "--incremental",
            *extra,
        ]
    )


def test_nodes_are_grouped_by_what_a_run_does_there_and_the_unreachable_named(nodes, capsys):
    assert compose(nodes, "--markdown") == 1  # n5 unreachable blocks the run
    out = capsys.readouterr().out
    plan = json.loads((nodes["run"] / "plan.json").read_text())
    kinds = {g["folded"]: g["kind"] for g in plan["groups"]}
    assert kinds == {"n1": fanplan.EVERYTHING, "n[2,4]": fanplan.UP_TO_DATE, "n3": fanplan.OLDER}
    n3 = [g for g in plan["groups"] if g["folded"] == "n3"][0]
    assert Path(n3["listing"]).read_text().splitlines() == [
        ">f????????? lib/a.py (changed at the destination since the install)"
    ]
    # a file changed on a node: the node takes the whole bundle, not the changes alone
    assert n3["send_bytes"] == 20 and not n3["incremental"]
    assert plan["unreachable"] == {"n5": "ssh: connect to host n5 port 22: Connection refused"}
    assert plan["blockers"][0].startswith("unreachable: n5")
    assert sorted(plan["destination"]["nodes"]) == ["n1", "n2", "n3", "n4"]
    assert "group 2:     n[2,4] (2 nodes): holds exactly this source's install" in out
    assert "unreachable: n5: ssh: connect to host n5 port 22" in out
    assert "# group 3: n3" in (nodes["run"] / "plan.md").read_text()
    # each node's state kept beside the plan, for --apply
    assert sorted(p.name for p in (nodes["run"] / "nodes").iterdir() if p.suffix == ".state") == [
        "n1.state",
        "n2.state",
        "n3.state",
        "n4.state",
    ]


def test_drift_names_the_node_that_moved_and_the_one_unreachable_now(
    nodes, tmp_path, capsys, monkeypatch
):
    compose(nodes)
    capsys.readouterr()
    (nodes["dests"]["n2"] / "lib" / "new.py").write_text("new")
    shutil.rmtree(nodes["dests"]["n1"].parent)  # n1's parent gone: still a state
    now = tmp_path / "now.out"
    with open(now, "w") as out:
        for n in ("n1", "n2", "n3"):  # n4 does not answer now
            report(tmp_path, n, nodes["dests"][n], out, monkeypatch)
    drift = [
        "drift",
        "--plan",
        str(nodes["run"] / "plan.json"),
        "--dir",
        str(tmp_path / "apply"),
        "--nodes",
        "n1,n2,n3,n4,n5",
        "--engine-out",
        str(now),
    ]
    rc = fanplan.main(drift + ["--source-now", str(nodes["run"] / "source.scan")])
    said = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert "moved\tnode n2: 1 paths (lib/new.py (new))" in said, said
    assert "moved\tunreachable now: n4, n5" in said
    assert not any("n3" in s or "the source" in s for s in said)
    assert "compression\t" in said
    # the source moved too: named with its paths
    tree(tmp_path / "src", {"lib/later.py": "later"})
    hostfs.scan(str(tmp_path / "src"), [], str(tmp_path / "names-now"))
    assert fanplan.main(drift + ["--source-now", str(tmp_path / "names-now.stat")]) == 1
    said = capsys.readouterr().out.splitlines()
    assert any(s.startswith("moved\tthe source ") and "lib/later.py (new)" in s for s in said), said
