"""Buffers: host (mmapped numpy arrays, zero copy), device, and wrapped user memory."""

from __future__ import annotations

import copy
import mmap
from typing import TYPE_CHECKING, Any

import numpy as np

from . import apitrace as tr
from . import uapi as U
from .errors import (
    BufferKindError,
    ContextClosedError,
    TaccError,
    UseAfterFreeError,
    WrongDeviceError,
)

if TYPE_CHECKING:
    from .context import Context

PAGE = 4096
HUGE = 2 << 20
N_FREE = tr.NAME_ID["free"]


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    s = (shape,) if isinstance(shape, int) else tuple(int(x) for x in shape)
    if any(x < 0 for x in s):
        raise ValueError(f"negative dimension in shape {s}")
    return s


class Buffer:
    """A buffer object of one context. ``offset`` is where the data starts in the BO."""

    kind = "buffer"
    host_side = False

    def __init__(self, ctx: Context, handle: int, bo_size: int, shape: tuple[int, ...],
                 dtype: np.dtype, offset: int = 0, va: int = 0, page_size: int = 0) -> None:
        self.ctx = ctx
        self.handle = handle
        self.bo_size = bo_size
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.offset = offset
        self.va = va
        self.page_size = page_size
        self.freed = False
        self._base: Buffer | None = None  # the buffer a view() was made of

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def name(self) -> str:
        return f"{self.kind[0]}{self.handle}"

    def view(self, shape: int | tuple[int, ...], dtype: Any = None, offset: int = 0) -> Buffer:
        """The same memory from byte ``offset`` seen as ``shape``/``dtype`` (no copy).

        A view lives as long as its buffer: freeing the buffer frees it, and it cannot be
        freed itself.
        """
        s = _shape(shape)
        dt = self.dtype if dtype is None else np.dtype(dtype)
        nbytes = int(np.prod(s, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"view: {s} {dt} at byte {offset} overruns {self!r}")
        v = copy.copy(self)
        v.shape, v.dtype, v.offset = s, dt, self.offset + offset
        v._base = self._base or self
        return v

    def check(self, ctx: Context) -> None:
        """Raises if this buffer cannot be used with ``ctx`` now."""
        if self._base is not None:
            self._base.check(ctx)
        if self.freed:
            raise UseAfterFreeError(f"{self!r} was freed")
        if self.ctx is not ctx:
            raise WrongDeviceError(f"{self!r} belongs to {self.ctx!r}, not to {ctx!r}")
        if ctx.closed:
            raise ContextClosedError(f"{ctx!r} is closed")

    def _release(self) -> None:
        self.ctx.backend.gem_close(self.handle)

    def release(self) -> None:
        """free() without an API trace record (the runtime's own staging buffers)."""
        if not self.freed:
            if not self.ctx.closed:
                self._release()
            self.freed = True
            self.ctx._buffers.discard(self)

    def free(self) -> None:
        """Releases the buffer now (pending jobs keep the memory alive until they end)."""
        if self.freed:
            raise UseAfterFreeError(f"{self!r} freed twice")
        if self._base is not None:
            raise TaccError(f"{self!r} is a view: it is freed with {self._base!r}")
        t0 = tr.begin()
        st = -1
        try:
            if not self.ctx.closed:
                self._release()
            self.freed = True
            self.ctx._buffers.discard(self)
            st = 0
        finally:
            if t0:
                tr.end(t0, N_FREE, 0, self.nbytes, self.ctx.dev_id, self.ctx.hw_context, st,
                       self.name)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.freed:
            self.free()

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return (f"<{type(self).__name__} {self.name} {self.shape} {self.dtype} "
                f"on {self.ctx.device.pci}{state}>")


class HostBuffer(Buffer):
    """Host memory the device reads/writes; :attr:`array` is a numpy view (no copy)."""

    kind = "host"
    host_side = True

    def __init__(self, ctx: Context, handle: int, bo_size: int, shape: tuple[int, ...],
                 dtype: np.dtype, mm: mmap.mmap, va: int) -> None:
        super().__init__(ctx, handle, bo_size, shape, dtype, 0, va, PAGE)
        self._mm = mm
        self._array = np.frombuffer(mm, self.dtype, self.size).reshape(shape)

    @property
    def array(self) -> np.ndarray:
        if self.freed:
            raise UseAfterFreeError(f"{self!r} was freed")
        return self._array

    def _release(self) -> None:
        super()._release()
        self._array = np.empty(0, self.dtype)
        try:
            self._mm.close()
        except BufferError:
            pass  # numpy views still exist: the mapping (and pages) live until they go


class DeviceBuffer(Buffer):
    """Device memory; not CPU visible. ``page_size``: device MMU page size of its binding."""

    kind = "device"


class UserptrBuffer(Buffer):
    """An existing numpy array registered (pinned, IOMMU-mapped) for the device.

    The driver pins whole pages: a misaligned array is registered from the page below it
    and operands start at :attr:`offset` inside the BO.
    """

    kind = "userptr"
    host_side = True

    def __init__(self, ctx: Context, handle: int, bo_size: int, array: np.ndarray,
                 offset: int, va: int, readonly: bool = False) -> None:
        super().__init__(ctx, handle, bo_size, array.shape, array.dtype, offset, va, PAGE)
        self._array = array
        self.readonly = readonly

    @property
    def array(self) -> np.ndarray:
        if self.freed:
            raise UseAfterFreeError(f"{self!r} was freed")
        return self._array

    @property
    def aligned(self) -> bool:
        return self.offset == 0

    def _release(self) -> None:
        super()._release()
        self._array = np.empty(0, self.dtype)


def host_side(obj: Any, what: str) -> Buffer:
    if isinstance(obj, (HostBuffer, UserptrBuffer)):
        return obj
    if isinstance(obj, DeviceBuffer):
        raise BufferKindError(f"{what}: {obj!r} is device memory; a host buffer is needed")
    raise TypeError(f"{what}: expected a HostBuffer, UserptrBuffer or numpy array, "
                    f"got {type(obj).__name__}")


def device_side(obj: Any, what: str) -> DeviceBuffer:
    if isinstance(obj, DeviceBuffer):
        return obj
    if isinstance(obj, Buffer):
        raise BufferKindError(f"{what}: {obj!r} is host memory; device memory is needed")
    if isinstance(obj, np.ndarray):
        raise BufferKindError(f"{what}: a numpy array is host memory; use a DeviceBuffer "
                              "(Context.device_buffer / Context.to_device)")
    raise TypeError(f"{what}: expected a DeviceBuffer, got {type(obj).__name__}")


def alloc_host(ctx: Context, shape: int | tuple[int, ...], dtype: Any) -> HostBuffer:
    s = _shape(shape)
    dt = np.dtype(dtype)
    nbytes = int(np.prod(s, dtype=np.int64)) * dt.itemsize
    size = max((nbytes + PAGE - 1) // PAGE * PAGE, PAGE)
    handle, va = ctx.backend.bo_create(size, U.BO_HOST)
    try:
        mm = ctx.backend.mmap_bo(handle, size)
    except TaccError:
        ctx.backend.gem_close(handle)
        raise
    return HostBuffer(ctx, handle, size, s, dt, mm, va)


def alloc_device(ctx: Context, shape: int | tuple[int, ...], dtype: Any,
                 page_size: int | None) -> DeviceBuffer:
    s = _shape(shape)
    dt = np.dtype(dtype)
    nbytes = int(np.prod(s, dtype=np.int64)) * dt.itemsize
    if page_size not in (None, PAGE, HUGE):
        raise ValueError(f"page_size must be None, 4096 or {HUGE}, not {page_size}")
    size = max((nbytes + PAGE - 1) // PAGE * PAGE, PAGE)
    if page_size == HUGE:
        size = (size + HUGE - 1) // HUGE * HUGE
    if page_size != PAGE:
        handle, va = ctx.backend.bo_create(size, U.BO_DEVICE)
        pg = HUGE if size >= HUGE and va % HUGE == 0 else PAGE
        return DeviceBuffer(ctx, handle, size, s, dt, 0, va, pg)
    # 4 KiB pages on purpose: bind at a VA that is not 2 MiB aligned
    handle, _ = ctx.backend.bo_create(size, U.BO_DEVICE, U.BO_F_NO_BIND)
    try:
        va, pg = ctx._bind_small_pages(handle, size)
    except TaccError:
        ctx.backend.gem_close(handle)
        raise
    return DeviceBuffer(ctx, handle, size, s, dt, 0, va, pg)


def wrap_user(ctx: Context, array: np.ndarray, readonly: bool | None) -> UserptrBuffer:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"wrap: expected a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError("wrap: the array must be C-contiguous (np.ascontiguousarray)")
    if array.nbytes == 0:
        raise ValueError("wrap: empty array")
    ro = (not array.flags.writeable) if readonly is None else readonly
    addr = array.ctypes.data
    base = addr // PAGE * PAGE
    end = (addr + array.nbytes + PAGE - 1) // PAGE * PAGE
    flags = U.BO_F_READONLY if ro else 0
    handle, va = ctx.backend.bo_create(end - base, U.BO_USERPTR, flags, base)
    return UserptrBuffer(ctx, handle, end - base, array, addr - base, va, ro)
