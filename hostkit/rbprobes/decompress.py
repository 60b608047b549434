"""Decoding fatbin payloads: the LZ4 block and Zstandard decoders and the limits they work within
(rbprobes.fatbin reads the format and calls these on an entry's stored bytes). Stdlib only:
zstd through Python 3.14's compression.zstd, the zstandard module, or libzstd.so.1 by ctypes."""

from __future__ import annotations

import contextlib
import os
import time
from typing import List, Optional, Tuple

# Decoding payloads: only for units without a path to the target (are there kernels in them,
# and which?). The limits, all here, so that a few small entries that declare huge outputs cannot
# cost the source's preflight seconds and hundreds of MB (what they cost unbounded, and the
# largest real entries seen: docs/benchmarks.md, "Figures behind choices in the code"):
#  - ENTRY_CAP: one entry's decoded size, above the largest real entries seen; an entry that
#    declares more is not decoded.
#  - AUDIT_OUTPUT_BUDGET: decoded bytes for a whole audit run (every file, every worker).
#  - AUDIT_DEADLINE_S: seconds after the audit's start after which nothing more is decoded.
#  - FILE_INPUT_BUDGET: compressed bytes decoded per file (checks_static).
# Every decoder stops at the entry's declared size (more output is Unreadable: corrupt) and
# checks the deadline as it goes (every DECODE_CHUNK of output at most); an entry the budget,
# the deadline or the cap leaves undecoded is NotDecoded: its unit is not proven, never passed.
ENTRY_CAP = 128 << 20
AUDIT_OUTPUT_BUDGET = 2 << 30
AUDIT_DEADLINE_S = 60.0
FILE_INPUT_BUDGET = 64 << 20
DECODE_CHUNK = 4 << 20
_TOKEN = 1 << 20  # the run's output budget is shared as tokens of this many bytes


class Unreadable(ValueError):
    """A payload that cannot be decoded: corrupt, truncated, or larger than it says."""


class NotDecoded(Unreadable):
    """A payload left undecoded by a limit (ENTRY_CAP, the run's output budget or deadline):
    nothing is known of it, so what depends on it is not proven."""


def mib(size: int) -> str:
    return "%d MiB" % (size >> 20) if size >= 1 << 20 else "%d bytes" % size


class DecodeBudget:
    """What one audit run may decode: `output` bytes of decoded output in all, and nothing once
    `seconds` have passed since it was made. Shared by the run's forked workers: the bytes are
    tokens of _TOKEN bytes in a pipe (a read takes, a write gives back, both atomic), taken
    before an entry is decoded (its declared size) and the unused part given back after. A
    process keeps less than one token between entries. `close()` when the run is done."""

    def __init__(self, output: Optional[int] = None, seconds: Optional[float] = None):
        self.output = AUDIT_OUTPUT_BUDGET if output is None else output
        self.seconds = AUDIT_DEADLINE_S if seconds is None else seconds
        self.deadline = time.monotonic() + self.seconds
        output = self.output
        self._held = 0  # bytes this process took from the pipe and did not use yet
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        tokens = output // _TOKEN
        while tokens > 0:  # more than the pipe holds: only the first pipeful (64 GiB on Linux)
            try:
                tokens -= os.write(self._w, b"\0" * min(tokens, 1 << 16))
            except BlockingIOError:
                break
        os.set_blocking(self._w, False)

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1

    def expired(self) -> Optional[str]:
        if time.monotonic() > self.deadline:
            return "the audit's decoding deadline (%g s) passed" % self.seconds
        return None

    def take(self, size: int) -> None:
        """Room for `size` decoded bytes, or NotDecoded (the deadline passed, the budget spent)."""
        why = self.expired()
        if why:
            raise NotDecoded("not decoded: %s" % why)
        need = -(-(size - self._held) // _TOKEN)
        got = 0
        while got < need:
            try:
                chunk = os.read(self._r, need - got)
            except (BlockingIOError, OSError):
                chunk = b""
            if not chunk:
                break
            got += len(chunk)
        if got < need:
            self._give(got)
            raise NotDecoded(
                "not decoded: the audit's budget of %s of decoded output is spent "
                "(this entry declares %s)" % (mib(self.output), mib(size))
            )
        self._held += got * _TOKEN

    def used(self, decoded: int) -> None:
        """`decoded` of the bytes taken were decoded; whole tokens not used go back to the pipe."""
        self._held = max(0, self._held - decoded)
        back = self._held // _TOKEN
        if back:
            self._held -= back * _TOKEN
            self._give(back)

    def _give(self, tokens: int) -> None:
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0" * tokens)


def _past(deadline: Optional[float], produced: int):
    """Raise NotDecoded when the deadline passed (`produced` bytes were decoded by then)."""
    if deadline is not None and time.monotonic() > deadline:
        exc = NotDecoded("not decoded: the audit's decoding deadline passed")
        exc.produced = produced  # type: ignore[attr-defined]
        raise exc


def zstd_decompress(raw: bytes, limit: int, deadline: Optional[float] = None):
    """At most `limit` bytes out of one zstd frame, DECODE_CHUNK at a time (stopped at
    `deadline`, a time.monotonic() value); None when no decoder is available."""
    try:
        from compression import zstd  # type: ignore  # Python 3.14+
    except ImportError:
        zstd = None
    if zstd is not None:
        decoder = zstd.ZstdDecompressor()
        out = bytearray()
        data = raw
        try:
            while not decoder.eof:
                _past(deadline, len(out))
                out += decoder.decompress(data, max_length=min(DECODE_CHUNK, limit + 1 - len(out)))
                data = b""
                if len(out) > limit:
                    raise Unreadable("zstd output exceeds the declared %d bytes" % limit)
                if decoder.needs_input and not decoder.eof:
                    raise Unreadable("truncated zstd frame")
        except zstd.ZstdError as exc:
            raise Unreadable("zstd: %s" % exc) from None
        return out
    try:
        import zstandard  # type: ignore
    except ImportError:
        zstandard = None
    if zstandard is not None:
        out = bytearray()
        try:
            declared = zstandard.frame_content_size(raw)
            if declared > limit:
                raise Unreadable("zstd frame declares %d bytes, the entry %d" % (declared, limit))
            with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
                while True:
                    _past(deadline, len(out))
                    chunk = reader.read(min(DECODE_CHUNK, limit + 1 - len(out)))
                    if not chunk:
                        break
                    out += chunk
                    if len(out) > limit:
                        raise Unreadable("zstd output exceeds the declared %d bytes" % limit)
        except zstandard.ZstdError as exc:
            raise Unreadable("zstd: %s" % exc) from None
        if 0 <= declared != len(out):  # the reader ends quietly where the input does
            raise Unreadable("truncated zstd frame")
        return out
    lib = _libzstd()
    if lib is None:
        return None
    return _libzstd_stream(lib, raw, limit, deadline)


def _libzstd_stream(lib, raw: bytes, limit: int, deadline: Optional[float]) -> bytearray:
    """One zstd frame through libzstd's streaming API, straight into the bytearray it returns
    (as large as the frame declares, plus one byte to see more; grown a chunk at a time when it
    does not say), DECODE_CHUNK of output per call."""
    import ctypes

    declared = lib.ZSTD_getFrameContentSize(raw, len(raw))
    known = declared < (1 << 64) - 2  # not UNKNOWN (-1) nor ERROR (-2)
    if known and declared > limit:
        raise Unreadable("zstd frame declares %d bytes, the entry %d" % (declared, limit))
    most = declared if known else limit
    out = bytearray((declared if known else min(DECODE_CHUNK, limit)) + 1)
    pos = 0
    src = ctypes.c_char_p(raw)  # raw's own bytes, not a copy
    inb = _ZstdIn(ctypes.cast(src, ctypes.c_void_p), len(raw), 0)
    ds = lib.ZSTD_createDStream()
    if not ds:
        raise MemoryError("ZSTD_createDStream")
    try:
        lib.ZSTD_initDStream(ds)
        while True:
            _past(deadline, pos)
            if pos == len(out):  # a frame that does not say its size: room for a chunk more
                out.extend(bytes(min(DECODE_CHUNK, most + 1 - pos)))
            view = (ctypes.c_char * (len(out) - pos)).from_buffer(out, pos)
            outb = _ZstdOut(ctypes.addressof(view), min(DECODE_CHUNK, len(out) - pos), 0)
            ret = lib.ZSTD_decompressStream(ds, ctypes.byref(outb), ctypes.byref(inb))
            del view
            if lib.ZSTD_isError(ret):
                raise Unreadable("zstd: %s" % lib.ZSTD_getErrorName(ret).decode("ascii", "replace"))
            pos += outb.pos
            if pos > most:
                raise Unreadable("zstd output exceeds the declared %d bytes" % most)
            if ret == 0:
                break
            if inb.pos == inb.size and outb.pos < outb.size:
                raise Unreadable("truncated zstd frame")
    finally:
        lib.ZSTD_freeDStream(ds)
    del out[pos:]
    return out


_LIBZSTD: List[object] = []


def _zstd_types():
    import ctypes

    class _In(ctypes.Structure):
        _fields_ = [("src", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]

    class _Out(ctypes.Structure):
        _fields_ = [("dst", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]

    return _In, _Out


def _libzstd():
    """libzstd.so.1 through ctypes (present on most Linux hosts), or None."""
    global _ZstdIn, _ZstdOut
    if not _LIBZSTD:
        lib = None
        try:
            import ctypes

            lib = ctypes.CDLL("libzstd.so.1")
            size_t, vp = ctypes.c_size_t, ctypes.c_void_p
            lib.ZSTD_isError.restype = ctypes.c_uint
            lib.ZSTD_isError.argtypes = [size_t]
            lib.ZSTD_getErrorName.restype = ctypes.c_char_p
            lib.ZSTD_getErrorName.argtypes = [size_t]
            lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
            lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, size_t]
            lib.ZSTD_createDStream.restype = vp
            lib.ZSTD_createDStream.argtypes = []
            lib.ZSTD_initDStream.restype = size_t
            lib.ZSTD_initDStream.argtypes = [vp]
            lib.ZSTD_freeDStream.restype = size_t
            lib.ZSTD_freeDStream.argtypes = [vp]
            _ZstdIn, _ZstdOut = _zstd_types()
            lib.ZSTD_decompressStream.restype = size_t
            lib.ZSTD_decompressStream.argtypes = [
                vp,
                ctypes.POINTER(_ZstdOut),
                ctypes.POINTER(_ZstdIn),
            ]
        except (OSError, AttributeError):
            lib = None
        _LIBZSTD.append(lib)
    return _LIBZSTD[0]


_ZstdIn = _ZstdOut = None


def zstd_decoder() -> Optional[str]:
    """Which zstd decoder this host has ("compression.zstd", "zstandard", "libzstd"), or None."""
    try:
        from compression import zstd  # type: ignore  # noqa: F401

        return "compression.zstd"
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore  # noqa: F401

        return "zstandard"
    except ImportError:
        pass
    return "libzstd" if _libzstd() is not None else None


def _lz4_length(src: bytes, pos: int, length: int, room: int) -> Tuple[int, int]:
    """A 4-bit length of 15 continues in bytes of 255 until one is smaller. `room`: the output
    left; a longer length is refused as soon as it is seen."""
    if length != 15:
        return length, pos
    end = len(src)
    while True:
        if pos >= end:
            raise Unreadable("truncated LZ4 block: a length runs past the input")
        extra = src[pos]
        pos += 1
        length += extra
        if length > room:
            raise Unreadable("LZ4 output exceeds the declared size")
        if extra != 255:
            return length, pos


def lz4_block_decompress(src: bytes, size: int, deadline: Optional[float] = None) -> bytearray:
    """Decode one LZ4 block (the format of flag 0x2000) into at most `size` bytes (the entry's
    declared uncompressed size). Raises Unreadable for output past `size`, a match before the
    start of the output, or input that ends in the middle of a sequence; NotDecoded once
    `deadline` (a time.monotonic() value) has passed, checked every 1024 sequences and every
    DECODE_CHUNK of a long match."""
    if size > ENTRY_CAP:
        raise NotDecoded(
            "not decoded: declared size %d exceeds the %d-byte cap for one entry"
            % (size, ENTRY_CAP)
        )
    dst = bytearray()
    try:
        _lz4_into(dst, src, size, deadline)
    except Unreadable as exc:
        exc.produced = len(dst)  # type: ignore[attr-defined]
        raise
    return dst


def _lz4_into(dst: bytearray, src: bytes, size: int, deadline: Optional[float]) -> None:
    pos, end = 0, len(src)
    steps = 0
    while pos < end:
        steps += 1
        if deadline is not None and not steps & 1023:
            _past(deadline, len(dst))
        token = src[pos]
        pos += 1
        length, pos = _lz4_length(src, pos, token >> 4, size - len(dst))
        if pos + length > end:
            raise Unreadable(
                "truncated LZ4 block: %d literal bytes past the input" % (pos + length - end)
            )
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        dst += src[pos : pos + length]
        pos += length
        if pos >= end or len(dst) == size:
            break  # the last sequence has literals only
        if pos + 2 > end:
            raise Unreadable("truncated LZ4 block: no room for a match offset")
        offset = src[pos] | (src[pos + 1] << 8)
        pos += 2
        if offset == 0 or offset > len(dst):
            raise Unreadable("corrupt LZ4 block: match offset %d at output %d" % (offset, len(dst)))
        length, pos = _lz4_length(src, pos, token & 15, size - len(dst))
        length += 4
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        start = len(dst) - offset
        if offset >= length:
            dst += dst[start : start + length]
            continue
        # overlapping: the last `offset` bytes repeat. Appended a block of whole periods at a
        # time (at most about DECODE_CHUNK), so a long match costs no more memory than that
        # and the deadline is looked at between blocks.
        period = bytes(dst[start:])
        block = period * (min(length, DECODE_CHUNK) // offset + 1)
        while length > len(block):
            _past(deadline, len(dst))
            dst += block
            length -= len(block)
        dst += block[:length]
