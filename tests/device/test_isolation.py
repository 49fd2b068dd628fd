"""Isolation and lifetimes, device model: a guest's
register writes never crash or wedge QEMU, the device's own DMA and MSI-X never
reach its registers, QEMU's SR-IOV code keeps VF Enable and NumVFs consistent,
and the device does what docs/hardware.md says.

Tests that could kill QEMU run on their own instance (``fresh``), so a crash
fails that test only.
"""

from __future__ import annotations

import re
import resource
import struct
import time
from pathlib import Path

import pytest
from tacc import hw
from tacc.hw.records import PAYLOAD, d_copy, d_elt, desc
from tacc.testing.taccdev import DEVMEM_VA, Tacc

Q0 = 0x1000
SRIOV_CTRL, SRIOV_NUM_VF, SRIOV_TOTAL_VF = 0x08, 0x10, 0x0E


@pytest.fixture
def fresh():
    d = Tacc("sriov-max-vfs=4")
    d.root0 = d.map_default(0x2000_0000, 256 << 20)
    d.pf.reset()
    d.pf.set_ptbr(0, d.root0)
    yield d
    d.close()


def msix_to(dev, f, devfn, vector, addr, data):
    """Point MSI-X vector `vector` of function f at `addr` (data `data`), enable MSI-X."""
    qt = dev.qt
    cap = qt.find_cap(0, devfn, 0x11)
    qt.writeq(f.bar4 + 16 * vector, addr)
    qt.writel(f.bar4 + 16 * vector + 8, data)
    qt.writel(f.bar4 + 16 * vector + 12, 0)
    qt.cfg_write(0, devfn, cap + 2, 0x8000, 2)
    return cap


def assert_alive(dev):
    assert dev.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


# ----------------------------------------------------------- item 11 ----
@pytest.mark.parametrize("zero", ["cq", "sq"])
def test_zero_ring_size_enable_reset_doorbell(fresh, zero):
    """Q_*_SIZE = 0, ENABLE (refused), ENABLE|RESET, a NOP with F_LAST and a
    doorbell: QEMU stays alive and the queue reports ERROR with ENABLE clear."""
    pf = fresh.pf
    pf.w32(Q0 + hw.TACC_Q_CTRL, 0)
    pf.w64(Q0 + hw.TACC_Q_SQ_BASE, pf.sq_addr(0))
    pf.w32(Q0 + hw.TACC_Q_SQ_SIZE, 0 if zero == "sq" else 16)
    pf.w64(Q0 + hw.TACC_Q_CQ_BASE, pf.cq_addr(0))
    pf.w32(Q0 + hw.TACC_Q_CQ_SIZE, 0 if zero == "cq" else 16)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    pf.w32(Q0 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    pf.w32(Q0 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE | hw.TACC_Q_CTRL_RESET)
    fresh.qt.memwrite(pf.sq_addr(0), desc(hw.TACC_OP_NOP, flags=hw.TACC_DESC_F_LAST, job=1))
    pf.w32(Q0 + hw.TACC_Q_SQ_TAIL, 1)
    fresh.qt.clock_step(10**6)
    assert_alive(fresh)
    assert pf.qstatus(0) & hw.TACC_Q_STATUS_ERROR
    assert not pf.r32(Q0 + hw.TACC_Q_CTRL) & hw.TACC_Q_CTRL_ENABLE
    assert pf.r32(Q0 + hw.TACC_Q_CQ_TAIL) == 0 and pf.r32(Q0 + hw.TACC_Q_SQ_HEAD) == 0
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_QUEUE_ERROR
    # a good configuration afterwards works again
    pf.setup_queue(0, sq_size=16, cq_size=16)
    assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == hw.TACC_ST_OK


def test_refused_enable_then_ring_registers_writable(fresh):
    """A refused enable leaves ENABLE clear, so the ring can be fixed and enabled."""
    pf = fresh.pf
    pf.w32(Q0 + hw.TACC_Q_CTRL, 0)
    pf.w32(Q0 + hw.TACC_Q_CQ_SIZE, 3)
    pf.w32(Q0 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    assert pf.qstatus(0) & hw.TACC_Q_STATUS_ERROR
    pf.w32(Q0 + hw.TACC_Q_CQ_SIZE, 16)
    assert pf.r32(Q0 + hw.TACC_Q_CQ_SIZE) == 16
    pf.w32(Q0 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    assert not pf.qstatus(0) & hw.TACC_Q_STATUS_ERROR


# ----------------------------------------------------------- item 12 ----
def test_msix_into_own_bar0_is_refused(fresh):
    """Queue 0's MSI-X vector aimed at its own Q_CTRL with data 0 (disable =
    abort): the completion's MSI-X must not reset the queue under it."""
    pf, qt = fresh.pf, fresh.qt
    pf.setup_queue(0, irq=True)
    msix_to(fresh, pf, 0x08, 0, pf.bar0 + Q0 + hw.TACC_Q_CTRL, 0)
    j1, d1 = pf.job_of(0, [desc(hw.TACC_OP_NOP)])
    j2, d2 = pf.job_of(0, [desc(hw.TACC_OP_NOP)])
    pf.submit(0, d1 + d2)
    qt.clock_step(10**6)
    assert_alive(fresh)
    assert pf.r32(Q0 + hw.TACC_Q_CTRL) == hw.TACC_Q_CTRL_ENABLE | hw.TACC_Q_CTRL_IRQ
    assert [c.job for c in pf.cqes(0)] == [j1, j2]
    assert pf.qstatus(0) & hw.TACC_Q_STATUS_IDLE and not pf.qstatus(0) & hw.TACC_Q_STATUS_ERROR


def test_msix_into_own_ctrl_reset_during_fault(fresh):
    """The error vector aimed at CTRL with RESET: an MMU fault raised while a
    command is dispatched from the scheduler's timer (after a NOP) must not
    reset the function under it."""
    pf = fresh.pf
    msix_to(fresh, pf, 0x08, hw.TACC_MSIX_ERROR, pf.bar0 + hw.TACC_REG_CTRL,
            hw.TACC_CTRL_RESET)
    pf.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT)
    cq = pf.run_job(0, [desc(hw.TACC_OP_NOP),
                        d_copy(hw.TACC_OP_COPY_H2D, 0x7F_0000_0000, DEVMEM_VA, 64)])
    assert cq.status == hw.TACC_ST_MMU_FAULT
    assert_alive(fresh)
    assert pf.r32(hw.TACC_REG_CTRL) == hw.TACC_CTRL_ENABLE
    assert pf.r32(hw.TACC_REG_IRQ_MASK) == hw.TACC_IRQ_MMU_FAULT
    assert pf.r32(hw.TACC_REG_FAULT_INFO) & hw.TACC_FAULT_VALID


def test_trace_wb_into_own_ptbr_is_refused(fresh):
    """TRACE_WB aimed at CTX_PTBR(0): each record's write-back must not replace
    context 0's page-table root."""
    pf = fresh.pf
    root = fresh.root0 | hw.TACC_PTBR_VALID
    assert pf.r64(hw.TACC_REG_CTX_PTBR(0)) == root
    pf.trace_enable(size=64, wb=pf.bar0 + 0x100)
    src = fresh.alloc(4096)
    for _ in range(3):
        cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 4096)])
        assert cq.status == hw.TACC_ST_OK
    assert_alive(fresh)
    assert pf.r64(hw.TACC_REG_CTX_PTBR(0)) == root
    assert pf.r32(hw.TACC_REG_TRACE_PROD) == 3


def test_sample_wb_into_own_bar0_is_refused(fresh):
    """SAMPLE_WB aimed at CTX_PTBR(1) (written from the sample timer)."""
    pf = fresh.pf
    pf.set_ptbr(1, fresh.root0)
    pf.w64(hw.TACC_REG_SAMPLE_BASE, pf.sample_addr())
    pf.w32(hw.TACC_REG_SAMPLE_SIZE, 8)
    pf.w64(hw.TACC_REG_SAMPLE_WB, pf.bar0 + 0x108)
    pf.w32(hw.TACC_REG_SAMPLE_PERIOD, hw.TACC_SAMPLE_MIN_PERIOD_NS)
    fresh.qt.clock_step(3 * hw.TACC_SAMPLE_MIN_PERIOD_NS + 1)
    assert_alive(fresh)
    assert pf.r32(hw.TACC_REG_SAMPLE_PROD) == 3
    assert pf.r64(hw.TACC_REG_CTX_PTBR(1)) == fresh.root0 | hw.TACC_PTBR_VALID


def test_pf_msix_into_vf_bar0_is_refused(fresh):
    """Cross-function: the PF's queue vector aimed at VF1's Q0 CTRL (abort)."""
    pf = fresh.pf
    (vf1,) = fresh.enable_vfs(1)
    pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), 64 << 20)
    pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), 32 << 20)
    vf1.reset()
    pf.setup_queue(0, irq=True)
    msix_to(fresh, pf, 0x08, 0, vf1.bar0 + Q0 + hw.TACC_Q_CTRL, 0)
    pf.run_job(0, [desc(hw.TACC_OP_NOP)])
    assert_alive(fresh)
    assert vf1.r32(Q0 + hw.TACC_Q_CTRL) == hw.TACC_Q_CTRL_ENABLE


@pytest.mark.parametrize("reg", [hw.TACC_REG_TRACE_WB, hw.TACC_REG_SAMPLE_WB])
def test_misaligned_writeback_refused(fresh, reg):
    pf = fresh.pf
    good = fresh.alloc(4096)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    pf.w64(reg, good)
    pf.w64(reg, good + 4)
    assert pf.r64(reg) == good  # refused: keeps the old value
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_DMA_ERROR
    pf.w32(reg + 4, 0)  # HI half alone is fine
    pf.w32(reg, (good + 2) & 0xFFFFFFFF)
    assert pf.r64(reg) == good


# ----------------------------------------------------------- item 13 ----
def test_sriov_numvfs_above_total_then_vf_enable(fresh):
    """NumVFs = TotalVFs + 1, then VF Enable: VF Enable is masked, so no VF may
    be enabled (QEMU 10.0.2 walked vf[] past TotalVFs: CVE-2025-54567)."""
    qt = fresh.qt
    sr = qt.find_ext_cap(0, 0x08, 0x10)
    total = qt.cfg_read(0, 0x08, sr + SRIOV_TOTAL_VF, 2)
    assert total == 4
    qt.cfg_write(0, 0x08, sr + SRIOV_NUM_VF, total + 1, 2)
    qt.cfg_write(0, 0x08, sr + SRIOV_CTRL, 0x9, 2)  # VF Enable | VF MSE
    assert_alive(fresh)
    assert not qt.cfg_read(0, 0x08, sr + SRIOV_CTRL, 2) & 1
    for i in range(total):
        assert qt.cfg_read(0, 0x09 + i, 8) == 0xFFFFFFFF, i  # VF not enabled
    # a valid NumVFs still enables VFs
    qt.cfg_write(0, 0x08, sr + SRIOV_NUM_VF, 2, 2)
    qt.cfg_write(0, 0x08, sr + SRIOV_CTRL, 0x9, 2)
    assert qt.cfg_read(0, 0x08, sr + SRIOV_CTRL, 2) & 1
    assert qt.cfg_read(0, 0x09, 8) >> 8 == hw.TACC_PCI_CLASS
    assert qt.cfg_read(0, 0x0B, 8) == 0xFFFFFFFF


# ----------------------------------------------------------- item 15 ----
def test_unmask_fires_pending_cause(fresh):
    """A cause raised while masked pends and raises its vector on unmask."""
    pf, qt = fresh.pf, fresh.qt
    msg = fresh.alloc(4096)
    msix_to(fresh, pf, 0x08, hw.TACC_MSIX_ERROR, msg, 0xE4)
    pf.w32(hw.TACC_REG_IRQ_MASK, 0)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, 0x7F_0000_0000, DEVMEM_VA, 64)])
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_MMU_FAULT
    assert qt.readl(msg) == 0 and pf.cnt("irqs") == 0
    pf.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT)
    assert qt.readl(msg) == 0xE4 and pf.cnt("irqs") == 1
    # re-writing the same mask does not fire again; a cleared cause does not fire
    pf.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    pf.w32(hw.TACC_REG_IRQ_MASK, 0)
    pf.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT)
    assert pf.cnt("irqs") == 1


def test_clock_latch_per_register(dev, pf):
    """LO of DEVCLK, LO of HOSTCLK, HI of DEVCLK: each 64-bit register has its
    own latch, so interleaved reads do not tear."""
    dev.qt.clock_step(1000)
    want = dev.qt.clock()
    lo = pf.r32(hw.TACC_REG_DEVCLK)
    hlo = pf.r32(hw.TACC_REG_HOSTCLK)
    hi = pf.r32(hw.TACC_REG_DEVCLK + 4)
    hhi = pf.r32(hw.TACC_REG_HOSTCLK + 4)
    assert hi << 32 | lo == want
    host = hhi << 32 | hlo
    assert abs(host - pf.r64(hw.TACC_REG_HOSTCLK)) < 60 * 10**9


def test_barrier_waits_for_fetched_non_barriers(dev, pf):
    """Queue 2 runs a copy; queue 1 holds [BARRIER (waiting for queue 2), NOP]
    when queue 0's BARRIER is fetched: queue 0's barrier must also wait for
    queue 1's NOP (docs/hardware.md section 3), not start because queue 1's
    head is a barrier."""
    n = 1 << 20
    src = dev.alloc(n)
    j2, d2 = pf.job_of(2, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, n)])
    j1, d1 = pf.job_of(1, [desc(hw.TACC_OP_BARRIER), desc(hw.TACC_OP_NOP)])
    pf.submit(2, d2)
    pf.submit(1, d1)
    cq0 = pf.run_job(0, [desc(hw.TACC_OP_BARRIER)])
    (cq1,), (cq2,) = pf.cqes(1), pf.cqes(2)
    assert (cq1.job, cq2.job) == (j1, j2)
    assert cq0.status == cq1.status == cq2.status == hw.TACC_ST_OK
    assert cq1.start >= cq2.end
    assert cq0.start >= cq1.end


def test_barriers_in_two_queues_do_not_deadlock(dev, pf):
    """[BARRIER, NOP] in queue 0 and [BARRIER, NOP] in queue 1, fetched together:
    the older barrier goes first, both jobs complete."""
    j0, d0 = pf.job_of(0, [desc(hw.TACC_OP_BARRIER), desc(hw.TACC_OP_NOP)])
    j1, d1 = pf.job_of(1, [desc(hw.TACC_OP_BARRIER), desc(hw.TACC_OP_NOP)])
    pf.submit(0, d0)
    pf.submit(1, d1)
    dev.qt.clock_step(10**6)
    (c0,), (c1,) = pf.cqes(0), pf.cqes(1)
    assert (c0.job, c1.job) == (j0, j1) and c0.status == c1.status == hw.TACC_ST_OK
    assert c1.start >= c0.start + 100  # queue 1's barrier waited for queue 0's first


def test_pf_ctrl_reset_keeps_sriov_flr_disables(fresh):
    """docs/hardware.md section 8: CTRL.RESET of the PF clears the VF windows but
    leaves SR-IOV enabled; an FLR of the PF disables SR-IOV."""
    pf, qt = fresh.pf, fresh.qt
    sr = qt.find_ext_cap(0, 0x08, 0x10)
    vf1, _ = fresh.enable_vfs(2)
    pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), 64 << 20)
    pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), 32 << 20)
    assert vf1.r64(hw.TACC_REG_DEVMEM_SIZE) == 32 << 20
    pf.w32(hw.TACC_REG_CTRL, hw.TACC_CTRL_RESET)
    assert qt.cfg_read(0, 0x08, sr + SRIOV_CTRL, 2) & 1
    assert vf1.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
    assert vf1.r64(hw.TACC_REG_DEVMEM_SIZE) == 0 and pf.r64(hw.TACC_REG_VF_DEVMEM_BASE(0)) == 0
    exp = qt.find_cap(0, 0x08, 0x10)
    qt.cfg_write(0, 0x08, exp + 8, qt.cfg_read(0, 0x08, exp + 8, 2) | 0x8000, 2)
    assert not qt.cfg_read(0, 0x08, sr + SRIOV_CTRL, 2) & 1
    assert qt.cfg_read(0, 0x09, 8) == 0xFFFFFFFF
    assert struct.pack("<I", qt.cfg_read(0, 0x08, 0)) == struct.pack(
        "<HH", hw.TACC_PCI_VENDOR_ID, hw.TACC_PCI_DEVICE_ID_PF)


# ----------------------------------------------------------- item 14 ----
def test_gemm_host_allocation_failure_fails_cleanly():
    """A batched GEMM whose operands gather into 4 GiB of host buffers (valid:
    64 batches of a 4096 x 4096 A fit a 4 GiB device memory; 2^30 multiply-adds) in
    a QEMU whose address space is capped: the allocation fails and the command
    ends with BAD_LENGTH, QEMU stays up (g_malloc aborted it before).  The host
    buffers hold the elements only (padding between rows is not gathered)."""
    d = Tacc("devmem-size=4G")
    try:
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, d.map_default(devmem=256 << 20))
        pid = d.qt.proc.pid
        vm = int(re.search(r"VmSize:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1])
        limit = vm * 1024 + (3 << 29)  # 1.5 GiB more than QEMU has mapped
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        m, n, k, batch = 4096, 1, 4096, 64
        gemm = desc(hw.TACC_OP_GEMM, payload=PAYLOAD["gemm"].pack(
            DEVMEM_VA, DEVMEM_VA, DEVMEM_VA, m, n, k, k, n, n, 0x3F800000, 0, 0, 0, 0, 0,
            batch, 0, m * k, 0, m * n, 0))
        cq = pf.run_job(0, [gemm])
        assert cq.status == hw.TACC_ST_BAD_LENGTH
        assert_alive(d)
        assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == hw.TACC_ST_OK
    finally:
        d.close()


@pytest.mark.parametrize("what", ["copy", "eltwise"])
def test_huge_command_does_not_block_the_main_loop(what):
    """A 1 GiB COPY_D2D (or a 2^26-element eltwise) is moved in slices, one
    per main-loop turn: while it runs, QEMU answers a register read (ID) in a
    tenth of the command's host time; its modelled times are those of the unsliced
    model."""
    d = Tacc("devmem-size=2G")
    try:
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, d.map_default(devmem=2 << 30))
        if what == "copy":
            n = 1 << 30
            cmd = d_copy(hw.TACC_OP_COPY_D2D, DEVMEM_VA, DEVMEM_VA + n, n)
            model_ps = 100_000 + tacc_devmem_ps(d, 2 * n)  # T_cmd + 2L / BW_devmem
        else:
            n = hw.TACC_ELT_MAX_N
            cmd = d_elt(hw.TACC_ELT_ADD, DEVMEM_VA, DEVMEM_VA + 4 * n, DEVMEM_VA + 8 * n, n)
            # flops n at compute-gflops per engine, or the bytes (the roofline)
            model_ps = 100_000 + max(n * 1000 // d.qom_get("compute-gflops"),
                                     tacc_devmem_ps(d, 12 * n))
        _, ds = pf.job_of(0, [cmd])
        t0 = time.monotonic()
        pf.submit(0, ds)  # the doorbell returns before the work is done
        t_db = time.monotonic() - t0
        t1 = time.monotonic()
        assert_alive(d)
        t_id = time.monotonic() - t1
        d.qt.clock_step(10**9)
        (cq,) = pf.cqes(0)  # a state register: waits for the rest of the work
        t_all = time.monotonic() - t0
        assert cq.status == hw.TACC_ST_OK
        model_ps += 500_000 * pf.cnt("tlb_walk_reads")  # W: walk-latency-ns per PTE read
        assert (cq.end - cq.start) * 1000 == pytest.approx(model_ps, abs=2000)
        # against the work's own wall time, not a clock bound (a loaded host stretches all
        # three alike): unsliced, the doorbell or the ID read waited for the whole command
        assert max(t_db, t_id) < t_all / 10, (t_db, t_id, t_all)
    finally:
        d.close()


def tacc_devmem_ps(d: Tacc, nbytes: int) -> int:
    return nbytes * 1000 // d.qom_get("devmem-gbps")  # ps per byte = 1000 / GB/s
