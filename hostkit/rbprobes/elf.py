"""Just enough ELF to find sections and the soname: the section table, read with struct.

Works on a bytes-like buffer (an mmap of the file, so a 1 GB library is not read into memory).
Little-endian ELF32 and ELF64; anything else is reported as "not ELF" by returning None.
"""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple, Optional

MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_PROGBITS = 1
SHT_NOBITS = 8
SHT_DYNAMIC = 6
DT_NULL = 0
DT_SONAME = 14


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


class Elf(NamedTuple):
    bits: int  # 32 or 64
    machine: int
    osabi: int
    abiversion: int
    flags: int  # e_flags
    sections: List[Section]


def parse(buf) -> Optional[Elf]:
    """The header and section table of the ELF image in `buf`, or None if it is not a
    little-endian ELF (or is truncated)."""
    if len(buf) < 52 or bytes(buf[:4]) != MAGIC:
        return None
    ei_class, ei_data = buf[4], buf[5]
    if ei_data != 1 or ei_class not in (1, 2):
        return None
    osabi, abiversion = buf[7], buf[8]
    try:
        if ei_class == 2:
            (machine,) = struct.unpack_from("<H", buf, 18)
            shoff, flags = struct.unpack_from("<QI", buf, 40)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 58)
            fmt = "<IIQQQQIIQQ"
        else:
            (machine,) = struct.unpack_from("<H", buf, 18)
            shoff, flags = struct.unpack_from("<II", buf, 32)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 46)
            fmt = "<IIIIIIIIII"
        raw = []
        if shoff and shnum and shoff + shnum * shentsize <= len(buf):
            for i in range(shnum):
                (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, _info, _align,
                 _entsize) = struct.unpack_from(fmt, buf, shoff + i * shentsize)
                raw.append((sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    except struct.error:
        return None
    names = b""
    if 0 <= shstrndx < len(raw):
        _n, _t, _f, _a, off, size, _l = raw[shstrndx]
        names = bytes(buf[off:off + size])
    sections = []
    for sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name:end if end >= 0 else len(names)].decode("latin-1")
        sections.append(Section(name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    bits = 64 if ei_class == 2 else 32
    return Elf(bits, machine, osabi, abiversion, flags, sections)


def in_file(buf, section: Section) -> bool:
    """Whether the section has contents inside the file (not NOBITS, not truncated)."""
    return section.type != SHT_NOBITS and section.offset + section.size <= len(buf)


def section_bytes(buf, section: Section) -> bytes:
    """A copy of a (small) section's contents; empty for NOBITS or out-of-file sections."""
    if not in_file(buf, section):
        return b""
    return bytes(buf[section.offset:section.offset + section.size])


def by_name(elf: Elf) -> Dict[str, Section]:
    return {s.name: s for s in elf.sections}


def file_offset(elf: Elf, address: int) -> Optional[int]:
    """The file offset of a virtual address inside an allocated section with file contents."""
    for sec in elf.sections:
        if sec.type != SHT_NOBITS and sec.addr and sec.addr <= address < sec.addr + sec.size:
            return sec.offset + (address - sec.addr)
    return None


def soname(buf, elf: Elf) -> Optional[str]:
    """DT_SONAME of a shared object, or None."""
    for sec in elf.sections:
        if sec.type != SHT_DYNAMIC or not (0 <= sec.link < len(elf.sections)):
            continue
        strtab = elf.sections[sec.link]
        data = section_bytes(buf, sec)
        fmt, step = ("<qQ", 16) if elf.bits == 64 else ("<iI", 8)
        for pos in range(0, len(data) - step + 1, step):
            tag, val = struct.unpack_from(fmt, data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_SONAME:
                strs = section_bytes(buf, strtab)
                end = strs.find(b"\0", val)
                return strs[val:end if end >= 0 else len(strs)].decode("latin-1") or None
    return None
