"""VF BARs as vfio-pci and a VMM want them: 64-bit prefetchable (issue 15).

QEMU 10.0.2 realizes VFs before the PF sets the VF BAR type, so a 64-bit VF BAR never
decoded; qemu/patches/0002 (upstream 2e54e5fda779) registers VF BARs with their type.
Here the PF's SR-IOV capability advertises 64-bit prefetchable VF BARs, and a VF whose
BAR0 sits above 4 GiB answers register reads there.
"""

from tacc import hw

PCI_BAR_MEM_TYPE_64 = 0x4
PCI_BAR_MEM_PREFETCH = 0x8
SRIOV_VF_BAR0 = 0x24
HIGH_BAR0 = 0x8_0000_0000  # 32 GiB: only a 64-bit BAR reaches it


def test_vf_bars_64bit_prefetchable(dev, pf):
    qt = dev.qt
    sr = qt.find_ext_cap(0, pf.devfn, 0x10)
    for bar in (hw.TACC_BAR_REGS, hw.TACC_BAR_COUNTERS, hw.TACC_BAR_MSIX):
        lo = qt.cfg_read(0, pf.devfn, sr + SRIOV_VF_BAR0 + 4 * bar)
        assert lo & 0x6 == PCI_BAR_MEM_TYPE_64, f"VF BAR{bar} 0x{lo:08x}: not 64-bit"
        assert lo & PCI_BAR_MEM_PREFETCH, f"VF BAR{bar} 0x{lo:08x}: not prefetchable"


def test_vf_bar0_above_4g_decodes(dev, pf):
    qt = dev.qt
    sr = qt.find_ext_cap(0, pf.devfn, 0x10)
    vfs = dev.enable_vfs(2)
    qt.cfg_write(0, pf.devfn, sr + 0x08, 0, 2)  # VF Enable off: program the BAR
    qt.cfg_write(0, pf.devfn, sr + SRIOV_VF_BAR0, HIGH_BAR0 & 0xFFFFFFFF)
    qt.cfg_write(0, pf.devfn, sr + SRIOV_VF_BAR0 + 4, HIGH_BAR0 >> 32)
    qt.cfg_write(0, pf.devfn, sr + 0x08, 0x9, 2)  # VF Enable | VF MSE
    for i, vf in enumerate(vfs):
        qt.cfg_write(0, vf.devfn, 0x04, 0x0006, 2)
        base = HIGH_BAR0 + i * hw.TACC_BAR_REGS_SIZE
        assert qt.readl(base + hw.TACC_REG_ID) == hw.TACC_ID_MAGIC, f"VF{i + 1} at 0x{base:x}"
        assert qt.readl(base + hw.TACC_REG_FUNC) == i + 1
    dev.enable_vfs(0)  # the session's device: VF BARs back below 4 GiB
