"""Device MMU: TLB hits/misses/walks, faults (unmapped, permission, ...)."""

import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_fence, desc
from tacc.testing.taccdev import DEVMEM_VA

VA = 0x10_0000_0000  # a 4 KiB-page region of context 1


@pytest.fixture
def ctx1(dev, pf):
    root = dev.pt.new_root()
    host = dev.alloc(64 << 10)
    dev.pt.map(root, VA, host, 32 << 10)  # 8 host pages, writable
    dev.pt.map(root, VA + (32 << 10), host + (32 << 10), 4 << 10, write=False)
    dev.pt.map(root, VA + (1 << 30), 0x10_0000, 64 << 10, devmem=True)  # 16 devmem pages
    dev.pt.flush()
    pf.set_ptbr(1, root)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    pf.w32(hw.TACC_REG_FAULT_CLEAR, 1)
    return host


def test_tlb_hits_misses_walks(dev, pf, ctx1):
    c0 = pf.counters()
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 32 << 10, ctx=1)])
    assert cq.status == 0
    c1 = pf.counters()
    # 8 source pages + 8 destination pages, each a 3-level walk
    assert c1["tlb_misses"] - c0["tlb_misses"] == 16
    assert c1["tlb_walk_reads"] - c0["tlb_walk_reads"] == 48
    assert c1["tlb_hits"] - c0["tlb_hits"] == 0
    cq2 = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 32 << 10, ctx=1)])
    c2 = pf.counters()
    assert c2["tlb_misses"] - c1["tlb_misses"] == 0 and c2["tlb_hits"] - c1["tlb_hits"] == 16
    # each walk read costs walk-latency-ns (500 ns)
    assert (cq.end - cq.start) - (cq2.end - cq2.start) == 48 * 500
    # invalidation drops the context's entries
    pf.w32(hw.TACC_REG_TLB_INV, 1)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 4096, ctx=1)])
    assert pf.cnt("tlb_misses") - c2["tlb_misses"] == 2


def test_small_tlb_thrashes():
    from tacc.testing.taccdev import Tacc
    d = Tacc("tlb-entries=4,sriov-max-vfs=0")
    try:
        root = d.pt.new_root()
        host = d.alloc(64 << 10)
        d.pt.map(root, VA, host, 64 << 10)
        d.pt.map(root, VA + (1 << 30), 0, 64 << 10, devmem=True)
        d.pt.flush()
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, root)
        assert pf.r32(hw.TACC_REG_TLB_ENTRIES) == 4
        for _ in range(2):
            pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 64 << 10)])
        assert pf.cnt("tlb_misses") == 64 and pf.cnt("tlb_hits") == 0  # LRU, 4 entries
    finally:
        d.close()


def fault_case(pf, cmd, want_status, want_type, want_va, write):
    c0 = pf.counters()
    job, ds = pf.job_of(0, [cmd, desc(hw.TACC_OP_NOP)], tag=0x5EED)
    pf.submit(0, ds)
    pf.dev.qt.clock_step(10**8)
    cq = pf.cqes(0)
    assert len(cq) == 1 and cq[0].status == want_status and cq[0].job == job
    assert cq[0].tag == 0x5EED
    info = pf.r32(hw.TACC_REG_FAULT_INFO)
    assert info & hw.TACC_FAULT_VALID
    assert (info & hw.TACC_FAULT_TYPE_MASK) >> hw.TACC_FAULT_TYPE_SHIFT == want_type
    assert info & hw.TACC_FAULT_CTX_MASK == 1
    assert bool(info & hw.TACC_FAULT_WRITE) == write
    assert pf.r64(hw.TACC_REG_FAULT_ADDR) == want_va
    assert pf.r64(hw.TACC_REG_FAULT_TAG) == 0x5EED
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_MMU_FAULT
    c1 = pf.counters()
    assert c1["mmu_faults"] - c0["mmu_faults"] == 1
    assert c1["cmds_completed"] - c0["cmds_completed"] == 1  # the NOP was skipped
    pf.w32(hw.TACC_REG_FAULT_CLEAR, 1)
    pf.w32(hw.TACC_REG_IRQ_STATUS, hw.TACC_IRQ_MMU_FAULT)
    assert pf.r32(hw.TACC_REG_FAULT_INFO) == 0


def test_fault_unmapped(pf, ctx1):
    fault_case(pf, d_copy(hw.TACC_OP_COPY_H2D, VA + (40 << 10), VA + (1 << 30), 64, ctx=1),
               hw.TACC_ST_MMU_FAULT, hw.TACC_FAULT_UNMAPPED, VA + (40 << 10), False)


def test_fault_unmapped_mid_copy(pf, ctx1):
    # 36 KiB mapped (32 rw + 4 ro): the read faults at the first unmapped page
    fault_case(pf, d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 40 << 10, ctx=1),
               hw.TACC_ST_MMU_FAULT, hw.TACC_FAULT_UNMAPPED, VA + (36 << 10), False)


def test_fault_permission(pf, ctx1):
    fault_case(pf, d_fence(VA + (32 << 10), 1, ctx=1), hw.TACC_ST_MMU_FAULT,
               hw.TACC_FAULT_PERMISSION, VA + (32 << 10), True)


def test_fault_mem_kind(pf, ctx1):
    fault_case(pf, d_copy(hw.TACC_OP_COPY_H2D, VA + (1 << 30), VA, 64, ctx=1),
               hw.TACC_ST_MMU_FAULT, hw.TACC_FAULT_MEM_KIND, VA + (1 << 30), False)


def test_fault_bad_ctx(pf, ctx1):
    c = bytearray(d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 64, ctx=1))
    c[2] = 5  # context 5 has no PTBR
    job, ds = pf.job_of(0, [bytes(c)])
    pf.submit(0, ds)
    pf.dev.qt.clock_step(10**8)
    cq = pf.cqes(0)
    assert cq[0].status == hw.TACC_ST_BAD_CTX
    info = pf.r32(hw.TACC_REG_FAULT_INFO)
    assert (info & hw.TACC_FAULT_TYPE_MASK) >> 24 == hw.TACC_FAULT_BAD_CTX and info & 0xFFFF == 5


def test_fault_devmem_range(dev, pf, ctx1):
    root = dev.pt.new_root()
    dev.pt.map(root, 0, 0, 2 << 20, huge=True)
    dev.pt.map(root, DEVMEM_VA, 256 << 20, 2 << 20, devmem=True, huge=True)  # beyond 256 MiB
    dev.pt.flush()
    pf.set_ptbr(1, root)
    fault_case(pf, d_copy(hw.TACC_OP_COPY_H2D, 0x10_0000, DEVMEM_VA, 64, ctx=1),
               hw.TACC_ST_MMU_FAULT, hw.TACC_FAULT_DEVMEM_RANGE, DEVMEM_VA, True)


def test_fault_walk_dma(dev, pf, ctx1):
    pf.set_ptbr(1, 0xF0000000)  # not RAM: the table read fails
    fault_case(pf, d_copy(hw.TACC_OP_COPY_H2D, VA, VA + (1 << 30), 64, ctx=1),
               hw.TACC_ST_MMU_FAULT, hw.TACC_FAULT_WALK_DMA, VA, False)


def test_first_fault_is_kept(pf, ctx1):
    for off in (40 << 10, 44 << 10):
        pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, VA + off, VA + (1 << 30), 64, ctx=1)])
    assert pf.r64(hw.TACC_REG_FAULT_ADDR) == VA + (40 << 10)
    assert pf.cnt("mmu_faults") == 2


def test_gemm_write_back_walks_are_neither_timed_nor_counted():
    """A GEMM translates A, B and every row of C at dispatch (timed: walk-latency-ns per
    PTE read) and writes C back at completion.  With a TLB too small to keep C's pages,
    the write-back walks again; those walks are not timed, so they must not be counted
    either: the command's tlb_misses/tlb_walk_reads are what its time paid for."""
    from tacc.hw.records import d_gemm
    from tacc.testing.taccdev import Tacc
    d = Tacc("tlb-entries=4,sriov-max-vfs=0")
    try:
        root = d.pt.new_root()
        d.pt.map(root, VA + (1 << 30), 0, 64 << 10, devmem=True)  # 4 KiB device pages
        d.pt.flush()
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, root)
        # A 128x32 (4 pages), B 32x64 (2 pages), C 128x64 (8 pages: more than the TLB)
        m, n, k = 128, 64, 32
        base = VA + (1 << 30)
        va, vb, vc = base, base + (16 << 10), base + (32 << 10)
        c0 = pf.counters()
        cq = pf.run_job(2, [d_gemm(va, vb, vc, m, n, k, k, n, n, 1.0, 0.0)])
        assert cq.status == 0
        c1 = pf.counters()
        # 4 pages of A + 2 of B + 8 of C (its rows probed in page order), 3 reads each;
        # the write-back misses all 8 of C again (LRU of 4) and counts none of them
        assert c1["tlb_misses"] - c0["tlb_misses"] == 14
        assert c1["tlb_walk_reads"] - c0["tlb_walk_reads"] == 42
        busy = sum(c1[f"busy_compute{i}"] - c0[f"busy_compute{i}"] for i in range(4))
        comp_ps = max(2 * m * n * k * 1000 // d.qom_get("compute-gflops"),
                      (m * k + k * n + m * n) * 4 * 1000 // d.qom_get("devmem-gbps"))
        assert busy == cq.end - cq.start == (100_000 + 500_000 * 42 + comp_ps) // 1000
    finally:
        d.close()
