"""The decode benchmark's arithmetic (vm_decode.py, report.py, tests/host): the mode order
of each round, the per-mode summary with its ratio to untraced, and the modelled
device's roofline bound on tokens/s of a decode step.  No numpy, no device.

Roofline bound of a decode step at batch ``B`` (tacc.model's parameters, one command at
a time on one compute engine, docs/hardware.md "The roofline timing model"): the step
reads every matmul weight once (the LM head tied to the embedding: ``V d``), the small
fp32 weights (biases, LayerNorm), the ``B`` embedding rows and the KV cache up to the
attention span; it computes ``B x flops_per_token(span)``.  Its time is at least
``max(bytes / devmem-gbps, FLOPs / peak)``, so tokens/s <= ``B / that``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchstats import median_ci, ratio_ci

BASE = "untraced"


def rotations(modes: Sequence[str], rounds: int) -> list[list[str]]:
    """The mode order of each round: round ``r`` starts at mode ``r mod len(modes)``, so
    over ``len(modes)`` rounds every mode runs once at every position (first, ..., last),
    and a drift within a round reaches every mode alike.  The cyclic order stays: each
    mode follows the same mode (the one before it in ``modes``) in every round."""
    n = len(modes)
    return [list(modes[r % n:]) + list(modes[:r % n]) for r in range(rounds)] if n else []


def summarize(runs: dict[str, list[float]], base: str = BASE) -> list[dict[str, Any]]:
    """Per mode (the order of ``runs``): median, 95 % interval of the median, spread
    (min, max), ratio of medians to ``base`` (paired by round) with its 95 % interval."""
    ref = runs.get(base) or []
    rows = []
    for mode, xs in runs.items():
        if not xs:
            continue
        med, lo, hi = median_ci(xs)
        rat, rlo, rhi = ratio_ci(xs, ref) if ref else (0.0, 0.0, 0.0)
        rows.append({"mode": mode, "median": med, "ci": [lo, hi],
                     "spread": [min(xs), max(xs)],
                     "rel_spread": (max(xs) - min(xs)) / med if med else 0.0,
                     "ratio": rat, "ratio_ci": [rlo, rhi], "runs": list(xs),
                     "n": len(xs)})
    return rows


def step_cost(n_layer: int, d_model: int, vocab: int, batch: int, span: int,
              weight_bytes: int = 4, kv_bytes: int = 4) -> tuple[float, float]:
    """(device-memory bytes, FLOPs) of one decode step of a GPT-2-shaped model at
    ``batch`` sequences attending over ``span`` positions."""
    d, f = d_model, 4 * d_model
    mm = n_layer * (4 * d * d + 2 * d * f) + vocab * d  # matmul weights, LM head included
    small = n_layer * (d + f + d + 4 * d) + 2 * d  # biases and LayerNorms (fp32)
    kv = 2 * n_layer * batch * span * d * kv_bytes  # K and V read
    emb = 2 * batch * d * 4  # token and position rows
    flops = batch * (n_layer * (2 * (4 * d * d + 2 * d * f) + 4 * span * d) + 2 * d * vocab)
    return float(weight_bytes * mm + 4 * small + kv + emb), float(flops)


def roofline(n_layer: int, d_model: int, vocab: int, batch: int, span: int,
             peak_gflops: float, devmem_gbps: float, weight_bytes: int = 4,
             time_scale: float = 1.0) -> dict[str, float]:
    """The bound on tokens/s at ``batch`` (one token per sequence per step) and what
    sets it: ``memory_s`` and ``compute_s`` per step, ``bound``: the larger's name.
    ``time_scale``: the device's (``time-scale`` / 1000): every modelled duration is
    that many times longer on the guest clock, and the bound that many times lower."""
    nbytes, flops = step_cost(n_layer, d_model, vocab, batch, span, weight_bytes)
    mem_s = nbytes / (devmem_gbps * 1e9) * time_scale
    cmp_s = flops / (peak_gflops * 1e9) * time_scale
    t = max(mem_s, cmp_s)
    return {"batch": batch, "span": span, "bytes": nbytes, "flops": flops,
            "memory_s": mem_s, "compute_s": cmp_s, "step_s": t,
            "tokens_per_s": batch / t, "bound": "memory" if mem_s >= cmp_s else "compute"}


def mean_span(prompt: int, tokens: int) -> int:
    """The mean attention span over a run's decode steps (prompt + 1 .. prompt + tokens-1)."""
    return prompt + max(tokens, 1) // 2


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0
