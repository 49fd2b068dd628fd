"""The inference operations on a stream (GEMM with transposes/batch/bias/bf16, softmax,
layer/RMS norm, GELU, SiLU, exp, broadcast add/mul, cast, gather).

A call is checked here (device buffers of the context, dtypes, shapes), becomes an
:class:`Op` (kind, operand buffers, parameters, FLOPs and device-memory bytes) and is
submitted as one command of one job, or recorded into the graph being captured
(:mod:`tacc.runtime.graph`).  :func:`run_op` is what the command computes
(:mod:`tacc.runtime.kernels`), used by the simulator backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import apitrace as tr
from . import kernels as K
from . import opcost
from .buffers import Buffer, device_side
from .errors import DtypeError, ShapeError

if TYPE_CHECKING:
    from .context import Context
    from .stream import Stream

INDEX_DTYPES = (np.dtype(np.int32),)
# device limits (docs/hardware.md section 14)
GEMM_MAX_DIM = 4096        # m, n, k
GEMM_MAX_MNK = 1 << 30     # batch * m * n * k
GEMM_MAX_LD = 65536        # lda, ldb, ldc
MAX_BATCH = 65536
MAX_COLS = 65536           # SOFTMAX, NORM, GATHER columns
MAX_ELEMS = 1 << 26        # elements of one operand (rows * cols, eltwise n)


@dataclass
class Op:
    """One inference command: ``kind``, operands by role, parameters, its roofline cost.

    A parameter may be a :class:`~tacc.runtime.graph.Param` (a graph's parameter block
    value, read by the device when the command runs).
    """

    kind: str
    bufs: dict[str, Buffer]
    p: dict[str, Any] = field(default_factory=dict)
    flops: int = 0
    nbytes: int = 0
    bf16: bool = False   # a GEMM with bf16 A and B: the bf16 peak
    tag: int = 0

    def summary(self) -> str:
        dims = " ".join(f"{k}={_pv(v)}" for k, v in self.p.items()
                        if k in ("m", "n", "k", "batch", "rows", "cols", "pos_offset"))
        return f"{dims} flops={self.flops} bytes={self.nbytes}".strip()


def _pv(v: Any) -> str:
    return str(v) if isinstance(v, (int, float, bool)) else repr(v)


def resolve(v: Any, params: np.ndarray | None) -> Any:
    """A parameter's value: a plain value, or a Param read from the parameter block."""
    if hasattr(v, "value_in"):
        if params is None:
            raise ValueError(f"{v!r} outside a graph launch")
        return v.value_in(params)
    return v


def run_op(op: Op, load: Callable[[Buffer], np.ndarray],
           store: Callable[[Buffer, np.ndarray], None], params: np.ndarray | None = None
           ) -> None:
    """Executes ``op``: ``load`` reads an operand as its shape/dtype, ``store`` writes one."""
    b, p = op.bufs, {k: resolve(v, params) for k, v in op.p.items()}
    out = b["out"]
    if op.kind == "gemm":
        ld = p.get("ld") or {}
        a = _strided(load(b["a"]), ld["a"]) if "a" in ld else \
            load(b["a"]).reshape(p["ba"], *p["a_mat"])
        bm = _strided(load(b["b"]), ld["b"]) if "b" in ld else \
            load(b["b"]).reshape(p["bb"], *p["b_mat"])
        span = load(out) if "c" in ld else None
        c = _strided(span, ld["c"]) if span is not None else \
            load(out).reshape(p["batch"], p["m"], p["n"]) if p["beta"] != 0.0 else None
        bias = load(b["bias"]) if "bias" in b else None
        r = K.gemm(a, bm, trans_a=p["trans_a"], trans_b=p["trans_b"], alpha=p["alpha"],
                   beta=p["beta"], c=c if p["beta"] != 0.0 else None, bias=bias,
                   out_dtype=out.dtype)
        if span is not None:  # the block's rows within the span, the rest as it was
            assert c is not None
            c[...] = r
            store(out, span)
            return
    elif op.kind == "softmax":
        x = load(b["x"]).reshape(-1, p["rows"], p["cols"])
        r = K.softmax(x, scale=p["scale"], causal=p["causal"], pos_offset=p["pos_offset"],
                      out_dtype=out.dtype)
    elif op.kind == "layer_norm":
        x = load(b["x"]).reshape(-1, p["cols"])
        r = K.layer_norm(x, load(b["gamma"]), load(b["beta"]) if "beta" in b else None,
                         eps=p["eps"], out_dtype=out.dtype)
        if "stats" in b:
            st = K.norm_stats(x, "layer_norm", eps=p["eps"])
            store(b["stats"], st.reshape(b["stats"].shape))
    elif op.kind == "rms_norm":
        x = load(b["x"]).reshape(-1, p["cols"])
        r = K.rms_norm(x, load(b["gamma"]), eps=p["eps"], out_dtype=out.dtype)
        if "stats" in b:
            st = K.norm_stats(x, "rms_norm", eps=p["eps"])
            store(b["stats"], st.reshape(b["stats"].shape))
    elif op.kind in ("gelu", "silu", "exp"):
        r = getattr(K, op.kind)(load(b["x"]), out_dtype=out.dtype)
    elif op.kind in ("add", "mul"):
        a = load(b["x"]).reshape(-1, p["cols"])
        r = K.binary(op.kind, a, load(b["y"]), out_dtype=out.dtype)
    elif op.kind == "cast":
        r = K.cast(load(b["x"]), out.dtype)
    elif op.kind == "gather":
        r = K.gather(load(b["table"]).reshape(p["rows"], p["cols"]), load(b["idx"]))
    else:
        raise ValueError(f"unknown op {op.kind}")
    store(out, np.ascontiguousarray(r).reshape(out.shape))


def _strided(span: np.ndarray, mat: tuple[int, int, int]) -> np.ndarray:
    """A ``rows x cols`` matrix with ``ld`` elements per row inside the flat ``span``
    (writable when the span is), as one batch ``(1, rows, cols)``."""
    rows, cols, ld = mat
    flat = span.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat, (1, rows, cols),
                                           (0, ld * flat.itemsize, flat.itemsize))


# ------------------------------------------------------------------ checks ---
def _dev(ctx: Context, x: Any, what: str, dtypes: tuple[np.dtype, ...] | None = None
         ) -> Buffer:
    """The device buffer behind ``x``, of one of ``dtypes`` (default: float32, bfloat16)."""
    d = device_side(x, what)
    d.check(ctx)
    if d.dtype not in dtypes if dtypes else not (d.dtype == K.F32 or K.is_bf16(d.dtype)):
        raise DtypeError(f"{what}: {d!r} is {d.dtype}; the device takes "
                         + ", ".join(str(t) for t in dtypes or ("float32", "bfloat16")))
    if d.size > MAX_ELEMS:
        raise ShapeError(f"{what}: {d.size} elements exceed the device limit {MAX_ELEMS}")
    return d


def _rows(x: Buffer, what: str) -> tuple[int, int]:
    if not x.shape or x.shape[-1] == 0 or x.size == 0:
        raise ShapeError(f"{what}: empty or 0-D operand {x.shape}")
    cols = x.shape[-1]
    if cols > MAX_COLS:
        raise ShapeError(f"{what}: rows of {cols} exceed the device limit {MAX_COLS}")
    return x.size // cols, cols


def _same(x: Buffer, out: Buffer, what: str) -> None:
    if out.size != x.size:
        raise ShapeError(f"{what}: out has {out.size} elements, the input {x.size}")


def _vec(ctx: Context, v: Any, cols: int, what: str) -> Buffer:
    d = _dev(ctx, v, what)
    if d.size != cols:
        raise ShapeError(f"{what}: {d.shape} is not a row vector of {cols}")
    return d


def _is_bf16(*bufs: Buffer) -> bool:
    return any(K.is_bf16(b.dtype) for b in bufs)


def _mat(x: Buffer, what: str, ld: tuple[int, int, int] | None = None
         ) -> tuple[int, int, int]:
    if ld is not None:  # one matrix of rows x cols, ld elements a row, in a flat span
        rows, cols, pitch = ld
        if len(x.shape) != 1 or x.size != (rows - 1) * pitch + cols or not \
                cols <= pitch <= GEMM_MAX_LD:
            raise ShapeError(f"gemm: {what} {x.shape} is not a {rows} x {cols} matrix with "
                             f"{pitch} elements a row (<= {GEMM_MAX_LD})")
        return 1, rows, cols
    if len(x.shape) < 2:
        raise ShapeError(f"gemm: {what} must be at least 2-D, has shape {x.shape}")
    r, c = x.shape[-2], x.shape[-1]
    return int(np.prod(x.shape[:-2], dtype=np.int64)), r, c


# --------------------------------------------------------------- builders ---
def build_gemm(ctx: Context, a: Any, b: Any, c: Any, *, alpha: float, beta: float,
               trans_a: bool, trans_b: bool, batch: int | None, bias: Any,
               ld: dict[str, tuple[int, int, int]] | None = None) -> Op:
    """``ld``: role (``a``, ``b``, ``c``) -> (rows, cols, elements a row) of an operand
    given as the flat span of a matrix inside a wider one (a block of :meth:`gemm_blocks`);
    one matrix, no batch."""
    da, db = _dev(ctx, a, "gemm operand a"), _dev(ctx, b, "gemm operand b")
    dc = _dev(ctx, c, "gemm output c")
    if da.dtype != db.dtype:
        raise DtypeError(f"gemm: a is {da.dtype}, b is {db.dtype}: operands share a dtype")
    ld = ld or {}
    ba, ar, ac = _mat(da, "a", ld.get("a"))
    bb, br, bc = _mat(db, "b", ld.get("b"))
    bo, m, n = _mat(dc, "c", ld.get("c"))
    m2, k = (ac, ar) if trans_a else (ar, ac)
    k2, n2 = (bc, br) if trans_b else (br, bc)
    nb = bo if batch is None else int(batch)
    if k != k2 or m != m2 or n != n2:
        raise ShapeError(f"gemm: shapes {da.shape}{'T' if trans_a else ''} x {db.shape}"
                         f"{'T' if trans_b else ''} -> {dc.shape} do not fit")
    if nb != bo or ba not in (1, nb) or bb not in (1, nb) or not 1 <= nb <= MAX_BATCH:
        raise ShapeError(f"gemm: batch {nb}: a has {ba}, b {bb}, c {bo} matrices "
                         f"(each {nb} or 1; batch <= {MAX_BATCH})")
    if ld and nb != 1:
        raise ShapeError(f"gemm: batch {nb} with a leading dimension (one matrix only)")
    if max(m, n, k) > GEMM_MAX_DIM or nb * m * n * k > GEMM_MAX_MNK:
        raise ShapeError(f"gemm: {nb}x{m}x{n}x{k} exceeds the device limits (m, n, k <= "
                         f"{GEMM_MAX_DIM}, batch*m*n*k <= 2^30)")
    bufs = {"a": da, "b": db, "out": dc}
    if bias is not None:
        bufs["bias"] = _vec(ctx, bias, n, "gemm bias")
        if bufs["bias"].dtype != dc.dtype:
            raise DtypeError(f"gemm: bias is {bufs['bias'].dtype}, c {dc.dtype} (the same)")
    flops, nbytes = opcost.gemm_cost(m, n, k, nb, da.dtype.itemsize, dc.dtype.itemsize,
                                     bias is not None, beta != 0.0, bb == 1 and nb > 1)
    p = {"m": m, "n": n, "k": k, "batch": nb, "ba": ba, "bb": bb, "a_mat": (ar, ac),
         "b_mat": (br, bc), "trans_a": bool(trans_a), "trans_b": bool(trans_b),
         "alpha": float(alpha), "beta": float(beta)}
    if ld:
        p["ld"] = dict(ld)
    return Op("gemm", bufs, p, flops, nbytes, _is_bf16(da, db))


def build_rows(ctx: Context, kind: str, x: Any, out: Any, **kw: Any) -> Op:
    """softmax, layer_norm, rms_norm, gelu, silu, exp, add, mul, cast."""
    dx = _dev(ctx, x, f"{kind} input")
    do = _dev(ctx, out, f"{kind} output")
    _same(dx, do, kind)
    rows, cols = _rows(dx, kind)
    bufs = {"x": dx, "out": do}
    p: dict[str, Any] = {"rows": rows, "cols": cols}
    extra = 0
    if kind == "softmax":
        if len(dx.shape) >= 2:
            p["rows"] = dx.shape[-2]
        p.update(scale=float(kw["scale"]), causal=bool(kw["causal"]),
                 pos_offset=kw["pos_offset"])
        if not hasattr(kw["pos_offset"], "value_in") and int(kw["pos_offset"]) < 0:
            raise ValueError(f"softmax: pos_offset {kw['pos_offset']} < 0")
    elif kind in ("layer_norm", "rms_norm"):
        bufs["gamma"] = _vec(ctx, kw["gamma"], cols, f"{kind} gamma")
        if kw.get("beta") is not None:
            bufs["beta"] = _vec(ctx, kw["beta"], cols, f"{kind} beta")
            if bufs["beta"].dtype != bufs["gamma"].dtype:
                raise DtypeError(f"{kind}: gamma and beta of different dtypes")
        p["eps"] = float(kw["eps"])
        if not p["eps"] > 0:
            raise ValueError(f"{kind}: eps {kw['eps']} must be > 0")
        if kw.get("stats") is not None:
            per = 2 if kind == "layer_norm" else 1
            bufs["stats"] = _dev(ctx, kw["stats"], f"{kind} stats", (K.F32,))
            if bufs["stats"].size != per * rows:
                raise ShapeError(f"{kind}: stats {bufs['stats'].shape} is not {per} x {rows} "
                                 "float32 (" + ("means, then 1/std" if per == 2 else "1/rms")
                                 + " of each row)")
        extra = sum(bufs[r].nbytes for r in ("gamma", "beta", "stats") if r in bufs)
    elif kind in ("add", "mul"):
        dy = _dev(ctx, kw["y"], f"{kind} operand b")
        if dy.size not in (dx.size, cols):
            raise ShapeError(f"{kind}: b {dy.shape} is neither a's shape {dx.shape} nor a "
                             f"row vector of {cols}")
        if dy.dtype != dx.dtype:
            raise DtypeError(f"{kind}: a is {dx.dtype}, b {dy.dtype} (the same)")
        bufs["y"] = dy
        p["row_bcast"] = dy.size != dx.size
        extra = dy.nbytes
    elif kind == "cast":
        if dx.dtype == do.dtype:
            raise DtypeError(f"cast: input and output are both {dx.dtype}")
    rows_total = dx.size // cols
    flops, nbytes = opcost.rows_cost(kind, rows_total * cols, dx.dtype.itemsize,
                                     do.dtype.itemsize, extra)
    if dx.size > MAX_ELEMS:
        raise ShapeError(f"{kind}: {dx.size} elements exceed the device limit {MAX_ELEMS}")
    if kind == "softmax":
        p["batch"] = rows_total // p["rows"]
    return Op(kind, bufs, p, flops, nbytes)


def build_gather(ctx: Context, table: Any, idx: Any, out: Any) -> Op:
    dt = _dev(ctx, table, "gather table")
    di = _dev(ctx, idx, "gather indices", INDEX_DTYPES)
    do = _dev(ctx, out, "gather output")
    rows, cols = _rows(dt, "gather table")
    if do.dtype != dt.dtype:
        raise DtypeError(f"gather: out is {do.dtype}, the table {dt.dtype}")
    if do.size != di.size * cols:
        raise ShapeError(f"gather: out {do.shape} is not {di.size} rows of {cols}")
    nbytes = di.nbytes + 2 * do.nbytes
    if di.size * cols > MAX_ELEMS:
        raise ShapeError(f"gather: {di.size} rows of {cols} exceed the device limit")
    return Op("gather", {"table": dt, "idx": di, "out": do},
              {"rows": rows, "cols": cols, "n": di.size}, 0, nbytes)


# ------------------------------------------------------------ stream API ---
class InferenceOps:
    """The inference operations of :class:`~tacc.runtime.stream.Stream`."""

    def _op(self: Stream, name: str, build: Callable[[], Op]) -> None:
        t0 = tr.begin()
        tag = tr.next_tag()
        st, op = -1, None
        ctx = self.ctx
        try:
            self._check()
            op = build()
            op.tag = tag
            self._submit_op(op)
            st = 0
        finally:
            if t0:
                tr.end(t0, tr.NAME_ID[name], tag, op.nbytes if op else 0, ctx.dev_id,
                       ctx.hw_context, st, op.summary() if op else "error")

    def gemm(self: Stream, a: Any, b: Any, c: Any, *, alpha: float = 1.0, beta: float = 0.0,
             trans_a: bool = False, trans_b: bool = False, batch: int | None = None,
             bias: Any = None) -> None:
        """``c = alpha * op(a) @ op(b) + beta * c (+ bias)`` on the device.

        Operands are device buffers of float32 or bfloat16 (a and b the same), accumulated
        in fp32; ``c``'s dtype is the output dtype.  Matrices are the last two axes; the
        leading axes are the batch (a or b may hold one matrix, used for every batch).
        ``trans_a``/``trans_b`` read a or b transposed; ``bias`` is a row vector of n added to
        every row.
        """
        plain = (not trans_a and not trans_b and bias is None and batch in (None, 1)
                 and all(getattr(x, "dtype", None) == K.F32 and len(getattr(x, "shape", ())) == 2
                         for x in (a, b, c)))
        if plain:
            self._gemm_fp32(a, b, c, alpha=alpha, beta=beta)
            return
        self._op("gemm", lambda: build_gemm(self.ctx, a, b, c, alpha=alpha, beta=beta,
                                            trans_a=trans_a, trans_b=trans_b, batch=batch,
                                            bias=bias))

    def gemm_blocks(self: Stream, a: Any, b: Any, c: Any, *, alpha: float = 1.0,
                    beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
                    bias: Any = None) -> int:
        """:meth:`gemm` of one matrix of any size the device's leading dimension reaches
        (the rows of a, b and c: <= ``GEMM_MAX_LD``): past the GEMM limits (m, n, k <=
        ``GEMM_MAX_DIM``, m*n*k <= ``GEMM_MAX_MNK``) it runs as block GEMMs, each reading
        and writing its block in place through the leading dimensions: row blocks of op(a)
        and c (M), column blocks of op(b) and c (N), and K blocks accumulated into c (the
        first with ``beta`` and the bias, the rest with beta 1: a bf16 c rounds each partial
        sum).  a, b and c are 2-D (or leading axes of 1).  Returns the number of GEMMs."""
        da = _dev(self.ctx, a, "gemm operand a")
        db = _dev(self.ctx, b, "gemm operand b")
        dc = _dev(self.ctx, c, "gemm output c")

        def mat(x: Buffer, what: str) -> tuple[int, int]:
            nb, r, cols = _mat(x, what)
            if nb != 1:
                raise ShapeError(f"gemm_blocks: {what} {x.shape} is a batch (one matrix only)")
            return r, cols

        (ar, ac), (br, bc), (m, n) = mat(da, "a"), mat(db, "b"), mat(dc, "c")
        m2, k = (ac, ar) if trans_a else (ar, ac)
        k2, n2 = (bc, br) if trans_b else (br, bc)
        if k != k2 or m != m2 or n != n2:
            raise ShapeError(f"gemm: shapes {da.shape}{'T' if trans_a else ''} x {db.shape}"
                             f"{'T' if trans_b else ''} -> {dc.shape} do not fit")
        if max(m, n, k) <= GEMM_MAX_DIM and m * n * k <= GEMM_MAX_MNK:
            self.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                      bias=bias)
            return 1
        if max(ac, bc, n) > GEMM_MAX_LD:
            raise ShapeError(f"gemm: rows of {max(ac, bc, n)} elements exceed the device's "
                             f"leading dimension ({GEMM_MAX_LD}): not split")
        blk = [min(x, GEMM_MAX_DIM) for x in (m, n, k)]
        while blk[0] * blk[1] * blk[2] > GEMM_MAX_MNK:
            j = blk.index(max(blk))
            blk[j] = (blk[j] + 1) // 2
        bm, bn, bk = blk
        dbias = _vec(self.ctx, bias, n, "gemm bias") if bias is not None else None

        def span(x: Buffer, start: int, rows: int, cols: int, ld: int
                 ) -> tuple[Buffer, tuple[int, int, int]]:
            return (x.view(((rows - 1) * ld + cols,), offset=start * x.dtype.itemsize),
                    (rows, cols, ld))

        count = 0
        for i0 in range(0, m, bm):
            mi = min(bm, m - i0)
            for j0 in range(0, n, bn):
                nj = min(bn, n - j0)
                for p0 in range(0, k, bk):
                    kp = min(bk, k - p0)
                    va, la = span(da, p0 * ac + i0, kp, mi, ac) if trans_a else \
                        span(da, i0 * ac + p0, mi, kp, ac)
                    vb, lb = span(db, j0 * bc + p0, nj, kp, bc) if trans_b else \
                        span(db, p0 * bc + j0, kp, nj, bc)
                    vc, lc = span(dc, i0 * n + j0, mi, nj, n)
                    vbias = dbias.view((nj,), offset=j0 * dbias.dtype.itemsize) \
                        if dbias is not None and p0 == 0 else None
                    self._op("gemm", functools.partial(
                        build_gemm, self.ctx, va, vb, vc, alpha=alpha,
                        beta=beta if p0 == 0 else 1.0, trans_a=trans_a, trans_b=trans_b,
                        batch=None, bias=vbias, ld={"a": la, "b": lb, "c": lc}))
                    count += 1
        return count

    def softmax(self: Stream, x: Any, out: Any, *, scale: float = 1.0, causal: bool = False,
                pos_offset: Any = 0) -> None:
        """Softmax over the last axis of ``scale * x``; ``causal``: in each matrix (the last
        two axes) row i sees columns ``j <= i + pos_offset`` (a graph Param may give it)."""
        self._op("softmax", lambda: build_rows(self.ctx, "softmax", x, out, scale=scale,
                                               causal=causal, pos_offset=pos_offset))

    def layer_norm(self: Stream, x: Any, gamma: Any, beta: Any, out: Any, *,
                   eps: float = 1e-5, stats: Any = None) -> None:
        """Each row (last axis) normalised, times ``gamma`` plus ``beta`` (None: none).
        ``stats``: a float32 device buffer of 2 x rows, written with each row's mean,
        then each row's ``1 / sqrt(var + eps)``."""
        self._op("layer_norm", lambda: build_rows(self.ctx, "layer_norm", x, out,
                                                  gamma=gamma, beta=beta, eps=eps,
                                                  stats=stats))

    def rms_norm(self: Stream, x: Any, gamma: Any, out: Any, *, eps: float = 1e-5,
                 stats: Any = None) -> None:
        """``x / sqrt(mean(x^2) + eps) * gamma`` per row; ``stats``: a float32 device
        buffer of rows, written with each row's ``1 / sqrt(mean(x^2) + eps)``."""
        self._op("rms_norm", lambda: build_rows(self.ctx, "rms_norm", x, out, gamma=gamma,
                                                eps=eps, stats=stats))

    def gelu(self: Stream, x: Any, out: Any) -> None:
        """GELU, tanh form."""
        self._op("gelu", lambda: build_rows(self.ctx, "gelu", x, out))

    def silu(self: Stream, x: Any, out: Any) -> None:
        self._op("silu", lambda: build_rows(self.ctx, "silu", x, out))

    def exp(self: Stream, x: Any, out: Any) -> None:
        self._op("exp", lambda: build_rows(self.ctx, "exp", x, out))

    def add(self: Stream, a: Any, b: Any, out: Any) -> None:
        """``out = a + b``; b is a's shape or a row vector (broadcast over a's rows)."""
        self._binary("add", a, b, out)

    def mul(self: Stream, a: Any, b: Any, out: Any) -> None:
        """``out = a * b``; b is a's shape or a row vector (broadcast over a's rows)."""
        self._binary("mul", a, b, out)

    def _binary(self: Stream, kind: str, a: Any, b: Any, out: Any) -> None:
        if (all(getattr(x, "dtype", None) == K.F32 for x in (a, b, out))
                and getattr(a, "size", -1) == getattr(b, "size", -2)):
            self.eltwise(kind, a, out, b)
            return
        self._op("eltwise", lambda: build_rows(self.ctx, kind, a, out, y=b))

    def cast(self: Stream, x: Any, out: Any) -> None:
        """float32 <-> bfloat16 (round to nearest even), by the buffers' dtypes."""
        self._op("cast", lambda: build_rows(self.ctx, "cast", x, out))

    def gather(self: Stream, table: Any, idx: Any, out: Any) -> None:
        """``out[i] = table[idx[i]]``: rows of a (V, D) table by int32 indices; an index
        outside [0, V) fails the job on the device (nothing written)."""
        self._op("gather", lambda: build_gather(self.ctx, table, idx, out))
