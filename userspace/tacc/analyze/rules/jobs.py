"""Jobs on the device queues, the host-starved gaps between them and the tacc.range names
a time range spans: what the inference rules (launch_bound, redundant_upload,
kv_roundtrip) share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tacc.analyze.data import Cmds, Data, merged
from tacc.capture.schema import DriverKind, Opcode

# not device-local work: host transfers and the control commands (NOP, fences, timestamps,
# barriers, the driver's FILL, a LIST itself); everything else (GEMM, element-wise,
# SOFTMAX, NORM, GATHER, D2D copies) is what a command list holds between the host's
# inputs and outputs
NOT_LOCAL = (Opcode.NOP, Opcode.COPY_H2D, Opcode.COPY_D2H, Opcode.FENCE, Opcode.TIMESTAMP,
             Opcode.BARRIER, Opcode.FILL, Opcode.LIST)


@dataclass
class Jobs:
    """One row per job (commands sharing a tag on one queue of one function), in device
    order per queue: first start, last end, commands, whether all are device-local, the
    host's submit time, and the device-idle gap before the job when the host submitted
    it only after the queue's previous job had ended (``starved``; else 0)."""

    fid: np.ndarray
    queue: np.ndarray
    tag: np.ndarray
    ts: np.ndarray
    te: np.ndarray
    ncmds: np.ndarray
    local: np.ndarray
    opcode: np.ndarray  # the first command's
    submit: np.ndarray
    starved: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)


def jobs(d: Data) -> Jobs:
    c = d.cmds
    local_ops = ~np.isin(c.opcode, [int(o) for o in NOT_LOCAL])
    if len(c) == 0:
        z = np.zeros(0, np.int64)
        return Jobs(z, z, z.astype(np.uint64), z, z, z, z.astype(bool), z, z, z)
    key = np.stack([c.fid, c.queue, c.tag.astype(np.int64)])
    _, inv = np.unique(key, axis=1, return_inverse=True)
    inv = inv.reshape(-1)
    n = int(inv.max()) + 1
    ts = np.full(n, np.iinfo(np.int64).max, np.int64)
    te = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(ts, inv, c.ts)
    np.maximum.at(te, inv, c.te)
    ncmds = np.bincount(inv, minlength=n)
    nlocal = np.bincount(inv, weights=local_ops, minlength=n)
    first = np.zeros(n, np.int64)
    first[inv[::-1]] = np.arange(len(inv))[::-1]
    fid, queue, tag = c.fid[first], c.queue[first], c.tag[first]
    o = np.lexsort((ts, queue, fid))
    fid, queue, tag, ts, te = fid[o], queue[o], tag[o], ts[o], te[o]
    ncmds, nlocal, opcode = ncmds[o], nlocal[o], c.opcode[first][o]
    # the host's submit of each job (driver SUBMIT by tag)
    sub = d.drv[d.drv["kind"] == DriverKind.SUBMIT]
    submit = np.full(len(tag), np.iinfo(np.int64).min, np.int64)
    if len(sub):
        so = np.argsort(sub["tag"], kind="stable")
        stag, st = sub["tag"][so], sub["t_ns"][so].astype(np.int64)
        idx = np.minimum(np.searchsorted(stag, tag), len(stag) - 1)
        hit = stag[idx] == tag
        submit[hit] = st[idx[hit]]
    same = np.r_[False, (fid[1:] == fid[:-1]) & (queue[1:] == queue[:-1])]
    prev_te = np.r_[np.iinfo(np.int64).min, te[:-1]]
    gap = np.maximum(ts - prev_te, 0)
    starved = np.where(same & (submit >= prev_te), gap, 0)
    return Jobs(fid, queue, tag, ts, te, ncmds, (nlocal == ncmds), opcode, submit, starved)


def range_names(d: Data, starts: np.ndarray, ends: np.ndarray, limit: int = 8
                ) -> dict[str, int]:
    """The tacc.range names (API records named ``range``) overlapping the given time
    ranges, with the overlapped time (ns) in each, most first."""
    names, ra, rb = range_records(d)
    if not names or len(starts) == 0:
        return {}
    out: dict[str, int] = {}
    o = np.argsort(starts)
    st, en = starts[o], ends[o]
    cum_en = np.maximum.accumulate(en)
    for a, b, name in zip(ra.tolist(), rb.tolist(), names, strict=True):
        lo = int(np.searchsorted(cum_en, a, "right"))
        hi = int(np.searchsorted(st, b, "left"))
        if hi <= lo:
            continue
        ov = np.minimum(en[lo:hi], b) - np.maximum(st[lo:hi], a)
        t = int(ov[ov > 0].sum())
        if t:
            out[name] = out.get(name, 0) + t
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:limit])


def api_copies(d: Data, name: str) -> tuple[np.ndarray, list[str]]:
    """The API records of ``name`` (copy_h2d, copy_d2h) and their argument strings."""
    s = d.cap.strings
    ids = [k for k, v in s.items() if v == name]
    api = d.api
    if not ids or len(api) == 0:
        return api[:0], []
    r = api[np.isin(api["name_id"], ids)]
    return r, [s.get(int(a), "") for a in r["args_id"].tolist()]


def cost_of_tags(j: Jobs, tags: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray]:
    """What the jobs of ``tags`` cost the device's timeline: (their device time, the
    host-starved gaps before them, starts, ends): the time a program without them saves,
    its submits gone with them."""
    m = np.isin(j.tag, tags)
    return (int((j.te[m] - j.ts[m]).sum()), int(j.starved[m].sum()), j.ts[m], j.te[m])


def api_covered(d: Data, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each interval [a, b) the host spent inside runtime API calls (the
    union of the capture's API records but ranges and recorded host work: host_preprocess,
    a host_op of tacc.onnx's fallback): the submit path."""
    api = d.api
    rid = [k for k, v in d.cap.strings.items() if v in ("range", "host_preprocess",
                                                         "host_op")]
    r = api[~np.isin(api["name_id"], rid)] if len(api) else api
    if len(r) == 0 or len(a) == 0:
        return np.zeros(len(a), np.int64)
    s, e = merged(r["t_start"].astype(np.int64), r["t_end"].astype(np.int64))
    cum = np.r_[0, np.cumsum(e - s)]

    def upto(t: np.ndarray) -> np.ndarray:  # API time before t
        i = np.searchsorted(s, t, "right")  # intervals starting at or before t
        inside = np.minimum(t, e[np.maximum(i - 1, 0)]) - s[np.maximum(i - 1, 0)]
        return cum[np.maximum(i - 1, 0)] + np.where(i > 0, np.maximum(inside, 0), 0)

    return np.maximum(upto(b) - upto(a), 0)


def range_records(d: Data) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The tacc.range records: names, starts, ends (host CLOCK_MONOTONIC ns)."""
    s = d.cap.strings
    rid = [k for k, v in s.items() if v == "range"]
    if not rid or len(d.api) == 0:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    r = d.api[np.isin(d.api["name_id"], rid)]
    return ([s.get(int(a), "?") for a in r["args_id"].tolist()],
            r["t_start"].astype(np.int64), r["t_end"].astype(np.int64))


def range_paths(d: Data) -> list[tuple[str, ...]]:
    """Per tacc.range record (range_records' order), the names of the ranges of its thread
    that enclose it, outermost first, then its own: where the range sits in the program
    (``("decode step 2", "L0")``).  Ranges of a thread nest (the runtime's ranges are
    ``with`` blocks); a sweep over starts keeps the open ones on a stack."""
    names, a, b = range_records(d)
    if not names:
        return []
    s = d.cap.strings
    rid = [k for k, v in s.items() if v == "range"]
    tid = d.api[np.isin(d.api["name_id"], rid)]["tid"].astype(np.int64)
    paths: list[tuple[str, ...]] = [()] * len(names)
    stacks: dict[int, list[int]] = {}
    for r in np.lexsort((-(b - a), a, tid)).tolist():  # per thread, by start, longest first
        st = stacks.setdefault(int(tid[r]), [])
        while st and b[st[-1]] < b[r]:  # closed before this one ends: not an ancestor
            st.pop()
        paths[r] = tuple(names[q] for q in st) + (names[r],)
        st.append(r)
    return paths


def innermost_range(d: Data, c: Cmds) -> tuple[list[str], np.ndarray]:
    """(range names, index per command of the innermost tacc.range occurrence holding it
    on the device's timeline, -1 = none): ranges applied longest first, so a nested one
    overrides its parent."""
    names, a, b = range_records(d)
    occ = np.full(len(c), -1, np.int64)
    if not names or len(c) == 0:
        return names, occ
    o = np.argsort(c.ts, kind="stable")
    ts = c.ts[o]
    for r in np.argsort(-(b - a), kind="stable").tolist():
        lo, hi = np.searchsorted(ts, a[r], "left"), np.searchsorted(ts, b[r], "right")
        sel = o[lo:hi]
        sel = sel[c.te[sel] <= b[r]]
        occ[sel] = r
    return names, occ
