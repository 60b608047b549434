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

from . import proc
from .checks_runtime import need_cuda
from .result import Context, failed, passed, short_list

# Largest acceptable max|C - ref| / max|ref|, the reference being the same (rounded) inputs
# multiplied in float64 on the CPU. Output rounding alone is 2^-9 (bf16) and 2^-12 (fp16)
# relative to an element; float32 leaves room for TF32, should a site enable it.
TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 5e-3}
FULL_ROWS = 1024  # every row is checked up to this size, then this many sampled rows
FULL_COLS = 8192  # every column is checked up to this size, then FULL_ROWS sampled columns


def _sample(torch, n: int, limit: int, seed: int):
    if n <= limit:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:limit].sort().values


def matmul_once(torch, device: str, dtype_name: str, size: int, seed: int = 0,
                min_time_s: float = 0.2, op=None) -> Dict[str, Any]:
    """C = A @ B on `device` in `dtype`, checked against float64 on the CPU, then timed.
    `op` replaces torch.matmul (unit tests inject a wrong product with it)."""
    op = op or torch.matmul
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    a = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    b = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    if device.startswith("cuda"):
        def sync():
            torch.cuda.synchronize(device)
    else:
        def sync():
            return None
    c = op(a, b)
    sync()
    rows = _sample(torch, size, FULL_ROWS, seed + 1)
    cols = _sample(torch, size, FULL_COLS if size <= FULL_COLS else FULL_ROWS, seed + 2)
    a_ref = (a if rows is None else a[rows.to(device)]).cpu().double()
    b_ref = (b if cols is None else b[:, cols.to(device)]).cpu().double()
    got = c if rows is None else c[rows.to(device)]
    got = (got if cols is None else got[:, cols.to(device)]).cpu().double()
    ref = a_ref @ b_ref
    scale = float(ref.abs().max())
    err = float((got - ref).abs().max()) / scale if scale > 0 else float("inf")
    if not math.isfinite(err) or not bool(torch.isfinite(got).all()):
        err = float("nan")
    # timing: warm up, then repeat until min_time_s has passed (at most 100 runs)
    for _ in range(2):
        op(a, b)
    sync()
    runs, start = 0, time.perf_counter()
    while True:
        op(a, b)
        runs += 1
        if runs % 5 == 0 or runs == 1:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time_s or runs >= 100:
                break
    sync()
    elapsed = time.perf_counter() - start
    checked = "%dx%d of %dx%d" % (ref.shape[0], ref.shape[1], size, size)
    tflops = 2.0 * size ** 3 * runs / elapsed / 1e12
    return {"max_rel_err": err, "tflops": float("%.4g" % tflops),
            "runs": runs, "checked": checked}


def matmul_check(params: Dict[str, Any], ctx: Context, device: Optional[str] = None, op=None):
    """Check: on every device (or the first), a dtype matmul is correct within tolerance.
    `device="cpu"` and `op` are for unit tests of the numerics; the check itself needs CUDA."""
    dtype_name = params.get("dtype", "bfloat16")
    size = int(params.get("size", 4096))
    if dtype_name not in TOLERANCE:
        return failed("dtype %r is not one of %s" % (dtype_name, ", ".join(sorted(TOLERANCE))))
    if size < 1:
        return failed("size must be positive, got %d" % size)
    if device is None:
        torch = need_cuda()
        n = torch.cuda.device_count() if params.get("every_device", True) else 1
        targets = ["cuda:%d" % i for i in range(n)]
    else:
        import torch

        targets = [device]
    tol = TOLERANCE[dtype_name]
    results = []
    for dev in targets:
        name = (torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda")
                else "cpu")
        r = matmul_once(torch, dev, dtype_name, size, op=op)
        r.update({"device": dev, "name": name, "tolerance": tol,
                  "ok": r["max_rel_err"] <= tol})
        results.append(r)
    values: Dict[str, Any] = {"dtype": dtype_name, "size": size, "devices": results}
    if device is None or device.startswith("cuda"):
        values["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    bad = ["%s: max rel err %.3g > %.3g" % (r["device"], r["max_rel_err"], tol)
           for r in results if not r["ok"]]
    if bad:
        return failed("%s %dx%d matmul wrong on %s" % (dtype_name, size, size, short_list(bad)),
                      values)
    worst = max(r["max_rel_err"] for r in results)
    speeds = ", ".join("%.3g" % r["tflops"] for r in results)
    return passed("%s %d^3 on %d device(s): max rel err %.2g <= %.0e, TFLOP/s %s" % (
        dtype_name, size, len(results), worst, tol, speeds), values)


def _package_parent() -> str:
    """The directory to put on PYTHONPATH so that `python -m <this package>` works."""
    depth = len(__package__.split("."))
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(depth):
        here = os.path.dirname(here)
    return here


def nccl_check(params: Dict[str, Any], ctx: Context):
    """Check: an all-reduce over every local GPU, one process per GPU, gives the exact sum."""
    torch = need_cuda()
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return failed("this torch build has no NCCL backend (torch %s)" % torch.__version__)
    world = torch.cuda.device_count()
    timeout_s = int(params.get("timeout_s", 180))
    elements = int(params.get("elements", 1 << 22))
    tmp = tempfile.mkdtemp(prefix="rbprobes-nccl-")
    env = proc.child_env(_package_parent())
    try:
        store = os.path.join(tmp, "store")
        argv = [sys.executable, "-m", __package__ + ".nccl_worker"]
        started = time.monotonic()
        children = []
        for rank in range(world):
            log = open(os.path.join(tmp, "rank%d.log" % rank), "w+b")
            child = proc.subprocess.Popen(
                argv + [str(rank), str(world), store, str(elements), str(timeout_s)],
                stdout=log, stderr=proc.subprocess.STDOUT, stdin=proc.subprocess.DEVNULL,
                env=env, start_new_session=True)
            children.append((child, log))
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
    expected = world * (world + 1) // 2
    values = {"world_size": world, "expected": expected, "elements": elements,
              "ranks": results, "env": {k: os.environ.get(k, v)
                                        for k, v in proc.SAFE_ENV.items()}}
    bad = ["rank %d: %s" % (r["rank"], r.get("error") or "sum %s, expected %s" % (
        r.get("min"), expected)) for r in results if not r.get("ok")]
    if bad:
        return failed("all-reduce over %d GPU(s) failed: %s" % (world, short_list(bad, 3)),
                      values)
    slowest = max(r.get("elapsed_s", 0.0) for r in results)
    note = " (world size 1: only one GPU, no inter-GPU traffic)" if world == 1 else ""
    return passed("all-reduce over %d GPU(s) gave exactly %d on every element in %.3f s%s"
                  % (world, expected, slowest, note), values)


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
    what = "killed at the deadline" if returncode is None or returncode < 0 else \
        "exit status %d" % returncode
    return {"rank": rank, "ok": False,
            "error": "%s; output: %s" % (what, proc.tail(output, 600).strip() or "(none)")}
