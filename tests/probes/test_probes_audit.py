"""kernel_audit unit by unit, on hand-made images (no nvcc, no gcc): each fatbin container is
judged on its own, with its kernels named; unreadable, LTO-only and unknown entries fail; the
LZ4 decoder is bounded; a FIFO does not hang the walk; the driver's PTX limit is read."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from probes_helpers import (
    ROOT,
    fatbin_container,
    fatbin_entry,
    lz4_literals,
    tiny_cubin,
    tiny_ptx,
    tiny_rdc_so,
    tiny_so,
    zstd_raw_frame,
)
from rbprobes import arch, decompress, driver, fatbin, run_check
from rbprobes.checks_static import audit
from rbprobes.result import Context

LZ4 = 0x2011
ZSTD = 0x8011


def sass(number, kernels, flags=0x11):
    return fatbin_entry(2, number, flags, tiny_cubin(kernels, number))


def audit_check(path, **params):
    params.setdefault("arch", "sm_90")
    params.setdefault("driver_ptx_max", "none")
    return run_check({"type": "kernel_audit", "params": params}, Context(venv=str(path)))


def two_units(tmp_path, name="libtwo.so", where=""):
    path = tmp_path / where / name if where else tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        tiny_so(
            fatbin_container(sass(90, ["good_kernel"]))
            + fatbin_container(sass(80, ["_Z10bad_kernelPi", "other_bad"]))
        )
    )
    return path


def test_each_container_is_judged_on_its_own(tmp_path):
    """The old rule passed this file (some unit had sm_90): the sm_80 unit's kernels would fail
    to launch."""
    path = two_units(tmp_path)
    result = audit_check(path)
    assert result["status"] == "fail"
    assert "libtwo.so" in result["reason"] and "_Z10bad_kernelPi" in result["reason"]
    assert "good_kernel" not in result["reason"]
    (info,) = result["values"]["files"]
    assert info["verdict"] == "partial" and info["units"] == 2
    (missing,) = info["missing"]
    assert missing["kernels"] == ["_Z10bad_kernelPi", "other_bad"]
    assert missing["archs"] == ["sm_80"] and missing["unit"].startswith(".nv_fatbin+0x")
    assert result["values"]["failing"] == ["libtwo.so"]


def test_vendor_libraries_are_a_note_unless_strict(tmp_path):
    path = two_units(tmp_path, where="lib/python3.12/site-packages/nvidia/foo/lib")
    ok = audit_check(tmp_path)
    assert ok["status"] == "pass", ok["reason"]
    assert "partial_ok" in ok["reason"] and "libtwo.so (1 of 2 units)" in ok["reason"]
    rel = os.path.relpath(path, tmp_path)
    assert ok["values"]["partial_waived"] == [rel]
    assert ok["values"]["files"][0]["waived_by"] == "nvidia/*"
    assert audit_check(tmp_path, strict=True)["status"] == "fail"
    assert audit_check(tmp_path, partial_ok=[])["status"] == "fail"
    assert audit_check(tmp_path, partial_ok=["*/foo/lib/*"])["status"] == "pass"


def test_a_vendor_library_with_no_unit_for_the_target_fails(tmp_path):
    path = tmp_path / "nvidia" / "x" / "libonly80.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(tiny_so(fatbin_container(sass(80, ["k80"]))))
    result = audit_check(tmp_path)
    assert result["status"] == "fail" and "no unit has a path to sm_90" in result["reason"]


def test_arch_specific_units_for_other_archs_are_listed_not_failed(tmp_path):
    """A unit of sm_100a/sm_100f code only is built for those archs' own features: a library
    calls it only there. On sm_90 it is listed; strict counts it; alone it fails."""
    path = tmp_path / "libdispatch.so"
    path.write_bytes(
        tiny_so(
            fatbin_container(sass(90, ["generic"]))
            + fatbin_container(
                sass(100, ["tcgen05_gemm"], 0x100011), sass(103, ["tcgen05_gemm"], 0x100011)
            )
            + fatbin_container(sass(100, ["fam"], 0x200011))
        )
    )
    result = audit_check(path)
    assert result["status"] == "pass", result["reason"]
    (info,) = result["values"]["files"]
    assert info["units_arch_specific"] == 2 and info["arch_specific_archs"] == [
        "sm_100a",
        "sm_100f",
        "sm_103a",
    ]
    assert info["arch_specific"][0]["kernels"] == ["tcgen05_gemm"]
    assert "arch-specific units" in result["reason"]
    assert result["values"]["arch_specific"] == ["libdispatch.so"]
    assert audit_check(path, strict=True)["status"] == "fail"
    alone = tmp_path / "libonly100a.so"
    alone.write_bytes(tiny_so(fatbin_container(sass(100, ["k100a"], 0x100011))))
    result = audit_check(alone)
    assert result["status"] == "fail" and "no unit has a path" in result["reason"]
    mixed = tmp_path / "libmixed.so"  # plain sm_80 beside sm_100a in one unit: not specific
    mixed.write_bytes(
        tiny_so(
            fatbin_container(sass(90, ["ok"]))
            + fatbin_container(sass(80, ["old"]), sass(100, ["old"], 0x100011))
        )
    )
    assert audit_check(mixed)["status"] == "fail"


@pytest.mark.parametrize(
    "units, runs",
    [
        # (entries of each relocatable unit, which kernels the runtime loads on sm_90: H200)
        ([[("ptx", 80)], [("ptx", 80)]], {"ka", "kb"}),
        ([[("ptx", 80)], [("sass", 80)]], {"ka"}),
        ([[("sass", 90)], [("sass", 90)]], {"ka", "kb"}),
        ([[("sass", 80)], [("sass", 80)]], set()),
    ],
)
def test_rdc_units_are_judged_on_their_own_when_the_link_does_not_fit(tmp_path, units, runs):
    """-rdc linked for sm_80: on sm_90 the runtime falls back to each relocatable unit, its
    SASS if it runs, else its PTX (what the H200 did with librdc80*.so)."""

    def entry(kind, number, kernel):
        if kind == "ptx":
            return fatbin_entry(1, number, payload=tiny_ptx([kernel], "9.0"), version=(9, 0))
        return sass(number, [kernel])

    linked = fatbin_container(sass(80, ["ka", "kb"]))
    rel = [
        fatbin_container(*[entry(k, n, name) for k, n in u]) for u, name in zip(units, ["ka", "kb"])
    ]
    path = tmp_path / "librdc.so"
    path.write_bytes(tiny_rdc_so(linked, rel))
    scan = fatbin.scan_file(str(path))
    assert [c.wrapper for c in scan.containers] == [2, 1, 1]
    result = audit_check(path, driver_ptx_max="9.0")
    (info,) = result["values"]["files"]
    lacking = {k for m in info["missing"] for k in m["kernels"]}
    assert lacking == {"ka", "kb"} - runs
    assert result["status"] == ("pass" if runs == {"ka", "kb"} else "fail")
    fits = audit_check(path, arch="sm_86")  # the linked sm_80 cubin runs on 8.6: one unit
    assert fits["status"] == "pass" and fits["values"]["files"][0]["units"] == 1


def test_lto_only_units_fail_with_the_reason(tmp_path):
    """LTO-IR is nvJitLink input, never loaded: it used to count as "no kernel" (a pass)."""
    only = tmp_path / "liblto.so"
    only.write_bytes(tiny_so(fatbin_container(fatbin_entry(8, 90))))
    result = audit_check(only)
    assert result["status"] == "fail" and "only LTO-IR (lto_90)" in result["reason"]
    mixed = tmp_path / "libmixed.so"
    mixed.write_bytes(
        tiny_so(fatbin_container(sass(90, ["k"])) + fatbin_container(fatbin_entry(8, 90)))
    )
    result = audit_check(mixed)
    assert result["status"] == "fail" and "only LTO-IR" in result["reason"]


def test_entries_of_unknown_kind_fail(tmp_path):
    path = tmp_path / "libodd.so"
    path.write_bytes(tiny_so(fatbin_container(sass(90, ["k"]), fatbin_entry(7, 90))))
    result = audit_check(path)
    assert result["status"] == "fail" and "kind7_90" in result["reason"]
    assert result["values"]["unknown_kinds"] == ["libodd.so"]
    only = tmp_path / "libodd2.so"
    only.write_bytes(tiny_so(fatbin_container(fatbin_entry(7, 90))))
    assert audit_check(only)["status"] == "fail"


def test_truncated_elf_is_unreadable_not_free_of_gpu_code(tmp_path):
    data = tiny_so(fatbin_container(sass(90, ["k"])))
    path = tmp_path / "libcut.so"
    path.write_bytes(data[: len(data) - 100])  # the section table is at the end
    result = audit_check(path)
    assert result["status"] == "fail" and "unreadable" in result["reason"]
    assert "truncated" in result["reason"] and result["values"]["unreadable"] == ["libcut.so"]


def test_fatbin_section_outside_the_file_is_unreadable(tmp_path):
    data = bytearray(tiny_so(fatbin_container(sass(90, ["k"]))))
    (shoff,) = struct.unpack_from("<Q", data, 40)
    # section 1 (.nv_fatbin): its sh_offset at byte 24 of the entry
    struct.pack_into("<Q", data, shoff + 64 + 24, len(data) + 4096)
    path = tmp_path / "libout.so"
    path.write_bytes(bytes(data))
    result = audit_check(path)
    assert result["status"] == "fail" and "lies outside the file" in result["reason"]


def test_image_without_a_section_table_is_searched(tmp_path):
    data = bytearray(tiny_so(fatbin_container(sass(80, ["k80"]))))
    struct.pack_into("<QIHHHHHH", data, 40, 0, 0, 64, 0, 0, 0, 0, 0)  # e_shoff = 0, no sections
    path = tmp_path / "libstripped.so"
    path.write_bytes(bytes(data))
    scan = fatbin.scan_file(str(path))
    assert [e.name for e in scan.entries] == ["sm_80"]
    result = audit_check(path)
    assert result["status"] == "fail" and "k80" in result["reason"]


def test_ptx_kernels_are_named(tmp_path):
    path = tmp_path / "libptx.so"
    path.write_bytes(
        tiny_so(
            fatbin_container(
                fatbin_entry(
                    1, 100, payload=tiny_ptx(["ptx_kernel"], "9.0", "sm_100"), version=(9, 0)
                )
            )
        )
    )
    result = audit_check(path)
    assert result["status"] == "fail" and "ptx_kernel" in result["reason"]


def test_lz4_units_are_decoded_for_their_kernels(tmp_path):
    cubin = tiny_cubin(["lz4_kernel"], 80)
    entry = fatbin_entry(2, 80, LZ4, lz4_literals(cubin), usize=len(cubin))
    path = tmp_path / "liblz4.so"
    path.write_bytes(tiny_so(fatbin_container(entry)))
    result = audit_check(path)
    assert result["status"] == "fail" and "lz4_kernel" in result["reason"]


def test_lz4_bomb_fails_fast_as_unreadable(tmp_path):
    """#15 L1: a 412 KB payload that expands without end (one literal, then a match whose
    length runs on in 255s) took 6.8 s and 117 MB; now it stops at the declared size."""
    bomb = bytes([0x1F]) + b"a" + struct.pack("<H", 1) + b"\xff" * (412 << 10)
    entry = fatbin_entry(2, 80, LZ4, bomb, usize=4096)
    path = tmp_path / "libbomb.so"
    path.write_bytes(tiny_so(fatbin_container(entry)))
    start = time.monotonic()
    result = audit_check(path)
    assert time.monotonic() - start < 5
    assert result["status"] == "fail" and "unreadable" in result["reason"]
    assert "exceeds the declared" in result["reason"]


def test_lz4_block_decoder_bounds():
    block = bytes([0x44]) + b"abcd" + struct.pack("<H", 4) + bytes([0x10]) + b"!"
    assert decompress.lz4_block_decompress(block, 13) == b"abcdabcdabcd!"
    long_run = bytes([0x1F]) + b"z" + struct.pack("<H", 1) + bytes([200])
    assert decompress.lz4_block_decompress(long_run, 1 + 15 + 4 + 200) == b"z" * 220
    with pytest.raises(decompress.Unreadable, match="exceeds the declared"):
        decompress.lz4_block_decompress(block, 12)
    with pytest.raises(decompress.Unreadable, match="offset"):
        decompress.lz4_block_decompress(bytes([0x10]) + b"a" + struct.pack("<H", 9), 10)
    with pytest.raises(decompress.Unreadable, match="truncated"):
        decompress.lz4_block_decompress(bytes([0x50]) + b"ab", 10)
    with pytest.raises(decompress.Unreadable, match="truncated"):
        decompress.lz4_block_decompress(bytes([0x14]) + b"a" + b"\x01", 10)
    with pytest.raises(decompress.Unreadable, match="cap"):
        decompress.lz4_block_decompress(b"", decompress.ENTRY_CAP + 1)


@pytest.mark.skipif(
    decompress.zstd_decoder() is None,
    reason="no zstd decoder on this host (compression.zstd, zstandard or libzstd.so.1)",
)
def test_zstd_units_are_decoded_within_their_declared_size(tmp_path):
    cubin = tiny_cubin(["zstd_kernel"], 80)
    frame = zstd_raw_frame(cubin)
    good = tmp_path / "libz.so"
    good.write_bytes(tiny_so(fatbin_container(fatbin_entry(2, 80, ZSTD, frame, usize=len(cubin)))))
    assert "zstd_kernel" in audit_check(good)["reason"]
    liar = tmp_path / "libzliar.so"
    liar.write_bytes(tiny_so(fatbin_container(fatbin_entry(2, 80, ZSTD, frame, usize=100))))
    result = audit_check(liar)
    assert result["status"] == "fail" and "unreadable" in result["reason"]


def test_compressed_entry_without_declared_size_is_unreadable(tmp_path):
    cubin = tiny_cubin(["k"], 80)
    path = tmp_path / "libnosize.so"
    path.write_bytes(
        tiny_so(fatbin_container(fatbin_entry(2, 80, LZ4, lz4_literals(cubin), usize=0)))
    )
    result = audit_check(path)
    assert result["status"] == "fail" and "declares no uncompressed size" in result["reason"]


def test_a_fifo_named_like_a_library_does_not_hang_the_audit(tmp_path):
    """The old walk opened every *.so with a blocking open(): a FIFO hung it for good."""
    venv = tmp_path / "venv"
    venv.mkdir()
    os.mkfifo(str(venv / "libtrap.so"))
    (venv / "libreal.so").write_bytes(tiny_so(fatbin_container(sass(90, ["k"]))))
    code = (
        "import json, sys; from rbprobes.checks_static import audit; "
        "print(json.dumps(audit(sys.argv[1], (9, 0))))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "hostkit"))
    done = subprocess.run(
        [sys.executable, "-c", code, str(venv)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    import json

    values = json.loads(done.stdout)
    assert values["skipped_not_regular"] == [str(venv / "libtrap.so")]
    assert values["gpu_files"] == 1 and values["failing"] == []
    assert fatbin.scan_file(str(venv / "libtrap.so")).kind == "not-regular"


def test_links_are_not_followed_in_a_walk(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libbad.so").write_bytes(tiny_so(fatbin_container(sass(80, ["k"]))))
    venv = tmp_path / "venv"
    venv.mkdir()
    os.symlink(str(outside / "libbad.so"), str(venv / "libbad.so"))
    os.symlink(str(outside), str(venv / "linkdir"))
    values = audit(str(venv), (9, 0))
    assert values["files_scanned"] == 0 and values["failing"] == []


@pytest.mark.parametrize(
    "version, cuda",
    [
        ("580.159.04", "13.0"),
        ("580.65.06", "13.0"),
        ("575.57.08", "12.9"),
        ("570.124.06", "12.8"),
        ("560.35.03", "12.6"),
        ("535.104.05", "12.2"),
        ("470.256.02", "11.4"),
        ("440.33", None),
        ("590.44.01", "13.1"),
        ("not a version", None),
    ],
)
def test_driver_version_to_cuda(version, cuda):
    assert driver.cuda_for_driver(version) == cuda


@pytest.mark.parametrize(
    "cuda, isa",
    [
        ("13.0", (9, 0)),
        ("13.1", (9, 1)),
        ("12.9", (8, 8)),
        ("12.8", (8, 7)),
        ("12.6", (8, 5)),
        ("12.4", (8, 4)),
        ("11.8", (7, 8)),
        ("14.0", None),
    ],
)
def test_cuda_to_newest_ptx_isa(cuda, isa):
    assert driver.ptx_max_for_cuda(cuda) == isa


def test_the_hosts_driver_limits_ptx_by_default(tmp_path, monkeypatch):
    """PTX the driver cannot JIT was only a note unless driver_ptx_max was given: the host's
    driver is now read (here a 575 driver: CUDA 12.9, PTX ISA <= 8.8)."""
    path = tmp_path / "libptx90.so"
    path.write_bytes(
        tiny_so(
            fatbin_container(
                fatbin_entry(1, 80, payload=tiny_ptx(["jit_me"], "9.0"), version=(9, 0))
            )
        )
    )
    old = driver.HostDriver("575.57.08", "12.9", "libcuda", (8, 8))
    monkeypatch.setattr(driver, "host_driver", lambda: old)
    params = {"type": "kernel_audit", "params": {"arch": "sm_90"}}
    result = run_check(params, Context(venv=str(path)))
    assert result["status"] == "fail", result["reason"]
    assert "ISA 9.0, the driver JITs up to 8.8" in result["reason"] and "jit_me" in result["reason"]
    assert result["values"]["driver"]["cuda"] == "12.9"
    new = driver.HostDriver("580.159.04", "13.0", "libcuda", (9, 0))
    monkeypatch.setattr(driver, "host_driver", lambda: new)
    result = run_check(params, Context(venv=str(path)))
    assert result["status"] == "pass" and "ISA 9.0 <= 9.0" in result["reason"]
    monkeypatch.setattr(driver, "host_driver", lambda: driver.HostDriver(None, None, None, None))
    result = run_check(params, Context(venv=str(path)))
    assert result["status"] == "pass" and "not checked" in result["reason"]


def test_arch_runs_on_is_unchanged():
    assert arch.runs_on("ptx", 80, "", (9, 0), (9, 0), (9, 0))
    assert not arch.runs_on("ptx", 80, "", (9, 0), (9, 1), (9, 0))
