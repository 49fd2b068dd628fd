"""In-guest: the inference operations, graphs and tacc.onnx against tacc.ko and the device.

- ONNX backend node tests of a few ops on every function kind of the boot (the PF in the
  strict boot; the PF, a VF and virtio-tacc in the extras boot, where this file runs
  again); every supported op's under the ``long`` marker;
- a graph launched N times: one submit ioctl per launch (tacc_submit tracepoints), each
  listed command its own version-3 device trace record with FLOPs, bytes and the list id;
- hostile lists written by tacc-user into its own list memory: a FILL (kernel only) and a
  LIST naming itself end with an error completion, nothing else happens.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tacc.runtime import Context
from tacc.runtime import uapi as U
from test_runtime_basic import KINDS, kind_context
from test_runtime_join import DeviceTrace

TRACEFS = Path("/sys/kernel/tracing")
# a small set of the node tests: one module each
SMALL_OPS = ("MatMul", "Gemm", "Softmax", "RMSNormalization", "Gelu", "Gather", "Cast",
             "Swish", "Transpose", "LayerNormalization")


@pytest.fixture(scope="module")
def small_cases() -> list:
    from tacc.onnx import conformance

    return conformance.load_cases(SMALL_OPS)


@pytest.mark.parametrize("kind", KINDS)
def test_node_tests_on_device(kind: str, small_cases: list) -> None:
    """The same cases pass on the device as on the simulator; none fails."""
    from tacc.onnx import conformance

    with Context(sim=True) as sim:
        ref = {r.name: r.status for r in conformance.run(sim, small_cases, reference=False)}
    with kind_context(kind) as ctx:
        res = conformance.run(ctx, small_cases, reference=False)
    fails = [(r.name, r.reason) for r in res if r.status == "fail"]
    assert not fails, fails
    got = {r.name: r.status for r in res}
    assert got == ref
    n = conformance.summary(res)
    print(kind, {op: c["pass"] for op, c in n.items()})
    assert sum(c["pass"] for c in n.values()) >= 40


@pytest.mark.long
def test_all_node_tests_on_pf() -> None:
    """Every supported op's node tests on the PF (python -m tacc.onnx.conformance)."""
    code = ("import sys, json\nfrom tacc.onnx import conformance\n"
            "sys.exit(conformance.main(['--json', sys.argv[1]]))")
    out = Path("/tmp/onnx-node-tests.json")
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                       timeout=3000)
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import json

    d = json.loads(out.read_text())
    assert sum(c["pass"] for c in d["summary"].values()) >= 100
    assert not any(c["fail"] for c in d["summary"].values())


# ------------------------------------------------------------------ graphs ---
def _rec3() -> np.dtype:
    """struct tacc_trace_rec3: the version-2 record, then FLOPs, bytes and the list id."""
    from tacc import hw

    base = hw.dtype("tacc_trace_rec")
    tail = [f for f in hw.STRUCTS["tacc_trace_rec3"]["fields"] if f["name"] != "rec"
            and f["name"] != "rsvd"]
    fmt = {"__u64": "<u8", "__u32": "<u4", "__u16": "<u2", "__u8": "u1"}
    return np.dtype({"names": [*base.names, *(f["name"] for f in tail)],
                     "formats": [base.fields[n][0] for n in base.names]
                     + [fmt[f["type"]] for f in tail],
                     "offsets": [base.fields[n][1] for n in base.names]
                     + [f["offset"] for f in tail],
                     "itemsize": hw.TACC_TRACE_REC3_SIZE})


REC3 = _rec3()
assert REC3.itemsize == 128


@pytest.fixture()
def submits() -> Iterator[Path]:
    if not (TRACEFS / "events/tacc").is_dir():
        pytest.skip("tacc tracepoints not in tracefs")
    (TRACEFS / "events/tacc/tacc_submit/enable").write_text("1")
    (TRACEFS / "trace").write_text("")
    yield TRACEFS / "trace"
    (TRACEFS / "events/tacc/tacc_submit/enable").write_text("0")


def _decode_step(ctx: Context, heads: int = 2, dh: int = 8, maxlen: int = 16) -> tuple:
    """Attention of one decode step as a graph: the new key row into the cache at pos,
    Q.K^T (bf16), a causal softmax at pos."""
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    s = ctx.stream()
    kc = ctx.device_buffer((heads, maxlen, dh), bf)
    s.copy_h2d(kc, np.zeros((heads, maxlen, dh), bf))
    q, kn = ctx.device_buffer((heads, 1, dh), bf), ctx.device_buffer((heads, 1, dh), bf)
    sc = ctx.device_buffer((heads, 1, maxlen))
    pr = ctx.device_buffer((heads, 1, maxlen))
    row = dh * 2
    with s.capture() as g:
        pos = g.param("pos", high=maxlen - 1)
        for h in range(heads):
            s.copy_d2d(kc, kn, row, dst_offset=h * maxlen * row + pos * row,
                       src_offset=h * row)
        s.gemm(q, kc, sc, trans_b=True, alpha=dh ** -0.5)
        s.softmax(sc, pr, causal=True, pos_offset=pos)
    return s, g, (q, kn, pr), (heads, dh, maxlen)


def test_graph_one_submit_per_launch_traced(pf_accel: Path, submits: Path) -> None:
    import ml_dtypes

    dev = DeviceTrace(str(pf_accel), flags=1, dtype=REC3)   # DRM_TACC_TRACE_F_V3
    try:
        dev.drain()
        with Context() as ctx:
            s, g, (q, kn, pr), (heads, dh, maxlen) = _decode_step(ctx)
            rng = np.random.default_rng(0)
            Q = rng.standard_normal((heads, 1, dh)).astype(ml_dtypes.bfloat16)
            K = rng.standard_normal((heads, maxlen, dh)).astype(ml_dtypes.bfloat16)
            s.copy_h2d(q, Q)
            s.synchronize()
            (TRACEFS / "trace").write_text("")
            launches = 6
            for t in range(launches):
                s.copy_h2d(kn, np.ascontiguousarray(K[:, t:t + 1]))
                g.launch({"pos": t})
            s.synchronize()
            text = submits.read_text()
            probs = ctx.to_numpy(pr)
        recs, dropped = dev.drain()
    finally:
        dev.close()
    t = launches - 1
    k64, q64 = K.astype(np.float64), Q.astype(np.float64)
    sc = (q64 @ k64[:, :t + 1].swapaxes(1, 2)) * dh ** -0.5
    e = np.exp(sc - sc.max(-1, keepdims=True))
    assert np.allclose(probs[..., :t + 1], e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
    assert np.all(probs[..., t + 1:] == 0)
    pid = os.getpid()
    mine = [int(x, 16) for x in re.findall(r"tacc_submit: .*? tag=0x([0-9a-f]+)", text)
            if int(x, 16) >> 32 == pid]
    # per launch: one copy_h2d job and one LIST job; nothing else was submitted
    assert len(mine) == 2 * launches
    ours = recs[recs["list_id"] == g.id]
    listed = ours[ours["opcode"] != U.OP_LIST]
    assert dropped == 0 and len(listed) == launches * len(g)
    assert np.sum(ours["opcode"] == U.OP_LIST) == launches   # the LIST's own record
    per = {}
    for r in listed:
        per.setdefault(int(r["opcode"]), []).append(r)
    gemm, smax = per[U.OP_GEMM], per[U.OP_SOFTMAX]
    # FLOPs and bytes of the listed commands, as docs/hardware.md section 14 counts them
    assert all(int(r["flops"]) == 2 * heads * 1 * maxlen * dh for r in gemm)
    assert all(int(r["devmem_rd"]) == heads * (dh + maxlen * dh) * 2 for r in gemm)
    assert all(int(r["flops"]) == 5 * heads * maxlen for r in smax)
    assert all(int(r["devmem_wr"]) == heads * maxlen * 4 for r in smax)
    assert np.all(listed["status"] == 0)


# ------------------------------------------------------------- hostile lists ---
# Run as tacc-user in one process (a Python start under TCG costs a minute): a valid
# graph whose list memory it then rewrites, for each hostile case.
HOSTILE = """
import ctypes as C
from tacc.runtime import Context, DeviceError
from tacc.runtime import cmdcodec as CC
from tacc.runtime import uapi as U

with Context() as ctx:
    s = ctx.stream()
    a = ctx.device_buffer(1024)
    for what in ("fill", "self"):
        with s.capture() as g:
            s.exp(a, a)
        d = CC.tacc_desc.from_buffer(g.device_list.descs.array)
        C.memset(C.addressof(d.payload), 0, 104)
        if what == "fill":     # kernel only: FILL of the window from offset 0
            f = (C.c_uint64 * 3).from_buffer(d.payload)
            f[0], f[1], f[2] = 0, 1 << 20, 0x4141414141414141
            d.opcode = 9
        else:                  # a LIST naming its own list: nesting
            la = CC.list_args(list=g.device_list.descs.va, count=1, list_id=7)
            C.memmove(C.addressof(d.payload), C.addressof(la), C.sizeof(la))
            d.opcode = U.OP_LIST
        g.launch()
        try:
            s.synchronize()
            print(what, "ran")
        except DeviceError as e:
            print(what, "refused", e.status)
"""


def test_gemm_blocks_past_the_limits_on_pf() -> None:
    """GEMMs past the device's dimension (4096) as block GEMMs through the driver, with
    lda/ldb/ldc of the whole matrices: N in column blocks (an LM head: B transposed, a
    bias), K in blocks accumulated with beta 1 onto beta * C; submitted and replayed from a
    captured list; against float64 numpy."""
    rng = np.random.default_rng(3)

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    A, W, bias = f(3, 16), f(4100, 16), f(4100)
    A2, B2, C2 = f(2, 4100), f(4100, 3), f(2, 3)
    with Context() as ctx:
        s = ctx.stream()
        bufs = [ctx.device_buffer(x.shape) for x in (A, W, bias, A2, B2)]
        for d, x in zip(bufs, (A, W, bias, A2, B2), strict=True):
            s.copy_h2d(d, x)
        da, dw, dbias, da2, db2 = bufs
        out, out2 = ctx.device_buffer((3, 4100)), ctx.device_buffer((2, 3))
        s.copy_h2d(out2, C2)
        assert s.gemm_blocks(da, dw, out, trans_b=True, bias=dbias) == 2
        assert s.gemm_blocks(da2, db2, out2, beta=0.5) == 2
        s.synchronize()
        ref = A.astype(np.float64) @ W.T.astype(np.float64) + bias
        ref2 = A2.astype(np.float64) @ B2.astype(np.float64) + 0.5 * C2
        got, got2 = ctx.to_numpy(out), ctx.to_numpy(out2)
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), float(np.max(np.abs(got - ref)))
        assert np.allclose(got2, ref2, rtol=1e-4, atol=1e-3), \
            float(np.max(np.abs(got2 - ref2)))
        with s.capture() as g:  # the same blocks as a list's commands
            s.gemm_blocks(da, dw, out, trans_b=True, bias=dbias)
        s.copy_h2d(out, np.zeros((3, 4100), np.float32))
        g.launch()
        s.synchronize()
        got = ctx.to_numpy(out)
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), float(np.max(np.abs(got - ref)))


def test_hostile_lists_refused_as_tacc_user() -> None:
    cmd = f"exec {sys.executable} -c '{HOSTILE}'"
    p = subprocess.run(["su", "tacc-user", "-c", cmd], capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert p.returncode == 0, p.stderr[-2000:]
    for what in ("fill", "self"):
        assert f"{what} refused {-errno.EINVAL}" in p.stdout, p.stdout
    # the device is still usable afterwards
    with Context() as ctx:
        b = ctx.to_device(np.arange(8, dtype=np.float32))
        ctx.default_stream.exp(b, b)
        assert np.allclose(ctx.to_numpy(b), np.exp(np.arange(8, dtype=np.float32)))
