"""Helpers shared by the probes tests (a unique module name: importable beside other suites)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "hostkit") not in sys.path:
    sys.path.insert(0, str(ROOT / "hostkit"))

PACKAGE_DIR = ROOT / "hostkit" / "rbprobes"
KERNEL = r"""
extern "C" __global__ void add_one(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" int launch_add_one(float *x, int n) {
  add_one<<<(n + 255) / 256, 256>>>(x, n);
  return 0;
}
"""

# A translation unit with device code but no kernel (a __device__ variable only).
NO_KERNEL = "__device__ int counter;\nextern \"C\" int host_only(void) { return 1; }\n"

# name -> nvcc arguments after the input: one tiny kernel, several target sets, as .so files.
FATBIN_BUILDS = {
    "nokernel": ["-gencode", "arch=compute_75,code=sm_75"],
    "nokernel_zstd": ["-gencode", "arch=compute_75,code=sm_75", "-Xfatbin", "-compress-all"],
    "sm120": ["-gencode", "arch=compute_120,code=sm_120"],
    "sm100a": ["-gencode", "arch=compute_100a,code=sm_100a"],
    "sm100f": ["-gencode", "arch=compute_100f,code=sm_100f"],
    "ptx100": ["-gencode", "arch=compute_100,code=compute_100"],
    "sm90": ["-gencode", "arch=compute_90,code=sm_90"],
    "compressed": ["-gencode", "arch=compute_90,code=sm_90", "-gencode",
                   "arch=compute_103,code=sm_103", "-gencode", "arch=compute_90,code=compute_90",
                   "-Xfatbin", "-compress-all"],
    "lz4": ["-gencode", "arch=compute_90,code=sm_90", "-Xfatbin", "-compress-all",
            "-compress-mode=speed"],
}


SOURCES = {"nokernel": NO_KERNEL, "nokernel_zstd": NO_KERNEL}  # default: KERNEL


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _is_python39(path: str) -> bool:
    """A working Python 3.9 (a pyenv shim without that version selected is not)."""
    if not os.access(path, os.X_OK):
        return False
    try:
        done = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout.strip() == "(3, 9)"


def need(tool: str, why: str):
    """A tool's path; a missing tool fails the test in CI and skips it elsewhere."""
    if tool == "nvcc":
        candidates = [shutil.which("nvcc"), os.environ.get("CUDA_HOME", "") + "/bin/nvcc",
                      "/usr/local/cuda/bin/nvcc", "/usr/local/cuda-13.0/bin/nvcc"]
        found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    elif tool == "python3.9":
        candidates = ["/root/.pyenv/versions/3.9.18/bin/python3", shutil.which("python3.9")]
        found = next((c for c in candidates if c and _is_python39(c)), None)
    else:
        found = shutil.which(tool)
    if found:
        return found
    message = "%s not found: %s" % (tool, why)
    if in_ci():
        pytest.fail(message + " (CI=true: required)")
    pytest.skip(message)


def run_cli(*args, python=None, env=None, cwd=None, stdin=None, timeout=300):
    """Run `python -m rbprobes ARGS` from the repo root; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([python or sys.executable, "-m", "rbprobes"] + list(args),
                          capture_output=True, text=True, cwd=cwd or ROOT, env=full_env,
                          input=stdin, timeout=timeout)


def cli_json(done):
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise AssertionError("stdout is not JSON:\n%s\nstderr:\n%s" % (done.stdout, done.stderr))


def fatbin_entry(kind: int, number: int, flags: int = 0x11, payload: bytes = b"\0" * 8,
                 version=(1, 8), usize: int = 0, header_size: int = 64) -> bytes:
    """One fatbin entry (header + payload padded to 8), laid out as nvcc writes it."""
    import struct

    padded = payload + b"\0" * (-len(payload) % 8)
    compressed = len(payload) if flags & 0xA000 else 0
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, header_size, len(padded), compressed, 0,
                       version[1], version[0], number, 0, 0, flags, 0, usize)
    head += b"\0" * (header_size - len(head))
    return head + padded


def fatbin_container(*entries: bytes) -> bytes:
    import struct

    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def c_array(name: str, data: bytes, section: str = "") -> str:
    """A C definition of a const byte array (8-byte aligned), optionally in a named section."""
    attrs = "aligned(8), used" + (', section("%s")' % section if section else "")
    body = ",".join(str(b) for b in data)
    return "const unsigned char %s[%d] __attribute__((%s)) = {%s};\n" % (
        name, len(data), attrs, body)
