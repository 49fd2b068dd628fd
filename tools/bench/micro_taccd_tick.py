#!/usr/bin/env python3
"""In-guest micro-benchmark (issue 18): taccd's fixed per-tick cost (a capture session
on the real device, no BPF program, no workload) and its parts, and a device trace ring
drain of 100 records (a fake ring); guest µs under -icount are instruction times.

    micro_taccd_tick.py [USERSPACE_DIR]
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else
                str(Path(__file__).resolve().parents[2] / "userspace"))
import numpy as np  # noqa: E402
from tacc.capture.schema import TRACE_REC_DTYPE  # noqa: E402
from tacc.daemon.devring import RingView  # noqa: E402
from tacc.daemon.session import CaptureSession, Options  # noqa: E402
from tacc.devices import discover  # noqa: E402
from tacc.runtime import uapi  # noqa: E402

fns = [f for f in discover() if f.accel]
tmp = Path(tempfile.mkdtemp())
s = CaptureSession(tmp / "cap", fns, Options())
t = time.monotonic()
for i in range(5):
    s.tick(t + i * 0.05)
N = 200


def tick() -> None:
    global t
    t += 0.05
    s.tick(t)


def dev() -> None:
    s._drain_devices(False, t)


def cnt() -> None:
    s.sample_counters(time.monotonic())


def api() -> None:
    assert s.api is not None
    s.api.scan()
    s.api.due(t, 4, 0.25)


for f in (tick, dev, cnt, api):
    ts = timeit.repeat(f, number=N, repeat=3)
    print(f"{f.__name__:6s} {min(ts) / N * 1e6:8.1f} us")
s.close()
# device trace ring drain, a fake 4096-entry ring: 100 records per drain
hdr = uapi.drm_tacc_trace_header()
hdr.version = uapi.TRACE_HDR_VERSION
hdr.rec_size, hdr.entries, hdr.data_offset = 64, 4096, 4096
buf = bytearray(4096 + 4096 * 64)
buf[:ctypes.sizeof(hdr)] = bytes(hdr)
state = {"prod": 0}
view = RingView(buf, 0, lambda cons: (state["prod"], 0))
recs = np.frombuffer(buf, TRACE_REC_DTYPE, 4096, 4096)


def ring100() -> None:
    p = state["prod"]
    for i in range(100):
        recs[(p + i) % 4096]["seq"] = p + i
    state["prod"] = p + 100
    hdr.prod = state["prod"] & 0xFFFFFFFF
    buf[:ctypes.sizeof(hdr)] = bytes(hdr)


def fill_only() -> None:
    ring100()
    view.cons = state["prod"]
    view.next_seq = state["prod"]


def drain100() -> None:
    ring100()
    view.drain()


for f in (fill_only, drain100):
    ts = timeit.repeat(f, number=50, repeat=3)
    print(f"{f.__name__:10s} {min(ts) / 50 * 1e6:8.1f} us")
