"""The timeline's link power-state tracks: from the PF's global link
PM counters (capture minor 8), per counter-sample interval."""

from __future__ import annotations

import numpy as np
from tacc.capture.schema import COUNTERS_DTYPE
from tacc.timeline.model import link_pm_series


def _samples(l0s: list[int], l1: list[int], exits: list[int]) -> np.ndarray:
    s = np.zeros(len(l1), COUNTERS_DTYPE)
    s["g_link_l0s_ticks"], s["g_link_l1_ticks"], s["g_link_l1_exits"] = l0s, l1, exits
    return s


def test_shares_of_each_interval_and_exits() -> None:
    s = _samples([0, 100, 100, 100], [0, 0, 60_000, 60_500], [0, 0, 0, 1])
    ok = np.ones(3, bool)
    dt = np.full(3, 100_000.0)
    got = {name: (unit, vals.tolist()) for name, unit, vals in link_pm_series(s, ok, dt)}
    assert got == {"link in L1 %": ("%", [0.0, 60.0, 0.5]),
                   "link in L0s %": ("%", [0.1, 0.0, 0.0]),
                   "link L1 exits": ("exits", [0.0, 0.0, 1.0])}


def test_no_tracks_when_the_link_never_left_l0() -> None:
    s = _samples([0, 0, 0], [0, 0, 0], [0, 0, 0])
    assert link_pm_series(s, np.ones(2, bool), np.full(2, 1e5)) == []
    old = np.zeros(3, [("devclk", "<u8"), ("h2d_bytes", "<u8")])  # before minor 8
    assert link_pm_series(old, np.ones(2, bool), np.full(2, 1e5)) == []


def test_l1_substate_shares_when_the_link_used_them() -> None:
    """Capture minor 10: L1.1 / L1.2 residency (parts of L1's) as their own share tracks,
    only for a substate the link was in; a minor-8 capture (no such columns) has none."""
    s = _samples([0, 0, 0], [0, 50_000, 100_000], [0, 1, 2])
    s["g_link_l12_ticks"] = [0, 40_000, 90_000]
    got = {name: vals.tolist() for name, _, vals in
           link_pm_series(s, np.ones(2, bool), np.full(2, 100_000.0))}
    assert got["link in L1.2 %"] == [40.0, 50.0] and got["link in L1 %"] == [50.0, 50.0]
    assert "link in L1.1 %" not in got
    s["g_link_l11_ticks"] = [0, 10_000, 15_000]  # and in L1.1 for the rest of L1
    got = {name: vals.tolist() for name, _, vals in
           link_pm_series(s, np.ones(2, bool), np.full(2, 100_000.0))}
    assert got["link in L1.1 %"] == [10.0, 5.0] and got["link in L1.2 %"] == [40.0, 50.0]
    names = [n for n in COUNTERS_DTYPE.names if n not in ("g_link_l11_ticks",
                                                          "g_link_l12_ticks")]
    old = np.zeros(3, [(n, COUNTERS_DTYPE[n]) for n in names])
    old["g_link_l1_ticks"] = [0, 50_000, 100_000]
    assert [n for n, _, _ in link_pm_series(old, np.ones(2, bool), np.full(2, 1e5))] == [
        "link in L1 %", "link in L0s %", "link L1 exits"]
