"""Facts read straight out of a compiled cubin (an ELF file), on the host, without a GPU.

Kernels export the layout numbers the host needs as ``__constant__`` symbols; reading them here
instead of from device memory after loading keeps the first call free of a synchronising copy, and
lets CPU tests compare them with the Python mirror of the layout.
"""
from __future__ import annotations

import functools
import struct

_SHT_SYMTAB = 2
_SHT_NOBITS = 8


def _sections(elf: bytes) -> list[tuple[int, int, int, int, int, int]]:
    """(type, offset, size, link, entsize, name offset) of every section of a little-endian ELF64 image."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a little-endian ELF64 image (a cubin)")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    out = []
    for i in range(shnum):
        base = shoff + i * shentsize
        sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize = struct.unpack_from(
            "<IIQQQQIIQQ", elf, base)
        out.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize, sh_name))
    return out


def section(elf: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of the section called `name` (e.g. ".text.<entry>": a kernel's SASS, 16 bytes per
    instruction); ValueError if there is none."""
    sections = _sections(elf)
    shstrndx, = struct.unpack_from("<H", elf, 0x3E)
    names = sections[shstrndx][1]
    for _, offset, size, _, _, name_off in sections:
        start = names + name_off
        if elf[start:elf.index(b"\0", start)].decode() == name:
            return offset, size
    raise ValueError(f"cubin has no section {name!r}")


def read_u32_symbols(elf: bytes, names: tuple[str, ...]) -> dict[str, int]:
    """The values of 4-byte ``__constant__`` symbols `names`; ValueError if one is missing."""
    sections = _sections(elf)
    wanted = set(names)
    found: dict[str, int] = {}
    for sh_type, offset, size, link, entsize, _ in sections:
        if sh_type != _SHT_SYMTAB:
            continue
        str_offset = sections[link][1]
        for pos in range(offset, offset + size, entsize or 24):
            st_name, _, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", elf, pos)
            end = elf.index(b"\0", str_offset + st_name)
            name = elf[str_offset + st_name:end].decode()
            if name not in wanted or st_size != 4:
                continue
            sec_type, sec_offset = sections[st_shndx][0], sections[st_shndx][1]
            found[name] = 0 if sec_type == _SHT_NOBITS else struct.unpack_from("<I", elf, sec_offset + st_value)[0]
    missing = wanted - set(found)
    if missing:
        raise ValueError(f"cubin has no 4-byte symbol(s) {sorted(missing)}")
    return found


@functools.lru_cache(maxsize=2048)
def entry_symbols(elf: bytes, entry: str, names: tuple[str, ...]) -> dict[str, int]:
    """The `<entry>_<name>` u32 constants a kernel exports, by `name` (memoized per cubin: read on every launch
    plan, parsed once)."""
    raw = read_u32_symbols(elf, tuple(f"{entry}_{name}" for name in names))
    return {name: raw[f"{entry}_{name}"] for name in names}


@functools.lru_cache(maxsize=2048)
def optional_entry_symbol(elf: bytes, entry: str, name: str) -> int | None:
    """`<entry>_<name>` as entry_symbols reads it, or None where the kernel does not export it (kernels from
    template trees older than the symbol, e.g. in A/B runs)."""
    try:
        return entry_symbols(elf, entry, (name,))[name]
    except ValueError:
        return None
