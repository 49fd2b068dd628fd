"""The same host bytes uploaded again (docs/analysis.md "redundant_upload"): weights
re-uploaded every step instead of kept resident in device memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import api_copies, cost_of_tags, jobs, range_names

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class RedundantUploadThresholds:
    redundant_min_bytes: int = 1 << 20  # re-uploaded bytes of a function


def redundant_upload(d: Data, th: Thresholds) -> list[Finding]:
    """copy_h2d API records whose destination (buffer and ``doff=`` offset), size and
    host-bytes fingerprint (``fp=`` in their arguments, tacc.runtime.stream.fingerprint)
    equal an earlier one's: each
    repeat moves bytes the device already holds.  Time lost: the repeats' device time
    and the host-starved gaps before them (their submits)."""
    recs, args = api_copies(d, "copy_h2d")
    if not len(recs):
        return []
    seen: dict[tuple[int, str, str, int], int] = {}
    rep = np.zeros(len(recs), bool)
    for i, (a, fid) in enumerate(zip(args, recs["fid"].tolist(), strict=True)):
        parts = a.split()
        fp = next((p[3:] for p in parts if p.startswith("fp=")), "")
        if not fp or len(parts) < 2 or "->" not in parts[0]:
            continue
        doff = next((p[5:] for p in parts if p.startswith("doff=")), "0")
        key = (int(fid), parts[0].split("->")[1] + "+" + doff, fp, int(recs["bytes"][i]))
        rep[i] = key in seen
        seen[key] = seen.get(key, 0) + 1
    if not rep.any():
        return []
    j = jobs(d)
    out = []
    for f in d.functions:
        m = rep & (recs["fid"] == f.fid)
        nbytes = int(recs["bytes"][m].sum())
        if nbytes < th.redundant_min_bytes:
            continue
        dev, gaps, st, en = cost_of_tags(j, recs["tag"][m])
        lost = dev + gaps
        if lost < th.min_time_lost_ns:
            continue
        distinct = len({k for k, n in seen.items() if n > 1 and k[0] == f.fid})
        out.append(Finding(
            rule="redundant_upload",
            title=f"{nbytes / (1 << 20):.1f} MiB uploaded again to {f.name}: the same host "
                  f"bytes to the same device buffer",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"repeated_uploads": int(m.sum()), "repeated_bytes": nbytes,
                      "distinct_buffers": distinct, "device_ns": dev,
                      "starved_gaps_ns": gaps, "ranges": range_names(d, st, en)},
            time_lost_ns=lost,
            suggestion="upload the weights once and keep them resident in device memory "
                       "(bind the same DeviceBuffer at every step)",
            functions=[f.pci],
        ))
    return out
