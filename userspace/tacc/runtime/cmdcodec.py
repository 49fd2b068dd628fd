"""Encoding inference commands and graphs for the driver (uAPI 4, hw 1.3).

A direct command is a ``struct drm_tacc_cmd2``: operands as ``{handle, offset}`` and the
device descriptor's payload with its address fields zero (the driver writes the VAs).  A
graph is a list of device descriptors (``struct tacc_desc``, 128 bytes, with VAs: the
device reads it) and a patch table in host memory of the context, launched by one LIST
command carrying the parameter block.  The payload layouts mirror
``kernel/include/tacc_hw.h`` (``tests/host/test_infer_layout.py`` compares them with gcc).
"""

from __future__ import annotations

import ctypes as C
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tacc import hw

from . import uapi as U
from .buffers import Buffer, HostBuffer
from .errors import TaccError

if TYPE_CHECKING:
    from .graph import Graph, Launch
    from .ops import Op
    from .stream import Stream

u8, u16, u32, u64 = C.c_uint8, C.c_uint16, C.c_uint32, C.c_uint64

# the descriptors' dtype codes, by numpy dtype name (bfloat16 without importing ml_dtypes)
DT = {"float32": 0, "bfloat16": 1, "int32": 2}
GEMM_F_TRANS_A, GEMM_F_TRANS_B, GEMM_F_BIAS = 1, 2, 4
ELT_F_ROW_BCAST = 1
SOFTMAX_F_CAUSAL = 1
NORM_LAYER, NORM_RMS = 0, 1
PATCH_SET32, PATCH_ADD32, PATCH_ADD64 = 0, 1, 2
ELT_OPS = {"add": U.ELT_ADD, "mul": U.ELT_MUL, "relu": U.ELT_RELU, "scale": U.ELT_SCALE,
           "gelu": U.ELT_GELU, "silu": U.ELT_SILU, "exp": U.ELT_EXP, "cast": U.ELT_CAST}


class copy_args(C.Structure):  # noqa: N801
    _fields_ = [("src", u64), ("dst", u64), ("len", u64)]


class gemm_args(C.Structure):  # noqa: N801
    _fields_ = [("a", u64), ("b", u64), ("c", u64), ("m", u32), ("n", u32), ("k", u32),
                ("lda", u32), ("ldb", u32), ("ldc", u32), ("alpha", u32), ("beta", u32),
                ("dtype_ab", u8), ("dtype_c", u8), ("gflags", u8), ("rsvd", u8),
                ("batch", u32), ("bias", u64), ("stride_a", u64), ("stride_b", u64),
                ("stride_c", u64), ("rsvd2", u64)]


class eltwise_args(C.Structure):  # noqa: N801
    _fields_ = [("a", u64), ("b", u64), ("c", u64), ("n", u64), ("op", u32), ("scalar", u32),
                ("dtype_a", u8), ("dtype_c", u8), ("eflags", u8), ("rsvd", u8), ("cols", u32)]


class fence_args(C.Structure):  # noqa: N801
    _fields_ = [("addr", u64), ("value", u64)]


class softmax_args(C.Structure):  # noqa: N801
    _fields_ = [("x", u64), ("y", u64), ("rows", u32), ("cols", u32), ("ldx", u32),
                ("ldy", u32), ("scale", u32), ("sflags", u32), ("pos", u32), ("period", u32),
                ("dtype_x", u8), ("dtype_y", u8), ("rsvd", u16)]


class norm_args(C.Structure):  # noqa: N801
    _fields_ = [("x", u64), ("y", u64), ("gamma", u64), ("beta", u64), ("rows", u32),
                ("cols", u32), ("ldx", u32), ("ldy", u32), ("eps", u32), ("kind", u8),
                ("dtype_x", u8), ("dtype_y", u8), ("dtype_w", u8), ("nflags", u32),
                ("rsvd", u32), ("stats", u64)]


class gather_args(C.Structure):  # noqa: N801
    _fields_ = [("table", u64), ("idx", u64), ("out", u64), ("rows", u32), ("cols", u32),
                ("ld_table", u32), ("ld_out", u32), ("table_rows", u32), ("dtype", u8),
                ("rsvd", u8 * 3)]


class list_args(C.Structure):  # noqa: N801
    _fields_ = [("list", u64), ("patches", u64), ("count", u32), ("npatch", u32),
                ("list_id", u32), ("rsvd", u32), ("params", u32 * 16), ("rsvd2", u64)]


class tacc_desc(C.Structure):  # noqa: N801
    _fields_ = [("opcode", u8), ("flags", u8), ("ctx", u16), ("index", u16), ("rsvd0", u16),
                ("job", u32), ("rsvd1", u32), ("tag", u64), ("payload", u8 * 104)]


class tacc_list_patch(C.Structure):  # noqa: N801
    _fields_ = [("cmd", u32), ("offset", u16), ("param", u8), ("op", u8), ("mult", u64)]


PAYLOADS: dict[str, type[C.Structure]] = {
    "copy": copy_args, "gemm": gemm_args, "eltwise": eltwise_args, "fence": fence_args,
    "softmax": softmax_args, "norm": norm_args, "gather": gather_args, "list": list_args}
for _p in PAYLOADS.values():
    assert C.sizeof(_p) <= 104, _p.__name__
assert C.sizeof(tacc_desc) == 128 and C.sizeof(tacc_list_patch) == 16
assert C.sizeof(U.drm_tacc_cmd2) == 256


def f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


@dataclass
class Encoded:
    """One command: opcode, payload, operand buffers in address-field order, and the
    payload fields a graph parameter patches: (byte offset, Param, patch op)."""

    opcode: int
    args: C.Structure
    operands: list[Buffer | None]
    patches: list[tuple[int, Any, int]]


def _is_param(v: Any) -> bool:
    return hasattr(v, "value_in")


def encode_op(op: Op) -> Encoded:
    """The descriptor payload of an inference Op (address fields zero)."""
    b, p = op.bufs, op.p
    patches: list[tuple[int, Any, int]] = []
    if op.kind == "gemm":
        a = gemm_args()
        ar, ac = p["a_mat"]
        br, bc = p["b_mat"]
        m, n, k = p["m"], p["n"], p["k"]
        a.m, a.n, a.k = m, n, k
        ld = p.get("ld") or {}
        a.lda, a.ldb, a.ldc = (ld[r][2] if r in ld else d for r, d in (("a", ac), ("b", bc),
                                                                       ("c", n)))
        a.alpha, a.beta = f32_bits(p["alpha"]), f32_bits(p["beta"])
        a.dtype_ab, a.dtype_c = DT[b["a"].dtype.name], DT[b["out"].dtype.name]
        a.gflags = (GEMM_F_TRANS_A if p["trans_a"] else 0) | \
            (GEMM_F_TRANS_B if p["trans_b"] else 0) | (GEMM_F_BIAS if "bias" in b else 0)
        nb = p["batch"]
        a.batch = nb if nb > 1 else 0
        if nb > 1:
            a.stride_a = ar * ac if p["ba"] > 1 else 0
            a.stride_b = br * bc if p["bb"] > 1 else 0
            a.stride_c = m * n
        return Encoded(U.OP_GEMM, a, [b["a"], b["b"], b["out"], b.get("bias")], patches)
    if op.kind in ELT_OPS:
        e = eltwise_args()
        x = b["x"]
        e.n = x.size
        e.op = ELT_OPS[op.kind]
        e.dtype_a, e.dtype_c = DT[x.dtype.name], DT[b["out"].dtype.name]
        y = b.get("y")
        if y is not None and p.get("row_bcast"):
            e.eflags, e.cols = ELT_F_ROW_BCAST, p["cols"]
        return Encoded(U.OP_ELTWISE, e, [x, y, b["out"]], patches)
    if op.kind == "softmax":
        s = softmax_args()
        rows_total = p["batch"] * p["rows"]
        s.rows, s.cols, s.ldx, s.ldy = rows_total, p["cols"], p["cols"], p["cols"]
        s.scale = f32_bits(p["scale"])
        s.dtype_x, s.dtype_y = DT[b["x"].dtype.name], DT[b["out"].dtype.name]
        if p["causal"]:
            s.sflags, s.period = SOFTMAX_F_CAUSAL, p["rows"]
            pos = p["pos_offset"]
            if _is_param(pos):
                s.pos = pos.bias
                patches.append((softmax_args.pos.offset, pos, PATCH_ADD32))
            else:
                s.pos = int(pos)
        return Encoded(U.OP_SOFTMAX, s, [b["x"], b["out"]], patches)
    if op.kind in ("layer_norm", "rms_norm"):
        nm = norm_args()
        nm.rows, nm.cols = p["rows"], p["cols"]
        nm.ldx = nm.ldy = p["cols"]
        nm.eps = f32_bits(p["eps"])
        nm.kind = NORM_LAYER if op.kind == "layer_norm" else NORM_RMS
        nm.dtype_x, nm.dtype_y = DT[b["x"].dtype.name], DT[b["out"].dtype.name]
        nm.dtype_w = DT[b["gamma"].dtype.name]
        if "stats" in b:
            nm.nflags = hw.TACC_NORM_F_STATS
        return Encoded(U.OP_NORM, nm, [b["x"], b["out"], b["gamma"], b.get("beta"),
                                       b.get("stats")], patches)
    if op.kind == "gather":
        g = gather_args()
        g.rows, g.cols = p["n"], p["cols"]
        g.ld_table = g.ld_out = p["cols"]
        g.table_rows = p["rows"]
        g.dtype = DT[b["table"].dtype.name]
        return Encoded(U.OP_GATHER, g, [b["table"], b["idx"], b["out"]], patches)
    raise TaccError(f"cmdcodec: no encoding for {op.kind}")


def _cmd2(arr: Any, i: int, opcode: int, tag: int, args: C.Structure,
          operands: list[Any]) -> None:
    c = arr[i]
    C.memset(C.addressof(c), 0, C.sizeof(c))
    c.opcode, c.tag = opcode, tag
    for j, x in enumerate(operands):
        if x is not None:
            c.op[j].handle, c.op[j].offset = x.handle, x.offset
    C.memmove(C.addressof(c.args), C.addressof(args), C.sizeof(args))


def encode(stream: Stream, ops: list[Any]) -> tuple[Any, int]:
    """``struct drm_tacc_cmd2`` commands of ``ops`` (Ops or a graph Launch)."""
    from .graph import Launch

    arr = getattr(stream, "_cmds2", None)
    if arr is None or len(arr) < len(ops):
        arr = (U.drm_tacc_cmd2 * max(4, len(ops)))()
        stream._cmds2 = arr  # type: ignore[attr-defined]
    for i, op in enumerate(ops):
        if isinstance(op, Launch):
            _encode_launch(arr, i, op)
            continue
        e = encode_op(op)
        if e.patches:
            raise TaccError(f"{op.kind}: a graph parameter outside a graph launch")
        _cmd2(arr, i, e.opcode, op.tag, e.args, e.operands)
    return arr, len(ops)


# ----------------------------------------------------------------- graphs ---
@dataclass
class DeviceList:
    """A graph's descriptors and patch table, in host memory of the context."""

    descs: HostBuffer
    patches: HostBuffer | None
    count: int
    npatch: int


def _va(x: Buffer) -> int:
    if not x.va:
        raise TaccError(f"{x!r} has no device address (not bound)")
    return int(x.va + x.offset)


def _desc_of_cmd(cmd: bytes, vas: dict[int, int]) -> tuple[tacc_desc, list[tuple[int, str]]]:
    """A device descriptor from a captured ``struct drm_tacc_cmd`` (direct command)."""
    c = U.drm_tacc_cmd.from_buffer_copy(cmd)
    d = tacc_desc(opcode=c.opcode, tag=c.tag)

    def va(o: U.drm_tacc_operand) -> int:
        if o.handle not in vas:
            raise TaccError(f"graph: buffer handle {o.handle} is not a buffer of the context")
        return vas[o.handle] + int(o.offset)

    fields: list[tuple[int, str]] = []
    if c.opcode in (U.OP_COPY_H2D, U.OP_COPY_D2H, U.OP_COPY_D2D):
        a: C.Structure = copy_args(src=va(c.a), dst=va(c.b), len=c.size)
        fields = [(copy_args.src.offset, "a.offset"), (copy_args.dst.offset, "b.offset")]
    elif c.opcode == U.OP_GEMM:
        a = gemm_args(a=va(c.a), b=va(c.b), c=va(c.c), m=c.m, n=c.n, k=c.k, lda=c.lda,
                      ldb=c.ldb, ldc=c.ldc, alpha=c.alpha, beta=c.beta)
    elif c.opcode == U.OP_ELTWISE:
        a = eltwise_args(a=va(c.a), b=va(c.b) if c.b.handle else 0, c=va(c.c), n=c.size,
                         op=c.elt_op, scalar=c.scalar)
    elif c.opcode == U.OP_NOP:
        a = copy_args()
    else:
        raise TaccError(f"graph: opcode {c.opcode} cannot be listed")
    C.memmove(C.addressof(d.payload), C.addressof(a), C.sizeof(a))
    return d, fields


def upload_graph(g: Graph) -> DeviceList:
    """Writes the graph's descriptors (with VAs) and patch table into host buffers."""
    ctx = g.stream.ctx
    vas = {b.handle: int(b.va) for b in list(ctx._buffers) if not b.freed and b.va}
    descs: list[tacc_desc] = []
    patches: list[tacc_list_patch] = []
    for i, e in enumerate(g.entries):
        if e.op is not None:
            enc = encode_op(e.op)
            order = _ADDR_ORDER[type(enc.args)]
            for f, x in zip(order, enc.operands, strict=False):
                if x is not None:
                    setattr(enc.args, f, _va(x))
            d = tacc_desc(opcode=enc.opcode, tag=e.op.tag)
            C.memmove(C.addressof(d.payload), C.addressof(enc.args), C.sizeof(enc.args))
            for off, prm, pop in enc.patches:
                patches.append(tacc_list_patch(cmd=i, offset=off, param=prm.slot, op=pop,
                                               mult=prm.scale & (1 << 64) - 1))
        else:
            d, fields = _desc_of_cmd(e.cmd, vas)
            byname = {n: off for off, n in fields}
            for fld, prm in e.patches:
                if fld not in byname:
                    raise TaccError(f"graph: {fld} of opcode {d.opcode} takes no parameter")
                off = byname[fld]
                cur = struct.unpack_from("<Q", bytes(d.payload), off)[0]
                struct.pack_into("<Q", d.payload, off, cur + prm.bias)
                patches.append(tacc_list_patch(cmd=i, offset=off, param=prm.slot,
                                               op=PATCH_ADD64, mult=prm.scale))
        descs.append(d)
    hb = ctx._alloc_host_raw((len(descs) * 128,), np.uint8)
    C.memmove(hb.array.ctypes.data, (tacc_desc * len(descs))(*descs), len(descs) * 128)
    pb = None
    if patches:
        pb = ctx._alloc_host_raw((len(patches) * 16,), np.uint8)
        C.memmove(pb.array.ctypes.data, (tacc_list_patch * len(patches))(*patches),
                  len(patches) * 16)
    return DeviceList(hb, pb, len(descs), len(patches))


_ADDR_ORDER: dict[type[C.Structure], tuple[str, ...]] = {
    gemm_args: ("a", "b", "c", "bias"), eltwise_args: ("a", "b", "c"),
    softmax_args: ("x", "y"), norm_args: ("x", "y", "gamma", "beta", "stats"),
    gather_args: ("table", "idx", "out")}


def _encode_launch(arr: Any, i: int, launch: Launch) -> None:
    dl: DeviceList = launch.graph.device_list
    la = list_args(count=dl.count, npatch=dl.npatch, list_id=launch.graph.id)
    for j, v in enumerate(launch.block[:16]):
        la.params[j] = int(v) & 0xFFFFFFFF
    _cmd2(arr, i, U.OP_LIST, launch.tag, la, [dl.descs, dl.patches])
