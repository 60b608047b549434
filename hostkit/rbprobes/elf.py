"""Just enough ELF to find sections, the soname and a cubin's kernels, read with struct.

Works on a bytes-like buffer (an mmap of the file, so a 1 GB library is not read into memory).
Little-endian ELF32 and ELF64; anything else is reported as "not ELF" by returning None. An image
that has the magic but cannot be read (a section table outside the file, a truncated header, a
section name table that is not there) raises ElfError: it is unreadable, not "no GPU code".
"""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple, Optional

MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOBITS = 8
SHT_DYNAMIC = 6
DT_NULL = 0
DT_SONAME = 14
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10  # st_other bit nvcc sets on a kernel's symbol in a cubin
SHN_XINDEX = 0xFFFF


class ElfError(ValueError):
    """An ELF image (it has the magic) whose header or section table cannot be read."""


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
    type: int  # e_type: 1 relocatable, 2 executable, 3 shared object
    machine: int
    osabi: int
    abiversion: int
    flags: int  # e_flags
    sections: List[Section]


def parse(buf) -> Optional[Elf]:
    """The header and section table of the ELF image in `buf`; None if it is not a
    little-endian ELF32/ELF64. Raises ElfError when it is one but cannot be read."""
    if len(buf) < 4 or bytes(buf[:4]) != MAGIC:
        return None
    if len(buf) < 52:
        raise ElfError("truncated ELF header (%d bytes)" % len(buf))
    ei_class, ei_data = buf[4], buf[5]
    if ei_data != 1 or ei_class not in (1, 2):
        return None
    osabi, abiversion = buf[7], buf[8]
    if ei_class == 2:
        if len(buf) < 64:
            raise ElfError("truncated ELF64 header (%d bytes)" % len(buf))
        e_type, machine = struct.unpack_from("<HH", buf, 16)
        shoff, flags = struct.unpack_from("<QI", buf, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 58)
        fmt = "<IIQQQQIIQQ"
    else:
        e_type, machine = struct.unpack_from("<HH", buf, 16)
        shoff, flags = struct.unpack_from("<II", buf, 32)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 46)
        fmt = "<IIIIIIIIII"
    raw = []
    if shoff:
        if shentsize < struct.calcsize(fmt):
            raise ElfError("section header size %d is too small" % shentsize)
        if shoff + shentsize > len(buf):
            raise ElfError(
                "section table at offset %d lies outside the file (%d bytes): "
                "truncated?" % (shoff, len(buf))
            )
        first = struct.unpack_from(fmt, buf, shoff)
        if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
            shnum = first[5]
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
        if shoff + shnum * shentsize > len(buf):
            raise ElfError(
                "section table (%d entries at offset %d) runs past the end of the "
                "file (%d bytes): truncated?" % (shnum, shoff, len(buf))
            )
        for index in range(shnum):
            (
                sh_name,
                sh_type,
                sh_flags,
                sh_addr,
                sh_offset,
                sh_size,
                sh_link,
                _info,
                _align,
                _entsize,
            ) = struct.unpack_from(fmt, buf, shoff + index * shentsize)
            raw.append((sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    names = b""
    if raw:
        if not 0 <= shstrndx < len(raw):
            raise ElfError("section name table index %d is not a section" % shstrndx)
        _n, _t, _f, _a, off, size, _l = raw[shstrndx]
        if off + size > len(buf):
            raise ElfError("section name table lies outside the file: truncated?")
        names = bytes(buf[off : off + size])
    sections = []
    for sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name : end if end >= 0 else len(names)].decode("latin-1")
        sections.append(Section(name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    bits = 64 if ei_class == 2 else 32
    return Elf(bits, e_type, machine, osabi, abiversion, flags, sections)


def in_file(buf, section: Section) -> bool:
    """Whether the section has contents inside the file (not NOBITS, not truncated)."""
    return section.type != SHT_NOBITS and section.offset + section.size <= len(buf)


def section_bytes(buf, section: Section) -> bytes:
    """A copy of a (small) section's contents; empty for NOBITS or out-of-file sections."""
    if not in_file(buf, section):
        return b""
    return bytes(buf[section.offset : section.offset + section.size])


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
                return strs[val : end if end >= 0 else len(strs)].decode("latin-1") or None
    return None


def kernels(buf, image: Elf) -> List[str]:
    """The kernels of a cubin: global functions marked STO_CUDA_ENTRY in `.symtab`, in symbol
    order; without a symbol table, the names of its `.text.NAME` sections."""
    found: List[str] = []
    for sec in image.sections:
        if sec.type != SHT_SYMTAB or not (0 <= sec.link < len(image.sections)):
            continue
        data = section_bytes(buf, sec)
        strs = section_bytes(buf, image.sections[sec.link])
        step = 24 if image.bits == 64 else 16
        for pos in range(0, len(data) - step + 1, step):
            if image.bits == 64:
                st_name, st_info, st_other = struct.unpack_from("<IBB", data, pos)
            else:
                (st_name,) = struct.unpack_from("<I", data, pos)
                st_info, st_other = data[pos + 12], data[pos + 13]
            if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY:
                end = strs.find(b"\0", st_name)
                name = strs[st_name : end if end >= 0 else len(strs)].decode("latin-1")
                if name and name not in found:
                    found.append(name)
    if found:
        return found
    return [sec.name[len(".text.") :] for sec in image.sections if sec.name.startswith(".text.")]
