"""The tacc runtime ("CPU API"): devices, contexts, buffers, streams, events.

    import numpy as np
    from tacc.runtime import Context

    with Context() as ctx:                    # the first PF; Context("0000:01:00.1") for a VF
        a = ctx.to_device(np.random.rand(64, 64).astype(np.float32))
        b = ctx.to_device(np.eye(64, dtype=np.float32))
        c = ctx.device_buffer((64, 64))
        s = ctx.stream()
        s.gemm(a, b, c)
        out = ctx.host_buffer((64, 64))       # out.array is a numpy view of pinned memory
        s.copy_d2h(out, c)
        s.synchronize()

Every public call is traced into the per-thread API ring (see :mod:`tacc.runtime.apitrace`)
when tracing is enabled, and carries a user tag (pid << 32 | seq) to the driver and device.
See docs/runtime.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BufferKindError,
    ContextClosedError,
    DeviceError,
    DeviceNotFoundError,
    DevicePermissionError,
    DeviceTimeoutError,
    DriverError,
    DtypeError,
    OutOfMemoryError,
    ShapeError,
    TaccError,
    UseAfterFreeError,
    WrongDeviceError,
)

if TYPE_CHECKING:
    from .buffers import Buffer, DeviceBuffer, HostBuffer, UserptrBuffer
    from .context import Context
    from .device import DeviceInfo, HotplugEvent, HotplugWatch, devices, find, watch
    from .stream import Event, Stream

# The rest loads on first use: ``from tacc.runtime import uapi`` (the counters, taccd, every
# CLI start) need not import the streams, the numpy kernels and bfloat16 (ml_dtypes: about
# 10 s of guest time under TCG).
_LAZY = {"Buffer": "buffers", "DeviceBuffer": "buffers", "HostBuffer": "buffers",
         "UserptrBuffer": "buffers", "Context": "context", "DeviceInfo": "device",
         "HotplugEvent": "device", "HotplugWatch": "device", "devices": "device",
         "find": "device", "watch": "device", "Event": "stream", "Stream": "stream"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Buffer", "BufferKindError", "Context", "ContextClosedError", "DeviceBuffer", "DeviceError",
    "DeviceInfo", "DeviceNotFoundError", "DevicePermissionError", "DeviceTimeoutError",
    "DriverError", "DtypeError", "Event", "HostBuffer", "HotplugEvent", "HotplugWatch",
    "OutOfMemoryError", "ShapeError", "Stream", "TaccError", "UseAfterFreeError",
    "UserptrBuffer", "WrongDeviceError", "devices", "find", "watch",
]
