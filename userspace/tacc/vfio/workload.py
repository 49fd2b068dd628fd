"""Workloads of the user-space driver, checked against numpy: copies, a GEMM, NOPs, and
a live migration with jobs in flight (a VF on tacc_vfio_pci)."""

from __future__ import annotations

import ctypes as C
import errno
import os
import struct
import time
from collections.abc import Callable

import numpy as np

from tacc import hw
from tacc.errors import DeviceError, VfioError
from tacc.vfio.driver import CQ_ENTRIES, QUEUE, TaccVfio
from tacc.vfio.migration import Migration

VFSTATE_HDR = struct.Struct("<IHHHHIQQQIIQQ")  # struct tacc_vfstate_hdr (docs/hardware.md 16)


def _ok(t: TaccVfio, descs: list[bytes], what: str) -> None:
    c = t.run(descs)
    if c.status != hw.TACC_ST_OK:
        raise DeviceError(f"{t.bdf}: {what}: completion status {c.status}")


def copies(t: TaccVfio, size: int = 1 << 20, seed: int = 1, huge: bool = False) -> int:
    """Host -> device -> host of @size random bytes; returns the bytes checked."""
    src, dst = t.alloc(size, huge=huge), t.alloc(size, huge=huge)
    try:
        data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        src.array[:size] = data
        _ok(t, [t.copy_h2d(src, 0, size), t.copy_d2h(0, dst, size)], "copy")
        if not np.array_equal(dst.array[:size], data):
            bad = int(np.flatnonzero(dst.array[:size] != data)[0])
            raise DeviceError(f"{t.bdf}: copy differs at byte {bad}")
        return size
    finally:
        t.free(src)
        t.free(dst)


def gemm(t: TaccVfio, m: int = 64, n: int = 48, k: int = 32, seed: int = 2) -> float:
    """C = A x B on the device, against numpy; returns the max relative error."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    oa, ob, oc = 0, a.nbytes, a.nbytes + b.nbytes
    host = t.alloc(oc + m * n * 4)
    try:
        host.array[:oa + a.nbytes] = a.view(np.uint8).ravel()
        host.array[ob:oc] = b.view(np.uint8).ravel()
        _ok(t, [t.copy_h2d(host, 0, oc), t.gemm(oa, ob, oc, m, n, k),
                t.copy_d2h(oc, host, m * n * 4, dst_off=oc)], "gemm")
        c = host.view(np.float32)[oc // 4: oc // 4 + m * n].reshape(m, n)
        ref = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        if not np.allclose(c, ref, rtol=1e-5, atol=1e-5):
            raise DeviceError(f"{t.bdf}: GEMM differs from numpy by "
                              f"{float(np.abs(c - ref).max())}")
        return float(np.abs(c - ref).max() / max(float(np.abs(ref).max()), 1e-30))
    finally:
        t.free(host)


def nop_latency(t: TaccVfio, count: int) -> list[int]:
    """Submit-to-completion of @count single-NOP jobs, one at a time, ns each."""
    out = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        c = t.run([t.nop()])
        out.append(time.perf_counter_ns() - t0)
        if c.status != hw.TACC_ST_OK:
            raise DeviceError(f"{t.bdf}: NOP status {c.status}")
    return out


def migrate_in_flight(t: TaccVfio, m: Migration, n: int = 256 << 10, seed: int = 11,
                      between: Callable[[bytes], None] | None = None) -> dict:
    """A VF's live migration with two jobs in flight, through the VFIO migration uAPI
    (the VF on tacc_vfio_pci; docs/vfio.md "Migration"), checked against numpy.

    @n random bytes go to device memory; the CQ is filled with NOP completions nobody
    consumes, then job X (device memory -> host) runs and its completion waits for CQ
    space, and job Y (the same copy to another buffer) waits behind it, not started.
    RUNNING -> STOP -> STOP_COPY (the state read) -> STOP; the VF is reset (FLR) and its
    device memory overwritten; @between(state) runs (the VF RUNNING, as after the reset);
    STOP -> RESUMING (the state written) -> STOP -> RUNNING, with the rings and page
    tables as they were at the stop (the VMM's guest RAM).  X and Y must complete with
    the data, Y's read from the restored device memory.  Dirty logging covers the
    driver's buffers from the start.

    Returns the figures: state bytes (total, registers, device memory), milliseconds of
    each phase (stop, stop_copy, read, load, resume; downtime their sum, the reset and
    @between excluded), and "dirty": the pages reported dirty (None where the kernel has
    no DMA_LOGGING_REPORT), "written": the pages of X's and Y's data and of the CQ.
    """
    from tacc.vfio import uapi as V

    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    src, dst, dst2, zero = (t.alloc(n) for _ in range(4))
    try:
        src.array[:n] = data
        _ok(t, [t.copy_h2d(src, 0, n)], "load")
        span = (t.bufs[0].iova, t.next_iova - t.bufs[0].iova)
        page = m.log_start([span], 4096)
        q = hw.TACC_QUEUE_BASE(QUEUE)
        full = (t.cq_head + CQ_ENTRIES - 1) % CQ_ENTRIES
        for _ in range(CQ_ENTRIES - 1):
            t.submit([t.nop()])
        deadline = time.monotonic() + 30
        while t.dev.r32(q + hw.TACC_Q_CQ_TAIL) != full:
            if time.monotonic() > deadline:
                raise DeviceError(f"{t.bdf}: the NOPs did not complete")
            time.sleep(0.001)
        jx = t.submit([t.copy_d2h(0, dst, n)])
        jy = t.submit([t.copy_d2h(0, dst2, n)])

        fig: dict = {}
        t0 = time.perf_counter()
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        fig["stop_ms"] = (time.perf_counter() - t0) * 1e3
        if dst2.array.any():
            raise DeviceError(f"{t.bdf}: job Y ran before the stop: nothing was in flight")
        size = m.data_size()
        t0 = time.perf_counter()
        fd = m.set_state(V.VFIO_DEVICE_STATE_STOP_COPY)
        fig["stop_copy_ms"] = (time.perf_counter() - t0) * 1e3
        assert fd is not None
        t0 = time.perf_counter()
        try:
            blob = m.read_all(fd)
        finally:
            os.close(fd)
        fig["read_ms"] = (time.perf_counter() - t0) * 1e3
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        hdr = VFSTATE_HDR.unpack_from(blob)
        fig.update(state_bytes=len(blob), size_reported=size, hdr_fn=hdr[3],
                   hdr_total=hdr[6], regs_bytes=hdr[7], devmem_bytes=hdr[8])

        ram = [t.pt_pool, t.sq, t.cq]
        saved = [C.string_at(b.addr, b.size) for b in ram]
        ptrs = (t.sq_tail, t.cq_head, t.job)
        t.reset()  # FLR: RUNNING, the VF programmed afresh
        _ok(t, [t.copy_h2d(zero, 0, n)], "overwrite")
        if between is not None:
            between(blob)
        m.set_state(V.VFIO_DEVICE_STATE_STOP)
        for b, d in zip(ram, saved, strict=True):
            C.memmove(b.addr, d, b.size)
        t.sq_tail, t.cq_head, t.job = ptrs
        t0 = time.perf_counter()
        m.load(blob)
        fig["load_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        m.set_state(V.VFIO_DEVICE_STATE_RUNNING)
        fig["resume_ms"] = (time.perf_counter() - t0) * 1e3
        cx, cy = t.wait(jx), t.wait(jy)
        if (cx.status, cy.status) != (0, 0):
            raise DeviceError(f"{t.bdf}: after the restore: statuses {cx.status}, {cy.status}")
        for name, b in (("X", dst), ("Y", dst2)):
            if not np.array_equal(b.array[:n], data):
                bad = int(np.flatnonzero(b.array[:n] != data)[0])
                raise DeviceError(f"{t.bdf}: job {name}'s data differs at byte {bad}")
        fig["downtime_ms"] = sum(fig[k] for k in ("stop_ms", "stop_copy_ms", "read_ms",
                                                  "load_ms", "resume_ms"))
        written = np.zeros(span[1] // page, dtype=bool)
        for b in (dst, dst2, t.cq):
            first = (b.iova - span[0]) // page
            written[first:first + b.size // page] = True
        fig["written"] = np.flatnonzero(written).tolist()
        try:
            fig["dirty"] = np.flatnonzero(m.log_report(span[0], span[1], page)).tolist()
        except VfioError as e:
            if e.errno != errno.EOPNOTSUPP:
                raise
            fig["dirty"] = None
        m.log_stop()
        return fig
    finally:
        for b in (src, dst, dst2, zero):
            t.free(b)
