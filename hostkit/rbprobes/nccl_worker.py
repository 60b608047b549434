"""One rank of the nccl check: `python -m <package>.nccl_worker RANK WORLD STORE ELEMENTS TIMEOUT`.

Rank r contributes r + 1 on every element of a float32 tensor (integer values, exact in float32),
so after a sum all-reduce every element must equal WORLD * (WORLD + 1) / 2 exactly. Prints one
JSON line as its last line of output. The check's preconditions are found here, in a fresh
process, not in the probe's: `unavailable` (torch or a CUDA device missing, need_cuda's words),
`no_nccl` (a torch build without NCCL), `device_count` (torch's; the check started one worker
per device libcuda counted, and a worker whose torch counts otherwise stops before NCCL).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

from .proc import apply_safe_env
from .result import Unavailable


def main(argv) -> int:
    rank, world, store, elements, timeout_s = (
        int(argv[0]),
        int(argv[1]),
        argv[2],
        int(argv[3]),
        int(argv[4]),
    )
    apply_safe_env()
    out = {"rank": rank, "ok": False}
    try:
        from .checks_runtime import need_cuda

        try:
            torch = need_cuda()
        except Unavailable as exc:
            out["unavailable"] = exc.reason
            print(json.dumps(out), flush=True)
            return 1
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            out["no_nccl"] = "this torch build has no NCCL backend (torch %s)" % torch.__version__
            print(json.dumps(out), flush=True)
            return 1
        out["device_count"] = torch.cuda.device_count()
        if out["device_count"] != world:
            out["error"] = "torch sees %d device(s), the check started %d worker(s)" % (
                out["device_count"],
                world,
            )
            print(json.dumps(out), flush=True)
            return 1
        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl",
            init_method="file://" + store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        tensor = torch.full((elements,), float(rank + 1), dtype=torch.float32, device="cuda")
        dist.all_reduce(tensor)  # warm-up: builds the communicator
        torch.cuda.synchronize()
        tensor.fill_(float(rank + 1))
        start = time.perf_counter()
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        expected = world * (world + 1) // 2
        lo, hi = float(tensor.min()), float(tensor.max())
        out.update(
            {
                "ok": lo == hi == expected,
                "min": lo,
                "max": hi,
                "elapsed_s": elapsed,
                "device": torch.cuda.get_device_name(rank),
                "nccl": _nccl_version(torch),
            }
        )
        dist.destroy_process_group()
    except Exception as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:400])
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


def _nccl_version(torch) -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
