"""The runner's two lanes: serial checks (torch in the probe's process) one after another in the
config's order, parallel ones (files, child processes) overlapping them; each check under its own
deadline; the report in the config's order whatever order the checks finished in.

Timing is asserted through the report's `schedule` (who started before whom ended), never on a
tight wall time: the machine running the tests is busy. The one wall bound is generous.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from probes_helpers import ROOT, run_cli
from rbprobes import checks, run_check, run_config
from rbprobes.result import Context, failed, passed

LOG = []
LOCK = threading.Lock()


def _note(what):
    with LOCK:
        LOG.append(what)


def nap(params, ctx):
    """A test-only check: sleeps params.ms, passes (fails with params.fail)."""
    _note(("start", params["name"]))
    time.sleep(params.get("ms", 0) / 1000.0)
    _note(("end", params["name"]))
    if params.get("fail"):
        return failed("%s failed as told" % params["name"])
    return passed("%s slept %d ms" % (params["name"], params.get("ms", 0)))


@pytest.fixture
def naps(monkeypatch):
    """Two test-only check types, `nap` (parallel) and `serial_nap` (serial)."""
    LOG.clear()
    params = {"name": "str", "ms": "int", "fail": "bool"}
    monkeypatch.setitem(
        checks.CHECKS, "nap", checks.CheckType(nap, "L0", params, 60, checks.PARALLEL)
    )
    monkeypatch.setitem(
        checks.CHECKS, "serial_nap", checks.CheckType(nap, "L1", params, 60, checks.SERIAL)
    )
    return LOG


def check(cid, ctype, ms=0, fail=False, **extra):
    c = {"id": cid, "type": ctype, "params": {"name": cid, "ms": ms}, "allow_skip": False}
    if fail:
        c["params"]["fail"] = True
    c.update(extra)
    return c


def sched(doc):
    return {s["id"]: s for s in doc["schedule"]}


def overlap(a, b):
    return a["start_s"] < b["end_s"] and b["start_s"] < a["end_s"]


def test_the_registry_puts_torch_checks_in_the_probes_process():
    lanes = {t: checks.lane_for(t, {}) for t in checks.CHECKS}
    assert {t for t, lane in lanes.items() if lane == checks.SERIAL} == {
        "libraries",
        "torch",
        "devices",
        "imports",
        "matmul",
    }
    # a libraries check that only reads files shares nothing
    assert checks.lane_for("libraries", {"runtime": False}) == checks.PARALLEL
    assert checks.lane_for("teleport", {}) == checks.PARALLEL


def test_report_in_config_order_whatever_finished_first(naps):
    config = {
        "schema": 1,
        "checks": [
            check("slow", "nap", 600),
            check("s1", "serial_nap", 100),
            check("quick", "nap", 0),
            check("s2", "serial_nap", 0),
        ],
    }
    seen = []
    doc, stopped = run_config(config, on_result=lambda e: seen.append(e["id"]))
    assert not stopped
    assert [c["id"] for c in doc["checks"]] == ["slow", "s1", "quick", "s2"]
    assert [s["id"] for s in doc["schedule"]] == ["slow", "s1", "quick", "s2"]
    assert all(c["status"] == "pass" for c in doc["checks"])
    assert sorted(seen) == sorted(["slow", "s1", "quick", "s2"]) and seen[-1] == "slow"
    s = sched(doc)
    assert s["quick"]["end_s"] <= s["slow"]["end_s"]
    assert {x["lane"] for x in doc["schedule"]} == {"serial", "parallel"}
    assert s["s1"]["lane"] == s["s2"]["lane"] == "serial"
    # serial checks: one after the other, in the config's order
    assert s["s1"]["end_s"] <= s["s2"]["start_s"]
    assert naps.index(("end", "s1")) < naps.index(("start", "s2"))
    # the slow parallel check overlapped the serial ones
    assert overlap(s["slow"], s["s1"])


def test_two_slow_parallel_checks_overlap(naps):
    config = {"schema": 1, "checks": [check("a", "nap", 1000), check("b", "nap", 1000)]}
    start = time.monotonic()
    doc, _ = run_config(config)
    wall = time.monotonic() - start
    s = sched(doc)
    assert overlap(s["a"], s["b"])
    assert naps.index(("start", "b")) < naps.index(("end", "a"))
    assert wall < 30  # generous: the point is the overlap above, not the time


def test_two_sleeping_commands_overlap():
    config = {
        "schema": 1,
        "checks": [
            {"id": "one", "type": "command", "params": {"run": "sleep 1"}},
            {"id": "two", "type": "command", "params": {"run": "sleep 1"}},
        ],
    }
    doc, stopped = run_config(config)
    assert not stopped and [c["status"] for c in doc["checks"]] == ["pass", "pass"]
    s = sched(doc)
    assert s["one"]["lane"] == s["two"]["lane"] == "parallel"
    assert overlap(s["one"], s["two"])


def test_a_failing_child_process_check_does_not_stop_the_others(naps):
    config = {
        "schema": 1,
        "checks": [
            {"id": "broken", "type": "command", "params": {"run": "exit 3"}},
            check("after", "serial_nap", 50),
            {"id": "snippet", "type": "python", "params": {"code": "raise SystemExit(5)"}},
            check("other", "nap", 50),
        ],
    }
    doc, stopped = run_config(config)
    assert not stopped
    status = {c["id"]: c["status"] for c in doc["checks"]}
    assert status == {"broken": "fail", "after": "pass", "snippet": "fail", "other": "pass"}
    assert "exited 3" in doc["checks"][0]["reason"]
    assert doc["summary"] == {"pass": 2, "fail": 2, "skip": 0}


def test_a_hung_parallel_check_fails_by_its_deadline_and_the_others_finish(naps):
    config = {
        "schema": 1,
        "checks": [
            check("hung", "nap", 30000, timeout_s=1),
            check("s1", "serial_nap", 50),
            check("s2", "serial_nap", 50),
            check("quick", "nap", 50),
        ],
    }
    start = time.monotonic()
    doc, stopped = run_config(config)
    assert time.monotonic() - start < 20 and stopped
    hung, s1, s2, quick = doc["checks"]
    assert hung["status"] == "fail" and "timed out" in hung["reason"]
    assert hung["values"]["timed_out"] is True
    # the serial lane is not the hung check's: it runs on
    assert [s1["status"], s2["status"], quick["status"]] == ["pass"] * 3
    s = sched(doc)
    assert s["hung"]["end_s"] - s["hung"]["start_s"] < 15


def test_a_hung_serial_check_stops_the_serial_lane_only(naps):
    config = {
        "schema": 1,
        "checks": [
            check("s1", "serial_nap", 0),
            check("stuck", "serial_nap", 30000, timeout_s=1),
            check("s3", "serial_nap", 0),
            check("late", "nap", 1500),
        ],
    }
    doc, stopped = run_config(config)
    assert stopped
    got = {c["id"]: c for c in doc["checks"]}
    assert got["s1"]["status"] == "pass"
    assert got["stuck"]["status"] == "fail" and "timed out" in got["stuck"]["reason"]
    assert got["s3"]["status"] == "fail" and "not run" in got["s3"]["reason"]
    assert got["s3"]["values"]["not_run"] is True
    # the parallel check outlived the stuck one's deadline and kept its result
    assert got["late"]["status"] == "pass"
    s = sched(doc)
    assert s["s3"]["start_s"] is None and s["late"]["end_s"] is not None
    assert doc["levels_run"] == ["L0", "L1"]


def test_parallel_checks_beyond_the_cap_wait_their_turn(naps, monkeypatch):
    from rbprobes import runner

    monkeypatch.setattr(runner, "PARALLEL_MAX", 2)
    config = {"schema": 1, "checks": [check("p%d" % i, "nap", 300) for i in range(4)]}
    doc, _ = run_config(config)
    assert all(c["status"] == "pass" for c in doc["checks"])
    s = sched(doc)
    # at most two at once: each later one started after one of the first two ended
    for late in ("p2", "p3"):
        assert s[late]["start_s"] >= min(s["p0"]["end_s"], s["p1"]["end_s"]) - 0.001


def test_run_report_has_the_schedule_and_the_exit_status(tmp_path):
    config = {
        "schema": 1,
        "checks": [
            {"id": "fine", "type": "command", "params": {"run": "true"}},
            {"id": "mods", "type": "imports", "params": {"modules": ["json"]}},
            {"id": "bad", "type": "command", "params": {"run": "false"}},
        ],
    }
    path = tmp_path / "r.json"
    done = run_cli("run", "--config-json", json.dumps(config), "--report", str(path))
    assert done.returncode == 1, done.stderr
    doc = json.loads(path.read_text())
    assert [c["id"] for c in doc["checks"]] == ["fine", "mods", "bad"]
    assert [(s["id"], s["lane"]) for s in doc["schedule"]] == [
        ("fine", "parallel"),
        ("mods", "serial"),
        ("bad", "parallel"),
    ]
    assert all(s["end_s"] >= s["start_s"] >= 0 for s in doc["schedule"])
    assert "1 failed" in done.stderr.strip().splitlines()[-1]


def test_nccl_imports_no_torch_in_the_probes_process():
    """nccl overlaps the serial checks, and libraries reads what this process has loaded: the
    nccl check leaves torch to its workers (here there is no GPU: it stops before them)."""
    code = (
        "import sys, json\n"
        "from rbprobes import run_check\n"
        "from rbprobes.result import Context\n"
        "r = run_check({'type': 'nccl', 'params': {}}, Context())\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'status': r['status'],"
        " 'reason': r['reason']}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["torch"] is False and out["status"] == "fail", out
    assert "no CUDA device visible" in out["reason"]


def test_nccl_workers_report_a_missing_precondition(monkeypatch):
    """libcuda says a device is there, torch in the worker says none is (a CPU torch on a GPU
    host, say): the worker's words, fail or skip as the config says."""
    pytest.importorskip("torch")
    from rbprobes import driver

    monkeypatch.setattr(driver, "cuda_device_count", lambda: (1, "test"))
    result = run_check({"type": "nccl", "params": {"timeout_s": 60}}, Context())
    assert result["status"] == "fail", result["reason"]
    assert "no CUDA device visible: torch" in result["reason"]
    assert "allow_skip" in result["reason"]
    (rank,) = result["values"]["ranks"]
    assert rank["rank"] == 0 and rank["unavailable"].startswith("no CUDA device visible")
    skipped = run_check(
        {"type": "nccl", "params": {"timeout_s": 60}, "allow_skip": True}, Context()
    )
    assert skipped["status"] == "skip"


def test_probe_time_script_prints_each_check_and_the_total(tmp_path):
    """benchmarks/probe_time.py (for the GPU host): stdlib only, reads a runbook's config."""
    config = {
        "schema": 1,
        "checks": [
            {"id": "one", "type": "command", "params": {"run": "true"}},
            {"id": "mods", "type": "imports", "params": {"modules": ["json"]}},
        ],
    }
    runbook = tmp_path / "x.sh"
    runbook.write_text("#!/usr/bin/env bash\nreadonly RB_PROBE_CONFIG='%s'\n" % json.dumps(config))
    out = tmp_path / "t.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "probe_time.py"),
            "--python",
            sys.executable,
            "--config",
            str(runbook),
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "probe wall time: median" in done.stdout and "serial lane ends at" in done.stdout
    got = json.loads(out.read_text())
    assert len(got["rounds"]) == 2 and got["checks"] == ["one", "mods"]
    assert [(c["id"], c["lane"], c["status"]) for c in got["rounds"][0]["checks"]] == [
        ("one", "parallel", "pass"),
        ("mods", "serial", "pass"),
    ]
