"""All device DMA goes through the vIOMMU (intel-iommu, programmed here by
hand: legacy root/context tables, 3-level second-level tables).  A DMA to an
IOVA the IOMMU does not map fails with DMA_ERROR and leaves a DMAR fault record
with the function's requester ID; nothing is silently served."""

import struct

import pytest
from tacc import hw
from tacc.hw.records import d_copy
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import DEVMEM_VA, Tacc

DMAR = 0xFED9_0000
VTD_TABLES = 0x0C00_0000  # root, context, second-level tables (not IOMMU-mapped)
MAPPED = 0x0400_0000  # IOVA == GPA for 0 .. 64 MiB ...
HOLE = (0x0300_0000, 0x0301_0000)  # ... except this hole


class VtdTables:
    def __init__(self, qt):
        self.qt = qt
        self.next = VTD_TABLES
        self.pages: dict[int, bytearray] = {}

    def alloc(self):
        a = self.next
        self.next += 4096
        self.pages[a] = bytearray(4096)
        return a

    def entry(self, table, idx, val, hi=None, size=8):
        struct.pack_into("<Q", self.pages[table], idx * size, val)
        if hi is not None:
            struct.pack_into("<Q", self.pages[table], idx * size + 8, hi)

    def get(self, table, idx):
        return struct.unpack_from("<Q", self.pages[table], idx * 8)[0]

    def map4k(self, l0, iova):
        t = l0
        for shift in (30, 21):
            idx = (iova >> shift) & 511
            e = self.get(t, idx)
            if not e:
                n = self.alloc()
                self.entry(t, idx, n | 3)
                e = n | 3
            t = e & ~0xFFF
        self.entry(t, (iova >> 12) & 511, iova | 3)

    def flush(self):
        for a, b in self.pages.items():
            self.qt.memwrite(a, bytes(b))


def iommu_on(d: Tacc) -> int:
    """Translation on in the vIOMMU for the PF: IOVA == GPA for 0 .. MAPPED except the
    HOLE; returns the device page-table root (context 0) it maps."""
    qt = d.qt
    root0 = d.map_default()  # device page tables (at IOVA == GPA, mapped below)
    vt = VtdTables(qt)
    root = vt.alloc()
    ctx = vt.alloc()
    sl = vt.alloc()
    vt.entry(root, 0, ctx | 1, 0, size=16)  # bus 0
    vt.entry(ctx, d.pf.devfn, sl | 1, 1 | (1 << 8), size=16)  # present, AW=39-bit, domain 1
    for iova in range(0, MAPPED, 4096):
        if not HOLE[0] <= iova < HOLE[1]:
            vt.map4k(sl, iova)
    vt.flush()
    qt.writeq(DMAR + 0x20, root)  # RTADDR
    qt.writel(DMAR + 0x18, 1 << 30)  # SRTP
    assert qt.readl(DMAR + 0x1C) & (1 << 30)
    qt.writel(DMAR + 0x18, 1 << 31)  # TE
    assert qt.readl(DMAR + 0x1C) & (1 << 31)
    return root0


@pytest.fixture(scope="module")
def vdev():
    if not QEMU.exists():
        pytest.skip("QEMU not built")
    d = Tacc("sriov-max-vfs=0", pre=["-device", "intel-iommu"])
    root0 = iommu_on(d)
    d.pf.reset()
    d.pf.set_ptbr(0, root0)
    yield d
    d.close()


def test_translated_dma_works(vdev):
    pf, qt = vdev.pf, vdev.qt
    src, dst = 0x0200_0000, 0x0280_0000
    qt.memwrite(src, bytes(range(256)) * 32)
    assert pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, 8192),
                          d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, dst, 8192)]).status == 0
    assert qt.memread(dst, 8192) == qt.memread(src, 8192)
    assert qt.readl(DMAR + 0x34) & 2 == 0  # no DMAR fault


def test_unmapped_iova_fails_and_is_reported(vdev):
    pf, qt = vdev.pf, vdev.qt
    pf.w32(hw.TACC_REG_IRQ_STATUS, 0xFFFFFFFF)
    e0 = pf.cnt("dma_errors")
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, HOLE[0] + 0x100, DEVMEM_VA, 64)])
    assert cq.status == hw.TACC_ST_DMA_ERROR
    assert pf.cnt("dma_errors") == e0 + 1
    assert pf.r32(hw.TACC_REG_IRQ_STATUS) & hw.TACC_IRQ_DMA_ERROR
    assert qt.readl(DMAR + 0x34) & 2  # FSTS.PPF: primary pending fault
    lo, hi = qt.readq(DMAR + 0x220), qt.readq(DMAR + 0x228)
    assert hi >> 63  # F: a fault is recorded
    assert lo & ~0xFFF == HOLE[0]  # the faulting IOVA page
    assert hi & 0xFFFF == pf.devfn  # requester ID = bus 0, our devfn
    # D2H into the hole fails too (a write fault)
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, HOLE[0], 64)])
    assert cq.status == hw.TACC_ST_DMA_ERROR


def test_ring_in_unmapped_iova_is_a_queue_error(vdev):
    pf = vdev.pf
    b = 0x1000 + 2 * 0x100
    pf.w32(b + hw.TACC_Q_CTRL, 0)
    pf.w64(b + hw.TACC_Q_SQ_BASE, HOLE[0])
    pf.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    pf.w32(b + hw.TACC_Q_SQ_TAIL, 1)
    assert pf.qstatus(2) & hw.TACC_Q_STATUS_ERROR
    pf.setup_queue(2)
