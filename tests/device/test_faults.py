"""Fault injection (qom-set), ground truth (qom-get), errors, PM, FLR, MSI-X."""

import struct

import pytest
from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.taccdev import DEVMEM_VA, Tacc


def test_ground_truth_matches_counters(dev, pf):
    gt0 = {k: dev.qom_get(k) for k in ("x-gt-h2d-bytes", "x-gt-d2h-bytes", "x-gt-h2d-link-bytes",
                                       "x-gt-d2h-link-bytes", "x-gt-busy-ns-dma-h2d", "x-gt-cmds")}
    n = 300000
    a = dev.alloc(n)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, n),
                   d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, a, n)])
    c = pf.counters()
    gt = {k: dev.qom_get(k) - v for k, v in gt0.items()}
    assert gt["x-gt-h2d-bytes"] == c["h2d_bytes"] == n
    assert gt["x-gt-d2h-bytes"] == c["d2h_bytes"] == n
    assert gt["x-gt-h2d-link-bytes"] == c["h2d_link_bytes"]
    assert gt["x-gt-d2h-link-bytes"] == c["d2h_link_bytes"]
    assert abs(gt["x-gt-busy-ns-dma-h2d"] - c["busy_dma_h2d"]) <= 1
    assert gt["x-gt-cmds"] == 2
    assert dev.qom_get("x-gt-link-busy-ns-h2d") == pf.gcnt("link_h2d_busy_ticks")


def test_fail_next_dma(dev, pf):
    a = dev.alloc(4096)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    dev.qom_set("x-fi-fail-next-dma", True)
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, 4096)])
    assert cq.status == hw.TACC_ST_DMA_ERROR
    assert pf.cnt("dma_errors") == 1 and pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_DMA_ERROR
    assert dev.qom_get("x-fi-fail-next-dma") is False
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, 4096)]).status == 0


def test_dma_to_unbacked_address(dev, pf):
    # guest RAM is 512 MiB; 0x3000_0000 is not backed: the DMA is refused
    root = dev.pt.new_root()
    dev.pt.map(root, 0, 0x3000_0000, 2 << 20, huge=True)
    dev.pt.map(root, DEVMEM_VA, 0, 2 << 20, devmem=True, huge=True)
    dev.pt.flush()
    pf.set_ptbr(2, root)
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, 0, DEVMEM_VA, 64, ctx=2)])
    assert cq.status == hw.TACC_ST_DMA_ERROR and pf.cnt("dma_errors") == 1


def test_corrupt_next_cqe(dev, pf):
    dev.qom_set("x-fi-corrupt-next-cqe", True)
    job, ds = pf.job_of(0, [desc(hw.TACC_OP_NOP)])
    pf.submit(0, ds)
    dev.qt.clock_step(10**6)
    cq = pf.cqes(0)[0]
    assert cq.status == hw.TACC_ST_CORRUPT and cq.job == job ^ 0xFFFFFFFF
    assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == 0


def test_hang_engine(dev, pf):
    a = dev.alloc(4096)
    dev.qom_set("x-fi-hang-engine", hw.TACC_ENGINE_DMA_H2D)
    job, ds = pf.job_of(1, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, 4096)])
    pf.submit(1, ds)
    dev.qt.clock_step(10**8)
    assert pf.cqes(1) == []
    assert pf.qstatus(1) & hw.TACC_Q_STATUS_HUNG
    assert not pf.r32(hw.TACC_REG_STATUS) & hw.TACC_STATUS_IDLE
    # other engines keep working
    assert pf.run_job(0, [desc(hw.TACC_OP_NOP)]).status == 0
    t = dev.qt.clock()
    dev.qom_set("x-fi-hang-engine", -1)
    dev.qt.clock_step(10**6)
    cq = pf.cqes(1)
    assert cq and cq[0].status == 0 and cq[0].end >= t
    assert not pf.qstatus(1) & hw.TACC_Q_STATUS_HUNG


def test_hang_then_queue_reset(dev, pf):
    a = dev.alloc(4096)
    pf.trace_enable(size=16)
    dev.qom_set("x-fi-hang-engine", hw.TACC_ENGINE_DMA_H2D)
    _, ds = pf.job_of(1, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, 4096)])
    pf.submit(1, ds)
    dev.qt.clock_step(10**6)
    pf.w32(0x1100 + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_RESET)
    dev.qom_set("x-fi-hang-engine", -1)
    assert pf.qstatus(1) & hw.TACC_Q_STATUS_IDLE
    rec = pf.trace_read(0, 1, 16)[0]
    assert rec.status == hw.TACC_ST_ABORTED
    # the engine is free again for others
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, 4096)]).status == 0


def test_fatal(dev, pf):
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    dev.qom_set("x-fi-fatal", True)
    assert pf.r32(hw.TACC_REG_STATUS) & hw.TACC_STATUS_FATAL
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_FATAL
    assert pf.r32(0x1000 + hw.TACC_Q_CTRL) == 0  # queues stopped
    aer = dev.qt.find_ext_cap(0, 0x08, 0x01)
    assert aer and dev.qt.cfg_read(0, 0x08, aer + 4) & (1 << 22)  # AER: internal error
    dev.qom_set("x-fi-fatal", False)
    pf.reset()
    assert not pf.r32(hw.TACC_REG_STATUS) & hw.TACC_STATUS_FATAL


def test_fatal_error_keeps_link_capabilities():
    """An uncorrectable error sets Device Status and leaves Link Capabilities alone.
    QEMU 10.0's pcie_aer_inject_uncor_error wrote DEVSTA (16 bits at +0x0A) with
    pci_set_long, zeroing LNKCAP[15:0] (+0x0C): after a fatal error the guest read
    "Speed unknown, Width x0, ASPM not supported" (qemu/patches/0005).  A QEMU of its
    own: the session's device has had fatal errors already."""
    d = Tacc()
    try:
        qt, devfn = d.qt, d.pf.devfn
        cap = qt.find_cap(0, devfn, 0x10)
        lnkcap = qt.cfg_read(0, devfn, cap + 0x0C)
        assert (lnkcap >> 4 & 0x3F, lnkcap & 0xF) == (16, 4), hex(lnkcap)  # x16, 16 GT/s
        d.qom_set("x-fi-fatal", True)
        assert qt.cfg_read(0, devfn, cap + 0x0A, 2) & 0x4  # DEVSTA Fatal Error Detected
        assert hex(qt.cfg_read(0, devfn, cap + 0x0C)) == hex(lnkcap)
    finally:
        d.close()


def msix_setup(dev, f, devfn):
    qt = dev.qt
    cap = qt.find_cap(0, devfn, 0x11)
    msg = dev.alloc(4096)
    for v in range(hw.TACC_MSIX_VECTORS):
        qt.writeq(f.bar4 + 16 * v, msg + 4 * v)
        qt.writel(f.bar4 + 16 * v + 8, 0x100 + v)
        qt.writel(f.bar4 + 16 * v + 12, 0)
    qt.cfg_write(0, devfn, cap + 2, 0x8000, 2)
    return msg, cap


def test_msix_vectors(dev, pf):
    msg, cap = msix_setup(dev, pf, 0x08)
    try:
        pf.setup_queue(2, irq=True)
        # F_IRQ on a non-last command and the job's CQE each raise vector 2
        _, ds = pf.job_of(2, [desc(hw.TACC_OP_NOP, flags=hw.TACC_DESC_F_IRQ),
                              desc(hw.TACC_OP_NOP)])
        pf.submit(2, ds)
        dev.qt.clock_step(10**6)
        assert dev.qt.readl(msg + 8) == 0x102 and pf.cnt("irqs") == 2
        # error vector on an unmasked MMU fault
        pf.w32(hw.TACC_REG_IRQ_MASK, hw.TACC_IRQ_MMU_FAULT)
        pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, 0x7F_0000_0000, DEVMEM_VA, 64)])
        assert dev.qt.readl(msg + 4 * hw.TACC_MSIX_ERROR) == 0x100 + hw.TACC_MSIX_ERROR
        assert dev.qom_get("x-gt-irqs") >= 3
    finally:
        dev.qt.cfg_write(0, 0x08, cap + 2, 0, 2)


def test_d3hot_loses_queue_state(dev, pf):
    qt = dev.qt
    pm = qt.find_cap(0, 0x08, 0x01)
    pf.submit(0, pf.job_of(0, [desc(hw.TACC_OP_NOP)])[1])
    qt.cfg_write(0, 0x08, pm + 4, 3, 2)  # D3hot
    assert qt.cfg_read(0, 0x08, pm + 4, 2) & 3 == 3
    assert qt.readl(pf.bar0) in (0xFFFFFFFF, 0)  # BARs off in D3hot
    qt.cfg_write(0, 0x08, pm + 4, 0, 2)  # back to D0: function reset
    qt.cfg_write(0, 0x08, 0x04, 0x0006, 2)
    assert pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
    assert pf.r32(0x1000 + hw.TACC_Q_CTRL) == 0 and pf.r32(hw.TACC_REG_CTRL) == 0
    assert pf.r64(0x1000 + hw.TACC_Q_SQ_BASE) == 0


def test_flr(dev, pf):
    qt = dev.qt
    exp = qt.find_cap(0, 0x08, 0x10)
    pf.w32(hw.TACC_REG_SCRATCH, 1234)
    pf.run_job(0, [desc(hw.TACC_OP_NOP)])
    qt.cfg_write(0, 0x08, exp + 8, qt.cfg_read(0, 0x08, exp + 8, 2) | 0x8000, 2)
    # FLR resets config space too: re-map the BARs
    for bar, addr in ((0, pf.bar0), (2, pf.bar2), (4, pf.bar4)):
        qt.set_bar(0, 0x08, 0x10 + 4 * bar, addr, True)
    qt.cfg_write(0, 0x08, 0x04, 0x0006, 2)
    assert pf.r32(hw.TACC_REG_SCRATCH) == 0 and pf.cnt("cmds_completed") == 0


@pytest.mark.parametrize("bad", ["align", "size", "tail"])
def test_bad_ring_config(dev, pf, bad):
    b = 0x1000 + 3 * 0x100
    pf.w32(b + hw.TACC_Q_CTRL, 0)
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    pf.w64(b + hw.TACC_Q_SQ_BASE, pf.sq_addr(3) + (0x80 if bad == "align" else 0))
    pf.w32(b + hw.TACC_Q_SQ_SIZE, 100 if bad == "size" else 16)
    pf.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    if bad == "tail":
        pf.w32(b + hw.TACC_Q_SQ_TAIL, 16)
    assert pf.qstatus(3) & hw.TACC_Q_STATUS_ERROR
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_QUEUE_ERROR
    pf.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_RESET)
    assert not pf.qstatus(3) & hw.TACC_Q_STATUS_ERROR


def test_cq_full_stalls_until_head_moves(dev, pf):
    pf.setup_queue(1, cq_size=4)
    jobs = [pf.job_of(1, [desc(hw.TACC_OP_NOP)]) for _ in range(6)]
    pf.submit(1, [d for _, ds in jobs for d in ds])
    dev.qt.clock_step(10**6)
    assert pf.r32(0x1100 + hw.TACC_Q_CQ_TAIL) == 3  # 3 of 4 slots usable
    assert pf.r32(0x1100 + hw.TACC_Q_DEPTH) == 2
    got = pf.cqes(1)  # moves CQ_HEAD
    dev.qt.clock_step(10**6)
    got += pf.cqes(1)
    assert [c.job for c in got] == [j for j, _ in jobs]
    assert pf.cnt("queue1_depth_hwm") == 6
    pf.setup_queue(1, cq_size=256)


def test_counter_snapshot_protocol(pf):
    """Reader side of the generation protocol: gen even and unchanged."""
    g1 = pf.cnt(slot=1)
    vals = [pf.cnt(slot=s) for s in range(2, 38)]
    g2 = pf.cnt(slot=1)
    assert g1 % 2 == 0 and g1 == g2 and len(vals) == 36
    raw = pf.dev.qt.memread  # BAR reads via memread also work (mmap-like access)
    blk = raw(pf.bar2, 64)
    assert struct.unpack_from("<Q", blk, 0)[0] >> 32 == 1


def test_qmp_through_qemu_qmp(dev) -> None:
    # tacc.testing.qtest's QMP is qemu.qmp's QEMUMonitorProtocol: values come back, and a
    # QMP error is one QTestError naming the command and QEMU's description
    from qemu.qmp.legacy import QEMUMonitorProtocol
    from tacc.testing.qtest import QTestError

    assert isinstance(dev.qt.qmp.mon, QEMUMonitorProtocol)
    assert isinstance(dev.qom_get("x-gt-h2d-bytes"), int)
    with pytest.raises(QTestError, match=r"^qom-get: .*no-such-prop"):
        dev.qom_get("no-such-prop")
