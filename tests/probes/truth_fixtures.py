"""GPU code with known verdicts for sm_90, built by nvcc: the audit's ground truth.

    python tests/probes/truth_fixtures.py OUTDIR [--nvcc PATH] [--jobs N]

Builds shared objects (each kernel with an exported host wrapper `rb_launch_<kernel>` that
launches it, checks what it wrote and returns the CUDA error code, -1 for wrong output), a
standalone cubin and fatbins, and writes OUTDIR/manifest.json: for every file its kernels
(symbol name, wrapper) and whether each is expected to launch on an sm_90 device whose driver
JITs PTX ISA <= 9.0 (the H200's 580 driver, CUDA 13.0). `launch_all.py` launches them there;
`test_probes_truth.py` checks the audit against EXPECTED here, without a GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional

KERNEL = r"""
#include <cuda_runtime.h>
%(ns_open)s__global__ void %(kernel)s(int *p) { p[threadIdx.x] = 42 + threadIdx.x; }%(ns_close)s
extern "C" int rb_launch_%(kernel)s(void) {
  int *d = 0;
  int h[32];
  cudaError_t e = cudaMalloc(&d, sizeof h);
  if (e) return (int)e;
  %(qual)s%(kernel)s<<<1, 32>>>(d);
  e = cudaGetLastError();
  if (!e) e = cudaDeviceSynchronize();
  if (!e) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e) return (int)e;
  for (int i = 0; i < 32; i++) if (h[i] != 42 + i) return -1;
  return 0;
}
"""

# A device-code-only source for cubins, PTX and fatbins (launched through the driver API).
DEVICE_ONLY = (
    'extern "C" __global__ void %(kernel)s(int *p) { p[threadIdx.x] = 42 + threadIdx.x; }\n'
)


def gencode(*pairs: str) -> List[str]:
    """gencode("90:sm_90", "80:compute_80") -> -gencode arch=compute_90,code=sm_90 ..."""
    out = []
    for pair in pairs:
        virt, code = pair.split(":")
        out += ["-gencode", "arch=compute_%s,code=%s" % (virt, code)]
    return out


ZSTD = ["-Xfatbin", "-compress-all"]
LZ4 = ["-Xfatbin", "-compress-all", "-compress-mode=speed"]


class Unit(NamedTuple):
    kernel: str
    args: List[str]  # nvcc code-generation arguments of this translation unit
    expect: bool  # launches on sm_90 (driver PTX ISA <= 9.0)
    mangled: bool = False  # a C++ kernel in namespace rb (symbol _ZN2rb...EPi)


class Fixture(NamedTuple):
    name: str
    units: List[Unit]
    how: str = "so"  # "so" (nvcc -shared), "rdc" (-rdc units device-linked with link_args),
    #                  "cubin", "fatbin", "ptxfatbin" (PTX with its .version raised to ptx_isa)
    link_args: Optional[List[str]] = None
    ptx_isa: Optional[str] = None


FIXTURES = [
    Fixture("sass90", [Unit("k_sass90", gencode("90:sm_90"), True)]),
    Fixture("sass90a", [Unit("k_sass90a", gencode("90a:sm_90a"), True)]),
    Fixture("ptx80", [Unit("k_ptx80", gencode("80:compute_80"), True)]),
    Fixture("ptx100", [Unit("k_ptx100", gencode("100:compute_100"), False)]),
    Fixture("sass80", [Unit("k_sass80", gencode("80:sm_80"), False, mangled=True)]),
    Fixture("sass80_ptx80", [Unit("k_sass80_ptx80", gencode("80:sm_80", "80:compute_80"), True)]),
    Fixture("sass100_120", [Unit("k_sass100_120", gencode("100:sm_100", "120:sm_120"), False)]),
    Fixture("zstd90", [Unit("k_zstd90", gencode("90:sm_90") + ZSTD, True)]),
    Fixture("lz4_90", [Unit("k_lz4_90", gencode("90:sm_90") + LZ4, True)]),
    Fixture("zstd80", [Unit("k_zstd80", gencode("80:sm_80") + ZSTD, False)]),
    Fixture("lz4_80", [Unit("k_lz4_80", gencode("80:sm_80") + LZ4, False)]),
    Fixture(
        "multi",
        [
            Unit("k_multi_ok", gencode("90:sm_90"), True),
            Unit("k_multi_bad", gencode("80:sm_80"), False),
        ],
    ),
    Fixture(
        "multi_zstd",
        [
            Unit("k_multiz_ok", gencode("90:sm_90") + ZSTD, True),
            Unit("k_multiz_bad", gencode("80:sm_80") + ZSTD, False),
        ],
    ),
    # a unit of arch-specific code for another arch: it cannot launch here, and the audit
    # lists it without failing the file (dispatch by design); alone in a file, it fails
    Fixture(
        "multi_a",
        [
            Unit("k_multia_ok", gencode("90:sm_90"), True),
            Unit("k_multia_100a", gencode("100a:sm_100a"), False),
        ],
    ),
    Fixture("sass100a", [Unit("k_sass100a", gencode("100a:sm_100a"), False)]),
    Fixture(
        "multi_ptx",
        [
            Unit("k_multip_ok", gencode("80:compute_80"), True),
            Unit("k_multip_bad", gencode("100:compute_100", "80:sm_80"), False),
        ],
    ),
    # -rdc: the units' kernels live in the device-linked cubin (SASS for the link's archs
    # only); their relocatable SASS and PTX sit in __nv_relfatbin. On the H200, when the
    # linked cubin does not fit, the runtime falls back to each relocatable unit on its own:
    # its SASS if that runs, else its PTX through the JIT (rdc80 runs on sm_90; in
    # rdc80_mixed only the unit with PTX runs; rdc80_sass90 runs from relocatable sm_90 SASS).
    Fixture(
        "rdc90",
        [
            Unit("k_rdc90_a", gencode("90:sm_90", "90:compute_90"), True),
            Unit("k_rdc90_b", gencode("90:sm_90", "90:compute_90"), True),
        ],
        how="rdc",
        link_args=gencode("90:sm_90"),
    ),
    Fixture(
        "rdc80",
        [
            Unit("k_rdc80_a", gencode("80:sm_80", "80:compute_80"), True),
            Unit("k_rdc80_b", gencode("80:sm_80", "80:compute_80"), True),
        ],
        how="rdc",
        link_args=gencode("80:sm_80"),
    ),
    Fixture(
        "rdc80_mixed",
        [
            Unit("k_rdcm_a", gencode("80:sm_80", "80:compute_80"), True),
            Unit("k_rdcm_b", gencode("80:sm_80"), False),
        ],
        how="rdc",
        link_args=gencode("80:sm_80"),
    ),
    Fixture(
        "rdc80_sass90",
        [
            Unit("k_rdcs_a", gencode("80:sm_80", "90:sm_90"), True),
            Unit("k_rdcs_b", gencode("80:sm_80", "90:sm_90"), True),
        ],
        how="rdc",
        link_args=gencode("80:sm_80"),
    ),
    Fixture("cubin90", [Unit("k_cubin90", ["-arch", "sm_90"], True)], how="cubin"),
    Fixture("cubin80", [Unit("k_cubin80", ["-arch", "sm_80"], False)], how="cubin"),
    Fixture("fatbin_ptx80", [Unit("k_fatbin_ptx80", gencode("80:compute_80"), True)], how="fatbin"),
    Fixture(
        "ptx91", [Unit("k_ptx91", ["-arch", "compute_80"], False)], how="ptxfatbin", ptx_isa="9.1"
    ),
]


def file_name(f: Fixture) -> str:
    return {"cubin": "%s.cubin", "fatbin": "%s.fatbin", "ptxfatbin": "%s.fatbin"}.get(
        f.how, "lib%s.so"
    ) % f.name


def symbol(u: Unit) -> str:
    return "_ZN2rb%d%sEPi" % (len(u.kernel), u.kernel) if u.mangled else u.kernel


def source(u: Unit, device_only: bool = False) -> str:
    if device_only:
        return DEVICE_ONLY % {"kernel": u.kernel}
    return KERNEL % {
        "kernel": u.kernel,
        "ns_open": "namespace rb { " if u.mangled else 'extern "C" ',
        "ns_close": " }" if u.mangled else "",
        "qual": "rb::" if u.mangled else "",
    }


def _run(cmd: List[str], cwd: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), done.stderr[-3000:]))


def build_one(f: Fixture, out: str, nvcc: str) -> str:
    """Build one fixture into `out`; returns its file name."""
    work = os.path.join(out, "src", f.name)
    os.makedirs(work, exist_ok=True)
    target = os.path.join(out, file_name(f))
    fatbinary = os.path.join(os.path.dirname(nvcc), "fatbinary")
    device_only = f.how in ("cubin", "fatbin", "ptxfatbin")
    objects = []
    for u in f.units:
        cu = os.path.join(work, u.kernel + ".cu")
        with open(cu, "w") as fh:
            fh.write(source(u, device_only))
        if f.how == "cubin":
            _run([nvcc, "-cubin"] + u.args + [cu, "-o", target], work)
        elif f.how == "fatbin":
            _run([nvcc, "-fatbin"] + u.args + [cu, "-o", target], work)
        elif f.how == "ptxfatbin":
            ptx = os.path.join(work, u.kernel + ".ptx")
            _run([nvcc, "-ptx"] + u.args + [cu, "-o", ptx], work)
            with open(ptx) as fh:
                text = fh.read()
            lines = [
                ".version %s" % f.ptx_isa if line.startswith(".version ") else line
                for line in text.splitlines()
            ]
            arch_num = [a for a in u.args if a.startswith("compute_")][0].split("_")[1]
            with open(ptx, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            _run(
                [
                    fatbinary,
                    "--create=" + target,
                    "--64",
                    "--image3=kind=ptx,sm=%s,file=%s" % (arch_num, ptx),
                ],
                work,
            )
        else:
            obj = os.path.join(work, u.kernel + ".o")
            rdc = ["-rdc=true"] if f.how == "rdc" else []
            _run([nvcc, "-c", "-Xcompiler", "-fPIC"] + rdc + u.args + [cu, "-o", obj], work)
            objects.append(obj)
    if objects:
        _run([nvcc, "-shared"] + (f.link_args or []) + objects + ["-o", target], work)
    return file_name(f)


def manifest() -> Dict[str, Dict[str, object]]:
    """{file: {"how", "kernels": [{"kernel", "symbol", "wrapper", "expect"}]}}."""
    out = {}
    for f in FIXTURES:
        out[file_name(f)] = {
            "fixture": f.name,
            "how": f.how,
            "kernels": [
                {
                    "kernel": u.kernel,
                    "symbol": symbol(u),
                    "wrapper": None
                    if f.how in ("cubin", "fatbin", "ptxfatbin")
                    else "rb_launch_" + u.kernel,
                    "expect": u.expect,
                }
                for u in f.units
            ],
        }
    return out


# What each kernel does on sm_90 (launched on the H200; see docs/probes.md).
EXPECTED = {k["symbol"]: k["expect"] for entry in manifest().values() for k in entry["kernels"]}


def find_nvcc(given: Optional[str] = None) -> Optional[str]:
    for c in (
        given,
        shutil.which("nvcc"),
        os.environ.get("CUDA_HOME", "") + "/bin/nvcc",
        "/usr/local/cuda/bin/nvcc",
        "/usr/local/cuda-13.0/bin/nvcc",
    ):
        if c and os.access(c, os.X_OK):
            return c
    return None


def build_all(out: str, nvcc: str, jobs: int = 2) -> Dict[str, Dict[str, object]]:
    os.makedirs(out, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda f: build_one(f, out, nvcc), FIXTURES))
    doc = manifest()
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--nvcc")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    nvcc = find_nvcc(args.nvcc)
    if not nvcc:
        sys.stderr.write("nvcc not found\n")
        return 2
    build_all(args.out, nvcc, args.jobs)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def audit_verdicts(
    values: Dict[str, object], doc: Dict[str, Dict[str, object]]
) -> Dict[str, Optional[bool]]:
    """kernel symbol -> what kernel_audit's values say: True (its unit has a path), False (it
    is named in a unit without a path), None (the audit does not say: file not seen, or the
    unit's kernels were not read)."""
    files = {f["path"]: f for f in values["files"]}
    out: Dict[str, Optional[bool]] = {}
    for name, entry in doc.items():
        info = files.get(name)
        named, unknown = set(), False
        for m in (info or {}).get("missing", []) + (info or {}).get("arch_specific", []):
            named.update(m.get("kernels") or [])
            unknown = unknown or not m.get("kernels_complete", False)
        for k in entry["kernels"]:
            if info is None or info.get("verdict") == "unreadable":
                out[k["symbol"]] = None
            elif k["symbol"] in named:
                out[k["symbol"]] = False
            else:
                out[k["symbol"]] = None if unknown else True
    return out
