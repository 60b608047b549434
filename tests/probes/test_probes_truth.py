"""The audit against the ground truth of truth_fixtures.py: what each kernel did on the H200
(sm_90, driver 580: PTX ISA <= 9.0) is EXPECTED there; the audit, without a GPU, must say the
same for every kernel. Built with nvcc at test time; skipped where there is none (CI: the
hand-made images of test_probes_audit.py cover the audit there)."""

from __future__ import annotations

import pytest
import truth_fixtures
from rbprobes import run_check
from rbprobes.checks_static import audit
from rbprobes.result import Context


@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    nvcc = truth_fixtures.find_nvcc()
    if not nvcc:
        pytest.skip("nvcc not found: the truth fixtures are built at test time")
    out = tmp_path_factory.mktemp("truth")
    doc = truth_fixtures.build_all(str(out), nvcc, jobs=2)
    return out, doc


def test_audit_agrees_with_what_launched_on_the_h200(truth):
    out, doc = truth
    values = audit(str(out), (9, 0), driver_ptx_max=(9, 0))
    says = truth_fixtures.audit_verdicts(values, doc)
    wrong = {
        k: (says.get(k), want) for k, want in truth_fixtures.EXPECTED.items() if says.get(k) != want
    }
    assert not wrong, wrong
    assert len(truth_fixtures.EXPECTED) == sum(len(e["kernels"]) for e in doc.values())


def test_the_check_names_every_failing_file(truth):
    out, doc = truth
    result = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_90", "driver_ptx_max": "9.0"}},
        Context(venv=str(out)),
    )
    assert result["status"] == "fail"
    failing = {name for name, e in doc.items() if not all(k["expect"] for k in e["kernels"])}
    failing.discard("libmulti_a.so")  # its sm_100a unit is arch-specific: listed, not failed
    assert set(result["values"]["failing"]) == failing
    by_file = {f["path"]: f for f in result["values"]["files"]}
    assert by_file["libmulti.so"]["verdict"] == "partial"
    assert by_file["libmulti.so"]["missing"][0]["kernels"] == ["k_multi_bad"]
    assert by_file["libsass80.so"]["missing"][0]["kernels"] == ["_ZN2rb8k_sass80EPi"]
    assert "9.1" in by_file["ptx91.fatbin"]["missing"][0]["why"]
    assert by_file["libmulti_a.so"]["arch_specific"][0]["kernels"] == ["k_multia_100a"]
    assert by_file["libmulti_a.so"]["fails"] is False


def test_expected_is_what_the_h200_did():
    """EXPECTED is the launches recorded on the H200 (h200_truth.json), kernel for kernel;
    the matmul calibration there passed every correct product and failed every fault."""
    import json
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "h200_truth.json")) as fh:
        measured = json.load(fh)["launches"]
    assert {k: v["ran"] for k, v in measured.items()} == truth_fixtures.EXPECTED
    with open(os.path.join(here, "h200_matmul.json")) as fh:
        matmul = json.load(fh)
    assert all(r["status"] == "pass" and r["max_ratio"] < 0.5 for r in matmul["correct"])
    assert all(r["status"] == "fail" for r in matmul["faults"]) and len(matmul["faults"]) == 9
