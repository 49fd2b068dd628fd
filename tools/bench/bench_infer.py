#!/usr/bin/env python3
"""The hw 1.3 operations through the device model (qtest, no guest; docs/hardware.md
section 14):

- **roofline**: per operation and dtype, the modelled time (CQE end - start), the FLOPs
  and device-memory bytes the trace/counters report, the achieved FLOP/s and bytes/s, and
  the fraction of the roofline bound ``max(flops / peak, bytes / bandwidth)`` the command
  took (fixed costs and page walks are the rest);
- **host BLAS**: host GFLOP/s of the device's 1024^3 fp32 GEMM (wall time of the job,
  gather and scatter included) against the same OpenBLAS ``cblas_sgemm`` called directly
  (ctypes, the library QEMU links); the goal is >= 0.5x;
- **lists**: per command, direct submits (one doorbell and one job per NOP) against one
  LIST of the same NOPs: modelled device ns per command and host wall us per command
  (qtest MMIO and clock steps stand in for the ioctl path; the in-guest figure is the
  runtime's graph benchmark).

    tools/bench/bench_infer.py [--json out.json] [--n 256]
"""

from __future__ import annotations

import argparse
import ctypes as C
import ctypes.util
import json
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "userspace"))

import numpy as np  # noqa: E402
from tacc import hw  # noqa: E402
from tacc.hw.records import PAYLOAD, desc  # noqa: E402
from tacc.testing.taccdev import DEVMEM_VA, Tacc  # noqa: E402

FP32, BF16 = hw.TACC_DT_FP32, hw.TACC_DT_BF16


def f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def gemm(m: int, n: int, k: int, dt: int) -> bytes:
    b = DEVMEM_VA + (32 << 20)
    c = DEVMEM_VA + (96 << 20)
    return desc(hw.TACC_OP_GEMM, payload=PAYLOAD["gemm"].pack(
        DEVMEM_VA, b, c, m, n, k, k, n, n, f32(1.0), 0, dt, FP32, 0, 0, 1, 0, 0, 0, 0, 0))


def eltwise(op: int, n: int, dt: int) -> bytes:
    return desc(hw.TACC_OP_ELTWISE, payload=PAYLOAD["eltwise"].pack(
        DEVMEM_VA, 0, DEVMEM_VA + (96 << 20), n, op, 0, dt, dt, 0, 0, 0))


def softmax(rows: int, cols: int, dt: int) -> bytes:
    return desc(hw.TACC_OP_SOFTMAX, payload=PAYLOAD["softmax"].pack(
        DEVMEM_VA, DEVMEM_VA + (96 << 20), rows, cols, cols, cols, f32(0.125),
        hw.TACC_SOFTMAX_F_CAUSAL, 0, 0, dt, dt, 0))


def norm(rows: int, cols: int, dt: int) -> bytes:
    return desc(hw.TACC_OP_NORM, payload=PAYLOAD["norm"].pack(
        DEVMEM_VA, DEVMEM_VA + (96 << 20), DEVMEM_VA + (64 << 20), DEVMEM_VA + (65 << 20),
        rows, cols, cols, cols, f32(1e-5), hw.TACC_NORM_LAYER, dt, dt, dt))


OPS = [  # name, descriptor, dtype used for the peak
    ("gemm fp32 1024^3", gemm(1024, 1024, 1024, FP32), FP32),
    ("gemm bf16 1024^3", gemm(1024, 1024, 1024, BF16), BF16),
    ("gemv bf16 1x4096x4096", gemm(1, 4096, 4096, BF16), BF16),
    ("gemm bf16 16x4096x4096", gemm(16, 4096, 4096, BF16), BF16),
    ("gelu bf16 4M", eltwise(hw.TACC_ELT_GELU, 4 << 20, BF16), FP32),
    ("softmax bf16 1024x1024 causal", softmax(1024, 1024, BF16), FP32),
    ("layernorm bf16 4096x768", norm(4096, 768, BF16), FP32),
]


def fill(pf, off: int, n: int, value: int) -> None:
    d = desc(hw.TACC_OP_FILL, payload=PAYLOAD["fill"].pack(off, n, value))
    assert pf.run_job(0, [d]).status == 0


def roofline(dev, pf) -> list[dict]:
    peak = {FP32: dev.qom_get("compute-gflops"), BF16: dev.qom_get("bf16-gflops")}
    bw = dev.qom_get("devmem-gbps")
    fill(pf, 0, 64 << 20, 0x3F803F803F803F80)
    fill(pf, 32 << 20, 64 << 20, 0x3F803F803F803F80)
    rows = []
    for name, d, dt in OPS:
        c0 = pf.counters()
        cq = pf.run_job(1, [d])
        c1 = pf.counters()
        assert cq.status == 0, (name, cq.status)
        t_ns = cq.end - cq.start
        flops = c1["flops"] - c0["flops"]
        nbytes = (c1["devmem_read_bytes"] - c0["devmem_read_bytes"] +
                  c1["devmem_write_bytes"] - c0["devmem_write_bytes"])
        bound_ns = max(flops / peak[dt], nbytes / bw)
        rows.append({"op": name, "t_ns": t_ns, "flops": flops, "bytes": nbytes,
                     "gflops": flops / t_ns, "gbps": nbytes / t_ns,
                     "peak_gflops": peak[dt], "peak_gbps": bw,
                     "intensity": flops / nbytes if nbytes else 0.0,
                     "bound": "compute" if flops / peak[dt] > nbytes / bw else "memory",
                     "of_roofline": bound_ns / t_ns})
    return rows


def blas_direct(n: int = 1024, reps: int = 3) -> float:
    """GFLOP/s of OpenBLAS cblas_sgemm called directly (the library QEMU links)."""
    lib = C.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
    a = np.ones((n, n), np.float32)
    b = np.ones((n, n), np.float32)
    c = np.zeros((n, n), np.float32)
    p = C.POINTER(C.c_float)
    lib.cblas_sgemm.argtypes = [C.c_int] * 6 + [C.c_float, p, C.c_int, p, C.c_int,
                                                 C.c_float, p, C.c_int]
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        lib.cblas_sgemm(101, 111, 111, n, n, n, 1.0, a.ctypes.data_as(p), n,
                        b.ctypes.data_as(p), n, 0.0, c.ctypes.data_as(p), n)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def blas_device(pf, n: int = 1024, reps: int = 3) -> float:
    """Host GFLOP/s of the device's fp32 GEMM: wall time of the job (operand gather,
    the BLAS, C's scatter and the qtest round trips)."""
    d = gemm(n, n, n, FP32)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        assert pf.run_job(2, [d], step=10**7).status == 0
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def lists(dev, pf, n: int) -> dict:
    nop = desc(hw.TACC_OP_NOP)
    # direct: n jobs of one NOP, a doorbell each
    t = time.perf_counter()
    direct_dev = 0
    for _ in range(n):
        cq = pf.run_job(3, [nop], step=10**6)
        direct_dev += cq.end - cq.start
    direct_wall = time.perf_counter() - t
    # one LIST of n NOPs in host memory
    lst = dev.alloc(128 * n)
    dev.qt.memwrite(lst, nop * n)
    t = time.perf_counter()
    cq = pf.run_job(3, [desc(hw.TACC_OP_LIST, payload=PAYLOAD["list"].pack(
        lst, 0, n, 0, 1, 0, *([0] * 16), 0))], step=10**8)
    list_wall = time.perf_counter() - t
    assert cq.status == 0
    return {"n": n, "direct_dev_ns_per_cmd": direct_dev / n,
            "list_dev_ns_per_cmd": (cq.end - cq.start) / n,
            "direct_host_us_per_cmd": direct_wall / n * 1e6,
            "list_host_us_per_cmd": list_wall / n * 1e6,
            "host_ratio": direct_wall / list_wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--n", type=int, default=256, help="NOPs per list / direct run")
    args = ap.parse_args()
    dev = Tacc("sriov-max-vfs=0")
    try:
        root = dev.map_default()
        pf = dev.pf
        pf.reset()
        pf.set_ptbr(0, root)
        rows = roofline(dev, pf)
        direct, device = blas_direct(), blas_device(pf)
        lst = lists(dev, pf, args.n)
    finally:
        dev.close()
    print(f"{'op':32} {'t us':>9} {'GFLOP/s':>9} {'GB/s':>7} {'bound':>8} {'of roofline':>11}")
    for r in rows:
        print(f"{r['op']:32} {r['t_ns'] / 1e3:9.1f} {r['gflops']:9.0f} {r['gbps']:7.1f} "
              f"{r['bound']:>8} {r['of_roofline']:11.3f}")
    print(f"host BLAS 1024^3 fp32: device GEMM {device:.1f} GFLOP/s, OpenBLAS direct "
          f"{direct:.1f} GFLOP/s, ratio {device / direct:.2f} (goal >= 0.5)")
    print(f"{lst['n']} NOPs: direct {lst['direct_dev_ns_per_cmd']:.0f} ns/cmd device, "
          f"{lst['direct_host_us_per_cmd']:.0f} us/cmd host; list "
          f"{lst['list_dev_ns_per_cmd']:.0f} ns/cmd device, {lst['list_host_us_per_cmd']:.1f} "
          f"us/cmd host; host ratio {lst['host_ratio']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps({"version": 1, "roofline": rows,
                                         "blas": {"device_gflops": device,
                                                  "direct_gflops": direct,
                                                  "ratio": device / direct},
                                         "lists": lst}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
