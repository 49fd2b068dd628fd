"""In-guest: the runtime against tacc.ko and the QEMU device (small sizes, TCG).

The tests taking ``ctx`` run on every function kind the boot has (one uAPI on
all of them): the PF in every boot, and a VF and virtio-tacc in the extras boot (VFS=2
VIRTIO=1), where this file runs again.
"""

from __future__ import annotations

import numpy as np
import pytest
from tacc.runtime import (
    BufferKindError,
    Context,
    ContextClosedError,
    DtypeError,
    ShapeError,
    UseAfterFreeError,
    WrongDeviceError,
    devices,
)
from tacc.workloads import run, run_twins


def _kinds() -> list[str]:
    """The function kinds of this boot, PF first (collection time)."""
    try:
        have = {d.kind for d in devices()}
    except OSError:
        have = set()
    return ["pf"] + [k for k in ("vf", "virtio") if k in have]


KINDS = _kinds()


def kind_context(kind: str) -> Context:
    """A context on the first function of ``kind`` (the PF: the default device)."""
    if kind == "pf":
        return Context()
    found = [d for d in devices() if d.kind == kind]
    assert found, f"no {kind} function any more (the boot had one at collection)"
    return Context(found[0])


@pytest.fixture(params=KINDS)
def ctx(request: pytest.FixtureRequest) -> Context:
    c = kind_context(request.param)
    yield c
    c.close()


def test_discovery(pf_pci) -> None:  # type: ignore[no-untyped-def]
    devs = devices()
    assert devs, "pyudev found no tacc function"
    pf = devs[0]
    assert pf.pci == pf_pci.name and not pf.is_vf
    assert pf.devnode.startswith("/dev/accel/accel")
    assert pf.devmem_bytes > 0 and pf.link_width > 0 and pf.queues == 4


def test_roundtrip_host_buffer(ctx: Context) -> None:
    h = ctx.host_buffer((256, 64))
    h.array[...] = np.arange(h.size, dtype=np.float32).reshape(h.shape)
    d = ctx.device_buffer((256, 64))
    out = ctx.host_buffer((256, 64))
    s = ctx.stream()
    s.copy_h2d(d, h)
    s.copy_d2h(out, d)
    s.synchronize()
    assert np.array_equal(out.array, h.array)


def test_gemm_eltwise_match_numpy(ctx: Context) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 48), dtype=np.float32)
    b = rng.standard_normal((48, 32), dtype=np.float32)
    bias = rng.standard_normal((64, 32), dtype=np.float32)
    da, db, dbias = ctx.to_device(a), ctx.to_device(b), ctx.to_device(bias)
    dc = ctx.device_buffer((64, 32))
    s = ctx.stream()
    s.copy_d2d(dc, dbias)
    s.gemm(da, db, dc, alpha=0.5, beta=1.0)
    s.relu(dc, dc)
    s.scale(dc, 2.0, dc)
    got = ctx.to_numpy(dc, s)
    want = 2.0 * np.maximum(0.5 * (a.astype(np.float64) @ b) + bias, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_userptr_misaligned_and_numpy_staging(ctx: Context) -> None:
    base = np.zeros(70_000, np.float32)
    x = base[17:17 + 50_000]  # 68 bytes past a page boundary at most
    x[:] = np.arange(x.size)
    u = ctx.wrap(x)
    assert u.offset == x.ctypes.data % 4096
    d = ctx.device_buffer(x.size)
    s = ctx.stream()
    s.copy_h2d(d, u)
    y = np.empty_like(x)
    s.copy_d2h(y, d)
    s.synchronize()
    assert np.array_equal(x, y)


def test_streams_and_events(ctx: Context) -> None:
    s1, s2 = ctx.stream(), ctx.stream()
    assert s1.queue != s2.queue
    h = ctx.host_buffer(1 << 18)
    h.array[:] = 3.0
    d = ctx.device_buffer(1 << 18)
    t0 = s1.record(timing=True)
    s1.copy_h2d(d, h)
    ev = s1.record()
    s2.wait_event(ev)
    s2.scale(d, 2.0, d)
    t1 = s2.record(timing=True)
    s2.synchronize()
    assert ev.query()
    assert t1.elapsed_ns(t0) > 0
    assert np.all(ctx.to_numpy(d) == 6.0)


def test_errors_are_python_exceptions(ctx: Context) -> None:
    s = ctx.stream()
    d32 = ctx.device_buffer((8, 8))
    d64 = ctx.device_buffer((8, 8), np.float64)
    with pytest.raises(DtypeError):
        s.gemm(d64, d32, d32)
    with pytest.raises(ShapeError):
        s.gemm(d32, ctx.device_buffer((4, 8)), d32)
    with pytest.raises(BufferKindError):
        s.gemm(ctx.host_buffer((8, 8)), d32, d32)
    other = Context()
    try:
        with pytest.raises(WrongDeviceError):
            s.copy_d2d(d32, other.device_buffer((8, 8)))
    finally:
        other.close()
    d32.free()
    with pytest.raises(UseAfterFreeError):
        s.relu(d32, d32)
    ctx.close()
    with pytest.raises(ContextClosedError):
        s.relu(d64, d64)
    with pytest.raises(ContextClosedError):
        ctx.device_buffer(4)


def test_workloads_match_numpy(ctx: Context) -> None:
    """The workloads' numpy checks on this function kind: mlp (both variants) and the
    twins with a small default size (the timed comparisons stay in
    test_runtime_workloads.py, on the PF)."""
    for bad in (False, True):
        r = run("mlp", ctx, bad, batches=2)
        assert r.checked and r.max_abs_err < 1e-3, r
    for name, kw in (("tiny_transfers", {}), ("serialized_copies", {"rows": 256})):
        for r in run_twins(name, ctx, **kw):
            assert r.checked and r.max_abs_err < 1e-3, (name, r)
