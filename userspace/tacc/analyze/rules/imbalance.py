"""One link direction carries most of the bytes while the other idles (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, runs, window_amount
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
    direction_mask,
    links_of,
    window_edges,
)
from tacc.capture.schema import Opcode

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class ImbalanceThresholds:
    imbalance_light_ratio: float = 0.05


def imbalance(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = window_edges(d, th)
    for pf, fids in links_of(d).items():
        fn = d.functions[fids[0]]
        h = d.cmds.sel(direction_mask(d, fids, Opcode.COPY_H2D))
        g = d.cmds.sel(direction_mask(d, fids, Opcode.COPY_D2H))
        hb, gb = int(h.bytes.sum()), int(g.bytes.sum())
        heavy, light, name = (h, g, "H2D") if hb >= gb else (g, h, "D2H")
        hbytes, lbytes = max(hb, gb), min(hb, gb)
        bw = fn.max_bw(name.lower())
        cap_w = bw * th.window_ns / 1e9
        if hbytes == 0 or lbytes > th.imbalance_light_ratio * hbytes:
            continue
        share = np.minimum(window_amount(heavy.ts, heavy.te, heavy.bytes, edges) / cap_w, 1.0)
        sat = share >= th.saturation_share
        rs, re_ = runs(sat)
        keep = (re_ - rs) >= th.saturation_min_run_windows
        total = int(np.sum((re_ - rs)[keep])) * th.window_ns
        if total < th.saturation_min_total_ns:
            continue
        lost = int((hbytes - lbytes) / 2 / bw * 1e9)
        lost = min(lost, total)
        out.append(Finding(
            rule="h2d_d2h_imbalance",
            title=f"{name} carries {hbytes / max(lbytes, 1):.0f}x the opposite direction on {pf}",
            time_ranges=clip_ranges(d, edges[rs[keep]], edges[re_[keep]], th),
            evidence={"link": pf, "heavy_direction": name, "heavy_bytes": hbytes,
                      "light_bytes": lbytes, "heavy_saturated_ns": total,
                      "api_calls": d.api_names(heavy.tag)},
            time_lost_ns=lost,
            suggestion=(f"The link is full duplex but only {name} is busy: the other "
                        "direction has idle capacity. Keep results on the device or move "
                        f"work so less data crosses {name} (upper bound of the saving: half "
                        "the difference at the link maximum)."),
            functions=[d.functions[f].pci for f in fids],
        ))
    return out
