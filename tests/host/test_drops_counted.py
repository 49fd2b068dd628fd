"""Drops that happen are counted: a capture whose rings overflow holds, per function,
records + counted drops = the records produced (the device trace ring: commands the
device ran; the runtime's API ring: calls made).  taccd's capture engine
(``CaptureSession``) drains them into a real capture that is read back with
``open_capture``; the tests/vm side overflows the real rings of a real device
(tests/vm/test_tracing_accounting.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from tacc.capture import open_capture
from tacc.capture.schema import TRACE_REC_DTYPE, DropSource
from tacc.daemon.devring import RingView
from tacc.daemon.session import CaptureSession, Options
from tacc.devices import TaccFunction
from tacc.runtime import uapi


class OverflowingRing:
    """A device trace ring as the device fills it (docs/hardware.md, trace ring): a
    command finished while the ring is full is not written, the header's ``dropped``
    counts it and its sequence number is used up."""

    def __init__(self, entries: int, fid: int) -> None:
        self.entries = entries
        self.buf = bytearray(4096 + entries * 64)
        self.prod = self.cons = self.dropped = self.seq = 0
        self._hdr()
        self.view = RingView(self.buf, fid, self.advance)

    def _hdr(self) -> None:
        h = uapi.drm_tacc_trace_header(version=1, rec_size=64, entries=self.entries, rec_version=1,
                             data_offset=4096, prod=self.prod, dropped=self.dropped, epoch=1)
        self.buf[:ctypes.sizeof(h)] = bytes(h)

    def run(self, n: int) -> None:
        for _ in range(n):
            if self.prod - self.cons >= self.entries:
                self.dropped += 1
            else:
                r = np.zeros(1, TRACE_REC_DTYPE)
                r["seq"], r["version"], r["tag"], r["bytes"] = self.seq, 1, 1 + self.seq, 64
                off = 4096 + (self.prod % self.entries) * 64
                self.buf[off:off + 64] = r.tobytes()
                self.prod += 1
            self.seq += 1
        self._hdr()

    def advance(self, cons: int) -> tuple[int, int]:
        self.cons = cons
        return self.prod, self.dropped

    # the DeviceTraceRing interface the session uses
    def drain(self):  # noqa: ANN201 - DrainResult
        return self.view.drain()

    def pending(self) -> int:
        return self.view.pending()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("entries", [8, 16])
def test_device_trace_overflow_records_plus_drops_equal_commands(tmp_path: Path,
                                                                 entries: int) -> None:
    fns = [TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None),
           TaccFunction("0000:01:00.1", 0x100, tmp_path, False, 1, "0000:01:00.0", None)]
    s = CaptureSession(tmp_path / "cap", fns, Options(device_trace=False, api=False,
                                                      counters_hz=0.0, clock_hz=0.0,
                                                      host_events=False), tool="test")
    rings = {0: OverflowingRing(entries, 0), 1: OverflowingRing(entries, 1)}
    s.rings.update(rings)
    # bursts of jobs between drains: some fit, some overflow the ring by far
    bursts = {0: [3, 40, entries, 0, 100, 1], 1: [entries + 1, 2, 0, 7, 64, 0]}
    t = 1000.0
    for i in range(6):
        for fid, r in rings.items():
            r.run(bursts[fid][i])
        t += 10.0  # every ring is due (its age)
        s.tick(t)
    s.close()
    cap = open_capture(tmp_path / "cap")
    dt = cap.read("device_trace")
    dr = cap.read("drops")
    for fid, r in rings.items():
        submitted = sum(bursts[fid])
        recs = dt[dt["fid"] == fid]
        dropped = int(dr["count"][(dr["source"] == DropSource.DEVICE_TRACE)
                                  & (dr["fid"] == fid)].sum())
        assert r.dropped > 0  # the ring did overflow
        assert dropped == r.dropped, (fid, dropped, r.dropped)
        assert len(recs) + dropped == submitted, (fid, len(recs), dropped, submitted)
        # the records kept are the device's, in order, none twice
        assert np.all(np.diff(recs["seq"].astype(np.int64)) > 0)
        assert set(recs["tag"].tolist()) <= set(range(1, submitted + 1))


def test_api_ring_overflow_records_plus_drops_equal_calls(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from tacc.runtime import apitrace

    monkeypatch.setenv("TACC_API_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    ring = apitrace.Ring(tmp_path / "shm" / "tacc-api.4242", 4242, 4243, 16, enabled=False)
    fns = [TaccFunction("0000:01:00.0", 0x100, tmp_path, False, 0, "0000:01:00.0", None)]
    s = CaptureSession(tmp_path / "cap", fns, Options(device_trace=False, counters_hz=0.0,
                                                      clock_hz=0.0, host_events=False),
                       tool="test")
    t = 1000.0
    s.tick(t)  # enables the ring
    calls = 0
    for burst in (5, 50, 16, 0, 33):
        for _ in range(burst):
            calls += 1
            ring.emit(apitrace.NAME_ID["nop"], calls, calls + 1, tag=calls, dev=1 << 8)
        ring.publish()
        t += 10.0
        s.tick(t)
    s.close()
    ring.close()
    cap = open_capture(tmp_path / "cap")
    api = cap.read("api")
    dr = cap.read("drops")
    dropped = int(dr["count"][dr["source"] == DropSource.API].sum())
    assert dropped > 0
    assert len(api) + dropped == calls, (len(api), dropped, calls)
    assert np.all(np.diff(api["tag"].astype(np.int64)) > 0)
