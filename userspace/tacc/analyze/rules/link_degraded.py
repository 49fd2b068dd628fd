"""A link trained below its capability (docs/analysis.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, merged
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
    links_of,
    top_tags,
)
from tacc.capture.schema import Opcode
from tacc.model.link import D2H, H2D, LINK_RATE_GTS, copy_link_ps

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


def link_degraded(d: Data, th: Thresholds) -> list[Finding]:
    """A PF's link trained below what it is capable of (Link Status under Link
    Capabilities: a lower generation or fewer lanes, docs/hardware.md "Link faults").
    Time lost, per direction: the time the direction's copies (the PF's and its VFs')
    kept it busy (the union of their spans) x (1 - their modelled link time at the
    capable speed and width / at the negotiated ones); at most the copies' union."""
    out = []
    c = d.cmds
    by_fid = {f.fid: f for f in d.functions}
    for pf, fids in links_of(d).items():
        f = next((by_fid[i] for i in fids if by_fid[i].vf == 0), by_fid[fids[0]])
        known = f.gen in LINK_RATE_GTS and f.width > 0 and f.max_gen in LINK_RATE_GTS
        if not known or (f.gen >= f.max_gen and f.width >= f.max_width):
            continue
        m = np.isin(c.fid, fids) & (c.bytes > 0) & (
            (c.opcode == Opcode.COPY_H2D) | (c.opcode == Opcode.COPY_D2H))
        s = c.sel(m)
        lost, dirs = 0, {}
        for op, kind in ((Opcode.COPY_H2D, H2D), (Opcode.COPY_D2H, D2H)):
            k = s.opcode == op
            if not k.any():
                continue
            sizes, counts = np.unique(s.bytes[k], return_counts=True)
            now = cap = 0
            for n, cnt in zip(sizes.tolist(), counts.tolist(), strict=True):
                now += cnt * copy_link_ps(kind, n, f.gen, f.width, f.mps, f.mrrs, f.rcb)
                cap += cnt * copy_link_ps(kind, n, f.max_gen, f.max_width, f.mps, f.mrrs,
                                          f.rcb)
            st, en = merged(s.ts[k], s.te[k])
            busy = int((en - st).sum())
            dirs[kind] = {"busy_ns": busy, "capable_link_share": cap / max(now, 1)}
            lost += int(busy * (1 - cap / max(now, 1)))
        st, en = merged(s.ts, s.te)
        lost = min(lost, int((en - st).sum()))
        if lost < th.min_time_lost_ns:
            continue
        ratio = (LINK_RATE_GTS[f.gen] * f.width) / (LINK_RATE_GTS[f.max_gen] * f.max_width)
        out.append(Finding(
            rule="link_degraded",
            title=(f"{pf}: link trained at Gen{f.gen} x{f.width}, capable of "
                   f"Gen{f.max_gen} x{f.max_width}"),
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"negotiated": {"gen": f.gen, "width": f.width},
                      "capable": {"gen": f.max_gen, "width": f.max_width},
                      "raw_bandwidth_ratio": ratio, "directions": dirs,
                      "affected_transfers": len(s), "affected_bytes": int(s.bytes.sum()),
                      "top_tags": top_tags(d, s.tag, s.bytes.astype(np.float64)),
                      "api_calls": d.api_names(s.tag)},
            time_lost_ns=lost,
            suggestion=("The link trained below its capability (a lane or speed fault, a "
                        "slot wired narrower, or retraining after errors): compare lspci "
                        "LnkSta with LnkCap and check the AER counters, reseat or move the "
                        "card; /sys/bus/pci/devices/.../current_link_speed and "
                        "current_link_width show the negotiated link."),
            functions=[by_fid[i].pci for i in fids],
        ))
    return out
