"""hw 1.3 (docs/hardware.md section 14): the inference operations against numpy,
per dtype, the bad inputs that must end in error completions, command lists
(parameters, hostile lists) and the roofline timing model.

References are computed in float64 from the widened inputs and rounded to the
output dtype with ml_dtypes.  Tolerances: fp32 outputs within 1e-5 of the
largest reference magnitude (GEMM: k * 2^-22 * max|a| * max|b| absolute, fp32
accumulation in the BLAS's order); bf16 outputs within one bf16 ulp of the
reference (2^-7 relative) plus that fp32 tolerance.
"""

import struct

import ml_dtypes
import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_elt, desc
from tacc.testing.taccdev import DEVMEM_VA, Tacc

OK = hw.TACC_ST_OK
FP32, BF16, I32 = hw.TACC_DT_FP32, hw.TACC_DT_BF16, hw.TACC_DT_I32
NP = {FP32: np.float32, BF16: ml_dtypes.bfloat16}
RNG = np.random.default_rng(36)


# ------------------------------------------------------------ descriptors ----
def d_gemm3(a, b, c, m, n, k, lda, ldb, ldc, *, alpha=1.0, beta=0.0, dab=FP32, dc=FP32,
            flags=0, batch=0, bias=0, sa=0, sb=0, sc=0, rsvd=0, **kw):
    return desc(hw.TACC_OP_GEMM, payload=struct.pack(
        "<QQQIIIIIIffBBBBIQQQQQ", a, b, c, m, n, k, lda, ldb, ldc, alpha, beta, dab, dc,
        flags, rsvd, batch, bias, sa, sb, sc, 0), **kw)


def d_elt3(op, a, b, c, n, *, scalar=0.0, da=FP32, dc=FP32, flags=0, cols=0, **kw):
    return desc(hw.TACC_OP_ELTWISE, payload=struct.pack(
        "<QQQQIfBBBBI", a, b, c, n, op, scalar, da, dc, flags, 0, cols), **kw)


def d_softmax(x, y, rows, cols, ldx, ldy, *, scale=1.0, causal=False, pos=0, period=0,
              dx=FP32, dy=FP32, **kw):
    return desc(hw.TACC_OP_SOFTMAX, payload=struct.pack(
        "<QQIIIIfIIIBBH", x, y, rows, cols, ldx, ldy, scale,
        hw.TACC_SOFTMAX_F_CAUSAL if causal else 0, pos, period, dx, dy, 0), **kw)


def d_norm(x, y, gamma, beta, rows, cols, ldx, ldy, *, eps=1e-5, kind=0, dx=FP32, dy=FP32,
           dw=FP32, nflags=0, rsvd=0, stats=0, **kw):
    return desc(hw.TACC_OP_NORM, payload=struct.pack(
        "<QQQQIIIIfBBBBIIQ", x, y, gamma, beta, rows, cols, ldx, ldy, eps, kind, dx, dy, dw,
        nflags, rsvd, stats), **kw)


def d_gather(table, idx, out, rows, cols, ld_table, ld_out, table_rows, dt=FP32, **kw):
    return desc(hw.TACC_OP_GATHER, payload=struct.pack(
        "<QQQIIIIIB3x", table, idx, out, rows, cols, ld_table, ld_out, table_rows, dt), **kw)


def d_list(lst, count, list_id, *, patches=0, npatch=0, params=(), **kw):
    p = list(params) + [0] * (hw.TACC_LIST_PARAMS - len(params))
    return desc(hw.TACC_OP_LIST, payload=struct.pack(
        "<QQIIII16IQ", lst, patches, count, npatch, list_id, 0, *p, 0), **kw)


def patch(cmd, offset, param, op, mult=0):
    return struct.pack("<IHBBQ", cmd, offset, param, op, mult)


# ----------------------------------------------------------------- memory ----
def put(dev, data: bytes) -> int:
    a = dev.alloc(len(data))
    dev.qt.memwrite(a, data)
    return a


def load(dev, pf, arr: np.ndarray, off: int) -> int:
    """Host array -> device memory at offset off; returns its device VA."""
    raw = np.ascontiguousarray(arr).tobytes()
    src = put(dev, raw)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + off, len(raw))]).status == OK
    return DEVMEM_VA + off


def fetch(dev, pf, va: int, shape, dt) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(NP.get(dt, np.int32)).itemsize
    dst = dev.alloc(n)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, n)]).status == OK
    return np.frombuffer(dev.qt.memread(dst, n), NP[dt]).reshape(shape)


def rnd(shape, dt, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(NP[dt])


def check(got, ref, dt, atol=0.0):
    """got (device, dtype dt) against the float64 reference (tolerances above)."""
    got = got.astype(np.float64)
    tol = 1e-5 * max(np.max(np.abs(ref)), 1e-30) + atol
    if dt == BF16:
        tol = tol + 2.0 ** -7 * np.abs(ref)
    err = np.abs(got - ref)
    assert np.all(err <= tol), f"max error {np.max(err - tol)} over tolerance"


def delta(c0, c1, name):
    return c1[name] - c0[name]


def busy(c0, c1):
    return sum(delta(c0, c1, f"busy_compute{i}") for i in range(4))


# -------------------------------------------------------------- contract ----
def test_version_caps_and_roofline_registers(dev, pf):
    assert pf.r32(hw.TACC_REG_VERSION) >= (1 << 16) | 3  # the operations of hw 1.3, or later
    caps = pf.r32(hw.TACC_REG_CAPS)
    for bit in ("GEMM_EX", "BF16", "NN_OPS", "CMD_LIST", "TRACE_V3", "ROOFLINE",
                "NORM_STATS"):
        assert caps & getattr(hw, f"TACC_CAP_{bit}"), bit
    assert pf.r32(hw.TACC_REG_PEAK_FP32_GFLOPS) == dev.qom_get("compute-gflops") == 7575
    assert pf.r32(hw.TACC_REG_PEAK_BF16_GFLOPS) == dev.qom_get("bf16-gflops") == 30250
    assert pf.r32(hw.TACC_REG_DEVMEM_GBPS) == dev.qom_get("devmem-gbps") == 300


# ------------------------------------------------------------------ GEMM ----
@pytest.mark.parametrize("dab,dc,ta,tb,batch,bias,beta", [
    (FP32, FP32, False, False, 1, False, 0.0),
    (FP32, FP32, True, True, 1, True, 0.5),
    (BF16, FP32, False, True, 3, False, 0.0),
    (BF16, BF16, True, False, 2, True, 0.0),
    (BF16, BF16, False, False, 4, False, 1.0),
    (FP32, BF16, False, True, 1, True, -1.0),
])
def test_gemm_ex(dev, pf, dab, dc, ta, tb, batch, bias, beta):
    gemm_ex(dev, pf, dab, dc, ta, tb, batch, bias, beta, 19, 23, 37)


# at least 2^21 multiply-adds: computed on QEMU's thread pool (docs/hardware.md section 9)
@pytest.mark.parametrize("dab,dc,ta,tb,batch,bias,beta", [
    (FP32, FP32, False, False, 1, False, 0.0),
    (BF16, BF16, False, False, 1, False, 1.0),
    (FP32, FP32, True, True, 2, True, 0.5),
    (BF16, FP32, False, True, 3, False, 0.0),
])
def test_gemm_ex_thread_pool(dev, pf, dab, dc, ta, tb, batch, bias, beta):
    gemm_ex(dev, pf, dab, dc, ta, tb, batch, bias, beta, 128, 120, 144)


def gemm_ex(dev, pf, dab, dc, ta, tb, batch, bias, beta, m, n, k):
    pad = 3
    alpha = 1.25
    sa_rows, sa_cols = (k, m) if ta else (m, k)
    sb_rows, sb_cols = (n, k) if tb else (k, n)
    lda, ldb, ldc = sa_cols + pad, sb_cols + pad, n + pad
    A = rnd((batch, sa_rows, lda), dab)
    B = rnd((batch, sb_rows, ldb), dab)
    C = rnd((batch, m, ldc), dc)
    bv = rnd((n,), dc)
    va, vb = load(dev, pf, A, 0), load(dev, pf, B, 4 << 20)
    vc, vbias = load(dev, pf, C, 8 << 20), load(dev, pf, bv, 12 << 20)
    flags = ((hw.TACC_GEMM_F_TRANS_A if ta else 0) | (hw.TACC_GEMM_F_TRANS_B if tb else 0) |
             (hw.TACC_GEMM_F_BIAS if bias else 0))
    c0 = pf.counters()
    cq = pf.run_job(1, [d_gemm3(va, vb, vc, m, n, k, lda, ldb, ldc, alpha=alpha, beta=beta,
                                dab=dab, dc=dc, flags=flags, batch=batch,
                                bias=vbias if bias else 0, sa=sa_rows * lda,
                                sb=sb_rows * ldb, sc=m * ldc)])
    assert cq.status == OK
    c1 = pf.counters()
    got = fetch(dev, pf, vc, C.shape, dc)
    Af, Bf, Cf = (x.astype(np.float64) for x in (A, B, C))
    for i in range(batch):
        a = Af[i, :, :sa_cols]
        b = Bf[i, :, :sb_cols]
        ref = alpha * ((a.T if ta else a) @ (b.T if tb else b)) + beta * Cf[i, :, :n]
        if bias:
            ref = ref + bv.astype(np.float64)
        amax = np.max(np.abs(Af)) * np.max(np.abs(Bf)) * abs(alpha)
        check(got[i, :, :n], ref, dc, atol=k * 2.0 ** -22 * amax)
        assert np.array_equal(got[i, :, n:].view(np.uint8), C[i, :, n:].view(np.uint8))
    # FLOPs and bytes as documented (elements only, no padding)
    eab, ec = (2 if dab == BF16 else 4), (2 if dc == BF16 else 4)
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)
    rd = batch * (m * k + k * n) * eab + (batch * m * n * ec if beta else 0) + \
        (n * ec if bias else 0)
    assert delta(c0, c1, "flops") == flops
    assert delta(c0, c1, "flops_bf16") == (flops if dab == BF16 else 0)
    assert delta(c0, c1, "devmem_read_bytes") == rd
    assert delta(c0, c1, "devmem_write_bytes") == batch * m * n * ec
    peak = 30250 if dab == BF16 else 7575
    ideal = max(flops * 1000 // peak, (rd + batch * m * n * ec) * 1000 // 300)
    walks = delta(c0, c1, "tlb_walk_reads")
    assert busy(c0, c1) == (100_000 + 500_000 * walks + ideal) // 1000
    assert delta(c0, c1, "compute_ideal_ticks") == ideal // 1000


def test_gemm_hw12_descriptor_keeps_its_meaning(dev, pf):
    """A hw 1.2 GEMM (those bytes zero) is the fp32, untransposed, single GEMM."""
    m, n, k = 8, 5, 7
    A, B = rnd((m, k), FP32), rnd((k, n), FP32)
    va, vb = load(dev, pf, A, 0), load(dev, pf, B, 1 << 20)
    vc = DEVMEM_VA + (2 << 20)
    assert pf.run_job(0, [d_gemm3(va, vb, vc, m, n, k, k, n, n)]).status == OK
    check(fetch(dev, pf, vc, (m, n), FP32), A.astype(np.float64) @ B, FP32,
          atol=k * 2.0 ** -22 * np.max(np.abs(A)) * np.max(np.abs(B)))


# --------------------------------------------------------------- eltwise ----
def _elt_ref(op, a, b):
    x = a.astype(np.float64)
    return {
        "ADD": lambda: x + b, "MUL": lambda: x * b, "RELU": lambda: np.maximum(x, 0),
        "SCALE": lambda: x * -0.75,
        "GELU": lambda: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
        "SILU": lambda: x / (1 + np.exp(-x)), "EXP": lambda: np.exp(x), "CAST": lambda: x,
    }[op]()


@pytest.mark.parametrize("op", ["ADD", "MUL", "RELU", "SCALE", "GELU", "SILU", "EXP", "CAST"])
@pytest.mark.parametrize("da,dc", [(FP32, FP32), (BF16, BF16), (FP32, BF16), (BF16, FP32)])
def test_eltwise_ops(dev, pf, op, da, dc):
    rows, cols = 37, 64
    n = rows * cols
    bcast = op in ("ADD", "MUL") and da == BF16
    a = rnd((n,), da, 2.0)
    b = rnd((cols if bcast else n,), da)
    va, vb = load(dev, pf, a, 0), load(dev, pf, b, 1 << 20)
    vc = DEVMEM_VA + (2 << 20)
    code = getattr(hw, f"TACC_ELT_{op}")
    two = op in ("ADD", "MUL")
    c0 = pf.counters()
    cq = pf.run_job(2, [d_elt3(code, va, vb if two else 0, vc, n, scalar=-0.75 if op == "SCALE"
                               else 0.0, da=da, dc=dc,
                               flags=hw.TACC_ELT_F_ROW_BCAST if bcast else 0,
                               cols=cols if bcast else 0)])
    assert cq.status == OK
    c1 = pf.counters()
    bf = np.tile(b, rows).astype(np.float64) if bcast else b.astype(np.float64)
    ref = _elt_ref(op, a, bf)
    check(fetch(dev, pf, vc, (n,), dc), ref, dc)
    sa, sc = (2 if da == BF16 else 4), (2 if dc == BF16 else 4)
    per = {"GELU": 8, "SILU": 4, "CAST": 0}.get(op, 1)
    assert delta(c0, c1, "flops") == n * per
    assert delta(c0, c1, "devmem_read_bytes") == n * sa + (len(b) * sa if two else 0)
    assert delta(c0, c1, "devmem_write_bytes") == n * sc


def test_cast_rounds_to_nearest_even_like_ml_dtypes(dev, pf):
    # halfway cases, NaN, inf, subnormals, large values
    bits = np.array([0x3F808000, 0x3F818000, 0x7FC00001, 0xFF800000, 0x00010001,
                     0x7F7FFFFF, 0x3F80FFFF, 0xBF808001], np.uint32)
    a = bits.view(np.float32)
    va = load(dev, pf, a, 0)
    vc = DEVMEM_VA + (1 << 20)
    assert pf.run_job(0, [d_elt3(hw.TACC_ELT_CAST, va, 0, vc, len(a), dc=BF16)]).status == OK
    got = fetch(dev, pf, vc, (len(a),), BF16).view(np.uint16)
    want = a.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(a)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all((got[nan] & 0x7F80) == 0x7F80) and np.all(got[nan] & 0x7F)


# --------------------------------------------------------------- softmax ----
@pytest.mark.parametrize("dx,dy,causal,pos,period", [
    (FP32, FP32, False, 0, 0), (FP32, FP32, True, 0, 0), (BF16, BF16, True, 5, 4),
    (BF16, FP32, True, 0, 3), (FP32, BF16, False, 0, 0)])
def test_softmax(dev, pf, dx, dy, causal, pos, period):
    rows, cols, pad, scale = 12, 40, 2, 0.125
    x = rnd((rows, cols + pad), dx, 4.0)
    vx = load(dev, pf, x, 0)
    vy = DEVMEM_VA + (1 << 20)
    c0 = pf.counters()
    assert pf.run_job(3, [d_softmax(vx, vy, rows, cols, cols + pad, cols, scale=scale,
                                    causal=causal, pos=pos, period=period,
                                    dx=dx, dy=dy)]).status == OK
    c1 = pf.counters()
    z = x[:, :cols].astype(np.float64) * scale
    ref = np.zeros_like(z)
    for r in range(rows):
        valid = min((r % (period or rows)) + pos + 1, cols) if causal else cols
        e = np.exp(z[r, :valid] - z[r, :valid].max())
        ref[r, :valid] = e / e.sum()
    got = fetch(dev, pf, vy, (rows, cols), dy)
    check(got, ref, dy)
    if causal:
        assert np.all(got.astype(np.float64)[ref == 0] == 0)
    assert delta(c0, c1, "flops") == 5 * rows * cols


# ------------------------------------------------------------------ norm ----
@pytest.mark.parametrize("kind", ["LAYER", "RMS"])
@pytest.mark.parametrize("dx,dy,dw", [(FP32, FP32, FP32), (BF16, BF16, BF16),
                                      (BF16, FP32, FP32)])
def test_norm(dev, pf, kind, dx, dy, dw):
    rows, cols, eps = 9, 96, 1e-5
    x = (rnd((rows, cols), dx).astype(np.float64) * 3 + 1).astype(NP[dx])
    g, b = rnd((cols,), dw), rnd((cols,), dw)
    layer = kind == "LAYER"
    vx, vg, vb = load(dev, pf, x, 0), load(dev, pf, g, 1 << 20), load(dev, pf, b, 2 << 20)
    vy = DEVMEM_VA + (3 << 20)
    assert pf.run_job(1, [d_norm(vx, vy, vg, vb if layer else 0, rows, cols, cols, cols,
                                 eps=eps, kind=getattr(hw, f"TACC_NORM_{kind}"),
                                 dx=dx, dy=dy, dw=dw)]).status == OK
    xf = x.astype(np.float64)
    if layer:
        ref = (xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + eps)
        ref = ref * g.astype(np.float64) + b.astype(np.float64)
    else:
        ref = xf / np.sqrt((xf ** 2).mean(1, keepdims=True) + eps) * g.astype(np.float64)
    check(fetch(dev, pf, vy, (rows, cols), dy), ref, dy)


@pytest.mark.parametrize("kind", ["LAYER", "RMS"])
@pytest.mark.parametrize("dx", [FP32, BF16])
def test_norm_stats(dev, pf, kind, dx):
    """TACC_NORM_F_STATS: each row's mean and 1/sqrt(var + eps) (RMS: 1/rms), fp32, within
    fp32 rounding of the float64 reference; Y as without them; the bytes counted."""
    rows, cols, eps = 300, 96, 1e-5
    layer = kind == "LAYER"
    k = getattr(hw, f"TACC_NORM_{kind}")
    x = (rnd((rows, cols), dx).astype(np.float64) * 3 + 1).astype(NP[dx])
    g, b = rnd((cols,), FP32), rnd((cols,), FP32)
    vx, vg, vb = load(dev, pf, x, 0), load(dev, pf, g, 1 << 20), load(dev, pf, b, 2 << 20)
    vy, vy0, vs = DEVMEM_VA + (3 << 20), DEVMEM_VA + (4 << 20), DEVMEM_VA + (5 << 20) + 4
    ns = (2 if layer else 1) * rows
    bb = vb if layer else 0
    assert pf.run_job(0, [d_norm(vx, vy0, vg, bb, rows, cols, cols, cols, eps=eps,
                                 kind=k, dx=dx)]).status == OK
    c0 = pf.counters()
    assert pf.run_job(0, [d_norm(vx, vy, vg, bb, rows, cols, cols, cols, eps=eps, kind=k,
                                 dx=dx, nflags=hw.TACC_NORM_F_STATS, stats=vs)]).status == OK
    c1 = pf.counters()
    xf = x.astype(np.float64)
    mean = xf.mean(1) if layer else np.zeros(rows)
    inv = 1 / np.sqrt(((xf - mean[:, None]) ** 2).mean(1) + eps)
    got = fetch(dev, pf, vs, (ns,), FP32).astype(np.float64)
    if layer:
        # the mean within fp32 rounding of the row's scale; 1/std within 1e-5 relative
        assert np.max(np.abs(got[:rows] - mean)) <= 1e-6 * np.max(np.abs(xf))
    assert np.max(np.abs(got[-rows:] - inv) / inv) <= 1e-5
    assert np.array_equal(fetch(dev, pf, vy, (rows, cols), FP32),
                          fetch(dev, pf, vy0, (rows, cols), FP32))   # Y unchanged
    es = 2 if dx == BF16 else 4
    wbytes = (1 + (1 if layer else 0)) * cols * 4
    assert delta(c0, c1, "devmem_read_bytes") == rows * cols * es + wbytes
    assert delta(c0, c1, "devmem_write_bytes") == rows * cols * 4 + ns * 4


# ---------------------------------------------------------------- gather ----
@pytest.mark.parametrize("dt", [FP32, BF16])
def test_gather(dev, pf, dt):
    trows, cols, rows = 50, 24, 7
    table = rnd((trows, cols + 8), dt)
    idx = np.array([3, 0, 49, 3, 17, 48, 1], np.int32)
    vt, vi = load(dev, pf, table, 0), load(dev, pf, idx, 1 << 20)
    vo = DEVMEM_VA + (2 << 20)
    c0 = pf.counters()
    assert pf.run_job(0, [d_gather(vt, vi, vo, rows, cols, cols + 8, cols, trows, dt)]).status == OK
    c1 = pf.counters()
    got = fetch(dev, pf, vo, (rows, cols), dt)
    assert np.array_equal(got.view(np.uint8), table[idx, :cols].view(np.uint8))
    es = 2 if dt == BF16 else 4
    assert delta(c0, c1, "devmem_read_bytes") == 4 * rows + rows * cols * es
    # an index outside the table: BAD_INDEX and nothing written
    bad = load(dev, pf, np.array([1, 50], np.int32), 3 << 20)
    before = fetch(dev, pf, vo, (rows, cols), dt).copy()
    cq = pf.run_job(0, [d_gather(vt, bad, vo, 2, cols, cols + 8, cols, trows, dt)])
    assert cq.status == hw.TACC_ST_BAD_INDEX
    assert np.array_equal(fetch(dev, pf, vo, (rows, cols), dt).view(np.uint8),
                          before.view(np.uint8))


# ------------------------------------------------------------ bad inputs ----
V = DEVMEM_VA
END = DEVMEM_VA + (256 << 20)  # the end of mapped device memory
BAD = {
    # an operand shape past the end of device memory: the MMU faults
    "gemm_a_past_devmem": (lambda: d_gemm3(END - 4096, V, V, 64, 8, 64, 64, 8, 8),
                           hw.TACC_ST_MMU_FAULT),
    "gemm_batch_stride_out_of_window": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, batch=2,
                                                         sa=1 << 40, sc=16),
                                         hw.TACC_ST_BAD_LENGTH),
    "gemm_batch_writes_one_c": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, batch=2),
                                hw.TACC_ST_BAD_LENGTH),
    "gemm_unknown_dtype": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, dab=7),
                           hw.TACC_ST_BAD_OPCODE),
    "gemm_i32_operands": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, dc=I32),
                          hw.TACC_ST_BAD_OPCODE),
    "gemm_unknown_flag": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, flags=0x80),
                          hw.TACC_ST_BAD_OPCODE),
    "gemm_reserved_byte": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, rsvd=1),
                           hw.TACC_ST_BAD_OPCODE),
    "gemm_bias_without_flag": (lambda: d_gemm3(V, V, V, 4, 4, 4, 4, 4, 4, bias=V),
                               hw.TACC_ST_BAD_OPCODE),
    "gemm_trans_lda_too_small": (lambda: d_gemm3(V, V, V, 8, 4, 4, 4, 4, 4,
                                                 flags=hw.TACC_GEMM_F_TRANS_A),
                                 hw.TACC_ST_BAD_LENGTH),
    "gemm_too_many_macs": (lambda: d_gemm3(V, V, V + (64 << 20), 1024, 1024, 1024, 1024, 1024,
                                           1024, batch=2, sa=0, sc=1 << 20),
                           hw.TACC_ST_BAD_LENGTH),
    "gemm_bf16_misaligned": (lambda: d_gemm3(V + 1, V, V, 4, 4, 4, 4, 4, 4, dab=BF16),
                             hw.TACC_ST_BAD_ALIGN),
    "elt_unknown_op": (lambda: d_elt3(9, V, 0, V, 16), hw.TACC_ST_BAD_OPCODE),
    "elt_unknown_dtype": (lambda: d_elt3(hw.TACC_ELT_GELU, V, 0, V, 16, da=3),
                          hw.TACC_ST_BAD_OPCODE),
    "elt_bcast_not_dividing": (lambda: d_elt3(hw.TACC_ELT_ADD, V, V, V, 10, cols=3,
                                              flags=hw.TACC_ELT_F_ROW_BCAST),
                               hw.TACC_ST_BAD_LENGTH),
    "elt_bcast_on_unary": (lambda: d_elt3(hw.TACC_ELT_EXP, V, 0, V, 9, cols=3,
                                          flags=hw.TACC_ELT_F_ROW_BCAST),
                           hw.TACC_ST_BAD_OPCODE),
    "elt_past_devmem": (lambda: d_elt3(hw.TACC_ELT_EXP, END - 64, 0, V, 1024),
                        hw.TACC_ST_MMU_FAULT),
    "softmax_zero_cols": (lambda: d_softmax(V, V, 4, 0, 4, 4), hw.TACC_ST_BAD_LENGTH),
    "softmax_ld_below_cols": (lambda: d_softmax(V, V, 4, 8, 4, 8), hw.TACC_ST_BAD_LENGTH),
    "softmax_pos_without_causal": (lambda: d_softmax(V, V, 4, 8, 8, 8, pos=3),
                                   hw.TACC_ST_BAD_OPCODE),
    "softmax_rows_past_devmem": (lambda: d_softmax(END - 4096, V, 64, 64, 64, 64),
                                 hw.TACC_ST_MMU_FAULT),
    "norm_negative_eps": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, eps=-1.0),
                          hw.TACC_ST_BAD_OPCODE),
    "norm_rms_with_beta": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, kind=hw.TACC_NORM_RMS),
                           hw.TACC_ST_BAD_OPCODE),
    "norm_unknown_kind": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, kind=5),
                          hw.TACC_ST_BAD_OPCODE),
    "norm_unknown_flag": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, nflags=2, stats=V),
                          hw.TACC_ST_BAD_OPCODE),
    "norm_reserved_word": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, rsvd=1),
                           hw.TACC_ST_BAD_OPCODE),
    "norm_stats_without_flag": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, stats=V),
                                hw.TACC_ST_BAD_OPCODE),
    "norm_stats_misaligned": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, stats=V + 2,
                                             nflags=hw.TACC_NORM_F_STATS),
                              hw.TACC_ST_BAD_ALIGN),
    "norm_stats_past_devmem": (lambda: d_norm(V, V, V, V, 4, 8, 8, 8, stats=END - 16,
                                              nflags=hw.TACC_NORM_F_STATS),
                               hw.TACC_ST_MMU_FAULT),
    "norm_stats_unmapped": (lambda: d_norm(V, V, V, V, 2, 8, 8, 8, stats=1 << 40,
                                           nflags=hw.TACC_NORM_F_STATS),
                            hw.TACC_ST_MMU_FAULT),
    "norm_stats_bigger_than_window": (lambda: d_norm(V, V, V, V, 1 << 26, 1, 1, 1, stats=V,
                                                     nflags=hw.TACC_NORM_F_STATS),
                                      hw.TACC_ST_BAD_LENGTH),
    "gather_table_bigger_than_window": (lambda: d_gather(V, V, V, 2, 8, 8, 8, 1 << 26),
                                        hw.TACC_ST_BAD_LENGTH),
    "gather_i32_rows": (lambda: d_gather(V, V, V, 2, 8, 8, 8, 4, dt=I32),
                        hw.TACC_ST_BAD_OPCODE),
    "opcode_past_list": (lambda: desc(hw.TACC_OP_MAX), hw.TACC_ST_BAD_OPCODE),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_error_completion(dev, pf, name):
    make, status = BAD[name]
    load(dev, pf, np.zeros(4096, np.float32), 0)  # operands readable
    cq = pf.run_job(0, [make(), desc(hw.TACC_OP_NOP)])
    assert cq.status == status
    # the device goes on: the next job completes
    assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == OK


# ---------------------------------------------------------- command lists ----
def _list_mem(dev, cmds: list[bytes], patches: list[bytes] = ()):
    lst = put(dev, b"".join(cmds))
    pt = put(dev, b"".join(patches)) if patches else 0
    return lst, pt


def test_list_runs_each_command_with_its_record_and_params(dev, pf):
    """A 3-command list launched twice: the parameter block moves the KV-style
    write position (ADD64) and the element count (SET32) without a rebuild."""
    n = 256
    a = rnd((n,), FP32)
    va = load(dev, pf, a, 0)
    out = DEVMEM_VA + (1 << 20)
    load(dev, pf, np.zeros(8 * n, np.float32), 1 << 20)
    cmds = [d_elt3(hw.TACC_ELT_EXP, va, 0, out, 0, tag=101),  # n: param 1, dst += p0 * 4n
            d_elt3(hw.TACC_ELT_SCALE, va, 0, out + 4 * n, n, scalar=2.0, tag=102),
            d_elt(hw.TACC_ELT_RELU, va, 0, out + 8 * n, n, tag=103)]
    n_off, c_off = 24, 16  # eltwise.n (low u32), eltwise.c
    lst, pt = _list_mem(dev, cmds, [patch(0, c_off, 0, hw.TACC_PATCH_ADD64, 12 * n),
                                    patch(0, n_off, 1, hw.TACC_PATCH_SET32)])
    pf.trace_enable(size=64)
    pf.w32(hw.TACC_REG_TRACE_CTRL, 0)
    pf.w32(hw.TACC_REG_TRACE_CTRL, hw.TACC_TRACE_CTRL_ENABLE | hw.TACC_TRACE_CTRL_V3)
    c0 = pf.counters()
    for launch in range(2):
        cq = pf.run_job(1, [d_list(lst, 3, 77, patches=pt, npatch=2, params=[launch, n],
                                   tag=0x5)])
        assert cq.status == OK
    c1 = pf.counters()
    got = fetch(dev, pf, out, (4 * n,), FP32)
    check(got[:n], np.exp(a.astype(np.float64)), FP32)        # launch 0 at offset 0
    check(got[3 * n:4 * n], np.exp(a.astype(np.float64)), FP32)  # launch 1 at 12 n bytes
    check(got[n:2 * n], a * 2.0, FP32)
    check(got[2 * n:3 * n], np.maximum(a, 0), FP32)
    assert delta(c0, c1, "list_launches") == 2 and delta(c0, c1, "list_cmds") == 6
    assert delta(c0, c1, "cmds_completed") == 8 and delta(c0, c1, "jobs_completed") == 2
    # 4 version-3 records per launch: the 3 listed commands, then the LIST
    raw = [dev.qt.memread(pf.trace_addr() + i * 128, 128) for i in range(8)]
    recs = [struct.unpack_from("<BBBBHHIIQQQQIIHHHH", r) for r in raw]
    ext = [struct.unpack_from("<QQQIHBB", r, 64) for r in raw]
    assert [r[1] for r in recs] == [hw.TACC_OP_ELTWISE] * 3 + [hw.TACC_OP_LIST] + \
        [hw.TACC_OP_ELTWISE] * 3 + [hw.TACC_OP_LIST]
    assert all(r[0] == hw.TACC_TRACE_VERSION_3 for r in recs)
    assert [r[8] for r in recs[:3]] == [101, 102, 103]  # their own tags
    assert [r[14] for r in recs[:3]] == [0, 1, 2]  # index: the position in the list
    assert all(e[3] == 77 for e in ext)  # list id
    assert ext[0][0] == n and ext[0][1] == 4 * n and ext[0][2] == 4 * n  # flops, bytes
    assert recs[3][10] == recs[0][10] and recs[3][11] >= recs[2][11]  # LIST spans them


@pytest.mark.parametrize("case", ["fill", "barrier", "nested_self", "flags", "patch_param",
                                  "patch_order", "unmapped", "count0", "id0"])
def test_hostile_list_ends_with_error(dev, pf, case):
    """What the driver cannot check, the device refuses per listed command:
    the commands before the culprit ran, none after it."""
    va = load(dev, pf, np.ones(64, np.float32), 0)
    out = DEVMEM_VA + (1 << 20)
    load(dev, pf, np.zeros(128, np.float32), 1 << 20)
    good0 = d_elt3(hw.TACC_ELT_EXP, va, 0, out, 64, tag=1)
    good2 = d_elt3(hw.TACC_ELT_EXP, va, 0, out + 256, 64, tag=3)
    lst_va = dev.alloc(3 * 128)
    culprit = {
        "fill": desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", 0, 4096, 0x5A5A), tag=2),
        "barrier": desc(hw.TACC_OP_BARRIER, tag=2),
        "nested_self": d_list(lst_va, 3, 9, tag=2),  # a list pointing at itself
        "flags": d_elt3(hw.TACC_ELT_EXP, va, 0, out, 64, flags=0, tag=2)[:1] + b"\x02" +
        d_elt3(hw.TACC_ELT_EXP, va, 0, out, 64, tag=2)[2:],
    }.get(case, d_elt3(hw.TACC_ELT_EXP, va, 0, out, 64, tag=2))
    dev.qt.memwrite(lst_va, good0 + culprit + good2)
    patches, npatch = 0, 0
    if case == "patch_param":
        patches, npatch = put(dev, patch(1, 24, 16, hw.TACC_PATCH_SET32)), 1
    if case == "patch_order":
        patches, npatch = put(dev, patch(1, 24, 0, hw.TACC_PATCH_SET32) +
                              patch(0, 24, 0, hw.TACC_PATCH_SET32)), 2
    lst = 0x3F_0000_0000 if case == "unmapped" else lst_va
    count = 0 if case == "count0" else 3
    lid = 0 if case == "id0" else 9
    fill_probe = fetch(dev, pf, DEVMEM_VA, (64,), FP32).copy()
    c0 = pf.counters()
    cq = pf.run_job(2, [d_list(lst, count, lid, patches=patches, npatch=npatch, params=[1],
                               tag=0x99)])
    c1 = pf.counters()
    want = {"fill": hw.TACC_ST_NOT_PERMITTED, "barrier": hw.TACC_ST_NOT_PERMITTED,
            "unmapped": hw.TACC_ST_MMU_FAULT, "count0": hw.TACC_ST_BAD_LENGTH}
    assert cq.status == want.get(case, hw.TACC_ST_BAD_LIST)
    got = fetch(dev, pf, out, (128,), FP32)
    ran_first = case not in ("unmapped", "count0", "id0")
    assert np.allclose(got[:64], np.e) == ran_first
    assert np.all(got[64:] == 0)  # nothing after the culprit
    if case == "fill":
        assert np.array_equal(fetch(dev, pf, DEVMEM_VA, (64,), FP32), fill_probe)
    assert cq.tag == 0x99  # the LIST's tag: its culprit is named by its own record
    assert delta(c0, c1, "list_launches") == 1
    assert delta(c0, c1, "list_errors") == (1 if case in ("fill", "barrier", "nested_self",
                                                          "flags", "patch_param", "patch_order",
                                                          "id0") else 0)
    assert pf.run_job(2, [desc(hw.TACC_OP_NOP)]).status == OK


def test_queue_reset_during_a_list(dev, pf):
    va = load(dev, pf, np.ones(1 << 20, np.float32), 0)
    cmds = [d_elt3(hw.TACC_ELT_EXP, va, 0, va, 1 << 20) for _ in range(50)]
    lst, _ = _list_mem(dev, cmds)
    job, ds = pf.job_of(0, [d_list(lst, 50, 1)])
    pf.submit(0, ds)
    dev.qt.clock_step(20_000)
    pf.setup_queue(0)  # disable (aborts), re-enable
    assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == OK


# -------------------------------------------------------------- roofline ----
def d_fill(off, n, value):
    return desc(hw.TACC_OP_FILL, payload=struct.pack("<QQQ", off, n, value))


def _gemm_time(dev, pf, m, n, k, dab):
    # operands by FILL (device side: a 32 MiB qtest memwrite takes minutes)
    one = 0x3F803F803F803F80 if dab == BF16 else 0x3F8000003F800000
    es = 2 if dab == BF16 else 4
    assert pf.run_job(0, [d_fill(0, m * k * es, 0), d_fill(16 << 20, k * n * es, one)]).status == OK
    va, vb = DEVMEM_VA, DEVMEM_VA + (16 << 20)
    vc = DEVMEM_VA + (128 << 20)
    c0 = pf.counters()
    cq = pf.run_job(3, [d_gemm3(va, vb, vc, m, n, k, k, n, n, dab=dab, dc=FP32)])
    assert cq.status == OK
    c1 = pf.counters()
    walks = delta(c0, c1, "tlb_walk_reads")
    t_ns = busy(c0, c1) - 100 - 500 * walks  # minus the fixed cost and the walks
    nbytes = delta(c0, c1, "devmem_read_bytes") + delta(c0, c1, "devmem_write_bytes")
    return t_ns, delta(c0, c1, "flops"), nbytes


def test_roofline_bf16_gemv_is_memory_bound(dev, pf):
    t_ns, flops, nbytes = _gemm_time(dev, pf, 1, 4096, 4096, BF16)
    assert nbytes == (4096 + 4096 * 4096) * 2 + 4096 * 4
    assert abs(t_ns - nbytes / 300) <= 0.01 * nbytes / 300
    assert flops / 30250 < 0.02 * nbytes / 300  # far below the ridge


def test_roofline_large_bf16_gemm_is_compute_bound(dev, pf):
    t_ns, flops, nbytes = _gemm_time(dev, pf, 1024, 1024, 1024, BF16)
    assert flops == 2 * 1024 ** 3
    assert abs(t_ns - flops / 30250) <= 0.01 * flops / 30250
    assert nbytes / 300 < flops / 30250


# ------------------------------------------------------ sliced host work ----
def _row_ops_figures(props: str) -> list[tuple]:
    """Row operations of 0.5 .. 2 MiB (bf16 and fp32, causal softmax with a period,
    padded rows, rows of 256 KiB across 2 MiB boundaries, broadcast, gather, NORM's
    statistics) on a
    fresh device with ``props``: per command its status, modelled duration, the
    function's counter deltas and its output bytes."""
    rng = np.random.default_rng(2836)
    d = Tacc("devmem-size=64M" + ("," + props if props else ""))
    try:
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, d.map_default(devmem=64 << 20))

        def arr(shape, dt):
            return (rng.standard_normal(shape) * 2).astype(NP[dt])

        M = 1 << 20
        cases = []
        x = load(d, pf, arr((300, 1003), BF16), 0)
        cases.append((d_softmax(x, DEVMEM_VA + 32 * M, 300, 1000, 1003, 1001, scale=0.5,
                                causal=True, pos=5, period=7, dx=BF16, dy=BF16),
                      32 * M, 300 * 1001 * 2))
        x = load(d, pf, arr((8, 65536), FP32), 2 * M - 100 * 1024)
        cases.append((d_softmax(x, DEVMEM_VA + 36 * M - 4096, 8, 65536, 65536, 65536),
                      36 * M - 4096, 8 * 65536 * 4))
        x = load(d, pf, arr((200, 2048), BF16), 5 * M)
        g = load(d, pf, arr((2048,), BF16), 6 * M)
        b = load(d, pf, arr((2048,), BF16), 6 * M + 8192)
        cases.append((d_norm(x, DEVMEM_VA + 40 * M, g, b, 200, 2048, 2048, 2048,
                             kind=hw.TACC_NORM_LAYER, dx=BF16, dy=BF16, dw=BF16),
                      40 * M, 200 * 2048 * 2))
        a = load(d, pf, arr((1 << 20,), BF16), 8 * M - 300 * 1024)
        bb = load(d, pf, arr((1024,), BF16), 11 * M)
        cases.append((d_elt3(hw.TACC_ELT_ADD, a, bb, DEVMEM_VA + 44 * M, 1 << 20,
                             da=BF16, dc=BF16, flags=hw.TACC_ELT_F_ROW_BCAST, cols=1024),
                      44 * M, 2 * M))
        cases.append((d_elt3(hw.TACC_ELT_GELU, x, 0, DEVMEM_VA + 48 * M, 200 * 2048,
                             da=BF16, dc=FP32), 48 * M, 200 * 2048 * 4))
        t = load(d, pf, arr((4096, 310), BF16), 12 * M)
        i = load(d, pf, rng.integers(0, 4096, 3000).astype(np.int32), 16 * M)
        cases.append((d_gather(t, i, DEVMEM_VA + 52 * M, 3000, 300, 310, 300, 4096, BF16),
                      52 * M, 3000 * 300 * 2))
        # NORM's statistics (hw 1.5): 320 KiB across a 2 MiB boundary, written in slices
        x = load(d, pf, arr((40000, 16), FP32), 20 * M)
        g = load(d, pf, arr((16,), FP32), 23 * M)
        b = load(d, pf, arr((16,), FP32), 23 * M + 4096)
        cases.append((d_norm(x, DEVMEM_VA + 24 * M, g, b, 40000, 16, 16, 16,
                             nflags=hw.TACC_NORM_F_STATS,
                             stats=DEVMEM_VA + 28 * M - 100 * 1024),
                      28 * M - 100 * 1024, 2 * 40000 * 4))
        out = []
        for cmd, off, n in cases:
            c0 = pf.counters()
            cq = pf.run_job(2, [cmd])
            c1 = pf.counters()
            dst = d.alloc(n)
            assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + off, dst, n)]
                              ).status == OK
            out.append((cq.status, cq.end - cq.start,
                        {k: c1[k] - c0[k] for k in c1}, d.qt.memread(dst, n)))
        return out
    finally:
        d.close()


def test_row_operations_sliced_as_whole():
    """The row operations run their host work in x-host-slice slices (64 KiB here:
    tens of slices each, rows cut inside and across 2 MiB boundaries): the same
    status, modelled duration, counters (TLB hits, misses, walks, bytes, flops) and
    output bytes as with the default slice, which runs these commands whole at
    dispatch."""
    whole = _row_ops_figures("")
    sliced = _row_ops_figures("x-host-slice=65536")
    assert all(w[0] == OK for w in whole)
    for n, (w, s) in enumerate(zip(whole, sliced, strict=True)):
        assert w[:3] == s[:3], n
        assert w[3] == s[3], n
