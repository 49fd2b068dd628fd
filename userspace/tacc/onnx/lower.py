"""Lowering ONNX nodes to tacc device commands.

:func:`lower_node` turns one node (given the shapes, dtypes and places of its inputs) into
a :class:`Step`: the stream calls that compute it on the device, or the reason the device
cannot (``None`` plus a message), in which case the session runs it on the host or refuses
the model.  Layout-only nodes (Reshape, Flatten, Squeeze, Unsqueeze, Identity, a
Transpose of size-1 axes) become views of the same device memory, no command.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from ..runtime import kernels as K
from ..runtime.ops import GEMM_MAX_DIM, GEMM_MAX_LD, GEMM_MAX_MNK

if TYPE_CHECKING:
    from .session import Plan

FLOATS = (K.F32, K.BF16)
INDEX = (np.dtype(np.int32), np.dtype(np.int64))
# Nodes whose output follows from the static shapes alone: constants of the plan.
HOST_CONST_OPS = ("Shape", "Size", "Constant", "ConstantOfShape")
LAYOUT_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
# The op types the device runs (some only with given attributes, shapes or dtypes).
DEVICE_OPS = ("MatMul", "Gemm", "Add", "Mul", "Softmax", "LayerNormalization",
              "RMSNormalization", "Gelu", "Sigmoid", "Swish", "Exp", "Relu", "Cast", "Gather",
              "Transpose", "Concat", "Sub", "Neg", "CastLike", *HOST_CONST_OPS, *LAYOUT_OPS)


class Unsupported(Exception):
    """The device has no command for this node as given (the reason is the message)."""


@dataclass
class Step:
    """One node, or a fused group (``nodes``), and how it runs."""

    nodes: list[onnx.NodeProto]
    run: Callable[[Any], None] | None = None   # device: run(stream); None: host
    reason: str = ""
    fused: str = ""
    outputs: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        n = self.nodes[0]
        return f"{n.name or n.output[0]!r} ({'+'.join(x.op_type for x in self.nodes)})"


def attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _floats(plan: Plan, names: list[str], op: str) -> None:
    for nm in names:
        if nm and plan.dtype(nm) not in FLOATS:
            raise Unsupported(f"{op}: {nm} is {plan.dtype(nm)}; the device computes float32 "
                              "and bfloat16")


def _prod(s: tuple[int, ...]) -> int:
    return int(np.prod(s, dtype=np.int64))


def lower_node(plan: Plan, i: int) -> Step:
    """Lowers ``plan.nodes[i]`` (and the nodes fused into it, marked done in ``plan``)."""
    node = plan.nodes[i]
    if node.op_type in HOST_CONST_OPS or (node.input and all(
            not x or plan.is_const(x) for x in node.input) and node.op_type not in
            ("Identity",)):
        # every input a constant (Shape of a static shape too): folded once, at plan time
        try:
            plan.fold_constant(node)
            return Step([node], lambda s: None, fused="folded", outputs=[])
        except Exception as e:  # the reference cannot fold it: lowered as any node
            if node.op_type in HOST_CONST_OPS:
                return Step([node], None, f"{node.op_type} could not be folded: {e}")
    fn = LOWER.get(node.op_type)
    if node.domain not in ("", "ai.onnx") or fn is None:
        return Step([node], None, f"no device command for {node.op_type}"
                    + (f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""))
    try:
        return fn(plan, i, node, attrs(node))
    except Unsupported as e:
        return Step([node], None, str(e))


# ------------------------------------------------------------------ nodes ---
def _layout(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, y = node.input[0], node.output[0]
    shape = plan.shape(y)
    if plan.dtype(x) != plan.dtype(y):
        raise Unsupported("layout op changes the dtype")

    def run(s: Any) -> None:
        pass

    plan.alias(y, x, shape)
    return Step([node], run, outputs=[y])


GEMM_MAX_BATCH = 65536  # docs/hardware.md (GEMM_MAX_DIM, GEMM_MAX_MNK: runtime.ops)


def _canon(shape: tuple[int, ...], perm: list[int]) -> tuple[list[int], list[int]]:
    """The same transpose over fewer axes: size-1 axes dropped, and axes adjacent (in
    order) in both the input and the output merged into one."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    pos = {a: j for j, a in enumerate(keep)}
    p = [pos[a] for a in perm if shape[a] != 1]
    groups: list[list[int]] = []       # runs of p of consecutive input axes
    for a in p:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])   # input order
    dims = [_prod(tuple(shape[keep[a]] for a in groups[g])) for g in order]
    rank = {g: j for j, g in enumerate(order)}
    return dims, [rank[g] for g in range(len(groups))]


def _rot_cost(dims: list[int], cur: tuple[int, ...], s: int, j: int) -> int:
    """Multiply-adds of moving ``cur[s:s+j]`` to the end (x^T @ I or I @ x^T, the
    smaller identity)."""
    x = _prod(tuple(dims[a] for a in cur[s:s + j]))
    y = _prod(tuple(dims[a] for a in cur[s + j:]))
    return _prod(tuple(dims[a] for a in cur[:s])) * x * y * min(x, y)


def _rotations(dims: list[int], perm: list[int]) -> list[tuple[int, int]]:
    """The fewest (then cheapest) batched last-two-axes transposes taking the axes from
    input order to ``perm``: each (s, j) moves the j axes at position s to the end (the
    suffix from s rotated by j; the axes before s are the batch)."""
    n = len(perm)
    start, goal = tuple(range(n)), tuple(perm)
    if n <= 6:   # Dijkstra over (commands, multiply-adds); the axes in place stay
        heap: list[tuple[int, int, tuple[int, ...], list[tuple[int, int]]]] = [
            (0, 0, start, [])]
        seen: set[tuple[int, ...]] = set()
        while heap:
            k, f, cur, path = heapq.heappop(heap)
            if cur == goal:
                return path
            if cur in seen:
                continue
            seen.add(cur)
            s0 = next(s for s in range(n) if cur[s] != goal[s])
            for s in range(s0, n - 1):
                for j in range(1, n - s):
                    nxt = cur[:s] + cur[s + j:] + cur[s:s + j]
                    if nxt not in seen:
                        heapq.heappush(heap, (k + 1, f + _rot_cost(dims, cur, s, j), nxt,
                                              [*path, (s, j)]))
    # more axes: the axes after perm's leading increasing run moved to the end in order,
    # those adjacent at the time together
    lead = 1
    while lead < n and perm[lead] > perm[lead - 1]:
        lead += 1
    path: list[tuple[int, int]] = []
    cur = list(start)
    k = lead
    while k < n:
        s, j = cur.index(perm[k]), 1
        while k + j < n and s + j < n and cur[s + j] == perm[k + j]:
            j += 1
        path.append((s, j))
        cur = cur[:s] + cur[s + j:] + cur[s:s + j]
        k += j
    return path


class _Transposer:
    """Device commands permuting a tensor's axes: batched last-two-axes transposes on the
    GEMM engine (x^T @ I with ``trans_a``, or I @ x^T with ``trans_b``: the smaller
    identity), through scratch values of the plan."""

    def __init__(self, plan: Plan, x: str, shape: tuple[int, ...], perm: list[int],
                 name: str) -> None:
        self.dtype = plan.dtype(x)
        self.dims, cperm = _canon(shape, perm)
        self.path = _rotations(self.dims, cperm) if _prod(shape) else []
        if self.path:
            _floats(plan, [x], "Transpose")
        self.plan, self.eyes = plan, {}
        cur = tuple(range(len(self.dims)))
        self.cmds: list[tuple[int, int, int]] = []      # (batch, x, y) per rotation
        for s, j in self.path:
            a = _prod(tuple(self.dims[q] for q in cur[:s]))
            xx = _prod(tuple(self.dims[q] for q in cur[s:s + j]))
            yy = _prod(tuple(self.dims[q] for q in cur[s + j:]))
            e = min(xx, yy)
            if max(xx, yy) > GEMM_MAX_DIM or xx * yy * e > GEMM_MAX_MNK:
                raise Unsupported(f"Transpose perm {perm} of {shape}: a {xx} x {yy} "
                                  f"transpose (the GEMM's m, n, k are <= {GEMM_MAX_DIM}, "
                                  "m n k <= 2^30)")
            if e not in self.eyes:
                self.eyes[e] = plan.const_device(np.eye(e, dtype=self.dtype))
            self.cmds.append((a, xx, yy))
            cur = cur[:s] + cur[s + j:] + cur[s:s + j]
        n = _prod(shape)
        self.tmp = [plan.temp(f"{name}/t{i}", (n,), self.dtype)
                    for i in range(min(len(self.path) - 1, 2))]

    def __len__(self) -> int:
        return len(self.cmds)

    def run(self, s: Any, src: Any, dst: Any) -> None:
        """Issues the commands: ``src`` (any shape) permuted into ``dst``."""
        isz = self.dtype.itemsize
        cur = src
        for i, (a, xx, yy) in enumerate(self.cmds):
            out = dst if i == len(self.cmds) - 1 else self.plan.dev(self.tmp[i % 2])
            e = self.eyes[min(xx, yy)]
            # the batch in chunks within the GEMM limits (batch, batch m n k)
            step = max(1, min(GEMM_MAX_BATCH, GEMM_MAX_MNK // (xx * yy * min(xx, yy))))
            for b0 in range(0, a, step):
                nb = min(step, a - b0)
                off = b0 * xx * yy * isz
                vi = cur.view((nb, xx, yy), offset=off)
                vo = out.view((nb, yy, xx), offset=off)
                if xx <= yy:
                    s.gemm(vi, e, vo, trans_a=True)     # (x^T) @ I_x
                else:
                    s.gemm(e, vi, vo, trans_b=True)     # I_y @ (x^T)
            cur = out


def _transpose(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, y = node.input[0], node.output[0]
    shape = plan.shape(x)
    perm = list(at.get("perm", range(len(shape) - 1, -1, -1)))
    tr = _Transposer(plan, x, shape, perm, y)
    if not len(tr):   # only size-1 axes move (or no element): the same bytes
        plan.alias(y, x, plan.shape(y))
        return Step([node], lambda s: None, outputs=[y])
    plan.alloc(y)
    return Step([node], lambda s: tr.run(s, plan.dev(x), plan.dev(y)), outputs=[y])


def _batch_ok(bshape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    return _prod(bshape) == 1 or tuple(bshape) == tuple(full)


def _over_limits(m: int, n: int, k: int, nb: int = 1) -> bool:
    """Past the device's GEMM limits: one matrix runs as block GEMMs
    (``Stream.gemm_blocks``); a batch of them is refused (the host runs it)."""
    over = max(m, n, k) > GEMM_MAX_DIM or nb * m * n * k > GEMM_MAX_MNK
    if over and nb > 1:
        raise Unsupported(f"batched GEMM of {nb} x {m}x{n}x{k} past the device's limits "
                          f"(m, n, k <= {GEMM_MAX_DIM}, batch*m*n*k <= 2^30): only a "
                          "single matrix is split into blocks")
    if over and max(m, n, k) > GEMM_MAX_LD:
        raise Unsupported(f"GEMM {m}x{n}x{k}: a dimension past the device's leading "
                          f"dimension ({GEMM_MAX_LD}) cannot be split in place")
    return over


def _matmul(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    a, b = node.input[0], node.input[1]
    _floats(plan, [a, b], "MatMul")
    if plan.dtype(a) != plan.dtype(b):
        raise Unsupported("MatMul operands of different dtypes")
    sa, sb = plan.shape(a), plan.shape(b)
    y = node.output[0]
    sy = plan.shape(y)
    av = sa if len(sa) >= 2 else (1, *sa)
    bv = sb if len(sb) >= 2 else (*sb, 1)
    batch = tuple(np.broadcast_shapes(av[:-2], bv[:-2]))
    if not (_batch_ok(av[:-2], batch) and _batch_ok(bv[:-2], batch)):
        raise Unsupported(f"MatMul batch broadcast {sa} x {sb}")
    nb, m, n = _prod(batch), av[-2], bv[-1]
    split = _over_limits(m, n, av[-1], nb)
    trans_b, b_src = False, b
    prod = plan.producer(b)
    if prod is not None and prod.op_type == "Transpose" and plan.single_use(b):
        sp = plan.shape(prod.input[0])
        perm = list(attrs(prod).get("perm", range(len(sp) - 1, -1, -1)))
        if len(sp) >= 2 and perm == [*range(len(sp) - 2), len(sp) - 1, len(sp) - 2]:
            trans_b, b_src = True, prod.input[0]
    nodes, bias, out = [node], None, y
    # MatMul + Add(bias row vector) -> one GEMM with bias
    cons = plan.consumers(y)
    if len(cons) == 1 and cons[0].op_type == "Add" and not plan.is_output(y):
        add = cons[0]
        other = add.input[1] if add.input[0] == y else add.input[0]
        if plan.dtype(other) in FLOATS and _prod(plan.shape(other)) == n and \
                plan.shape(add.output[0]) == sy and plan.dtype(add.output[0]) == plan.dtype(y):
            nodes, bias, out = [node, add], other, add.output[0]
            plan.done(add)
    plan.alloc(out)

    def run(s: Any) -> None:
        da = plan.dev(a)
        db = plan.dev(b_src)
        dbv = db.view((_prod(db.shape[:-2]) if len(db.shape) > 2 else 1, *db.shape[-2:])) \
            if len(db.shape) >= 2 else db.view((1, db.shape[0], 1))
        dav = da.view((_prod(av[:-2]), m, av[-1]))
        do = plan.dev(out).view((nb, m, n))
        dbias = plan.dev(bias).view((n,)) if bias else None
        if split:  # one matrix past the device's limits: block GEMMs
            s.gemm_blocks(dav.view(dav.shape[1:]), dbv.view(dbv.shape[1:]),
                          do.view(do.shape[1:]), trans_b=trans_b, bias=dbias)
            return
        s.gemm(dav, dbv, do, trans_b=trans_b, bias=dbias)

    if trans_b:
        nodes.insert(0, prod)
        plan.undo(prod)
    return Step(nodes, run, fused="+".join(x.op_type for x in nodes) if len(nodes) > 1 else "",
                outputs=[out])


def _gemm(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    _floats(plan, [a, b, c], "Gemm")
    if plan.dtype(a) != plan.dtype(b):
        raise Unsupported("Gemm operands of different dtypes")
    ta, tb = bool(at.get("transA", 0)), bool(at.get("transB", 0))
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    y = node.output[0]
    m, n = plan.shape(y)
    sa = plan.shape(a)
    split = _over_limits(m, n, sa[0] if ta else sa[-1])
    bias = full = None
    if c and beta != 0.0:
        sc = plan.shape(c)
        if sc == (m, n):
            full = c
        elif _prod(sc) == n and (len(sc) == 1 or sc[0] == 1) and (m == 1 or sc[-1] == n):
            if beta == 1.0:
                bias = c
            elif plan.is_const(c):
                bias = plan.const_name(c + "/beta", plan.const(c).reshape(n) * np.float32(beta))
            else:
                raise Unsupported("Gemm: a bias input scaled by beta != 1")
        elif plan.is_const(c):
            full = plan.const_name(c + "/bcast", np.broadcast_to(plan.const(c), (m, n)))
        else:
            raise Unsupported(f"Gemm: C of shape {sc} broadcast to ({m}, {n})")
    plan.alloc(y)

    def run(s: Any) -> None:
        do = plan.dev(y)
        if full is not None:
            s.copy_d2d(do, plan.dev(full).view(do.shape, do.dtype)) if \
                plan.dtype(full) == do.dtype else s.cast(plan.dev(full), do)
        (s.gemm_blocks if split else s.gemm)(
            plan.dev(a), plan.dev(b), do, alpha=alpha, beta=beta if full else 0.0,
            trans_a=ta, trans_b=tb, bias=plan.dev(bias) if bias else None)

    return Step([node], run, outputs=[y])


def _binary(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    a, b = node.input[0], node.input[1]
    y = node.output[0]
    _floats(plan, [a, b, y], node.op_type)
    sy = plan.shape(y)
    sa, sb = plan.shape(a), plan.shape(b)
    if tuple(sa) != tuple(sy):
        a, b, sa, sb = b, a, sb, sa   # commutative: the full operand first
    if tuple(sa) != tuple(sy):
        raise Unsupported(f"{node.op_type}: neither input has the output shape {sy}")
    if tuple(sb) != tuple(sy) and not (_prod(sb) == sy[-1] and
                                       all(d == 1 for d in sb[:-1]) and sb[-1:] == sy[-1:]):
        if plan.is_const(b):
            b = plan.const_name(b + "/bcast", np.broadcast_to(plan.const(b), sy))
        else:
            raise Unsupported(f"{node.op_type}: broadcast {sb} -> {sy} (the device broadcasts "
                              "a row vector)")
    if plan.dtype(a) != plan.dtype(y) or plan.dtype(b) != plan.dtype(y):
        raise Unsupported(f"{node.op_type}: mixed dtypes")
    kind = node.op_type.lower()
    plan.alloc(y)

    def run(s: Any) -> None:
        getattr(s, kind)(plan.dev(a), plan.dev(b), plan.dev(y))

    return Step([node], run, outputs=[y])


def _sigmoid(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    """Sigmoid(x) * x (either order) -> one SiLU command writing the Mul's output."""
    x, sg = node.input[0], node.output[0]
    cons = plan.consumers(sg)
    if len(cons) == 1 and cons[0].op_type == "Mul" and not plan.is_output(sg):
        mul = cons[0]
        other = mul.input[1] if mul.input[0] == sg else mul.input[0]
        y = mul.output[0]
        if other == x and plan.shape(y) == plan.shape(x) and \
                plan.dtype(x) == plan.dtype(y) and plan.dtype(x) in FLOATS:
            plan.done(mul)
            plan.alloc(y)
            return Step([node, mul], lambda s: s.silu(plan.dev(x), plan.dev(y)),
                        fused="Sigmoid+Mul", outputs=[y])
    raise Unsupported("Sigmoid alone (the device has SiLU: Sigmoid(x) * x)")


def _unary(kind: str) -> Callable[..., Step]:
    def lower(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
        x, y = node.input[0], node.output[0]
        _floats(plan, [x, y], node.op_type)
        if node.op_type == "Gelu" and at.get("approximate", b"none") not in (b"tanh", "tanh"):
            raise Unsupported("Gelu approximate='none' (erf); the device computes the tanh "
                              "form")
        if node.op_type == "Swish" and float(at.get("alpha", 1.0)) != 1.0:
            raise Unsupported("Swish alpha != 1")
        if kind == "relu" and plan.dtype(x) != K.F32:
            raise Unsupported("Relu on bfloat16")
        if plan.dtype(x) != plan.dtype(y):
            raise Unsupported(f"{node.op_type}: dtype changes")
        plan.alloc(y)
        return Step([node], lambda s: getattr(s, kind)(plan.dev(x), plan.dev(y)), outputs=[y])

    return lower


def _softmax(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, y = node.input[0], node.output[0]
    _floats(plan, [x, y], "Softmax")
    shape = plan.shape(x)
    if not shape:
        raise Unsupported("Softmax of a scalar")
    axis = int(at.get("axis", -1 if plan.opset >= 13 else 1))
    axis = axis + len(shape) if axis < 0 else axis
    if plan.opset < 13:
        cols = _prod(shape[axis:])
    elif _prod(shape[axis + 1:]) > 1 and _prod(shape):
        return _softmax_axis(plan, node, shape, axis)
    else:
        cols = shape[axis]
    plan.alloc(y)

    def run(s: Any) -> None:
        dx, dy = plan.dev(x), plan.dev(y)
        v = (_prod(shape) // max(cols, 1), cols)
        s.softmax(dx.view(v), dy.view(v))

    return Step([node], run, outputs=[y])


def _softmax_axis(plan: Plan, node: onnx.NodeProto, shape: tuple[int, ...], axis: int
                  ) -> Step:
    """Softmax over an axis with axes after it, (A, I, B): the axis moved to the end
    (a transpose to (A, B, I)), SOFTMAX over rows, and moved back."""
    x, y = node.input[0], node.output[0]
    a, n, b = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
    if plan.dtype(x) != plan.dtype(y):
        raise Unsupported("Softmax: dtype changes")
    if n > 65536:
        raise Unsupported(f"Softmax over {n} columns (the device's rows are <= 65536)")
    there = _Transposer(plan, x, (a, n, b), [0, 2, 1], y + "/to")  # raises before temps
    t_in = plan.temp(y + "/last", (a * b * n,), plan.dtype(x))
    t_out = plan.temp(y + "/softmax", (a * b * n,), plan.dtype(x))
    back = _Transposer(plan, t_out, (a, b, n), [0, 2, 1], y + "/back")
    plan.alloc(y)

    def run(s: Any) -> None:
        ti, to = plan.dev(t_in), plan.dev(t_out)
        there.run(s, plan.dev(x), ti)
        s.softmax(ti.view((a * b, n)), to.view((a * b, n)))
        back.run(s, to, plan.dev(y))

    return Step([node], run, fused="Transpose+Softmax+Transpose", outputs=[y])


def _norm(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, scale = node.input[0], node.input[1]
    bias = node.input[2] if node.op_type == "LayerNormalization" and len(node.input) > 2 \
        else ""
    y = node.output[0]
    _floats(plan, [x, scale, bias, y], node.op_type)
    shape = plan.shape(x)
    axis = int(at.get("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    cols = _prod(shape[axis:])
    rows = _prod(shape[:axis])
    # Mean, InvStdDev: the NORM's row statistics (float32: rows means, then rows 1/std)
    extra = [(j, o) for j, o in enumerate(node.output[1:3], 1)
             if o and (plan.is_output(o) or plan.consumers(o))]
    stats = ""
    if extra:
        if node.op_type != "LayerNormalization" or int(at.get("stash_type", 1)) != 1 or \
                any(plan.dtype(o) != K.F32 for _, o in extra) or not rows:
            raise Unsupported(f"{node.op_type}: the Mean/InvStdDev outputs other than "
                              "float32 with stash_type 1 (the device's NORM statistics)")
        stats = plan.temp(y + "/stats", (2 * rows,), K.F32)
        for j, o in extra:
            plan.alias(o, stats, plan.shape(o), offset=(j - 1) * rows * 4)
    for v in (scale, bias):
        if v and _prod(plan.shape(v)) != cols:
            if plan.is_const(v):
                continue
            raise Unsupported(f"{node.op_type}: {v} {plan.shape(v)} broadcast to "
                              f"{shape[axis:]}")
    g = scale if _prod(plan.shape(scale)) == cols else plan.const_name(
        scale + "/bcast", np.broadcast_to(plan.const(scale), shape[axis:]))
    bt = bias
    if bias and _prod(plan.shape(bias)) != cols:
        bt = plan.const_name(bias + "/bcast", np.broadcast_to(plan.const(bias), shape[axis:]))
    eps = float(at.get("epsilon", 1e-5))
    plan.alloc(y)

    def run(s: Any) -> None:
        v = (_prod(shape) // max(cols, 1), cols)
        dx, dy = plan.dev(x).view(v), plan.dev(y).view(v)
        gv = plan.dev(g).view((cols,))
        if node.op_type == "LayerNormalization":
            s.layer_norm(dx, gv, plan.dev(bt).view((cols,)) if bt else None, dy, eps=eps,
                         stats=plan.dev(stats) if stats else None)
        else:
            s.rms_norm(dx, gv, dy, eps=eps)

    return Step([node], run, outputs=[y, *(o for _, o in extra)])


def _cast(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, y = node.input[0], node.output[0]
    if plan.dtype(x) not in FLOATS or plan.dtype(y) not in FLOATS:
        raise Unsupported(f"Cast {plan.dtype(x)} -> {plan.dtype(y)}: the device casts "
                          "float32 <-> bfloat16")
    if plan.dtype(x) == plan.dtype(y):
        plan.alias(y, x, plan.shape(y))
        return Step([node], lambda s: None, outputs=[y])
    plan.alloc(y)
    return Step([node], lambda s: s.cast(plan.dev(x), plan.dev(y)), outputs=[y])


def _gather(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    data, idx = node.input[0], node.input[1]
    y = node.output[0]
    if int(at.get("axis", 0)) not in (0, -len(plan.shape(data))):
        raise Unsupported(f"Gather axis {at.get('axis')} (the device gathers rows: axis 0)")
    _floats(plan, [data], "Gather")
    if plan.dtype(idx) not in INDEX:
        raise Unsupported(f"Gather indices of {plan.dtype(idx)}")
    sd = plan.shape(data)
    if not sd:
        raise Unsupported("Gather from a scalar")
    rows, cols = sd[0], _prod(sd[1:])
    plan.index_input(idx, rows)
    plan.alloc(y)

    def run(s: Any) -> None:
        ni = max(_prod(plan.shape(idx)), 1)
        s.gather(plan.dev(data).view((rows, cols)), plan.dev(idx).view((ni,)),
                 plan.dev(y).view((ni, cols)))

    return Step([node], run, outputs=[y])


def _concat(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    y = node.output[0]
    sy = plan.shape(y)
    axis = int(at["axis"])
    axis = axis + len(sy) if axis < 0 else axis
    ins = [x for x in node.input if x and _prod(plan.shape(x)) > 0]
    outer = _prod(sy[:axis])
    if outer > 256:
        raise Unsupported(f"Concat of {outer} blocks per input (at most 256 copies)")
    isz = plan.dtype(y).itemsize
    if any(plan.dtype(x) != plan.dtype(y) for x in ins):
        raise Unsupported("Concat of mixed dtypes")
    plan.alloc(y)

    def run(s: Any) -> None:
        do = plan.dev(y)
        row = _prod(sy[axis:]) * isz
        off = 0
        for x in ins:
            blk = _prod(plan.shape(x)[axis:]) * isz
            dx = plan.dev(x)
            for o in range(outer):
                s.copy_d2d(do, dx, blk, dst_offset=o * row + off, src_offset=o * blk)
            off += blk

    return Step([node], run, outputs=[y])


def _sub(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    """a - b = a + (-1 * b): the element-wise SCALE then ADD commands (float32)."""
    a, b = node.input[0], node.input[1]
    y = node.output[0]
    if any(plan.dtype(x) != K.F32 for x in (a, b, y)):
        raise Unsupported("Sub on other than float32 (the device negates with SCALE, fp32)")
    sy = plan.shape(y)
    if plan.shape(a) != sy or plan.shape(b) != sy:
        raise Unsupported(f"Sub with broadcast {plan.shape(a)} - {plan.shape(b)}")
    tmp = plan.temp(y + "/neg", sy, K.F32)
    plan.alloc(y)

    def run(s: Any) -> None:
        s.scale(plan.dev(b), -1.0, plan.dev(tmp))
        s.add(plan.dev(a), plan.dev(tmp), plan.dev(y))

    return Step([node], run, outputs=[y])


def _neg(plan: Plan, i: int, node: onnx.NodeProto, at: dict[str, Any]) -> Step:
    x, y = node.input[0], node.output[0]
    if plan.dtype(x) != K.F32:
        raise Unsupported("Neg on other than float32 (the device's SCALE is fp32)")
    plan.alloc(y)
    return Step([node], lambda s: s.scale(plan.dev(x), -1.0, plan.dev(y)), outputs=[y])


LOWER: dict[str, Callable[..., Step]] = {
    **{op: _layout for op in LAYOUT_OPS},
    "Transpose": _transpose, "MatMul": _matmul, "Gemm": _gemm, "Add": _binary, "Mul": _binary,
    "Sigmoid": _sigmoid, "Gelu": _unary("gelu"), "Swish": _unary("silu"),
    "Exp": _unary("exp"), "Relu": _unary("relu"), "Softmax": _softmax,
    "LayerNormalization": _norm, "RMSNormalization": _norm, "Cast": _cast,
    "Gather": _gather, "Concat": _concat, "Sub": _sub, "Neg": _neg, "CastLike": _cast,
}
