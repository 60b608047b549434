"""On a GPU host: the matmul check's margins on correct products and its verdict on planted
faults (zeroed outputs, one flipped sign, one dropped K-block).

    PYTHONPATH=DIR_WITH_rbprobes python calibrate_matmul.py [--out matmul.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CORRECT = [
    ("bfloat16", 4096),
    ("float16", 4096),
    ("float32", 4096),
    ("bfloat16", 8192),
    ("float16", 8192),
    ("float32", 8192),
]
FAULTY = [("bfloat16", 4096), ("float16", 4096), ("float32", 4096)]


def summary(outcome, seconds):
    d = outcome.values["devices"][0]
    return {
        "status": outcome.status,
        "bad": d["bad"],
        "elements": d["elements"],
        "max_ratio": d["max_ratio"],
        "atol": d["atol"],
        "rtol": d["rtol"],
        "scale": d["scale"],
        "max_rel_err": d["max_rel_err"],
        "tflops": d["tflops"],
        "worst": d["worst"][:3],
        "allow_tf32": outcome.values["allow_tf32"],
        "checked": d["checked"],
        "reference_check": d.get("reference_check"),
        "seconds": round(seconds, 2),
        "reason": outcome.reason,
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import torch
    from numeric_faults import FAULTS
    from rbprobes.checks_numeric import matmul_check
    from rbprobes.result import Context

    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "tf32_default": bool(torch.backends.cuda.matmul.allow_tf32),
        "correct": [],
        "faults": [],
    }
    for dtype, size in CORRECT:
        t0 = time.monotonic()
        o = matmul_check({"dtype": dtype, "size": size}, Context(), device="cuda:0")
        row = dict(summary(o, time.monotonic() - t0), dtype=dtype, size=size)
        out["correct"].append(row)
        print(
            "correct %-8s %5d %s max_ratio %.3f max_rel %.2e %.0f TFLOP/s"
            % (dtype, size, row["status"], row["max_ratio"], row["max_rel_err"], row["tflops"])
        )
    for dtype, size in FAULTY:
        for name, make in sorted(FAULTS.items()):
            t0 = time.monotonic()
            o = matmul_check(
                {"dtype": dtype, "size": size}, Context(), device="cuda:0", op=make(torch)
            )
            row = dict(summary(o, time.monotonic() - t0), dtype=dtype, size=size, fault=name)
            out["faults"].append(row)
            print(
                "fault   %-8s %5d %-20s %s bad %d max_ratio %.3g"
                % (dtype, size, name, row["status"], row["bad"], row["max_ratio"])
            )
    out["tf32_after"] = bool(torch.backends.cuda.matmul.allow_tf32)
    ok = all(r["status"] == "pass" for r in out["correct"]) and all(
        r["status"] == "fail" for r in out["faults"]
    )
    out["ok"] = ok
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
