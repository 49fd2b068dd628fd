"""The C library, loaded once through ctypes, for the few calls Python has no wrapper
for (bpf(2) and perf_event_open(2) by number, clock_nanosleep, prctl, mallopt)."""

from __future__ import annotations

import ctypes

libc = ctypes.CDLL(None, use_errno=True)

# system call numbers (x86_64) and perf_event_open(2)'s attribute block, for the callers
# of both (the counters' PMU backend, the BPF program's loader)
NR_PERF_EVENT_OPEN = 298
NR_BPF = 321


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr (include/uapi/linux/perf_event.h) up to config2, padded to
    PERF_ATTR_SIZE; the bit-field word is ``flags``."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64),
                ("config2", ctypes.c_uint64), ("_rest", ctypes.c_uint8 * 72)]


PERF_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7
