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
  they are one module (see `Scan.units`).

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
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import arch, decompress, elf
from .decompress import DecodeBudget, NotDecoded, Unreadable

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
# cuLibraryLoadData; libcufft keeps most of its containers in .ldata, see docs/probes.md).
# Searched only in files that have one of the sections above.
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
        rdc = [
            c
            for c in self.containers
            if c.section == RELOCATABLE_SECTION and c.wrapper == 1 and c not in rt
        ]
        units = [[c] + rdc if c.wrapper == 2 and rdc else [c] for c in rt]
        return units + ([embedded] if embedded else [])

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


def linked_group(unit: List[Container]) -> bool:
    """A device-linked container followed by the relocatable units it was linked from."""
    return (
        len(unit) > 1
        and unit[0].wrapper == 2
        and all(c.section == RELOCATABLE_SECTION for c in unit[1:])
    )


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


def parse_entries(
    buf, start: int, end: int, strict: bool = False
) -> Tuple[List[Entry], Optional[str]]:
    """Entries of one container whose entry area is buf[start:end]. `strict` (for containers
    found by searching data sections) rejects any entry that is not PTX, ELF or LTO-IR of
    version 0x0101, so random bytes that happen to hold the magic are not taken for code."""
    entries = []
    pos = start
    while pos + 64 <= end:
        kind_code, version, hsize, size = struct.unpack_from("<HHIQ", buf, pos)
        if strict and (version != 0x0101 or kind_code not in (KIND_PTX, KIND_ELF, KIND_LTO)):
            return [], "not a fatbin entry at offset %d" % pos
        if hsize < 64 or pos + hsize + size > end:
            return entries, "entry at offset %d overruns its container" % pos
        (compressed,) = struct.unpack_from("<I", buf, pos + 16)
        minor, major, number = struct.unpack_from("<HHI", buf, pos + 24)
        (flags,) = struct.unpack_from("<Q", buf, pos + 40)
        (usize,) = struct.unpack_from("<Q", buf, pos + 56)
        kind = {KIND_PTX: "ptx", KIND_ELF: "sass", KIND_LTO: "lto"}.get(
            kind_code, "kind%d" % kind_code
        )
        comp = _compression(flags)
        if comp and compressed > size:
            return entries, (
                "entry at offset %d: compressed size %d exceeds its payload of %d"
                % (pos, compressed, size)
            )
        entries.append(
            Entry(
                kind,
                number,
                _suffix(flags),
                (major, minor),
                flags,
                comp,
                pos + hsize,
                compressed if comp and compressed else size,
                usize if comp else size,
            )
        )
        pos += hsize + size
    if pos != end and end - pos >= 8 and any(bytes(buf[pos:end])):
        return entries, "%d stray bytes after the last entry at offset %d" % (end - pos, pos)
    return entries, None


def parse_containers(
    buf, start: int, end: int, section: str, strict: bool = False
) -> List[Container]:
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
            match = _TKINFO_ARCH.search(elf.section_bytes(buf, sec))
            if match:
                _k, major, minor, suffix = arch.parse_arch(match.group(1).decode())
                return Entry(
                    "sass", major * 10 + minor, suffix, (0, 0), 0, None, 0, len(buf), len(buf)
                )
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
            containers.append(
                Container(
                    sec.name,
                    sec.offset,
                    [],
                    (
                        "section %s (%d bytes at offset %d) lies outside the file (%d bytes): "
                        "truncated?" % (sec.name, sec.size, sec.offset, len(buf))
                    ),
                )
            )
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
            if (
                sec.type == elf.SHT_PROGBITS
                and sec.name.startswith(EMBEDDED_PREFIXES)
                and elf.in_file(buf, sec)
            ):
                containers.extend(
                    parse_containers(buf, sec.offset, sec.offset + sec.size, sec.name, strict=True)
                )
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


def _limit(entry: Entry) -> int:
    if entry.compression and entry.size <= 0:
        raise Unreadable("%s entry declares no uncompressed size" % entry.compression)
    if entry.size > decompress.ENTRY_CAP:
        raise NotDecoded(
            "not decoded: declares %d decoded bytes, more than the cap for one "
            "entry (%s; the largest real entry seen has 71 MB)"
            % (entry.size, decompress.mib(decompress.ENTRY_CAP))
        )
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
        return bytes(buf[entry.payload_offset : end])
    limit = _limit(entry)
    raw = bytes(buf[entry.payload_offset : end])
    deadline = None
    if budget is not None:
        budget.take(limit)
        deadline = budget.deadline
    out = None
    produced = limit
    try:
        if entry.compression == "lz4":
            out = decompress.lz4_block_decompress(raw, limit, deadline)
        elif not raw.startswith(_ZSTD_MAGIC):
            raise Unreadable("entry is flagged zstd but its payload has no zstd frame magic")
        elif deadline is None:
            out = decompress.zstd_decompress(raw, limit)
        else:
            out = decompress.zstd_decompress(raw, limit, deadline)
        produced = len(out) if out is not None else 0
        return out
    except Unreadable as exc:
        produced = getattr(exc, "produced", limit)
        raise
    finally:
        if budget is not None:
            budget.used(produced)


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
        for match in _PTX_ENTRY.finditer(data):
            name = match.group(1).decode("latin-1")
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


def unit_kernels(
    buf,
    unit: List[Container],
    budget: Optional[List[int]] = None,
    run: Optional[DecodeBudget] = None,
) -> UnitKernels:
    """The kernels of a unit, read from the cheapest code entry of each container that decodes
    here (all entries of one container hold the same kernels, compiled for other archs).
    `budget`: [bytes] of compressed input still allowed to be decoded (shared across calls);
    a container past it is left undecoded. `run`: the audit run's output budget and deadline
    (DecodeBudget); an entry past them, or over ENTRY_CAP, is left undecoded (`limited`)."""
    order = {None: 0, "lz4": 1, "zstd": 2}
    names: List[str] = []
    undecoded = ""
    limited = False
    for container in unit:
        code = sorted(
            (e for e in container.entries if e.kind in ("sass", "ptx")),
            key=lambda e: (order.get(e.compression, 3), e.stored_size),
        )
        if not code:
            continue
        done = False
        why = ""
        capped = False
        for entry in code:
            if budget is not None and budget[0] < entry.stored_size:
                why = "%s %s: not decoded: the file's budget of %s of compressed input is spent" % (
                    container.label,
                    entry.name,
                    decompress.mib(decompress.FILE_INPUT_BUDGET),
                )
                capped = True
                break
            try:
                found = entry_kernels(buf, entry, run)
            except NotDecoded as exc:
                why = "%s %s: %s" % (container.label, entry.name, exc)
                capped = True
                continue  # another entry of the container may be within the limits
            except Unreadable as exc:
                return UnitKernels(
                    names, False, "%s %s: %s" % (container.label, entry.name, exc), ""
                )
            if budget is not None:
                budget[0] -= entry.stored_size
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
    sass = sorted({e.name for e in entries if e.kind == "sass"}, key=arch_key)
    ptx = sorted({e.name for e in entries if e.kind == "ptx"}, key=arch_key)
    versions = sorted({e.version for e in entries if e.kind == "ptx"})
    lto = sorted({e.name for e in entries if e.kind == "lto"}, key=arch_key)
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


def arch_key(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits or 0), name)
