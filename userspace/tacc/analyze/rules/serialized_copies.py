"""Copies that could overlap compute run one after another (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, union_by_group
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
)

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class SerializedCopiesThresholds:
    serial_class_share: float = 0.10
    serial_lost_share: float = 0.15
    serial_wait_share: float = 0.3
    phase_gap_ns: int = 2_000_000


def serialized_copies(d: Data, th: Thresholds) -> list[Finding]:
    """Evaluated per phase (busy stretches separated by >= phase_gap_ns of idle)."""
    out = []
    c = d.cmds
    for f in d.functions:
        s = c.sel(c.fid == f.fid)
        if len(s) == 0:
            continue
        s = s.sel(np.argsort(s.ts, kind="stable"))
        run_end = np.maximum.accumulate(s.te)
        ph = np.cumsum(np.r_[True, s.ts[1:] - run_end[:-1] >= th.phase_gap_ns]) - 1
        nph = int(ph[-1]) + 1
        is_copy = s.is_copy
        is_comp = s.is_compute
        u = union_by_group(ph, s.ts, s.te, nph)
        bc = union_by_group(ph[is_copy], s.ts[is_copy], s.te[is_copy], nph)
        bk = union_by_group(ph[is_comp], s.ts[is_comp], s.te[is_comp], nph)
        e0, e1 = s.engine == 0, s.engine == 1
        h2d = union_by_group(ph[e0], s.ts[e0], s.te[e0], nph)
        d2h = union_by_group(ph[e1], s.ts[e1], s.te[e1], nph)
        lost = u - np.maximum(np.maximum(h2d, d2h), bk)
        # commands that were ready while a command of the other class ran before them on
        # the same queue: the overlap was possible and not taken
        # (classes: 1 copy, 2 compute; timestamps and fences (0) belong to neither)
        o = np.lexsort((s.ts, s.queue))
        cls = np.where(is_copy, 1, np.where(is_comp, 2, 0))[o]
        q, ts, te, tf = s.queue[o], s.ts[o], s.te[o], s.tf[o]
        prev_end = np.r_[0, te[:-1]]
        prev_cls = np.r_[0, cls[:-1]]
        waited = (np.r_[False, q[1:] == q[:-1]] & (cls > 0) & (prev_cls > 0)
                  & (prev_cls != cls) & (tf < prev_end) & (ts >= prev_end))
        nwait = np.bincount(ph[o][waited], minlength=nph)
        ncmd = np.bincount(ph, minlength=nph)
        ok = ((np.minimum(bc, bk) >= th.serial_class_share * u)
              & (lost >= th.serial_lost_share * u) & (nwait >= th.serial_wait_share * ncmd))
        total_lost = int(lost[ok].sum())
        if not ok.any() or total_lost < th.min_time_lost_ns:
            continue
        pst = np.zeros(nph, np.int64)
        pen = np.zeros(nph, np.int64)
        first = np.r_[True, ph[1:] != ph[:-1]]
        pst[ph[first]] = s.ts[first]
        np.maximum.at(pen, ph, s.te)
        tags = s.tag[o][waited & ok[ph[o]]]
        U, C, K = int(u[ok].sum()), int(bc[ok].sum()), int(bk[ok].sum())
        out.append(Finding(
            rule="serialized_copies",
            title=f"copies serialized with compute on {f.pci}",
            time_ranges=clip_ranges(d, pst[ok], pen[ok], th),
            evidence={"busy_union_ns": U, "copy_busy_ns": C, "compute_busy_ns": K,
                      "overlap_ns": C + K - U, "possible_overlap_ns": min(C, K),
                      "h2d_busy_ns": int(h2d[ok].sum()), "d2h_busy_ns": int(d2h[ok].sum()),
                      "commands_waiting_on_other_class": int(nwait[ok].sum()),
                      "queues_used": sorted({int(x) for x in np.unique(s.queue[ok[ph]])}),
                      "phases": int(ok.sum()), "api_calls": d.api_names(tags)},
            time_lost_ns=total_lost,
            suggestion=("Put copies and compute on different queues (streams) and double-"
                        "buffer: upload batch i+1 while batch i computes, download i-1 at the "
                        f"same time; the serialized schedule took {U / 1e6:.1f} ms, the "
                        f"busiest engine class alone needs {(U - total_lost) / 1e6:.1f} ms."),
            functions=[f.pci],
        ))
    return out
