"""Digests from a tar stream as it passes: a reader between the decompressor and `tar -x` (the
receiving end, receive.receive) that hands every byte on to tar unchanged and hashes each regular
file's data as it goes by, so that verify compares the source's manifest with what tar was given
instead of reading every file tar wrote.

The parser knows what GNU tar writes (`rbkit engine send`: `tar -cf - --null --no-recursion -T
NAMES`, GNU format) and what a POSIX one may: ustar names with their prefix, GNU long names and
long link targets (`L`, `K` members before the entry they name), pax extended headers (`x`, and
`g` for every entry after it: path, linkpath, size), numbers in octal or GNU base-256, hard links
(`1`: no data; the content of the member it names, earlier in the same stream). Each header's
checksum is checked. What it does not follow (a GNU sparse member, pax sparse keys) stops the
digests, never the stream: the files from there on get no digest and verify reads them.

The stream must end as a tar archive ends (a zero block); one that stops before it, or in the
middle of a member, is truncated (`Digester.truncated`), whatever tar says about it.

One thread hands on and parses: it gives tar a piece, then parses it (a file's data is a slice of
the piece, no copy). Between two pipes (the receiving end: the decompressor's output, tar's input)
tar is given the piece by tee(2) and the thread reads it once to parse it; elsewhere it reads the
piece and writes it to tar. Small files are hashed there. Big ones, with `workers`, by
hashing threads (hashlib releases the GIL on buffers of 2 KiB and more; every piece of one file
goes to the same thread, in order): one file's digest is sequential work (sha256 runs at about
1 GB/s a core), so on a host with cores to spare big files are hashed side by side. The parser
hands a big file's pieces to its thread and goes on to the next member without waiting for them
to be hashed, up to a byte budget for all threads together (`budget`: bounded memory; an eighth
of the memory available, 64 MiB to 1 GiB): with a small per-thread limit the parser would wait on
each big file in turn and the stream run at one core's hashing rate. Each hand-over costs
wake-ups and GIL switches, so a host of two cores (tar, ssh and this share them) hashes
everything in the one thread (receive.receive: no workers), which costs less CPU there than a
parser thread and one hasher (docs/benchmarks.md, "Figures behind choices in the code").

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import os
import queue
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

from . import filehash

BLOCK = 512
CHUNK = 1 << 20  # what one read asks for (a pipe gives at most its size)
PIPE_SIZE = 1 << 20  # asked for both pipes (F_SETPIPE_SZ; a refusal is ignored)
INLINE = 64 << 10  # files up to this size are hashed by the parser's thread, bigger ones
# by the hashing threads (docs/benchmarks.md: what it takes off it)
BUDGET_MIN, BUDGET_MAX = 64 << 20, 1 << 30  # bytes handed to hashing threads, not yet hashed
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (named there from Python 3.10 only)
REGULAR = (b"0", b"\0", b"7")
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # tarfile's rule: these never carry data
ZERO = bytes(BLOCK)


def _tee() -> Optional[Callable[[int, int, int, int], int]]:
    """libc's tee(2) (Linux: the bytes of one pipe put into another too, no copy made), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.tee
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    fn.restype = ctypes.c_ssize_t
    return fn


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


def hash_budget() -> int:
    """How many bytes of big files' data may wait for the hashing threads: an eighth of the
    memory available now, between BUDGET_MIN and BUDGET_MAX (256 MiB where /proc/meminfo does
    not say)."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return max(BUDGET_MIN, min(BUDGET_MAX, int(line.split()[1]) * 1024 // 8))
    except (OSError, ValueError, IndexError):
        pass
    return 256 << 20


class _Hasher:
    """One hashing thread: its queue of (hasher, piece, slot) items, and the bytes handed to it
    and not hashed yet (kept by _Budget, under its lock)."""

    __slots__ = ("queue", "thread", "pending")

    def __init__(self, target: Callable[["_Hasher"], None]) -> None:
        self.queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.pending = 0
        self.thread = threading.Thread(target=target, args=(self,), daemon=True)


class _Budget:
    """Bytes handed to the hashing threads and not hashed yet, in all and per thread
    (_Hasher.pending). `take` waits while they would pass `limit` (a piece always goes when
    nothing is held: one bigger than the limit cannot wait for room)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.cv = threading.Condition()

    def take(self, size: int, worker: _Hasher) -> None:
        with self.cv:
            while self.held and self.held + size > self.limit:
                self.cv.wait()
            self.held += size
            worker.pending += size

    def give(self, size: int, worker: _Hasher) -> None:
        with self.cv:
            self.held -= size
            worker.pending -= size
            self.cv.notify_all()


def _number(field: bytes) -> int:
    """A header number: octal text, or GNU base-256 (first byte 0x80, or 0xff: negative)."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            raise ValueError("a negative number in a tar header")
        return value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    return int(text, 8) if text else 0


def _text(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


def norm(name: bytes) -> Optional[str]:
    """A member's name as the manifest writes the path: no leading `./`, no trailing `/`; None
    for a name tar would rewrite before extracting (absolute, `..`), which gets no digest."""
    text = name.decode("utf-8", "surrogateescape")
    while text.startswith("./"):
        text = text[2:]
    text = text.rstrip("/")
    if not text or text[0] == "/" or (".." in text and ".." in text.split("/")):
        return None
    return text


def _pax(data: bytes) -> Dict[str, bytes]:
    """The records of a pax extended header: `LEN KEY=VALUE\\n`, each."""
    out: Dict[str, bytes] = {}
    at = 0
    while at < len(data) and data[at : at + 1] not in (b"\0", b""):
        space = data.index(b" ", at)
        length = int(data[at:space])
        if length <= 0:
            raise ValueError("a pax record of length %d" % length)
        record = data[space + 1 : at + length - 1]  # without the newline
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value
        at += length
    return out


class Digester:
    """Parses a tar stream fed to it in pieces (`feed`), in order, and keeps each regular file's
    digest by its path (`result`). `stage(in_fd, out_fd)` is the reader itself: a pipeline stage
    (stream.pipeline) that copies in_fd to out_fd and feeds a copy to the parser."""

    def __init__(
        self, algo: str = "sha256", workers: int = 2, budget: Optional[int] = None
    ) -> None:
        self.algo = algo
        self._new = filehash.hasher(algo)
        self.off = 0  # stream offset of what feed sees next
        self.ended = False  # saw the end of the archive (a zero block)
        self.corrupt: Optional[str] = None  # the stream is not a good tar archive: why
        self.lost: Optional[str] = None  # the parser stopped following the stream: why
        self._hdr = bytearray()
        self._left = 0  # data bytes of the current member still to come
        self._pad = 0  # padding after them
        self._sink: Any = None  # where the data goes: a hash's update, or a bytearray
        self._meta: Optional[tuple] = None  # (type, bytearray) of an L/K/x/g member
        self._file: Optional[tuple] = None  # (slot, hash, worker or None) of a file
        self._pending: Dict[str, bytes] = {}
        self._global: Dict[str, bytes] = {}
        # what each member left: (path, slot) in stream order; slots hold digests, or
        # ("link", target path) for a hard link, resolved in order by `result`
        self._order: List[tuple] = []
        self._slots: List[Any] = []
        self._workers: List[_Hasher] = []
        self._nworkers = max(0, workers)
        self._budget = _Budget(hash_budget() if budget is None else budget)
        self._closed = False

    # -- the parser --------------------------------------------------------------------------

    def feed(self, data: Any) -> None:
        mv = memoryview(data)
        while mv.nbytes:
            if self.corrupt or self.lost or (self.ended and not self._hdr):
                self.off += mv.nbytes
                return
            if self._left:
                taken = min(self._left, mv.nbytes)
                if self._sink is not None:
                    self._sink(mv[:taken])
                self._left -= taken
                self.off += taken
                mv = mv[taken:]
                if not self._left:
                    self._member_done()
                continue
            if self._pad:
                taken = min(self._pad, mv.nbytes)
                self._pad -= taken
                self.off += taken
                mv = mv[taken:]
                continue
            if not self._hdr and mv.nbytes >= BLOCK:
                block = mv[:BLOCK].tobytes()
                mv = mv[BLOCK:]
            else:
                taken = min(BLOCK - len(self._hdr), mv.nbytes)
                self._hdr += mv[:taken]
                self.off += taken - BLOCK  # the whole block is counted below
                mv = mv[taken:]
                if len(self._hdr) < BLOCK:
                    self.off += BLOCK
                    return
                block, self._hdr = bytes(self._hdr), bytearray()
            self.off += BLOCK
            self._header(block, self.off - BLOCK)

    def _header(self, header: bytes, at: int) -> None:
        if header == ZERO:
            self.ended = True
            return
        try:
            want = _number(header[148:156])
            size = _number(header[124:136])
        except ValueError as exc:
            self.corrupt = "the tar header at byte %d of the stream: %s" % (at, exc)
            return
        unsigned = sum(header) - sum(header[148:156]) + 256  # the checksum field counts as spaces
        if want != unsigned and want != unsigned - 256 * sum(1 for b in header if b > 127):
            self.corrupt = "the tar header at byte %d of the stream fails its checksum" % at
            return
        kind = header[156:157]
        if kind in (b"L", b"K", b"x", b"g"):
            self._meta = (kind, bytearray())
            self._sink = self._meta[1].extend
            self._expect(size)
            return
        name = _text(header[0:100])
        if header[257:263] == b"ustar\0":  # POSIX ustar: a prefix before the name
            prefix = _text(header[345:500])
            if prefix:
                name = prefix + b"/" + name
        link = _text(header[157:257])
        meta = dict(self._global, **self._pending) if self._pending or self._global else {}
        self._pending = {}
        if meta:
            name = meta.get("path", name)
            link = meta.get("linkpath", link)
            size = int(meta["size"]) if "size" in meta else size
        if kind in (b"S", b"M") or (meta and any(k.startswith("GNU.sparse") for k in meta)):
            self.lost = "member %s of type %s (sparse or multi-volume) is not followed" % (
                name.decode("utf-8", "replace"),
                kind.decode("ascii", "replace"),
            )
            return
        path = norm(name)
        if kind in REGULAR and not (kind == b"\0" and name.endswith(b"/")):
            slot = len(self._slots)
            self._slots.append(None)
            self._order.append((path, slot))
            hasher = self._new()
            worker = self._worker() if size > INLINE else None
            self._file = (slot, hasher, worker)
            self._sink = (
                hasher.update
                if worker is None
                else (lambda piece, w=worker, hs=hasher: self._hand(w, hs, piece))
            )
            self._expect(size)
            return
        if kind == b"1":
            slot = len(self._slots)
            self._slots.append(("link", norm(link)))
            self._order.append((path, slot))
        else:
            self._order.append((path, None))  # a directory, a symlink, a device: no digest
        if kind not in NO_DATA:
            self._sink = None  # an unknown member: its data is skipped
            self._expect(size)

    def _expect(self, size: int) -> None:
        self._left, self._pad = size, (-size) % BLOCK
        if not size:
            self._member_done()

    def _member_done(self) -> None:
        if self._meta is not None:
            kind, data = self._meta
            self._meta = None
            if kind == b"L":
                self._pending["path"] = _text(bytes(data))
            elif kind == b"K":
                self._pending["linkpath"] = _text(bytes(data))
            else:
                try:
                    records = _pax(bytes(data))
                except ValueError as exc:
                    self.corrupt = "a pax header before byte %d: %s" % (self.off, exc)
                    return
                (self._pending if kind == b"x" else self._global).update(records)
        elif self._file is not None:
            slot, hasher, worker = self._file
            if worker is None:
                self._slots[slot] = hasher.hexdigest()
            else:
                worker.queue.put((hasher, None, slot))
        self._file = None
        self._sink = None

    # -- big files' hashing threads ------------------------------------------------------------

    def _worker(self) -> Optional[_Hasher]:
        """The thread for the next big file: a new one while there are fewer than `workers`,
        else the one with the fewest bytes still to hash."""
        if not self._nworkers:
            return None
        if len(self._workers) < self._nworkers:
            worker = _Hasher(self._hash_loop)
            self._workers.append(worker)
            worker.thread.start()
            return worker
        with self._budget.cv:
            return min(self._workers, key=lambda w: w.pending)

    def _hand(self, worker: _Hasher, hasher: Any, piece: memoryview) -> None:
        """A piece of a big file to its thread, once the budget has room for it."""
        self._budget.take(piece.nbytes, worker)
        worker.queue.put((hasher, piece, None))

    def _hash_loop(self, worker: _Hasher) -> None:
        while True:
            item = worker.queue.get()
            if item is None:
                return
            hasher, piece, slot = item
            try:
                if piece is None:
                    self._slots[slot] = hasher.hexdigest()
                else:
                    hasher.update(piece)
            except Exception as exc:
                # a bug: no digests at all; the thread goes on, or the parser would wait for
                # budget this thread never gives back
                self.lost = "a hashing thread failed: %s: %s" % (type(exc).__name__, exc)
            if piece is not None:
                self._budget.give(piece.nbytes, worker)

    def close(self) -> None:
        """Wait for the hashing threads (every digest is in its slot after this)."""
        if self._closed:
            return
        self._closed = True
        for _worker in self._workers:
            _worker.queue.put(None)
        for _worker in self._workers:
            _worker.thread.join()

    @property
    def truncated(self) -> bool:
        """The stream stopped before the archive's end: in a member, or before its zero block."""
        return not (self.corrupt or self.lost) and (
            not self.ended or bool(self._left) or bool(self._hdr)
        )

    def result(self) -> Dict[str, Optional[str]]:
        """path -> digest of its content as the stream carried it (the last member of that path
        wins, as it does on disk); none at all when the parser lost the stream (verify then reads
        every file)."""
        self.close()
        if self.corrupt or self.lost:
            return {}
        out: Dict[str, Optional[str]] = {}
        for path, slot in self._order:
            if path is None:
                continue
            value = None if slot is None else self._slots[slot]
            if isinstance(value, tuple):  # a hard link: the content of its target
                value = out.get(value[1]) if value[1] else None
            if value is None:
                out.pop(path, None)
            else:
                out[path] = value
        return out

    # -- the pipeline stage ------------------------------------------------------------------

    def stage(self, in_fd: int, out_fd: int) -> int:
        """Hand in_fd on to out_fd unchanged and parse each piece right after tar was given it, in
        this one thread (small files are hashed here, big files' pieces go to the hashing
        threads). Between two pipes (the receiving end's) tar is given each piece by tee(2),
        which copies no byte, and this thread reads the same piece once, to parse it; else each
        piece is read and written (a copy more). Ends at the end of in_fd, or when out_fd's
        reader is gone (tar stopped: its own exit code says why); returns 0."""
        for fd in (in_fd, out_fd):
            try:
                import fcntl

                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
            except (OSError, ImportError):
                pass  # not a pipe, or over the host's limit
        try:
            if not self._tee_stage(in_fd, out_fd):
                self._copy_stage(in_fd, out_fd)
        finally:
            self.close()
        return 0

    def _tee_stage(self, in_fd: int, out_fd: int) -> bool:
        """The stage by tee(2) (docs/benchmarks.md, "The relay's CPU"): False, nothing read,
        where there is none (not Linux, no ctypes) or the fds are not two pipes."""
        tee = _tee()
        if tee is None:
            return False
        # one buffer read into again and again, where no hashing thread keeps a piece of it
        buf = bytearray(CHUNK) if not self._nworkers else None
        view = memoryview(buf) if buf is not None else None
        first = True
        while True:
            moved = tee(in_fd, out_fd, CHUNK, 0)
            if moved < 0:
                err = _errno()
                if err == errno.EINTR:
                    continue
                if first and err in (errno.EINVAL, errno.ENOSYS):
                    return False  # not two pipes: the copy does it
                if err != errno.EPIPE:
                    raise OSError(err, os.strerror(err))
                # tar is gone: everything tee'd before was parsed; past the archive's end the
                # rest of in_fd is read unparsed (the sender's writes must not fail), inside it
                # the stage stops
                if self.ended:
                    while os.read(in_fd, CHUNK):
                        pass
                return True
            first = False
            if not moved:
                return True  # the end of in_fd
            if view is None:
                data = os.read(in_fd, moved)  # the pipe holds `moved` bytes at least: all of them
                while len(data) < moved:
                    data += os.read(in_fd, moved - len(data))
                self._parse(data)
                continue
            got = 0
            while got < moved:
                got += os.readv(in_fd, [view[got:moved]])
            self._parse(view[:moved])

    def _copy_stage(self, in_fd: int, out_fd: int) -> None:
        writing = True
        while True:
            data = os.read(in_fd, CHUNK)
            if not data:
                break
            if not writing:
                continue  # past the archive's end, tar gone: read only
            view = memoryview(data)
            try:
                while view.nbytes:
                    view = view[os.write(out_fd, view) :]
            except BrokenPipeError:
                # tar is gone. Whether it had the whole archive is the parser's to say, on
                # every byte written before the pipe broke: past the end, the rest of in_fd
                # is read unparsed (the sender's writes must not fail); inside it, the
                # stage stops
                writing = False
                self._parse(data[: len(data) - view.nbytes])
                if not self.ended:
                    break
                continue
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        try:
            self.feed(data)
        except Exception as exc:  # a parser bug: no digests, the copy goes on
            self.lost = "the tar parser failed at byte %d: %s: %s" % (
                self.off,
                type(exc).__name__,
                exc,
            )
