"""The VFIO migration uAPI v2 and DMA dirty-page tracking of a device fd (the VMM's side).

A tacc VF bound to ``tacc_vfio_pci`` (``tacc.vfio.bind.bind(bdf, driver=VARIANT_DRIVER)``)
offers ``VFIO_DEVICE_FEATURE_MIGRATION`` (STOP_COPY) and DMA logging; docs/vfio.md
"Migration" has the states, the data format and the threat model::

    m = Migration(t.dev)                    # t: a TaccVfio
    m.set_state(V.VFIO_DEVICE_STATE_STOP)
    blob = m.save()                         # STOP -> STOP_COPY, the data fd read to EOF, -> STOP
    ...
    m.load(blob)                            # STOP -> RESUMING, written, -> STOP (the device loads)
    m.set_state(V.VFIO_DEVICE_STATE_RUNNING)

Every refusal of the kernel is a :class:`tacc.errors.VfioError` with the errno.
"""

from __future__ import annotations

import ctypes as C
import errno
import os

import numpy as np

from tacc.errors import VfioError
from tacc.vfio import uapi as V
from tacc.vfio.driver import Device, _ioctl

STATE_NAMES = {V.VFIO_DEVICE_STATE_ERROR: "ERROR", V.VFIO_DEVICE_STATE_STOP: "STOP",
               V.VFIO_DEVICE_STATE_RUNNING: "RUNNING", V.VFIO_DEVICE_STATE_STOP_COPY: "STOP_COPY",
               V.VFIO_DEVICE_STATE_RESUMING: "RESUMING",
               V.VFIO_DEVICE_STATE_RUNNING_P2P: "RUNNING_P2P"}
CHUNK = 1 << 20


def _feature(dev: Device, flags: int, payload: C.Structure | C.c_uint64 | None,
             what: str) -> None:
    """VFIO_DEVICE_FEATURE with @payload after the header (read back into it on GET)."""
    n = C.sizeof(payload) if payload is not None else 0

    class _Feat(C.Structure):
        _fields_ = [("hdr", V.vfio_device_feature), ("data", C.c_uint8 * n)]

    f = _Feat()
    f.hdr = V.vfio_device_feature(C.sizeof(_Feat), flags)
    if payload is not None:
        C.memmove(C.addressof(f.data), C.addressof(payload), n)
    _ioctl(dev.fd, V.VFIO_DEVICE_FEATURE, f, what)
    if payload is not None:
        C.memmove(C.addressof(payload), C.addressof(f.data), n)


class Migration:
    """Migration and dirty logging of one open VFIO device."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev

    def flags(self) -> int:
        """VFIO_MIGRATION_* of the device (VfioError ENOTTY: the driver has no migration)."""
        m = V.vfio_device_feature_migration(0)
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_GET | V.VFIO_DEVICE_FEATURE_MIGRATION, m,
                 "VFIO_DEVICE_FEATURE_MIGRATION")
        return int(m.flags)

    def state(self) -> int:
        s = V.vfio_device_feature_mig_state(0, -1)
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_GET | V.VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, s,
                 "MIG_DEVICE_STATE get")
        return int(s.device_state)

    def set_state(self, state: int) -> int | None:
        """Move to @state (the kernel walks the arcs); the data fd of STOP_COPY or RESUMING."""
        s = V.vfio_device_feature_mig_state(state, -1)
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_SET | V.VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, s,
                 f"MIG_DEVICE_STATE -> {STATE_NAMES.get(state, state)}")
        return int(s.data_fd) if s.data_fd >= 0 else None

    def data_size(self) -> int:
        """The bytes STOP_COPY will produce (VFIO_DEVICE_FEATURE_MIG_DATA_SIZE)."""
        d = C.c_uint64(0)
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_GET | V.MIG_DATA_SIZE_FEATURE, d,
                 "MIG_DATA_SIZE")
        return int(d.value)

    @staticmethod
    def read_all(fd: int) -> bytes:
        out = bytearray()
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                return bytes(out)
            out += b

    @staticmethod
    def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view[:CHUNK])
            except OSError as e:
                raise VfioError(e.errno, f"migration data write: {e.strerror}") from None
            view = view[n:]

    def save(self) -> bytes:
        """STOP_COPY from STOP: the device's state, read to EOF; back to STOP."""
        fd = self.set_state(V.VFIO_DEVICE_STATE_STOP_COPY)
        if fd is None:
            raise VfioError(errno.EPROTO, "STOP_COPY gave no data fd")
        try:
            data = self.read_all(fd)
        finally:
            os.close(fd)
        self.set_state(V.VFIO_DEVICE_STATE_STOP)
        return data

    def load(self, *parts: bytes | bytearray | memoryview) -> None:
        """RESUMING from STOP: the state (@parts, one after the other) written, then STOP,
        where the device takes it or the kernel refuses it (VfioError; the device stays
        RESUMING until a reset)."""
        fd = self.set_state(V.VFIO_DEVICE_STATE_RESUMING)
        if fd is None:
            raise VfioError(errno.EPROTO, "RESUMING gave no data fd")
        try:
            for data in parts:
                self.write_all(fd, data)
        finally:
            os.close(fd)
        self.set_state(V.VFIO_DEVICE_STATE_STOP)

    # ------------------------------------------------------------ dirty logging ---
    def log_start(self, ranges: list[tuple[int, int]], page_size: int = 4096) -> int:
        """Log the device's DMA writes into @ranges ((iova, length) each); returns the page
        size the driver chose."""
        arr = (V.vfio_device_feature_dma_logging_range * len(ranges))(*ranges)
        c = V.vfio_device_feature_dma_logging_control(page_size, len(ranges), 0,
                                                      C.addressof(arr))
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_SET | V.VFIO_DEVICE_FEATURE_DMA_LOGGING_START,
                 c, "DMA_LOGGING_START")
        return int(c.page_size)

    def log_stop(self) -> None:
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_SET | V.VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP,
                 None, "DMA_LOGGING_STOP")

    def log_report(self, iova: int, length: int, page_size: int) -> np.ndarray:
        """The dirty bitmap of [iova, +length) (read and cleared): one bool per page."""
        pages = length // page_size
        bm = np.zeros((pages + 63) // 64, dtype=np.uint64)
        r = V.vfio_device_feature_dma_logging_report(iova, length, page_size,
                                                     bm.ctypes.data)
        _feature(self.dev, V.VFIO_DEVICE_FEATURE_GET | V.VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT,
                 r, "DMA_LOGGING_REPORT")
        return np.unpackbits(bm.view(np.uint8), bitorder="little")[:pages].astype(bool)
