"""The libraries check: CUDA libraries shipped (static) and loaded (runtime, /proc/self/maps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from probes_helpers import ROOT, run_cli
from rbprobes import cudalibs
from rbprobes.checks_runtime import loaded_report
from rbprobes.checks_static import library_inventory


def load_then_check(libs, *cli_args, devices=None):
    """In a fresh interpreter: dlopen `libs` (as a system CUDA would be), then run the
    libraries check's command line without importing torch. `devices`: what libcuda is made
    to report (this machine has no GPU); None leaves it alone."""
    code = (
        "import ctypes, sys\n"
        "from rbprobes import driver\n"
        "if %r is not None:\n"
        "    driver.cuda_device_count = lambda: (%r, 'test')\n"
        "for lib in sys.argv[1:]:\n"
        "    ctypes.CDLL(lib)\n"
        "from rbprobes.cli import main\n"
        "sys.exit(main(%r))\n"
        % (devices, devices, ["libraries", "--module", "ctypes"] + list(cli_args))
    )
    done = subprocess.run(
        [sys.executable, "-c", code] + [str(lib) for lib in libs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout)


def test_system_cudart_shadowing_the_venv_is_caught(fake_libs, tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    rc, result = load_then_check(
        [fake_libs["12"]], "--venv", str(venv), "--expect-dir", str(tmp_path / "elsewhere")
    )
    assert rc == 1 and result["status"] == "fail"
    assert str(fake_libs["12"]) in result["reason"]
    assert "outside the expected dirs" in result["reason"]
    (loaded,) = [lib for lib in result["values"]["loaded"] if lib["lib"] == "libcudart"]
    assert loaded["cuda_major"] == 12 and loaded["expected_dir"] is False


def test_library_from_an_expected_dir_passes(fake_libs, tmp_path):
    rc, result = load_then_check(
        [fake_libs["12"]],
        "--venv",
        str(tmp_path),
        "--expect-dir",
        str(fake_libs["12"].parent),
        devices=1,
    )
    assert (rc, result["status"]) == (0, "pass"), result["reason"]
    assert result["values"]["loaded_majors"] == [12]


def test_without_cuda_nothing_is_proven(fake_libs, tmp_path):
    """No GPU (this machine): the check used to pass; it fails unless allow_skip."""
    args = ("--venv", str(tmp_path), "--expect-dir", str(fake_libs["12"].parent))
    rc, result = load_then_check([fake_libs["12"]], *args, devices=0)
    assert (rc, result["status"]) == (1, "fail")
    assert "no CUDA device" in result["reason"] and "allow_skip" in result["reason"]
    assert result["values"]["loaded_majors"] == [12]  # what was seen is still reported
    rc, result = load_then_check([fake_libs["12"]], *args, "--allow-skip")
    assert (rc, result["status"]) == (0, "skip") and "libcuda" in result["reason"]


def test_cuda_without_any_library_loaded_fails(tmp_path):
    rc, result = load_then_check([], "--venv", str(tmp_path), devices=1)
    assert rc == 1 and "no tracked CUDA library was loaded" in result["reason"]


def test_cuda_library_dirs_and_home_count_as_expected(fake_libs, tmp_path):
    rc, result = load_then_check(
        [fake_libs["12"]],
        "--venv",
        str(tmp_path),
        "--library-dir",
        str(fake_libs["12"].parent),
        devices=1,
    )
    assert rc == 0, result["reason"]
    rc, result = load_then_check(
        [fake_libs["12"]],
        "--venv",
        str(tmp_path),
        "--cuda-home",
        str(fake_libs["12"].parent),
        devices=1,
    )
    assert rc == 0, result["reason"]


def test_two_cuda_majors_loaded_together_fail(fake_libs, tmp_path):
    rc, result = load_then_check(
        [fake_libs["12"], fake_libs["13"]],
        "--venv",
        str(tmp_path),
        "--expect-dir",
        str(fake_libs["12"].parent),
    )
    assert rc == 1
    assert "CUDA majors 12+13 loaded together" in result["reason"]
    assert "libcudart.so.12" in result["reason"] and "libcudart.so.13" in result["reason"]
    assert result["values"]["foreign"] == []


def test_static_only_needs_no_imports(tmp_path):
    done = run_cli("libraries", "--venv", str(tmp_path), "--static-only")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["level"] == "L0"
    assert "runtime" not in result["values"]


def make_venv(root):
    """A venv-shaped tree with CUDA 13 wheels' layout plus CUDA 12 leftovers."""
    site = root / "lib" / "python3.12" / "site-packages"
    files = {
        "nvidia/cu13/lib/libcudart.so.13": b"",
        "nvidia/cu13/lib/libcublasLt.so.13": b"",
        "nvidia/cu13/lib/libcufft.so.12": b"",
        "nvidia/cudnn/lib/libcudnn.so.9": b"",
        "nvidia/cudnn/lib/libcudnn_graph.so.9": b"",
        "nvidia/nccl/lib/libnccl.so.2": b"",
        "torch/lib/libcudart-9a8b7c6d.so.12": b"",
        "torch/lib/libtorch_cuda.so": b"",
    }
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (site / "nvidia/cu13/lib/libcudart.so").symlink_to("libcudart.so.13")
    for dist, rels in (
        (
            "nvidia_cudnn_cu12-9.1.0.70",
            ["nvidia/cudnn/lib/libcudnn.so.9", "nvidia/cudnn/lib/libcudnn_graph.so.9"],
        ),
        ("nvidia_nccl_cu13-2.27.7", ["nvidia/nccl/lib/libnccl.so.2"]),
    ):
        info = site / (dist + ".dist-info")
        info.mkdir()
        (info / "RECORD").write_text("".join("%s,sha256=x,0\n" % r for r in rels))
    return site


def test_static_inventory_by_cuda_major(tmp_path):
    site = make_venv(tmp_path)
    inv = library_inventory(str(tmp_path))
    by_file = {
        lib["file"].split("site-packages/")[1]: (lib["lib"], lib["cuda_major"], lib["source"])
        for lib in inv["shipped"]
    }
    assert by_file == {
        "nvidia/cu13/lib/libcudart.so.13": ("libcudart", 13, "soname"),
        "nvidia/cu13/lib/libcublasLt.so.13": ("libcublasLt", 13, "soname"),
        "nvidia/cu13/lib/libcufft.so.12": ("libcufft", 13, "path"),
        "nvidia/cudnn/lib/libcudnn.so.9": ("libcudnn", 12, "dist:nvidia_cudnn_cu12-9.1.0.70"),
        "nvidia/cudnn/lib/libcudnn_graph.so.9": ("libcudnn", 12, "dist:nvidia_cudnn_cu12-9.1.0.70"),
        "nvidia/nccl/lib/libnccl.so.2": ("libnccl", 13, "dist:nvidia_nccl_cu13-2.27.7"),
        "torch/lib/libcudart-9a8b7c6d.so.12": ("libcudart", 12, "soname"),
    }
    assert inv["mixed"] and inv["cuda_majors"] == [12, 13]
    assert inv["majors_by_lib"]["libcudart"] == [12, 13]
    assert inv["not_shipped"] == ["libcublas", "libnvJitLink"]
    assert site.exists()


def test_mixed_venv_is_visible_in_the_check(tmp_path):
    make_venv(tmp_path)
    done = run_cli("libraries", "--venv", str(tmp_path), "--static-only")
    result = json.loads(done.stdout)
    assert "venv ships CUDA majors 12+13" in result["reason"]
    assert "libcudart: 12/13" in result["reason"]


def test_soname_inside_the_file_tells_the_major(fake_libs, tmp_path):
    plain = tmp_path / "libcudart.so"
    plain.write_bytes(fake_libs["13"].read_bytes())
    assert cudalibs.cuda_major(str(plain)) == (13, "elf-soname")


@pytest.mark.parametrize(
    "name, family",
    [
        ("libcudart.so.12", "libcudart"),
        ("libcublasLt.so.13.0.1", "libcublasLt"),
        ("libcublas.so", "libcublas"),
        ("libcudnn_ops.so.9", "libcudnn"),
        ("libnvJitLink.so.13", "libnvJitLink"),
        ("libnccl.so.2", "libnccl"),
        ("libcudart_static.a", None),
        ("libcudart.so.12.bak", None),
        ("libtorch_cuda.so", None),
    ],
)
def test_family(name, family):
    assert cudalibs.family(name) == family


def test_maps_parsing_and_report():
    maps = "\n".join(
        [
            "7f00-7f10 r-xp 00000000 08:01 1 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/"
            "libcublas.so.13",
            "7f10-7f20 r--p 00010000 08:01 1 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/"
            "libcublas.so.13",
            "7f20-7f30 r-xp 00000000 08:01 2 /usr/local/cuda-12.8/lib64/libcudart.so.12 (deleted)",
            "7f30-7f40 rw-p 00000000 00:00 0 ",
            "7f40-7f50 r-xp 00000000 08:01 3 /usr/lib/libc.so.6",
        ]
    )
    report = loaded_report(maps, ["/venv"])
    assert [(lib["lib"], lib["cuda_major"]) for lib in report["loaded"]] == [
        ("libcublas", 13),
        ("libcudart", 12),
    ]
    assert report["foreign"] == ["/usr/local/cuda-12.8/lib64/libcudart.so.12"]
    assert report["loaded_majors"] == [12, 13]


def test_venv_reached_through_a_symlink_is_expected(tmp_path):
    real = tmp_path / "real"
    (real / "lib").mkdir(parents=True)
    (real / "lib" / "libcudart.so.13").write_bytes(b"")
    link = tmp_path / "link"
    os.symlink(real, link)
    maps = "1-2 r-xp 0 0:0 1 %s/lib/libcudart.so.13" % real
    assert loaded_report(maps, [str(link)])["foreign"] == []


def test_library_path_first_is_relative_to_site_packages(tmp_path):
    from rbprobes.checks_runtime import _expected_dirs
    from rbprobes.result import Context

    site = make_venv(tmp_path)
    ctx = Context(
        cuda={
            "home": "/usr/local/cuda-13.0",
            "library_dirs": ["/opt/extra"],
            "library_path_first": ["nvidia/cu13/lib"],
        }
    )
    dirs = _expected_dirs({"expect_dirs": ["/srv/mine"]}, ctx, str(tmp_path))
    assert dirs == [
        str(tmp_path),
        "/opt/extra",
        str(site / "nvidia/cu13/lib"),
        "/usr/local/cuda-13.0",
        "/srv/mine",
    ]
