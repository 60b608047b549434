"""Fixtures for the probes tests: real fatbins built by nvcc, fake CUDA libraries built by gcc."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probes_helpers import FATBIN_BUILDS, KERNEL, SOURCES, need  # noqa: E402


@pytest.fixture(scope="session")
def fatbins(tmp_path_factory):
    """{name: path of a .so} built by nvcc once per session, in parallel."""
    nvcc = need("nvcc", "the fatbin tests build real CUDA shared objects")
    out = tmp_path_factory.mktemp("fatbins")
    src = out / "kernel.cu"
    src.write_text(KERNEL)

    def build(item):
        name, args = item
        unit = src
        if name in SOURCES:
            unit = out / ("%s.cu" % name)
            unit.write_text(SOURCES[name])
        target = out / ("lib%s.so" % name)
        cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", str(unit), "-o", str(target)] + args
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError("%s failed:\n%s" % (" ".join(cmd), done.stderr))
        return name, target

    def build_partial(_):
        # Two translation units compiled apart (sm_90, sm_120), linked by the host linker only:
        # one file, two modules, each with code for one arch.
        objects = []
        for i, gencode in enumerate(("arch=compute_90,code=sm_90", "arch=compute_120,code=sm_120")):
            unit = out / ("unit%d.cu" % i)
            unit.write_text(KERNEL.replace("add_one", "add_one_%d" % i))
            obj = out / ("unit%d.o" % i)
            subprocess.run(
                [nvcc, "-c", "-Xcompiler", "-fPIC", "-gencode", gencode, str(unit), "-o", str(obj)],
                check=True,
                capture_output=True,
                timeout=300,
            )
            objects.append(str(obj))
        target = out / "libpartial.so"
        subprocess.run(
            ["gcc", "-shared"] + objects + ["-o", str(target)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return "partial", target

    jobs = [(build, item) for item in FATBIN_BUILDS.items()] + [(build_partial, None)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        built = dict(pool.map(lambda job: job[0](job[1]), jobs))
    return built


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory):
    """Fake CUDA runtimes: {"12": path of libcudart.so.12, "13": ...} in a "system" dir."""
    gcc = need("gcc", "the library tests build fake libcudart.so files")
    out = tmp_path_factory.mktemp("system-cuda")
    src = out / "fake.c"
    src.write_text("int cudaRuntimeGetVersion(int *v) { *v = 12080; return 0; }\n")
    libs = {}
    for major in ("12", "13"):
        target = out / ("libcudart.so.%s" % major)
        subprocess.run(
            [
                gcc,
                "-shared",
                "-fPIC",
                "-Wl,-soname,libcudart.so.%s" % major,
                str(src),
                "-o",
                str(target),
            ],
            check=True,
            timeout=120,
        )
        libs[major] = target
    return libs
