"""Derived metrics and the shared link formula (docs/hardware.md, Timing model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tacc.counters import LinkInfo, deltas, derive
from tacc.model.link import link_max_payload_bw

GEN4X16 = LinkInfo(gen=4, width=16, mps=256)


def test_link_formula_per_direction() -> None:
    raw = 16 * 16e9 * 128 / 130 / 8
    assert raw / 1e9 == pytest.approx(31.51, abs=0.005)  # hardware.md: Gen4 x16
    skp = 370 / 371  # one SKP ordered set per 370 blocks (hw 1.2)
    # H2D: 64 B completions (the root port's RCB), 20 B each, + the root port's ACK and
    # UpdateFC DLLPs for the requests (1 each per 4 requests of 512 B: 4 B per 512 B)
    assert GEN4X16.max_bw("h2d") == pytest.approx(raw * skp * 512 / (512 + 8 * 20 + 4),
                                                  rel=1e-4)
    assert GEN4X16.max_bw("d2h") == pytest.approx(raw * skp * 256 / 280, rel=1e-4)
    # the capture module's function is the same one (default = the lower direction)
    assert link_max_payload_bw(4, 16, 256) == GEN4X16.max_bw("h2d")
    assert LinkInfo(0, 0, 256).max_bw("h2d") == 0.0


def test_copy_metrics() -> None:
    size = 16 << 20
    tlps = size // 256
    d = {"h2d_bytes": size, "h2d_link_bytes": size + 20 * tlps, "busy_dma_h2d": 591_000,
         "tlb_hits": 90, "tlb_misses": 10, "busy_compute0": 500_000, "d2h_bytes": 0}
    m = derive(d, 0.001, GEN4X16, level={"queue0_depth_hwm": 64})
    assert m["h2d_gbps"] == pytest.approx(size / 1e-3 / 1e9)
    assert m["h2d_engine_gbps"] == pytest.approx(size / 591e-6 / 1e9)
    assert m["h2d_tlp_efficiency"] == pytest.approx(256 / 276)
    assert m["util_compute0"] == pytest.approx(0.5)
    assert m["util_dma_h2d"] == pytest.approx(0.591)
    assert m["tlb_hit_rate"] == pytest.approx(0.9)
    assert m["queue0_occupancy_hwm"] == pytest.approx(0.25)
    assert m["h2d_link_share"] == pytest.approx(size / 1e-3 / GEN4X16.max_bw("h2d"))
    assert math.isnan(m["d2h_tlp_efficiency"])  # no traffic: undefined, not 0 or inf


def test_columns_and_wraparound() -> None:
    names = ["h2d_bytes", "queue0_depth_hwm"]
    before = np.array([[2**64 - 10, 5], [100, 7]], dtype=np.uint64)
    after = np.array([[5, 6], [300, 3]], dtype=np.uint64)
    d = deltas(names, before, after)
    assert list(d["h2d_bytes"]) == [15, 200]  # u64 wrap
    assert list(d["queue0_depth_hwm"]) == [6, 3]  # a level: the value after
    m = derive(d, np.array([1.0, 2.0]), GEN4X16)
    assert list(m["h2d_gbps"]) == pytest.approx([15e-9, 100e-9])
