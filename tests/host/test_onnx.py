"""tacc.onnx on the simulator backend: the ONNX node tests, a transformer block against
onnx.reference.ReferenceEvaluator, unsupported nodes, host fallback, IOBinding."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from tacc.onnx import InferenceSession, UnsupportedNodeError, conformance
from tacc.runtime import Context, TaccError
from test_runtime_infer import traced_run

# pass counts of the node tests on the simulator (onnx 1.23); every supported op but
# Sigmoid (only as SiLU) passes some
MIN_PASS = {"MatMul": 6, "Gemm": 7, "Add": 2, "Mul": 3, "Softmax": 7, "RMSNormalization": 19,
            "Gelu": 2, "Swish": 1, "Exp": 2, "Relu": 1, "Cast": 2, "Gather": 2, "Transpose": 7,
            "Concat": 12, "Reshape": 10, "Flatten": 9, "Squeeze": 2, "Unsqueeze": 7,
            "Identity": 1, "Sub": 2, "Neg": 2, "Shape": 11, "LayerNormalization": 19}


@pytest.fixture(scope="module")
def node_results():
    with Context(sim=True) as ctx:
        yield conformance.run(ctx, conformance.load_cases())


def test_node_tests_pass_or_skip_with_a_reason(node_results) -> None:
    assert len(node_results) > 400
    fails = [(r.name, r.reason) for r in node_results if r.status == "fail"]
    assert not fails
    per = conformance.summary(node_results)
    for op, n in MIN_PASS.items():
        assert per[op]["pass"] >= n, (op, per[op])
    # Mean and InvStdDev from the NORM's statistics: none partial
    assert not [r.name for r in node_results if r.status == "partial"]
    assert per["Transpose"]["skip"] == 0
    assert all("ReduceMax" in r.reason for r in node_results
               if r.op == "Softmax" and r.status == "skip")   # only the _expanded forms
    for r in node_results:
        if r.status == "skip":
            assert r.reason and "\n" not in r.reason
        if r.status == "pass" and r.ref_err is not None:
            assert r.ref_err <= 1.0, (r.name, r.ref_err)   # agrees with ReferenceEvaluator
    assert any(r.ref_err is not None for r in node_results if r.status == "pass")


def _block(dt: int = T.FLOAT) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Embedding, LayerNorm, one attention head with a causal mask-free softmax, GELU MLP,
    residual adds: the ops of a decoder block."""
    rng = np.random.default_rng(0)
    V, D, S = 50, 16, 6

    def w(name: str, *shape: int, s: float = 0.2) -> onnx.TensorProto:
        return nh.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [w("emb", V, D, s=1.0), w("g", D, s=1.0), w("b", D), w("wq", D, D), w("bq", D),
             w("wk", D, D), w("wv", D, D), w("w1", D, 4 * D), w("b1", 4 * D),
             w("w2", 4 * D, D), nh.from_array(np.array(0.25, np.float32), "scale")]
    nodes = [
        h.make_node("Gather", ["emb", "ids"], ["x"]),
        h.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-5),
        h.make_node("MatMul", ["ln", "wq"], ["q0"]), h.make_node("Add", ["q0", "bq"], ["q"]),
        h.make_node("MatMul", ["ln", "wk"], ["k"]), h.make_node("MatMul", ["ln", "wv"], ["v"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        h.make_node("MatMul", ["q", "kt"], ["s0"]), h.make_node("Mul", ["s0", "scale"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["att"]), h.make_node("Add", ["x", "att"], ["r1"]),
        h.make_node("MatMul", ["r1", "w1"], ["f0"]), h.make_node("Add", ["f0", "b1"], ["f1"]),
        h.make_node("Gelu", ["f1"], ["f2"], approximate="tanh"),
        h.make_node("MatMul", ["f2", "w2"], ["f3"]), h.make_node("Add", ["r1", "f3"], ["y"]),
    ]
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("ids", T.INT64, [S])],
                     [h.make_tensor_value_info("y", T.FLOAT, [S, D])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    return m, {"ids": np.array([3, 7, 0, 49, 7, -1], np.int64)}


def test_transformer_block_matches_reference() -> None:
    m, feeds = _block()
    with InferenceSession(m, sim=True) as sess:
        (y,) = sess.run(None, feeds)
        steps = [st for p in sess._plans.values() for st in p.steps]
        recs = sess.ctx.backend.op_records
    (ref,) = ReferenceEvaluator(m).run(None, feeds)
    assert y.shape == ref.shape and np.allclose(y, ref, rtol=1e-4, atol=1e-5), \
        float(np.max(np.abs(y - ref)))
    fused = {st.fused for st in steps}
    assert "MatMul+Add" in fused and "Transpose+MatMul" in fused
    kinds = [r[0] for r in recs]
    assert kinds.count("gemm") == 7 and "gather" in kinds and "layer_norm" in kinds
    assert "gelu" in kinds and "softmax" in kinds


def _one_node(node: onnx.NodeProto, shape: tuple[int, ...], dtype: int = T.FLOAT,
              opset: int = 17) -> onnx.ModelProto:
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", dtype, shape)],
                     [h.make_tensor_value_info("y", dtype, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _gemms(monkeypatch, sess: InferenceSession) -> list:
    """Records the shapes of every GEMM command the session's stream issues."""
    calls = []
    cls = type(sess.stream)
    orig = cls.gemm

    def gemm(self, a, b, c, **kw):
        calls.append((a.shape, b.shape, c.shape))
        return orig(self, a, b, c, **kw)

    monkeypatch.setattr(cls, "gemm", gemm)
    return calls


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 1, 4, 2), (1, 6, 5, 1, 3)])
def test_transpose_every_permutation(monkeypatch, shape) -> None:
    """Any permutation: values equal to numpy's (the identity GEMM is exact); commands:
    none when only size-1 axes move, else the fewest batched last-two-axes transposes."""
    import itertools

    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    with Context(sim=True) as ctx:
        for perm in itertools.permutations(range(len(shape))):
            m = _one_node(h.make_node("Transpose", ["x"], ["y"], perm=list(perm)), shape)
            with InferenceSession(m, context=ctx) as sess:
                calls = _gemms(monkeypatch, sess)
                (y,) = sess.run(None, {"x": x})
            assert np.array_equal(y, x.transpose(perm)), (shape, perm)
            big = [a for a in perm if shape[a] > 1]
            if big == sorted(big):
                assert not calls, (perm, calls)
            else:   # reversing 3 axes of > 1: 2 commands; at most n - 1 for n axes
                assert 1 <= len(calls) <= len(big) - 1, (perm, calls)
    assert len(calls) == len(big) - 1   # the last, the full reversal


def test_transpose_counts() -> None:
    from tacc.onnx.lower import _canon, _rotations

    def n(shape, perm):
        return len(_rotations(*_canon(shape, perm)))

    assert n((2, 3, 4), [0, 2, 1]) == 1 and n((2, 3, 4), [2, 0, 1]) == 1
    assert n((2, 3, 4), [2, 1, 0]) == 2 and n((2, 3, 4, 5), [0, 2, 1, 3]) == 2
    assert n((2, 3, 4, 5), [0, 1, 2, 3]) == 0 and n((2, 1, 4), [2, 1, 0]) == 1
    assert n((2, 3, 4, 5, 6, 7, 8), [6, 4, 2, 0, 1, 3, 5]) == 3   # merged (0, 1)
    assert n(tuple(range(2, 10)), [7, 6, 5, 4, 3, 2, 1, 0]) == 7  # 8 axes: greedy
    # only size-1 axes move: a view, any dtype (int64 too: no GEMM)
    m = _one_node(h.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2]), (1, 3, 2), T.INT64)
    x = np.arange(6).reshape(1, 3, 2)
    with InferenceSession(m, sim=True) as sess:
        assert np.array_equal(sess.run(None, {"x": x})[0], x.transpose(1, 0, 2))


@pytest.mark.parametrize("dtype", [T.FLOAT, T.BFLOAT16])
def test_softmax_every_axis(monkeypatch, dtype) -> None:
    """Softmax (opset 13) over each axis of a 4-D tensor against ReferenceEvaluator: an
    axis with axes after it is moved to the end and back (2 transposes + SOFTMAX)."""
    shape = (2, 3, 4, 5)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    npdt = ml_dtypes.bfloat16 if dtype == T.BFLOAT16 else np.float32
    x = x.astype(npdt)
    rtol = 2.0 ** -7 if dtype == T.BFLOAT16 else 1e-5
    with Context(sim=True) as ctx:
        for axis in range(-4, 4):
            m = _one_node(h.make_node("Softmax", ["x"], ["y"], axis=axis), shape, dtype)
            ref = ReferenceEvaluator(_one_node(h.make_node("Softmax", ["x"], ["y"], axis=axis),
                                               shape)).run(None, {"x": x.astype(np.float32)})[0]
            with InferenceSession(m, context=ctx) as sess:
                calls = _gemms(monkeypatch, sess)
                (y,) = sess.run(None, {"x": x})
            assert y.dtype == npdt
            np.testing.assert_allclose(y.astype(np.float32), ref, rtol=rtol, atol=1e-6)
            assert len(calls) == (0 if axis in (-1, 3) else 2), (axis, calls)


def test_unsupported_node_is_one_line_naming_it(tmp_path) -> None:
    g = h.make_graph([h.make_node("Div", ["a", "b"], ["c"], name="the_div")], "d",
                     [h.make_tensor_value_info("a", T.FLOAT, [4]),
                      h.make_tensor_value_info("b", T.FLOAT, [4])],
                     [h.make_tensor_value_info("c", T.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 14)])
    feeds = {"a": np.arange(4, dtype=np.float32), "b": np.full(4, 2, np.float32)}
    with InferenceSession(m, sim=True) as sess, pytest.raises(UnsupportedNodeError) as ei:
        sess.run(None, feeds)
    msg = str(ei.value)
    assert "\n" not in msg and "the_div" in msg and "(Div)" in msg
    # with fallback="cpu" it runs on the host, recorded as API host_op
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    code = f"""
import numpy as np
from tacc.onnx import InferenceSession
s = InferenceSession({str(path)!r}, sim=True, fallback="cpu")
(c,) = s.run(["c"], {{"a": np.arange(4, dtype=np.float32), "b": np.full(4, 2, np.float32)}})
assert c.tolist() == [0.0, 0.5, 1.0, 1.5], c
"""
    names = [(x["name"], x["args"]) for x in traced_run(code, tmp_path)]
    assert (b"host_op", b"Div the_div") in names


def test_bad_model_file(tmp_path) -> None:
    with pytest.raises(TaccError, match="cannot load"):
        InferenceSession(tmp_path / "nope.onnx", sim=True)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x01\x02 not a model")
    with pytest.raises(TaccError) as ei:
        InferenceSession(junk, sim=True)
    assert "\n" not in str(ei.value)


def test_iobinding_resident_buffers() -> None:
    """Inputs and outputs in device memory between runs; weights uploaded once."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((8, 8)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 8])], [nh.from_array(W, "W")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    with Context(sim=True) as ctx:
        sess = InferenceSession(m, context=ctx)
        assert [(i.name, i.shape, i.type) for i in sess.get_inputs()] == \
            [("x", [2, 8], "tensor(float)")]
        x, y = ctx.device_buffer((2, 8)), ctx.device_buffer((2, 8))
        b = sess.io_binding()
        b.bind_input("x", x)
        b.bind_output("y", y)
        h2d = []
        for _ in range(3):
            X = rng.standard_normal((2, 8)).astype(np.float32)
            s = sess.stream
            s.copy_h2d(x, X)
            n0 = len(ctx.backend.jobs)
            sess.run_with_iobinding(b)
            h2d.append(len(ctx.backend.jobs) - n0)
            assert b.get_outputs()[0] is y
            assert np.allclose(ctx.to_numpy(y), X @ W, rtol=1e-5, atol=1e-6)
        # the first run uploads W; then one GEMM per run, writing y in place
        assert h2d == [2, 1, 1]
        g = sess.capture(b)                       # the model as a graph: one job a launch
        X = rng.standard_normal((2, 8)).astype(np.float32)
        sess.stream.copy_h2d(x, X)
        n0 = len(ctx.backend.jobs)
        g.launch()
        assert len(ctx.backend.jobs) == n0 + 1
        assert np.allclose(ctx.to_numpy(y), X @ W, rtol=1e-5, atol=1e-6)
        sess.close()


def test_bf16_model() -> None:
    """A Cast to bf16, a bf16 GEMM with bias and GELU, a Cast back."""
    rng = np.random.default_rng(2)
    W = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(8).astype(ml_dtypes.bfloat16)
    g = h.make_graph([h.make_node("Cast", ["x"], ["xb"], to=T.BFLOAT16),
                      h.make_node("Gemm", ["xb", "W", "bias"], ["yb"]),
                      h.make_node("Gelu", ["yb"], ["gb"], approximate="tanh"),
                      h.make_node("Cast", ["gb"], ["y"], to=T.FLOAT)], "bf",
                     [h.make_tensor_value_info("x", T.FLOAT, [4, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
                     [nh.from_array(W, "W"), nh.from_array(bias, "bias")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    x = rng.standard_normal((4, 16)).astype(np.float32)
    with InferenceSession(m, sim=True) as sess:
        (y,) = sess.run(None, {"x": x})
    xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    r = (xb @ W.astype(np.float64) + bias.astype(np.float64)).astype(np.float32)
    r = r.astype(ml_dtypes.bfloat16).astype(np.float64)
    ref = 0.5 * r * (1 + np.tanh(np.sqrt(2 / np.pi) * (r + 0.044715 * r ** 3)))
    # two bf16 roundings (the GEMM's output, GELU's): 2 ulps of 2^-8, plus fp32 noise
    assert np.allclose(y, ref, rtol=2 * 2.0 ** -8, atol=1e-3), float(np.max(np.abs(y - ref)))


def test_cli_run_and_bad_file(tmp_path, capsys) -> None:
    import json

    from tacc.cli import main

    m, feeds = _block()
    path = tmp_path / "block.onnx"
    onnx.save(m, str(path))
    np.save(tmp_path / "ids.npy", feeds["ids"])
    out = tmp_path / "out.npz"
    assert main(["onnx", "run", str(path), "--sim", "-i", f"ids={tmp_path}/ids.npy",
                 "-o", str(out)]) == 0
    (ref,) = ReferenceEvaluator(m).run(None, feeds)
    assert np.allclose(np.load(out)["y"], ref, rtol=1e-4, atol=1e-5)
    capsys.readouterr()
    assert main(["onnx", "run", str(path), "--sim", "-i", f"ids={tmp_path}/ids.npy",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"name": "y", "dtype": str(ref.dtype), "shape": list(ref.shape)}]
    r = subprocess.run([sys.executable, "-m", "tacc.cli", "onnx", "run",
                        str(tmp_path / "missing.onnx"), "--sim"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "missing.onnx" in r.stderr


def test_gemm_past_the_device_limits_runs_as_blocks() -> None:
    """MatMul/Gemm wider than the device's GEMM dimension (4096): N in column blocks
    written through c's leading dimension (an LM head: MatMul by a transposed table, its
    bias fused), M in row blocks (transA), K in blocks accumulated with beta 1 onto
    Gemm's beta * C; against ReferenceEvaluator, every node on the device."""
    rng = np.random.default_rng(5)

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    V, D = 9000, 24
    inits = [nh.from_array(f(V, D), "wte"), nh.from_array(f(V), "bv"),
             nh.from_array(f(5000, 3), "wk"), nh.from_array(f(2, 3), "c"),
             nh.from_array(f(6, 5000), "am")]
    nodes = [h.make_node("Transpose", ["wte"], ["wt"], perm=[1, 0]),
             h.make_node("MatMul", ["x", "wt"], ["l0"]), h.make_node("Add", ["l0", "bv"], ["n"]),
             h.make_node("Gemm", ["xk", "wk", "c"], ["k"], alpha=0.5, beta=2.0),
             h.make_node("Gemm", ["am", "xm"], ["m"], transA=1)]
    g = h.make_graph(nodes, "big", [h.make_tensor_value_info("x", T.FLOAT, [3, D]),
                                    h.make_tensor_value_info("xk", T.FLOAT, [2, 5000]),
                                    h.make_tensor_value_info("xm", T.FLOAT, [6, 7])],
                     [h.make_tensor_value_info(o, T.FLOAT, None) for o in "nkm"], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    feeds = {"x": f(3, D), "xk": f(2, 5000), "xm": f(6, 7)}
    with InferenceSession(m, sim=True) as sess:
        got = sess.run(None, feeds)
        steps = [st for p in sess._plans.values() for st in p.steps]
        recs = sess.ctx.backend.op_records
    assert all(st.run is not None for st in steps), [(st.label, st.reason) for st in steps]
    # N: 3 column blocks (9000 = 4096 + 4096 + 808); K: 2 (5000); M: 2 (5000)
    assert [r[0] for r in recs].count("gemm") == 3 + 2 + 2
    ref = ReferenceEvaluator(m).run(None, feeds)
    for name, y, r in zip("nkm", got, ref, strict=True):
        assert y.shape == r.shape, name
        # fp32 sums of up to 5000 products of N(0,1) values (|y| ~ 70): fp32 rounding
        assert np.allclose(y, r, rtol=1e-4, atol=2e-3), (name, float(np.max(np.abs(y - r))))
