"""The runtime's inference operations and graphs on the simulator backend.

References are written here in float64 from the (widened) inputs, independently of
tacc.runtime.kernels; tolerances: fp32 outputs 1e-5 relative to the largest reference
magnitude, bf16 outputs one bf16 ulp (2^-8 relative) plus that.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from tacc import model
from tacc.runtime import Context, DeviceError, DtypeError, ShapeError, TaccError, opcost
from tacc.runtime import apitrace as tr

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def ctx():
    c = Context(sim=True)
    yield c
    c.close()


F32 = np.dtype(np.float32)


def close(out: np.ndarray, ref: np.ndarray, dtype: np.dtype = F32) -> None:
    ref = np.asarray(ref, np.float64)
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    tol = 1e-5 * scale + (np.abs(ref) * 2.0 ** -8 if dtype == BF16 else 0)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= tol), f"max error {err.max()} (tolerance {np.max(tol)})"


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("dt", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_transposes_batch_bias(ctx, dt, ta, tb) -> None:
    s = ctx.stream()
    nb, m, n, k = 3, 5, 7, 9
    A = rnd(nb, *((k, m) if ta else (m, k)), seed=1).astype(dt)
    B = rnd(nb, *((n, k) if tb else (k, n)), seed=2).astype(dt)
    bias = rnd(n, seed=3).astype(dt)
    c = ctx.device_buffer((nb, m, n), dt)
    s.gemm(ctx.to_device(A), ctx.to_device(B), c, trans_a=ta, trans_b=tb,
           bias=ctx.to_device(bias), alpha=0.5)
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    ref = 0.5 * np.matmul(a64.swapaxes(1, 2) if ta else a64, b64.swapaxes(1, 2) if tb else b64)
    close(ctx.to_numpy(c), ref + bias.astype(np.float64), np.dtype(dt))


def test_gemm_shared_b_and_bf16_out(ctx) -> None:
    s = ctx.stream()
    A, B = rnd(4, 2, 8, seed=4), rnd(8, 3, seed=5)
    c = ctx.device_buffer((4, 2, 3), BF16)
    s.gemm(ctx.to_device(A), ctx.to_device(B), c, batch=4)
    close(ctx.to_numpy(c), A.astype(np.float64) @ B.astype(np.float64), BF16)
    assert ctx.to_numpy(c).dtype == BF16


@pytest.mark.parametrize("dt", [np.float32, BF16], ids=["fp32", "bf16"])
def test_softmax_causal_pos(ctx, dt) -> None:
    s = ctx.stream()
    X = rnd(2, 4, 10, seed=6).astype(dt)
    y = ctx.device_buffer(X.shape, dt)
    s.softmax(ctx.to_device(X), y, scale=0.25, causal=True, pos_offset=3)
    x = X.astype(np.float64) * 0.25
    ref = np.zeros_like(x)
    for h in range(2):
        for r in range(4):
            v = x[h, r, :r + 4]
            e = np.exp(v - v.max())
            ref[h, r, :r + 4] = e / e.sum()
    out = ctx.to_numpy(y)
    close(out, ref, np.dtype(dt))
    assert np.all(out.astype(np.float32)[:, 0, 4:] == 0)   # masked columns exactly 0


def test_norms_and_unary(ctx) -> None:
    s = ctx.stream()
    X, g, b = rnd(6, 32, seed=7), rnd(32, seed=8), rnd(32, seed=9)
    dx, dg, db = ctx.to_device(X), ctx.to_device(g), ctx.to_device(b)
    x = X.astype(np.float64)
    outs = {k: ctx.device_buffer(X.shape) for k in ("ln", "rms", "gelu", "silu", "exp")}
    s.layer_norm(dx, dg, db, outs["ln"], eps=1e-5)
    s.rms_norm(dx, dg, outs["rms"], eps=1e-6)
    s.gelu(dx, outs["gelu"])
    s.silu(dx, outs["silu"])
    s.exp(dx, outs["exp"])
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(ctx.to_numpy(outs["ln"]), (x - mu) / np.sqrt(var + 1e-5) * g + b)
    close(ctx.to_numpy(outs["rms"]), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g)
    close(ctx.to_numpy(outs["gelu"]),
          0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
    close(ctx.to_numpy(outs["silu"]), x / (1 + np.exp(-x)))
    close(ctx.to_numpy(outs["exp"]), np.exp(x))


def test_norm_stats(ctx) -> None:
    """layer_norm/rms_norm(..., stats=): each row's mean then 1/std (RMS: 1/rms), float32,
    the same Y; the stats' bytes in the command's device bytes."""
    s = ctx.stream()
    X, g, b = rnd(2, 3, 32, seed=14) * 3 + 1, rnd(32, seed=15), rnd(32, seed=16)
    dx, dg, db = ctx.to_device(X), ctx.to_device(g), ctx.to_device(b)
    x = X.astype(np.float64).reshape(6, 32)
    y0, y1, y2 = (ctx.device_buffer(X.shape) for _ in range(3))
    st, rs = ctx.device_buffer((2, 6)), ctx.device_buffer(6)
    s.layer_norm(dx, dg, db, y0, eps=1e-5)
    s.layer_norm(dx, dg, db, y1, eps=1e-5, stats=st)
    s.rms_norm(dx, dg, y2, eps=1e-6, stats=rs)
    mean, var = x.mean(-1), x.var(-1)
    got = ctx.to_numpy(st).astype(np.float64)
    assert np.max(np.abs(got[0] - mean)) <= 1e-6 * np.max(np.abs(x))
    assert np.max(np.abs(got[1] * np.sqrt(var + 1e-5) - 1)) <= 1e-5
    rms = np.sqrt((x * x).mean(-1) + 1e-6)
    assert np.max(np.abs(ctx.to_numpy(rs) * rms - 1)) <= 1e-5
    assert np.array_equal(ctx.to_numpy(y0), ctx.to_numpy(y1))
    from tacc.runtime.ops import build_rows

    plain = build_rows(ctx, "layer_norm", dx, y0, gamma=dg, beta=db, eps=1e-5)
    with_st = build_rows(ctx, "layer_norm", dx, y0, gamma=dg, beta=db, eps=1e-5, stats=st)
    assert with_st.nbytes - plain.nbytes == 12 * 4 and with_st.flops == plain.flops
    with pytest.raises(ShapeError, match="stats"):
        s.layer_norm(dx, dg, db, y0, stats=ctx.device_buffer(6))       # 2 x rows
    with pytest.raises(DtypeError):
        s.rms_norm(dx, dg, y0, stats=ctx.device_buffer(6, BF16))       # float32 only


def test_row_broadcast_cast_gather(ctx) -> None:
    s = ctx.stream()
    X, r = rnd(5, 8, seed=10).astype(BF16), rnd(8, seed=11).astype(BF16)
    dx, dr = ctx.to_device(X), ctx.to_device(r)
    add, mul = ctx.device_buffer((5, 8), BF16), ctx.device_buffer((5, 8), BF16)
    s.add(dx, dr, add)
    s.mul(dx, dr, mul)
    x64, r64 = X.astype(np.float64), r.astype(np.float64)
    close(ctx.to_numpy(add), x64 + r64, BF16)
    close(ctx.to_numpy(mul), x64 * r64, BF16)
    f = rnd(4, 4, seed=12)
    down, up = ctx.device_buffer((4, 4), BF16), ctx.device_buffer((4, 4))
    s.cast(ctx.to_device(f), down)
    s.cast(down, up)
    assert np.array_equal(ctx.to_numpy(down), f.astype(BF16))   # round to nearest even
    assert np.array_equal(ctx.to_numpy(up), f.astype(BF16).astype(np.float32))
    table = rnd(10, 6, seed=13)
    idx = np.array([3, 0, 9, 3], np.int32)
    out = ctx.device_buffer((4, 6))
    s.gather(ctx.to_device(table), ctx.to_device(idx), out)
    assert np.array_equal(ctx.to_numpy(out), table[idx])


def test_bad_inputs(ctx) -> None:
    s = ctx.stream()
    a, b = ctx.device_buffer((4, 8)), ctx.device_buffer((8, 3))
    with pytest.raises(ShapeError):
        s.gemm(a, b, ctx.device_buffer((4, 4)))
    with pytest.raises(DtypeError):
        s.gemm(a, ctx.device_buffer((8, 3), BF16), ctx.device_buffer((4, 3)), trans_a=False,
               batch=1, bias=ctx.device_buffer(3))
    with pytest.raises(ShapeError):
        s.gemm(a, b, ctx.device_buffer((4, 3)), bias=ctx.device_buffer(4))
    with pytest.raises(ShapeError):
        s.add(a, ctx.device_buffer(5), ctx.device_buffer((4, 8)))
    with pytest.raises(DtypeError):
        s.gelu(ctx.device_buffer(4, np.int32), ctx.device_buffer(4, np.int32))
    with pytest.raises(DtypeError):
        s.gather(ctx.device_buffer((4, 2)), ctx.device_buffer(2, np.int64),
                 ctx.device_buffer((2, 2)))
    with pytest.raises(ValueError):
        s.layer_norm(a, ctx.device_buffer(8), None, ctx.device_buffer((4, 8)), eps=0.0)
    with pytest.raises(ShapeError):
        s.gemm(ctx.device_buffer((4097, 1)), ctx.device_buffer((1, 1)),
               ctx.device_buffer((4097, 1)), trans_a=True)
    # an index outside the table fails the job on the device, not the call
    s.gather(ctx.to_device(rnd(4, 2)), ctx.to_device(np.array([1, 4], np.int32)),
             ctx.device_buffer((2, 2)))
    with pytest.raises(DeviceError, match="rejected"):
        s.synchronize()


def traced_run(code: str, tmp_path) -> list:
    """Runs ``code`` in a process with API tracing on; its records (decoded)."""
    env = dict(os.environ, TACC_API_DIR=str(tmp_path), TACC_API_TRACE="1",
               TACC_API_PRODUCER="python")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    recs = []
    for path in tr.list_rings(tmp_path):
        r = tr.open_reader(path)
        recs += list(r.drain())
        r.close()
    return recs


def test_ops_traced_with_flops_and_bytes(tmp_path) -> None:
    code = """
import numpy as np, ml_dtypes
from tacc.runtime import Context
bf = ml_dtypes.bfloat16
with Context(sim=True) as ctx:
    s = ctx.stream()
    a = ctx.to_device(np.ones((1, 64), bf))
    w = ctx.to_device(np.ones((64, 128), bf))
    y = ctx.device_buffer((1, 128))
    s.gemm(a, w, y, trans_b=False)
    s.softmax(y, y)
    with s.capture() as g:
        s.exp(y, y)
    g.launch()
"""
    recs = [x for x in traced_run(code, tmp_path) if x["name"] in (
        b"gemm", b"softmax", b"exp", b"graph_capture", b"graph_launch")]
    names = [x["name"].decode() for x in recs]
    assert names == ["gemm", "softmax", "exp", "graph_capture", "graph_launch"]
    # GEMM: 2 m n k FLOPs; bytes: A and W (bf16) read, y (fp32) written
    assert b"flops=16384" in recs[0]["args"]
    assert recs[0]["bytes"] == (64 + 64 * 128) * 2 + 128 * 4
    assert b"flops=640" in recs[1]["args"] and recs[1]["bytes"] == 1024
    assert recs[4]["tag"] != 0 and b"cmds=1" in recs[4]["args"]


def test_roofline_model() -> None:
    p = model.DEFAULT
    # a batch-1 bf16 GEMV is memory-bound: time = bytes / bandwidth (within 1 %)
    fl, nb = opcost.gemm_cost(1, 4096, 4096, 1, 2, 2, False, False)
    t = model.compute_ns(fl, nb, "bf16") - p.cmd_latency_ns
    assert abs(t - nb / p.devmem_gbps) <= 0.01 * t
    # a 1024^3 bf16 GEMM is compute-bound: time = FLOPs / the bf16 peak
    fl, nb = opcost.gemm_cost(1024, 1024, 1024, 1, 2, 2, False, False)
    t = model.compute_ns(fl, nb, "bf16") - p.cmd_latency_ns
    assert abs(t - fl / p.peak_gflops["bf16"]) <= 0.01 * t


def test_graph_one_submit_per_launch_and_params(ctx) -> None:
    s = ctx.stream()
    heads, dh, maxlen = 2, 4, 8
    k_cache = ctx.device_buffer((heads, maxlen, dh))
    q, k_new = ctx.device_buffer((heads, 1, dh)), ctx.device_buffer((heads, 1, dh))
    scores = ctx.device_buffer((heads, 1, maxlen))
    probs = ctx.device_buffer((heads, 1, maxlen))
    s.copy_h2d(k_cache, np.zeros((heads, maxlen, dh), np.float32))
    row = dh * 4
    with s.capture() as g:
        pos = g.param("pos", high=maxlen - 1)
        for h in range(heads):   # the new key row of each head into the cache at pos
            s.copy_d2d(k_cache, k_new, row, dst_offset=h * maxlen * row + pos * row,
                       src_offset=h * row)
        s.gemm(q, k_cache, scores, trans_b=True, alpha=0.5)
        s.softmax(scores, probs, causal=True, pos_offset=pos)
    assert len(g) == heads + 2
    jobs0 = len(ctx.backend.jobs)
    Q, K = rnd(heads, 1, dh, seed=20), rnd(heads, maxlen, dh, seed=21)
    for t in range(maxlen):
        s.copy_h2d(q, Q)
        s.copy_h2d(k_new, K[:, t:t + 1])
        n0 = len(ctx.backend.jobs)
        g.launch({"pos": t})
        assert len(ctx.backend.jobs) == n0 + 1      # one job (one submit) per launch
        sc = 0.5 * (Q.astype(np.float64) @ K[:, :t + 1].astype(np.float64).swapaxes(1, 2))
        e = np.exp(sc - sc.max(-1, keepdims=True))
        ref = np.zeros((heads, 1, maxlen))
        ref[..., :t + 1] = e / e.sum(-1, keepdims=True)
        close(ctx.to_numpy(probs), ref)
    assert len(ctx.backend.jobs) == jobs0 + 4 * maxlen   # 2 copies, the launch, the read
    listed = [r for r in ctx.backend.op_records if r[4] == g.id]
    assert len(listed) == maxlen * (heads + 2)
    assert {r[0] for r in listed} == {"op3", "gemm", "softmax"}
    with pytest.raises(ValueError, match="outside"):
        g.launch({"pos": maxlen})
    with pytest.raises(ValueError, match="unknown"):
        g.launch({"step": 1})


def test_graph_capture_rules(ctx) -> None:
    s = ctx.stream()
    a = ctx.device_buffer(16)
    with pytest.raises(TaccError, match="numpy"):
        with s.capture():
            s.copy_h2d(a, np.zeros(16, np.float32))
    with pytest.raises(TaccError, match="events"):
        with s.capture():
            s.record()
    with pytest.raises(TaccError, match="nothing was captured"):
        with s.capture():
            pass
    with s.capture() as g1:
        p1 = g1.param("x", high=3)
        s.exp(a, a)
    with pytest.raises(TaccError, match="another graph"):
        with s.capture():
            s.softmax(ctx.device_buffer((2, 2)), ctx.device_buffer((2, 2)), causal=True,
                      pos_offset=p1)
    with pytest.raises(TaccError, match="Param"):
        s.copy_d2d(a, a, 4, dst_offset=p1)
    # nothing captured ran
    assert np.array_equal(ctx.to_numpy(a), np.zeros(16, np.float32))
    g1.launch()
    assert np.array_equal(ctx.to_numpy(a), np.ones(16, np.float32))


def test_graph_hostile_offset_faults_on_the_device(ctx) -> None:
    """A parameter block past what the runtime allows (forged, as a hostile process could
    write it): the listed copy fails the launch on the device, nothing is written."""
    from tacc.runtime.graph import Launch

    s = ctx.stream()
    dst, src = ctx.device_buffer(1024), ctx.device_buffer(16)
    with s.capture() as g:
        p = g.param("i", high=15)
        s.copy_d2d(dst, src, 16, dst_offset=p * 64)
    block = g.block.copy()
    block[p.slot] = 1 << 20
    s._submit(1, ops=[Launch(g, block, 1)])
    with pytest.raises(DeviceError):
        s.synchronize()
