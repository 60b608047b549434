"""L2 checks: the GPUs compute the right numbers (matmul) and talk to each other (nccl)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from rbrules import launch

from . import driver, proc
from .checks_runtime import need_cuda
from .result import Context, Unavailable, failed, passed, short_list

# Per element, |C - ref| <= atol + rtol * |ref|, the reference being the same (rounded) inputs
# multiplied in float64 on the CPU:
#   rtol = EPS[dtype]: the output's rounding is at most half of that (2^-9 of an element in
#          bfloat16, 2^-12 in float16, 2^-25 in float32);
#   atol = s * (ATOL_DTYPE * sqrt(K) * EPS[dtype] + ATOL_ACC * K * EPS_ACC), s = rms(A) * rms(B)
#          (the size of one product term, so sqrt(K) * s is the size of an element of C): the
#          first term for partial sums kept in the dtype (split-K reductions in reduced
#          precision), the second for float32 accumulation over K terms (its rounding errors
#          grow with K, not sqrt(K); docs/probes.md has what a float32 8192^3 product on the
#          H200 was off by, as that predicts).
# float32 runs with TF32 off (restored afterwards), so its tolerance is float32's own.
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
EPS_ACC = 2.0**-23
ATOL_DTYPE = 2.0
ATOL_ACC = 8.0
WORST_LISTED = 5
FULL_ROWS = 1024  # the device's float64 reference is compared with the CPU's on this many
FULL_COLS = 8192  # sampled rows (and every column up to FULL_COLS, else FULL_ROWS of them)
REF_AGREE = 1e-9  # largest relative difference between the two float64 references


def _sample(torch, size: int, limit: int, seed: int):
    if size <= limit:
        return None
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=gen)[:limit].sort().values


class _Tf32Off:
    """TF32 off for float32 products (torch.backends.cuda.matmul and cudnn, old and new
    switches, and the float32 matmul precision), restored on exit."""

    def __init__(self, torch):
        self.torch = torch
        self.saved = []

    def __enter__(self):
        import warnings

        torch = self.torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in (torch.backends.cuda.matmul, torch.backends.cudnn):
                for attr in ("fp32_precision", "allow_tf32"):
                    if hasattr(obj, attr):
                        self.saved.append((obj, attr, getattr(obj, attr)))
            self.precision = torch.get_float32_matmul_precision()
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        return self

    def __exit__(self, *exc):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.torch.set_float32_matmul_precision(self.precision)
            for obj, attr, value in reversed(self.saved):
                try:
                    setattr(obj, attr, value)
                except (RuntimeError, ValueError, TypeError):
                    pass
        return False


def tolerance(dtype_name: str, inner: int, scale: float) -> Dict[str, float]:
    """atol and rtol of a product with inner dimension `inner` and term size `scale`."""
    eps = EPS[dtype_name]
    atol = scale * (ATOL_DTYPE * math.sqrt(inner) * eps + ATOL_ACC * inner * EPS_ACC)
    return {"atol": atol, "rtol": eps}


def compare(torch, got, ref, atol: float, rtol: float, rows=None, cols=None) -> Dict[str, Any]:
    """Per element |got - ref| <= atol + rtol*|ref| (got, ref: float64 tensors on one device):
    how many fail, the largest ratio of error to allowance, and the worst few as (row, col,
    got, want) in the full matrix's indices (`rows`/`cols` map a sampled block back)."""
    err = (got - ref).abs()
    allowed = atol + rtol * ref.abs()
    ratio = err / allowed
    finite = torch.isfinite(got)
    ratio = torch.where(finite, ratio, torch.full_like(ratio, float("inf")))
    bad = int((ratio > 1.0).sum())  # non-finite outputs have ratio inf
    flat = ratio.flatten()
    listed = min(WORST_LISTED, flat.numel())
    values, where = torch.topk(flat, listed)
    worst = []
    ncols = ratio.shape[1]
    for ratio_value, flat_index in zip(values.tolist(), where.tolist()):
        row, col = divmod(int(flat_index), ncols)
        worst.append(
            {
                "row": int(rows[row]) if rows is not None else row,
                "col": int(cols[col]) if cols is not None else col,
                "got": float(got[row, col]),
                "want": float(ref[row, col]),
                "ratio": float(ratio_value),
            }
        )
    return {
        "bad": bad,
        "elements": int(flat.numel()),
        "max_ratio": float(values[0]) if listed else 0.0,
        "worst": worst,
        "max_abs_err": float(err[finite].max()) if bool(finite.any()) else float("nan"),
    }


def matmul_once(
    torch,
    device: str,
    dtype_name: str,
    size: int,
    seed: int = 0,
    min_time_s: float = 0.2,
    op=None,
    crosscheck: Optional[bool] = None,
) -> Dict[str, Any]:
    """C = A @ B on `device` in `dtype`, every element checked against the same rounded inputs
    multiplied in float64 on the device, that reference itself checked against float64 on the
    CPU for a seeded sample of rows (and columns), then timed. `op` replaces torch.matmul
    (unit tests and the GPU calibration inject wrong products with it); `crosscheck` forces
    the CPU comparison on or off (default: on unless the device is the CPU)."""
    op = op or torch.matmul
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    mat_a = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    mat_b = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    if device.startswith("cuda"):

        def sync():
            torch.cuda.synchronize(device)
    else:

        def sync():
            return None

    scale = float(mat_a.float().pow(2).mean().sqrt()) * float(mat_b.float().pow(2).mean().sqrt())
    tol = tolerance(dtype_name, size, scale)
    product = op(mat_a, mat_b)
    sync()
    a64, b64 = mat_a.double(), mat_b.double()
    ref = a64 @ b64
    result = compare(torch, product.double(), ref, tol["atol"], tol["rtol"])
    ref_max = float(ref.abs().max())
    if crosscheck is None:
        crosscheck = not device.startswith("cpu")
    if crosscheck:
        rows = _sample(torch, size, FULL_ROWS, seed + 1)
        cols = _sample(torch, size, FULL_COLS if size <= FULL_COLS else FULL_ROWS, seed + 2)
        a_ref = (mat_a if rows is None else mat_a[rows.to(device)]).cpu().double()
        b_ref = (mat_b if cols is None else mat_b[:, cols.to(device)]).cpu().double()
        sample = ref if rows is None else ref[rows.to(device)]
        sample = (sample if cols is None else sample[:, cols.to(device)]).cpu()
        cpu = a_ref @ b_ref
        diff = float((cpu - sample).abs().max()) / max(float(cpu.abs().max()), 1e-300)
        result["reference_check"] = {
            "rows": int(cpu.shape[0]),
            "cols": int(cpu.shape[1]),
            "max_rel_diff": diff,
            "ok": diff <= REF_AGREE,
        }
    del a64, b64, ref
    # timing: warm up, then repeat until min_time_s has passed (at most 100 runs)
    for _ in range(2):
        op(mat_a, mat_b)
    sync()
    runs, start = 0, time.perf_counter()
    while True:
        op(mat_a, mat_b)
        runs += 1
        if runs % 5 == 0 or runs == 1:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time_s or runs >= 100:
                break
    sync()
    elapsed = time.perf_counter() - start
    tflops = 2.0 * size**3 * runs / elapsed / 1e12
    checked = "every element of %dx%d" % (size, size)
    if "reference_check" in result:
        checked += "; float64 reference on %s agrees with the CPU's on %dx%d" % (
            device,
            result["reference_check"]["rows"],
            result["reference_check"]["cols"],
        )
    result.update(
        {
            "atol": tol["atol"],
            "rtol": tol["rtol"],
            "scale": scale,
            "max_rel_err": result["max_abs_err"] / ref_max if ref_max > 0 else float("inf"),
            "tflops": float("%.4g" % tflops),
            "runs": runs,
            "checked": checked,
        }
    )
    return result


def _describe_worst(result: Dict[str, Any]) -> str:
    return ", ".join(
        "C[%d,%d] = %.6g, want %.6g" % (w["row"], w["col"], w["got"], w["want"])
        for w in result["worst"][:3]
    )


def matmul_check(params: Dict[str, Any], ctx: Context, device: Optional[str] = None, op=None):
    """Check: on every device (or the first), a dtype matmul is right element by element.
    `device="cpu"` and `op` are for unit tests of the numerics; the check itself needs CUDA."""
    dtype_name = params.get("dtype", "bfloat16")
    size = int(params.get("size", 4096))
    if dtype_name not in EPS:
        return failed("dtype %r is not one of %s" % (dtype_name, ", ".join(sorted(EPS))))
    if size < 1:
        return failed("size must be positive, got %d" % size)
    if device is None:
        torch = need_cuda()
        count = torch.cuda.device_count() if params.get("every_device", True) else 1
        targets = ["cuda:%d" % i for i in range(count)]
    else:
        import torch

        targets = [device]
    results = []
    with _Tf32Off(torch) if dtype_name == "float32" else _Nothing():
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
        for dev in targets:
            name = (
                torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu"
            )
            result = matmul_once(torch, dev, dtype_name, size, op=op)
            result.update(
                {
                    "device": dev,
                    "name": name,
                    "ok": result["bad"] == 0 and result.get("reference_check", {}).get("ok", True),
                }
            )
            results.append(result)
    values: Dict[str, Any] = {
        "dtype": dtype_name,
        "size": size,
        "devices": results,
        "allow_tf32": tf32,
        "rule": "|C - ref| <= atol + rtol*|ref| per element",
    }
    bad = [
        "%s: %d of %d elements off (worst %.3g x allowed: %s)"
        % (r["device"], r["bad"], r["elements"], r["max_ratio"], _describe_worst(r))
        for r in results
        if r["bad"]
    ]
    bad += [
        "%s: its float64 reference differs from the CPU's by %.3g (relative)"
        % (r["device"], r["reference_check"]["max_rel_diff"])
        for r in results
        if not r.get("reference_check", {}).get("ok", True)
    ]
    if bad:
        return failed(
            "%s %dx%d matmul wrong on %s" % (dtype_name, size, size, short_list(bad)), values
        )
    worst = max(r["max_ratio"] for r in results)
    speeds = ", ".join("%.3g" % r["tflops"] for r in results)
    return passed(
        "%s %d^3 on %d device(s): every element within atol %.2g + rtol %.2g "
        "(worst %.2f of allowed), TF32 %s, TFLOP/s %s"
        % (
            dtype_name,
            size,
            len(results),
            results[0]["atol"],
            results[0]["rtol"],
            worst,
            "on" if tf32 else "off",
            speeds,
        ),
        values,
    )


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def nccl_check(params: Dict[str, Any], ctx: Context):
    """Check: an all-reduce over every local GPU, one process per GPU, gives the exact sum.

    It imports no torch in this process (it overlaps the serial checks, and the libraries check
    reads what this process has loaded): the number of workers comes from libcuda
    (cuDeviceGetCount, which honours CUDA_VISIBLE_DEVICES as torch does), and the workers
    themselves say whether torch, CUDA and NCCL are there (the same words as need_cuda)."""
    timeout_s = int(params.get("timeout_s", 180))
    elements = int(params.get("elements", 1 << 22))
    world, how = driver.cuda_device_count()
    if not world:
        why = (
            how
            if world is None
            else "libcuda sees no CUDA device (CUDA_VISIBLE_DEVICES=%r)"
            % os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        raise Unavailable(
            "no CUDA device visible: %s; the all-reduce needs one" % why, {"devices_from": how}
        )
    results = _run_workers(world, elements, timeout_s)
    seen = [r.get("device_count") for r in results if isinstance(r.get("device_count"), int)]
    if seen and seen[0] != world and seen[0] > 0 and not any(r.get("unavailable") for r in results):
        # torch counts otherwise than libcuda did (should not happen): run again with its count
        world = seen[0]
        results = _run_workers(world, elements, timeout_s)
    expected = world * (world + 1) // 2
    values = {
        "world_size": world,
        "expected": expected,
        "elements": elements,
        "devices_from": how,
        "ranks": results,
        "env": {k: os.environ.get(k, v) for k, v in proc.SAFE_ENV.items()},
    }
    for result in results:
        if result.get("unavailable"):
            raise Unavailable(result["unavailable"], values)
    for result in results:
        if result.get("no_nccl"):
            return failed(result["no_nccl"], values)
    bad = [
        "rank %d: %s"
        % (r["rank"], r.get("error") or "sum %s, expected %s" % (r.get("min"), expected))
        for r in results
        if not r.get("ok")
    ]
    if bad:
        return failed("all-reduce over %d GPU(s) failed: %s" % (world, short_list(bad, 3)), values)
    slowest = max(r.get("elapsed_s", 0.0) for r in results)
    note = " (world size 1: only one GPU, no inter-GPU traffic)" if world == 1 else ""
    return passed(
        "all-reduce over %d GPU(s) gave exactly %d on every element in %.3f s%s"
        % (world, expected, slowest, note),
        values,
    )


def _run_workers(world: int, elements: int, timeout_s: int) -> List[Dict[str, Any]]:
    """Start one worker per rank, wait for all (bounded by timeout_s + 60 s, then every
    worker's process group is killed), and read each one's JSON line."""
    tmp = tempfile.mkdtemp(prefix="rbprobes-nccl-")
    env = proc.child_env()
    try:
        store = os.path.join(tmp, "store")
        argv = launch.argv(sys.executable, __package__ + ".nccl_worker", site=True)
        started = time.monotonic()
        children = []
        try:
            for rank in range(world):
                log = open(os.path.join(tmp, "rank%d.log" % rank), "w+b")
                child = proc.subprocess.Popen(
                    argv + [str(rank), str(world), store, str(elements), str(timeout_s)],
                    stdout=log,
                    stderr=proc.subprocess.STDOUT,
                    stdin=proc.subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
                children.append((child, log))
        except BaseException:
            for other, log in children:
                proc.kill_group(other)
                other.wait()
                log.close()
            raise
        deadline = started + timeout_s + 60
        results: List[Dict[str, Any]] = []
        for rank, (child, log) in enumerate(children):
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except proc.subprocess.TimeoutExpired:
                for other, _log in children:
                    proc.kill_group(other)
                child.wait()
            log.seek(0)
            output = log.read().decode("utf-8", "replace")
            log.close()
            results.append(_worker_result(rank, child.returncode, output))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _worker_result(rank: int, returncode: Optional[int], output: str) -> Dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
                data.setdefault("rank", rank)
                if returncode != 0 and data.get("ok"):
                    data["ok"] = False
                    data["error"] = "exit status %s" % returncode
                return data
            except ValueError:
                break
    what = (
        "killed at the deadline"
        if returncode is None or returncode < 0
        else "exit status %d" % returncode
    )
    return {
        "rank": rank,
        "ok": False,
        "error": "%s; output: %s" % (what, proc.tail(output, 600).strip() or "(none)"),
    }
