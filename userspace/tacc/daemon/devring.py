"""Consumer of a function's device trace ring (DRM_IOCTL_TACC_TRACE_OPEN/ADVANCE/CLOSE).

The driver owns the consumer index: one registered consumer per function maps the
ring read-only and hands records back with ADVANCE.  Records are copied out in bulk
as a numpy array; drops are the device's ``dropped`` count (cross-checked against
gaps in the record sequence numbers).  On a device whose CAPS advertise
``TACC_CAP_TRACE_V3`` the ring is opened with ``DRM_TACC_TRACE_F_V3``: 128-byte
version-3 records, whose FLOPs, device-memory bytes, list id and index, dtype and sub-op
fill the stream's version-3 columns (docs/capture-format.md, minor 12).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tacc import hw
from tacc.capture.schema import (
    DEVICE_TRACE_DTYPE,
    TRACE_REC3_SIZE,
    TRACE_REC_DTYPE,
    TRACE_V3_TAIL_DTYPE,
)
from tacc.errors import TaccError
from tacc.runtime import uapi
from tacc.runtime.ring import KernelRing

HDR_SIZE = ctypes.sizeof(uapi.drm_tacc_trace_header)
REC = TRACE_REC_DTYPE.itemsize  # 64
OUT_REC = DEVICE_TRACE_DTYPE.itemsize  # 72: the record, fid, pad
assert DEVICE_TRACE_DTYPE.fields is not None and DEVICE_TRACE_DTYPE.fields["fid"][1] == REC
_V_REC = np.dtype(f"V{REC}")
_PAD_AT = DEVICE_TRACE_DTYPE.fields["_pad"][1]
_PAD = slice(_PAD_AT, _PAD_AT + DEVICE_TRACE_DTYPE.fields["_pad"][0].itemsize)
_TAIL_AT = DEVICE_TRACE_DTYPE.fields["flops"][1]  # the version-3 columns of the stream
_TAIL = TRACE_V3_TAIL_DTYPE.itemsize
_V_TAIL = np.dtype(f"V{_TAIL}")
_V_OUT = np.dtype({"names": ["rec", "tail"], "formats": [_V_REC, _V_TAIL],
                   "offsets": [0, _TAIL_AT], "itemsize": OUT_REC})
# a version-3 ring record: the version-2 record, then the tail (offset 64), reserved bytes
_V_REC3 = np.dtype({"names": ["rec", "tail"], "formats": [_V_REC, _V_TAIL],
                    "offsets": [0, REC], "itemsize": TRACE_REC3_SIZE})


_U32 = struct.Struct("<I")
_OFF_PROD = uapi.drm_tacc_trace_header.prod.offset
_OFF_EPOCH = uapi.drm_tacc_trace_header.epoch.offset


class TraceRingError(TaccError):
    errno: int | None = None  # the TRACE_OPEN refusal's, when it is one


@dataclass
class DrainResult:
    records: np.ndarray  # DEVICE_TRACE_DTYPE
    dropped: int  # records newly known dropped (device count or sequence gaps, the larger)
    seq_gaps: int


class RingView:
    """Parses a mapped ring (header + records) and tracks the consumer side.

    ``advance(cons) -> (prod, dropped)`` hands records back; the default implementation
    is the ioctl, tests pass a fake.
    """

    def __init__(self, buf: mmap.mmap | bytearray | memoryview, fid: int,
                 advance: Callable[[int], tuple[int, int]]) -> None:
        self.buf = buf
        self.fid = fid
        self.advance = advance
        hdr = self.header()
        if hdr.version != uapi.TRACE_HDR_VERSION:
            raise TraceRingError(f"trace ring header version {hdr.version} is not supported")
        if hdr.rec_size not in (REC, TRACE_REC3_SIZE):
            raise TraceRingError(f"trace record size {hdr.rec_size} is neither {REC} nor "
                                 f"{TRACE_REC3_SIZE}")
        self.rec_size = int(hdr.rec_size)  # 128: version-3 records
        self.entries = int(hdr.entries)
        self.data_offset = int(hdr.data_offset)
        self.cons = int(hdr.cons)
        self.epoch = int(hdr.epoch)
        # The device's drop count is cumulative since the function's last reset; the
        # driver seeds the header with it at TRACE_OPEN (and after a reset), so only
        # drops of this consumer's run count.
        self.dropped_seen = int(hdr.dropped)
        self.next_seq: int | None = None
        self.total_records = 0
        self.total_dropped = 0  # reported: max of the two totals below (+ overrun)
        self.total_device_drops = 0  # the header's count, since this consumer opened
        self.total_seq_gaps = 0
        self.overrun = 0  # records skipped when PROD ran more than a ring ahead

    def pending(self) -> int:
        """Records waiting (two words of the mapped header, no copy of it); a function
        reset since the last drain reads as a full ring, so that it is drained now."""
        prod, = _U32.unpack_from(self.buf, _OFF_PROD)
        epoch, = _U32.unpack_from(self.buf, _OFF_EPOCH)
        if epoch != self.epoch:
            return self.entries
        return min((prod - self.cons) & 0xFFFFFFFF, self.entries)

    def header(self) -> uapi.drm_tacc_trace_header:
        return uapi.drm_tacc_trace_header.from_buffer_copy(bytes(self.buf[:HDR_SIZE]))

    def drain(self, max_records: int | None = None) -> DrainResult:
        hdr = self.header()
        if int(hdr.epoch) != self.epoch:  # function reset: indices restart at 0
            self.epoch, self.cons, self.next_seq = int(hdr.epoch), 0, None
            self.dropped_seen = int(hdr.dropped)
        prod = int(hdr.prod)
        n = (prod - self.cons) & 0xFFFFFFFF
        if n > self.entries:  # cannot happen with a sane device; resynchronise
            self.overrun += n - self.entries
            self.cons = (prod - self.entries) & 0xFFFFFFFF
            n = self.entries
        if max_records is not None:
            n = min(n, max_records)
        out = np.empty(n, DEVICE_TRACE_DTYPE)  # every byte written below
        if n:
            # the records copied as opaque items (a memcpy each) into the stream's records:
            # the first 64 bytes, and of a version-3 record its 32 bytes of FLOPs, bytes
            # and list (zero for version 2); the ring may wrap once
            v3 = self.rec_size == TRACE_REC3_SIZE
            ring = np.frombuffer(self.buf, dtype=_V_REC3 if v3 else _V_REC,
                                 count=self.entries, offset=self.data_offset)
            view = out.view(_V_OUT)
            start = self.cons % self.entries
            first = min(n, self.entries - start)
            for name in ("rec", "tail") if v3 else ("rec",):
                src = ring[name] if v3 else ring
                dst = view[name]
                dst[:first] = src[start:start + first]
                dst[first:] = src[:n - first]
            out["fid"] = self.fid
            raw = out.view(np.uint8).reshape(n, OUT_REC)
            raw[:, _PAD] = 0
            if not v3:
                raw[:, _TAIL_AT:_TAIL_AT + _TAIL] = 0
        if n:
            self.cons = (self.cons + n) & 0xFFFFFFFF
            _prod, dropped = self.advance(self.cons)
        else:
            # nothing to hand back: no ioctl.  The device drops only into a full ring (n > 0
            # then), so the header's count cannot have moved since the last ADVANCE.
            dropped = int(hdr.dropped)
        new_drops = (dropped - self.dropped_seen) & 0xFFFFFFFF
        self.dropped_seen = dropped
        gaps = self._seq_gaps(out)
        self.total_records += n
        self.total_device_drops += new_drops
        self.total_seq_gaps += gaps
        # The device counts a drop when it happens; its sequence gap shows only with the
        # next record kept, often in a later drain.  Both measure the same drops, so the
        # larger of the two running totals is the count, and a drain reports what it adds
        # (a per-drain max counted one overflow twice, once from each).
        total = max(self.total_device_drops + self.overrun, self.total_seq_gaps)
        lost = max(total - self.total_dropped, 0)
        self.total_dropped += lost
        return DrainResult(out, lost, gaps)

    def _seq_gaps(self, recs: np.ndarray) -> int:
        if not len(recs):
            return 0
        seq = recs["seq"].astype(np.int64)
        gaps = int(np.sum(np.maximum((np.diff(seq) & 0xFFFFFFFF) - 1, 0)))
        if self.next_seq is not None:
            gaps += int((int(seq[0]) - self.next_seq) & 0xFFFFFFFF)
        self.next_seq = (int(seq[-1]) + 1) & 0xFFFFFFFF
        return gaps


def trace_v3_supported(node: str) -> bool:
    """The function's CAPS (DRM_TACC_PARAM_CAPS) advertise version-3 trace records."""
    try:
        fd = uapi.open_node(node)
    except OSError:
        return False
    try:
        return bool(uapi.get_param(fd, uapi.PARAM_CAPS) & hw.TACC_CAP_TRACE_V3)
    except OSError:
        return False
    finally:
        os.close(fd)


class DeviceTraceRing:
    """The registered consumer of one function's trace ring (owns the accel fd)."""

    def __init__(self, node: str, fid: int, entries: int = 0, v3: bool = False) -> None:
        """``entries``: ring size asked of TRACE_OPEN (0 = the driver's default); ``v3``:
        ask for version-3 records (a driver or device refusing them, EINVAL or
        EOPNOTSUPP: version 2, ``self.version`` says which)."""
        self.node = node
        self.version = 3 if v3 else 2
        try:
            self._open(node, entries, v3)
        except TraceRingError as exc:
            if not v3 or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self.version = 2
            self._open(node, entries, False)
        self.fd, self.mm = self.ring.fd, self.ring.mm
        self.view = RingView(self.mm, fid, self.ring.advance)

    def _open(self, node: str, entries: int, v3: bool) -> None:

        def refused(exc: OSError) -> TraceRingError:
            why = {errno.EBUSY: "trace ring already has a consumer (taccd or accel-bpftrace "
                                "record)",
                   errno.EACCES: "the trace ring needs CAP_PERFMON (root): it records every "
                                 "user's commands"}
            if exc.errno in why:
                err = TraceRingError(f"{node}: {why[exc.errno]}")
            else:
                err = TraceRingError(f"{node}: TRACE_OPEN failed: {exc.strerror}")
            err.errno = exc.errno
            return err

        flags = hw.DRM_TACC_TRACE_F_V3 if v3 else 0
        self.ring = KernelRing(node, uapi.DRM_IOCTL_TACC_TRACE_OPEN,
                               uapi.drm_tacc_trace_open(flags=flags, entries=entries),
                               refused, uapi.DRM_IOCTL_TACC_TRACE_ADVANCE,
                               uapi.DRM_IOCTL_TACC_TRACE_CLOSE)

    def drain(self) -> DrainResult:
        return self.view.drain()

    def pending(self) -> int:
        return self.view.pending()

    @property
    def entries(self) -> int:
        return self.view.entries

    def close(self) -> None:
        self.ring.close()
        self.fd = self.ring.fd
