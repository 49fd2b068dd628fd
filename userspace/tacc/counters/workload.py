"""A copy of known size through the driver's ioctls, for tests and the benchmark.

``copy(dev, size, "h2d")`` runs one job [TIMESTAMP, COPY, TIMESTAMP] on queue 0 and
returns the two device timestamps: the ground truth that counter-derived bandwidth is
checked against.  The two 8-byte timestamp writes are D2H payload too (16 bytes).
"""

from __future__ import annotations

import ctypes as C
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tacc.runtime import uapi

TIMESTAMP_BYTES = 16  # two 8-byte TIMESTAMP writes to host memory per job


@dataclass
class CopyResult:
    size: int
    direction: str
    t_start: int  # device ticks, first TIMESTAMP
    t_end: int  # device ticks, second TIMESTAMP

    @property
    def ticks(self) -> int:
        return self.t_end - self.t_start


class Device:
    def __init__(self, node: str | Path) -> None:
        self.fd = os.open(node, os.O_RDWR)
        self.handles: list[int] = []

    def bo(self, size: int, kind: int) -> int:
        a = uapi.ioctl(self.fd, uapi.DRM_IOCTL_TACC_BO_CREATE,
                       uapi.drm_tacc_bo_create(size=size, type=kind))
        self.handles.append(a.handle)  # type: ignore[attr-defined]
        return int(a.handle)  # type: ignore[attr-defined]

    def map_bo(self, handle: int, size: int) -> mmap.mmap:
        info = uapi.ioctl(self.fd, uapi.DRM_IOCTL_TACC_BO_INFO,
                          uapi.drm_tacc_bo_info(handle=handle))
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                         offset=info.mmap_offset)  # type: ignore[attr-defined]

    def submit(self, cmds: list[C.Structure], queue: int = 0,
               timeout_ns: int = 30_000_000_000) -> int:
        arr = (uapi.drm_tacc_cmd * len(cmds))(*cmds)
        s = uapi.drm_tacc_submit(cmds=C.addressof(arr), num_cmds=len(cmds), queue=queue,
                                 cmd_size=C.sizeof(uapi.drm_tacc_cmd))
        uapi.ioctl(self.fd, uapi.DRM_IOCTL_TACC_SUBMIT, s)
        w = uapi.ioctl(self.fd, uapi.DRM_IOCTL_TACC_WAIT,
                       uapi.drm_tacc_wait(seqno=s.seqno, timeout_ns=timeout_ns))
        return int(w.status)  # type: ignore[attr-defined]

    def close(self) -> None:
        for h in self.handles:
            try:
                uapi.ioctl(self.fd, uapi.DRM_IOCTL_TACC_GEM_CLOSE,
                           uapi.drm_tacc_gem_close(handle=h))
            except OSError:
                pass
        os.close(self.fd)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CopyWorkload:
    """Buffers allocated once; ``run()`` may be called many times."""

    def __init__(self, dev: Device, size: int) -> None:
        self.dev = dev
        self.size = size
        self.host = dev.bo(size, uapi.BO_HOST)
        self.devbo = dev.bo(size, uapi.BO_DEVICE)
        self.ts = dev.bo(4096, uapi.BO_HOST)
        self.ts_map = dev.map_bo(self.ts, 4096)

    def run(self, direction: str = "h2d", tag: int = 0x7ACC) -> CopyResult:
        op = uapi.OP_COPY_H2D if direction == "h2d" else uapi.OP_COPY_D2H
        src, dst = (self.host, self.devbo) if direction == "h2d" else (self.devbo, self.host)
        cmd, operand = uapi.drm_tacc_cmd, uapi.drm_tacc_operand
        ts0 = cmd(opcode=uapi.OP_TIMESTAMP, tag=tag, a=operand(self.ts, 0, 0))
        cp = cmd(opcode=op, tag=tag, a=operand(src, 0, 0), b=operand(dst, 0, 0), size=self.size)
        ts1 = cmd(opcode=uapi.OP_TIMESTAMP, tag=tag, a=operand(self.ts, 0, 8))
        status = self.dev.submit([ts0, cp, ts1])
        if status:
            raise OSError(-status, f"copy job failed: {os.strerror(-status)}")
        t = np.frombuffer(self.ts_map, "<u8", 2)
        return CopyResult(self.size, direction, int(t[0]), int(t[1]))

    def close(self) -> None:
        self.ts_map.close()


def main(argv: list[str] | None = None) -> int:
    """python -m tacc.counters.workload [-d NODE] [--size N] [--dir h2d|d2h] [--count K]"""
    import argparse
    import json

    from .catalogue import functions

    p = argparse.ArgumentParser(prog="python -m tacc.counters.workload")
    p.add_argument("-d", "--node", help="accel node (default: the first tacc function's)")
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--dir", choices=("h2d", "d2h"), default="h2d")
    p.add_argument("--count", type=int, default=1)
    a = p.parse_args(argv)
    node = a.node or str(functions()[0].accel_node)
    with Device(node) as dev:
        wl = CopyWorkload(dev, a.size)
        res = [wl.run(a.dir) for _ in range(a.count)]
        wl.close()
    print(json.dumps({"size": a.size, "dir": a.dir, "ticks": [r.ticks for r in res]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
