"""The registered consumer of the PF's TLP capture ring (DRM_IOCTL_TACC_TLPCAP_*, uAPI 3).

Same protocol as the device trace ring (tacc.daemon.devring): the driver maps a header
page (``struct drm_tacc_trace_header``, ``rec_size`` 64) then the records read-only; the
consumer copies records out in bulk and hands them back with ADVANCE.  Opening needs
CAP_PERFMON (the capture shows every function and context): -EACCES otherwise.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os

import numpy as np

from tacc.errors import TaccError
from tacc.runtime import uapi

from . import TLP_DTYPE

HDR_SIZE = ctypes.sizeof(uapi.drm_tacc_trace_header)
REC = TLP_DTYPE.itemsize


class TlpCaptureError(TaccError):
    pass


class TlpRing:
    """Open the capture on ``node`` (an accel node of a PF) with device-side filters:
    ``funcs`` (bit f = function f, 0 = all), ``kinds`` (bit k = TACC_TLP_k, 0 = all),
    ``addr`` ([lo, hi) bus addresses, None = all), ``no_ctrl`` (leave out control
    traffic)."""

    def __init__(self, node: str, entries: int = 0, funcs: int = 0, kinds: int = 0,
                 addr: tuple[int, int] | None = None, no_ctrl: bool = False) -> None:
        self.fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
        try:
            op = uapi.drm_tacc_tlpcap_open(
                flags=uapi.TLPCAP_NO_CTRL if no_ctrl else 0, entries=entries, funcs=funcs,
                kinds=kinds, addr_lo=addr[0] if addr else 0, addr_hi=addr[1] if addr else 0)
            try:
                fcntl.ioctl(self.fd, uapi.DRM_IOCTL_TACC_TLPCAP_OPEN, op)
            except OSError as exc:
                why = {errno.EACCES: "the TLP capture needs CAP_PERFMON (root)",
                       errno.EBUSY: "the TLP capture already has a consumer",
                       errno.EOPNOTSUPP: "no TLP capture on this function (a VF, or the "
                                         "device lacks TACC_CAP_TLP_CAPTURE)"}
                raise TlpCaptureError(f"{node}: {why.get(exc.errno, exc.strerror)}") from None
            self.entries = int(op.entries)
            self.mm = mmap.mmap(self.fd, int(op.mmap_size), mmap.MAP_SHARED, mmap.PROT_READ,
                                offset=int(op.mmap_offset))
            hdr = self.header()
            if hdr.rec_size != REC:
                raise TlpCaptureError(f"{node}: TLP record size {hdr.rec_size} != {REC}")
            self.data_offset = int(hdr.data_offset)
            self.cons = int(hdr.cons)
            self.dropped = 0
        except BaseException:
            os.close(self.fd)
            raise

    def header(self) -> uapi.drm_tacc_trace_header:
        return uapi.drm_tacc_trace_header.from_buffer_copy(bytes(self.mm[:HDR_SIZE]))

    def drain(self) -> np.ndarray:
        """Every record the device produced since the last drain (TLP_DTYPE)."""
        prod = int(self.header().prod)
        n = min((prod - self.cons) & 0xFFFFFFFF, self.entries)
        ring = np.frombuffer(self.mm, dtype=TLP_DTYPE, count=self.entries,
                             offset=self.data_offset)
        start = self.cons % self.entries
        first = min(n, self.entries - start)
        out = np.concatenate([ring[start:start + first], ring[:n - first]])
        self.cons = (self.cons + n) & 0xFFFFFFFF
        a = uapi.drm_tacc_trace_advance(cons=self.cons)
        fcntl.ioctl(self.fd, uapi.DRM_IOCTL_TACC_TLPCAP_ADVANCE, a)
        self.dropped = int(a.dropped)
        return out

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass
        try:
            fcntl.ioctl(self.fd, uapi.DRM_IOCTL_TACC_TLPCAP_CLOSE, uapi.drm_tacc_trace_close())
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> TlpRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
