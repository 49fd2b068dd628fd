"""What the device's inference operations compute, in numpy (the specification in code).

The simulator backend executes device commands with these functions, ``tacc.onnx`` runs a
node on the host with them when asked (``fallback="cpu"``), and the tests compare the
device's results with them.  Every function takes and returns numpy arrays; bf16 is
``ml_dtypes.bfloat16`` (:data:`BF16`).  Arithmetic is fp32 whatever the storage dtype
(bf16 operands are widened, results rounded to the output dtype once, to nearest even).
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32 = np.dtype(np.float32)
GELU_C = np.float32(np.sqrt(2.0 / np.pi))  # tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))


def is_bf16(dtype: Any) -> bool:
    """Whether ``dtype`` is bfloat16, without importing ml_dtypes (an array of it has)."""
    return np.dtype(dtype).name == "bfloat16"


def __getattr__(name: str) -> Any:
    """:data:`BF16` on first use: importing ml_dtypes costs ~10 s of guest time under TCG,
    so the runtime's users that never touch bfloat16 do not pay it."""
    if name != "BF16":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import ml_dtypes

    globals()["BF16"] = bf16 = np.dtype(ml_dtypes.bfloat16)
    return bf16


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(F32, copy=False)


def gemm(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, c: np.ndarray | None = None,
         bias: np.ndarray | None = None, out_dtype: np.dtype = F32) -> np.ndarray:
    """``alpha * op(a) @ op(b) + beta * c + bias`` per batch, fp32 accumulation.

    ``a``: (batch, M, K) (or (batch, K, M) with ``trans_a``), ``b``: (batch, K, N) (or
    (batch, N, K)); a batch of 1 broadcasts.  ``bias``: a row vector of N, added to every row.
    """
    x, y = f32(a), f32(b)
    if trans_a:
        x = np.swapaxes(x, -1, -2)
    if trans_b:
        y = np.swapaxes(y, -1, -2)
    r = np.matmul(x, y)
    if alpha != 1.0:
        r = r * np.float32(alpha)
    if beta != 0.0 and c is not None:
        r = r + np.float32(beta) * f32(c)
    if bias is not None:
        r = r + f32(bias).reshape(-1)
    return r.astype(out_dtype)


def softmax(x: np.ndarray, *, scale: float = 1.0, causal: bool = False, pos_offset: int = 0,
            out_dtype: np.dtype = F32) -> np.ndarray:
    """Softmax over the last axis of ``scale * x``.

    ``causal``: in each (..., R, C) matrix, row ``i`` sees columns ``j <= i + pos_offset``
    only (the others are 0): row i is the query at position ``pos_offset + i``.  A row
    that sees no column is all zeros.
    """
    v = f32(x) * np.float32(scale)
    if causal:
        rows, cols = v.shape[-2], v.shape[-1]
        keep = np.arange(cols)[None, :] <= np.arange(rows)[:, None] + int(pos_offset)
        v = np.where(keep, v, -np.inf)
    m = np.max(v, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    e = np.exp(v - m)
    s = np.sum(e, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(s > 0, e / s, np.float32(0))
    return r.astype(out_dtype)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, *,
               eps: float = 1e-5, out_dtype: np.dtype = F32) -> np.ndarray:
    """Normalises each row (last axis): ``(x - mean) / sqrt(var + eps) * gamma + beta``."""
    v = f32(x)
    mean = np.mean(v, axis=-1, keepdims=True)
    d = v - mean
    var = np.mean(d * d, axis=-1, keepdims=True)
    r = d / np.sqrt(var + np.float32(eps)) * f32(gamma)
    if beta is not None:
        r = r + f32(beta)
    return r.astype(out_dtype)


def rms_norm(x: np.ndarray, gamma: np.ndarray, *, eps: float = 1e-5,
             out_dtype: np.dtype = F32) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * gamma`` over each row (last axis)."""
    v = f32(x)
    r = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + np.float32(eps)) * f32(gamma)
    return r.astype(out_dtype)


def norm_stats(x: np.ndarray, kind: str, *, eps: float = 1e-5) -> np.ndarray:
    """NORM's row statistics, float32: layer_norm each row's mean then each row's
    ``1 / sqrt(var + eps)`` (2 x rows); rms_norm ``1 / sqrt(mean(x^2) + eps)`` (rows)."""
    v = f32(x).reshape(-1, x.shape[-1])
    mean = np.mean(v, axis=-1) if kind == "layer_norm" else np.zeros(len(v), F32)
    d = v - mean[:, None]
    inv = (np.float32(1) / np.sqrt(np.mean(d * d, axis=-1) + np.float32(eps))).astype(F32)
    return np.concatenate([mean.astype(F32), inv]) if kind == "layer_norm" else inv


def gelu(x: np.ndarray, out_dtype: np.dtype = F32) -> np.ndarray:
    """GELU, tanh form."""
    v = f32(x)
    r = np.float32(0.5) * v * (np.float32(1) + np.tanh(GELU_C * (v + np.float32(0.044715)
                                                                  * v * v * v)))
    return r.astype(out_dtype)


def silu(x: np.ndarray, out_dtype: np.dtype = F32) -> np.ndarray:
    v = f32(x)
    with np.errstate(over="ignore"):
        r = v / (np.float32(1) + np.exp(-v))
    return r.astype(out_dtype)


def exp(x: np.ndarray, out_dtype: np.dtype = F32) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(f32(x)).astype(out_dtype)


def binary(op: str, a: np.ndarray, b: np.ndarray, out_dtype: np.dtype = F32) -> np.ndarray:
    """``a + b`` or ``a * b``; ``b`` is ``a``'s shape or a row vector (its last axis)."""
    x, y = f32(a), f32(b)
    if y.size != x.size:
        y = y.reshape(-1)
    else:
        y = y.reshape(x.shape)
    r = x + y if op == "add" else x * y
    return r.astype(out_dtype)


def cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """fp32 <-> bf16, round to nearest even (ml_dtypes' conversion)."""
    return np.asarray(x).astype(dtype)


def gather(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rows of ``table`` (V, D) by ``idx`` (N,), int32 or int64, each in [0, V)."""
    i = np.asarray(idx).reshape(-1).astype(np.int64)
    if i.size and (i.min() < 0 or i.max() >= table.shape[0]):
        raise IndexError(f"gather: index out of [0, {table.shape[0]})")
    return table[i]
