"""The twin workloads as data: each one's sizes, iteration counts and device command
sequence, defined once.  :mod:`tacc.workloads.twins` runs a plan on a device (its
parameters and its calls, in this order) and :mod:`tacc.capture.synth` writes the
synthetic capture of the same plan; tests/host/test_plans.py checks that the commands a
real twin submits (on the runtime's simulator) are its plan's steps.

A plan's ``steps`` are the device commands of the measured section in the order the
host issues them; ``stream`` is the twin's stream (a device queue), ``sync`` says the
host waits for that command before its next call.  Pure data: no runtime, no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KiB = 1 << 10
MiB = 1 << 20
F32 = 4  # bytes per element of the twins' arrays


@dataclass(frozen=True)
class Step:
    op: str  # "copy_h2d", "copy_d2h", "gemm" (m x k @ k x n) or "scale"
    nbytes: int = 0  # copies and scale: bytes moved or scaled
    stream: int = 0
    offset: int = 0  # copies: the byte offset into both buffers
    m: int = 0
    n: int = 0
    k: int = 0
    sync: bool = False


@dataclass(frozen=True)
class Plan:
    workload: str
    bad: bool
    iters: int
    steps: tuple[Step, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def count(self, op: str) -> int:
        return sum(1 for s in self.steps if s.op == op)


def tiny_transfers(bad: bool, scale: int = 1) -> Plan:
    """Upload 2 MiB x scale as 4 KiB copies (bad) or 1 MiB copies (good)."""
    total = 2 * MiB * scale
    chunk = 4 * KiB if bad else 1 * MiB
    steps = tuple(Step("copy_h2d", chunk, offset=off) for off in range(0, total, chunk))
    return Plan("tiny_transfers", bad, len(steps), steps, {"total": total, "chunk": chunk})


def unaligned_userptr(bad: bool, scale: int = 1) -> Plan:
    """4 MiB up and 1 MiB down through userptr arrays 64 B off a page (bad) or aligned."""
    n_up, n_down = 1 << 20, 1 << 18  # float32 elements
    iters = 4 * scale
    one = (Step("copy_h2d", n_up * F32, 0), Step("copy_d2h", n_down * F32, 1))
    return Plan("unaligned_userptr", bad, iters, one * iters,
                {"n_up": n_up, "n_down": n_down, "misalign": 64 if bad else 0})


def map_churn(bad: bool, scale: int = 1) -> Plan:
    """A 256 KiB upload and a wait per call; bad: the array is registered (pin + map +
    bind) and unregistered around every call, good: once."""
    n = 64 * KiB  # float32 elements
    iters = 64 * scale
    return Plan("map_churn", bad, iters, (Step("copy_h2d", n * F32, sync=True),) * iters,
                {"n": n, "register_per_call": bad})


def serialized_copies(bad: bool, scale: int = 1, rows: int = 2048, k: int = 512,
                      n_out: int = 128) -> Plan:
    """Upload X_i, Y_i = X_i @ W, download Y_i; bad: one stream and a wait per batch;
    good: three streams (upload, compute, download), double-buffered."""
    iters = 8 * scale
    up, comp, down = (0, 0, 0) if bad else (0, 1, 2)
    one = (Step("copy_h2d", rows * k * F32, up), Step("gemm", 0, comp, m=rows, n=n_out, k=k),
           Step("copy_d2h", rows * n_out * F32, down, sync=bad))
    return Plan("serialized_copies", bad, iters, one * iters,
                {"rows": rows, "k": k, "n": n_out})


def tlb_thrash(bad: bool, scale: int = 1, m: int = 512) -> Plan:
    """GEMMs on m x m operands mapped with 4 KiB device pages (bad) or 2 MiB (good)."""
    iters = 6 * scale
    return Plan("tlb_thrash", bad, iters, (Step("gemm", 0, m=m, n=m, k=m),) * iters,
                {"m": m, "page_size": 4096 if bad else 2 * MiB})


def link_saturation(bad: bool, scale: int = 1) -> Plan:
    """Four queues each run ``y = 2 x`` on an 8 MiB input, 12 x scale times; bad: every
    step re-uploads the input, good: it is uploaded once per queue."""
    nq, n = 4, 2 * MiB  # float32 elements
    iters = 12 * scale
    steps: list[Step] = []
    for i in range(iters):
        for q in range(nq):
            if bad or i == 0:
                steps.append(Step("copy_h2d", n * F32, q))
            steps.append(Step("scale", n * F32, q))
    return Plan("link_saturation", bad, iters, tuple(steps), {"queues": nq, "n": n})


def host_bound(bad: bool, scale: int = 1, m: int = 512, k: int = 512,
               n_out: int = 256) -> Plan:
    """Per batch the host prepares an m x k input, uploads it and runs a GEMM with an
    k x n_out weight; bad: prepare, submit, wait in turn; good: prepare batch i+1 while
    the device runs batch i."""
    iters = 6 * scale
    one = (Step("copy_h2d", m * k * F32), Step("gemm", 0, m=m, n=n_out, k=k, sync=bad))
    return Plan("host_bound", bad, iters, one * iters, {"m": m, "k": k, "n": n_out})


def noisy_neighbour(bad: bool, scale: int = 1) -> Plan:
    """A victim uploads 8 MiB and waits, 40 x scale times; bad: a neighbour has queued
    8 x scale rounds of 8 MiB uploads on four queues first (``params``)."""
    n = 2 * MiB  # float32 elements
    iters = 40 * scale
    return Plan("noisy_neighbour", bad, iters, (Step("copy_h2d", n * F32, sync=True),) * iters,
                {"n": n, "neighbour_queues": 4 if bad else 0, "neighbour_rounds": 8 * scale})


PLANS = {f.__name__: f for f in (tiny_transfers, unaligned_userptr, map_churn,
                                 serialized_copies, tlb_thrash, link_saturation, host_bound,
                                 noisy_neighbour)}
