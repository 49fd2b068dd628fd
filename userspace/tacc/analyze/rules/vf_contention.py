"""Functions sharing a link slow each other down (docs/analysis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tacc.analyze.data import Data, merged, window_amount
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
class VfContentionThresholds:
    contention_other_share: float = 0.10
    contention_wait_share: float = 0.10  # queued behind another function: wait >= this x dur
    contention_slowdown: float = 1.2
    contention_min_transfers: int = 10


def _ready_ns(c: Any) -> np.ndarray:
    """Per command: when it was ready to run (fetched by the device and its queue's
    previous command done), never after its start."""
    o = np.lexsort((c.ts, c.queue, c.fid))
    te = c.te[o]
    same = np.r_[False, (c.fid[o][1:] == c.fid[o][:-1]) & (c.queue[o][1:] == c.queue[o][:-1])]
    prev_end = np.where(same, np.r_[0, te[:-1]], 0)
    out = np.empty(len(o), np.int64)
    out[o] = np.minimum(np.maximum(c.tf[o], prev_end), c.ts[o])
    return out


def _covered(s: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a, b) covered by the disjoint sorted intervals [s, e), per element."""
    if len(s) == 0:
        return np.zeros(len(a), np.int64)
    cum = np.r_[0, np.cumsum(e - s)]

    def upto(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, x, side="right") - 1
        kk = np.maximum(k, 0)
        part = np.clip(x - s[kk], 0, e[kk] - s[kk])
        return np.where(k >= 0, cum[kk] + part, 0)

    return np.maximum(upto(b) - upto(a), 0)


def vf_contention(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = window_edges(d, th)
    for fids in links_of(d).values():
        if len(fids) < 2:
            continue
        for op, dname in ((Opcode.COPY_H2D, "H2D"), (Opcode.COPY_D2H, "D2H")):
            bw = d.functions[fids[0]].max_bw(dname.lower())
            cap_w = bw * th.window_ns / 1e9
            m = direction_mask(d, fids, op)
            c = d.cmds.sel(m)
            if len(c) == 0 or len(np.unique(c.fid)) < 2:
                continue
            per = {f: window_amount(c.ts[c.fid == f], c.te[c.fid == f], c.bytes[c.fid == f],
                                    edges) for f in np.unique(c.fid).tolist()}
            ready = _ready_ns(c)
            total = sum(per.values())
            for f in per:
                mine = c.fid == f
                other = (total - per[f]) / cap_w
                wi = np.clip(((c.ts + c.te) // 2 - d.t0) // th.window_ns, 0, len(other) - 1)
                # service time: the transfer plus the time it was ready but waited while
                # ANOTHER function's transfer held the shared engine/link (the device
                # time-multiplexes its DMA engines between functions, docs/hardware.md
                # section 4: a neighbour shows as queueing, not as a slower copy)
                os_, oe_ = merged(c.ts[~mine], c.te[~mine])
                wait = _covered(os_, oe_, ready, c.ts)
                dur = (np.maximum(c.dur, 1) + wait).astype(np.float64)
                # contended: it queued behind another function's transfer, or ran while
                # another function moved bytes over the link (parallel engines).  Not the
                # window share alone: with the engine alternating between two functions
                # the neighbour moves its bytes while the victim waits, not while the
                # victim's own transfer runs (a CI run split the victim's 31 queued
                # transfers 19/12 by window share and saw no slowdown)
                queued = wait >= th.contention_wait_share * np.maximum(c.dur, 1)
                cont = mine & (queued | (other[wi] >= th.contention_other_share))
                solo = mine & ~cont
                if cont.sum() < th.contention_min_transfers or solo.sum() < 3:
                    continue
                bws = c.bytes / dur
                solo_bw = float(np.median(bws[solo]))
                cont_bw = float(np.median(bws[cont]))
                if cont_bw <= 0 or solo_bw / cont_bw < th.contention_slowdown:
                    continue
                # lost: the time the function's ready transfers waited behind the others
                # (a union: several queued transfers waiting at once lose it once), plus
                # transfers that ran slower than alone (a shared link)
                ws, we = merged(ready[cont], c.ts[cont])
                waited = int(_covered(os_, oe_, ws, we).sum())
                ideal = c.bytes[cont] / solo_bw
                slower = np.maximum(np.maximum(c.dur[cont], 1) - ideal, 0)
                lost = waited + int(slower.sum())
                if lost < th.min_time_lost_ns:
                    continue
                others = {d.functions[g].pci: int(per[g][np.unique(wi[cont])].sum())
                          for g in per if g != f}
                aggressor = max(others, key=lambda k: others[k])
                s, e = merged(c.ts[cont], c.te[cont])
                out.append(Finding(
                    rule="vf_contention",
                    title=f"{d.functions[f].pci} {dname} slowed {solo_bw / cont_bw:.1f}x "
                          f"by {aggressor} sharing the link",
                    time_ranges=clip_ranges(d, s, e, th),
                    evidence={"victim": d.functions[f].pci, "aggressor": aggressor,
                              "direction": dname, "solo_GBps": round(solo_bw, 3),
                              "contended_GBps": round(cont_bw, 3),
                              "contended_transfers": int(cont.sum()),
                              "other_bytes_in_windows": others,
                              "victim_tags": top_tags(d, c.tag[cont],
                                                       c.bytes[cont].astype(np.float64)),
                              "api_calls": d.api_names(c.tag[cont])},
                    time_lost_ns=lost,
                    suggestion=("Noisy neighbour: another function on the same link takes "
                                "its bandwidth. Set arbitration weights (TACC_REG_ARB_WEIGHT "
                                "via sysfs), rate-limit the aggressor, or schedule the two "
                                "workloads apart."),
                    functions=[d.functions[f].pci, aggressor],
                ))
    return out
