"""What the rules read from a capture: columns in numpy, device times on CLOCK_MONOTONIC."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tacc import hw
from tacc.capture import Capture
from tacc.capture.devinfo import Function
from tacc.capture.schema import NUM_ENGINES, TRACE_EV_BASE, DriverKind, Engine, Opcode

DRIVER_KEEP = (DriverKind.DMA_MAP, DriverKind.DMA_UNMAP, DriverKind.VM_BIND,
               DriverKind.VM_UNBIND, DriverKind.BO_CREATE, DriverKind.BO_DESTROY,
               DriverKind.SUBMIT)
# ioctl numbers (_IOC_NR) of buffer management: GEM_CLOSE, BO_CREATE (pin + IOMMU map of
# user memory), VM_BIND, VM_UNBIND
BUFFER_IOCTLS = tuple(hw.IOCTLS[n] & 0xFF for n in ("GEM_CLOSE", "BO_CREATE", "VM_BIND",
                                                   "VM_UNBIND"))
DRIVER_COLS = ["t_ns", "dur_ns", "kind", "fid", "pid", "tag", "addr", "size", "nsegs",
               "page_size", "flags", "arg"]


@dataclass
class Cmds:
    fid: np.ndarray
    engine: np.ndarray
    queue: np.ndarray
    opcode: np.ndarray
    tag: np.ndarray
    bytes: np.ndarray
    tlps: np.ndarray
    tlb: np.ndarray
    tf: np.ndarray
    ts: np.ndarray
    te: np.ndarray
    # trace record version 3 (capture minor 12; zero in older records): FLOPs, device-
    # memory bytes read and written, operand dtype, sub-op, list id; ``ver`` the record's
    # version (3: those columns are the device's)
    ver: np.ndarray
    flops: np.ndarray
    rd: np.ndarray
    wr: np.ndarray
    dtype: np.ndarray
    subop: np.ndarray
    list_id: np.ndarray
    index: np.ndarray  # the command's index in its job (a listed command's: in its list)

    def __len__(self) -> int:
        return len(self.ts)

    def sel(self, m: np.ndarray) -> Cmds:
        return Cmds(**{k: getattr(self, k)[m] for k in self.__dataclass_fields__})

    @property
    def dur(self) -> np.ndarray:
        return self.te - self.ts

    @property
    def is_copy(self) -> np.ndarray:
        return (self.opcode == Opcode.COPY_H2D) | (self.opcode == Opcode.COPY_D2H)

    @property
    def is_compute(self) -> np.ndarray:
        """Ran on a compute engine (fences and timestamps have engine 255: none)."""
        return (self.engine >= Engine.COMPUTE0) & (self.engine < NUM_ENGINES)


@dataclass
class Data:
    cap: Capture
    t0: int
    t1: int
    functions: list[Function]
    cmds: Cmds
    drv: np.ndarray
    api: np.ndarray
    host: np.ndarray
    tlb_counts: dict[int, tuple[int, int, int]]  # fid -> (hits, misses, walk reads), counters
    _api_sorted: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def span(self) -> int:
        return max(self.t1 - self.t0, 1)

    def api_names(self, tags: np.ndarray, limit: int = 5) -> dict[str, int]:
        """API call names (with counts of calls) of the given correlation ids.

        One binary search per tag into the API calls sorted by tag (built once) and a
        scatter into a per-call mask: no sort of ``tags`` (millions of commands), no
        per-id Python.
        """
        if len(self.api) == 0 or len(tags) == 0:
            return {}
        if self._api_sorted is None:
            o = np.argsort(self.api["tag"], kind="stable")
            self._api_sorted = (self.api["tag"][o], self.api["name_id"][o])
        stags, snames = self._api_sorted
        tags = np.asarray(tags, dtype=stags.dtype)
        idx = np.searchsorted(stags, tags)
        idx[idx >= len(stags)] = len(stags) - 1
        hit = (stags[idx] == tags) & (tags != 0)
        sel = np.zeros(len(stags), bool)
        sel[idx[hit]] = True
        # calls sharing a tag (one per API call in practice): all of them
        if len(stags) > 1 and sel.any():
            dup = np.r_[False, stags[1:] == stags[:-1]]
            if dup.any():
                grp = np.cumsum(~dup) - 1
                gsel = np.zeros(int(grp[-1]) + 1, bool)
                gsel[grp[sel]] = True
                sel = gsel[grp]
        cnt = np.bincount(snames[sel].astype(np.int64))
        ids = np.flatnonzero(cnt)
        o = ids[np.argsort(-cnt[ids], kind="stable")][:limit]
        s = self.cap.strings
        return {s.get(int(i), f"#{i}"): int(cnt[i]) for i in o}

    def api_args(self, tags: np.ndarray) -> list[str]:
        """The arguments string of the API call of each tag ("" when none: untagged, no
        API stream, or a call recorded without arguments); one binary search per tag."""
        if len(self.api) == 0 or len(tags) == 0:
            return [""] * len(tags)
        o = np.argsort(self.api["tag"], kind="stable")
        stags, sargs = self.api["tag"][o], self.api["args_id"][o]
        tags = np.asarray(tags, dtype=stags.dtype)
        idx = np.minimum(np.searchsorted(stags, tags), len(stags) - 1)
        hit = (stags[idx] == tags) & (tags != 0)
        s = self.cap.strings
        return [s.get(int(sargs[i]), "") if h and sargs[i] else ""
                for i, h in zip(idx.tolist(), hit.tolist(), strict=True)]


def load(cap: Capture) -> Data:
    parts: dict[str, list[np.ndarray]] = {k: [] for k in Cmds.__dataclass_fields__}
    for ch in cap.chunks("device_trace"):
        ts = np.empty(len(ch), np.int64)
        te = np.empty(len(ch), np.int64)
        tf = np.empty(len(ch), np.int64)
        for fid in np.unique(ch["fid"]).tolist():
            m = ch["fid"] == fid
            clk = cap.device_clock(int(fid)) if fid < len(cap.functions) else None
            if clk is None:
                continue
            ts[m], te[m], tf[m] = (clk.convert(ch[c][m]) for c in ("t_start", "t_end", "t_fetch"))
        parts["fid"].append(ch["fid"].astype(np.int64))
        parts["engine"].append(ch["engine"].astype(np.int64))
        parts["queue"].append(ch["queue"].astype(np.int64))
        parts["opcode"].append(ch["opcode"].astype(np.int64))
        parts["tag"].append(ch["tag"].copy())
        parts["bytes"].append(ch["bytes"].astype(np.int64))
        parts["tlps"].append(ch["tlps"].astype(np.int64))
        parts["tlb"].append(ch["tlb_misses"].astype(np.int64))
        parts["tf"].append(tf)
        parts["ts"].append(ts)
        parts["te"].append(np.maximum(te, ts))
        for k, col in (("ver", "version"), ("flops", "flops"), ("rd", "bytes_read"),
                       ("wr", "bytes_written"), ("dtype", "dtype"), ("subop", "subop"),
                       ("list_id", "list_id"), ("index", "index")):
            parts[k].append(ch[col].astype(np.int64))
    cmds = Cmds(**{k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in
                   parts.items()})
    # FILL is the driver scrubbing freed device memory (docs/uapi.md), not the workload
    cmds = cmds.sel(cmds.opcode != Opcode.FILL)
    # virtio-tacc's kick and dispatch records (trace version 2) are events, not commands
    cmds = cmds.sel(cmds.opcode < TRACE_EV_BASE)
    keep = [int(k) for k in DRIVER_KEEP]
    drv_parts = []
    for ch in cap.chunks("driver"):
        m = np.isin(ch["kind"], keep) | ((ch["kind"] == DriverKind.IOCTL) &
                                         np.isin(ch["arg"], BUFFER_IOCTLS))
        drv_parts.append(ch[DRIVER_COLS][m])
    from tacc.capture.schema import DRIVER_DTYPE

    drv = np.concatenate(drv_parts) if drv_parts else np.zeros(0, DRIVER_DTYPE)[DRIVER_COLS]
    api = cap.read("api", ["t_start", "t_end", "tag", "name_id", "args_id", "pid", "tid",
                           "bytes", "fid"])
    host = cap.read("host", ["t_ns", "dur_ns", "kind", "size", "tid", "pid", "dev",
                             "prev_state", "comm"])
    tlb: dict[int, tuple[int, int, int]] = {}
    first: dict[int, np.ndarray] = {}
    last: dict[int, np.ndarray] = {}
    for ch in cap.chunks("counters", ["fid", "tlb_hits", "tlb_misses", "tlb_walk_reads"]):
        for fid in np.unique(ch["fid"]).tolist():
            sub = ch[ch["fid"] == fid]
            first.setdefault(int(fid), sub[0])
            last[int(fid)] = sub[-1]
    for fid, a in first.items():
        b = last[fid]
        tlb[fid] = (int(b["tlb_hits"]) - int(a["tlb_hits"]),
                    int(b["tlb_misses"]) - int(a["tlb_misses"]),
                    int(b["tlb_walk_reads"]) - int(a["tlb_walk_reads"]))
    t0, t1 = cap.time_range
    return Data(cap, t0, t1, cap.functions, cmds, drv, api, host, tlb)


# ---------------------------------------------------------------- helpers --
def union_length(ts: np.ndarray, te: np.ndarray) -> int:
    """Total length of the union of intervals."""
    if len(ts) == 0:
        return 0
    o = np.argsort(ts, kind="stable")
    s, e = ts[o], te[o]
    run = np.maximum.accumulate(e)
    prev = np.r_[np.iinfo(np.int64).min, run[:-1]]
    return int(np.sum(np.maximum(e - np.maximum(s, prev), 0) * (e > prev)))


def merged(ts: np.ndarray, te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint busy periods."""
    if len(ts) == 0:
        return ts, te
    o = np.argsort(ts, kind="stable")
    s, e = ts[o], te[o]
    run = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > run[:-1]]
    starts = s[new]
    grp = np.cumsum(new) - 1
    ends = np.zeros(len(starts), np.int64)
    np.maximum.at(ends, grp, e)
    return starts, ends


def window_amount(ts: np.ndarray, te: np.ndarray, amount: np.ndarray, edges: np.ndarray
                  ) -> np.ndarray:
    """Spread each interval's ``amount`` uniformly over [ts, te) and sum per window."""
    if len(ts) == 0:
        return np.zeros(len(edges) - 1)
    dur = np.maximum(te - ts, 1).astype(np.float64)
    rate = amount.astype(np.float64) / dur
    pts = np.concatenate([ts, te])
    dr = np.concatenate([rate, -rate])
    o = np.argsort(pts, kind="stable")
    pts, dr = pts[o], dr[o]
    r = np.cumsum(dr)  # rate after each point
    cum = np.r_[0.0, np.cumsum(r[:-1] * np.diff(pts).astype(np.float64))]
    at = np.interp(edges.astype(np.float64), pts.astype(np.float64), cum)
    return np.diff(at)


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) indices of runs of True."""
    d = np.diff(np.r_[0, mask.astype(np.int8), 0])
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def union_by_group(g: np.ndarray, ts: np.ndarray, te: np.ndarray, ngroups: int) -> np.ndarray:
    """Union length of the intervals of each group (vectorised, groups 0..ngroups-1)."""
    if len(ts) == 0:
        return np.zeros(ngroups, np.int64)
    o = np.lexsort((ts, g))
    g, s, e = g[o], ts[o], te[o]
    base = int(s.min())
    span = int(e.max()) - base + 1
    key = (e - base) + g.astype(np.int64) * span
    run = np.maximum.accumulate(key) - g.astype(np.int64) * span + base
    prev = np.r_[np.iinfo(np.int64).min, run[:-1]]
    first = np.r_[True, g[1:] != g[:-1]]
    prev[first] = np.iinfo(np.int64).min
    contrib = np.maximum(e - np.maximum(s, prev), 0)
    return np.bincount(g, weights=contrib, minlength=ngroups).astype(np.int64)
