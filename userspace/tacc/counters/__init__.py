"""tacc.counters: hardware counters through sysfs, mmap, perf and the device's sample ring
(docs/counters.md)."""

from .backends import (
    BACKENDS,
    MmapBackend,
    PerfBackend,
    SysfsBackend,
    default_catalogue,
    open_backend,
)
from .base import Backend, Snapshot
from .catalogue import Catalogue, Counter, CounterError, Function, functions, select_functions
from .derived import LinkInfo, deltas, derive
from .device import DeviceBackend

__all__ = [
    "BACKENDS", "Backend", "Catalogue", "Counter", "CounterError", "DeviceBackend", "Function",
    "LinkInfo",
    "MmapBackend", "PerfBackend", "Snapshot", "SysfsBackend", "default_catalogue", "deltas",
    "derive", "functions", "open_backend", "select_functions",
]
