"""The analysis rules (docs/analysis.md documents each rule and its thresholds)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tacc.capture.devinfo import (
    D2H,
    H2D,
    LINK_RATE_GTS,
    TLP_OVERHEAD_BYTES,
    Function,
    copy_link_ps,
    copy_tlps,
    link_prefix,
)
from tacc.capture.schema import DriverFlag, DriverKind, Opcode

from .data import Cmds, Data, merged, runs, union_by_group, window_amount


@dataclass
class Thresholds:
    # common
    severity_high: float = 0.10  # time lost / the finding's active span
    severity_medium: float = 0.03
    max_ranges: int = 50
    # link_saturation / imbalance / vf_contention
    window_ns: int = 1_000_000
    saturation_share: float = 0.85
    saturation_min_run_windows: int = 3
    saturation_min_total_ns: int = 10_000_000
    saturation_min_idle_share: float = 0.2
    imbalance_light_ratio: float = 0.05
    contention_other_share: float = 0.10
    contention_wait_share: float = 0.10  # queued behind another function: wait >= this x dur
    contention_slowdown: float = 1.2
    contention_min_transfers: int = 10
    # small_transfers
    small_bytes: int = 64 * 1024
    small_min_count: int = 100
    small_target_batch: int = 1 << 20
    job_overhead_ns: int = 10_000
    small_gap_cap_ns: int = 1_000_000
    min_time_lost_ns: int = 100_000
    # host_memory
    extra_tlp_share: float = 0.01
    bounce_bw: float = 8e9
    # iommu_churn
    churn_min_maps: int = 32  # the runtime's map_churn makes 40 per scale unit
    churn_gap_ns: int = 100_000_000  # bursts of maps are split at this gap
    churn_maps_per_job: float = 0.2
    churn_time_share: float = 0.02
    # tlb_thrash
    # a miss walks the page table, one PTE read per level (3 for 4 KiB pages, 2 for
    # 2 MiB), each read a host round trip: the device's `walk-latency-ns` (docs/
    # hardware.md section 1); reads per miss come from the tlb_walk_reads counter
    walk_read_ns: int = 500
    walk_reads_per_miss: float = 3.0  # without counters: 4 KiB pages
    tlb_lost_share: float = 0.05
    # serialized_copies
    serial_class_share: float = 0.10
    serial_lost_share: float = 0.15
    serial_wait_share: float = 0.3
    phase_gap_ns: int = 2_000_000
    # idle_gaps
    idle_gap_ns: int = 500_000
    idle_share: float = 0.10
    idle_min_gaps: int = 5  # a workload's own phases (upload, run, download) leave 3-4
    idle_small_calls: int = 2  # gaps with this many small copy calls: small_transfers' time

    def update(self, kv: dict[str, Any]) -> None:
        for k, v in kv.items():
            if k not in self.__dataclass_fields__:
                raise KeyError(k)
            typ = type(getattr(self, k))
            setattr(self, k, typ(v))


@dataclass
class Finding:
    rule: str
    title: str
    time_ranges: list[list[int]]
    evidence: dict[str, Any]
    time_lost_ns: int
    suggestion: str
    functions: list[str] = field(default_factory=list)
    severity: str = "low"
    id: str = ""
    node: str = ""
    # set by the engine: the finding's active span (first to last device or API activity
    # of its functions, widened to its own time ranges), time lost over it (share, what
    # the severity is judged on, at most 1) and over the whole capture (capture_share)
    active_range: list[int] = field(default_factory=list)
    active_span_ns: int = 0
    share: float = 0.0
    capture_share: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Rule = Callable[[Data, Thresholds], list[Finding]]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return deco


def _ranges(d: Data, starts: np.ndarray, ends: np.ndarray, th: Thresholds) -> list[list[int]]:
    s = np.clip(starts, d.t0, d.t1)
    e = np.clip(ends, d.t0, d.t1)
    o = np.argsort(-(e - s), kind="stable")[: th.max_ranges]
    o = np.sort(o)
    return [[int(a), int(b)] for a, b in zip(s[o], e[o], strict=True) if b >= a]


def _links(d: Data) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in d.functions:
        out.setdefault(f.pf, []).append(f.fid)
    return out


def _top_tags(d: Data, tags: np.ndarray, weight: np.ndarray, n: int = 5) -> list[str]:
    tags = tags[tags != 0]
    if len(tags) == 0:
        return []
    u, inv = np.unique(tags, return_inverse=True)
    w = np.bincount(inv, weights=weight[: len(inv)] if len(weight) == len(tags) else None)
    o = np.argsort(-w)[:n]
    return [f"0x{int(t):x}" for t in u[o]]


def _edges(d: Data, th: Thresholds) -> np.ndarray:
    n = int(np.ceil(d.span / th.window_ns))
    return d.t0 + np.arange(n + 1, dtype=np.int64) * th.window_ns


# ------------------------------------------------------- link saturation ---
def _direction(d: Data, fids: list[int], op: int) -> np.ndarray:
    c = d.cmds
    return np.isin(c.fid, fids) & (c.opcode == op)


@rule("link_saturation")
def link_saturation(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = _edges(d, th)
    for pf, fids in _links(d).items():
        fn = d.functions[fids[0]]
        comp = np.isin(d.cmds.fid, fids) & d.cmds.is_compute
        cbusy = window_amount(d.cmds.ts[comp], d.cmds.te[comp], d.cmds.dur[comp], edges)
        for op, dname in ((Opcode.COPY_H2D, "H2D"), (Opcode.COPY_D2H, "D2H")):
            m = _direction(d, fids, op)
            if not m.any():
                continue
            c = d.cmds.sel(m)
            bw = fn.max_bw(dname.lower())  # docs/hardware.md section 9, per direction
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
                time_ranges=_ranges(d, edges[rs], edges[re_], th),
                evidence={
                    "direction": dname, "link": pf,
                    "modelled_max_GBps": round(bw / 1e9, 3),
                    "saturated_ns": total,
                    "mean_share": float(share[mask].mean()),
                    "peak_share": float(share.max()),
                    "threshold_share": th.saturation_share,
                    "bytes_by_function": by_f, "bytes_by_queue": by_q,
                    "transfers": int(inside.sum()),
                    "top_tags": _top_tags(d, c.tag[inside], c.bytes[inside].astype(np.float64)),
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


@rule("h2d_d2h_imbalance")
def imbalance(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = _edges(d, th)
    for pf, fids in _links(d).items():
        fn = d.functions[fids[0]]
        h = d.cmds.sel(_direction(d, fids, Opcode.COPY_H2D))
        g = d.cmds.sel(_direction(d, fids, Opcode.COPY_D2H))
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
            time_ranges=_ranges(d, edges[rs[keep]], edges[re_[keep]], th),
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


@rule("vf_contention")
def vf_contention(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    edges = _edges(d, th)
    for fids in _links(d).values():
        if len(fids) < 2:
            continue
        for op, dname in ((Opcode.COPY_H2D, "H2D"), (Opcode.COPY_D2H, "D2H")):
            bw = d.functions[fids[0]].max_bw(dname.lower())
            cap_w = bw * th.window_ns / 1e9
            m = _direction(d, fids, op)
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
                    time_ranges=_ranges(d, s, e, th),
                    evidence={"victim": d.functions[f].pci, "aggressor": aggressor,
                              "direction": dname, "solo_GBps": round(solo_bw, 3),
                              "contended_GBps": round(cont_bw, 3),
                              "contended_transfers": int(cont.sum()),
                              "other_bytes_in_windows": others,
                              "victim_tags": _top_tags(d, c.tag[cont],
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


# ------------------------------------------------------- small transfers ---
@rule("small_transfers")
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
            time_ranges=_ranges(d, st, en, th),
            evidence={"transfers": n, "bytes": total,
                      "median_bytes": int(np.median(s.bytes)),
                      "share_of_copies": n / max(int((c.is_copy & (c.fid == f.fid)).sum()), 1),
                      "tlp_header_bytes": tlp_over,
                      "observed_ns": observed, "batched_estimate_ns": ideal,
                      "batches_of_target": batches,
                      "top_tags": _top_tags(d, s.tag, s.bytes.astype(np.float64)),
                      "api_calls": d.api_names(s.tag)},
            time_lost_ns=lost,
            suggestion=(f"Batch the transfers: {n} copies of median {int(np.median(s.bytes))} B "
                        f"cost {observed / 1e6:.1f} ms in per-call/per-job overhead; staging "
                        f"them into {batches} copies of {th.small_target_batch >> 20} MiB "
                        f"would take about {ideal / 1e6:.1f} ms."),
            functions=[f.pci],
        ))
    return out


# ------------------------------------------------------- host memory -------
_PAGE = 4096
_WALK_READS_4K = 3  # a 4 KiB leaf: one PTE read per level of the device's page table
# "u2+64->d4 4194304" (tacc.runtime.stream._args): source, destination, bytes
_COPY_ARGS = re.compile(r"^(\S+?)->(\S+) \d+$")


def _side_off(name: str) -> int | None:
    """The page offset of one side of a copy's API arguments: a buffer at ``+OFF`` into
    it (buffers start on a page), an ndarray at its address; None when not parseable."""
    if name.startswith("np@"):
        try:
            return int(name[3:], 16) % _PAGE
        except ValueError:
            return None
    m = re.fullmatch(r"[a-z]+\d+(?:\+(\d+))?", name)
    return int(m.group(1) or 0) % _PAGE if m else None


def _infer_host_off(kind: str, n: int, tlps: int, f: Function) -> int:
    """The smallest host offset (mod 4 KiB, device side aligned) whose modelled payload
    TLP count is the record's: 0 when the aligned count matches (a misalignment the
    record cannot show, e.g. 64 B on a 64 B RCB for a host read, is then not seen)."""
    for h in range(0, _PAGE, 16):
        if copy_tlps(n, kind == H2D, f.mps, f.mrrs, f.rcb, h) == tlps:
            return h
    return 0


def _copy_offsets(d: Data, f: Function, s: Cmds) -> tuple[np.ndarray, np.ndarray]:
    """(host, device) page offsets of each copy: from its API call's arguments when the
    runtime recorded them, else the host offset the record's TLP count implies."""
    host = np.zeros(len(s), np.int64)
    dev = np.zeros(len(s), np.int64)
    args = d.api_args(s.tag)
    cache: dict[tuple[str, int, int], int] = {}
    for i, (a, op, n, t) in enumerate(zip(args, s.opcode.tolist(), s.bytes.tolist(),
                                          s.tlps.tolist(), strict=True)):
        kind = H2D if op == Opcode.COPY_H2D else D2H
        m = _COPY_ARGS.match(a)
        if m:
            src, dst = _side_off(m.group(1)), _side_off(m.group(2))
            h, dv = (src, dst) if kind == H2D else (dst, src)
            if h is not None and dv is not None:
                host[i], dev[i] = h, dv
                continue
        key = (kind, n, t)
        if key not in cache:
            cache[key] = _infer_host_off(kind, n, t, f)
        host[i] = cache[key]
    return host, dev


def _misaligned_cost(f: Function, kind: str, n: int, h: int, dv: int, tlb: int,
                     walk_ns: int) -> tuple[int, int]:
    """(ns lost, extra TLPs) of one copy at host/device page offsets ``h``/``dv`` against
    the same copy aligned, by the device's closed forms (docs/hardware.md section 9):
    its link steps (devinfo.copy_link_ps) and a page walk per extra 4 KiB page the host
    side spans (at most the misses the record counts), time-scaled as the device does."""
    def link(ho: int, do: int) -> int:
        return copy_link_ps(kind, n, f.gen, f.width, f.mps, f.mrrs, f.rcb,
                            host_off=ho, dev_off=do)

    def tlps(ho: int, do: int) -> int:
        return sum(link_prefix(kind, n, f.mps, f.mrrs, f.rcb, ho, do).tlps)
    pages = min(-(-(h + n) // _PAGE) - -(-n // _PAGE), tlb)
    ps = link(h, dv) - link(0, 0) + pages * _WALK_READS_4K * walk_ns * 1000
    return max(int(ps * f.time_scale) // 1000, 0), max(tlps(h, dv) - tlps(0, 0), 0)


@rule("host_memory")
def host_memory(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    drv = d.drv
    for f in d.functions:
        m = (c.fid == f.fid) & c.is_copy & (c.bytes > 0)
        if not m.any():
            continue
        s = c.sel(m)
        host_off, dev_off = _copy_offsets(d, f, s)
        cost = np.zeros(len(s), np.int64)
        extra = np.zeros(len(s), np.int64)
        memo: dict[tuple[int, ...], tuple[int, int]] = {}
        known = f.gen in LINK_RATE_GTS and f.width > 0  # a VF seen only by hotplug: no link
        for i in np.flatnonzero(((host_off != 0) | (dev_off != 0)) & known).tolist():
            kind = H2D if s.opcode[i] == Opcode.COPY_H2D else D2H
            key = (int(s.opcode[i]), int(s.bytes[i]), int(host_off[i]), int(dev_off[i]),
                   int(s.tlb[i]))
            if key not in memo:
                memo[key] = _misaligned_cost(f, kind, *key[1:], th.walk_read_ns)
            cost[i], extra[i] = memo[key]
        extra_total = int(extra.sum())
        lost_tlp = int(cost.sum())
        dm = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.DMA_MAP)]
        bounced = dm[(dm["flags"] & int(DriverFlag.BOUNCE)) != 0]
        bounce_bytes = int(bounced["size"].sum())
        lost_bounce = int(bounce_bytes / th.bounce_bw * 1e9)
        bo = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.BO_CREATE)
                 & ((drv["flags"] & int(DriverFlag.USERPTR)) != 0)]
        misaligned = bo[(bo["addr"] % 4096) != 0]
        user = dm[(dm["flags"] & int(DriverFlag.USERPTR)) != 0]
        unpinned = int(((user["flags"] & int(DriverFlag.PINNED)) == 0).sum())
        share = extra_total / max(int(s.tlps.sum()), 1)
        lost = lost_tlp + lost_bounce
        if lost < th.min_time_lost_ns or (share < th.extra_tlp_share and bounce_bytes == 0):
            continue
        bad = cost > 0
        st, en = merged(s.ts[bad], s.te[bad])
        if len(bounced):
            st = np.r_[st, bounced["t_ns"]]
            en = np.r_[en, bounced["t_ns"] + bounced["dur_ns"]]
        kinds = [k for k, v in (("unaligned", extra_total > 0), ("bounced", bounce_bytes > 0))
                 if v]
        out.append(Finding(
            rule="host_memory",
            title=f"{' and '.join(kinds)} host memory in copies on {f.pci}",
            time_ranges=_ranges(d, st, en, th),
            evidence={"extra_tlps": extra_total, "extra_tlp_share": share,
                      "misaligned_copy_ns": lost_tlp,
                      "host_offsets": sorted({int(x) for x in host_off[bad]})[:5],
                      "affected_transfers": int(bad.sum()),
                      "affected_bytes": int(s.bytes[bad].sum()),
                      "misaligned_userptr_buffers": int(len(misaligned)),
                      "misaligned_addresses": [f"0x{int(a):x}" for a in
                                               np.unique(misaligned["addr"])[:5]],
                      "bounced_maps": int(len(bounced)), "bounced_bytes": bounce_bytes,
                      "userptr_maps_not_pinned": unpinned,
                      "top_tags": _top_tags(d, s.tag[bad], s.bytes[bad].astype(np.float64)),
                      "api_calls": d.api_names(s.tag[bad])},
            time_lost_ns=lost,
            suggestion=("Allocate host buffers page-aligned (numpy arrays from the runtime's "
                        "host allocator, or np.empty with 4 KiB alignment) and register them "
                        "once (pinned userptr); a misaligned userptr splits every page into "
                        "an extra TLP, and a bounce buffer adds a CPU copy."),
            functions=[f.pci],
        ))
    return out


# ------------------------------------------------------- IOMMU churn -------
@rule("iommu_churn")
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
        time_ranges=_ranges(d, allm["t_ns"], allm["t_ns"] + allm["dur_ns"], th),
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


# ------------------------------------------------------- TLB thrash --------
@rule("tlb_thrash")
def tlb_thrash(d: Data, th: Thresholds) -> list[Finding]:
    out = []
    c = d.cmds
    drv = d.drv
    for f in d.functions:
        # walks of compute commands (operands in device memory, what 2 MiB device pages
        # fix), against compute time; copies walk the pinned host pages (4 KiB whatever
        # the device pages are)
        m = (c.fid == f.fid) & c.is_compute
        misses = int(c.tlb[m].sum())
        if misses == 0:
            continue
        binds = drv[(drv["fid"] == f.fid) & (drv["kind"] == DriverKind.VM_BIND)]
        ps, cnt = np.unique(binds["page_size"], return_counts=True)
        small = binds["page_size"] == 4096
        small_bytes = int(binds["size"][small].sum())
        if not small.any():
            continue
        busy = int(c.dur[m].sum())
        hits, cmiss, creads = d.tlb_counts.get(f.fid, (0, 0, 0))
        per_miss = creads / cmiss if cmiss and creads else th.walk_reads_per_miss
        miss_ns = per_miss * th.walk_read_ns * f.time_scale  # modelled time is scaled
        walk = int(misses * miss_ns)
        if walk < th.tlb_lost_share * max(busy, 1):
            continue
        frac4k = small_bytes / max(int(binds["size"].sum()), 1)
        # walks are inside the commands' time: never more than that
        lost = min(int(walk * frac4k * (1 - 1 / 512)), busy)
        if lost < th.min_time_lost_ns:
            continue
        rate = cmiss / (hits + cmiss) if hits + cmiss else None
        hot = m & (c.tlb > 0)
        st, en = merged(c.ts[hot], c.te[hot])
        out.append(Finding(
            rule="tlb_thrash",
            title=f"device TLB thrash on {f.pci}: {misses} misses, 4 KiB pages",
            time_ranges=_ranges(d, st, en, th),
            evidence={"tlb_misses": misses, "miss_rate": rate,
                      "page_sizes": {str(int(p)): int(n) for p, n in zip(ps, cnt, strict=True)},
                      "bytes_in_4k_pages": small_bytes, "walk_ns_estimate": walk,
                      "walk_reads_per_miss": per_miss, "miss_cost_ns": miss_ns,
                      "busy_ns": busy,
                      "top_tags": _top_tags(d, c.tag[hot], c.tlb[hot].astype(np.float64)),
                      "api_calls": d.api_names(c.tag[hot])},
            time_lost_ns=lost,
            suggestion=(f"Map the {small_bytes >> 20} MiB of device buffers with 2 MiB pages "
                        "(huge-page aligned allocations): 512x fewer TLB entries, so the "
                        f"{misses} page walks would nearly vanish."),
            functions=[f.pci],
        ))
    return out


# ------------------------------------------------------- serialized copies -
@rule("serialized_copies")
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
            time_ranges=_ranges(d, pst[ok], pen[ok], th),
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


# ------------------------------------------------------- idle gaps ---------
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


@rule("idle_gaps")
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
            time_ranges=_ranges(d, gs, ge, th),
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


# ------------------------------------------------------- link degraded -----
@rule("link_degraded")
def link_degraded(d: Data, th: Thresholds) -> list[Finding]:
    """A PF's link trained below what it is capable of (Link Status under Link
    Capabilities: a lower generation or fewer lanes, docs/hardware.md "Link faults").
    Time lost, per direction: the time the direction's copies (the PF's and its VFs')
    kept it busy (the union of their spans) x (1 - their modelled link time at the
    capable speed and width / at the negotiated ones); at most the copies' union."""
    out = []
    c = d.cmds
    by_fid = {f.fid: f for f in d.functions}
    for pf, fids in _links(d).items():
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
            time_ranges=_ranges(d, st, en, th),
            evidence={"negotiated": {"gen": f.gen, "width": f.width},
                      "capable": {"gen": f.max_gen, "width": f.max_width},
                      "raw_bandwidth_ratio": ratio, "directions": dirs,
                      "affected_transfers": len(s), "affected_bytes": int(s.bytes.sum()),
                      "top_tags": _top_tags(d, s.tag, s.bytes.astype(np.float64)),
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
