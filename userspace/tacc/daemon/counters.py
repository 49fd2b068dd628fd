"""Counter samples of a function: the counter block mmap'd from the accel node (fast,
seqlocked, wakes nothing extra while a trace ring holds the device powered) or sysfs
(never wakes a suspended device; slow), or the function's sample ring (the device samples
itself; taccd drains it).
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable

import numpy as np

from tacc import hw
from tacc.capture.schema import COUNTERS_DTYPE, FUNC_COUNTERS, GLOBAL_COUNTERS
from tacc.devices import TaccFunction, read_counters_sysfs
from tacc.runtime import uapi

SLOT_HDR, SLOT_GEN = 0, 1
GLOBAL_PAGE = 0x1000
UPTIME_SLOT = hw.GLOBAL_COUNTERS["uptime_ticks"]  # the device clock, in the global page
_FUNC_SLOTS = np.array([s for _, s in FUNC_COUNTERS])
_GLOBAL_SLOTS = np.array([s for _, s in GLOBAL_COUNTERS])
# u64 word of each counter column in a COUNTERS_DTYPE record (every counter is a u64)
_F = COUNTERS_DTYPE.fields or {}
_FUNC_WORDS = np.array([_F[n][1] // 8 for n, _ in FUNC_COUNTERS])
_GLOBAL_WORDS = np.array([_F["g_" + n][1] // 8 for n, _ in GLOBAL_COUNTERS])
assert COUNTERS_DTYPE.itemsize % 8 == 0 and all(
    _F[n][0] == np.dtype("<u8") and _F[n][1] % 8 == 0
    for n in [c for c, _ in FUNC_COUNTERS] + ["g_" + c for c, _ in GLOBAL_COUNTERS])


def sample_from_slots(func: np.ndarray, glob: np.ndarray | None, fid: int, seq: int,
                      out: np.ndarray | None = None) -> np.ndarray:
    """One COUNTERS_DTYPE record from raw u64 slot arrays of the two counter pages."""
    rec = np.zeros(1, COUNTERS_DTYPE) if out is None else out
    words = rec.view("<u8")
    words[_FUNC_WORDS] = func[_FUNC_SLOTS]
    if glob is not None:
        words[_GLOBAL_WORDS] = glob[_GLOBAL_SLOTS]
        rec["devclk"] = glob[UPTIME_SLOT]  # the device clock when the page was read
    rec["fid"], rec["seq"] = fid, seq
    return rec


class CounterBlock:
    """The mmap'd counter block of one function (read-only).

    Only a PF's block has the global page, whose ``uptime_ticks`` is a sample's device
    time; ``clock`` gives a VF's or a virtio-tacc function's samples theirs: the same
    device's clock, read (from its PF's block, :meth:`uptime`) right after the snapshot."""

    def __init__(self, fn: TaccFunction, fid: int,
                 clock: Callable[[], int] | None = None) -> None:
        if fn.accel is None:
            raise OSError(f"{fn.pci}: no accel node")
        self.fid = fid
        self.clock = clock
        self.fd = uapi.open_node(fn.accel)
        self.size = 8192 if not fn.is_vf and os.geteuid() == 0 else 4096
        try:
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ,
                                offset=uapi.MMAP_COUNTERS)
        except OSError:
            self.size = 4096
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ,
                                offset=uapi.MMAP_COUNTERS)
        self.seq = 0
        self.retries = 0

    def _slots(self, page: int) -> np.ndarray:
        return np.frombuffer(self.mm, dtype="<u8", count=64, offset=page).copy()

    def sample(self) -> np.ndarray:
        for _ in range(8):
            g0 = int(np.frombuffer(self.mm, "<u8", 1, 8)[0])
            if g0 & 1:
                self.retries += 1
                continue
            func = self._slots(0)
            glob = self._slots(GLOBAL_PAGE) if self.size > 4096 else None
            if int(np.frombuffer(self.mm, "<u8", 1, 8)[0]) == g0:
                break
            self.retries += 1
        self.seq += 1
        rec = sample_from_slots(func, glob, self.fid, self.seq)
        if glob is None and self.clock is not None:
            rec["devclk"] = self.clock()
        return rec

    @property
    def has_global_page(self) -> bool:
        return self.size > 4096

    def uptime(self) -> int:
        """The device clock now: the global page's ``uptime_ticks`` (a PF's block)."""
        return int(np.frombuffer(self.mm, "<u8", 1, GLOBAL_PAGE + 8 * UPTIME_SLOT)[0])

    def close(self) -> None:
        try:
            self.mm.close()
        finally:
            os.close(self.fd)


class SysfsCounters:
    def __init__(self, fn: TaccFunction, fid: int) -> None:
        self.fn, self.fid, self.seq = fn, fid, 0

    def sample(self) -> np.ndarray:
        vals = read_counters_sysfs(self.fn)
        rec = np.zeros(1, COUNTERS_DTYPE)
        for k, v in vals.items():
            if k in (COUNTERS_DTYPE.names or ()):
                rec[k] = v
        rec["devclk"] = vals.get("g_uptime_ticks", 0)
        self.seq += 1
        rec["fid"], rec["seq"] = self.fid, self.seq
        return rec

    def close(self) -> None:
        pass


#: seconds of samples a capture's sample ring holds (taccd drains it every RING_MAX_AGE_S)
SAMPLE_RING_S = 4.0
# an entry's slots (tacc.counters.device: function page 0..63, global page 64..127) in the
# order of the record's counter words
_ENTRY_SLOTS = np.concatenate((_FUNC_SLOTS, 64 + _GLOBAL_SLOTS))
_ENTRY_WORDS = np.concatenate((_FUNC_WORDS, _GLOBAL_WORDS))


def ring_entries(hz: float) -> int:
    """Sample ring entries for ``hz``: a power of two holding SAMPLE_RING_S of samples,
    within the driver's limits (2 .. DRM_TACC_SAMPLE_MAX_ENTRIES)."""
    from tacc.runtime import uapi as ru

    want = max(2, math.ceil(SAMPLE_RING_S * hz))
    return min(ru.SAMPLE_MAX_ENTRIES, 1 << (want - 1).bit_length())


class SampleRingCounters:
    """Counter samples the device takes itself, every 1/hz of device time, into the
    function's sample ring (docs/uapi.md "Sample ring"); taccd only drains the ring.

    sampled from taccd's loop, a sample whose tick ran a whole period late (a
    NOP flood's busiest ticks on the traced process's CPU) was a counted drop; the device
    is never late, and the ring holds SAMPLE_RING_S of samples, so a drop is only a ring
    the loop left full for that long (the device's ``dropped``, counted).  ``seq`` is the
    device's sample number from 1 at the first sample of the capture (a gap is a drop;
    continued across a ring restart by a reset or resume).  The first and the last
    sample of a capture are read by taccd (:meth:`bracket`, the mmap'd counter block),
    at its start and end, so the series covers the whole capture."""

    def __init__(self, fn: TaccFunction, fid: int, hz: float,
                 clock: Callable[[], int] | None = None) -> None:
        from pathlib import Path

        from tacc.counters.device import DeviceBackend
        from tacc.runtime import uapi as ru

        if fn.accel is None:
            raise OSError(f"{fn.pci}: no accel node")
        self.fid = fid
        self.block = CounterBlock(fn, fid, clock)
        period = max(ru.SAMPLE_MIN_PERIOD_NS, round(1e9 / hz))
        try:
            self.ring = DeviceBackend(fn, period_ns=period,  # type: ignore[arg-type]
                                      entries=ring_entries(hz), node=Path(fn.accel),
                                      slots=_ENTRY_SLOTS)
        except BaseException:
            self.block.close()
            raise
        self.period_ns = period
        self.dropped = self.ring.dropped
        self.epoch = self.ring.epoch
        self.base: int | None = None  # device seq - capture seq
        self.last = 0  # capture seq of the last sample

    def drain(self) -> tuple[np.ndarray, int]:
        """(the samples taken since the last drain as COUNTERS_DTYPE records, samples the
        device dropped meanwhile)."""
        b = self.ring.drain()
        lost, self.dropped = b.dropped - self.dropped, b.dropped
        n = len(b)
        rec = np.zeros(n, COUNTERS_DTYPE)
        if n:
            dev_seq = b.seq.astype(np.int64)
            if self.base is None or b.epoch != self.epoch:
                self.base, self.epoch = int(dev_seq[0]) - self.last - 1, b.epoch
            words = rec.view("<u8").reshape(n, -1)
            words[:, _ENTRY_WORDS] = b.values
            rec["devclk"] = b.devclk
            rec["seq"] = dev_seq - self.base
            rec["fid"] = self.fid
            self.last = int(rec["seq"][-1])
        return rec, max(lost, 0)

    def bracket(self) -> np.ndarray:
        """A sample read now by taccd (the capture's first or last), next in ``seq``."""
        rec = self.block.sample()
        self.last += 1
        rec["seq"] = self.last
        return rec

    def pending(self) -> int:
        return self.ring.pending()

    @property
    def entries(self) -> int:
        return self.ring.entries

    def close(self) -> None:
        try:
            self.ring.close()
        finally:
            self.block.close()
