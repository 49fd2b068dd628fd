"""Mapping and unmapping buffers around each job (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tacc.analyze.data import Data
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
)
from tacc.capture.schema import DriverKind

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class IommuChurnThresholds:
    churn_min_maps: int = 32  # maps beyond the buffers needed; map_churn makes 40 per scale unit
    churn_gap_ns: int = 100_000_000  # bursts of maps are split at this gap
    churn_maps_per_job: float = 0.2
    churn_time_share: float = 0.02


def iommu_churn(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    drv = d.drv
    for f in d.functions:
        fd = drv[drv["fid"] == f.fid]
        maps_all = fd[fd["kind"] == DriverKind.DMA_MAP]
        unmaps_all = fd[fd["kind"] == DriverKind.DMA_UNMAP]
        if len(maps_all) == 0:
            continue
        # bursts of maps (split at churn_gap_ns without a map): one phase of a program
        # churning is not diluted by the jobs of its other phases
        tm = np.sort(maps_all["t_ns"].astype(np.int64))
        cut = np.flatnonzero(np.diff(tm) > th.churn_gap_ns)
        for a, b in zip(np.r_[tm[0], tm[cut + 1]].tolist(), np.r_[tm[cut], tm[-1]].tolist(),
                        strict=True):
            out.extend(_churn_burst(d, th, f, fd, maps_all, unmaps_all, a, b))
    return out


def _api_time(d: Data, names: tuple[str, ...], lo: int, hi: int) -> int:
    """Summed duration of the API calls named ``names`` that overlap [lo, hi]."""
    api = d.api
    if len(api) == 0:
        return 0
    ids = [int(i) for i in np.unique(api["name_id"]) if d.cap.strings.get(int(i), "") in names]
    m = (np.isin(api["name_id"], ids) & (api["t_end"].astype(np.int64) >= lo)
         & (api["t_start"].astype(np.int64) <= hi))
    return int((api["t_end"][m].astype(np.int64) - api["t_start"][m].astype(np.int64)).sum())


def _churn_burst(d: Data, th: Thresholds, f: Any, fd: np.ndarray, maps_all: np.ndarray,
                 unmaps_all: np.ndarray, a: int, b: int) -> list[Finding]:
    out: list[Finding] = []
    maps = maps_all[(maps_all["t_ns"] >= a) & (maps_all["t_ns"] <= b)]
    unmaps = unmaps_all[(unmaps_all["t_ns"] >= a) & (unmaps_all["t_ns"] <= b + th.churn_gap_ns)]
    n = len(maps)
    allm = np.concatenate([maps, unmaps])
    lo, hi = int(allm["t_ns"].min()), int((allm["t_ns"] + allm["dur_ns"]).max())
    sub = fd[(fd["kind"] == DriverKind.SUBMIT) & (fd["t_ns"] >= lo) & (fd["t_ns"] <= hi)]
    cm = (d.cmds.fid == f.fid) & (d.cmds.ts >= lo) & (d.cmds.ts <= hi)
    jobs = len(sub) or len(np.unique(d.cmds.tag[cm]))
    if n < th.churn_min_maps or n < th.churn_maps_per_job * max(jobs, 1):
        return out
    related = fd[np.isin(fd["kind"], [DriverKind.VM_BIND, DriverKind.VM_UNBIND,
                                      DriverKind.BO_CREATE]) &
                 (fd["t_ns"] >= lo) & (fd["t_ns"] <= hi)]
    t_map = int(maps["dur_ns"].sum() + unmaps["dur_ns"].sum())
    t_rel = int(related["dur_ns"].sum())
    # the buffer ioctls' own spans (create = pin + map, bind, unbind, close = unmap +
    # unpin) contain the map/unmap calls: the cost when the kernel's map/unmap spans
    # are not captured (kprobes off) or do not cover unpin/unbind
    bio = fd[(fd["kind"] == DriverKind.IOCTL) & (fd["t_ns"] >= lo) & (fd["t_ns"] <= hi)]
    t_ioctl = int(bio["dur_ns"].sum())
    # and the runtime's own calls that register and release the buffers (pin + map +
    # bind plus the library's work around them), when the API ring was captured
    t_api = _api_time(d, ("wrap", "host_buffer", "free"), lo, hi)
    t_cost = max(t_map + t_rel, t_ioctl, t_api)
    active = hi - lo
    if t_cost < th.churn_time_share * max(active, 1):
        return out
    key = maps["addr"].astype(np.uint64) ^ (maps["size"].astype(np.uint64) << np.uint64(40))
    distinct = len(np.unique(key))
    # buffers actually needed: at most the peak of mappings alive at once (IOVAs of
    # re-registered memory differ, so distinct addresses overstate it)
    tt = np.concatenate([maps["t_ns"], unmaps["t_ns"] + unmaps["dur_ns"]]).astype(np.int64)
    dd = np.r_[np.ones(len(maps), np.int64), -np.ones(len(unmaps), np.int64)]
    o = np.lexsort((dd, tt))  # unmap before map at equal times
    peak = int(max(np.cumsum(dd[o]).max(), 1))
    needed = min(distinct, peak)
    # churn is mapping again what was mapped: a program that maps each of its buffers
    # once (a model's weights and KV cache at load) has no map to save, however many
    if n - needed < th.churn_min_maps:
        return out
    # and the device's side: a re-registered buffer has a new device VA / IOVA, so every
    # copy from it walks its pages again (cold TLB; 4 KiB pinned pages).  The walks of the
    # burst's copies at the device's miss cost (as tlb_thrash prices them): on the real
    # map_churn twin 128 misses per 256 KiB copy, 12.5 ms of its 21.6 ms span difference,
    # which the host-side cost alone (8.8 ms) missed
    cp = cm & d.cmds.is_copy
    walk_misses = int(d.cmds.tlb[cp].sum())
    hits, cmiss, creads = d.tlb_counts.get(f.fid, (0, 0, 0))
    per_miss = creads / cmiss if cmiss and creads else th.walk_reads_per_miss
    t_walk = int(walk_misses * per_miss * th.walk_read_ns * f.time_scale)
    lost = int((t_cost + t_walk) * (1.0 - needed / n))
    if lost < th.min_time_lost_ns:
        return out
    out.append(Finding(
        rule="iommu_churn",
        title=f"{n} IOMMU maps for {jobs} jobs on {f.pci} ({n / max(jobs, 1):.2f} per job)",
        time_ranges=clip_ranges(d, allm["t_ns"], allm["t_ns"] + allm["dur_ns"], th),
        evidence={"maps": n, "unmaps": int(len(unmaps)), "jobs": jobs,
                  "maps_per_job": n / max(jobs, 1), "distinct_buffers": distinct,
                  "peak_live_mappings": peak,
                  "time_in_map_unmap_ns": t_map, "time_in_bind_create_ns": t_rel,
                  "time_in_buffer_ioctls_ns": t_ioctl, "time_in_buffer_api_calls_ns": t_api,
                  "copy_tlb_misses": walk_misses, "copy_walk_ns": t_walk,
                  "mapped_bytes": int(maps["size"].sum()),
                  "pids": sorted({int(p) for p in np.unique(maps["pid"])}),
                  "api_calls": d.api_names(d.cmds.tag[d.cmds.fid == f.fid])},
        time_lost_ns=lost,
        suggestion=("Register (pin and map) each host buffer once and reuse it: at most "
                    f"{needed} buffer(s) were mapped at once but {n} maps were made, "
                    f"costing {t_cost / 1e6:.1f} ms in pin/map/bind/unmap."),
        functions=[f.pci],
    ))
    return out
