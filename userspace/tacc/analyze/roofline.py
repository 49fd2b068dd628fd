"""Commands on the device's roofline: what the memory_bound and precision rules and the
HTML report's roofline chart share.  Version-3 trace records carry each command's FLOPs
and device-memory bytes (capture minor 12); the device's peaks are the capture's
(meta ``devices[]``), tacc.model's defaults where it reports none.  Device time is
tacc.model's (``compute_ns``), stretched by the function's time scale."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import isqrt

import numpy as np

from tacc import hw, model
from tacc.analyze.data import Cmds, Data
from tacc.capture.devinfo import Function
from tacc.capture.schema import Opcode

# the inference operations (a compute engine's work with FLOPs and bytes); D2D copies and
# control commands are not on the roofline
ROOF_OPS = (Opcode.GEMM, Opcode.ELTWISE, Opcode.SOFTMAX, Opcode.NORM, Opcode.GATHER)
DT_SIZE = {hw.TACC_DT_FP32: 4, hw.TACC_DT_BF16: 2, hw.TACC_DT_I32: 4}


def on_roof(c: Cmds, fid: int | None = None) -> np.ndarray:
    """Commands of version-3 records that the roofline places (of function ``fid``)."""
    m = (c.ver >= 3) & np.isin(c.opcode, [int(o) for o in ROOF_OPS]) & ((c.rd + c.wr) > 0)
    return m if fid is None else m & (c.fid == fid)


def per_function(d: Data) -> Iterator[tuple[Function, Cmds]]:
    """Each function with commands on the roofline, and those commands."""
    for f in d.functions:
        m = on_roof(d.cmds, f.fid)
        if m.any():
            yield f, d.cmds.sel(m)


def is_bf16_gemm(c: Cmds) -> np.ndarray:
    """Commands timed at the bf16 peak: GEMMs with bf16 A and B (every other command
    computes in fp32, docs/hardware.md "The roofline timing model")."""
    return (c.opcode == Opcode.GEMM) & (c.dtype == hw.TACC_DT_BF16)


def intensity(c: Cmds) -> np.ndarray:
    """FLOP per device-memory byte."""
    return c.flops / np.maximum(c.rd + c.wr, 1)


def ridge(f: Function, c: Cmds) -> np.ndarray:
    """Each command's ridge point on ``f``: the peak of its dtype over the bandwidth."""
    return np.where(is_bf16_gemm(c), f.ridge("bf16"), f.ridge("fp32"))


def model_ns(f: Function, flops: float, nbytes: float, dtype: str) -> float:
    """tacc.model's engine time of a command on ``f``, in the capture's time (scaled)."""
    return model.compute_ns(flops, nbytes, dtype, f.model_params()) * f.time_scale


@dataclass(frozen=True)
class GemmShape:
    """A GEMM's ``C[m, n] = A[m, k] B[k, n]`` (batch 1) as its record's FLOPs and bytes
    give it; ``n`` the weights' side: B is the larger operand (``k n >= m k``) unless the
    bias (``n`` values) says which is which."""

    m: int
    n: int
    k: int
    s_ab: int
    s_c: int
    bias: bool

    @property
    def weight_bytes(self) -> int:
        return self.k * self.n * self.s_ab

    @property
    def act_elems(self) -> int:
        return self.m * self.k


def gemm_shape(flops: int, rd: int, wr: int, s_ab: int, bias: bool) -> GemmShape | None:
    """Solve a batch-1 GEMM's ``m, n, k`` from its record (docs/hardware.md "FLOPs and
    bytes of a command": ``flops = 2mnk (+ mn with BIAS)``, read ``(mk + kn) s_ab (+ n
    s_c)``, written ``mn s_c``), the output size ``s_c`` 4 or 2 whichever solves exactly.
    None when none does: a batched GEMM (attention over heads), one accumulating into C
    (beta != 0), or a B operand shared by a batch."""
    for s_c in (4, 2):
        if wr <= 0 or wr % s_c:
            continue
        x = wr // s_c  # m n
        num = flops - (x if bias else 0)
        if num <= 0 or num % (2 * x):
            continue
        k = num // (2 * x)
        # (k s_ab + bias s_c) n^2 - rd n + x k s_ab = 0
        a = k * s_ab + (s_c if bias else 0)
        disc = rd * rd - 4 * a * x * k * s_ab
        if disc < 0:
            continue
        r = isqrt(disc)
        if r * r != disc:
            continue
        for top in (rd + r, rd - r):
            if top <= 0 or top % (2 * a):
                continue
            n = top // (2 * a)
            if x % n:
                continue
            m = x // n
            if not bias and m * k > k * n:
                m, n = n, m
            return GemmShape(m, n, k, s_ab, s_c, bias)
    return None


def shape_of(c: Cmds, i: int) -> GemmShape | None:
    if int(c.opcode[i]) != Opcode.GEMM:
        return None
    return gemm_shape(int(c.flops[i]), int(c.rd[i]), int(c.wr[i]),
                      DT_SIZE.get(int(c.dtype[i]), 4),
                      bool(int(c.subop[i]) & hw.TACC_GEMM_F_BIAS))


def batch_to_ridge(s: GemmShape, ridge_fpb: float) -> int | None:
    """Rows (multiples of ``m``) at which the GEMM, its weights read once, reaches the
    ridge: ``2 b m n k >= R ((b m k + k n) s_ab + b m n s_c)``; None when the output's and
    activations' bytes alone keep it below (it never does)."""
    den = s.m * (2 * s.n * s.k - ridge_fpb * (s.k * s.s_ab + s.n * s.s_c))
    if den <= 0:
        return None
    return int(np.ceil(ridge_fpb * s.k * s.n * s.s_ab / den)) * s.m
