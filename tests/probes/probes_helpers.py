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
NO_KERNEL = '__device__ int counter;\nextern "C" int host_only(void) { return 1; }\n'

# name -> nvcc arguments after the input: one tiny kernel, several target sets, as .so files.
FATBIN_BUILDS = {
    "nokernel": ["-gencode", "arch=compute_75,code=sm_75"],
    "nokernel_zstd": ["-gencode", "arch=compute_75,code=sm_75", "-Xfatbin", "-compress-all"],
    "sm120": ["-gencode", "arch=compute_120,code=sm_120"],
    "sm100a": ["-gencode", "arch=compute_100a,code=sm_100a"],
    "sm100f": ["-gencode", "arch=compute_100f,code=sm_100f"],
    "ptx100": ["-gencode", "arch=compute_100,code=compute_100"],
    "sm90": ["-gencode", "arch=compute_90,code=sm_90"],
    "compressed": [
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_103,code=sm_103",
        "-gencode",
        "arch=compute_90,code=compute_90",
        "-Xfatbin",
        "-compress-all",
    ],
    "lz4": [
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-Xfatbin",
        "-compress-all",
        "-compress-mode=speed",
    ],
}


SOURCES = {"nokernel": NO_KERNEL, "nokernel_zstd": NO_KERNEL}  # default: KERNEL


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _is_python39(path: str) -> bool:
    """A working Python 3.9 (a pyenv shim without that version selected is not)."""
    if not os.access(path, os.X_OK):
        return False
    try:
        done = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout.strip() == "(3, 9)"


def need(tool: str, why: str):
    """A tool's path; a missing tool fails the test in CI and skips it elsewhere."""
    if tool == "nvcc":
        candidates = [
            shutil.which("nvcc"),
            os.environ.get("CUDA_HOME", "") + "/bin/nvcc",
            "/usr/local/cuda/bin/nvcc",
            "/usr/local/cuda-13.0/bin/nvcc",
        ]
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
    return subprocess.run(
        [python or sys.executable, "-m", "rbprobes"] + list(args),
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=full_env,
        input=stdin,
        timeout=timeout,
    )


def cli_json(done):
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise AssertionError(
            "stdout is not JSON:\n%s\nstderr:\n%s" % (done.stdout, done.stderr)
        ) from exc


def fatbin_entry(
    kind: int,
    number: int,
    flags: int = 0x11,
    payload: bytes = b"\0" * 8,
    version=(1, 8),
    usize: int = 0,
    header_size: int = 64,
) -> bytes:
    """One fatbin entry (header + payload padded to 8), laid out as nvcc writes it."""
    import struct

    padded = payload + b"\0" * (-len(payload) % 8)
    compressed = len(payload) if flags & 0xA000 else 0
    head = struct.pack(
        "<HHIQIIHHIIIQQQ",
        kind,
        0x0101,
        header_size,
        len(padded),
        compressed,
        0,
        version[1],
        version[0],
        number,
        0,
        0,
        flags,
        0,
        usize,
    )
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
        name,
        len(data),
        attrs,
        body,
    )


def tiny_elf(
    sections,
    machine: int = 62,
    etype: int = 3,
    flags: int = 0,
    abiversion: int = 0,
    addresses: bool = False,
) -> bytes:
    """A little-endian ELF64 image with the given sections, laid out by hand (no toolchain):
    sections = [(name, sh_type, data, sh_link)], section 0 and .shstrtab added. x86-64 shared
    object by default; machine 190 makes a cubin."""
    import struct

    names = b"\0"
    offsets = []
    for name, *_rest in sections:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    body = b""
    placed = []
    pos = 64
    for _name, _type, data, _link in sections:
        pad = -pos % 8
        body += b"\0" * pad
        pos += pad
        placed.append(pos)
        body += data
        pos += len(data)
    pad = -pos % 8
    body += b"\0" * pad
    pos += pad
    shstr_off = pos
    body += names
    pos += len(names)
    pad = -pos % 8
    body += b"\0" * pad
    pos += pad
    shoff = pos
    shnum = len(sections) + 2
    head = b"\x7fELF" + bytes([2, 1, 1, 0x33 if machine == 190 else 0, abiversion]) + b"\0" * 7
    head += struct.pack(
        "<HHIQQQIHHHHHH", etype, machine, 1, 0, 0, shoff, flags, 64, 0, 0, 64, shnum, shnum - 1
    )
    table = b"\0" * 64
    for (_name, sh_type, data, link), noff, off in zip(sections, offsets, placed):
        entsize = 24 if sh_type == 2 else 0
        table += struct.pack(
            "<IIQQQQIIQQ",
            noff,
            sh_type,
            2,
            off if addresses else 0,
            off,
            len(data),
            link,
            0,
            8,
            entsize,
        )
    table += struct.pack("<IIQQQQIIQQ", shstr_name, 3, 0, 0, shstr_off, len(names), 0, 0, 1, 0)
    return head + body + table


def tiny_cubin(kernels, number: int = 90) -> bytes:
    """A cubin-shaped ELF (EM_CUDA) whose symbol table names `kernels` as entries
    (STT_FUNC, global, st_other STO_CUDA_ENTRY) with one `.text.NAME` section each."""
    import struct

    strtab = b"\0"
    syms = b"\0" * 24
    sections = []
    for i, k in enumerate(kernels):
        name_off = len(strtab)
        strtab += k.encode() + b"\0"
        # sections: 1 .strtab, 2 .symtab, then .text.k at 3 + i
        syms += struct.pack("<IBBHQQ", name_off, 0x12, 0x10, 3 + i, 0, 16)
    sections.append((".strtab", 3, strtab, 0))
    sections.append((".symtab", 2, syms, 1))
    for k in kernels:
        sections.append((".text." + k, 1, b"\0" * 16, 0))
    return tiny_elf(sections, machine=190, etype=2, flags=number, abiversion=7)


def tiny_ptx(kernels, isa: str = "8.0", target: str = "sm_80") -> bytes:
    body = "".join(".visible .entry %s(\n)\n{\n\tret;\n}\n" % k for k in kernels)
    return (".version %s\n.target %s\n.address_size 64\n%s" % (isa, target, body)).encode() + b"\0"


def tiny_so(fatbin: bytes, extra_sections=()) -> bytes:
    """An x86-64 shared object (hand-laid, no toolchain) with `fatbin` as its .nv_fatbin."""
    return tiny_elf([(".nv_fatbin", 1, fatbin, 0)] + list(extra_sections))


def lz4_literals(data: bytes) -> bytes:
    """A valid LZ4 block holding `data` as one run of literals (no matches)."""
    n = len(data)
    if n < 15:
        return bytes([n << 4]) + data
    rest = n - 15
    ext = b"\xff" * (rest // 255) + bytes([rest % 255])
    return bytes([0xF0]) + ext + data


def zstd_raw_frame(data: bytes) -> bytes:
    """A valid Zstandard frame holding `data` in raw blocks (no toolchain, no zstd module)."""
    import struct

    out = b"\x28\xb5\x2f\xfd" + bytes([0xA0]) + struct.pack("<I", len(data))
    blocks = [data[i : i + (128 << 10)] for i in range(0, len(data), 128 << 10)] or [b""]
    for i, block in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        header = last | (0 << 1) | (len(block) << 3)
        out += struct.pack("<I", header)[:3] + block
    return out


def tiny_rdc_so(linked: bytes, relocatables) -> bytes:
    """An -rdc shared object as nvcc 13 lays it out: the device-linked container in
    .nv_fatbin (version-2 wrapper), each unit's relocatable container in __nv_relfatbin
    (version-1 wrappers), and the 24-byte wrapper records in .nvFatBinSegment (addresses equal
    file offsets here)."""
    import struct

    rel = b""
    rel_offsets = []
    nv_off = 64
    rel_start = nv_off + len(linked) + (-len(linked) % 8)
    for r in relocatables:
        rel_offsets.append(rel_start + len(rel))
        rel += r + b"\0" * (-len(r) % 8)
    records = struct.pack("<IIQQ", 0x466243B1, 2, nv_off, 0)
    records += b"".join(struct.pack("<IIQQ", 0x466243B1, 1, o, 0) for o in rel_offsets)
    return tiny_elf(
        [
            (".nv_fatbin", 1, linked + b"\0" * (-len(linked) % 8), 0),
            ("__nv_relfatbin", 1, rel, 0),
            (".nvFatBinSegment", 1, records, 0),
        ],
        addresses=True,
    )
