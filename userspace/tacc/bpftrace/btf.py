"""Member offsets of kernel structs, read from the running kernel's BTF.

The capture program's scheduler handlers read four fields of ``struct task_struct``.
Including ``<linux/sched.h>`` for them made every bcc compile parse most of the kernel's
headers: 8.5 s of a compile's guest time was 3 s of that include (measured in
the test VM).  The kernel describes its own types in ``/sys/kernel/btf/vmlinux``
(Documentation/bpf/btf.rst); this module walks that type section to the structs it is
asked for and returns byte offsets, which the C source takes as constants.

Only what the walk needs is decoded: each type's name, kind and vlen (to step over its
trailing data), and the members of the structs looked for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F

# BTF_KIND_* (include/uapi/linux/btf.h) -> bytes that follow struct btf_type, per vlen
# unit (vlen-scaled kinds) or fixed
_KIND_STRUCT, _KIND_UNION = 4, 5
_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # struct union enum proto datasec enum64
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}  # int array var decl_tag


class BTFError(ValueError):
    """The BTF blob is missing, malformed, or lacks a struct or member asked for."""


@dataclass(frozen=True)
class Member:
    offset_bits: int
    type_id: int


def _header(blob: bytes) -> tuple[int, int, int, int]:
    if len(blob) < 24:
        raise BTFError("BTF blob shorter than its header")
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, str_len = \
        struct.unpack_from("<HBBIIIII", blob, 0)
    if magic != BTF_MAGIC:
        raise BTFError(f"bad BTF magic {magic:#x}")
    types = hdr_len + type_off
    strings = hdr_len + str_off
    if types + type_len > len(blob) or strings + str_len > len(blob):
        raise BTFError("BTF sections run past the blob")
    return types, types + type_len, strings, str_len


def struct_members(blob: bytes, wanted: set[str]) -> dict[str, dict[str, Member]]:
    """{struct name: {member name: Member}} of the first struct of each wanted name."""
    start, end, strings, str_len = _header(blob)

    def name(off: int) -> str:
        if off >= str_len:
            raise BTFError(f"string offset {off} outside the string section")
        stop = blob.index(b"\0", strings + off)
        return blob[strings + off:stop].decode()

    # a struct's name is compared by its offset in the string section: decode only those
    found: dict[str, dict[str, Member]] = {}
    pos = start
    while pos < end and len(found) < len(wanted):
        name_off, info, _size = struct.unpack_from("<III", blob, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        pos += 12
        if kind == _KIND_STRUCT and name_off:
            n = name(name_off)
            if n in wanted and n not in found:
                bitfields = bool(info >> 31)
                members: dict[str, Member] = {}
                for i in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("<III", blob, pos + 12 * i)
                    bits = m_off & 0xFFFFFF if bitfields else m_off
                    if m_name:
                        members[name(m_name)] = Member(bits, m_type)
                found[n] = members
        step = _PER_VLEN.get(kind)
        pos += step * vlen if step is not None else _FIXED.get(kind, 0)
    if pos > end:
        raise BTFError("BTF type section is truncated")
    return found


def offsets(fields: dict[str, list[str]], path: Path = VMLINUX) -> dict[str, int]:
    """Byte offsets {"struct.member": offset} of whole-byte members, e.g.
    ``offsets({"task_struct": ["pid", "comm"]})``."""
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise BTFError(f"cannot read {path}: {e.strerror}") from e
    found = struct_members(blob, set(fields))
    out: dict[str, int] = {}
    for sname, names in fields.items():
        if sname not in found:
            raise BTFError(f"{path}: no struct {sname}")
        for m in names:
            mem = found[sname].get(m)
            if mem is None:
                raise BTFError(f"{path}: struct {sname} has no member {m}")
            if mem.offset_bits % 8:
                raise BTFError(f"{path}: {sname}.{m} is a bitfield")
            out[f"{sname}.{m}"] = mem.offset_bits // 8
    return out
