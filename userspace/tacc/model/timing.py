"""The time a command takes on its engine, uncontended (qemu/hw/tacc/tacc-exec.c,
tacc-model.c; docs/hardware.md sections 9 and 14), in ns at time-scale 1."""

from __future__ import annotations

from functools import lru_cache

from . import link
from .params import DEFAULT, DeviceParams

# page-table levels a TLB miss reads (tacc-mmu.c): 3 for a 4 KiB page, 2 for a 2 MiB one
_WALK_READS = {4096: 3, 2 << 20: 2}


def compute_ns(flops: float, devmem_bytes: float = 0.0, dtype: str = "fp32",
               p: DeviceParams = DEFAULT) -> int:
    """Engine time of a compute command: fixed cost + max(arithmetic, device memory)."""
    arith = flops / p.peak_gflops[dtype]  # GFLOP/s = FLOP/ns
    mem = devmem_bytes / p.devmem_gbps  # GB/s = B/ns
    return int(p.cmd_latency_ns + max(arith, mem))


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of C = alpha * A x B + beta * C (a multiply and an add per term)."""
    return 2 * m * n * k


def gemm_ns(m: int, n: int, k: int, dtype: str = "fp32", elem_bytes: int = 4,
            p: DeviceParams = DEFAULT, beta: bool = True) -> int:
    """GEMM engine time: A and B read, C written in device memory (and read first when
    ``beta`` is not 0)."""
    c = (2 if beta else 1) * m * n
    return compute_ns(gemm_flops(m, n, k), elem_bytes * (m * k + k * n + c), dtype, p)


def eltwise_ns(n: int, inputs: int = 1, flops_per_elem: int = 1,
               p: DeviceParams = DEFAULT) -> int:
    """An fp32 element-wise command over ``n`` elements reading ``inputs`` operands and
    writing one (add/mul: 2 inputs; relu/scale: 1)."""
    return compute_ns(flops_per_elem * n, 4 * n * (inputs + 1), "fp32", p)


def walk_reads(page_size: int) -> int:
    """Page-table reads of one TLB miss on pages of ``page_size`` bytes."""
    return _WALK_READS[int(page_size)]


def walk_ns(misses: int, page_size: int = 4096, p: DeviceParams = DEFAULT) -> int:
    """What ``misses`` TLB misses add to a command: one ``walk-latency-ns`` per read."""
    return int(misses) * walk_reads(page_size) * p.walk_latency_ns


@lru_cache(maxsize=4096)
def _link_ps(kind: str, n: int, host_off: int, gen: int, width: int, mps: int, mrrs: int,
             rcb: int, tags: int, rd: int, wr: int, pc: int, phc: int) -> int:
    return link.copy_link_ps(kind, n, gen, width, mps, mrrs, rcb, tags, rd, wr, pc, host_off,
                             0, phc)


def copy_ns(kind: str, n: int, host_off: int = 0, walks: int = 0, share: float = 1.0,
            p: DeviceParams = DEFAULT) -> int:
    """A host copy of ``n`` bytes (``"h2d"``: COPY_H2D, ``"d2h"``: COPY_D2H) whose host
    side starts ``host_off`` bytes into a page: the fixed cost, ``walks`` page-table
    reads, the link steps after idle and the host's read (or write) latency.  ``share``:
    the part of the link the copy gets when others stream at the same time (the steps
    take 1/share as long)."""
    steps = _link_ps(kind, int(n), int(host_off), p.link_gen, p.link_width, p.mps, p.mrrs,
                     p.rcb, p.tags, p.read_latency_ns, p.write_latency_ns, p.posted_credits,
                     p.posted_hdr_credits)
    lat = p.read_latency_ns if kind == link.H2D else p.write_latency_ns
    return int(p.cmd_latency_ns + int(walks) * p.walk_latency_ns + steps / share / 1000 + lat)


def link_max_bw(direction: str | None = None, p: DeviceParams = DEFAULT) -> float:
    """The modelled maximum payload bandwidth of the device's link, bytes/s."""
    return link.link_max_payload_bw(p.link_gen, p.link_width, p.mps, direction, p.mrrs, p.rcb,
                                    p.tags, p.read_latency_ns, p.write_latency_ns,
                                    p.posted_credits, p.posted_hdr_credits)
