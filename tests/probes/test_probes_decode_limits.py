"""The kernel audit's decoding limits (issue 33 N8: ten 1 MB LZ4 entries that expanded to 256 MB
each took 9.7 s and 552 MB in the source preflight). Hand-made entries that expand hugely (LZ4: one
literal, then one match that repeats it; zstd: a frame of zeros), decoded within a per-entry cap, a
budget of decoded bytes for the whole audit run (shared by its worker processes) and a deadline,
all enforced while decoding. A unit a limit left undecoded is "not proven": its file fails, named,
with the reason, and never passes. Memory and time are measured in a child process.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time

import pytest
from probes_helpers import ROOT, fatbin_container, fatbin_entry, lz4_literals, tiny_cubin, tiny_so
from rbprobes import decompress, fatbin

from tests.conftest import IN_CI

LZ4 = 0x2011
ZSTD = 0x8011
MIB = 1 << 20


def lz4_bomb(out_size: int) -> bytes:
    """An LZ4 block that decodes to `out_size` bytes of "a" (one literal, one match at offset 1):
    about 1 MB of input per 256 MiB of output."""
    rest = out_size - 1 - 4 - 15
    return bytes([0x1F]) + b"a" + b"\x01\x00" + b"\xff" * (rest // 255) + bytes([rest % 255])


def lz4_many_sequences(count: int) -> bytes:
    """An LZ4 block of `count` sequences (one literal, a 4-byte match) and a last literal."""
    return (bytes([0x10]) + b"x" + b"\x01\x00") * count + bytes([0x10]) + b"!"


def bomb_so(path, entries: int, out_size: int, extra: bytes = b"") -> None:
    """A shared object with `entries` containers, each one LZ4 bomb for sm_80 (no path to
    sm_90, so the audit decodes it for its kernels), then `extra` containers."""
    bomb = lz4_bomb(out_size)
    path.write_bytes(
        tiny_so(
            b"".join(
                fatbin_container(fatbin_entry(2, 80, LZ4, bomb, usize=out_size))
                for _ in range(entries)
            )
            + extra
        )
    )


# The audit in a fresh process, with the limits it is given (an attribute of decompress each), its
# wall time and the peak of what Python allocated (tracemalloc: the decoders' buffers).
CHILD = """
import json, sys, time, tracemalloc
from rbprobes import auditverdict, checks_static, decompress
limits = json.loads(sys.argv[2])
for name, value in limits.items():
    setattr(decompress, name, value)
tracemalloc.start()
t = time.monotonic()
values = checks_static.audit(sys.argv[1], (9, 0), jobs=int(sys.argv[3]))
out = auditverdict.judge_audit(values)
print(json.dumps({"seconds": time.monotonic() - t, "peak": tracemalloc.get_traced_memory()[1],
                  "status": out.status, "reason": out.reason, "workers": values["workers"],
                  "files": values["files"]}))
"""


def audit_child(root, limits=None, jobs=1) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), json.dumps(limits or {}), str(jobs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_issues_ten_bombs_are_not_decoded_and_not_passed(tmp_path):
    """The issue's case: ten 1 MB entries that declare (and expand to) 256 MiB each. More than
    one real entry can be (ENTRY_CAP): not decoded at all, each unit named as not proven."""
    bomb_so(tmp_path / "libbomb.so", 10, 256 * MIB)
    got = audit_child(tmp_path)
    assert got["status"] == "fail" and "libbomb.so" in got["reason"]
    assert "not proven: 10 units" in got["reason"] and "cap for one entry" in got["reason"]
    assert got["seconds"] < 3 and got["peak"] < 16 * MIB, got
    (f,) = got["files"]
    assert len(f["unproven"]) == 10 and all(
        "not decoded" in m["kernels_note"] for m in f["missing"]
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_runs_output_budget_stops_decoding_across_files_and_workers(tmp_path, jobs):
    """Ten files, one 32 MiB bomb each, a run budget of 96 MiB: three are decoded (they are not
    cubins: unreadable), seven are not (not proven), whatever the number of workers, and about
    one entry's output is held at once (the old decoder held three copies)."""
    for i in range(10):
        bomb_so(tmp_path / ("libbomb%d.so" % i), 1, 32 * MIB)
    got = audit_child(tmp_path, {"AUDIT_OUTPUT_BUDGET": 96 * MIB}, jobs)
    assert got["workers"] == (jobs if jobs > 1 else 0)
    assert got["status"] == "fail" and got["seconds"] < 3, got["seconds"]
    unproven = [f for f in got["files"] if f.get("unproven")]
    decoded = [f for f in got["files"] if f.get("unreadable")]
    assert (len(decoded), len(unproven)) == (3, 7), [f["problems"] for f in got["files"]]
    assert all(f["fails"] for f in got["files"])
    assert all(
        "the audit's budget of 96 MiB of decoded output is spent" in f["unproven"][0]
        for f in unproven
    )
    if jobs == 1:  # each worker's own memory is not traced here
        assert got["peak"] < 1.5 * 32 * MIB + decompress.DECODE_CHUNK, got["peak"]


def test_a_kernel_free_unit_past_the_deadline_fails_instead_of_passing(tmp_path):
    """With time, the sm_80 unit decodes to a cubin without kernels: it cannot fail a launch and
    the file passes. Past the deadline it is not decoded: the file fails, saying why."""
    empty = tiny_cubin([], 80)
    path = tmp_path / "libfree.so"
    path.write_bytes(
        tiny_so(
            fatbin_container(fatbin_entry(2, 90, 0x11, tiny_cubin(["k90"], 90)))
            + fatbin_container(fatbin_entry(2, 80, LZ4, lz4_literals(empty), usize=len(empty)))
        )
    )
    assert audit_child(tmp_path)["status"] == "pass"
    got = audit_child(tmp_path, {"AUDIT_DEADLINE_S": 0.0})
    assert got["status"] == "fail" and "libfree.so" in got["reason"], got["reason"]
    assert "not proven: 1 units" in got["reason"] and "deadline" in got["reason"]


def test_the_lz4_decoder_stops_at_the_deadline_inside_its_loops():
    """Stopped while decoding, not after: inside one long match (after at most DECODE_CHUNK of
    output) and in a run of short sequences (after at most 1024 of them)."""
    past = time.monotonic() - 1
    size = 64 * MIB
    t = time.monotonic()
    with pytest.raises(decompress.NotDecoded, match="deadline") as info:
        decompress.lz4_block_decompress(lz4_bomb(size), size, past)
    assert info.value.produced <= decompress.DECODE_CHUNK + 64 and time.monotonic() - t < 3
    many = lz4_many_sequences(5000)
    with pytest.raises(decompress.NotDecoded, match="deadline") as info:
        decompress.lz4_block_decompress(many, 5000 * 5 + 1, past)
    assert info.value.produced <= 1024 * 5
    # without a deadline both decode whole, long matches included
    assert decompress.lz4_block_decompress(many, 5000 * 5 + 1) == b"xxxxx" * 5000 + b"!"
    out = decompress.lz4_block_decompress(
        lz4_bomb(3 * decompress.DECODE_CHUNK + 7), 3 * decompress.DECODE_CHUNK + 7
    )
    assert out == b"a" * (3 * decompress.DECODE_CHUNK + 7)


def test_the_budget_is_taken_before_decoding_and_what_is_not_decoded_given_back():
    """An entry takes its declared size before it is decoded; what it did not decode (a refused
    entry, a corrupt one) goes back for the next."""
    bomb = lz4_bomb(6 * MIB)
    entry = fatbin.Entry("sass", 80, "", (1, 8), LZ4, "lz4", 0, len(bomb), 6 * MIB)
    small = entry._replace(size=2 * MIB, stored_size=len(lz4_bomb(2 * MIB)))
    run = decompress.DecodeBudget(output=8 * MIB, seconds=60)
    try:
        with pytest.raises(decompress.Unreadable, match="truncated"):  # corrupt: nothing out
            fatbin.payload(b"\xf0", entry._replace(size=7 * MIB, stored_size=1), run)
        assert len(fatbin.payload(bomb, entry, run)) == 6 * MIB
        with pytest.raises(decompress.NotDecoded, match="budget of 8 MiB .* spent"):
            fatbin.payload(bomb, entry, run)  # 2 MiB left
        assert len(fatbin.payload(lz4_bomb(2 * MIB), small, run)) == 2 * MIB
        with pytest.raises(decompress.NotDecoded, match="spent"):
            fatbin.payload(lz4_bomb(2 * MIB), small, run)
    finally:
        run.close()
    run = decompress.DecodeBudget(output=64 * MIB, seconds=0)
    try:
        with pytest.raises(decompress.NotDecoded, match="deadline"):
            fatbin.payload(bomb, entry, run)
    finally:
        run.close()


def _zstd_frame(data: bytes) -> bytes:
    try:
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        if IN_CI:  # make test installs zstd: its library is there
            pytest.fail("no libzstd.so.1 to make a zstd frame with")
        pytest.skip("no libzstd.so.1 to make a zstd frame with")
    lib.ZSTD_compressBound.restype = ctypes.c_size_t
    lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
    lib.ZSTD_compress.restype = ctypes.c_size_t
    lib.ZSTD_compress.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    bound = lib.ZSTD_compressBound(len(data))
    dst = ctypes.create_string_buffer(bound)
    n = lib.ZSTD_compress(dst, bound, data, len(data), 19)
    return dst.raw[:n]


@pytest.mark.skipif(
    decompress.zstd_decoder() is None and not IN_CI, reason="no zstd decoder on this host"
)
def test_the_zstd_decoder_stops_at_the_deadline_and_its_limit():
    size = 64 * MIB
    frame = _zstd_frame(b"\0" * size)
    assert len(frame) < 64 << 10
    assert len(decompress.zstd_decompress(frame, size)) == size
    past = time.monotonic() - 1
    with pytest.raises(decompress.NotDecoded, match="deadline") as info:
        decompress.zstd_decompress(frame, size, past)
    assert info.value.produced <= decompress.DECODE_CHUNK
    with pytest.raises(decompress.Unreadable, match="declares"):
        decompress.zstd_decompress(frame, size - 1)


@pytest.mark.skipif(
    decompress.zstd_decoder() is None and not IN_CI, reason="no zstd decoder on this host"
)
def test_zstd_bombs_are_bounded_in_an_audit_too(tmp_path):
    """Twelve 64 KiB zstd frames of 96 MiB each against the real limits, in one file: decoded
    one at a time (memory: one entry), until the run's budget; the rest not proven."""
    size = 96 * MIB
    frame = _zstd_frame(b"\0" * size)
    body = b"".join(
        fatbin_container(fatbin_entry(2, 80, ZSTD, frame, usize=size)) for _ in range(12)
    )
    (tmp_path / "libzbomb.so").write_bytes(tiny_so(body))
    got = audit_child(tmp_path, {"AUDIT_OUTPUT_BUDGET": 480 * MIB})
    (f,) = got["files"]
    assert f["fails"] and len(f["unproven"]) == 7, f["problems"]
    assert got["peak"] < 1.5 * size + decompress.DECODE_CHUNK, got["peak"]
    assert got["seconds"] < 3, got["seconds"]
