"""The BPF program's event record (``struct tacc_ev`` in program.py) as numpy, and its
conversion to the capture's driver and host streams (tacc.capture.schema).

Field use per kind (``a``..``d`` u64, ``x``/``w``/``v`` u32, ``z`` s32, ``y`` u16):

=============  ==========  ==========  =========  ==========  =====  ======  ========  ======  =====
kind           a           b           c          d           x      w       v         z       y
=============  ==========  ==========  =========  ==========  =====  ======  ========  ======  =====
IOCTL          nr          -           -          dur_ns      ctx    -       -         ret     -
SUBMIT         seqno       copy bytes  -          -           ctx    mix     ncmds     -       queue
DOORBELL       seqno       -           -          -           ctx    hw_job  tail      -       queue
IRQ            -           -           -          -           -      vector  status    -       -
JOB_START      seqno       -           -          wait_ns     ctx    hw_job  tail      -       queue
JOB_DONE       seqno       dev_start   dev_end    lat_ns      ctx    hw_job  status    error   queue
BO_CREATE      bo          size        -          -           ctx    type    flags     -       -
BO_DESTROY     bo          size        -          -           -      type    -         -       -
DMA_MAP/UNMAP  iova        len         bo         dur_ns      -      nents   dir       -       -
VM_BIND/UNB.   va          size        bo         page_size   ctx    -       -         -       -
MMU_FAULT      addr        -           -          -           ctx    type    write     -       queue
PM             -           -           -          -           -      from    to        -       -
RESET          seqno       -           -          -           ctx    -       -         reason  queue
TRACE_DROP     -           -           -          -           -      dropped total     -       -
=============  ==========  ==========  =========  ==========  =====  ======  ========  ======  =====

Host kinds are ``HOST_BASE + HostKind``: sched_switch (tid=prev, x=next_pid,
z=prev_state, comm/comm2), sched_wakeup (tid=woken, y=target cpu), block issue/complete
(x=dev, a=sector, b=bytes, d=dur_ns, v=operation: BlockOp), net tx/rx (b=len).
"""

from __future__ import annotations

import numpy as np

from tacc.capture.schema import (
    DRIVER_DTYPE,
    HOST_DTYPE,
    NO_FID,
    DriverKind,
    HostKind,
)

HOST_BASE = 32

EV_DTYPE = np.dtype(
    [
        ("ts", "<u8"), ("tag", "<u8"), ("a", "<u8"), ("b", "<u8"), ("c", "<u8"), ("d", "<u8"),
        ("pid", "<u4"), ("tid", "<u4"), ("dev", "<u4"), ("x", "<u4"), ("w", "<u4"),
        ("v", "<u4"), ("z", "<i4"), ("y", "<u2"), ("kind", "u1"), ("cpu", "u1"),
        ("comm", "S16"), ("comm2", "S16"),
    ]
)
assert EV_DTYPE.itemsize == 112

KIND_NAMES = {int(k): k.name.lower() for k in DriverKind}
KIND_NAMES.update({HOST_BASE + int(k): k.name.lower() for k in HostKind})


def driver_mask(ev: np.ndarray) -> np.ndarray:
    return ev["kind"] < HOST_BASE


# Per driver kind: (capture field, event field) copies; the table above, as data.  Every
# column not named stays zero, except the common ones (t_ns, tag, pid, tid, kind, cpu, ctx,
# queue, fid) and the adjustments in to_driver (span starts, BO flags, DMA ctx).
_K = DriverKind
FIELD_MAP: dict[int, tuple[tuple[str, str], ...]] = {int(k): m for k, m in {
    _K.IOCTL: (("dur_ns", "d"), ("arg", "a"), ("status", "z")),
    _K.SUBMIT: (("job", "a"), ("size", "b"), ("ncmds", "v"), ("arg", "w")),  # arg = mix
    _K.DOORBELL: (("job", "a"), ("arg", "w"), ("nsegs", "v")),  # nsegs = SQ tail
    _K.IRQ: (("arg", "w"), ("status", "v")),
    # dur = queue wait, nsegs = the SQ tail after the doorbell (tacc_doorbell's one extra fact)
    _K.JOB_START: (("job", "a"), ("arg", "w"), ("dur_ns", "d"), ("nsegs", "v")),
    # flags = hardware completion status, dur = submit -> completion
    _K.JOB_DONE: (("job", "a"), ("dev_start", "b"), ("dev_end", "c"), ("arg", "w"),
                  ("status", "z"), ("flags", "v"), ("dur_ns", "d")),
    # arg = the BO's kernel address (its identity across create/map/destroy)
    _K.BO_CREATE: (("arg", "a"), ("size", "b"), ("nsegs", "w")),
    _K.BO_DESTROY: (("arg", "a"), ("size", "b"), ("nsegs", "w")),
    _K.DMA_MAP: (("addr", "a"), ("size", "b"), ("arg", "c"), ("nsegs", "w"), ("dir", "v"),
                 ("dur_ns", "d")),
    _K.DMA_UNMAP: (("addr", "a"), ("size", "b"), ("arg", "c"), ("nsegs", "w"), ("dir", "v"),
                   ("dur_ns", "d")),
    _K.VM_BIND: (("addr", "a"), ("size", "b"), ("arg", "c"), ("page_size", "d")),
    _K.VM_UNBIND: (("addr", "a"), ("size", "b"), ("arg", "c"), ("page_size", "d")),
    _K.MMU_FAULT: (("addr", "a"), ("status", "w"), ("arg", "v")),
    _K.PM: (("arg", "v"), ("nsegs", "w")),  # arg = new state, nsegs = old
    _K.RESET: (("job", "a"), ("status", "z")),
    _K.TRACE_DROP: (("size", "w"), ("arg", "v")),
}.items()}
_SPANS = frozenset(int(k) for k in (_K.IOCTL, _K.DMA_MAP, _K.DMA_UNMAP))  # t_ns = start
_BO = frozenset(int(k) for k in (_K.BO_CREATE, _K.BO_DESTROY))
_DMA = frozenset(int(k) for k in (_K.DMA_MAP, _K.DMA_UNMAP))
# common columns: (capture field, event field)
_COMMON = (("t_ns", "ts"), ("tag", "tag"), ("pid", "pid"), ("tid", "tid"), ("kind", "kind"),
           ("cpu", "cpu"), ("ctx", "x"), ("queue", "y"))


_V_EV = np.dtype(f"V{EV_DTYPE.itemsize}")  # a record as one opaque item (row copies)
_V_DRIVER = np.dtype(f"V{DRIVER_DTYPE.itemsize}")


def to_driver(ev: np.ndarray, fid_of_dev: dict[int, int],
              mask: np.ndarray | None = None) -> np.ndarray:
    """Driver-kind events -> DRIVER_DTYPE records (t_ns CLOCK_MONOTONIC), in order.

    The driver events are put in kind order (a stable sort of the u8 kind column: one
    radix pass; host kinds sort last and are left out) by one row copy, converted column
    by column on contiguous per-kind slices (the common fields, then only the fields
    ``FIELD_MAP`` names for each kind present), and put back in arrival order by one row
    scatter: a few numpy calls per kind present, no per-field gathers or scatters.
    Integer columns are cast as numpy casts (wrapping; u64 -> i64, u32 -> u16/u8 keep
    the low bits).  ``mask`` (``driver_mask(ev)``), if given, saves recomputing it."""
    k_all = ev["kind"]
    counts = np.bincount(k_all, minlength=256)[:HOST_BASE]
    n = int(counts.sum())
    out = np.empty(n, DRIVER_DTYPE)
    if not n:
        return out
    order = np.argsort(k_all, kind="stable")[:n]  # event index of each sorted position
    ev_s = np.ascontiguousarray(ev).view(_V_EV)[order].view(EV_DTYPE)
    srt = np.zeros(n, DRIVER_DTYPE)
    for dst, src in _COMMON:
        srt[dst] = ev_s[src]
    devs = ev_s["dev"]
    if len(fid_of_dev) == 1 and bool((devs == next(iter(fid_of_dev))).all()):
        srt["fid"] = next(iter(fid_of_dev.values()))
    else:
        fid = np.full(n, NO_FID, np.uint16)
        for dev, f in fid_of_dev.items():
            fid[devs == dev] = f
        srt["fid"] = fid
    ends = np.cumsum(counts).tolist()
    for kind in np.flatnonzero(counts).tolist():
        a, b = ends[kind] - int(counts[kind]), ends[kind]
        o, e = srt[a:b], ev_s[a:b]
        for dst, src in FIELD_MAP.get(kind, ()):
            o[dst] = e[src]
        if kind in _SPANS:
            o["t_ns"] -= o["dur_ns"]
        if kind in _BO:
            w = e["w"]
            o["flags"] = np.where(w == 2, 1, 0) | np.where(w == 1, 8, 0)
        if kind in _DMA:
            o["ctx"] = 0
    if n == len(ev):
        pos = order
    else:  # output position = rank among the driver events
        if mask is None:
            mask = driver_mask(ev)
        pos = (np.cumsum(mask) - 1)[order]
    out.view(_V_DRIVER)[pos] = srt.view(_V_DRIVER)
    return out


_HOST_PAD = (HOST_DTYPE.fields or {})["_pad"][1]


def to_host(ev: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Host-kind events -> HOST_DTYPE records (``mask``: ``driver_mask(ev)`` if known).

    Every column written once over all the host events (kind-specific ones with
    ``np.where``): no zero-fill of the records, no masked assignments."""
    sel = np.flatnonzero(~(driver_mask(ev) if mask is None else mask))
    n = len(sel)
    out = np.empty(n, HOST_DTYPE)
    if not n:
        return out
    if n != len(ev):  # the host events' bytes, gathered by row
        ev = np.ascontiguousarray(ev).view(_V_EV)[sel].view(EV_DTYPE)
    out["t_ns"] = ev["ts"]
    out["kind"] = ev["kind"] - HOST_BASE
    out["pid"], out["tid"], out["cpu"] = ev["pid"], ev["tid"], ev["cpu"]
    out["comm"], out["next_comm"] = ev["comm"], ev["comm2"]
    out.view(np.uint8).reshape(n, HOST_DTYPE.itemsize)[:, _HOST_PAD] = 0
    k = out["kind"]
    sw = k == HostKind.SCHED_SWITCH
    blk = (k == HostKind.BLOCK_ISSUE) | (k == HostKind.BLOCK_COMPLETE)
    io = blk | (k == HostKind.NET_TX) | (k == HostKind.NET_RX)
    out["next_pid"] = np.where(sw, ev["x"], 0)
    # block records (minor 13): the request's operation (BlockOp) from the rwbs
    out["prev_state"] = np.where(sw, ev["z"], np.where(blk, ev["v"].astype(np.int32), 0))
    out["dev"] = np.where(io, ev["x"], 0)  # block device, or the net ifindex
    out["size"] = np.where(io, ev["b"], 0)
    out["sector"] = np.where(blk, ev["a"], 0)
    out["dur_ns"] = np.where(blk, ev["d"], 0)
    return out
