"""The command line and the runner: exit codes, the report, the table, deadlines, escape hatches."""

from __future__ import annotations

import json
import time

import pytest
from probes_helpers import cli_json, run_cli
from rbprobes import checks, run_check, run_config
from rbprobes.result import Context

CONFIG = {
    "schema": 1,
    "host": "b300",
    "venv": None,
    "gpu": {"model": "B300", "count": 8, "capability": "10.3", "arch": "sm_103"},
    "cuda": {"version": "13.0", "home": "/usr/local/cuda-13.0", "library_dirs": []},
    "checks": [
        {"id": "shell", "type": "command", "params": {"run": "echo fine"}, "allow_skip": False},
        {
            "id": "snippet",
            "type": "python",
            "params": {"code": "import sys; sys.exit(3)", "name": "exits 3"},
            "allow_skip": False,
        },
        {"id": "mods", "type": "imports", "params": {"modules": ["json"]}, "allow_skip": False},
        {"id": "mystery", "type": "teleport", "params": {}, "allow_skip": False},
    ],
}


@pytest.mark.parametrize(
    "args, code",
    [
        (["imports", "json"], 0),
        (["imports", "json", "not_a_module_qq"], 1),
        (["command", "exit 4", "--expect-exit", "4"], 0),
        (["command", "exit 4"], 1),
        (["python", "print('hello')"], 0),
        (["teleport"], 2),
        (["imports"], 2),
        (["matmul", "--dtype", "int8"], 2),
        ([], 2),
    ],
)
def test_exit_codes(args, code):
    done = run_cli(*args)
    assert done.returncode == code, done.stdout + done.stderr
    if code != 2:
        result = cli_json(done)
        assert set(result) == {"id", "type", "level", "status", "reason", "values", "duration_s"}


def test_a_checked_packages_warning_goes_to_the_report_not_the_table(tmp_path):
    """torch's `UserWarning: Failed to initialize NumPy` on import: the package's word, kept in
    the report (the runbook logs it to run.log only), never among the checks' lines."""
    (tmp_path / "warns_on_import_qq.py").write_text(
        "import warnings\nwarnings.warn('Failed to initialize NumPy (planted)', UserWarning)\n"
    )
    config = dict(
        CONFIG,
        checks=[
            {
                "id": "mods",
                "type": "imports",
                "params": {"modules": ["warns_on_import_qq"]},
                "allow_skip": False,
            }
        ],
    )
    report = tmp_path / "r.json"
    done = run_cli(
        "run",
        "--config-json",
        json.dumps(config),
        "--report",
        str(report),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to initialize NumPy" not in done.stderr + done.stdout
    (warned,) = json.loads(report.read_text())["warnings"]
    assert "UserWarning: Failed to initialize NumPy (planted)" in warned


def test_run_writes_the_report_and_the_table(tmp_path):
    path = tmp_path / "out" / "report.json"
    done = run_cli("run", "--config-json", json.dumps(CONFIG), "--report", str(path))
    assert done.returncode == 1  # the snippet and the unknown type fail
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["host"] == "b300" and doc["python"].count(".") == 2
    assert isinstance(doc["started"], float) and doc["duration_s"] >= 0
    assert doc["levels_run"] == ["L1"]
    assert [c["id"] for c in doc["checks"]] == ["shell", "snippet", "mods", "mystery"]
    assert [c["status"] for c in doc["checks"]] == ["pass", "fail", "pass", "fail"]
    assert doc["summary"] == {"pass": 2, "fail": 2, "skip": 0}
    for c in doc["checks"]:
        assert set(c) == {"id", "type", "level", "status", "reason", "values", "duration_s"}
    snippet = doc["checks"][1]
    assert "exited 3" in snippet["reason"] and snippet["values"]["exit"] == 3
    assert "unknown check type 'teleport'" in doc["checks"][3]["reason"]
    lines = done.stderr.strip().splitlines()
    ids = ("check", "shell", "snippet", "mods", "mystery")
    table = [row for row in lines if row.split()[0] in ids]
    assert len(table) == 5
    status_col = {row.index(row.split()[2]) for row in table}
    assert len(status_col) == 1  # aligned
    assert "2 passed, 2 failed, 0 skipped" in lines[-1]


def test_run_exits_0_when_nothing_failed(tmp_path):
    config = dict(CONFIG, checks=CONFIG["checks"][:1] + CONFIG["checks"][2:3])
    done = run_cli(
        "run", "--config-json", "-", "--report", str(tmp_path / "r.json"), stdin=json.dumps(config)
    )
    assert done.returncode == 0, done.stderr


def test_skip_is_not_a_pass(tmp_path):
    config = dict(CONFIG, checks=[{"id": "x", "type": "python", "params": {"code": "pass"}}])
    doc, _ = run_config(config)
    assert doc["summary"] == {"pass": 1, "fail": 0, "skip": 0}


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"schema": 2, "checks": []}), "unsupported config schema 2"),
        (json.dumps({"schema": 1}), "'checks' must be a list"),
        (json.dumps({"schema": 1, "checks": [{"params": {}}]}), "must be an object with a 'type'"),
        (
            json.dumps(
                {
                    "schema": 1,
                    "checks": [{"id": "a", "type": "torch"}, {"id": "a", "type": "torch"}],
                }
            ),
            "duplicate id",
        ),
    ],
)
def test_bad_config_is_a_usage_error(tmp_path, text, message):
    done = run_cli("run", "--config-json", text, "--report", str(tmp_path / "r.json"))
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_an_exception_in_a_check_is_a_failure(monkeypatch):
    def explode(params, ctx):
        raise RuntimeError("kaboom")

    monkeypatch.setitem(checks.CHECKS, "torch", checks.CHECKS["torch"]._replace(run=explode))
    result = run_check({"type": "torch", "params": {}}, Context())
    assert result["status"] == "fail" and "RuntimeError: kaboom" in result["reason"]
    assert "kaboom" in result["values"]["traceback"]


def test_a_hung_check_times_out_and_stops_the_run(monkeypatch):
    def hang(params, ctx):
        time.sleep(30)

    monkeypatch.setitem(checks.CHECKS, "devices", checks.CHECKS["devices"]._replace(run=hang))
    config = {
        "schema": 1,
        "checks": [
            {"id": "stuck", "type": "devices", "timeout_s": 0.5},
            {"id": "later", "type": "imports", "params": {"modules": ["json"]}},
        ],
    }
    start = time.monotonic()
    doc, stopped = run_config(config)
    assert time.monotonic() - start < 10 and stopped
    stuck, later = doc["checks"]
    assert stuck["status"] == "fail" and "timed out" in stuck["reason"]
    assert later["status"] == "fail" and "not run" in later["reason"]
    assert doc["levels_run"] == ["L1"]


def test_command_timeout_kills_it():
    start = time.monotonic()
    result = run_check(
        {"type": "command", "params": {"run": "sleep 30", "timeout_s": 1}}, Context()
    )
    assert time.monotonic() - start < 10
    assert result["status"] == "fail" and "timed out after 1s" in result["reason"]


def test_python_snippet_output_tail_and_safe_env():
    code = (
        "import os\n"
        "print('x' * 10000)\n"
        "for k in ('NCCL_NVLS_ENABLE', 'TORCH_SYMM_MEM_DISABLE_MULTICAST',"
        " 'NVSHMEM_DISABLE_NVLS'):\n"
        "    print(k, os.environ[k])\n"
    )
    result = run_check({"type": "python", "params": {"code": code}}, Context())
    assert result["status"] == "pass", result["reason"]
    tail = result["values"]["output_tail"]
    assert len(tail) < 5000 and "NCCL_NVLS_ENABLE 0" in tail and "NVSHMEM_DISABLE_NVLS 1" in tail


def test_safe_env_does_not_override_what_is_set():
    done = run_cli(
        "python", "import os; print(os.environ['NCCL_NVLS_ENABLE'])", env={"NCCL_NVLS_ENABLE": "1"}
    )
    assert "NCCL_NVLS_ENABLE" not in done.stderr
    assert cli_json(done)["values"]["output_tail"].strip() == "1"


def test_allow_skip_flag(tmp_path):
    # a python check cannot skip; a devices check without a GPU can
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert run_cli("devices").returncode == 1
    done = run_cli("devices", "--allow-skip")
    assert done.returncode == 0 and cli_json(done)["status"] == "skip"
