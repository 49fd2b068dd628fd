"""A link direction busy most of the time (docs/analysis.md)."""

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
    top_tags,
    window_edges,
)
from tacc.capture.schema import Opcode

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class LinkSaturationThresholds:
    # also read by h2d_d2h_imbalance and vf_contention: the window the link's use is
    # measured in
    window_ns: int = 1_000_000
    saturation_share: float = 0.85
    saturation_min_run_windows: int = 3
    saturation_min_total_ns: int = 10_000_000
    saturation_min_idle_share: float = 0.2


def link_saturation(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = window_edges(d, th)
    for pf, fids in links_of(d).items():
        fn = d.functions[fids[0]]
        comp = np.isin(d.cmds.fid, fids) & d.cmds.is_compute
        cbusy = window_amount(d.cmds.ts[comp], d.cmds.te[comp], d.cmds.dur[comp], edges)
        for op, dname in ((Opcode.COPY_H2D, "H2D"), (Opcode.COPY_D2H, "D2H")):
            m = direction_mask(d, fids, op)
            if not m.any():
                continue
            c = d.cmds.sel(m)
            bw = fn.max_bw(dname.lower())  # docs/hardware.md section 9, per direction
            if bw <= 0:
                continue  # the link is not known (gen or width 0): no capacity to fill
            cap_w = bw * th.window_ns / 1e9
            wb = window_amount(c.ts, c.te, c.bytes, edges)
            share = np.minimum(wb / cap_w, 1.0)
            sat = share >= th.saturation_share
            rs, re_ = runs(sat)
            keep = (re_ - rs) >= th.saturation_min_run_windows
            rs, re_ = rs[keep], re_[keep]
            total = int(np.sum(np.minimum(edges[re_], d.t1) - np.maximum(edges[rs], d.t0)))
            if total <= 0 or total < th.saturation_min_total_ns:
                continue
            mask = np.zeros(len(sat), bool)
            for a, b in zip(rs.tolist(), re_.tolist(), strict=True):
                mask[a:b] = True
            mid = (c.ts + c.te) // 2
            wi = np.clip((mid - d.t0) // th.window_ns, 0, len(mask) - 1)
            inside = mask[wi]
            by_f: dict[str, int] = {}
            for f in np.unique(c.fid[inside]).tolist():
                mm = inside & (c.fid == f)
                by_f[d.functions[f].pci] = int(c.bytes[mm].sum())
            by_q = {f"{d.functions[int(f)].pci} q{int(q)}": int(c.bytes[inside & (c.fid == f)
                                                                         & (c.queue == q)].sum())
                    for f, q in {(int(a), int(b)) for a, b in
                                 zip(c.fid[inside], c.queue[inside], strict=True)}}
            comp_share = float(np.clip(cbusy[mask].sum() / max(mask.sum() * th.window_ns, 1),
                                       0, 1))
            if not mask.any() or 1.0 - comp_share < th.saturation_min_idle_share:
                continue  # compute-bound anyway: the link is busy, not the bottleneck
            lost = int(total * (1.0 - comp_share))
            out.append(Finding(
                rule="link_saturation",
                title=f"PCIe {dname} saturated on {pf} for {total / 1e6:.1f} ms",
                time_ranges=clip_ranges(d, edges[rs], edges[re_], th),
                evidence={
                    "direction": dname, "link": pf,
                    "modelled_max_GBps": round(bw / 1e9, 3),
                    "saturated_ns": total,
                    "mean_share": float(share[mask].mean()),
                    "peak_share": float(share.max()),
                    "threshold_share": th.saturation_share,
                    "bytes_by_function": by_f, "bytes_by_queue": by_q,
                    "transfers": int(inside.sum()),
                    "top_tags": top_tags(d, c.tag[inside], c.bytes[inside].astype(np.float64)),
                    "api_calls": d.api_names(c.tag[inside]),
                    "compute_busy_share": comp_share,
                },
                time_lost_ns=lost,
                suggestion=(f"The {dname} link ran at >= {th.saturation_share:.0%} of its "
                            "modelled maximum while compute waited: move less data (keep "
                            "weights/activations resident on the device, reuse staged inputs, "
                            "use smaller dtypes) or spread transfers over time; queues shown "
                            "in bytes_by_queue compete for the same link."),
                functions=sorted(by_f),
            ))
    return out
