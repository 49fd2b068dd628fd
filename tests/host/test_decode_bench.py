"""The decode benchmark's arithmetic (tools/bench/decodestats.py): the rotated mode order,
the per-mode summary and ratios, and the roofline bound on tokens/s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import decodestats  # noqa: E402
from decodestats import mean_span, roofline, rotations, step_cost, summarize  # noqa: E402
from tacc import model  # noqa: E402
from tacc.models import gpt2  # noqa: E402

MODES = ["untraced", "taccd", "taccd-jobs", "perf", "bpftrace"]


def test_rotations_put_every_mode_at_every_position() -> None:
    rs = rotations(MODES, 9)
    assert len(rs) == 9
    assert rs[0] == MODES and rs[1] == MODES[1:] + MODES[:1] and rs[5] == MODES
    for r in rs:
        assert sorted(r) == sorted(MODES)
    for pos in range(len(MODES)):  # 5 rounds: each mode once at each position
        assert sorted(r[pos] for r in rs[:5]) == sorted(MODES)
    # a rotation keeps the cyclic order: each mode always follows the same one
    follows = {(r[i - 1], r[i]) for r in rs for i in range(1, len(r))}
    assert follows == {(MODES[i - 1], MODES[i]) for i in range(len(MODES))}
    assert rotations([], 3) == [] and rotations(MODES, 0) == []


def test_summary_ratios_paired_by_round() -> None:
    base = [10.0, 11.0, 9.0, 10.5, 9.5, 10.0, 10.2, 9.8, 10.1]
    runs = {"untraced": base, "taccd": [x * 0.98 for x in base],
            "perf": [x * 0.9 for x in base], "bpftrace": []}
    rows = {r["mode"]: r for r in summarize(runs)}
    assert set(rows) == {"untraced", "taccd", "perf"}  # a mode without runs is left out
    u = rows["untraced"]
    assert u["median"] == 10.0 and u["ratio"] == 1.0 and u["n"] == 9
    assert u["ci"] == [9.5, 10.5]  # n = 9: ranks 2 and 8
    assert u["spread"] == [9.0, 11.0] and u["rel_spread"] == pytest.approx(0.2)
    assert rows["taccd"]["ratio"] == pytest.approx(0.98)
    assert rows["taccd"]["ratio_ci"] == pytest.approx([0.98, 0.98])  # drift cancels
    assert rows["perf"]["ratio"] == pytest.approx(0.9)
    assert [r["mode"] for r in summarize(runs)] == ["untraced", "taccd", "perf"]
    assert summarize({"taccd": [1.0]})[0]["ratio"] == 0.0  # no base: no ratio


def test_step_cost_matches_the_model_flops() -> None:
    c = gpt2.get_config("gpt2")
    span = 10
    nbytes, flops = step_cost(c.n_layer, c.d_model, c.vocab, 8, span)
    assert flops == 8 * gpt2.flops_per_token(c, span)
    # every parameter but the embedding tables once (the LM head is the tied embedding),
    # plus the KV cache and the gathered rows
    d = c.d_model
    weights = c.n_params() - c.n_pos * d
    kv = 2 * c.n_layer * 8 * span * d * 4
    assert nbytes == 4 * weights + kv + 2 * 8 * d * 4
    assert 4 * weights == pytest.approx(497e6, rel=0.01)  # GPT-2 small: 124 M fp32 params


def test_roofline_bound_gpt2() -> None:
    c = gpt2.get_config("gpt2")
    p = model.DEFAULT
    kw = {"n_layer": c.n_layer, "d_model": c.d_model, "vocab": c.vocab,
          "peak_gflops": p.peak_gflops["fp32"], "devmem_gbps": p.devmem_gbps}
    b1 = roofline(batch=1, span=7, **kw)
    b8 = roofline(batch=8, span=7, **kw)
    assert b1["bound"] == b8["bound"] == "memory"  # decode GEMVs: under the fp32 ridge
    assert b1["step_s"] == pytest.approx(b1["bytes"] / 300e9)
    assert b1["tokens_per_s"] == pytest.approx(1 / b1["step_s"])
    assert 590 < b1["tokens_per_s"] < 610  # ~497 MB at 300 GB/s: ~1.66 ms per step
    assert b8["tokens_per_s"] == pytest.approx(8 * b1["tokens_per_s"], rel=0.01)
    big = roofline(batch=256, span=7, **kw)  # 2 FLOP per 4-byte weight per sequence
    assert big["bound"] == "compute"
    assert big["tokens_per_s"] == pytest.approx(256 / (big["flops"] / 7575e9))
    assert mean_span(4, 6) == 7 and mean_span(8, 1) == 8
    assert decodestats.median([3.0, 1.0, 2.0]) == 2.0 and decodestats.median([]) == 0.0
