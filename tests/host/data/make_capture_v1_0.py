"""The stream files of tests/host/data/capture-v1.0, a capture of format 1, minor 0
(meta.json without "minor", no device_events stream).  Made once with the writer of commit
350c768 (before minor versions existed); today's writer produces the same stream files byte
for byte, so tests/host/test_fleet.py writes them at test time and keeps only that
writer's meta.json and complete marker (text) in the tree.  By hand:

    PYTHONPATH=userspace python3 tests/host/data/make_capture_v1_0.py OUT
"""

from __future__ import annotations

import sys

import numpy as np
from tacc.capture import CaptureWriter
from tacc.capture.schema import (
    API_DTYPE,
    CLOCK_DTYPE,
    DEVICE_TRACE_DTYPE,
    DRIVER_DTYPE,
    DROPS_DTYPE,
    DriverKind,
)

META = {"node": "old0", "devices": [{"pci": "0000:01:00.0", "pf": "0000:01:00.0", "vf": 0,
                                     "link": {"gen": 4, "width": 8, "mps": 256, "mrrs": 512},
                                     "devmem": 1 << 30, "clock_hz": 1e9, "time_scale": 1.0,
                                     "tlb_entries": 64}],
        "created_unix": 1.7e9}
N = 24
T0 = 5_000_000_000  # CLOCK_MONOTONIC ns of the first call
OFF = 1_000_000  # device ticks = mono - T0 + OFF (1 GHz)


def main(out: str) -> None:
    streams = ("device_trace", "driver", "api", "strings", "clock_sync", "drops")
    with CaptureWriter(out, META, chunk_bytes=64 * 8, streams=streams) as w:
        name = w.string_id("submit")
        t = T0 + np.arange(N, dtype=np.int64) * 10_000
        api = np.zeros(N, API_DTYPE)
        api["t_start"], api["t_end"] = t, t + 4_000
        api["tag"] = np.arange(1, N + 1)
        api["bytes"] = 4096
        api["pid"] = api["tid"] = 100
        api["name_id"] = name
        w.append("api", api)
        drv = np.zeros(N, DRIVER_DTYPE)
        drv["t_ns"], drv["tag"], drv["kind"] = t + 1_000, api["tag"], int(DriverKind.SUBMIT)
        drv["size"], drv["ncmds"], drv["pid"], drv["tid"] = 4096, 1, 100, 100
        w.append("driver", drv)
        dt = np.zeros(N, DEVICE_TRACE_DTYPE)
        dt["version"], dt["opcode"], dt["tag"] = 1, 1, api["tag"]
        dt["seq"] = np.arange(N)
        dt["t_fetch"] = (t - T0 + OFF + 1_500).astype(np.uint64)
        dt["t_start"] = dt["t_fetch"] + 200
        dt["t_end"] = dt["t_start"] + 1_000
        dt["bytes"], dt["tlps"] = 4096, 16
        w.append("device_trace", dt)
        ck = np.zeros(4, CLOCK_DTYPE)
        m = T0 + np.arange(4, dtype=np.int64) * 100_000
        ck["mono_before"], ck["mono_after"] = m - 500, m + 500
        ck["devclk"] = (m - T0 + OFF).astype(np.uint64)
        ck["hostclk"] = (m + 7_000_000).astype(np.uint64)
        w.append("clock_sync", ck)
        dr = np.zeros(1, DROPS_DTYPE)
        dr["t_ns"], dr["count"], dr["source"] = T0 + 50_000, 3, 2
        w.append("drops", dr)


if __name__ == "__main__":
    main(sys.argv[1])
