"""Every opcode's effect, checked against an independent computation (numpy)."""

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_elt, d_fence, d_gemm, d_ts, desc
from tacc.model import link as linkmodel
from tacc.model.link import payload_tlps
from tacc.testing.taccdev import DEVMEM_VA

OK = hw.TACC_ST_OK
RNG = np.random.default_rng(1234)


def put(dev, data: bytes) -> int:
    a = dev.alloc(len(data))
    dev.qt.memwrite(a, data)
    return a


def h2d(pf, src, dev_off, n, q=0):
    return pf.run_job(q, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + dev_off, n)])


def d2h(pf, dev_off, dst, n, q=0):
    return pf.run_job(q, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + dev_off, dst, n)])


@pytest.mark.parametrize("n", [1, 7, 4096, 4097, 70000, 3 << 20])
def test_copy_roundtrip(dev, pf, n):
    data = RNG.integers(0, 256, n, dtype=np.uint8).tobytes()
    src = put(dev, data)
    dst = dev.alloc(n)
    dev.qt.memset(dst, n, 0xAA)
    off = 0x123000 + (n % 64)
    c0 = pf.counters()
    assert h2d(pf, src, off, n).status == OK
    # D2D inside device memory, then back to the host
    assert pf.run_job(1, [d_copy(hw.TACC_OP_COPY_D2D, DEVMEM_VA + off,
                                 DEVMEM_VA + off + (8 << 20), n)]).status == OK
    assert d2h(pf, off + (8 << 20), dst, n).status == OK
    assert dev.qt.memread(dst, n) == data
    c = pf.counters()
    d = {k: c[k] - c0[k] for k in c}
    # host buffers page-aligned, device side at offset n % 64 (docs/hardware.md
    # section 9): memory writes are cut at MPS boundaries of both addresses, completions
    # at the root port's RCB of the host address, read requests at MRRS
    wr = payload_tlps(n, 256, host_off=0, dev_off=off)
    cpl, req = -(-n // 64), -(-n // 512)
    assert d["h2d_bytes"] == n and d["d2h_bytes"] == n
    assert d["h2d_tlps"] == cpl and d["d2h_tlps"] == wr and d["d2h_req_tlps"] == req
    ack = linkmodel.LINK_DLLP_BYTES

    def q4(x):
        return -(-x // 4)
    assert d["h2d_link_bytes"] == n + 20 * cpl + ack * (2 * q4(req) + 2 * q4(wr))
    assert d["d2h_link_bytes"] == n + 24 * wr + 24 * req + ack * q4(cpl)
    assert d["devmem_write_bytes"] == 2 * n and d["devmem_read_bytes"] == 2 * n
    assert d["cmds_dma_h2d"] == 2 and d["cmds_dma_d2h"] == 1
    assert d["cmds_completed"] == 3 and d["jobs_completed"] == 3


def f32(dev, arr) -> int:
    return put(dev, np.ascontiguousarray(arr, dtype=np.float32).tobytes())


def load(dev, pf, arr, off):
    """Host array -> device memory at off (returns the device VA)."""
    a = f32(dev, arr)
    assert h2d(pf, a, off, arr.nbytes).status == OK
    return DEVMEM_VA + off


def fetch(dev, pf, va, nbytes):
    dst = dev.alloc(nbytes)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, va, dst, nbytes)]).status == OK
    return dev.qt.memread(dst, nbytes)


@pytest.mark.parametrize("m,n,k,pad,alpha,beta", [
    (1, 1, 1, 0, 1.0, 0.0),
    (16, 16, 16, 0, 1.0, 0.0),
    (33, 17, 65, 3, 0.5, 0.0),
    (64, 48, 40, 5, 1.5, -2.0),
    (128, 128, 128, 0, 1.0, 1.0),
    (256, 128, 96, 1, 1.0, 0.0),  # >= 2^21 MACs: computed on a worker thread
])
def test_gemm(dev, pf, m, n, k, pad, alpha, beta):
    A = RNG.standard_normal((m, k + pad), dtype=np.float32)
    B = RNG.standard_normal((k, n + pad), dtype=np.float32)
    C = RNG.standard_normal((m, n + pad), dtype=np.float32)
    va = load(dev, pf, A, 0)
    vb = load(dev, pf, B, 4 << 20)
    vc = load(dev, pf, C, 8 << 20)
    c0 = pf.counters()
    cq = pf.run_job(2, [d_gemm(va, vb, vc, m, n, k, k + pad, n + pad, n + pad, alpha, beta)])
    assert cq.status == OK
    c1 = pf.counters()
    got = np.frombuffer(fetch(dev, pf, vc, C.nbytes), np.float32).reshape(C.shape)
    want = C.copy()
    want[:, :n] = alpha * (A[:, :k].astype(np.float64) @ B[:, :n]) + beta * C[:, :n]
    np.testing.assert_allclose(got[:, :n], want[:, :n], rtol=1e-4, atol=1e-4 * k)
    assert np.array_equal(got[:, n:], C[:, n:])  # padding untouched
    assert c1["flops"] - c0["flops"] == 2 * m * n * k
    # the elements only: padding between rows is not moved (docs/hardware.md section 14)
    rd = (m * k + k * n) * 4
    if beta != 0:
        rd += m * n * 4
    assert c1["devmem_read_bytes"] - c0["devmem_read_bytes"] == rd
    assert c1["devmem_write_bytes"] - c0["devmem_write_bytes"] == m * n * 4
    walks = c1["tlb_walk_reads"] - c0["tlb_walk_reads"]
    busy = sum(c1[f"busy_compute{i}"] - c0[f"busy_compute{i}"] for i in range(4))
    cmds = sum(c1[f"cmds_compute{i}"] - c0[f"cmds_compute{i}"] for i in range(4))
    assert cmds == 1
    # roofline: max(flops / fp32 peak, bytes / bandwidth) + 100 ns command latency
    comp_ps = max(2 * m * n * k * 1000 // dev.qom_get("compute-gflops"),
                  (rd + m * n * 4) * 1000 // dev.qom_get("devmem-gbps"))
    assert busy == (100_000 + 500_000 * walks + comp_ps) // 1000
    assert cq.end - cq.start == busy


@pytest.mark.parametrize("op", ["ADD", "MUL", "RELU", "SCALE"])
def test_eltwise(dev, pf, op):
    n = 5000
    a = RNG.standard_normal(n, dtype=np.float32)
    b = RNG.standard_normal(n, dtype=np.float32)
    va, vb = load(dev, pf, a, 0), load(dev, pf, b, 1 << 20)
    vc = DEVMEM_VA + (2 << 20)
    cq = pf.run_job(3, [d_elt(getattr(hw, f"TACC_ELT_{op}"), va, vb, vc, n, scalar=-0.75)])
    assert cq.status == OK
    got = np.frombuffer(fetch(dev, pf, vc, 4 * n), np.float32)
    want = {"ADD": a + b, "MUL": a * b, "RELU": np.maximum(a, 0), "SCALE": a * np.float32(-0.75)}
    np.testing.assert_array_equal(got, want[op])


def test_fence_timestamp_nop_barrier(dev, pf):
    buf = dev.alloc(4096)
    assert pf.run_job(0, [d_fence(buf, 0)]).status == OK  # warm the TLB
    dev.qt.memset(buf, 64, 0)
    t0 = dev.qt.clock()
    job, ds = pf.job_of(0, [desc(hw.TACC_OP_NOP), d_fence(buf, 0x1122334455667788),
                            d_ts(buf + 8), desc(hw.TACC_OP_BARRIER)], tag=0xABCDEF)
    pf.submit(0, ds)
    # nothing is visible before the modelled completion time
    dev.qt.clock_step(150)
    assert dev.qt.memread(buf, 16) == bytes(16)
    dev.qt.clock_step(10**6)
    cq = pf.cqes(0)
    assert len(cq) == 1 and cq[0].status == OK and cq[0].job == job and cq[0].tag == 0xABCDEF
    fence, ts = np.frombuffer(dev.qt.memread(buf, 16), np.uint64)
    assert fence == 0x1122334455667788
    # NOP 100; fence 100 + link(32 B) + 200; timestamp = its own end; barrier 100
    link32 = -(-32 * 8 * 130 * 1000 // (16 * 16 * 128))
    fence_end = t0 * 1000 + 100_000 + 100_000 + link32 + 200_000
    ts_end = fence_end + 100_000 + link32 + 200_000
    assert ts == ts_end // 1000
    assert cq[0].start == t0 and cq[0].end == (ts_end + 100_000) // 1000


def test_barrier_waits_for_other_queues(dev, pf):
    n = 1 << 20
    src = dev.alloc(n)
    pf.submit(1, [pf.job_of(1, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)])[1][0]])
    cq = pf.run_job(0, [desc(hw.TACC_OP_BARRIER)])
    other = pf.cqes(1)[0]
    assert cq.status == OK and cq.start == other.end  # the barrier waited for queue 1


def test_gemm_result_lands_at_completion(dev, pf):
    """A big GEMM's C appears at its modelled end, not at dispatch: a copy of C
    that finishes before the GEMM still sees the old contents."""
    m = n = k = 256
    A = RNG.standard_normal((m, k), dtype=np.float32)
    B = RNG.standard_normal((k, n), dtype=np.float32)
    C = np.full((m, n), 7.0, np.float32)
    va, vb, vc = load(dev, pf, A, 0), load(dev, pf, B, 1 << 20), load(dev, pf, C, 2 << 20)
    out = dev.alloc(C.nbytes)
    jg, dg = pf.job_of(2, [d_gemm(va, vb, vc, m, n, k, k, n, n)])
    jc, dc = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_D2H, vc, out, 4096)])
    pf.submit(2, dg)
    pf.submit(0, dc)
    dev.qt.clock_step(10**8)
    cg, cc = pf.cqes(2)[0], pf.cqes(0)[0]
    assert cc.end < cg.end
    assert np.all(np.frombuffer(dev.qt.memread(out, 4096), np.float32) == 7.0)
    got = np.frombuffer(fetch(dev, pf, vc, C.nbytes), np.float32).reshape(m, n)
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
