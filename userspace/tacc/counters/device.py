"""The ``device`` backend: device-side counter sampling through the driver's sample ring.

The device snapshots the function's counter page (plus the global page on the PF)
every ``period_ns`` of device time and DMA-writes it to a ring the driver allocated
(DRM_IOCTL_TACC_SAMPLE_OPEN, docs/uapi.md "Sample ring").  User space maps the ring
read-only, reads the entries between its consumer index and the producer index the
device writes back into the header page, and hands the ring space back with
SAMPLE_ADVANCE.  No MMIO and no per-sample wakeup: the consumer only has to come back
before the ring is full (``entries * period_ns``); when it does not, the device drops
and counts (``SAMPLE_DROPPED``, a gap in ``seq``).

Entry layout (tacc_hw.h): ``struct tacc_sample_hdr {u32 version, u32 nslots, u64 seq,
u64 devclk}`` then 128 u64 slots: function page slots 0..63, global page slots 0..63
(zero on a VF, ``nslots`` 64).  The values are the raw counters, like ``mmap``.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tacc.runtime import uapi as ru
from tacc.runtime.uapi import ioctl as _ioctl

from .backends import Backend, Snapshot
from .catalogue import GLOBAL_PAGE, Catalogue, CounterError, Function

SAMPLE_SLOTS = 64  # TACC_SAMPLE_SLOTS
CNT_VERSION = 1  # TACC_CNT_VERSION
ENTRY_DTYPE = np.dtype([("version", "<u4"), ("nslots", "<u4"), ("seq", "<u8"),
                        ("devclk", "<u8"), ("slots", "<u8", (2 * SAMPLE_SLOTS,))])
ENTRY_SIZE = ENTRY_DTYPE.itemsize  # TACC_SAMPLE_SIZE, 1048
DEFAULT_ENTRIES = 2048  # DRM_TACC_SAMPLE_MAX_ENTRIES: 4 drains per 205 ms at 10 kHz


@dataclass
class SampleBatch:
    """Entries read from the ring in one drain, oldest first."""

    seq: np.ndarray  # uint64, device sample number (a gap is a drop)
    devclk: np.ndarray  # uint64, device ticks when the sample was taken
    values: np.ndarray  # uint64 (n, counters of the catalogue)
    dropped: int  # samples dropped since the ring was opened (cumulative)
    epoch: int  # ring epoch (changes when a reset restarted the ring)

    def __len__(self) -> int:
        return len(self.seq)


def entry_slots(catalogue: Catalogue) -> np.ndarray:
    """Index into an entry's ``slots`` of every counter of the catalogue."""
    out = []
    for c in catalogue:
        slot = c.offset // 8
        page, idx = divmod(slot, GLOBAL_PAGE // 8)
        if idx >= SAMPLE_SLOTS or page > 1:
            raise CounterError(f"{c.name}: slot {idx} of page {page} is not sampled")
        out.append(page * SAMPLE_SLOTS + idx)
    return np.array(out, dtype=np.intp)


ENTRY_WORDS = ENTRY_SIZE // 8  # u64 words per entry: version|nslots, seq, devclk, slots
assert ENTRY_WORDS * 8 == ENTRY_SIZE


def parse_entries(buf: bytes | bytearray | memoryview | np.ndarray, slots: np.ndarray,
                  first: int, count: int, entries: int) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """Decode ``count`` entries starting at free-running index ``first`` of a ring of
    ``entries`` entries whose entry 0 starts at ``buf[0]``.

    Returns ``(seq, devclk, values)``; ``values`` has one column per ``slots`` element.
    Raises :class:`CounterError` on an entry whose version is not TACC_CNT_VERSION.

    Only the words wanted are read (the header words and the selected slots: 41 of an
    entry's 131 for the function catalogue): one gather out of the ring, no copy of whole
    1048-byte entries (issue 18: that copy was most of the consumer's CPU at 10 kHz).
    """
    words = np.frombuffer(buf, dtype="<u8", count=entries * ENTRY_WORDS)
    words = words.reshape(entries, ENTRY_WORDS)
    cols = np.concatenate((np.arange(3, dtype=np.intp), 3 + np.asarray(slots, np.intp)))
    a = first & (entries - 1)
    if a + count <= entries:  # no wrap: rows are a slice, only columns are gathered
        g = words[a:a + count][:, cols]
    else:
        g = np.concatenate((words[a:][:, cols], words[:count - (entries - a)][:, cols]))
    ver = g[:, 0] & np.uint64(0xFFFF_FFFF)
    if count and np.any(ver != CNT_VERSION):
        raise CounterError(f"sample entry version {int(ver[ver != CNT_VERSION][0])}, "
                           f"expected {CNT_VERSION}")
    return g[:, 1].copy(), g[:, 2].copy(), g[:, 3:]


class DeviceBackend(Backend):
    """Consumer of the function's sample ring (one per function, EBUSY otherwise)."""

    name = "device"

    def __init__(self, fn: Function, catalogue: Catalogue | None = None,
                 period_ns: int = ru.SAMPLE_MIN_PERIOD_NS, entries: int = DEFAULT_ENTRIES,
                 node: Path | None = None, slots: np.ndarray | None = None) -> None:
        if slots is None:
            super().__init__(fn, catalogue)
            self.slots = entry_slots(self.catalogue)
        else:  # the entry slots wanted, given (taccd's capture columns): no catalogue read
            self.fn, self.catalogue = fn, catalogue  # type: ignore[assignment]
            self.slots = np.asarray(slots, np.intp)
        self.period_ns = int(period_ns)
        self.fd = os.open(node or fn.accel_node, os.O_RDWR)
        self.mm: mmap.mmap | None = None
        try:
            a = ru.drm_tacc_sample_open(period_ns=self.period_ns, entries=entries)
            try:
                _ioctl(self.fd, ru.DRM_IOCTL_TACC_SAMPLE_OPEN, a)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    raise CounterError(f"{fn.pci}: the sample ring has another consumer") \
                        from exc
                if exc.errno == errno.EACCES:
                    raise CounterError(f"{fn.pci}: the PF's sample ring needs CAP_PERFMON "
                                       "(root)") from exc
                raise
            self.mm = mmap.mmap(self.fd, a.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ,
                                offset=a.mmap_offset)
        except BaseException:
            os.close(self.fd)
            raise
        self.hdr = ru.drm_tacc_sample_header.from_buffer_copy(self.mm, 0)
        if self.hdr.version != ru.SAMPLE_HDR_VERSION or self.hdr.entry_size != ENTRY_SIZE:
            self.close()
            raise CounterError(f"{fn.pci}: sample header version {self.hdr.version}, "
                               f"entry size {self.hdr.entry_size}")
        self.entries = int(self.hdr.entries)
        self.data = memoryview(self.mm)[self.hdr.data_offset:
                                        self.hdr.data_offset + self.entries * ENTRY_SIZE]
        self.cons = 0
        self.epoch = self._hdr_u32("epoch")
        self.dropped = 0
        self.last: Snapshot | None = None

    def _hdr_u32(self, field: str) -> int:
        assert self.mm is not None
        off = getattr(ru.drm_tacc_sample_header, field).offset
        return int.from_bytes(self.mm[off:off + 4], "little")

    def advance(self, cons: int) -> tuple[int, int]:
        a = ru.drm_tacc_sample_advance(cons=cons & 0xFFFF_FFFF)
        _ioctl(self.fd, ru.DRM_IOCTL_TACC_SAMPLE_ADVANCE, a)
        return int(a.prod), int(a.dropped)

    def pending(self) -> int:
        return (self._hdr_u32("prod") - self.cons) & 0xFFFF_FFFF

    def drain(self, limit: int | None = None) -> SampleBatch:
        """Read every entry the device produced since the last drain and free it."""
        epoch = self._hdr_u32("epoch")
        if epoch != self.epoch:  # the driver restarted the ring (reset, resume)
            self.epoch, self.cons = epoch, 0
        prod = self._hdr_u32("prod")
        n = (prod - self.cons) & 0xFFFF_FFFF
        if n > self.entries:  # cannot happen unless the ring restarted under us
            n = 0
        if limit is not None:
            n = min(n, limit)
        seq, devclk, values = parse_entries(self.data, self.slots, self.cons, n, self.entries)
        if n:
            self.cons = (self.cons + n) & 0xFFFF_FFFF
        _, self.dropped = self.advance(self.cons)
        return SampleBatch(seq, devclk, values, self.dropped, epoch)

    def read(self) -> Snapshot:
        """The newest sample (waits up to two periods for the first one)."""
        deadline = time.monotonic_ns() + 2 * self.period_ns + 50_000_000
        while True:
            b = self.drain()
            if len(b):
                self.last = Snapshot(b.values[-1].copy(), time.monotonic_ns())
                return self.last
            if self.last is not None:
                return self.last
            if time.monotonic_ns() > deadline:
                return Snapshot(np.zeros(len(self.slots), np.uint64), time.monotonic_ns(),
                                False, "unavailable")
            time.sleep(self.period_ns / 1e9)

    def close(self) -> None:
        if getattr(self, "mm", None) is not None:
            self.data.release()
            try:
                a = ru.drm_tacc_sample_close()
                _ioctl(self.fd, ru.DRM_IOCTL_TACC_SAMPLE_CLOSE, a)
            except OSError:
                pass
            self.mm.close()  # type: ignore[union-attr]
            self.mm = None
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1
