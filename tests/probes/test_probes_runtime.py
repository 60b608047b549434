"""L1/L2 checks on this machine: CPU torch, no GPU. The numerics run on the CPU through the
matmul check's internal device option."""

from __future__ import annotations

import pytest
from numeric_faults import FAULTS, flip_one_sign
from rbprobes import run_check
from rbprobes.checks_numeric import EPS, matmul_check, tolerance
from rbprobes.checks_runtime import version_matches
from rbprobes.result import Context

torch = pytest.importorskip("torch")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def check(check_type, params=None, allow_skip=False, ctx=None):
    return run_check(
        {"type": check_type, "params": params or {}, "allow_skip": allow_skip}, ctx or Context()
    )


def test_missing_module_fails_naming_it():
    result = check("imports", {"modules": ["json", "no_such_module_xyz", "also_missing"]})
    assert result["status"] == "fail"
    assert "no_such_module_xyz" in result["reason"] and "also_missing" in result["reason"]
    ok = [m for m in result["values"]["modules"] if m["ok"]]
    assert [m["module"] for m in ok] == ["json"] and ok[0]["file"].endswith("json/__init__.py")


def test_imports_report_version_and_file():
    result = check("imports", {"modules": ["pytest", "torch"]})
    assert result["status"] == "pass", result["reason"]
    versions = {m["module"]: m["version"] for m in result["values"]["modules"]}
    assert versions["torch"] == torch.__version__ and versions["pytest"]


def test_a_module_without_a_version_is_said_so_not_a_question_mark(tmp_path, monkeypatch):
    (tmp_path / "rb_no_version_xyz.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = check("imports", {"modules": ["json", "rb_no_version_xyz"]})
    assert result["status"] == "pass", result["reason"]
    assert result["reason"].endswith(
        "rb_no_version_xyz (no version: neither __version__ nor package metadata)"
    ), result["reason"]
    assert "?" not in result["reason"]


def test_module_raising_anything_is_a_failure_not_a_crash(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = check("imports", {"modules": ["exits_on_import"]})
    assert result["status"] == "fail" and "SystemExit" in result["reason"]


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("2.11", "2.11.0+cu130", True),
        ("2.11.0", "2.11.0+cu130", True),
        ("2.11.0+cu130", "2.11.0+cu130", True),
        ("2.11.0+cu130", "2.11.0+cu128", False),
        ("2.1", "2.11.0", False),
        ("13.0", "13.0", True),
        ("13", "13.0", True),
        ("12.8", "13.0", False),
        ("13.0", None, False),
    ],
)
def test_version_prefix_match(expected, actual, ok):
    assert version_matches(expected, actual) is ok


def test_torch_check():
    good = check("torch", {"version": torch.__version__.split("+")[0]})
    assert good["status"] == "pass" and good["values"]["version"] == torch.__version__
    bad = check("torch", {"version": "1.0"})
    assert bad["status"] == "fail" and "expected 1.0" in bad["reason"]


@pytest.mark.parametrize(
    "wheel, drv, cuda, status, words",
    [
        ("13.0", "575.57.08", "12.9", "fail", ["13.0", "575.57.08", "12.9", ">= 580.65.06"]),
        ("12.8", "535.104.05", "12.2", "pass", ["minor-version compatibility"]),
        ("13.0", "580.159.04", "13.0", "pass", ["driver 580.159.04 (CUDA 13.0)"]),
        ("13.0", None, None, "pass", ["no NVIDIA driver found"]),
    ],
)
def test_torch_check_fails_on_a_driver_older_than_the_wheel(
    monkeypatch, wheel, drv, cuda, status, words
):
    """A cu130 wheel on a 575 driver (CUDA 12.9) cannot run at all; it used to pass here."""
    from rbprobes import driver

    monkeypatch.setattr(torch.version, "cuda", wheel)
    monkeypatch.setattr(
        driver,
        "host_driver",
        lambda: driver.HostDriver(drv, cuda, "libcuda" if cuda else None, None),
    )
    result = check("torch")
    assert result["status"] == status, result["reason"]
    for w in words:
        assert w in result["reason"]
    assert result["values"]["driver_cuda"] == cuda


@no_gpu
def test_cpu_torch_with_a_cuda_expectation_fails():
    result = check("torch", {"cuda": "13.0"})
    assert result["status"] == "fail" and "CPU-only" in result["reason"]


@no_gpu
def test_torch_without_a_cuda_of_its_own_is_held_to_the_specs_cuda():
    """Issue 45: `torch: {}` on a spec that declares `cuda:` passed a CPU build (`CUDA none`);
    the spec's cuda.version (the probe config's `cuda`) is what it is held to."""
    result = check("torch", ctx=Context(cuda={"version": "13.0"}))
    assert result["status"] == "fail", result["reason"]
    assert "CPU-only" in result["reason"] and "cuda: 13.0" in result["reason"], result["reason"]
    # no cuda: declared: a CPU build is what it is, and passes
    assert check("torch")["status"] == "pass"


@pytest.mark.parametrize(
    "wheel, spec_cuda, status",
    [
        ("13.0", "13.0", "pass"),
        ("13.0", "13", "pass"),
        ("12.8", "12.9", "pass"),
        ("12.8", "13.0", "fail"),
    ],
)
def test_torch_cuda_major_is_held_to_the_specs_cuda(monkeypatch, wheel, spec_cuda, status):
    from rbprobes import driver

    monkeypatch.setattr(torch.version, "cuda", wheel)
    monkeypatch.setattr(driver, "host_driver", lambda: driver.HostDriver(None, None, None, None))
    result = check("torch", ctx=Context(cuda={"version": spec_cuda}))
    assert result["status"] == status, result["reason"]


@no_gpu
@pytest.mark.parametrize("check_type", ["devices", "matmul", "nccl"])
def test_gpu_checks_without_a_gpu_fail_or_skip(check_type):
    failed = check(check_type)
    assert failed["status"] == "fail"
    assert "no CUDA device visible" in failed["reason"] and "allow_skip" in failed["reason"]
    skipped = check(check_type, allow_skip=True)
    assert skipped["status"] == "skip" and "no CUDA device visible" in skipped["reason"]
    assert skipped["values"]["precondition"].startswith("no CUDA device")


@pytest.mark.parametrize("dtype, size", [("bfloat16", 96), ("float16", 128), ("float32", 200)])
def test_matmul_numerics_on_cpu(dtype, size):
    outcome = matmul_check({"dtype": dtype, "size": size}, Context(), device="cpu")
    assert outcome.status == "pass", outcome.reason
    (dev,) = outcome.values["devices"]
    # a correct product meets the per-element rule with margin (worst element well inside)
    assert dev["bad"] == 0 and 0 < dev["max_ratio"] < 0.5 and dev["tflops"] > 0
    assert dev["rtol"] == EPS[dtype] and dev["atol"] > 0
    assert dev["checked"] == "every element of %dx%d" % (size, size)
    assert dev["elements"] == size * size and len(dev["worst"]) == 5


def test_tolerance_scales_with_k_and_the_term_size():
    t1 = tolerance("bfloat16", 1024, 1 / 3)
    t4 = tolerance("bfloat16", 4096, 1 / 3)
    assert t1["rtol"] == 2.0**-7 and t4["atol"] > t1["atol"]
    assert tolerance("bfloat16", 1024, 2 / 3)["atol"] == pytest.approx(2 * t1["atol"])
    # float32: the accumulation term (K * 2^-23) dominates, so 4x K is ~4x atol
    f1, f4 = tolerance("float32", 1024, 1.0), tolerance("float32", 4096, 1.0)
    assert 3.5 < f4["atol"] / f1["atol"] <= 4.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_planted_faults_fail(dtype, fault):
    """0.1% of outputs zeroed, one sign flipped, one K-block dropped: each fails, with the
    count of bad elements and the worst ones (index, got, want)."""
    outcome = matmul_check(
        {"dtype": dtype, "size": 256}, Context(), device="cpu", op=FAULTS[fault](torch)
    )
    assert outcome.status == "fail", (fault, outcome.reason)
    (dev,) = outcome.values["devices"]
    assert dev["bad"] >= 1 and dev["max_ratio"] > 1
    assert "elements off" in outcome.reason and "want" in outcome.reason
    if fault == "one_sign_flipped":
        assert dev["bad"] == 1 and (dev["worst"][0]["row"], dev["worst"][0]["col"]) == (85, 51)
        assert dev["worst"][0]["got"] == pytest.approx(-dev["worst"][0]["want"], rel=1e-2)


def test_small_errors_the_old_rule_missed():
    """One float32 element with a small value, its sign flipped: off by 2|c|, far below the
    old max|C - ref| / max|ref| <= 1e-3, far above float32's own error."""
    size = 200
    a = torch.Generator().manual_seed(0)
    probe = (torch.rand((size, size), generator=a) * 2 - 1) @ (
        torch.rand((size, size), generator=a) * 2 - 1
    )
    small = int((probe.abs() - 1e-3).abs().flatten().argmin())  # |c| close to 1e-3
    row, col = divmod(small, size)
    outcome = matmul_check(
        {"dtype": "float32", "size": size},
        Context(),
        device="cpu",
        op=flip_one_sign(torch, row, col),
    )
    (dev,) = outcome.values["devices"]
    assert outcome.status == "fail" and dev["bad"] == 1
    assert dev["max_rel_err"] < 1e-3  # what the old rule compared: it would have passed


def test_float32_runs_with_tf32_off_and_restores_it():
    m = torch.backends.cuda.matmul
    before = (m.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    m.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        seen = {}

        def spy(a, b):
            seen["tf32"] = (
                m.allow_tf32,
                torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision(),
            )
            return torch.matmul(a, b)

        outcome = matmul_check({"dtype": "float32", "size": 32}, Context(), device="cpu", op=spy)
        assert seen["tf32"] == (False, False, "highest")
        assert outcome.values["allow_tf32"] is False and "TF32 off" in outcome.reason
        assert (
            m.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
        ) == (True, True, "high")
    finally:
        m.allow_tf32, torch.backends.cudnn.allow_tf32 = before[0], before[1]
        torch.set_float32_matmul_precision(before[2])


def test_matmul_catches_a_wrong_product():
    def off_by_a_bit(a, b):
        c = torch.matmul(a, b)
        c[3, 5] += 0.05 * c.abs().max()
        return c

    outcome = matmul_check(
        {"dtype": "float32", "size": 64}, Context(), device="cpu", op=off_by_a_bit
    )
    assert outcome.status == "fail" and "1 of 4096 elements off" in outcome.reason
    assert "C[3,5]" in outcome.reason


def test_matmul_catches_nan():
    def nan(a, b):
        c = torch.matmul(a, b)
        c[0, 0] = float("nan")
        return c

    outcome = matmul_check({"dtype": "bfloat16", "size": 32}, Context(), device="cpu", op=nan)
    assert outcome.status == "fail" and "nan" in outcome.reason


def test_every_element_is_checked_and_the_reference_against_the_cpu(monkeypatch):
    """The old check compared a sample of 1024 rows beyond that size, so one wrong element
    elsewhere passed (on the H200 a flipped sign at row 1365 of 4096 did). Every element is
    compared now, with a float64 reference made on the device, itself compared with the CPU's
    on the sample."""
    from rbprobes import checks_numeric

    monkeypatch.setattr(checks_numeric, "FULL_ROWS", 8)
    monkeypatch.setattr(checks_numeric, "FULL_COLS", 16)
    r = checks_numeric.matmul_once(torch, "cpu", "float32", 48, crosscheck=True)
    assert r["elements"] == 48 * 48 and r["bad"] == 0
    assert r["reference_check"]["rows"] == 8 and r["reference_check"]["cols"] == 8
    assert r["reference_check"]["ok"] and r["checked"].startswith("every element of 48x48")
    outcome = matmul_check(
        {"dtype": "float32", "size": 48}, Context(), device="cpu", op=flip_one_sign(torch, 45, 3)
    )
    (dev,) = outcome.values["devices"]
    assert outcome.status == "fail" and dev["bad"] == 1
    assert (dev["worst"][0]["row"], dev["worst"][0]["col"]) == (45, 3)


def test_a_wrong_reference_fails(monkeypatch):
    from rbprobes import checks_numeric

    real = torch.Tensor.__matmul__

    def skewed(x, y):
        out = real(x, y)
        return out * (1 + 1e-6) if out.dtype == torch.float64 and out.shape[0] == 32 else out

    monkeypatch.setattr(torch.Tensor, "__matmul__", skewed)
    monkeypatch.setattr(checks_numeric, "FULL_ROWS", 8)
    r = checks_numeric.matmul_once(torch, "cpu", "float32", 32, crosscheck=True)
    assert r["reference_check"]["ok"] is False


def test_bad_params_fail_with_the_key():
    result = check("matmul", {"dtype": "bfloat16", "sise": 10})
    assert result["status"] == "fail" and "'sise'" in result["reason"]
    result = check("devices", {"count": "eight"})
    assert result["status"] == "fail" and "'count'" in result["reason"]


class _FakeCuda:
    """torch.cuda as the devices check reads it, for GPUs this machine does not have."""

    def __init__(self, names, capability=(9, 0)):
        self.names, self.capability = names, capability

    def device_count(self):
        return len(self.names)

    def get_device_properties(self, i):
        from types import SimpleNamespace

        return SimpleNamespace(
            name=self.names[i],
            major=self.capability[0],
            minor=self.capability[1],
            total_memory=80 << 30,
            multi_processor_count=132,
        )

    def get_arch_list(self):
        return ["sm_%d%d" % self.capability]


@pytest.mark.parametrize(
    "device, model, names_it",
    [
        ("NVIDIA H200", "H200", True),
        ("NVIDIA H100 80GB HBM3", "H200", False),  # same capability (9.0), another GPU
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA GH200 480GB", "H200", False),
        ("NVIDIA GH200 480GB", "GH200", True),
        ("NVIDIA B300 SXM6 AC", "B300", True),
        ("Tesla V100-SXM2-32GB", "V100", True),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000", True),
        ("NVIDIA GB200", "B200", False),
    ],
)
def test_the_devices_check_proves_the_specs_gpu_model(monkeypatch, device, model, names_it):
    """The spec's gpu.model comes with its catalog names; a device of the same capability that
    is not that model fails the check (found on a lent H100 running specs/h200.yaml: it passed)."""
    from types import SimpleNamespace

    from rbprobes import checks_runtime

    from compiler import catalog

    known = catalog.lookup(model)
    fake = SimpleNamespace(cuda=_FakeCuda([device], tuple(map(int, known.capability.split(".")))))
    monkeypatch.setattr(checks_runtime, "need_cuda", lambda: fake)
    gpu = {
        "model": known.name,
        "count": 1,
        "capability": known.capability,
        "names": catalog.model_names(model),
    }
    result = check("devices", ctx=Context(gpu=gpu))
    assert (result["status"] == "pass") == names_it, result["reason"]
    if not names_it:
        assert (
            f"the spec's gpu.model is {known.name}, but device 0: {device} is not one"
            in result["reason"]
        )
    else:
        assert f"(capability {known.capability}, gpu.model {known.name})" in result["reason"]
