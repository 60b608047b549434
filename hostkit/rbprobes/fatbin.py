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

import mmap
import os
import re
import struct
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
    size: int  # uncompressed size (padded payload size when not compressed)

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
    empty: bool = False  # holds no kernel at all (see kernel_free)


class Scan(NamedTuple):
    """What one file holds: its containers (runtime and relocatable) and wrapper count."""

    path: str
    kind: str  # "elf", "cubin", "fatbin", "not-elf", "error"
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
    def modules(self) -> List[List[Container]]:
        """Runtime containers grouped into modules: a device-linked container (version-2
        wrapper) together with the translation-unit containers (version-1 wrappers) it was
        linked from; every other container alone. With several device links in one file the
        units cannot be told apart and join all of them (an optimistic grouping). All embedded
        containers together count as one more module: the library picks among them itself."""
        rt = self.runtime_containers
        embedded = self.embedded_containers
        extra = [embedded] if embedded else []
        linked = [c for c in rt if c.wrapper == 2]
        if not linked:
            return [[c] for c in rt] + extra
        group = linked + [c for c in rt if c.wrapper == 1]
        return [group] + [[c] for c in rt if c.wrapper is None] + extra

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


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
    found by searching data sections) rejects any entry that is not PTX or ELF of version
    0x0101, so random bytes that happen to hold the magic are not taken for code."""
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
        entries.append(Entry(
            kind, number, _suffix(flags), (major, minor), flags, comp, pos + hsize,
            compressed if comp and compressed else size, usize if comp and usize else size))
        pos += hsize + size
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


def scan_buffer(buf, path: str = "<buffer>", embedded: bool = True) -> Scan:
    """Scan an in-memory image (ELF shared object or object, cubin, or a raw fatbin).
    `embedded`: also search the data sections of a file with GPU code (EMBEDDED_PREFIXES)."""
    if bytes(buf[:4]) == _MAGIC_BYTES:
        return Scan(path, "fatbin", parse_containers(buf, 0, len(buf), "<fatbin>"), 0, None)
    image = elf.parse(buf)
    if image is None:
        return Scan(path, "not-elf", [], 0, None)
    if image.machine == elf.EM_CUDA:
        entry = _cubin_entry(buf, image)
        return Scan(path, "cubin", [Container("<cubin>", 0, [entry], None)], 0, None)
    containers: List[Container] = []
    versions: Dict[int, int] = {}  # container file offset -> wrapper version
    wrappers = 0
    for sec in image.sections:
        if not elf.in_file(buf, sec):
            continue
        if sec.name in (RUNTIME_SECTION, RELOCATABLE_SECTION):
            containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size, sec.name))
        elif sec.name == WRAPPER_SECTION:
            for magic, version, data in _wrappers(buf, sec):
                wrappers += magic == WRAPPER_MAGIC
                where = elf.file_offset(image, data) if magic == WRAPPER_MAGIC and data else None
                if where is not None:
                    versions[where] = version
    containers = [c._replace(wrapper=versions.get(c.offset), empty=kernel_free(buf, c))
                  for c in containers]
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


# Emptiness: a registered module without kernels (libcufft.so.12 and libcufftw.so.12 each carry
# one sm_75 cubin with no .text section) cannot fail a launch, so it needs no path to the target.
DECODE_MAX = 8192  # only entries this small are decoded to look for kernels
EMPTY_CUBIN_MAX = 2560  # an undecodable (zstd, no module) sm_75+ cubin this small is taken as
#                         empty: nvcc 13 writes 1.4-2.3 KB kernel-free cubins (sm_75..sm_120)
#                         and 2.8-5 KB ones for a single empty kernel


def entry_has_kernels(buf, entry: Entry) -> Optional[bool]:
    """True/False when known (a cubin with a `.text.*` section, PTX with `.entry`); None when
    it cannot be told. Big entries are assumed to hold kernels."""
    if entry.kind not in ("sass", "ptx") or entry.size > DECODE_MAX:
        return True
    try:
        data = payload(buf, entry)
    except Exception:  # a corrupt payload, or the zstd module's own error type
        data = None
    if data is None:
        # the size rule was measured on sm_75+ only (what nvcc 13 builds)
        if entry.kind == "sass" and entry.number >= 75 and entry.size <= EMPTY_CUBIN_MAX:
            return False
        return None
    if entry.kind == "ptx":
        return b".entry" in data
    image = elf.parse(data)
    if image is None:
        return None
    return any(sec.name.startswith(".text.") for sec in image.sections)


def kernel_free(buf, container: Container) -> bool:
    """Whether a container surely holds no kernel (every code entry known to be empty)."""
    code = [e for e in container.entries if e.kind in ("sass", "ptx")]
    return bool(code) and all(entry_has_kernels(buf, e) is False for e in code)


def scan_file(path: str, embedded: bool = True) -> Scan:
    """Scan one file through a read-only mmap (never reads a big library into memory)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 16:
                return Scan(path, "not-elf", [], 0, None)
            head = fh.read(4)
            if head not in (elf.MAGIC, _MAGIC_BYTES):
                return Scan(path, "not-elf", [], 0, None)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                scan = scan_buffer(mm, path, embedded)
            return scan
    except (OSError, ValueError) as exc:
        return Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc))


def payload(buf, entry: Entry) -> Optional[bytes]:
    """The entry's code, decompressed; None when it is Zstandard-compressed and no zstd module
    (Python 3.14's compression.zstd, or zstandard) is importable."""
    raw = bytes(buf[entry.payload_offset:entry.payload_offset + entry.stored_size])
    if entry.compression is None:
        return raw
    if entry.compression == "lz4":
        return lz4_block_decompress(raw, entry.size)
    if not raw.startswith(_ZSTD_MAGIC):
        raise ValueError("entry is flagged zstd but its payload has no zstd frame magic")
    try:
        from compression import zstd  # type: ignore  # Python 3.14+

        return zstd.decompress(raw)
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore
    except ImportError:
        return None
    return zstandard.ZstdDecompressor().decompress(raw, max_output_size=entry.size)


def lz4_block_decompress(src: bytes, size: int) -> bytes:
    """Decode one LZ4 block (the format of flag 0x2000). `size` is the expected output size."""
    dst = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        length = token >> 4
        if length == 15:
            while True:
                extra = src[i]
                i += 1
                length += extra
                if extra != 255:
                    break
        dst += src[i:i + length]
        i += length
        if i >= n or len(dst) >= size:
            break
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(dst):
            raise ValueError("corrupt LZ4 block: match offset %d at output %d" % (offset, len(dst)))
        length = token & 15
        if length == 15:
            while True:
                extra = src[i]
                i += 1
                length += extra
                if extra != 255:
                    break
        length += 4
        start = len(dst) - offset
        if offset >= length:
            dst += dst[start:start + length]
        else:
            for k in range(length):
                dst.append(dst[start + k])
    return bytes(dst[:size])


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
