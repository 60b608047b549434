"""The reader between the decompressor and `tar -x` (rbkit.tarstream): the digest it takes of each
file from the stream is the digest of the file tar writes, for every way GNU tar writes a name, a
link or a size, whatever the pieces the stream arrives in; what it cannot follow gives no digest
(verify then reads the files), never a wrong one."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from rbkit import tarstream


@pytest.fixture(autouse=True)
def _no_hashing_threads_left(monkeypatch):
    """Every Digester a test made is closed after it: a test that only feeds one leaves its
    hashing threads waiting, and a process with threads does not fork (the early check's walk
    in test_engine, run after this file in one process, then failed: no worker forked)."""
    made = []
    real_init = tarstream.Digester.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(tarstream.Digester, "__init__", init)
    yield
    for d in made:
        d.close()


def odd_tree(root: Path, big: int = (3 << 20) + 17) -> None:
    """Names past 100 bytes (GNU long names, pax path, a ustar prefix), a symlink target past 100
    bytes, a hard link to a big file (a `1` member: no data), an empty file, a name that is not
    UTF-8, a file bigger than one read."""
    deep = root / ("a" * 120) / ("b" * 90)
    deep.mkdir(parents=True)
    (deep / ("c" * 150)).write_bytes(os.urandom(5000))
    (root / "big").write_bytes(os.urandom(big))
    os.link(root / "big", root / ("a" * 120) / ("hardlink-" + "x" * 100))
    (root / "longlink").symlink_to("z" * 200)
    (root / "empty").write_bytes(b"")
    (root / "d").mkdir()
    (root / "d" / "é-utf8").write_bytes(b"hi")
    with open(os.path.join(os.fsencode(root), b"d", b"raw\xff"), "wb") as f:
        f.write(b"raw")
    split = root / ("p" * 80) / ("q" * 60)  # 150 bytes: ustar splits it into prefix/name
    split.mkdir(parents=True)
    (split / "file").write_bytes(os.urandom(7000))


def digests_on_disk(root: Path) -> dict:
    out = {}
    for dirpath, _dirs, files in os.walk(os.fsencode(root)):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                rel = os.path.relpath(path, os.fsencode(root)).decode("utf-8", "surrogateescape")
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def tar_of(root: Path, *opts: str) -> bytes:
    return subprocess.run(
        ["tar", "-C", str(root), *opts, "-cf", "-", "."], check=True, capture_output=True
    ).stdout


@pytest.mark.parametrize("fmt", ["gnu", "posix", "oldgnu"])
@pytest.mark.parametrize("piece", [1, 511, 512, 100_000, 1 << 20])
def test_every_file_gets_the_digest_of_what_tar_writes(tmp_path, fmt, piece):
    odd_tree(tmp_path / "t", big=(3 << 20) + 17 if piece >= 512 else 70_000)
    data = tar_of(tmp_path / "t", "--format=" + fmt)
    d = tarstream.Digester("sha256", workers=2)
    for at in range(0, len(data), piece):
        d.feed(data[at : at + piece])
    assert d.result() == digests_on_disk(tmp_path / "t")
    assert d.ended and not d.truncated and d.corrupt is None and d.lost is None


def test_a_ustar_name_is_its_prefix_and_its_name(tmp_path):
    root = tmp_path / "t"
    split = root / ("p" * 80) / ("q" * 60)
    split.mkdir(parents=True)
    (split / "file").write_bytes(b"in a split name")
    d = tarstream.Digester()
    d.feed(tar_of(root, "--format=ustar"))
    assert d.result() == digests_on_disk(root)


def test_the_stage_hands_on_every_byte_unchanged(tmp_path):
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    (tmp_path / "in").write_bytes(data)
    d = tarstream.Digester("blake2b", workers=2)
    with open(tmp_path / "in", "rb") as src, open(tmp_path / "out", "wb") as dst:
        assert d.stage(src.fileno(), dst.fileno()) == 0
    assert (tmp_path / "out").read_bytes() == data
    want = {}
    for rel, _ in digests_on_disk(tmp_path / "t").items():
        with open(os.path.join(os.fsencode(tmp_path / "t"), os.fsencode(rel)), "rb") as f:
            want[rel] = hashlib.blake2b(f.read(), digest_size=32).hexdigest()
    assert d.result() == want


def test_a_stream_cut_short_is_truncated_wherever_it_is_cut(tmp_path):
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    last = members[-1]
    end = last.offset_data + -(-last.size // 512) * 512  # every member whole, no end blocks
    # in a header, in a file's data, between two members (GNU tar takes that as the end: exit 0)
    for cut in (700, members[1].offset_data + 10, members[len(members) // 2].offset, end):
        d = tarstream.Digester()
        d.feed(data[:cut])
        assert d.truncated, cut


def test_a_bad_header_is_corrupt_and_gives_no_digests(tmp_path):
    odd_tree(tmp_path / "t")
    data = bytearray(tar_of(tmp_path / "t"))
    data[5] ^= 0x20  # in the first header's name
    d = tarstream.Digester()
    d.feed(bytes(data))
    assert d.corrupt and "fails its checksum" in d.corrupt
    assert d.result() == {} and not d.truncated


def test_a_member_it_does_not_follow_gives_no_digests_not_wrong_ones(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "a").write_bytes(b"first")
    with open(root / "sparse", "wb") as f:
        f.truncate(1 << 20)
        f.seek(1 << 19)
        f.write(b"data in the middle")
    d = tarstream.Digester()
    d.feed(tar_of(root, "--sparse", "--format=gnu"))
    assert d.lost and "sparse" in d.lost
    assert d.result() == {} and not d.truncated


def test_numbers_in_octal_and_in_base_256():
    assert tarstream._number(b"00000001750\0") == 1000
    assert tarstream._number(b"   1750 \0") == 1000
    assert tarstream._number(bytes([0x80]) + (9 << 30).to_bytes(11, "big")) == 9 << 30
    with pytest.raises(ValueError):
        tarstream._number(b"\xff" * 12)


def through_pipes(d: "tarstream.Digester", data: bytes, consumer: list) -> tuple:
    """Run d.stage between two pipes: `data` written into the first by a thread, the second read
    by `consumer` (a command, its output to a file). Returns (stage's return, consumer's output,
    consumer's exit)."""
    import tempfile
    import threading

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    sink = tempfile.TemporaryFile()
    p = subprocess.Popen(consumer, stdin=out_r, stdout=sink)
    os.close(out_r)

    def feed():
        try:
            with os.fdopen(in_w, "wb") as f:
                f.write(data)
        except BrokenPipeError:
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    rc = d.stage(in_r, out_w)
    os.close(out_w)
    os.close(in_r)  # the feeder's writes fail now, if any are left
    p.wait(30)
    t.join(30)
    sink.seek(0)
    return rc, sink.read(), p.returncode


@pytest.mark.parametrize("workers", [0, 2])
def test_between_pipes_every_byte_goes_on_and_every_digest_is_tars(tmp_path, workers):
    """The stage as the receiving end runs it: between two pipes, with tar's reader behind;
    with no hashing threads (a host of two cores) and with two."""
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    d = tarstream.Digester("sha256", workers=workers)
    rc, got, crc = through_pipes(d, data, ["cat"])
    assert rc == 0 and crc == 0 and got == data
    assert d.result() == digests_on_disk(tmp_path / "t")
    assert d.ended and not d.truncated and d.corrupt is None and d.lost is None


def test_a_reader_that_stops_after_the_archive_leaves_the_rest_to_the_parser(tmp_path):
    """tar stops reading at the end of the archive: the sender's padding past it is still read
    (its writes must not fail), and the digests stand."""
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    padded = data + b"\0" * (3 << 20)
    d = tarstream.Digester("sha256", workers=2)
    rc, got, _ = through_pipes(d, padded, ["head", "-c", str(len(data))])
    assert rc == 0 and got == data
    assert d.result() == digests_on_disk(tmp_path / "t")
    assert d.ended and d.corrupt is None and d.lost is None


def test_a_reader_that_stops_at_the_end_is_judged_on_what_was_written_not_on_a_lagging_parser(
    tmp_path,
):
    """The copy may run ahead of the parser: when tar leaves after the archive's end, in the middle
    of a chunk, whether the end was reached is decided once the parser has every byte written
    before the pipe broke (here a parser slowed on purpose), so the last members' digests stand
    and the rest of the input is still read. Before, the stage judged by where the parser happened
    to be, stopped reading, and never parsed that chunk: its members had no digest."""
    import tempfile
    import time

    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    # the archive ends half-way into a chunk of the stage's reads (a file gives whole chunks)
    lead = (-len(data) - tarstream.CHUNK // 2) % tarstream.CHUNK
    total = len(data) + lead + 2 * tarstream.CHUNK
    src = tempfile.TemporaryFile()
    src.write(data.ljust(total, b"\0"))
    src.flush()
    os.lseek(src.fileno(), 0, os.SEEK_SET)
    d = tarstream.Digester("sha256", workers=2)
    feed = d.feed

    def slow_feed(chunk):
        time.sleep(0.2)
        return feed(chunk)

    d.feed = slow_feed
    out_r, out_w = os.pipe()
    sink = tempfile.TemporaryFile()
    p = subprocess.Popen(["head", "-c", str(len(data))], stdin=out_r, stdout=sink)
    os.close(out_r)
    assert d.stage(src.fileno(), out_w) == 0
    os.close(out_w)
    assert p.wait(30) == 0
    assert os.lseek(src.fileno(), 0, os.SEEK_CUR) == total  # every byte was read
    sink.seek(0)
    assert sink.read() == data
    assert d.result() == digests_on_disk(tmp_path / "t")
    assert d.ended and d.corrupt is None and d.lost is None


def test_a_reader_that_dies_mid_archive_ends_the_stage(tmp_path):
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t")
    d = tarstream.Digester("sha256", workers=2)
    rc, got, _ = through_pipes(d, data, ["head", "-c", "4096"])
    assert rc == 0 and got == data[:4096]
    assert not d.ended  # the stage stopped: no end was seen


class _Rendezvous:
    """A sha256 whose first update waits until another file's hashing has begun (a barrier of
    two): it passes only when two big files are hashed side by side."""

    barrier = None

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.first = True

    def update(self, piece) -> None:
        if self.first:
            self.first = False
            self.barrier.wait()
        self.h.update(piece)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def test_big_files_are_hashed_side_by_side_within_the_budget(tmp_path, monkeypatch):
    # one file's digest is sequential work: the parser must hand a big file's pieces over and go
    # on to the next file while they are hashed. Before, each thread took 16 pieces at most, so
    # the parser waited on the first file and the second was never begun (the barrier broke)
    root = tmp_path / "t"
    root.mkdir()
    for name in ("a", "b"):
        (root / name).write_bytes(os.urandom(3 << 20))
    data = tar_of(root, "--format=gnu")
    monkeypatch.setattr(_Rendezvous, "barrier", threading.Barrier(2, timeout=20))
    d = tarstream.Digester("sha256", workers=2, budget=16 << 20)
    monkeypatch.setattr(d, "_new", _Rendezvous)
    held = []
    give = d._budget.give
    monkeypatch.setattr(d._budget, "give", lambda n, w: (held.append(d._budget.held), give(n, w)))
    for at in range(0, len(data), 64 << 10):  # 48 pieces of 64 KiB a file
        d.feed(data[at : at + (64 << 10)])
    assert d.result() == digests_on_disk(root) and d.lost is None
    assert max(held) <= 16 << 20 and d._budget.held == 0


def test_the_budget_holds_the_parser_back(tmp_path, monkeypatch):
    # a budget of 256 KiB and a hasher that waits until the parser has handed over about that:
    # what is handed over and not hashed never passes the budget, and every digest is right
    root = tmp_path / "t"
    root.mkdir()
    (root / "a").write_bytes(os.urandom(2 << 20))
    data = tar_of(root, "--format=gnu")
    d = tarstream.Digester("sha256", workers=1, budget=256 << 10)
    full = threading.Event()

    class Gated(_Rendezvous):
        def update(self, piece) -> None:
            assert full.wait(20)
            self.h.update(piece)

    monkeypatch.setattr(d, "_new", Gated)
    held = []
    take = d._budget.take

    def watched_take(n, w):
        take(n, w)
        held.append(d._budget.held)
        if d._budget.held > (256 - 64) << 10:  # the next piece would not fit
            full.set()

    monkeypatch.setattr(d._budget, "take", watched_take)
    for at in range(0, len(data), 64 << 10):
        d.feed(data[at : at + (64 << 10)])
    assert d.result() == digests_on_disk(root) and d.lost is None
    assert (256 - 64) << 10 < max(held) <= 256 << 10 and len(held) >= 32


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tee(2) is Linux's")
@pytest.mark.parametrize("workers", [0, 2])
def test_between_two_pipes_the_stage_writes_nothing_itself(tmp_path, monkeypatch, workers):
    """Between two pipes tar is given the stream by tee(2) (no copy through this process: a CPU
    second less on the lab's relay, docs/benchmarks.md); the bytes and digests are the same."""
    odd_tree(tmp_path / "t")
    data = tar_of(tmp_path / "t") + b"\0" * (3 << 20)
    written = []
    real_write = os.write

    def write(fd, b):
        written.append(len(b))
        return real_write(fd, b)

    monkeypatch.setattr(tarstream.os, "write", write)
    d = tarstream.Digester("sha256", workers=workers)
    rc, got, crc = through_pipes(d, data, ["cat"])
    monkeypatch.undo()
    assert rc == 0 and crc == 0 and got == data
    assert d.result() == digests_on_disk(tmp_path / "t")
    assert not written  # the feeder thread writes through a file object
    assert d.ended and not d.truncated
