"""The BPF program's event record (``struct tacc_ev`` in program.py) as numpy, and its
conversion to the capture's driver and host streams (tacc.capture.schema).

Field use per kind (``a``..``d`` u64, ``x``/``w``/``v`` u32, ``z`` s32, ``y`` u16):

=============  ==========  ==========  =========  ==========  =====  ======  ========  ======  =====
kind           a           b           c          d           x      w       v         z       y
=============  ==========  ==========  =========  ==========  =====  ======  ========  ======  =====
IOCTL          nr          -           -          dur_ns      ctx    -       -         ret     -
SUBMIT         seqno       copy bytes  -          -           ctx    -       ncmds     -       queue
DOORBELL       seqno       -           -          -           ctx    hw_job  tail      -       queue
IRQ            -           -           -          -           -      vector  status    -       -
JOB_START      seqno       -           -          wait_ns     ctx    hw_job  -         -       queue
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
(x=dev, a=sector, b=bytes, d=dur_ns), net tx/rx (b=len).
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


def to_driver(ev: np.ndarray, fid_of_dev: dict[int, int]) -> np.ndarray:
    """Driver-kind events -> DRIVER_DTYPE records (t_ns CLOCK_MONOTONIC)."""
    ev = ev[driver_mask(ev)]
    out = np.zeros(len(ev), DRIVER_DTYPE)
    if not len(ev):
        return out
    k = ev["kind"]
    out["t_ns"] = ev["ts"].astype(np.int64)
    out["tag"] = ev["tag"]
    out["pid"], out["tid"] = ev["pid"], ev["tid"]
    out["kind"] = k
    out["cpu"] = ev["cpu"]
    out["ctx"] = ev["x"].astype(np.uint16)
    out["queue"] = ev["y"].astype(np.uint8)
    fid = np.full(len(ev), NO_FID, np.uint16)
    for dev, f in fid_of_dev.items():
        fid[ev["dev"] == dev] = f
    out["fid"] = fid

    def sel(kind: DriverKind | tuple[DriverKind, ...]) -> np.ndarray:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        return np.isin(k, [int(x) for x in kinds])

    s = sel(DriverKind.IOCTL)  # a span: t_ns is the start
    out["dur_ns"][s] = ev["d"][s].astype(np.int64)
    out["t_ns"][s] -= out["dur_ns"][s]
    out["arg"][s], out["status"][s] = ev["a"][s], ev["z"][s]
    s = sel(DriverKind.SUBMIT)
    out["job"][s], out["size"][s], out["ncmds"][s] = ev["a"][s], ev["b"][s], ev["v"][s]
    s = sel(DriverKind.DOORBELL)
    out["job"][s], out["arg"][s] = ev["a"][s], ev["w"][s]
    out["nsegs"][s] = ev["v"][s]  # SQ tail
    s = sel(DriverKind.IRQ)
    out["arg"][s], out["status"][s] = ev["w"][s], ev["v"][s].astype(np.int32)
    s = sel(DriverKind.JOB_START)
    out["job"][s], out["arg"][s] = ev["a"][s], ev["w"][s]
    out["dur_ns"][s] = ev["d"][s].astype(np.int64)  # queue wait since submit
    s = sel(DriverKind.JOB_DONE)
    out["job"][s], out["dev_start"][s], out["dev_end"][s] = ev["a"][s], ev["b"][s], ev["c"][s]
    out["arg"][s], out["status"][s] = ev["w"][s], ev["z"][s]
    out["flags"][s] = ev["v"][s]  # hardware completion status
    out["dur_ns"][s] = ev["d"][s].astype(np.int64)  # submit -> completion
    s = sel((DriverKind.BO_CREATE, DriverKind.BO_DESTROY))
    # arg = the BO's kernel address (its identity across create/map/destroy)
    out["arg"][s], out["size"][s], out["nsegs"][s] = ev["a"][s], ev["b"][s], ev["w"][s]
    out["flags"][s] = np.where(ev["w"][s] == 2, 1, 0) | np.where(ev["w"][s] == 1, 8, 0)
    s = sel((DriverKind.DMA_MAP, DriverKind.DMA_UNMAP))
    out["addr"][s], out["size"][s], out["arg"][s] = ev["a"][s], ev["b"][s], ev["c"][s]
    out["nsegs"][s], out["dir"][s] = ev["w"][s], ev["v"][s].astype(np.uint8)
    out["dur_ns"][s] = ev["d"][s].astype(np.int64)
    out["t_ns"][s] -= out["dur_ns"][s]
    out["ctx"][s] = 0
    s = sel((DriverKind.VM_BIND, DriverKind.VM_UNBIND))
    out["addr"][s], out["size"][s], out["arg"][s] = ev["a"][s], ev["b"][s], ev["c"][s]
    out["page_size"][s] = ev["d"][s].astype(np.uint32)
    s = sel(DriverKind.MMU_FAULT)
    out["addr"][s], out["status"][s], out["arg"][s] = ev["a"][s], ev["w"][s], ev["v"][s]
    s = sel(DriverKind.PM)
    out["arg"][s], out["nsegs"][s] = ev["v"][s], ev["w"][s]  # arg = new state, nsegs = old
    s = sel(DriverKind.RESET)
    out["job"][s], out["status"][s] = ev["a"][s], ev["z"][s]
    s = sel(DriverKind.TRACE_DROP)
    out["size"][s], out["arg"][s] = ev["w"][s], ev["v"][s]
    return out


def to_host(ev: np.ndarray) -> np.ndarray:
    """Host-kind events -> HOST_DTYPE records."""
    ev = ev[~driver_mask(ev)]
    out = np.zeros(len(ev), HOST_DTYPE)
    if not len(ev):
        return out
    out["t_ns"] = ev["ts"].astype(np.int64)
    out["kind"] = ev["kind"] - HOST_BASE
    out["pid"], out["tid"], out["cpu"] = ev["pid"], ev["tid"], ev["cpu"]
    out["comm"], out["next_comm"] = ev["comm"], ev["comm2"]
    k = out["kind"]
    s = k == HostKind.SCHED_SWITCH
    out["next_pid"][s], out["prev_state"][s] = ev["x"][s], ev["z"][s]
    s = np.isin(k, [HostKind.BLOCK_ISSUE, HostKind.BLOCK_COMPLETE])
    out["dev"][s], out["sector"][s], out["size"][s] = ev["x"][s], ev["a"][s], ev["b"][s]
    out["dur_ns"][s] = ev["d"][s].astype(np.int64)
    s = np.isin(k, [HostKind.NET_TX, HostKind.NET_RX])
    out["size"][s], out["dev"][s] = ev["b"][s], ev["x"][s]
    return out
