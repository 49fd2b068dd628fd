"""The runtime API on the Python simulator backend (no device): semantics and errors."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from tacc.runtime import (
    BufferKindError,
    Context,
    ContextClosedError,
    DeviceNotFoundError,
    DtypeError,
    ShapeError,
    UseAfterFreeError,
    WrongDeviceError,
    devices,
    find,
)
from tacc.runtime.device import pci_id


@pytest.fixture()
def ctx() -> Iterator[Context]:
    c = Context(sim=True)
    yield c
    c.close()


def test_pci_id() -> None:
    assert pci_id("0000:01:00.0") == 0x100
    assert pci_id("0001:02:03.4") == (1 << 16) | (2 << 8) | (3 << 3) | 4


def test_sim_discovery() -> None:
    devs = devices(sim=True)
    assert len(devs) == 1 and devs[0].sim
    assert find("00:00.0", sim=True) is not None
    with pytest.raises(DeviceNotFoundError):
        find("0000:09:00.0", sim=True)
    with pytest.raises(DeviceNotFoundError):
        find(5, sim=True)


def test_host_buffer_is_a_zero_copy_view(ctx: Context) -> None:
    h = ctx.host_buffer((16, 8), np.float32)
    a = h.array
    assert a.shape == (16, 8) and a.dtype == np.float32
    a[3, 4] = 7.0
    assert h.array[3, 4] == 7.0  # same memory
    assert not a.flags.owndata


def test_copy_gemm_eltwise(ctx: Context) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 16), dtype=np.float32)
    b = rng.standard_normal((16, 8), dtype=np.float32)
    da, db = ctx.to_device(a), ctx.to_device(b)
    dc = ctx.device_buffer((32, 8))
    s = ctx.stream()
    s.gemm(da, db, dc, alpha=2.0)
    s.relu(dc, dc)
    s.add(dc, dc, dc)
    s.scale(dc, 0.25, dc)
    want = 0.5 * np.maximum(2 * a.astype(np.float64) @ b, 0)
    np.testing.assert_allclose(ctx.to_numpy(dc), want, rtol=1e-5, atol=1e-6)


def test_userptr_misaligned_slice(ctx: Context) -> None:
    base = np.zeros(10_000, np.float32)
    x = base[5:5 + 3000]
    x[:] = np.arange(3000)
    u = ctx.wrap(x)
    assert u.offset == x.ctypes.data % 4096 and not (u.aligned and u.offset)
    d = ctx.device_buffer(3000)
    s = ctx.stream()
    s.copy_h2d(d, u)
    y = np.zeros(3000, np.float32)
    s.copy_d2h(y, d)
    assert not y.any()  # filled at synchronize
    s.synchronize()
    assert np.array_equal(x, y)


def test_partial_copies_with_offsets(ctx: Context) -> None:
    h = ctx.host_buffer(1024, np.uint8)
    h.array[:] = np.arange(1024) % 251
    d = ctx.device_buffer(1024, np.uint8)
    s = ctx.stream()
    for off in range(0, 1024, 256):
        s.copy_h2d(d, h, 256, dst_offset=off, src_offset=off)
    assert np.array_equal(ctx.to_numpy(d), h.array)
    with pytest.raises(ShapeError):
        s.copy_h2d(d, h, 512, dst_offset=768)


def test_events_and_timing(ctx: Context) -> None:
    s1, s2 = ctx.stream(), ctx.stream()
    d = ctx.device_buffer(256)
    t0 = s1.record(timing=True)
    s1.copy_h2d(d, np.ones(256, np.float32))
    ev = s1.record()
    s2.wait_event(ev)
    s2.scale(d, 3.0, d)
    t1 = s2.record(timing=True)
    ctx.synchronize()
    assert ev.query() and t1.elapsed_ns(t0) > 0
    assert np.all(ctx.to_numpy(d) == 3.0)


def test_dtype_and_shape_errors(ctx: Context) -> None:
    s = ctx.stream()
    f32 = ctx.device_buffer((8, 8))
    f64 = ctx.device_buffer((8, 8), np.float64)
    with pytest.raises(DtypeError):
        s.gemm(f64, f32, f32)
    with pytest.raises(DtypeError):
        s.relu(f64, f64)
    with pytest.raises(ShapeError):
        s.gemm(f32, ctx.device_buffer((4, 8)), f32)
    with pytest.raises(ShapeError):
        s.add(f32, ctx.device_buffer(10), f32)
    with pytest.raises(ShapeError):
        s.copy_h2d(f32, np.zeros((4, 4), np.float32))
    with pytest.raises(DtypeError):
        s.copy_h2d(f32, np.zeros((8, 8), np.float64))
    with pytest.raises(BufferKindError):
        s.gemm(ctx.host_buffer((8, 8)), f32, f32)
    with pytest.raises(BufferKindError):
        s.copy_h2d(np.zeros(4), f32)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.eltwise("tanh", f32, f32)
    # DtypeError/ShapeError are also TypeError/ValueError for generic handlers
    assert issubclass(DtypeError, TypeError) and issubclass(ShapeError, ValueError)


def test_wrong_device(ctx: Context) -> None:
    other = Context(sim=True)
    try:
        s = ctx.stream()
        mine, theirs = ctx.device_buffer(64), other.device_buffer(64)
        with pytest.raises(WrongDeviceError):
            s.copy_d2d(mine, theirs)
        with pytest.raises(WrongDeviceError):
            s.wait_event(other.stream().record())
    finally:
        other.close()


def test_use_after_free(ctx: Context) -> None:
    s = ctx.stream()
    d = ctx.device_buffer(64)
    h = ctx.host_buffer(64)
    d.free()
    with pytest.raises(UseAfterFreeError):
        s.relu(d, d)
    with pytest.raises(UseAfterFreeError):
        d.free()
    h.free()
    with pytest.raises(UseAfterFreeError):
        _ = h.array
    u = ctx.wrap(np.zeros(1024, np.float32))
    u.free()
    with pytest.raises(UseAfterFreeError):
        s.copy_h2d(ctx.device_buffer(1024), u)


def test_closed_context() -> None:
    ctx = Context(sim=True)
    s = ctx.stream()
    d = ctx.device_buffer(16)
    ev = s.record()
    ctx.close()
    ctx.close()  # idempotent
    with pytest.raises(ContextClosedError):
        ctx.device_buffer(16)
    with pytest.raises(ContextClosedError):
        s.relu(d, d)
    with pytest.raises(ContextClosedError):
        ev.synchronize()
    with pytest.raises(ContextClosedError):
        ctx.stream()
    assert d.freed  # close frees every buffer


def test_tags_are_pid_and_sequence(ctx: Context) -> None:
    import os

    s = ctx.stream()
    d = ctx.device_buffer(64)
    s.relu(d, d)
    s.relu(d, d)
    tags = ctx.backend.tags[-2:]  # type: ignore[attr-defined]
    assert all(t >> 32 == os.getpid() for t in tags)
    assert (tags[1] & 0xFFFFFFFF) == (tags[0] & 0xFFFFFFFF) + 1


def test_page_size_choice(ctx: Context) -> None:
    small = ctx.device_buffer((1024, 1024), page_size=4096)
    big = ctx.device_buffer((1024, 1024), page_size=2 << 20)
    assert small.page_size == 4096 and small.va % (2 << 20) != 0
    assert big.page_size == 2 << 20 and big.va % (2 << 20) == 0
    with pytest.raises(ValueError):
        ctx.device_buffer(16, page_size=8192)
