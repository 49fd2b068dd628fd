"""Storage reads and uploads of a load not overlapped (docs/analysis.md "load_serialised"):
each tensor read from storage, then uploaded, then the next read, so the storage idles
while the device uploads and the device idles while the storage reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tacc.analyze.data import Data, merged
from tacc.analyze.rules.base import Finding, clip_ranges
from tacc.analyze.rules.jobs import range_names
from tacc.capture.schema import BlockOp, DriverKind, HostKind, Opcode

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class LoadSerialisedThresholds:
    load_min_read_bytes: int = 1 << 20  # block reads of one process from one device
    load_max_overlap: float = 0.1  # reads issued in an upload, uploads submitted in a read
    load_min_phases: int = 3  # read phases (tensors) with an upload between them
    load_upload_ratio: float = 0.9  # a load uploads at least this share of what it read


def storage_reads(d: Data) -> np.ndarray:
    """The block read completions of the capture (host records of kind BLOCK_COMPLETE whose
    operation is a read; a capture older than minor 13 records no operation: none)."""
    h = d.host
    if not len(h) or "prev_state" not in (h.dtype.names or ()) or \
            d.cap.format_version < (1, 13):
        return h[:0]
    return h[(h["kind"] == HostKind.BLOCK_COMPLETE) & (h["prev_state"] == BlockOp.READ)]


def flow_ns(stages: list[np.ndarray]) -> int:
    """Makespan of phases passing through ``stages`` in order (a flow shop: phase i enters
    stage s when stage s has finished phase i-1 and stage s-1 phase i), with as many
    buffers between stages as it takes."""
    done = np.zeros(len(stages[0]) if stages else 0, np.int64)
    for p in stages:
        t = 0
        for i, x in enumerate(np.asarray(p, np.int64).tolist()):
            t = max(t, int(done[i])) + x
            done[i] = t
    return int(done[-1]) if len(done) else 0


def _overlap(as_: np.ndarray, ae: np.ndarray, bs: np.ndarray, be: np.ndarray) -> int:
    """Length of (union of a) intersected with (union of b); both merged and sorted."""
    total = 0
    j = 0
    for s, e in zip(as_.tolist(), ae.tolist(), strict=True):
        while j < len(bs) and be[j] <= s:
            j += 1
        k = j
        while k < len(bs) and bs[k] < e:
            total += min(e, int(be[k])) - max(s, int(bs[k]))
            k += 1
    return total


def load_serialised(d: Data, th: Thresholds) -> list[Finding]:
    """Per process and block device: its reads (``load_min_read_bytes`` or more) and the
    H2D copies it submitted from its first read to the first one after its last read
    (the load, which must upload ``load_upload_ratio`` of the bytes read).  Fewer than
    ``load_max_overlap`` of its read requests issued while an upload was in flight
    (submit to device end) and of its uploads submitted while a read was, with at least
    ``load_min_phases`` read phases separated by uploads: serialised.  Time lost: the
    load's span minus the span of the same phases pipelined (:func:`flow_ns`) through
    three stages: the storage (a read phase), the host (from a read phase's end to the
    submit of its first upload: the copy into staging and the submit path) and the link
    (the device time of the phase's uploads).  The rest of an upload phase, the latency
    from a submit to the device's start and from its end to the next read (completion,
    wake-up), is a wait, not a resource: pipelined, it overlaps the next phases' work."""
    reads = storage_reads(d)
    c = d.cmds
    up = c.sel(c.opcode == Opcode.COPY_H2D)
    if not len(reads) or not len(up):
        return []
    o = np.argsort(up.ts, kind="stable")
    up = up.sel(o)
    drv = d.drv
    sub = drv[drv["kind"] == DriverKind.SUBMIT] if len(drv) else drv
    out = []
    keys = np.unique(np.stack([reads["pid"].astype(np.int64),
                               reads["dev"].astype(np.int64)], 1), axis=0)
    for pid, dev in keys.tolist():
        r = reads[(reads["pid"] == pid) & (reads["dev"] == dev)]
        nbytes = int(r["size"].sum())
        if nbytes < th.load_min_read_bytes:
            continue
        rs = (r["t_ns"] - r["dur_ns"]).astype(np.int64)
        re_ = r["t_ns"].astype(np.int64)
        # the process's uploads: its submits' tags (the driver stream), else every upload
        mine = up
        if len(sub):
            tags = sub["tag"][sub["pid"] == pid]
            if len(tags):
                mine = up.sel(np.isin(up.tag, tags))
        mine = mine.sel(mine.ts >= rs.min())
        if not len(mine):
            continue
        # the load ends with the first upload after its last read (all its commands)
        after = np.flatnonzero(mine.ts >= int(re_.max()))
        if not len(after):
            continue  # nothing uploaded after the reads
        last_tag = mine.tag[after[0]]
        t_end = int(mine.te[(mine.tag == last_tag)].max())
        load = mine.sel(mine.ts <= t_end)
        if int(load.bytes.sum()) < th.load_upload_ratio * nbytes:
            continue  # the reads were not uploaded (not a load)
        inr = re_ <= t_end
        rs, re_ = rs[inr], re_[inr]
        t0 = int(rs.min())
        ms, me = merged(rs, re_)
        # an upload runs from its submit (the driver's record of its tag) to its device end
        ws = load.ts.copy()
        if len(sub):
            o = np.argsort(sub["tag"], kind="stable")
            st, sts = sub["tag"][o], sub["t_ns"][o].astype(np.int64)
            k = np.minimum(np.searchsorted(st, load.tag), len(st) - 1)
            ws = np.where(st[k] == load.tag, np.minimum(sts[k], load.ts), load.ts)
        us, ue = merged(ws, load.te)
        read_busy = int((me - ms).sum())
        up_busy = int((ue - us).sum())
        ovl = _overlap(ms, me, us, ue)
        # concurrency: reads issued while an upload was in flight, uploads submitted while
        # a read was (a pipelined load has many of one or the other; a serialised one none)
        ki = np.searchsorted(us, rs, side="right") - 1
        reads_in_up = float(np.mean((ki >= 0) & (rs < ue[np.maximum(ki, 0)])))
        kr = np.searchsorted(ms, ws, side="right") - 1
        ups_in_read = float(np.mean((kr >= 0) & (ws < me[np.maximum(kr, 0)])))
        ratio = max(reads_in_up, ups_in_read)
        if ratio >= th.load_max_overlap:
            continue
        # phases: consecutive reads with no upload between them are one read phase;
        # the time from a read phase's end to the next read (or the load's end), an
        # upload phase (the host copy, the submit, the transfer, the wait)
        nxt = np.r_[ms[1:], t_end]
        j = np.searchsorted(us, me, side="left")  # first upload starting at or after
        gap_has_up = (j < len(us)) & (us[np.minimum(j, len(us) - 1)] < nxt)
        ends = np.flatnonzero(gap_has_up)
        if len(ends) < th.load_min_phases:
            continue
        starts = np.r_[0, ends[:-1] + 1]
        r_ph = me[ends] - ms[starts]
        u_ph = nxt[ends] - me[ends]
        # the upload phase's host work (to its first submit) and link time (its uploads'
        # device time); the rest of it is waiting
        h_ph = us[j[ends]] - me[ends]
        dev_s, dev_e = merged(load.ts, load.te)
        g_ph = np.array([_overlap(dev_s, dev_e, np.array([a]), np.array([b]))
                         for a, b in zip(me[ends].tolist(), nxt[ends].tolist(), strict=True)],
                        np.int64)
        span = t_end - t0
        ideal = flow_ns([r_ph, h_ph, g_ph])
        lost = int(span - ideal)
        if lost < th.min_time_lost_ns:
            continue
        pids = d.api["pid"] if len(d.api) else np.zeros(0)
        comm = r["comm"][0].decode(errors="replace") if "comm" in (r.dtype.names or ()) \
            else ""
        fids = sorted(set(load.fid.tolist()))
        names = {f.fid: f for f in d.functions}
        gs, ge = me[ends], nxt[ends]
        out.append(Finding(
            rule="load_serialised",
            title=f"{len(ends)} storage reads of pid {pid} ({nbytes / (1 << 20):.1f} MiB "
                  f"from block {dev >> 20}:{dev & 0xFFFFF}) each waited for the previous "
                  f"upload: {100 * reads_in_up:.0f} % of the reads ran during an upload",
            time_ranges=clip_ranges(d, gs, ge, th),
            evidence={"pid": int(pid), "comm": comm, "block_dev": f"{dev >> 20}:{dev & 0xFFFFF}",
                      "read_requests": int(inr.sum()), "read_bytes": int(r["size"][inr].sum()),
                      "read_busy_ns": read_busy, "upload_commands": len(load),
                      "upload_bytes": int(load.bytes.sum()), "upload_busy_ns": up_busy,
                      "overlap_ns": int(ovl), "reads_in_uploads": round(reads_in_up, 4),
                      "uploads_in_reads": round(ups_in_read, 4),
                      "phases": len(ends), "read_phase_ns": int(r_ph.sum()),
                      "upload_phase_ns": int(u_ph.sum()), "host_phase_ns": int(h_ph.sum()),
                      "link_phase_ns": int(g_ph.sum()), "load_ns": int(span),
                      "pipelined_ns": int(ideal), "traced_api": bool(np.isin(pid, pids).any()),
                      "ranges": range_names(d, gs, ge)},
            time_lost_ns=lost,
            suggestion="read the next tensor while the previous one uploads: a reader "
                       "thread (or io_uring) reading into one of two pinned staging "
                       "buffers, the uploads on a stream with an event per buffer before "
                       "it is refilled (tacc run load's good twin)",
            functions=[names[f].pci for f in fids if f in names],
        ))
    return out
