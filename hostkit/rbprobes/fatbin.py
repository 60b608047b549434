"""A pure-Python reader of NVIDIA fat binaries (no CUDA toolkit needed).

Where GPU code lives in a shared object:
- `.nv_fatbin`: the fatbins the CUDA runtime registers when the library loads (what runs);
- `__nv_relfatbin`: relocatable device code kept for a later device link (-rdc); it only counts
  when a file has no `.nv_fatbin`;
- `.nvFatBinSegment`: 24-byte `__fatBinC_Wrapper_t` records {u32 magic 0x466243B1, u32 version,
  u64 fatbin address, u64 aux address}, one per registered fatbin. They hold no code, but tell
  which containers form one module: nvcc 13's `-shared` (and any device link) writes a version-2
  wrapper for the device-linked container and version-1 wrappers for each translation unit's own
  container; the runtime may fall back from the linked cubin to those units' PTX, so together
  they are one module (see `Scan.modules`).

A section holds one or more *containers*, back to back (8-byte aligned):

    container header, 16 bytes:  u32 magic 0xBA55ED50 | u16 version (1) | u16 header size (16)
                                 | u64 size of the entries that follow
    entry header, >= 64 bytes:   0  u16 kind (1 PTX, 2 ELF/SASS, 8 LTO-IR)   2  u16 (0x0101)
                                 4  u32 entry header size (64, 80, 96, 112: CUDA 12.8+ appends
                                        an option block for newer targets)
                                 8  u64 payload size (8-byte padded)
                                 16 u32 compressed size (0 if not compressed)
                                 20 u32 offset of the option block in the header (0 if none)
                                 24 u16 minor, 26 u16 major: PTX ISA version for PTX entries,
                                        the cubin ABI version ([1, 8]) for ELF entries
                                 28 u32 arch number: 90 = sm_90, 103 = sm_103, 120 = sm_120
                                 32 u32 name offset, 36 u32 name length
                                 40 u64 flags
                                 56 u64 uncompressed size (when compressed)
                                 then the payload, right after the entry header.

Flag bits, as nvcc 13.0 writes them (found by building the same kernel for sm_90 / sm_90a /
sm_100a / sm_100f / compute_100{,a,f} and comparing the bytes; see docs/probes.md):
    0x000001 64-bit, 0x000010 Linux host,
    0x002000 compressed, LZ4 block format (`-compress-mode=speed`, and CUDA < 12.8),
    0x008000 compressed, Zstandard (CUDA 12.8+ default; `size`, `balance`, `default`),
    0x100000 arch-specific code: `sm_90a`, `compute_100a` (the arch number stays 90 / 100),
    0x200000 family-specific code: `sm_100f`, `compute_100f`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
import struct
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import arch, elf

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

KIND_PTX = 1
KIND_ELF = 2
KIND_LTO = 8  # LTO-IR (`code=lto_90`): input for nvJitLink, never loaded as it is

FLAG_64BIT = 0x1
FLAG_LINUX = 0x10
FLAG_COMPRESS_LZ4 = 0x2000
FLAG_COMPRESS_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

RUNTIME_SECTION = ".nv_fatbin"
RELOCATABLE_SECTION = "__nv_relfatbin"
WRAPPER_SECTION = ".nvFatBinSegment"
# Data sections where a library may keep fatbins it loads itself (cuModuleLoadData,
# cuLibraryLoadData): libcufft.so.12 keeps ~24,000 containers in .ldata and a single sm_75 one in
# .nv_fatbin. Searched only in files that have one of the sections above.
EMBEDDED_PREFIXES = (".rodata", ".lrodata", ".data", ".ldata")

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class Entry(NamedTuple):
    kind: str  # "sass", "ptx", "lto", or "kind<N>" for kinds this reader does not know
    number: int  # arch number: 90, 100, 103, 120
    suffix: str  # "", "a" or "f"
    version: Tuple[int, int]  # PTX ISA version (PTX), cubin ABI version (SASS)
    flags: int
    compression: Optional[str]  # None, "lz4", "zstd"
    payload_offset: int  # absolute offset in the buffer
    stored_size: int  # bytes stored (compressed size when compressed)
    size: int  # uncompressed size: the header's declared size when compressed (0: not given),
    #            else the (padded) payload size

    @property
    def name(self) -> str:
        """sm_100a, compute_90, ..."""
        if self.kind == "lto":
            return "lto_%d%s" % (self.number, self.suffix)
        if self.kind not in ("sass", "ptx"):
            return "%s_%d%s" % (self.kind, self.number, self.suffix)
        return arch.code_name(self.kind, self.number, self.suffix)


class Container(NamedTuple):
    section: str
    offset: int
    entries: List[Entry]
    error: Optional[str]  # set when the container is truncated or malformed
    wrapper: Optional[int] = None  # version of the wrapper record pointing at it, if any

    @property
    def label(self) -> str:
        """Where it is: `.nv_fatbin+0x8e990` (the file offset of its header)."""
        return "%s+0x%x" % (self.section, self.offset)


class Scan(NamedTuple):
    """What one file holds: its containers (runtime and relocatable) and wrapper count."""

    path: str
    kind: str  # "elf", "cubin", "fatbin", "not-elf", "not-regular", "error"
    containers: List[Container]
    wrappers: int
    error: Optional[str]

    @property
    def embedded_containers(self) -> List[Container]:
        """Containers found in data sections: loaded by the library itself, if at all."""
        return [c for c in self.containers if c.section.startswith(EMBEDDED_PREFIXES)]

    @property
    def runtime_containers(self) -> List[Container]:
        """The containers the CUDA runtime registers when the file is loaded (`__nv_relfatbin`
        ones only when there is nothing else)."""
        registered = [c for c in self.containers if not c.section.startswith(EMBEDDED_PREFIXES)]
        rt = [c for c in registered if c.section != RELOCATABLE_SECTION]
        return rt if rt else registered

    @property
    def units(self) -> List[List[Container]]:
        """What is judged on its own: each registered container (one translation unit, or one
        device link), and all embedded containers together (the library picks among them).

        nvcc 13 registers, for a non-rdc `-shared` build, one container per translation unit
        (version-1 wrapper, the unit's SASS and PTX) and a kernel-free device-linked one
        (version-2 wrapper); the runtime loads each as a module of its own, so a unit built for
        other archs fails to launch even when its neighbour has the target's code. With -rdc
        the device-linked container (version 2) holds every unit's kernels as SASS for the
        link's archs only, and the units' relocatable code sits in `__nv_relfatbin` (version-1
        wrappers): when the linked SASS does not fit, the runtime falls back to those units,
        each on its own (seen on the H200), so such a unit is [linked container] + those
        relocatable containers (`linked_group`; checks_static.judged_units splits it)."""
        embedded = self.embedded_containers
        rt = self.runtime_containers
        rdc = [c for c in self.containers
               if c.section == RELOCATABLE_SECTION and c.wrapper == 1 and c not in rt]
        units = [[c] + rdc if c.wrapper == 2 and rdc else [c] for c in rt]
        return units + ([embedded] if embedded else [])

    @property
    def modules(self) -> List[List[Container]]:
        """The old name of `units`."""
        return self.units

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


def linked_group(unit: List[Container]) -> bool:
    """A device-linked container followed by the relocatable units it was linked from."""
    return (len(unit) > 1 and unit[0].wrapper == 2
            and all(c.section == RELOCATABLE_SECTION for c in unit[1:]))


def _suffix(flags: int) -> str:
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    if flags & FLAG_FAMILY:
        return "f"
    return ""


def _compression(flags: int) -> Optional[str]:
    if flags & FLAG_COMPRESS_ZSTD:
        return "zstd"
    if flags & FLAG_COMPRESS_LZ4:
        return "lz4"
    return None


def parse_entries(buf, start: int, end: int,
                  strict: bool = False) -> Tuple[List[Entry], Optional[str]]:
    """Entries of one container whose entry area is buf[start:end]. `strict` (for containers
    found by searching data sections) rejects any entry that is not PTX, ELF or LTO-IR of
    version 0x0101, so random bytes that happen to hold the magic are not taken for code."""
    entries = []
    pos = start
    while pos + 64 <= end:
        kind_code, v, hsize, size = struct.unpack_from("<HHIQ", buf, pos)
        if strict and (v != 0x0101 or kind_code not in (KIND_PTX, KIND_ELF, KIND_LTO)):
            return [], "not a fatbin entry at offset %d" % pos
        if hsize < 64 or pos + hsize + size > end:
            return entries, "entry at offset %d overruns its container" % pos
        (compressed,) = struct.unpack_from("<I", buf, pos + 16)
        minor, major, number = struct.unpack_from("<HHI", buf, pos + 24)
        (flags,) = struct.unpack_from("<Q", buf, pos + 40)
        (usize,) = struct.unpack_from("<Q", buf, pos + 56)
        kind = {KIND_PTX: "ptx", KIND_ELF: "sass", KIND_LTO: "lto"}.get(
            kind_code, "kind%d" % kind_code)
        comp = _compression(flags)
        if comp and compressed > size:
            return entries, ("entry at offset %d: compressed size %d exceeds its payload of %d"
                             % (pos, compressed, size))
        entries.append(Entry(
            kind, number, _suffix(flags), (major, minor), flags, comp, pos + hsize,
            compressed if comp and compressed else size, usize if comp else size))
        pos += hsize + size
    if pos != end and end - pos >= 8 and any(bytes(buf[pos:end])):
        return entries, "%d stray bytes after the last entry at offset %d" % (end - pos, pos)
    return entries, None


def parse_containers(buf, start: int, end: int, section: str,
                     strict: bool = False) -> List[Container]:
    """Every fatbin container found in buf[start:end] (`strict`: see parse_entries; a
    container that fails it is dropped, not reported)."""
    out = []
    pos = buf.find(_MAGIC_BYTES, start, end)
    while 0 <= pos and pos + 16 <= end:
        _m, version, hsize, fsize = struct.unpack_from("<IHHQ", buf, pos)
        if version != 1 or hsize < 16 or pos + hsize > end:
            pos = buf.find(_MAGIC_BYTES, pos + 4, end)
            continue
        cend = pos + hsize + fsize
        error = None
        if cend > end:
            error = "container at offset %d claims %d bytes past its section" % (pos, cend - end)
            cend = end
        entries, entry_error = parse_entries(buf, pos + hsize, cend, strict)
        if strict and (error or entry_error or not entries):
            pos = buf.find(_MAGIC_BYTES, pos + 4, end)
            continue
        if entries or error or entry_error:
            out.append(Container(section, pos, entries, error or entry_error))
        pos = buf.find(_MAGIC_BYTES, max(cend, pos + 4), end)
    return out


_TKINFO_ARCH = re.compile(rb"-arch (sm_[0-9]{2,3}[af]?)")


def _cubin_entry(buf, image: elf.Elf) -> Entry:
    """A standalone cubin: the arch from the toolkit note (ptxas's `-arch sm_90a`), else e_flags."""
    for sec in image.sections:
        if sec.name == ".note.nv.tkinfo":
            m = _TKINFO_ARCH.search(elf.section_bytes(buf, sec))
            if m:
                _k, major, minor, suffix = arch.parse_arch(m.group(1).decode())
                return Entry("sass", major * 10 + minor, suffix, (0, 0), 0, None, 0, len(buf),
                             len(buf))
    number = (image.flags >> 8) & 0xFF if image.abiversion >= 8 else image.flags & 0xFF
    return Entry("sass", number, "", (0, 0), 0, None, 0, len(buf), len(buf))


_FATBIN_SECTIONS = (RUNTIME_SECTION, RELOCATABLE_SECTION, WRAPPER_SECTION)
NO_SECTION_TABLE = "<no section table>"


def scan_buffer(buf, path: str = "<buffer>", embedded: bool = True) -> Scan:
    """Scan an in-memory image (ELF shared object or object, cubin, or a raw fatbin).
    `embedded`: also search the data sections of a file with GPU code (EMBEDDED_PREFIXES).
    Raises elf.ElfError for an ELF image whose section table cannot be read."""
    if bytes(buf[:4]) == _MAGIC_BYTES:
        return Scan(path, "fatbin", parse_containers(buf, 0, len(buf), "<fatbin>"), 0, None)
    image = elf.parse(buf)
    if image is None:
        return Scan(path, "not-elf", [], 0, None)
    if image.machine == elf.EM_CUDA:
        entry = _cubin_entry(buf, image)
        return Scan(path, "cubin", [Container("<cubin>", 0, [entry], None)], 0, None)
    if not image.sections:
        # A stripped image without section headers (sstrip): the runtime still registers
        # its fatbins (the registration code holds their addresses), so search all of it.
        found = parse_containers(buf, 0, len(buf), NO_SECTION_TABLE, strict=True)
        return Scan(path, "elf", found, 0, None)
    containers: List[Container] = []
    versions: Dict[int, int] = {}  # container file offset -> wrapper version
    wrappers = 0
    for sec in image.sections:
        if sec.name not in _FATBIN_SECTIONS or sec.type == elf.SHT_NOBITS:
            continue
        if not elf.in_file(buf, sec):
            containers.append(Container(sec.name, sec.offset, [], (
                "section %s (%d bytes at offset %d) lies outside the file (%d bytes): truncated?"
                % (sec.name, sec.size, sec.offset, len(buf)))))
        elif sec.name in (RUNTIME_SECTION, RELOCATABLE_SECTION):
            containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size, sec.name))
        else:
            for magic, version, data in _wrappers(buf, sec):
                wrappers += magic == WRAPPER_MAGIC
                where = elf.file_offset(image, data) if magic == WRAPPER_MAGIC and data else None
                if where is not None:
                    versions[where] = version
    containers = [c._replace(wrapper=versions.get(c.offset)) for c in containers]
    if embedded and (containers or wrappers):
        for sec in image.sections:
            if (sec.type == elf.SHT_PROGBITS and sec.name.startswith(EMBEDDED_PREFIXES)
                    and elf.in_file(buf, sec)):
                containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size,
                                                   sec.name, strict=True))
    return Scan(path, "elf", containers, wrappers, None)


def _wrappers(buf, sec: elf.Section):
    """(magic, version, fatbin address) of each 24-byte wrapper record. The address is the one
    stored in the file (the linker writes it there as well as into the RELATIVE relocation)."""
    for pos in range(sec.offset, sec.offset + sec.size - 23, 24):
        yield struct.unpack_from("<IIQ", buf, pos)


def scan_file(path: str, embedded: bool = True, follow: bool = False) -> Scan:
    """Scan one file through a read-only mmap (never reads a big library into memory). Only a
    regular file is read: the open does not block (a FIFO named `x.so` must not hang the
    audit) and, unless `follow`, does not follow a symbolic link."""
    with mapped(path, embedded, follow) as (scan, _buf):
        return scan


@contextlib.contextmanager
def mapped(path: str, embedded: bool = True, follow: bool = False):
    """`with mapped(path) as (scan, buf)`: scan_file, with the file's read-only mmap kept open
    for decoding payloads (buf is None when nothing was mapped)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        yield Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc.strerror or exc)), None
        return
    mm = None
    try:
        scan = None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                scan = Scan(path, "not-regular", [], 0, None)
            elif st.st_size < 16 or os.pread(fd, 4, 0) not in (elf.MAGIC, _MAGIC_BYTES):
                scan = Scan(path, "not-elf", [], 0, None)
            else:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                scan = scan_buffer(mm, path, embedded)
        except (OSError, ValueError) as exc:  # elf.ElfError is a ValueError
            scan = Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc))
        yield scan, mm
    finally:
        if mm is not None:
            mm.close()
        os.close(fd)


# Decoding payloads: only for units without a path to the target (are there kernels in them,
# and which?). The limits, all here (issue 33 N8: ten 1 MB LZ4 entries that expanded to 256 MB
# each took 9.7 s and 552 MB in the source preflight):
#  - ENTRY_CAP: one entry's decoded size. The largest real entries seen: 70.9 MB (PTX of
#    compute_75 in libcusparseLt.so.0, cusparselt-cu13 0.8.1), 48.8 MB (libcudnn_engines_
#    precompiled.so.9), 42.3 MB (libtorch_cuda.so, torch 2.14.1); an entry that declares more
#    is not decoded.
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
DECODE_CAP = ENTRY_CAP  # the old name
_TOKEN = 1 << 20  # the run's output budget is shared as tokens of this many bytes


class Unreadable(ValueError):
    """A payload that cannot be decoded: corrupt, truncated, or larger than it says."""


class NotDecoded(Unreadable):
    """A payload left undecoded by a limit (ENTRY_CAP, the run's output budget or deadline):
    nothing is known of it, so what depends on it is not proven."""


def _mib(n: int) -> str:
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d bytes" % n


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
            raise NotDecoded("not decoded: the audit's budget of %s of decoded output is spent "
                             "(this entry declares %s)" % (_mib(self.output), _mib(size)))
        self._held += got * _TOKEN

    def used(self, n: int) -> None:
        """`n` of the bytes taken were decoded; whole tokens not used go back to the pipe."""
        self._held = max(0, self._held - n)
        back = self._held // _TOKEN
        if back:
            self._held -= back * _TOKEN
            self._give(back)

    def _give(self, tokens: int) -> None:
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0" * tokens)


def _limit(entry: Entry) -> int:
    if entry.compression and entry.size <= 0:
        raise Unreadable("%s entry declares no uncompressed size" % entry.compression)
    if entry.size > ENTRY_CAP:
        raise NotDecoded("not decoded: declares %d decoded bytes, more than the cap for one "
                         "entry (%s; the largest real entry seen has 71 MB)"
                         % (entry.size, _mib(ENTRY_CAP)))
    return entry.size


def payload(buf, entry: Entry, budget: Optional[DecodeBudget] = None):
    """The entry's code (bytes, or a bytearray when it was decompressed); None when it is
    Zstandard-compressed and no zstd decoder (Python 3.14's compression.zstd, the zstandard
    module, or libzstd.so.1 through ctypes) is available. Raises Unreadable for a payload that
    does not decode within its declared size, NotDecoded for one a limit left undecoded (the
    entry cap; with `budget`, the run's output budget and deadline)."""
    end = entry.payload_offset + entry.stored_size
    if end > len(buf):
        raise Unreadable("payload runs past the end of the data")
    if entry.compression is None:
        return bytes(buf[entry.payload_offset:end])
    limit = _limit(entry)
    raw = bytes(buf[entry.payload_offset:end])
    deadline = None
    if budget is not None:
        budget.take(limit)
        deadline = budget.deadline
    out = None
    produced = limit
    try:
        if entry.compression == "lz4":
            out = lz4_block_decompress(raw, limit, deadline)
        elif not raw.startswith(_ZSTD_MAGIC):
            raise Unreadable("entry is flagged zstd but its payload has no zstd frame magic")
        elif deadline is None:
            out = zstd_decompress(raw, limit)
        else:
            out = zstd_decompress(raw, limit, deadline)
        produced = len(out) if out is not None else 0
        return out
    except Unreadable as exc:
        produced = getattr(exc, "produced", limit)
        raise
    finally:
        if budget is not None:
            budget.used(produced)


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
        d = zstd.ZstdDecompressor()
        out = bytearray()
        data = raw
        try:
            while not d.eof:
                _past(deadline, len(out))
                out += d.decompress(data, max_length=min(DECODE_CHUNK, limit + 1 - len(out)))
                data = b""
                if len(out) > limit:
                    raise Unreadable("zstd output exceeds the declared %d bytes" % limit)
                if d.needs_input and not d.eof:
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
                raise Unreadable("zstd: %s" % lib.ZSTD_getErrorName(ret).decode("ascii",
                                                                                "replace"))
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
        _fields_ = [("src", ctypes.c_void_p), ("size", ctypes.c_size_t),
                    ("pos", ctypes.c_size_t)]

    class _Out(ctypes.Structure):
        _fields_ = [("dst", ctypes.c_void_p), ("size", ctypes.c_size_t),
                    ("pos", ctypes.c_size_t)]

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
            lib.ZSTD_decompressStream.argtypes = [vp, ctypes.POINTER(_ZstdOut),
                                                  ctypes.POINTER(_ZstdIn)]
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


def _lz4_length(src: bytes, i: int, length: int, room: int) -> Tuple[int, int]:
    """A 4-bit length of 15 continues in bytes of 255 until one is smaller. `room`: the output
    left; a longer length is refused as soon as it is seen."""
    if length != 15:
        return length, i
    n = len(src)
    while True:
        if i >= n:
            raise Unreadable("truncated LZ4 block: a length runs past the input")
        extra = src[i]
        i += 1
        length += extra
        if length > room:
            raise Unreadable("LZ4 output exceeds the declared size")
        if extra != 255:
            return length, i


def lz4_block_decompress(src: bytes, size: int, deadline: Optional[float] = None) -> bytearray:
    """Decode one LZ4 block (the format of flag 0x2000) into at most `size` bytes (the entry's
    declared uncompressed size). Raises Unreadable for output past `size`, a match before the
    start of the output, or input that ends in the middle of a sequence; NotDecoded once
    `deadline` (a time.monotonic() value) has passed, checked every 1024 sequences and every
    DECODE_CHUNK of a long match."""
    if size > ENTRY_CAP:
        raise NotDecoded("not decoded: declared size %d exceeds the %d-byte cap for one entry"
                         % (size, ENTRY_CAP))
    dst = bytearray()
    try:
        _lz4_into(dst, src, size, deadline)
    except Unreadable as exc:
        exc.produced = len(dst)  # type: ignore[attr-defined]
        raise
    return dst


def _lz4_into(dst: bytearray, src: bytes, size: int, deadline: Optional[float]) -> None:
    i, n = 0, len(src)
    steps = 0
    while i < n:
        steps += 1
        if deadline is not None and not steps & 1023:
            _past(deadline, len(dst))
        token = src[i]
        i += 1
        length, i = _lz4_length(src, i, token >> 4, size - len(dst))
        if i + length > n:
            raise Unreadable("truncated LZ4 block: %d literal bytes past the input" % (
                i + length - n))
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        dst += src[i:i + length]
        i += length
        if i >= n or len(dst) == size:
            break  # the last sequence has literals only
        if i + 2 > n:
            raise Unreadable("truncated LZ4 block: no room for a match offset")
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(dst):
            raise Unreadable("corrupt LZ4 block: match offset %d at output %d"
                             % (offset, len(dst)))
        length, i = _lz4_length(src, i, token & 15, size - len(dst))
        length += 4
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        start = len(dst) - offset
        if offset >= length:
            dst += dst[start:start + length]
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


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$]*)")


def entry_kernels(buf, entry: Entry, run: Optional[DecodeBudget] = None) -> Optional[List[str]]:
    """The kernels of a SASS or PTX entry (a cubin's STO_CUDA_ENTRY symbols, PTX `.entry`
    names); [] for code without any kernel; None when it cannot be decoded here (zstd without a
    decoder). Raises Unreadable for a payload that does not decode or is not a cubin, NotDecoded
    for one a limit left undecoded (`run`: the audit run's budget and deadline)."""
    data = payload(buf, entry, run)
    if data is None:
        return None
    if entry.kind == "ptx":
        found = []
        for m in _PTX_ENTRY.finditer(data):
            name = m.group(1).decode("latin-1")
            if name not in found:
                found.append(name)
        return found
    try:
        image = elf.parse(data)
    except elf.ElfError as exc:
        raise Unreadable("cubin: %s" % exc) from None
    if image is None or image.machine != elf.EM_CUDA:
        raise Unreadable("payload of a SASS entry is not a CUDA ELF image")
    return elf.kernels(data, image)


class UnitKernels(NamedTuple):
    names: List[str]  # kernels found (mangled names as the symbol table has them)
    complete: bool  # every container with code was decoded: `names == []` means kernel-free
    error: Optional[str]  # a payload that is corrupt (the unit is unreadable)
    undecoded: str  # why some container was not decoded ("" when complete)
    limited: bool = False  # a limit (budget, deadline, cap) left it undecoded: not proven

    @property
    def kernel_free(self) -> bool:
        return self.complete and not self.names and not self.error


def unit_kernels(buf, unit: List[Container], budget: Optional[List[int]] = None,
                 run: Optional[DecodeBudget] = None) -> UnitKernels:
    """The kernels of a unit, read from the cheapest code entry of each container that decodes
    here (all entries of one container hold the same kernels, compiled for other archs).
    `budget`: [bytes] of compressed input still allowed to be decoded (shared across calls);
    a container past it is left undecoded. `run`: the audit run's output budget and deadline
    (DecodeBudget); an entry past them, or over ENTRY_CAP, is left undecoded (`limited`)."""
    order = {None: 0, "lz4": 1, "zstd": 2}
    names: List[str] = []
    undecoded = ""
    limited = False
    for c in unit:
        code = sorted((e for e in c.entries if e.kind in ("sass", "ptx")),
                      key=lambda e: (order.get(e.compression, 3), e.stored_size))
        if not code:
            continue
        done = False
        why = ""
        capped = False
        for e in code:
            if budget is not None and budget[0] < e.stored_size:
                why = ("%s %s: not decoded: the file's budget of %s of compressed input is "
                       "spent" % (c.label, e.name, _mib(FILE_INPUT_BUDGET)))
                capped = True
                break
            try:
                found = entry_kernels(buf, e, run)
            except NotDecoded as exc:
                why = "%s %s: %s" % (c.label, e.name, exc)
                capped = True
                continue  # another entry of the container may be within the limits
            except Unreadable as exc:
                return UnitKernels(names, False, "%s %s: %s" % (c.label, e.name, exc), "")
            if budget is not None:
                budget[0] -= e.stored_size
            if found is None:
                why = why or "zstd payload and no zstd decoder here"
                continue
            names.extend(k for k in found if k not in names)
            done = True
            break
        if not done:
            undecoded = undecoded or why or "no decodable entry"
            limited = limited or capped
    return UnitKernels(names, not undecoded, None, undecoded, limited)


def summarize(entries: List[Entry]) -> Dict[str, object]:
    """Sorted SASS and PTX names, PTX ISA versions and the count of compressed entries."""
    sass = sorted({e.name for e in entries if e.kind == "sass"}, key=_arch_key)
    ptx = sorted({e.name for e in entries if e.kind == "ptx"}, key=_arch_key)
    versions = sorted({e.version for e in entries if e.kind == "ptx"})
    lto = sorted({e.name for e in entries if e.kind == "lto"}, key=_arch_key)
    other = sorted({e.name for e in entries if e.kind not in ("sass", "ptx", "lto")})
    out = {
        "sass": sass,
        "ptx": ptx,
        "lto": lto,
        "ptx_versions": ["%d.%d" % v for v in versions],
        "entries": len(entries),
        "compressed": sum(1 for e in entries if e.compression),
    }
    if other:
        out["unknown_kinds"] = other
    return out


def _arch_key(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits or 0), name)
