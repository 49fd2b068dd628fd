"""A GPT-2-architecture decoder-only transformer as ONNX graphs, with a static KV cache.

    from tacc.models import gpt2
    cfg = gpt2.CONFIGS["tiny"]
    w = gpt2.weights(cfg)                                 # seeded, deterministic
    prefill = gpt2.build(cfg, w, batch=4, seq=16)         # onnx.ModelProto
    step = gpt2.build(cfg, w, batch=4, seq=1)             # the decode step
    tokens, logits = gpt2.reference_decode(cfg, w, prompt, n_new=8)

The graph (opset 24) is GPT-2's: token and position embedding (``Gather``); per block
LayerNorm, causal multi-head attention, residual, LayerNorm, GELU (tanh form) MLP,
residual; a final LayerNorm; the LM head tied to the token embedding
(``MatMul(h, Transpose(wte))``).  Shapes are static, one graph per (batch ``B``, step
length ``S``): the prefill graph (``S`` = prompt length) and the decode-step graph
(``S`` = 1) share the weights; static shapes are what a captured command list replays.

The KV cache is static: ``past_key_<i>`` / ``past_value_<i>`` are ``[H, B, T, dh]`` with
``T = cfg.max_len``; the step's keys and values are written at ``write_index`` (``[H]``,
each the number of tokens already cached: ``TensorScatter``'s index per slice of axis 0)
along axis -2 into ``present_key_<i>`` / ``present_value_<i>``, which the next step takes
as its past (a device-resident binding gives both the same buffer: an in-place update).
Attention runs over all ``T`` slots with the additive ``attn_mask`` ``[S, T]`` (0 where
key ``t <= write_index + s``, :data:`MASK_NEG` elsewhere), which covers causality and the
unwritten slots.

Layout: the residual stream is ``[N, D]`` (``N = B*S`` tokens, batch-major).  The
projections use a per-head weight layout so that no activation is ever transposed:
``MatMul(x [N,D], Wq [H,D,dh])`` gives ``[H,N,dh]`` (one batched matmul over heads, the
activation shared by all), a ``Reshape`` (no data movement) makes it ``[H,B,S,dh]``, and
the output projection ``ReduceSum(MatMul(ctx [H,N,dh], Wo [H,dh,D]), axis 0)`` sums the
heads' contributions: the FLOPs of GPT-2's ``concat(heads) @ W_o``.  The only transposes
are of ``K`` and ``wte`` in front of a ``MatMul`` (a GEMM's ``trans_b``).  The q, k, v
projections have no bias (a per-head bias is not a row vector the device can broadcast;
k's bias cancels in the softmax and v's folds into the output bias exactly, q's is the
one real difference from GPT-2); every other bias is GPT-2's.

``dtype="bf16"`` stores the weights of the projection, MLP and LM-head matmuls as
bfloat16 (``ml_dtypes``), casts their activations to bfloat16 in front of them and the
matmul's result back to float32 (LayerNorm, softmax, residuals, embeddings, attention and
the KV cache stay float32): half the weight bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 24  # TensorScatter (the static KV cache update)
MASK_NEG = -1.0e9  # additive mask of a key a query must not see
LN_EPS = 1e-5


@dataclass(frozen=True)
class Config:
    name: str
    n_layer: int
    d_model: int
    n_head: int
    vocab: int
    max_len: int  # T: KV cache slots (prompt + generated tokens)
    n_pos: int  # position embedding rows (>= max_len)
    init_std: float  # weights ~ N(0, init_std); GPT-2 uses 0.02
    seed: int = 1234

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    def n_params(self) -> int:
        d, f = self.d_model, self.d_ff
        per_layer = 4 * d * d + d + 2 * d * f + f + d + 4 * d
        return self.vocab * d + self.n_pos * d + self.n_layer * per_layer + 2 * d


CONFIGS: dict[str, Config] = {c.name: c for c in (
    # tests: 2 layers, d 128; weights wider than GPT-2's init and a seed whose greedy
    # choices for the default prompt (4 x 8 tokens, 8 new) are varied and clear of bf16
    # rounding (top-2 margin >= 0.064, logits' std 1.75: the reference check compares
    # tokens)
    Config("tiny", n_layer=2, d_model=128, n_head=4, vocab=512, max_len=64, n_pos=64,
           init_std=0.15, seed=13),
    # GPT-2 small's shapes (124M parameters): benchmarks
    Config("gpt2", n_layer=12, d_model=768, n_head=12, vocab=50257, max_len=128, n_pos=1024,
           init_std=0.02),
)}


def get_config(name: str) -> Config:
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown model config {name!r}; known: {', '.join(CONFIGS)}") from None


# ---------------------------------------------------------------------------- weights --
def weights(cfg: Config) -> dict[str, np.ndarray]:
    """GPT-2's parameters in the graph's layout, float32, from ``cfg.seed``: the same
    config always gives the same bytes.  Keys are the graph's initializer names."""
    rng = np.random.default_rng(cfg.seed)
    d, h, dh, f = cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_ff
    s = cfg.init_std

    def normal(*shape: int, std: float = s) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def around_one(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w: dict[str, np.ndarray] = {"wte": normal(cfg.vocab, d), "wpe": normal(cfg.n_pos, d,
                                                                          std=s / 2)}
    for i in range(cfg.n_layer):
        p = f"L{i}."
        w[p + "ln1.g"], w[p + "ln1.b"] = around_one(d), normal(d)
        for n in "qkv":
            w[p + f"attn.W{n}"] = normal(h, d, dh)  # GPT-2's c_attn split per head
        # residual projections scaled by 1/sqrt(2 n_layer), as GPT-2 initialises them
        w[p + "attn.Wo"] = normal(h, dh, d, std=s / math.sqrt(2 * cfg.n_layer))
        w[p + "attn.bo"] = normal(d)
        w[p + "ln2.g"], w[p + "ln2.b"] = around_one(d), normal(d)
        w[p + "mlp.W1"], w[p + "mlp.b1"] = normal(d, f), normal(f)
        w[p + "mlp.W2"] = normal(f, d, std=s / math.sqrt(2 * cfg.n_layer))
        w[p + "mlp.b2"] = normal(d)
    w["lnf.g"], w["lnf.b"] = around_one(d), normal(d)
    return w


#: weights that are matmul operands (bf16 in the bf16 graph)
def matmul_weight(name: str) -> bool:
    return name == "wte_lm" or name.split(".")[-1] in ("Wq", "Wk", "Wv", "Wo", "W1", "W2")


# ------------------------------------------------------------------------------ graph --
#: ``external_data`` location of an initializer whose bytes stay in a dict in memory
IN_MEMORY = "tacc:in-memory"


def in_memory_tensor(name: str, value: np.ndarray) -> TensorProto:
    """An initializer of ``value``'s type and shape whose data is external (location
    :data:`IN_MEMORY`): no copy of the bytes in the model."""
    t = TensorProto(name=name, dims=list(value.shape),
                    data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                    data_location=TensorProto.EXTERNAL)
    for k, v in (("location", IN_MEMORY), ("length", str(value.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


class _G:
    """Accumulates nodes with readable, unique names (layer.part.op)."""

    def __init__(self, external: dict[str, np.ndarray] | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.external = external

    def op(self, op: str, inputs: Sequence[str], name: str, n_out: int = 1,
           **attrs: Any) -> str:
        outs = [name] if n_out == 1 else [f"{name}:{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0]

    def const(self, name: str, value: np.ndarray) -> str:
        if self.external is not None and value.nbytes > 4096:
            self.external[name] = value
            self.inits.append(in_memory_tensor(name, value))
        else:
            self.inits.append(numpy_helper.from_array(value, name))
        return name


def _bf16() -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16


def input_names(cfg: Config) -> list[str]:
    names = ["input_ids", "position_ids", "attn_mask", "write_index"]
    for i in range(cfg.n_layer):
        names += [f"past_key_{i}", f"past_value_{i}"]
    return names


def output_names(cfg: Config) -> list[str]:
    names = ["logits"]
    for i in range(cfg.n_layer):
        names += [f"present_key_{i}", f"present_value_{i}"]
    return names


def cache_shape(cfg: Config, batch: int) -> tuple[int, int, int, int]:
    return (cfg.n_head, batch, cfg.max_len, cfg.d_head)


def build(cfg: Config, w: dict[str, np.ndarray] | None = None, dtype: str = "fp32",
          batch: int = 1, seq: int = 1, external: dict[str, np.ndarray] | None = None
          ) -> onnx.ModelProto:
    """The model's ONNX graph for ``batch`` sequences of ``seq`` new tokens a step, with
    ``w`` (default: :func:`weights`) as initializers.

    ``external``: a dict that receives every initializer over 4 KiB (the weights, as
    the graph holds them: bf16 ones cast) while the model keeps only its name, type and
    shape (external data at :data:`IN_MEMORY`; the decode engine takes the arrays from
    the dict): no copy of the weights' bytes into the protobuf, and shape inference does
    not serialise them.  GPT-2 small's 500 MB build: the inline model costs ~7 s of host
    time per graph (3 copies of the bytes, and shape inference's), this ~0.02 s."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype {dtype!r}: fp32 or bf16")
    if not (batch >= 1 and 1 <= seq <= cfg.max_len):
        raise ValueError(f"batch {batch}, seq {seq}: need batch >= 1, 1 <= seq <= "
                         f"{cfg.max_len}")
    w = weights(cfg) if w is None else w
    bf16 = dtype == "bf16"
    g = _G(external)
    F, I64 = TensorProto.FLOAT, TensorProto.INT64
    BF = TensorProto.BFLOAT16
    d, h, dh, t = cfg.d_model, cfg.n_head, cfg.d_head, cfg.max_len
    n = batch * seq
    for k, v in w.items():
        g.const(k, v.astype(_bf16()) if bf16 and matmul_weight(k) else v)
    if bf16:  # the LM head's own bf16 copy of wte (the gather keeps the fp32 table)
        g.const("wte_lm", w["wte"].astype(_bf16()))
    g.const("scale", np.array(1.0 / math.sqrt(dh), np.float32))
    g.const("axis0", np.array([0], np.int64))
    g.const("shape.tokens", np.array([n], np.int64))
    g.const("shape.heads", np.array([h, batch, seq, dh], np.int64))
    g.const("shape.heads_flat", np.array([h, n, dh], np.int64))
    g.const("shape.logits", np.array([batch, seq, cfg.vocab], np.int64))

    def matmul(x: str, wname: str, name: str, trans_w: bool = False) -> str:
        if not bf16:
            if trans_w:
                wname = g.op("Transpose", [wname], name + ".wT", perm=[1, 0])
            return g.op("MatMul", [x, wname], name)
        xb = g.op("Cast", [x], name + ".in_bf16", to=BF)
        wb = "wte_lm" if wname == "wte" else wname
        if trans_w:
            wb = g.op("Transpose", [wb], name + ".wT", perm=[1, 0])
        y = g.op("MatMul", [xb, wb], name + ".bf16")
        return g.op("Cast", [y], name, to=F)

    def layer_norm(x: str, p: str) -> str:
        return g.op("LayerNormalization", [x, p + ".g", p + ".b"], p, axis=-1,
                    epsilon=LN_EPS)

    ids = g.op("Reshape", ["input_ids", "shape.tokens"], "embed.ids")
    pids = g.op("Reshape", ["position_ids", "shape.tokens"], "embed.pos_ids")
    tok = g.op("Gather", ["wte", ids], "embed.tok", axis=0)  # [N, D]
    pos = g.op("Gather", ["wpe", pids], "embed.pos", axis=0)
    x = g.op("Add", [tok, pos], "embed")
    for i in range(cfg.n_layer):
        p = f"L{i}."
        a = layer_norm(x, p + "ln1")
        qkv = {}
        for nm in "qkv":
            y = matmul(a, p + f"attn.W{nm}", p + f"attn.{nm}_proj")  # [H, N, dh]
            qkv[nm] = g.op("Reshape", [y, "shape.heads"], p + f"attn.{nm}")  # [H,B,S,dh]
        k_all = g.op("TensorScatter", [f"past_key_{i}", qkv["k"], "write_index"],
                     f"present_key_{i}", axis=-2)
        v_all = g.op("TensorScatter", [f"past_value_{i}", qkv["v"], "write_index"],
                     f"present_value_{i}", axis=-2)
        kt = g.op("Transpose", [k_all], p + "attn.kT", perm=[0, 1, 3, 2])
        sc = g.op("MatMul", [qkv["q"], kt], p + "attn.qk")  # [H,B,S,T]
        sc = g.op("Mul", [sc, "scale"], p + "attn.scale")
        sc = g.op("Add", [sc, "attn_mask"], p + "attn.mask")
        pr = g.op("Softmax", [sc], p + "attn.softmax", axis=-1)
        ctx = g.op("MatMul", [pr, v_all], p + "attn.pv")  # [H,B,S,dh]
        ctx = g.op("Reshape", [ctx, "shape.heads_flat"], p + "attn.ctx")  # [H,N,dh]
        o = matmul(ctx, p + "attn.Wo", p + "attn.o_proj")  # [H,N,D]
        o = g.op("ReduceSum", [o, "axis0"], p + "attn.heads_sum", keepdims=0)  # [N,D]
        o = g.op("Add", [o, p + "attn.bo"], p + "attn.out")
        x = g.op("Add", [x, o], p + "attn.residual")
        m = layer_norm(x, p + "ln2")
        m = g.op("Add", [matmul(m, p + "mlp.W1", p + "mlp.fc_proj"), p + "mlp.b1"],
                 p + "mlp.fc")
        m = g.op("Gelu", [m], p + "mlp.gelu", approximate="tanh")
        m = g.op("Add", [matmul(m, p + "mlp.W2", p + "mlp.out_proj"), p + "mlp.b2"],
                 p + "mlp.out")
        x = g.op("Add", [x, m], p + "mlp.residual")
    x = layer_norm(x, "lnf")
    logits = matmul(x, "wte", "lm_head", trans_w=True)  # [N, V]
    g.op("Reshape", [logits, "shape.logits"], "logits")

    ins = [helper.make_tensor_value_info("input_ids", I64, [batch, seq]),
           helper.make_tensor_value_info("position_ids", I64, [batch, seq]),
           helper.make_tensor_value_info("attn_mask", F, [seq, t]),
           helper.make_tensor_value_info("write_index", I64, [h])]
    outs = [helper.make_tensor_value_info("logits", F, [batch, seq, cfg.vocab])]
    for i in range(cfg.n_layer):
        for kind in ("key", "value"):
            ins.append(helper.make_tensor_value_info(f"past_{kind}_{i}", F,
                                                     list(cache_shape(cfg, batch))))
            outs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", F,
                                                      list(cache_shape(cfg, batch))))
    graph = helper.make_graph(g.nodes, f"{cfg.name}_{dtype}_b{batch}_s{seq}", ins, outs,
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tacc.models.gpt2")
    model.doc_string = (f"GPT-2 architecture, config {cfg.name} ({cfg.n_layer} layers, "
                        f"d {d}, {h} heads, vocab {cfg.vocab}, KV cache {t}), {dtype}, "
                        f"batch {batch}, step {seq}, seed {cfg.seed}")
    return model


# ----------------------------------------------------------------------------- feeds --
def attn_mask(past: int, s: int, t: int) -> np.ndarray:
    """``[s, t]`` additive mask: query ``j`` (position ``past + j``) sees keys ``<= past + j``."""
    keys = np.arange(t)[None, :]
    q = past + np.arange(s)[:, None]
    return np.where(keys <= q, 0.0, MASK_NEG).astype(np.float32)


def step_feeds(cfg: Config, tokens: np.ndarray, past: int) -> dict[str, np.ndarray]:
    """The per-step inputs (not the KV cache) for ``tokens`` ``[B, S]`` written after
    ``past`` cached tokens."""
    tokens = np.asarray(tokens, np.int64)
    b, s = tokens.shape
    if past + s > cfg.max_len:
        raise ValueError(f"{past + s} tokens exceed the KV cache ({cfg.max_len})")
    return {"input_ids": tokens,
            "position_ids": np.broadcast_to(np.arange(past, past + s, dtype=np.int64),
                                            (b, s)).copy(),
            "attn_mask": attn_mask(past, s, cfg.max_len),
            "write_index": np.full(cfg.n_head, past, np.int64)}


def empty_cache(cfg: Config, batch: int) -> dict[str, np.ndarray]:
    shape = cache_shape(cfg, batch)
    return {f"past_{k}_{i}": np.zeros(shape, np.float32)
            for i in range(cfg.n_layer) for k in ("key", "value")}


def prompt(cfg: Config, batch: int, length: int, seed: int = 7) -> np.ndarray:
    """A deterministic prompt ``[batch, length]`` of token ids."""
    return np.random.default_rng(seed).integers(0, cfg.vocab, (batch, length), np.int64)


# ------------------------------------------------------------------------- reference --
def greedy_decode(run: Any, cfg: Config, prompt_ids: np.ndarray, n_new: int
                  ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Prefill ``prompt_ids`` ``[B, P]`` then ``n_new - 1`` decode steps, each taking the
    argmax of the last position's logits; ``run(feeds) -> (logits, presents)`` runs one
    step of the graph (``presents`` in :func:`output_names` order without logits).
    Returns the ``n_new`` new tokens ``[B, n_new]`` and each step's last-position logits
    ``[B, V]`` (the one generating each token)."""
    b, p = prompt_ids.shape
    cache = empty_cache(cfg, b)
    names = [n for n in input_names(cfg) if n.startswith("past_")]
    out, step_logits = [], []
    tokens, past = np.asarray(prompt_ids, np.int64), 0
    for _ in range(n_new):
        logits, presents = run({**step_feeds(cfg, tokens, past), **cache})
        last = np.asarray(logits, np.float32)[:, -1, :]
        step_logits.append(last)
        nxt = np.argmax(last, axis=-1).astype(np.int64)
        out.append(nxt)
        past += tokens.shape[1]
        cache = dict(zip(names, presents, strict=True))
        tokens = nxt[:, None]
    return np.stack(out, axis=1), step_logits


def reference_decode(cfg: Config, w: dict[str, np.ndarray], prompt_ids: np.ndarray,
                     n_new: int, dtype: str = "fp32"
                     ) -> tuple[np.ndarray, list[np.ndarray]]:
    """:func:`greedy_decode` with ``onnx.reference.ReferenceEvaluator`` running the
    prefill graph, then the decode-step graph."""
    from onnx.reference import ReferenceEvaluator

    b, p = prompt_ids.shape
    evs = {s: ReferenceEvaluator(build(cfg, w, dtype, b, s)) for s in {p, 1}}
    outs = output_names(cfg)

    def run(feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        r = evs[feeds["input_ids"].shape[1]].run(outs, feeds)
        return r[0], list(r[1:])

    return greedy_decode(run, cfg, prompt_ids, n_new)


def numpy_logits(cfg: Config, w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """GPT-2's forward pass over the whole sequence ``ids`` ``[B, S]`` in float64 numpy,
    without a cache, in the textbook layout (heads concatenated): an independent check
    of the graph.  Returns ``[B, S, V]``."""
    def ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + LN_EPS) * g + b

    def gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    f8 = {k: v.astype(np.float64) for k, v in w.items()}
    bsz, s = ids.shape
    d, h, dh = cfg.d_model, cfg.n_head, cfg.d_head
    x = f8["wte"][ids] + f8["wpe"][np.arange(s)][None]
    causal = np.tril(np.ones((s, s), bool))
    for i in range(cfg.n_layer):
        p = f"L{i}."
        a = ln(x, f8[p + "ln1.g"], f8[p + "ln1.b"])
        # per-head weights back to GPT-2's [D, D] (heads side by side in the columns)
        qkv = [a @ f8[p + f"attn.W{n}"].transpose(1, 0, 2).reshape(d, d) for n in "qkv"]
        q, k, v = (y.reshape(bsz, s, h, dh).transpose(0, 2, 1, 3) for y in qkv)
        sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        sc = np.where(causal, sc, -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ctx = (pr @ v).transpose(0, 2, 1, 3).reshape(bsz, s, d)
        x = x + ctx @ f8[p + "attn.Wo"].reshape(d, d) + f8[p + "attn.bo"]
        m = ln(x, f8[p + "ln2.g"], f8[p + "ln2.b"])
        x = x + gelu(m @ f8[p + "mlp.W1"] + f8[p + "mlp.b1"]) @ f8[p + "mlp.W2"] + \
            f8[p + "mlp.b2"]
    x = ln(x, f8["lnf.g"], f8["lnf.b"])
    return np.asarray(x @ f8["wte"].T)


def flops_per_token(cfg: Config, context: int) -> int:
    """Matmul FLOPs of one token at attention span ``context`` (2 per MAC)."""
    d, f = cfg.d_model, cfg.d_ff
    per_layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * context * d
    return cfg.n_layer * per_layer + 2 * d * cfg.vocab
