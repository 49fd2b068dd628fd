"""SR-IOV: VFs through the capability, own queues/counters, partitioned memory,
shared engines with weighted arbitration."""

from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.taccdev import DEVMEM_VA


def setup_vfs(dev, pf, n=2):
    vfs = dev.enable_vfs(n)
    for i in range(n):
        pf.w64(0x400 + 16 * i, (64 << 20) * (i + 1))  # VF i+1: [64 MiB * (i+1), +32 MiB)
        pf.w64(0x408 + 16 * i, 32 << 20)
    for vf in vfs:
        vf.reset()
        vf.set_ptbr(0, dev.map_default(devmem=32 << 20))
    return vfs


def test_vf_enable(dev, pf):
    qt = dev.qt
    sr = qt.find_ext_cap(0, 0x08, 0x10)
    assert qt.cfg_read(0, 0x08, sr + 0x0E, 2) == 4  # TotalVFs
    assert qt.cfg_read(0, 0x08, sr + 0x1A, 2) == hw.TACC_PCI_DEVICE_ID_VF
    assert qt.cfg_read(0, 0x09, 0) == 0xFFFFFFFF  # no VF before enable
    vfs = setup_vfs(dev, pf, 4)
    assert [vf.devfn for vf in vfs] == [0x09, 0x0A, 0x0B, 0x0C]
    for i, vf in enumerate(vfs):
        # a VF's Vendor and Device ID read 0xFFFF (SR-IOV 1.1 section 3.4.1.1: the
        # VF device ID is the PF's SR-IOV capability's); the VF is there all the same
        assert qt.cfg_read(0, vf.devfn, 0) == 0xFFFFFFFF
        assert qt.cfg_read(0, vf.devfn, 8) >> 8 == hw.TACC_PCI_CLASS
        assert vf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
        assert vf.r32(hw.TACC_REG_FUNC) == i + 1
        assert vf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_VF
        assert vf.r64(hw.TACC_REG_DEVMEM_SIZE) == (32 << 20 if i < 3 else 0)  # VF4 does not fit
        assert qt.find_cap(0, vf.devfn, 0x11)  # own MSI-X
    dev.enable_vfs(0)
    # every VF is gone: no function answers config reads (all ones), its BAR is dead,
    # and the PF reports no VF
    for vf in vfs:
        assert qt.cfg_read(0, vf.devfn, 0) == 0xFFFFFFFF
        assert qt.cfg_read(0, vf.devfn, 8) == 0xFFFFFFFF
        assert vf.r32(hw.TACC_REG_ID) != hw.TACC_ID_MAGIC
    assert qt.cfg_read(0, 0x08, sr + 0x10, 2) == 0  # NumVFs
    assert pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC  # the PF is still there


def test_vf_isolation_and_partition(dev, pf):
    vf1, vf2 = setup_vfs(dev, pf)
    n = 8192
    src = dev.alloc(n)
    dev.qt.memwrite(src, bytes(range(256)) * (n // 256))
    assert vf1.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + 4096, n)]).status == 0
    # VF1's window starts at 64 MiB of device memory: the PF sees the data there
    dst = dev.alloc(n)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + (64 << 20) + 4096, dst,
                                 n)]).status == 0
    assert dev.qt.memread(dst, n) == dev.qt.memread(src, n)
    # own counters per function
    assert vf1.cnt("h2d_bytes") == n and vf2.cnt("h2d_bytes") == 0
    assert vf1.dev.qt.readq(vf1.bar2 + 0x1000) == 0  # no global page on VFs
    # beyond the 32 MiB window: DEVMEM_RANGE fault (mapping covers 32 MiB only -> unmapped)
    cq = vf2.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA + (32 << 20), 64)])
    assert cq.status == hw.TACC_ST_MMU_FAULT
    assert vf1.r32(hw.TACC_REG_FAULT_INFO) == 0  # faults are per function
    dev.enable_vfs(0)


def test_vf_arbitration_weights(dev, pf):
    """PF weight 3, VF1 weight 1: with both queues full of H2D copies, the
    engine serves PF, PF, PF, VF1, PF, PF, PF, VF1 ..."""
    (vf1,) = setup_vfs(dev, pf, 1)
    pf.w32(0x480, 3)
    pf.w32(0x484, 1)
    src = dev.alloc(4096)
    pf.trace_enable(size=64)
    vf1.trace_enable(size=64)
    for f in (pf, vf1):
        f.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 4096)])  # warm TLBs
    p0 = pf.r32(hw.TACC_REG_TRACE_PROD)
    v0 = vf1.r32(hw.TACC_REG_TRACE_PROD)
    jobs = {}
    for f in (pf, vf1):
        ds = [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 4096) for _ in range(12)]
        jobs[f.fn] = f.job_of(0, ds)[1]
    # submit both before time moves
    pf.submit(0, jobs[0])
    vf1.submit(0, jobs[1])
    dev.qt.clock_step(10**8)
    recs = [(r.t_start, 0) for r in pf.trace_read(p0, p0 + 12, 64)]
    recs += [(r.t_start, 1) for r in vf1.trace_read(v0, v0 + 12, 64)]
    order = [fn for _, fn in sorted(recs)]
    assert order[:8] == [0, 0, 0, 1, 0, 0, 0, 1] or order[:8] == [1, 0, 0, 0, 1, 0, 0, 0]
    dev.enable_vfs(0)


def test_vf_msix_and_irq(dev, pf):
    (vf1,) = setup_vfs(dev, pf, 1)
    qt = dev.qt
    msix = qt.find_cap(0, vf1.devfn, 0x11)
    # vector 0 -> a RAM address we can read
    msg = dev.alloc(4096)
    qt.writeq(vf1.bar4 + 0, msg)
    qt.writel(vf1.bar4 + 8, 0xC0FFEE)
    qt.writel(vf1.bar4 + 12, 0)
    qt.cfg_write(0, vf1.devfn, msix + 2, 0x8000, 2)  # MSI-X enable
    vf1.setup_queue(0, irq=True)
    cq = vf1.run_job(0, [desc(hw.TACC_OP_NOP)])
    assert cq.status == 0
    assert qt.readl(msg) == 0xC0FFEE
    assert vf1.cnt("irqs") == 1
    qt.cfg_write(0, vf1.devfn, msix + 2, 0, 2)
    dev.enable_vfs(0)


def test_global_counters_sum_functions(dev, pf):
    (vf1,) = setup_vfs(dev, pf, 1)
    g0 = {k: pf.gcnt(k) for k in ("link_h2d_payload", "link_d2h_payload", "link_h2d_bytes",
                                  "link_d2h_bytes")}
    a = dev.alloc(1 << 20)
    for f, n in ((pf, 100_000), (vf1, 300_000)):
        f.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, n),
                      d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, a, n // 2)])
    d = {k: pf.gcnt(k) - v for k, v in g0.items()}
    assert d["link_h2d_payload"] == pf.cnt("h2d_bytes") + vf1.cnt("h2d_bytes") == 400_000
    assert d["link_d2h_payload"] == pf.cnt("d2h_bytes") + vf1.cnt("d2h_bytes") == 200_000
    # all link bytes: the commands' and the control traffic's (fetches, CQEs, ...)
    assert d["link_h2d_bytes"] == sum(f.cnt("h2d_link_bytes") + f.cnt("ctrl_h2d_link_bytes")
                                      for f in (pf, vf1))
    assert d["link_d2h_bytes"] == sum(f.cnt("d2h_link_bytes") + f.cnt("ctrl_d2h_link_bytes")
                                      for f in (pf, vf1))
    dev.enable_vfs(0)
