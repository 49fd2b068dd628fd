"""Context: one open accel node = one device address space and hardware context."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import apitrace as tr
from . import uapi as U
from .backend import Backend, DrmBackend
from .buffers import (
    HUGE,
    PAGE,
    Buffer,
    DeviceBuffer,
    HostBuffer,
    UserptrBuffer,
    alloc_device,
    alloc_host,
    wrap_user,
)
from .device import DeviceInfo, find
from .errors import ContextClosedError, TaccError
from .stream import Event, Stream

ID = tr.NAME_ID
TS_SLOTS = PAGE // 8


class Context:
    """An open tacc function (PF or VF).

    >>> with Context() as ctx:                       # first PF; or Context("0000:01:00.1")
    ...     x = ctx.host_buffer((64, 64))              # numpy view: x.array
    ...     d = ctx.device_buffer((64, 64))
    ...     s = ctx.stream()
    ...     s.copy_h2d(d, x); s.synchronize()
    """

    def __init__(self, device: str | int | DeviceInfo | None = None, *,
                 sim: bool | None = None, backend: Backend | None = None) -> None:
        t0 = tr.begin()
        self.closed = True
        self.device = find(device, sim)
        if backend is None:
            if self.device.sim:
                from .sim import SimBackend

                backend = SimBackend()
            else:
                backend = DrmBackend(self.device.devnode)
        self.backend = backend
        self.dev_id = self.device.pci_id
        self.closed = False
        self._buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._streams: list[Stream] = []
        self._last_stream: Stream | None = None
        try:
            self.hw_context = backend.get_param(U.PARAM_CONTEXT_ID)
            self.num_queues = backend.get_param(U.PARAM_NUM_QUEUES)
            self.max_cmds = backend.get_param(U.PARAM_MAX_CMDS)
            self.va_start = backend.get_param(U.PARAM_VA_START)
            self.va_end = backend.get_param(U.PARAM_VA_END)
            self.devmem_size = backend.get_param(U.PARAM_DEVMEM_SIZE)
            self.api_version = backend.get_param(U.PARAM_API_VERSION)
        except TaccError:
            backend.close()
            self.closed = True
            raise
        self._small_va = self.va_end  # 4 KiB-page bindings grow down from the top
        self._ts_buf: HostBuffer = alloc_host(self, TS_SLOTS, np.uint64)
        self._ts_free = list(range(TS_SLOTS - 1, -1, -1))
        # the queues this function may use (a VF's queue_mask, set by its PF)
        mask = int(self.device.attrs.get("queue_mask", "0"), 0) or (1 << self.num_queues) - 1
        self.queues = [q for q in range(self.num_queues) if mask >> q & 1]
        self._next_queue = 0
        if t0:
            tr.end(t0, ID["context_open"], 0, 0, self.dev_id, self.hw_context, 0,
                   self.device.pci)

    def __repr__(self) -> str:
        return f"<Context {self.device.pci} ctx{getattr(self, 'hw_context', '?')}" \
               f"{' closed' if self.closed else ''}>"

    def _check(self) -> None:
        if self.closed:
            raise ContextClosedError(f"{self!r} is closed")

    # ----------------------------------------------------------- buffers ---
    def _traced_alloc(self, name: str, fn: Any, args: str) -> Any:
        t0 = tr.begin()
        st, buf = -1, None
        try:
            self._check()
            buf = fn()
            self._buffers.add(buf)
            st = 0
            return buf
        finally:
            if t0:
                tr.end(t0, ID[name], 0, buf.nbytes if buf is not None else 0, self.dev_id,
                       self.hw_context, st, f"{buf.name if buf else '-'} {args}")

    def host_buffer(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> HostBuffer:
        """Host memory visible to the device; ``.array`` is its numpy view (no copy)."""
        return self._traced_alloc("host_buffer", lambda: alloc_host(self, shape, dtype),
                                  f"{shape} {np.dtype(dtype)}")  # type: ignore[no-any-return]

    def _alloc_host_raw(self, shape: tuple[int, ...], dtype: Any) -> HostBuffer:
        b = alloc_host(self, shape, dtype)
        self._buffers.add(b)
        return b

    def device_buffer(self, shape: int | tuple[int, ...], dtype: Any = np.float32, *,
                      page_size: int | None = None) -> DeviceBuffer:
        """Device memory. ``page_size=4096`` forces 4 KiB device pages (default: the
        driver's choice, 2 MiB pages for buffers of 2 MiB and more)."""
        return self._traced_alloc(  # type: ignore[no-any-return]
            "device_buffer", lambda: alloc_device(self, shape, dtype, page_size),
            f"{shape} {np.dtype(dtype)} pg={page_size or 'auto'}")

    def wrap(self, array: np.ndarray, *, readonly: bool | None = None) -> UserptrBuffer:
        """Registers an existing numpy array (pins its pages) for the device: no copy."""
        return self._traced_alloc(  # type: ignore[no-any-return]
            "wrap", lambda: wrap_user(self, array, readonly),
            f"@{array.ctypes.data:x}" if isinstance(array, np.ndarray) else "?")

    def to_device(self, array: np.ndarray, stream: Stream | None = None) -> DeviceBuffer:
        """A new device buffer holding a copy of ``array`` (synchronous)."""
        d = self.device_buffer(array.shape, array.dtype)
        s = stream or self.default_stream
        s.copy_h2d(d, np.ascontiguousarray(array))
        s.synchronize()
        return d

    def to_numpy(self, buf: DeviceBuffer, stream: Stream | None = None) -> np.ndarray:
        """A numpy copy of a device buffer (synchronous)."""
        out = np.empty(buf.shape, buf.dtype)
        s = stream or self.default_stream
        s.copy_d2h(out, buf)
        s.synchronize()
        return out

    def _bind_small_pages(self, handle: int, size: int) -> tuple[int, int]:
        """Binds at a VA that is 4 KiB but not 2 MiB aligned: the device uses 4 KiB pages."""
        for _ in range(64):
            va = (self._small_va - size - PAGE) // HUGE * HUGE + PAGE
            if va < self.va_start:
                break
            self._small_va = va - PAGE
            try:
                return self.backend.vm_bind(handle, va, 0, size, U.BIND_F_FIXED)
            except TaccError as e:
                if "EBUSY" not in str(e):
                    raise
        raise TaccError("no device address range left for a 4 KiB-page binding")

    # ----------------------------------------------------------- streams ---
    def stream(self, queue: int | None = None) -> Stream:
        """A new stream on hardware queue ``queue`` (default: the queues in turn)."""
        t0 = tr.begin()
        self._check()
        if queue is None:
            queue = self.queues[self._next_queue % len(self.queues)]
            self._next_queue += 1
        if queue not in self.queues:
            raise ValueError(f"queue {queue}: this function has queues {self.queues}")
        s = Stream(self, queue)
        self._streams.append(s)
        if t0:
            tr.end(t0, ID["stream_create"], 0, 0, self.dev_id, self.hw_context, 0, f"q{queue}")
        return s

    @property
    def default_stream(self) -> Stream:
        self._check()
        if not self._streams:
            self.stream(0)
        return self._streams[0]

    def event(self, timing: bool = False) -> Event:
        t0 = tr.begin()
        self._check()
        ev = Event(self, timing)
        if t0:
            tr.end(t0, ID["event_create"], 0, 0, self.dev_id, self.hw_context, 0)
        return ev

    def _ts_slot(self) -> int:
        if not self._ts_free:
            raise TaccError(f"more than {TS_SLOTS} timing events alive")
        return self._ts_free.pop()

    def _ts_value(self, slot: int) -> int:
        return int(self._ts_buf.array[slot])

    def synchronize(self) -> None:
        """Waits for every stream of the context."""
        t0 = tr.begin()
        st = -1
        try:
            self._check()
            for s in self._streams:
                s.synchronize()
            st = 0
        finally:
            if t0:
                tr.end(t0, ID["synchronize"], 0, 0, self.dev_id, self.hw_context, st)

    def param(self, p: int, index: int = 0) -> int:
        self._check()
        return self.backend.get_param(p, index)

    @property
    def devclk(self) -> int:
        """Device clock now (ticks = ns); wakes the device."""
        return self.param(U.PARAM_DEVCLK)

    # ------------------------------------------------------------- close ---
    def close(self) -> None:
        """Waits for outstanding work, frees every buffer and closes the node."""
        if self.closed:
            return
        t0 = tr.begin()
        try:
            for s in self._streams:
                try:
                    s.synchronize()
                except TaccError:
                    pass
            for b in list(self._buffers):
                if not b.freed:
                    try:
                        b.free()
                    except TaccError:
                        b.freed = True
            try:
                self._ts_buf.free()
            except TaccError:
                pass
        finally:
            self.closed = True
            self.backend.close()
            if t0:
                tr.end(t0, ID["context_close"], 0, 0, self.dev_id, self.hw_context, 0)
                tr.flush()  # the context's last calls are visible at once

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.backend.close()
        except Exception:
            pass
