"""On a GPU host: launch every kernel of the truth fixtures and compare with kernel_audit.

    PYTHONPATH=DIR_WITH_rbprobes python launch_all.py FIXTURES [--out truth.json]

FIXTURES is what truth_fixtures.py built (with its manifest.json). Each file is loaded in a
child process of its own: a shared object with ctypes (its static CUDA runtime registers the
fatbins), then each kernel's exported `rb_launch_<kernel>` wrapper is called (it launches the
kernel, synchronises, checks the output and returns the CUDA error code, -1 for a wrong
result); a .cubin/.fatbin through the driver API (cuModuleLoad, cuModuleGetFunction,
cuLaunchKernel). Then kernel_audit judges the same directory for this device's arch with this
host's driver, and every kernel's launch is compared with the audit's word on it. Prints the
table; writes the JSON document; exit 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

RUNTIME_ERRORS = {
    0: "cudaSuccess",
    -1: "wrong output",
    209: "cudaErrorNoKernelImageForDevice",
    218: "cudaErrorInvalidPtx",
    222: "cudaErrorUnsupportedPtxVersion",
    98: "cudaErrorInvalidDeviceFunction",
    200: "cudaErrorInvalidKernelImage",
    500: "cudaErrorNotFound",
    301: "cudaErrorFileNotFound",
}


def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def _check(lib, rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError("%s: %d %s" % (what, rc, (name.value or b"?").decode()))


def device_capability():
    lib = _driver()
    _check(lib, lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "major")
    _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "minor")
    return major.value, minor.value


def launch_module(path, kernels):
    """Driver API: load a cubin/fatbin, launch each kernel <<<1, 32>>> on an int[32]."""
    lib = _driver()
    out = {}
    _check(lib, lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx")
    _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    mod = ctypes.c_void_p()
    rc = lib.cuModuleLoad(ctypes.byref(mod), path.encode())
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        for k in kernels:
            out[k] = {"rc": rc, "error": "cuModuleLoad: %s" % (name.value or b"?").decode()}
        return out
    for k in kernels:
        fn = ctypes.c_void_p()
        rc = lib.cuModuleGetFunction(ctypes.byref(fn), mod, k.encode())
        if rc != 0:
            out[k] = {"rc": rc, "error": "cuModuleGetFunction"}
            continue
        dptr = ctypes.c_uint64()
        _check(lib, lib.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(128)), "cuMemAlloc")
        arg = ctypes.c_void_p(dptr.value)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
        rc = lib.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, params, None)
        if rc == 0:
            rc = lib.cuCtxSynchronize()
        host = (ctypes.c_int * 32)()
        if rc == 0:
            rc = lib.cuMemcpyDtoH_v2(host, dptr, ctypes.c_size_t(128))
        lib.cuMemFree_v2(dptr)
        if rc == 0 and list(host) != [42 + i for i in range(32)]:
            rc = -1
        out[k] = {"rc": rc, "error": None if rc == 0 else "launch"}
    return out


def launch_so(path, wrappers):
    lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    out = {}
    for kernel, wrapper in wrappers.items():
        fn = getattr(lib, wrapper)
        fn.restype = ctypes.c_int
        rc = fn()
        out[kernel] = {"rc": rc, "error": None if rc == 0 else RUNTIME_ERRORS.get(rc, "?")}
    return out


def one(path, entry):
    """In the child: launch the kernels of one file; prints {symbol: {"rc", "error"}}."""
    if entry["how"] in ("cubin", "fatbin", "ptxfatbin"):
        result = launch_module(path, [k["symbol"] for k in entry["kernels"]])
    else:
        wrappers = {k["symbol"]: k["wrapper"] for k in entry["kernels"]}
        result = launch_so(path, wrappers)
    print(json.dumps(result))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures")
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    with open(os.path.join(args.fixtures, "manifest.json")) as fh:
        doc = json.load(fh)
    if args.one:
        one(os.path.join(args.fixtures, args.one), doc[args.one])
        return 0
    import truth_fixtures
    from rbprobes import checks_static

    cap = device_capability()
    launched = {}
    timings = {}
    for name in sorted(doc):
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), args.fixtures, "--one", name],
                capture_output=True,
                text=True,
                timeout=120,
            )
            line = (done.stdout.strip().splitlines() or [""])[-1]
            result = json.loads(line) if line.startswith("{") else {}
            err = (
                None
                if result
                else "child exit %d: %s" % (done.returncode, done.stderr.strip()[-300:])
            )
        except subprocess.TimeoutExpired:
            result, err = {}, "timed out"
        timings[name] = round(time.monotonic() - t0, 2)
        for k in doc[name]["kernels"]:
            r = result.get(k["symbol"], {"rc": None, "error": err})
            launched[k["symbol"]] = {
                "file": name,
                "ran": r["rc"] == 0,
                "rc": r["rc"],
                "error": r["error"],
            }
    t0 = time.monotonic()
    limit, drv = checks_static.resolve_ptx_limit(None)
    values = checks_static.audit(args.fixtures, cap, None, limit)
    audit_s = time.monotonic() - t0
    says = truth_fixtures.audit_verdicts(values, doc)
    rows = []
    agree = 0
    for sym, got in launched.items():
        row = dict(
            got, symbol=sym, audit_path=says.get(sym), expected=truth_fixtures.EXPECTED.get(sym)
        )
        row["agree"] = row["audit_path"] is not None and row["audit_path"] == got["ran"]
        agree += row["agree"]
        rows.append(row)
    files = {
        f["path"]: {"verdict": f["verdict"], "fails": f["fails"], "missing": f.get("missing")}
        for f in values["files"]
    }
    out = {
        "device": "sm_%d%d" % cap,
        "driver": drv,
        "kernels": len(rows),
        "agree": agree,
        "all_agree": agree == len(rows),
        "rows": rows,
        "files": files,
        "audit_s": round(audit_s, 3),
        "launch_s": timings,
        "zstd_decoder": values.get("zstd_decoder"),
        "audit_errors": values["errors"],
    }
    print("%-22s %-22s %-6s %-8s %-6s %s" % ("kernel", "file", "ran", "audit", "agree", "error"))
    for r in rows:
        print(
            "%-22s %-22s %-6s %-8s %-6s %s"
            % (r["symbol"], r["file"], r["ran"], r["audit_path"], r["agree"], r["error"] or "")
        )
    print("agreement %d/%d on %s (%s)" % (agree, len(rows), out["device"], drv.get("source")))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if out["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
