"""The kernel rings of the trace-ring protocol (docs/uapi.md "Trace ring"): the device
trace ring, the sample ring and the TLP capture.  One consumer per ring: an OPEN ioctl
registers it and returns the mmap offset and size of a header page and the records, an
ADVANCE ioctl publishes the consumer index and returns the producer and drop count, a
CLOSE ioctl (or closing the file) unregisters it.  :class:`KernelRing` holds that
lifecycle; each ring keeps its own records and header reading."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

from tacc.runtime import uapi


class KernelRing:
    """Registered consumer of one ring of the accel node ``node``.

    ``open_req``/``open_arg``: the OPEN ioctl and its argument (filled by the driver);
    ``refused(exc)``: the exception to raise when OPEN fails (one line, naming why);
    ``advance_req``/``close_req``: the ring's ADVANCE and CLOSE ioctls."""

    def __init__(self, node: str, open_req: int, open_arg: Any,
                 refused: Callable[[OSError], Exception], advance_req: int,
                 close_req: int) -> None:
        self.node = node
        self.advance_req, self.close_req = advance_req, close_req
        self.fd = uapi.open_node(node)
        try:
            try:
                uapi.ioctl(self.fd, open_req, open_arg)
            except OSError as exc:
                raise refused(exc) from None
            self.open_arg = open_arg
            self.mm = mmap.mmap(self.fd, int(open_arg.mmap_size), mmap.MAP_SHARED,
                                mmap.PROT_READ, offset=int(open_arg.mmap_offset))
        except BaseException:
            os.close(self.fd)
            raise

    def advance(self, cons: int) -> tuple[int, int]:
        """Publish the consumer index; returns (producer index, records dropped)."""
        a = uapi.drm_tacc_trace_advance(cons=cons)
        uapi.ioctl(self.fd, self.advance_req, a)
        return int(a.prod), int(a.dropped)

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass
        try:
            uapi.ioctl(self.fd, self.close_req, uapi.drm_tacc_trace_close())
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1
