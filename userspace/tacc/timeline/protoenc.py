"""Vectorised protobuf encoding of TracePacket rows (numpy, no per-event Python).

A batch of events of one shape is laid out as a 2-D uint8 array, one row per packet.
Every varint column is written with the same width for the whole batch (the width the
largest value needs; smaller values get redundant continuation bytes, which protobuf
parsers accept and which Perfetto's own protozero writer uses for message lengths), so
nested message lengths are constants of the batch and each row is a fixed layout.
Rows of several shapes are merged back into event order with one scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WT_VARINT, WT_I64, WT_LEN = 0, 1, 2


def varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(field: int, wt: int) -> bytes:
    return varint_bytes((field << 3) | wt)


def varint_width(maxval: int) -> int:
    return max(1, (int(maxval).bit_length() + 6) // 7)


@dataclass
class Seg:
    """A column of one row layout: constant bytes, or a per-row value."""

    kind: str  # "const", "varint", "fixed64"
    width: int
    const: bytes = b""
    values: np.ndarray | None = None


def const(b: bytes) -> Seg:
    return Seg("const", len(b), const=b)


def varint(values: np.ndarray) -> Seg:
    v = np.asarray(values).astype(np.uint64, copy=False)
    w = varint_width(int(v.max())) if len(v) else 1
    return Seg("varint", w, values=v)


def fixed64(values: np.ndarray) -> Seg:
    v = np.asarray(values)
    if v.dtype.kind == "f":
        v = v.astype("<f8")
    else:
        v = v.astype("<u8")
    return Seg("fixed64", 8, values=v)


def f_varint(field: int, values: np.ndarray) -> list[Seg]:
    return [const(tag(field, WT_VARINT)), varint(values)]


def f_const_varint(field: int, value: int) -> list[Seg]:
    return [const(tag(field, WT_VARINT) + varint_bytes(value))]


def f_fixed64(field: int, values: np.ndarray) -> list[Seg]:
    return [const(tag(field, WT_I64)), fixed64(values)]


def f_message(field: int, body: list[Seg]) -> list[Seg]:
    n = sum(s.width for s in body)
    return [const(tag(field, WT_LEN) + varint_bytes(n))] + body


def width(segs: list[Seg]) -> int:
    return sum(s.width for s in segs)


def render(n: int, segs: list[Seg]) -> np.ndarray:
    """Rows (n, width) of the layout."""
    w = width(segs)
    out = np.empty((n, w), np.uint8)
    col = 0
    for s in segs:
        if s.kind == "const":
            out[:, col : col + s.width] = np.frombuffer(s.const, np.uint8)
        elif s.kind == "fixed64":
            assert s.values is not None
            out[:, col : col + 8] = np.ascontiguousarray(s.values).view(np.uint8).reshape(n, 8)
        else:
            assert s.values is not None
            v = s.values
            for i in range(s.width):
                b = ((v >> np.uint64(7 * i)) & np.uint64(0x7F)).astype(np.uint8)
                if i < s.width - 1:
                    b |= 0x80
                out[:, col + i] = b
        col += s.width
    return out


def packets(n: int, body: list[Seg]) -> np.ndarray:
    """Rows of ``Trace.packet`` entries (field 1) wrapping ``body`` (TracePacket fields)."""
    return render(n, f_message(1, body))


def merge_rows(n: int, groups: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Interleave row groups back into event order.

    ``groups``: (row indices into 0..n-1, rows 2-D array) covering every index once.
    """
    lens = np.zeros(n, np.int64)
    for idx, rows in groups:
        lens[idx] = rows.shape[1]
    off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    out = np.empty(int(off[-1]), np.uint8)
    for idx, rows in groups:
        if len(idx) == 0:
            continue
        w = rows.shape[1]
        if len(groups) == 1:
            return rows.tobytes()
        dest = off[idx][:, None] + np.arange(w, dtype=np.int64)[None, :]
        out[dest.ravel()] = rows.ravel()
    return out.tobytes()
