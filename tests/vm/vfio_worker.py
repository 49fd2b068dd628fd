"""Child process of tests/vm/test_vfio.py: a VFIO user of one function.

python vfio_worker.py BDF oob PHYS   map device VA 0x7f0000000 -> IOVA PHYS (never mapped in
                                     the container), copy device->host and host->device
                                     there; print the statuses, IRQ_STATUS, FAULT_* as JSON
python vfio_worker.py BDF busy       GEMM jobs back to back, "running" after the first
python vfio_worker.py BDF hold       open the group, print "held", sleep until killed
python vfio_worker.py BDF scan       read the function's whole device-memory window; print
                                     its size and the byte values found as JSON
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from tacc import hw
from tacc.hw.records import d_copy
from tacc.vfio.driver import DEVMEM_VA, TaccVfio

ATTACK_VA = 0x7F000_0000
SCAN_CHUNK = 1 << 20


def main(bdf: str, mode: str, arg: str = "") -> int:
    with TaccVfio(bdf) as t:
        if mode == "oob":
            phys = int(arg, 0)
            t.map_va(ATTACK_VA, phys, 4096)
            t.tlb_invalidate()
            w = t.run([d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, ATTACK_VA, 4096)])
            r = t.run([d_copy(hw.TACC_OP_COPY_H2D, ATTACK_VA, DEVMEM_VA, 4096)])
            ok = t.run([t.nop()])
            addr, info = t.fault()
            print(json.dumps({"write": w.status, "read": r.status, "after": ok.status,
                              "irq_status": t.irq_status(), "fault_info": info,
                              "fault_addr": addr}), flush=True)
        elif mode == "busy":  # jobs back to back until killed: one is always in flight
            job = t.submit([t.gemm(0, 1 << 20, 2 << 20, 128, 128, 128)] * 64)
            print("running", flush=True)
            while True:
                nxt = t.submit([t.gemm(0, 1 << 20, 2 << 20, 128, 128, 128)] * 64)
                t.wait(job, timeout=600)
                job = nxt
        elif mode == "scan":  # what the function's previous owner left in its window
            buf, found = t.alloc(SCAN_CHUNK), set()
            for off in range(0, t.devmem_size, SCAN_CHUNK):
                n = min(SCAN_CHUNK, t.devmem_size - off)
                assert t.run([t.copy_d2h(off, buf, n)]).status == 0, off
                found.update(int(v) for v in np.unique(buf.array[:n]))
            print(json.dumps({"size": t.devmem_size, "values": sorted(found)}), flush=True)
        elif mode == "hold":
            print("held", flush=True)
            time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
