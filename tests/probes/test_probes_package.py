"""The package as shipped: Python 3.9 grammar and runtime, the name `rbprobes`, no torch at import,
relative imports only."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys

import pytest
from probes_helpers import PACKAGE_DIR, fatbin_container, fatbin_entry, need

FILES = sorted(PACKAGE_DIR.glob("*.py"))
RULES = sorted((PACKAGE_DIR.parent / "rbrules").glob("*.py"))
# rbrules: the shared rules at the bottom of the kit (how a child Python is started, when a link
# leaves the venv), which
# imports nothing outside itself
ALLOWED_ABSOLUTE = {"torch", "zstandard", "compression", "rbrules"}


def test_there_are_files():
    assert {"__init__.py", "__main__.py", "fatbin.py", "decompress.py", "elf.py", "arch.py"} <= {
        f.name for f in FILES
    }


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_are_relative_or_stdlib(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            top = node.module.split(".")[0]
        elif isinstance(node, ast.Import):
            top = node.names[0].name.split(".")[0]
        else:
            continue
        assert top != "compiler", "%s:%d imports compiler.*" % (path.name, node.lineno)
        stdlib = top in getattr(sys, "stdlib_module_names", {top}) or top == "__future__"
        assert stdlib or top in ALLOWED_ABSOLUTE, "%s:%d imports %s" % (path.name, node.lineno, top)


@pytest.fixture(scope="module")
def py39():
    return need("python3.9", "the package must compile and run on Python 3.9 hosts")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The package copied as a host gets it: $KIT/rbprobes/*.py, beside $KIT/rbrules/*.py."""
    kit = tmp_path_factory.mktemp("kit")
    for package, files in (("rbprobes", FILES), ("rbrules", RULES)):
        (kit / package).mkdir()
        for f in files:
            shutil.copy(f, kit / package / f.name)
    return kit


def test_every_file_compiles_under_python39(py39):
    done = subprocess.run(
        [py39, "-m", "py_compile"] + [str(f) for f in FILES],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def run39(py39, kit, *args, stdin=None):
    return subprocess.run(
        [py39, "-m", "rbprobes"] + list(args),
        cwd=str(kit),
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(kit)},
    )


def test_rbprobes_runs_on_python39_without_torch(py39, shipped, tmp_path):
    """L0 and the command line work on a host with Python 3.9 and no torch; torch-needing
    checks fail with a clear reason."""
    blob = tmp_path / "kernels.fatbin"
    blob.write_bytes(fatbin_container(fatbin_entry(2, 90), fatbin_entry(1, 90, version=(8, 0))))
    done = run39(py39, shipped, "kernel_audit", str(blob), "--arch", "sm_103")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["values"]["ptx_only"] == ["kernels.fatbin"]
    done = run39(py39, shipped, "kernel_audit", str(blob), "--arch", "sm_80")
    assert done.returncode == 1
    report = tmp_path / "report.json"
    config = {
        "schema": 1,
        "host": "old",
        "venv": str(tmp_path),
        "gpu": {"arch": "sm_90"},
        "cuda": None,
        "checks": [
            {"id": "k", "type": "kernel_audit", "params": {}},
            {"id": "t", "type": "torch", "params": {}},
            {"id": "lib", "type": "libraries", "params": {"runtime": False}},
        ],
    }
    done = run39(py39, shipped, "run", "--config-json", json.dumps(config), "--report", str(report))
    doc = json.loads(report.read_text())
    assert done.returncode == 1 and doc["python"].startswith("3.9.")
    assert [c["status"] for c in doc["checks"]] == ["pass", "fail", "pass"]
    assert "torch is not installed" in doc["checks"][1]["reason"]
    assert doc["levels_run"] == ["L0", "L1"]


def test_import_does_not_import_torch(shipped):
    code = "import sys, rbprobes, rbprobes.cli, rbprobes.checks;print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(shipped),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(shipped)},
    )
    assert done.stdout.strip() == "False", done.stderr


def test_a_check_imports_its_own_module_only(shipped, tmp_path):
    """`python -m rbprobes outside` (the source's audit on every run) imports no GPU code's
    modules: a check's module is imported when that check runs; the package's names still work."""
    code = (
        "import sys, rbprobes.cli; rc = rbprobes.cli.main(['outside', sys.argv[1]]);"
        "print(sorted(m for m in sys.modules if m.startswith('rbprobes.'))); print(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(tmp_path)],
        cwd=str(shipped),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(shipped)},
    )
    loaded = ast.literal_eval(done.stdout.splitlines()[-2])
    assert "rbprobes.checks_venv" in loaded, done.stderr
    assert not {
        "rbprobes.checks_static",
        "rbprobes.fatbin",
        "rbprobes.elf",
        "rbprobes.checks_runtime",
        "rbprobes.checks_numeric",
    } & set(loaded), loaded
    names = (
        "import rbprobes; print(sorted(n for n in rbprobes.__all__ if callable(getattr("
        "rbprobes, n))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", names],
        cwd=str(shipped),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(shipped)},
    )
    assert done.stdout.split("\n")[0] == str(
        sorted(["Context", "audit", "run_check", "run_config", "scan_file"])
    ), done.stderr
