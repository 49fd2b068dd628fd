"""The device idle between jobs of a running workload (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, merged
from tacc.analyze.rules.base import (
    Finding,
    clip_ranges,
)

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class IdleGapsThresholds:
    idle_gap_ns: int = 500_000
    idle_share: float = 0.10
    idle_min_gaps: int = 5  # a workload's own phases (upload, run, download) leave 3-4
    idle_small_calls: int = 2  # gaps with this many small copy calls: small_transfers' time
    idle_storage_bytes: int = 256 << 10  # gaps with this much block reads issued: a load's


def _small_copy_calls_in(d: Data, gs: np.ndarray, ge: np.ndarray, th: Thresholds) -> np.ndarray:
    """Per gap [gs, ge): API copy calls under ``small_bytes`` that started in it."""
    api = d.api
    if len(api) == 0 or len(gs) == 0:
        return np.zeros(len(gs), np.int64)
    ids = np.unique(api["name_id"])
    copy_ids = [int(i) for i in ids if d.cap.strings.get(int(i), "").startswith("copy")]
    m = np.isin(api["name_id"], copy_ids) & (api["bytes"] > 0) & (api["bytes"] < th.small_bytes)
    t = api["t_start"][m].astype(np.int64)
    k = np.searchsorted(gs, t, side="right") - 1
    inside = (k >= 0) & (t < ge[np.maximum(k, 0)])
    return np.bincount(k[inside], minlength=len(gs))


def _storage_read_bytes(d: Data, gs: np.ndarray, ge: np.ndarray) -> np.ndarray:
    """Per gap [gs, ge): the bytes of the block reads (storage_reads) issued in it."""
    from tacc.analyze.rules.load_serialised import storage_reads

    r = storage_reads(d)
    if not len(r) or not len(gs):
        return np.zeros(len(gs), np.int64)
    t = (r["t_ns"] - r["dur_ns"]).astype(np.int64)
    k = np.searchsorted(gs, t, side="right") - 1
    inside = (k >= 0) & (t < ge[np.maximum(k, 0)])
    return np.bincount(k[inside], weights=r["size"][inside].astype(np.float64),
                       minlength=len(gs)).astype(np.int64)


def idle_gaps(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    for f in d.functions:
        s = c.sel(c.fid == f.fid)
        if len(s) < 2:
            continue
        bs, be = merged(s.ts, s.te)
        gs, ge = be[:-1], bs[1:]
        long = (ge - gs) >= th.idle_gap_ns
        # gaps in which the host was issuing small copies are the cost of those copies
        # (small_transfers counts it): a finding explains its time once
        long &= _small_copy_calls_in(d, gs, ge, th) < th.idle_small_calls
        # gaps in which the host read storage are a load's (load_serialised counts the
        # serialised ones; a pipelined load waits for its storage)
        long &= _storage_read_bytes(d, gs, ge) < th.idle_storage_bytes
        active = int(be.max() - bs.min())
        total = int((ge - gs)[long].sum())
        if long.sum() < th.idle_min_gaps or total < th.idle_share * active:
            continue
        # time lost: what overlapping the host's work with the device's could save.  With
        # the host preparing step i+1 while the device runs step i, a gap shrinks by at
        # most the device work before it (since the previous counted gap): a gap after a
        # short burst (a one-off upload, the end of a phase) is mostly not recoverable.
        # Counting every gap whole read 124.8 ms against 94.8 ms measured (host_bound,
        # real capture: its first batch's preparation and the phase gaps are in both twins)
        k = np.flatnonzero(long)
        cum = np.r_[0, np.cumsum(be - bs)]
        prev = np.r_[-1, k[:-1]]
        busy_before = cum[k + 1] - cum[prev + 1]
        lost = int(np.minimum(ge[k] - gs[k], busy_before).sum())
        if lost < th.min_time_lost_ns:
            continue
        gs, ge = gs[long], ge[long]
        # what the host did meanwhile
        api = d.api
        host_calls: dict[str, int] = {}
        if len(api):
            mid = (api["t_start"] + api["t_end"]) // 2
            k = np.searchsorted(gs, mid, side="right") - 1
            inside = (k >= 0) & (mid < ge[np.maximum(k, 0)])
            ids, cnt = np.unique(api["name_id"][inside], return_counts=True)
            host_calls = {d.cap.strings.get(int(i), f"#{i}"): int(n)
                          for i, n in zip(ids, cnt, strict=True)}
        h = d.host
        blk = 0
        if len(h):
            k = np.searchsorted(gs, h["t_ns"], side="right") - 1
            inside = (k >= 0) & (h["t_ns"] < ge[np.maximum(k, 0)])
            blk = int(h["size"][inside & (h["kind"] == 4)].sum())
        out.append(Finding(
            rule="idle_gaps",
            title=f"device {f.pci} idle {100 * total / active:.0f}% of its active time "
                  f"({int(long.sum())} gaps >= {th.idle_gap_ns / 1e6:g} ms)",
            time_ranges=clip_ranges(d, gs, ge, th),
            evidence={"gaps": int(long.sum()), "idle_ns": total, "active_ns": active,
                      "overlappable_ns": lost,
                      "longest_gap_ns": int((ge - gs).max()),
                      "median_gap_ns": int(np.median(ge - gs)),
                      "host_api_calls_in_gaps": host_calls,
                      "block_io_bytes_in_gaps": blk},
            time_lost_ns=lost,
            suggestion=("The device starves while the host works (see host_api_calls_in_gaps "
                        "and block I/O): prepare the next batch in a loader thread or process "
                        "and keep at least two batches queued so the device never waits."),
            functions=[f.pci],
        ))
    return out
