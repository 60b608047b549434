"""The pure-Python fatbin reader and the kernel_audit check, on fatbins nvcc built just now."""

from __future__ import annotations

import json
import marshal
import shutil
import struct
import subprocess
import sys

import pytest
from probes_helpers import ROOT, c_array, cli_json, fatbin_container, fatbin_entry, need, run_cli
from rbprobes import checks_static, decompress, elf, fatbin, run_check
from rbprobes.checks_static import audit, file_verdict
from rbprobes.result import Context


def names(path):
    return sorted(e.name for e in fatbin.scan_file(str(path)).entries)


@pytest.mark.parametrize(
    "build, expected",
    [
        ("nokernel", {"sm_75"}),
        ("nokernel_zstd", {"sm_75"}),
        ("sm120", {"sm_120"}),
        ("sm100a", {"sm_100a"}),
        ("sm100f", {"sm_100f"}),
        ("ptx100", {"compute_100"}),
        ("sm90", {"sm_90"}),
        ("compressed", {"sm_90", "sm_103", "compute_90"}),
        ("lz4", {"sm_90"}),
    ],
)
def test_entries_of_real_fatbins(fatbins, build, expected):
    scan = fatbin.scan_file(str(fatbins[build]))
    assert scan.kind == "elf" and scan.wrappers >= 1
    assert {e.name for e in scan.entries} == expected
    assert all(c.section == ".nv_fatbin" and c.error is None for c in scan.containers)


def test_suffix_is_a_flag_bit_not_an_arch_offset(fatbins):
    (e,) = set(
        (e.number, e.suffix, e.flags & 0x300000)
        for e in fatbin.scan_file(str(fatbins["sm100a"])).entries
    )
    assert e == (100, "a", fatbin.FLAG_ARCH_SPECIFIC)
    (f,) = set(
        (e.number, e.suffix, e.flags & 0x300000)
        for e in fatbin.scan_file(str(fatbins["sm100f"])).entries
    )
    assert f == (100, "f", fatbin.FLAG_FAMILY)


def test_ptx_entry_has_its_isa_version(fatbins):
    (e,) = fatbin.scan_file(str(fatbins["ptx100"])).entries
    assert e.kind == "ptx" and e.version >= (8, 0)  # CUDA 13.0 writes PTX ISA 9.0


def test_compressed_entries(fatbins):
    entries = fatbin.scan_file(str(fatbins["compressed"])).entries
    assert entries and all(e.compression == "zstd" for e in entries)
    assert all(e.stored_size < e.size for e in entries if e.kind == "sass")
    summary = fatbin.summarize(entries)
    assert summary["compressed"] == len(entries) and summary["sass"] == ["sm_90", "sm_103"]


def test_lz4_entries_decompress_to_cubins_of_their_arch(fatbins):
    with open(fatbins["lz4"], "rb") as fh:
        data = fh.read()
    entries = fatbin.scan_buffer(data).entries
    assert entries and all(e.compression == "lz4" for e in entries)
    for e in entries:
        cubin = fatbin.payload(data, e)
        assert len(cubin) == e.size
        image = elf.parse(cubin)
        assert image is not None and image.machine == elf.EM_CUDA
        assert fatbin.scan_buffer(cubin).entries[0].number == e.number == 90


@pytest.mark.parametrize(
    "build, target, verdict",
    [
        ("sm120", "sm_103", "none"),
        ("sm100a", "sm_103", "none"),
        ("sm100a", "sm_100", "sass"),
        ("sm100f", "sm_103", "sass"),
        ("sm100f", "sm_100", "sass"),
        ("ptx100", "sm_103", "ptx"),
        ("sm90", "sm_90", "sass"),
        ("sm90", "sm_80", "none"),
        ("compressed", "sm_103", "sass"),
        ("compressed", "sm_120", "ptx"),
        ("compressed", "sm_80", "none"),
    ],
)
def test_verdicts(fatbins, build, target, verdict):
    from rbprobes.arch import parse_target

    scan = fatbin.scan_file(str(fatbins[build]))
    assert file_verdict(scan, parse_target(target), None)[0] == verdict


@pytest.mark.parametrize(
    "build, target, status",
    [
        ("sm120", "sm_103", "fail"),
        ("sm100a", "sm_103", "fail"),
        ("sm100f", "sm_103", "pass"),
        ("ptx100", "sm_103", "pass"),
        ("sm90", "sm_90", "pass"),
        ("sm90", "sm_80", "fail"),
    ],
)
def test_kernel_audit_check(fatbins, build, target, status):
    path = fatbins[build]
    result = run_check(
        {"type": "kernel_audit", "params": {"arch": target}}, Context(venv=str(path))
    )
    assert result["status"] == status, result["reason"]
    assert result["level"] == "L0"
    if status == "fail":
        assert path.name in result["reason"] and path.name in result["values"]["no_path"]


def test_units_of_a_device_linked_library(fatbins):
    """nvcc -shared: a kernel-free device-linked container (wrapper version 2) and the unit's
    own container (version 1, SASS and PTX) are two units; the first needs no path."""
    scan = fatbin.scan_file(str(fatbins["compressed"]))
    assert sorted(c.wrapper for c in scan.containers) == [1, 2]
    assert len(scan.units) == 2
    data = fatbins["compressed"].read_bytes()
    linked = [u for u in scan.units if u[0].wrapper == 2][0]
    assert fatbin.unit_kernels(data, linked).kernel_free
    assert file_verdict(scan, (12, 0), None) == ("ptx", 0)


def test_partial_file_fails_naming_the_unit_and_its_kernel(fatbins, tmp_path):
    """Two units linked by the host linker: on sm_90 the sm_120 unit's kernel cannot launch.
    (It used to pass with a note: the old rule only failed files where no unit had a path.)"""
    scan = fatbin.scan_file(str(fatbins["partial"]))
    assert [c.wrapper for c in scan.containers] == [1, 1] and len(scan.units) == 2
    assert file_verdict(scan, (9, 0), None) == ("partial", 1)
    assert file_verdict(scan, (12, 0), None) == ("partial", 1)
    assert file_verdict(scan, (10, 3), None) == ("none", 2)
    ctx = Context(venv=str(fatbins["partial"]))
    result = run_check({"type": "kernel_audit", "params": {"arch": "sm_90"}}, ctx)
    assert result["status"] == "fail", result["reason"]
    assert "libpartial.so" in result["reason"] and "add_one_1" in result["reason"]
    (info,) = result["values"]["files"]
    assert [m["kernels"] for m in info["missing"]] == [["add_one_1"]]
    assert info["missing"][0]["archs"] == ["sm_120"]
    # the same file where a vendor dispatches per arch (below nvidia/): a note, listed
    vendor = tmp_path / "site-packages" / "nvidia" / "foo" / "lib"
    vendor.mkdir(parents=True)
    (vendor / "libfoo.so").write_bytes(fatbins["partial"].read_bytes())
    ctx = Context(venv=str(tmp_path))
    noted = run_check({"type": "kernel_audit", "params": {"arch": "sm_90"}}, ctx)
    assert noted["status"] == "pass" and "partial_ok" in noted["reason"]
    assert noted["values"]["partial_waived"] == ["site-packages/nvidia/foo/lib/libfoo.so"]
    for params in ({"strict": True}, {"partial_ok": []}, {"partial_ok": ["other/*"]}):
        params = dict(params, arch="sm_90")
        result = run_check({"type": "kernel_audit", "params": params}, ctx)
        assert result["status"] == "fail" and "libfoo.so" in result["reason"], params
    wider = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_90", "partial_ok": ["libpartial.so"]}},
        Context(venv=str(fatbins["partial"])),
    )
    assert wider["status"] == "pass", wider["reason"]


def test_audit_of_a_tree_lists_the_files_without_a_path(fatbins):
    root = fatbins["sm90"].parent
    values = audit(str(root), (10, 3))
    assert sorted(values["no_path"]) == [
        "liblz4.so",
        "libpartial.so",
        "libsm100a.so",
        "libsm120.so",
        "libsm90.so",
    ]
    assert sorted(values["kernel_free"]) == ["libnokernel.so", "libnokernel_zstd.so"]
    assert values["ptx_only"] == ["libptx100.so"]
    assert values["gpu_files"] == len(fatbins)
    assert values["compressed_entries"] >= 4


def test_workers_give_the_one_process_audit(fatbins, tmp_path):
    """The audit's files read by forked workers (a big venv's, on a host with cores): the same
    document as one process's, file for file and in order, also with a file that is
    unreadable, one that is waived and one without GPU code; each file's record is plain data
    (a worker marshals it back; one that does not load would be read again in the parent).
    Compared in a process of its own: this one may have threads, and then nothing forks."""
    root = tmp_path / "venv"
    shutil.copytree(fatbins["sm90"].parent, root, ignore=shutil.ignore_patterns("*.cu"))
    waived = root / "site-packages" / "nvidia" / "foo" / "lib"
    waived.mkdir(parents=True)
    shutil.copy(fatbins["partial"], waived / "libfoo.so")
    whole = fatbins["sm90"].read_bytes()
    (root / "libbroken.so").write_bytes(whole[: len(whole) // 2])
    (root / "libplain.so").write_bytes(b"\x7fELF" + b"\0" * 60)
    compare = (
        "import json, sys\n"
        "from rbprobes.checks_static import audit\n"
        "out = []\n"
        "for target in ((10, 3), (9, 0)):\n"
        "    one = audit(sys.argv[1], target, jobs=1)\n"
        "    alone = one.pop('workers')\n"
        "    for jobs in (2, 5):\n"
        "        many = audit(sys.argv[1], target, jobs=jobs)\n"
        "        out.append([target, jobs, many.pop('workers'), alone, many == one,\n"
        "                    one['gpu_files'], bool(one['errors']), one['partial_waived']])\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", compare, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    for target, jobs, workers, alone, same, gpu_files, errors, waived in json.loads(done.stdout):
        assert (workers, alone, same) == (jobs, 0, True), (target, jobs)
        assert gpu_files >= len(fatbins) and errors
        assert bool(waived) == (target == [9, 0])
    for path, _size in checks_static._candidates(str(root), []):
        rec = checks_static._audit_file(
            path, False, str(root), (10, 3), None, checks_static.DEFAULT_PARTIAL_OK, False
        )
        assert marshal.loads(marshal.dumps(rec)) == rec, path
    # preflight (the source's static checks, in a child Python beside the scan) forks them;
    # the kernel_audit check runs in a thread of the runner, so there one process reads them
    forked = run_cli(
        "preflight", "--venv", str(root), "--arch", "sm_103", env={"RBPROBES_AUDIT_JOBS": "3"}
    )
    alone = run_cli(
        "preflight", "--venv", str(root), "--arch", "sm_103", env={"RBPROBES_AUDIT_JOBS": "1"}
    )
    assert forked.returncode == alone.returncode == 1, forked.stderr
    forked_values, alone_values = (
        cli_json(done)["checks"][0]["values"] for done in (forked, alone)
    )
    assert (forked_values.pop("workers"), alone_values.pop("workers")) == (3, 0)
    assert forked_values == alone_values


def test_audit_workers_answer_in_order_and_a_lost_one_is_redone_here():
    """rbprobes.workers.over_workers (in a process without threads): items taken largest first by
    several workers, results in the items' order; an item whose worker died is computed in the
    calling process; in a process with threads nothing forks."""
    script = (
        "import json, os, threading, time\n"
        "from rbprobes.workers import over_workers as _over_workers\n"
        "parent = os.getpid()\n"
        "sizes = [5, 1, 30, 2, 9, 7, 3, 8]\n"
        "def slow(i):\n"
        "    time.sleep(0.05)  # each item takes a while, as a library does\n"
        "    return i, os.getpid()\n"
        "def dies_on_2(i):\n"
        "    if i == 2 and os.getpid() != parent:\n"
        "        os._exit(3)\n"
        "    return i * 10\n"
        "got, workers = _over_workers(slow, sizes, 3)\n"
        "lost = _over_workers(dies_on_2, sizes, 3)\n"
        "one = _over_workers(lambda i: i, sizes, 1)\n"
        "stop = threading.Event()\n"
        "t = threading.Thread(target=stop.wait)\n"
        "t.start()\n"
        "threaded = _over_workers(lambda i: os.getpid() == parent, sizes, 3)\n"
        "stop.set()\n"
        "print(json.dumps({'order': [i for i, _ in got], 'workers': workers,\n"
        "                  'pids': sorted({p for _, p in got}), 'parent': parent,\n"
        "                  'lost': lost, 'one': one, 'threaded': threaded}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    assert r["order"] == list(range(8)) and r["workers"] == 3
    assert r["parent"] not in r["pids"] and len(r["pids"]) > 1
    # the worker that took item 2 died: its items were computed here, the others answered
    assert r["lost"] == [[i * 10 for i in range(8)], 2]
    assert r["one"] == [list(range(8)), 0]
    assert r["threaded"] == [[True] * 8, 0]


def test_driver_ptx_limit(fatbins):
    ctx = Context(venv=str(fatbins["ptx100"]))
    old = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_103", "driver_ptx_max": "8.8"}}, ctx
    )
    new = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_103", "driver_ptx_max": "9.0"}}, ctx
    )
    assert (old["status"], new["status"]) == ("fail", "pass")


def test_config_gpu_arch_is_the_default_target(fatbins):
    ctx = Context(venv=str(fatbins["sm90"].parent), gpu={"arch": "sm_103"})
    result = run_check({"type": "kernel_audit", "params": {"paths": ["libsm100f.so"]}}, ctx)
    assert result["status"] == "pass" and result["values"]["target"] == "sm_103"
    missing = run_check({"type": "kernel_audit", "params": {"paths": ["nope.so"]}}, ctx)
    assert missing["status"] == "fail" and "nope.so" in missing["reason"]


def test_cli_kernel_audit_exit_codes(fatbins):
    bad = run_cli("kernel_audit", str(fatbins["sm120"]), "--arch", "sm_103")
    good = run_cli("kernel_audit", str(fatbins["sm100f"]), "--arch", "sm_103")
    assert (bad.returncode, good.returncode) == (1, 0), bad.stderr + good.stderr
    assert cli_json(bad)["values"]["no_path"] == ["libsm120.so"]
    assert run_cli("kernel_audit", str(fatbins["sm120"])).returncode == 2  # --arch missing


# Synthetic fatbins: the reader's edge cases, no nvcc needed.


def test_synthetic_container_and_unknown_kind():
    blob = fatbin_container(
        fatbin_entry(2, 90, 0x100011),
        fatbin_entry(1, 80, 0x11, b"ptx", version=(7, 8)),
        fatbin_entry(7, 75),
    )
    entries = fatbin.scan_buffer(blob).entries
    assert [e.name for e in entries] == ["sm_90a", "compute_80", "kind7_75"]
    assert entries[1].version == (7, 8)
    assert fatbin.summarize(entries)["unknown_kinds"] == ["kind7_75"]


def test_truncated_container_is_reported_not_raised():
    blob = fatbin_container(fatbin_entry(2, 90), fatbin_entry(2, 100))
    cut = blob[:-20]
    (container,) = fatbin.parse_containers(cut, 0, len(cut), "x")
    assert container.error and [e.name for e in container.entries] == ["sm_90"]


def test_garbage_and_bad_headers_are_skipped():
    magic = struct.pack("<I", fatbin.FATBIN_MAGIC)
    blob = b"junk" + magic + b"\x09\x00" + b"\0" * 30 + fatbin_container(fatbin_entry(2, 86))
    assert [e.name for e in fatbin.scan_buffer(b"\x7fELF" + blob[4:]).entries] == []
    assert [
        e.name for c in fatbin.parse_containers(blob, 0, len(blob), "x") for e in c.entries
    ] == ["sm_86"]


def test_not_elf_and_empty_files(tmp_path):
    (tmp_path / "a.so").write_bytes(b"")
    (tmp_path / "b.so").write_bytes(b"#!/bin/sh\necho not a library\n")
    assert fatbin.scan_file(str(tmp_path / "a.so")).kind == "not-elf"
    assert fatbin.scan_file(str(tmp_path / "b.so")).kind == "not-elf"
    values = audit(str(tmp_path), (9, 0))
    assert values["gpu_files"] == 0 and values["files_scanned"] == 0


def test_lz4_block_decoder():
    # literal "abcd", then a match of 8 bytes at offset 4 (overlapping copy), then literal "!"
    block = bytes([0x44]) + b"abcd" + struct.pack("<H", 4) + bytes([0x10]) + b"!"
    assert decompress.lz4_block_decompress(block, 13) == b"abcdabcdabcd!"
    with pytest.raises(ValueError):
        decompress.lz4_block_decompress(bytes([0x10]) + b"a" + struct.pack("<H", 9), 10)


def test_null_venv_means_the_running_interpreter(monkeypatch, tmp_path):
    """The runbook runs the probe with the moved venv's python and passes venv: null."""
    import sys

    blob = tmp_path / "lib" / "k.fatbin"
    blob.parent.mkdir()
    blob.write_bytes(fatbin_container(fatbin_entry(2, 120)))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    result = run_check(
        {"type": "kernel_audit", "params": {}},
        Context(venv=None, gpu={"arch": None, "capability": "10.3"}),
    )
    assert result["values"]["root"] == str(tmp_path)
    assert result["status"] == "fail" and result["values"]["no_path"] == ["lib/k.fatbin"]


@pytest.mark.parametrize("build", ["nokernel", "nokernel_zstd"])
def test_a_library_without_kernels_needs_no_path(fatbins, build):
    """Like libcufftw.so.12: one sm_75 cubin with no kernel in it. It cannot fail a launch."""
    scan = fatbin.scan_file(str(fatbins[build]))
    data = fatbins[build].read_bytes()
    assert scan.units and all(fatbin.unit_kernels(data, u).kernel_free for u in scan.units)
    assert file_verdict(scan, (10, 3), None) == ("empty", 0)
    result = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_103"}}, Context(venv=str(fatbins[build]))
    )
    assert result["status"] == "pass" and result["values"]["kernel_free"] == [fatbins[build].name]


def test_kernel_detection_by_decoding(fatbins):
    """Uncompressed, LZ4 and zstd cubins are decoded: kernels are the symbols nvcc marks as
    entries (STO_CUDA_ENTRY)."""
    for build, kernels in (
        ("nokernel", []),
        ("sm90", ["add_one"]),
        ("lz4", ["add_one"]),
        ("compressed", ["add_one"]),
        ("ptx100", ["add_one"]),
    ):
        data = fatbins[build].read_bytes()
        scan = fatbin.scan_buffer(data)
        tu = [c for c in scan.containers if c.wrapper != 2]  # the unit's own container
        for c in tu:
            for e in c.entries:
                assert fatbin.entry_kernels(data, e) == kernels, (build, e.name)


def test_no_size_rule_for_undecodable_zstd(monkeypatch, fatbins):
    """Without any zstd decoder a small zstd cubin is not taken for kernel-free (the old size
    rule skipped every compressed cubin up to 2560 bytes): the unit counts, and says why."""
    monkeypatch.setattr(decompress, "zstd_decompress", lambda raw, limit, deadline=None: None)
    scan = fatbin.scan_file(str(fatbins["nokernel_zstd"]))
    data = fatbins["nokernel_zstd"].read_bytes()
    (unit,) = [u for u in scan.units if u[0].entries[0].compression == "zstd"][:1]
    k = fatbin.unit_kernels(data, unit)
    assert not k.kernel_free and "no zstd decoder" in k.undecoded
    result = run_check(
        {"type": "kernel_audit", "params": {"arch": "sm_103"}},
        Context(venv=str(fatbins["nokernel_zstd"])),
    )
    assert result["status"] == "fail" and "no zstd decoder" in result["reason"]


def test_fatbins_in_data_sections(tmp_path):
    """Like libcufft.so.12: a kernel-free registered module, the real code in .rodata."""
    gcc = need("gcc", "builds a shared object with chosen sections")
    registered = fatbin_container(fatbin_entry(2, 75, payload=b"\0" * 8))
    embedded = fatbin_container(
        fatbin_entry(2, 90), fatbin_entry(2, 100, 0x200011), fatbin_entry(8, 90)
    )
    decoy = struct.pack("<I", fatbin.FATBIN_MAGIC) + b"\x01\x00\x10\x00" + b"\x07" * 80
    src = tmp_path / "lib.c"
    src.write_text(
        c_array("registered", registered, ".nv_fatbin")
        + c_array("embedded", embedded)
        + c_array("decoy", decoy)
    )
    lib = tmp_path / "libembedded.so"
    subprocess.run([gcc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    scan = fatbin.scan_file(str(lib))
    assert [c.section for c in scan.containers] == [".nv_fatbin", ".rodata"]
    assert [e.name for e in scan.embedded_containers[0].entries] == ["sm_90", "sm_100f", "lto_90"]
    assert fatbin.scan_file(str(lib), embedded=False).embedded_containers == []
    # the registered unit is an 8-byte "cubin" that does not decode: unreadable, and counted
    assert file_verdict(scan, (10, 3), None) == ("partial", 1)
    assert file_verdict(scan, (12, 0), None) == ("none", 2)  # LTO-IR is no path
    values = audit(str(lib), (10, 3))
    assert values["lto"] == ["lto_90"] and values["files"][0]["embedded_containers"] == 1


def test_data_sections_of_files_without_gpu_code_are_not_searched(tmp_path):
    gcc = need("gcc", "builds a shared object with chosen sections")
    src = tmp_path / "lib.c"
    src.write_text(c_array("blob", fatbin_container(fatbin_entry(2, 90))))
    lib = tmp_path / "libplain.so"
    subprocess.run([gcc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    assert fatbin.scan_file(str(lib)).containers == []


def test_against_cuobjdump_when_present(fatbins):
    """Optional: with a cuobjdump (PATH, /usr/local/cuda*/bin, or $CUOBJDUMP) the names match."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import crosscheck_cuobjdump as cc

    tool = cc.find_cuobjdump(os.environ.get("CUOBJDUMP"))
    if not tool:
        pytest.skip("no cuobjdump here (optional; see crosscheck_cuobjdump.py)")
    for path in fatbins.values():
        ours, _scan, _cut = cc.our_names(str(path))
        theirs = cc.cuobjdump_names(tool, str(path))[0]
        assert ours == theirs, path.name
