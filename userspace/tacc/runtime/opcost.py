"""FLOPs and device-memory bytes of each inference command (docs/hardware.md section 14,
"FLOPs and bytes of a command"); their time is :func:`tacc.model.compute_ns`'s.  Only a
GEMM with bf16 A and B runs at the bf16 peak; every other command computes in fp32.
"""

from __future__ import annotations

# FLOPs per element of the row/element-wise commands (counted as the device counts them:
# one per add, multiply, compare, divide, exp or tanh).
FLOPS_PER_ELEM = {
    "softmax": 5,      # scale, max, subtract, exp, sum + one divide
    "layer_norm": 8,   # mean, subtract, square, sum, rsqrt-multiply, gamma, beta
    "rms_norm": 4,     # square, sum, rsqrt-multiply, gamma
    "gelu": 8,         # x^3, fma, tanh, add, 2 multiplies
    "silu": 4,         # negate, exp, add, divide
    "exp": 1,
    "add": 1,
    "mul": 1,
    "relu": 1,
    "scale": 1,
    "cast": 0,
    "gather": 0,
}


def gemm_cost(m: int, n: int, k: int, batch: int, in_size: int, out_size: int,
              bias: bool, beta: bool, b_shared: bool = False) -> tuple[int, int]:
    flops = 2 * m * n * k * batch + (m * n * batch if bias else 0)
    rd = batch * m * k * in_size + (1 if b_shared else batch) * k * n * in_size
    rd += batch * m * n * out_size if beta else 0
    rd += n * out_size if bias else 0
    return flops, rd + batch * m * n * out_size


def rows_cost(kind: str, elems: int, in_size: int, out_size: int, extra: int = 0
              ) -> tuple[int, int]:
    """Element-wise and per-row commands: ``extra`` bytes of vectors (gamma, beta, b)
    (docs/hardware.md section 14, "FLOPs and bytes of a command")."""
    return FLOPS_PER_ELEM[kind] * elems, elems * (in_size + out_size) + extra
