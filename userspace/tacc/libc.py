"""The C library, loaded once through ctypes, for the few calls Python has no wrapper
for (bpf(2) and perf_event_open(2) by number, clock_nanosleep, prctl, mallopt)."""

from __future__ import annotations

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
