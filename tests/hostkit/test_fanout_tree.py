"""clush tree mode and per-node rollback, compile side and comparison, without a cluster (the
cluster tests are tests/e2e/test_fanout_tree.py)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from rbkit import fanout as kit_fanout

from compiler import cli
from compiler.fanout import expand

ROOT = Path(__file__).resolve().parents[2]


def compile_(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, err.getvalue()


def write_spec(tmp_path: Path, nodes: str, fanout_extra: str = "") -> Path:
    p = tmp_path / "fan.yaml"
    p.write_text(f"""name: fan
hosts:
  here: {{local: true}}
transfer:
  from: here:/opt/src
  to: here:/opt/venv
fanout:
  engine: clush
  nodes: {nodes}
{fanout_extra}""")
    return p


@pytest.mark.parametrize(
    "nodes, warned", [("node[01-08]", False), ("node[01-09]", True), ("gpu[001-128]", True)]
)
def test_a_flat_clush_copy_to_more_than_8_nodes_is_a_warning(tmp_path, nodes, warned):
    code, err = compile_(str(write_spec(tmp_path, nodes)), "-o", str(tmp_path))
    assert code == 0 and (tmp_path / "fan.sh").exists()
    if warned:
        assert (
            f"fan.yaml:9:10: warning: fanout.nodes: clush without a topology copies the bundle "
            f"from this machine once per node ({len(expand(nodes))} copies); set "
            f"fanout.topology" in err
        )
    else:
        assert "warning" not in err


def test_no_warning_with_a_topology_and_clush_runs_with_the_gateways_python(tmp_path):
    code, err = compile_(
        str(write_spec(tmp_path, "gpu[001-128]", "  topology: /etc/clustershell/topology.conf\n")),
        "-o",
        str(tmp_path),
    )
    assert code == 0 and "warning" not in err
    text = (tmp_path / "fan.sh").read_text()
    assert (
        "readonly -a RB_FAN_CLUSH=(env CLUSTERSHELL_GW_PYTHON_EXECUTABLE=/usr/bin/python3 "
        "clush)" in text
    )
    assert "readonly RB_FAN_TOPOLOGY=/etc/clustershell/topology.conf" in text


def test_flat_clush_runs_plain_clush(tmp_path):
    code, _err = compile_(str(write_spec(tmp_path, "node[01-02]")), "-o", str(tmp_path))
    assert code == 0
    text = (tmp_path / "fan.sh").read_text()
    assert "readonly -a RB_FAN_CLUSH=(clush)" in text
    assert "readonly RB_FAN_TOPOLOGY=''" in text


def report(node: str, *, failed: bool = False, rolled_back: bool = False) -> dict:
    steps = [
        {"id": s, "ok": True, "rc": 0} for s in ("extract", "verify", "relocate", "swap", "exports")
    ]
    steps.append({"id": "probe", "ok": not failed, "rc": int(failed)})
    doc = {
        "node": node,
        "ok": not failed,
        "steps": steps,
        "previous": "/v.rb-backup.3",
        "probe": {
            "checks": [{"id": "imports", "status": "fail" if failed else "pass", "values": {}}]
        },
    }
    if rolled_back:
        steps.append({"id": "rollback", "ok": True, "rc": 0})
        doc["rolled_back"] = {"restored": "/v.rb-backup.3", "kept_current_as": "/v.rb-backup.3"}
    return doc


def test_a_rolled_back_node_has_its_column_and_line_in_the_comparison():
    reports = {
        "n1": report("n1"),
        "n2": report("n2", failed=True, rolled_back=True),
        "n3": report("n3", failed=True),
    }
    result = kit_fanout.compare(["n1", "n2", "n3"], reports, [], "1")
    assert result["columns"][-1] == "rollback"
    assert result["rows"]["n2"]["rollback"] == "pass" and result["rows"]["n3"]["rollback"] == "-"
    assert set(result["rolled_back"]) == {"n2"}
    text = kit_fanout.table(result)
    assert (
        "rolled back n2: its checks failed, the previous install is in place again; the one "
        "that failed is kept at /v.rb-backup.3" in text
    )
    assert "rolled back n3" not in text


def test_no_rollback_column_when_no_node_rolled_back():
    result = kit_fanout.compare(["n1"], {"n1": report("n1")}, [], "all")
    assert "rollback" not in result["columns"] and result["rolled_back"] == {}
