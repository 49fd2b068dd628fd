"""The device's in-memory records as Python: descriptors (``struct tacc_desc``),
completion entries (``struct tacc_cqe``) and trace records (``struct tacc_trace_rec``),
their ``struct`` formats derived from the generated layouts of tacc_hw.h."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tacc import hw

_CODE = {"__u8": "B", "__u16": "H", "__u32": "I", "__u64": "Q", "__s8": "b", "__s16": "h",
         "__s32": "i", "__s64": "q"}


def struct_format(fields: list[dict], upto_aggregate: bool = False) -> str:
    """The little-endian ``struct`` format of flat @fields (padding as ``x``); with
    @upto_aggregate the fields before the first nested struct or union."""
    out, pos = "<", 0
    for f in fields:
        if "fields" in f or f["type"].startswith("struct "):
            if upto_aggregate:
                break
            raise ValueError(f"{f['name']}: not a flat field")
        out += "x" * (f["offset"] - pos)
        out += (str(f["count"]) if f["count"] > 1 else "") + _CODE[f["type"]]
        pos = f["offset"] + f["size"]
    return out


def _payloads() -> dict[str, struct.Struct]:
    union = next(f for f in hw.STRUCTS["tacc_desc"]["fields"] if "fields" in f)
    return {f["name"]: struct.Struct(struct_format(f["fields"])) for f in union["fields"]
            if "fields" in f}


DESC = struct.Struct(struct_format(hw.STRUCTS["tacc_desc"]["fields"], upto_aggregate=True))
CQE = struct.Struct(struct_format(hw.STRUCTS["tacc_cqe"]["fields"]))
TRACE = struct.Struct(struct_format(hw.STRUCTS["tacc_trace_rec"]["fields"]))
PAYLOAD = _payloads()  # union member of struct tacc_desc -> its format


def f32_bits(v: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", v))[0])


def _pack(member: str, *vals: int) -> bytes:
    """A payload member with its leading fields given, the rest (newer fields) zero."""
    s = PAYLOAD[member]
    n = len(s.unpack(bytes(s.size)))
    return s.pack(*vals, *([0] * (n - len(vals))))


def desc(op: int, *, flags: int = 0, ctx: int = 0, index: int = 0, job: int = 0,
         tag: int = 0, payload: bytes = b"") -> bytes:
    b = DESC.pack(op, flags, ctx, index, 0, job, 0, tag) + payload
    return b.ljust(hw.TACC_DESC_SIZE, b"\0")[: hw.TACC_DESC_SIZE]


def d_copy(op: int, src: int, dst: int, length: int, **kw: int) -> bytes:
    return desc(op, payload=_pack("copy", src, dst, length), **kw)


def d_gemm(a: int, b: int, c: int, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
           alpha: float = 1.0, beta: float = 0.0, **kw: int) -> bytes:
    return desc(hw.TACC_OP_GEMM, payload=_pack(
        "gemm", a, b, c, m, n, k, lda, ldb, ldc, f32_bits(alpha), f32_bits(beta)), **kw)


def d_elt(op: int, a: int, b: int, c: int, n: int, scalar: float = 0.0, **kw: int) -> bytes:
    return desc(hw.TACC_OP_ELTWISE,
                payload=_pack("eltwise", a, b, c, n, op, f32_bits(scalar)), **kw)


def d_fence(addr: int, value: int, **kw: int) -> bytes:
    return desc(hw.TACC_OP_FENCE, payload=_pack("fence", addr, value), **kw)


def d_ts(addr: int, **kw: int) -> bytes:
    return desc(hw.TACC_OP_TIMESTAMP, payload=_pack("timestamp", addr), **kw)


@dataclass
class Cqe:
    job: int
    status: int
    queue: int
    tag: int
    start: int
    end: int


@dataclass
class TraceRec:
    version: int
    opcode: int
    engine: int
    queue: int
    func: int
    ctx: int
    seq: int
    job: int
    tag: int
    t_fetch: int
    t_start: int
    t_end: int
    bytes: int
    tlps: int
    index: int
    status: int
    tlb_misses: int
