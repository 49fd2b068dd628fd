"""Workloads of the user-space driver, checked against numpy: copies, a GEMM, NOPs."""

from __future__ import annotations

import time

import numpy as np

from tacc import hw
from tacc.errors import DeviceError
from tacc.vfio.driver import TaccVfio


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
