"""The device's performance model in one place: the QEMU device's parameters
(:mod:`.params`, one table equal to ``-device tacc``'s property defaults), its PCIe link
(:mod:`.link`) and the time a command takes on an engine (:mod:`.timing`).  Nothing else
in Python computes device time: the runtime's simulator, the synthetic captures, the
analysis's estimates and the test link model take it from here.

Command timing is what the device computes (docs/hardware.md sections 9 and 14): a
compute command's engine time is its fixed cost (``cmd-latency-ns``) plus the larger of
its arithmetic time (FLOPs over the peak rate of its data type) and its device-memory
time (bytes over ``devmem-gbps``); a copy's is its fixed cost, its page walks, its link
steps and the host's read or write latency.  A new data type adds its peak rate to
:data:`PEAK_GFLOPS`; a new operation adds its timing here and in QEMU only.
"""

from __future__ import annotations

from . import link
from .params import DEFAULT, PEAK_GFLOPS, QEMU_DEFAULTS, DeviceParams
from .timing import (
    compute_ns,
    copy_ns,
    eltwise_ns,
    gemm_flops,
    gemm_ns,
    link_max_bw,
    walk_ns,
    walk_reads,
)

__all__ = [
    "DEFAULT", "PEAK_GFLOPS", "QEMU_DEFAULTS", "DeviceParams", "compute_ns", "copy_ns",
    "eltwise_ns", "gemm_flops", "gemm_ns", "link", "link_max_bw", "walk_ns", "walk_reads",
]
