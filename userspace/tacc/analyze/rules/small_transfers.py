"""Many small copies, each paying the per-command cost (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, merged
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
    top_tags,
)
from tacc.capture.schema import Opcode
from tacc.model.link import TLP_OVERHEAD_BYTES

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class SmallTransfersThresholds:
    small_bytes: int = 64 * 1024  # also serialized_copies' small copy
    small_min_count: int = 100
    small_target_batch: int = 1 << 20
    job_overhead_ns: int = 10_000
    small_gap_cap_ns: int = 1_000_000
    min_time_lost_ns: int = 100_000  # every rule: a finding loses at least this much


def small_transfers(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    for f in d.functions:
        m = (c.fid == f.fid) & c.is_copy & (c.bytes > 0) & (c.bytes < th.small_bytes)
        n = int(m.sum())
        if n < th.small_min_count:
            continue
        s = c.sel(m)
        o = np.lexsort((s.ts, s.queue, s.opcode))
        s = s.sel(o)
        nxt = np.r_[s.ts[1:], s.te[-1:]]
        same = np.r_[(s.queue[1:] == s.queue[:-1]) & (s.opcode[1:] == s.opcode[:-1]), False]
        gap = np.where(same, np.minimum(nxt - s.ts, th.small_gap_cap_ns), s.dur)
        cost = np.maximum(s.dur, gap)
        observed = int(cost.sum())
        total = int(s.bytes.sum())
        batches = int(np.ceil(total / th.small_target_batch))
        h2d = s.opcode == Opcode.COPY_H2D
        ideal = int((int(s.bytes[h2d].sum()) / f.max_bw("h2d") +
                     int(s.bytes[~h2d].sum()) / f.max_bw("d2h")) * 1e9)
        ideal += batches * th.job_overhead_ns
        lost = max(observed - ideal, 0)
        if lost < th.min_time_lost_ns:
            continue
        tlp_over = int(s.tlps.sum()) * TLP_OVERHEAD_BYTES
        st, en = merged(s.ts, s.te + np.minimum(gap, th.small_gap_cap_ns))
        out.append(Finding(
            rule="small_transfers",
            title=f"{n} copies under {th.small_bytes // 1024} KiB on {f.pci}",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"transfers": n, "bytes": total,
                      "median_bytes": int(np.median(s.bytes)),
                      "share_of_copies": n / max(int((c.is_copy & (c.fid == f.fid)).sum()), 1),
                      "tlp_header_bytes": tlp_over,
                      "observed_ns": observed, "batched_estimate_ns": ideal,
                      "batches_of_target": batches,
                      "top_tags": top_tags(d, s.tag, s.bytes.astype(np.float64)),
                      "api_calls": d.api_names(s.tag)},
            time_lost_ns=lost,
            suggestion=(f"Batch the transfers: {n} copies of median {int(np.median(s.bytes))} B "
                        f"cost {observed / 1e6:.1f} ms in per-call/per-job overhead; staging "
                        f"them into {batches} copies of {th.small_target_batch >> 20} MiB "
                        f"would take about {ideal / 1e6:.1f} ms."),
            functions=[f.pci],
        ))
    return out
