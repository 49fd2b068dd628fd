"""Derived metrics from counter differences (docs/counters.md, "Derived metrics").

Works on scalars (``tacc stat``) and on numpy columns (a sampled stream, one value per
interval).  The link maximum is ``tacc.model.link.link_max_payload_bw``: the one
implementation of docs/hardware.md's bandwidth formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tacc.model.link import link_max_payload_bw

ENGINES = ("dma_h2d", "dma_d2h", "compute0", "compute1", "compute2", "compute3")
QUEUES = 4
HWM_SUFFIX = "_depth_hwm"

Num = float | np.ndarray


def is_level(name: str) -> bool:
    """Counters that are levels (high-water marks), not running totals."""
    return name.endswith(HWM_SUFFIX)


@dataclass(frozen=True)
class LinkInfo:
    gen: int
    width: int
    mps: int
    clock_hz: float = 1e9
    sq_entries: int = 256
    time_scale: float = 1.0  # the device's modelled-time factor (docs/hardware.md)

    def max_bw(self, direction: str) -> float:
        """Modelled max payload bytes/s of one direction of the negotiated link."""
        if not self.gen or not self.width:
            return 0.0
        return link_max_payload_bw(self.gen, self.width, self.mps, direction) / self.time_scale


def _ratio(a: Num, b: Num) -> Num:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)
    return float(r) if r.ndim == 0 else r


def derive(delta: Mapping[str, Num], dt_s: Num, link: LinkInfo,
           level: Mapping[str, Num] | None = None) -> dict[str, Num]:
    """Metrics of one interval (or one per interval for columns).

    ``delta``: counter differences over the interval; ``dt_s``: its length in seconds;
    ``level``: values at the end of the interval (for the high-water marks).
    """

    def d(name: str) -> Num:
        return delta.get(name, 0)

    out: dict[str, Num] = {}
    ticks = np.asarray(dt_s, dtype=np.float64) * link.clock_hz
    for dirn in ("h2d", "d2h"):
        bw = _ratio(d(f"{dirn}_bytes"), dt_s)
        out[f"{dirn}_gbps"] = bw / 1e9
        mx = link.max_bw(dirn)
        out[f"{dirn}_link_share"] = bw / mx if mx else np.nan
        out[f"{dirn}_link_gbps"] = _ratio(d(f"{dirn}_link_bytes"), dt_s) / 1e9
        # bandwidth while the engine was busy: what device timestamps would show
        out[f"{dirn}_engine_gbps"] = _ratio(d(f"{dirn}_bytes"),
                                            np.asarray(d(f"busy_dma_{dirn}"), np.float64)
                                            / link.clock_hz) / 1e9
        out[f"{dirn}_tlp_efficiency"] = _ratio(d(f"{dirn}_bytes"), d(f"{dirn}_link_bytes"))
    for eng in ENGINES:
        out[f"util_{eng}"] = _ratio(d(f"busy_{eng}"), ticks)
    out["tlb_hit_rate"] = _ratio(d("tlb_hits"), np.asarray(d("tlb_hits"), np.float64)
                                 + np.asarray(d("tlb_misses"), np.float64))
    out["link_stall_share"] = _ratio(d("link_stall_ticks"), ticks)
    if level is not None:
        for q in range(QUEUES):
            name = f"queue{q}{HWM_SUFFIX}"
            if name in level:
                out[f"queue{q}_occupancy_hwm"] = _ratio(level[name], link.sq_entries)
    if "link_h2d_busy_ticks" in delta:
        out["link_h2d_busy"] = _ratio(d("link_h2d_busy_ticks"), ticks)
        out["link_d2h_busy"] = _ratio(d("link_d2h_busy_ticks"), ticks)
        for dirn in ("h2d", "d2h"):
            mx = link.max_bw(dirn)
            out[f"link_{dirn}_share_all"] = (_ratio(d(f"link_{dirn}_payload"), dt_s) / mx
                                             if mx else np.nan)
    return out


def deltas(names: list[str], before: np.ndarray, after: np.ndarray) -> dict[str, Num]:
    """after - before per counter (levels: the value after), wrap-safe in u64."""
    out: dict[str, Num] = {}
    for i, n in enumerate(names):
        a = np.asarray(after[..., i], dtype=np.uint64)
        b = np.asarray(before[..., i], dtype=np.uint64)
        v = a if is_level(n) else a - b
        out[n] = int(v) if v.ndim == 0 else v
    return out
