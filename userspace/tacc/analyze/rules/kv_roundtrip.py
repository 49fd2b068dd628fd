"""Device memory round-tripped through the host (docs/analysis.md "kv_roundtrip"): a KV
cache (or any state) downloaded after a step and uploaded again before the next."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import api_copies, cost_of_tags, jobs, range_names

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


def kv_roundtrip(d: Data, th: Thresholds) -> list[Finding]:
    """A copy_d2h of device buffer D into host buffer H followed by a copy_h2d of H back
    into D of the same size: the bytes left the device only to return.  Time lost: both
    copies' device time and the host-starved gaps before them."""
    down, dargs = api_copies(d, "copy_d2h")
    up, uargs = api_copies(d, "copy_h2d")
    if not len(down) or not len(up):
        return []

    def route(a: str) -> tuple[str, str] | None:
        p = a.split()
        if not p or "->" not in p[0]:
            return None
        src, dst = p[0].split("->", 1)
        return src, dst

    pending: dict[tuple[int, str, str, int], int] = {}  # (fid, dev, host, n) -> D2H tag
    pairs: list[tuple[int, int, int]] = []  # (fid, d2h tag, h2d tag)
    ev = sorted([(int(t), 0, i) for i, t in enumerate(down["t_start"].tolist())]
                + [(int(t), 1, i) for i, t in enumerate(up["t_start"].tolist())])
    for _, kind, i in ev:
        if kind == 0:
            r = route(dargs[i])
            if r:
                key = (int(down["fid"][i]), r[0], r[1], int(down["bytes"][i]))
                pending[key] = int(down["tag"][i])
        else:
            r = route(uargs[i])
            if r:
                key = (int(up["fid"][i]), r[1], r[0], int(up["bytes"][i]))
                t = pending.pop(key, None)
                if t is not None:
                    pairs.append((key[0], t, int(up["tag"][i])))
    if not pairs:
        return []
    j = jobs(d)
    out = []
    for f in d.functions:
        p = [(a, b) for fid, a, b in pairs if fid == f.fid]
        if not p:
            continue
        tags = np.array([t for ab in p for t in ab], np.uint64)
        dev, gaps, st, en = cost_of_tags(j, tags)
        lost = dev + gaps
        if lost < th.min_time_lost_ns:
            continue
        nb = int(up["bytes"][np.isin(up["tag"], tags)].sum())
        out.append(Finding(
            rule="kv_roundtrip",
            title=f"{len(p)} device buffers of {f.name} went to the host and came back "
                  f"({nb / (1 << 20):.1f} MiB each way)",
            time_ranges=clip_ranges(d, st, en, th),
            evidence={"round_trips": len(p), "bytes_each_way": nb, "device_ns": dev,
                      "starved_gaps_ns": gaps, "ranges": range_names(d, st, en)},
            time_lost_ns=lost,
            suggestion="keep the KV cache resident in device memory between steps (bind "
                       "the same DeviceBuffer as past and present); offload only what "
                       "does not fit",
            functions=[f.pci],
        ))
    return out
