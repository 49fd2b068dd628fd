"""A secondary bus reset through the pcie-root-port above the PF (docs/hardware.md
"Link faults", qemu/patches/0007): the port's Link Status reports Data Link Layer Link
Active while the PF is there and the port does not hold Secondary Bus Reset, as its
Link Capabilities (DLLLARC) promise; the reset is a device reset of the PF (config
space and SR-IOV cleared), which answers again once the bit is cleared."""

import pytest
from conftest import map_ctx0
from tacc import hw
from tacc.testing.taccdev import PF_BARS, Tacc

BRIDGE_CONTROL, BRIDGE_CTL_BUS_RESET = 0x3E, 0x40
LNKCAP, LNKSTA = 0x0C, 0x12
LNKCAP_DLLLARC, LNKSTA_DLLLA = 1 << 20, 1 << 13
SRIOV_CTRL, SRIOV_NUM_VF, SRIOV_VFE = 0x08, 0x10, 0x1


@pytest.fixture(scope="module")
def rdev():
    """A QEMU of its own: tacc (2 VFs possible) at 01:00.0 behind a pcie-root-port."""
    d = Tacc("sriov-max-vfs=2", root_port="")
    d.root0 = map_ctx0(d)
    yield d
    d.close()


def rp_reg(d: Tacc, off: int, size: int = 2) -> int:
    cap = d.qt.find_cap(0, Tacc.RP_DEVFN, 0x10)
    return d.qt.cfg_read(0, Tacc.RP_DEVFN, cap + off, size)


def set_sbr(d: Tacc, on: bool) -> None:
    v = d.qt.cfg_read(0, Tacc.RP_DEVFN, BRIDGE_CONTROL, 2)
    v = v | BRIDGE_CTL_BUS_RESET if on else v & ~BRIDGE_CTL_BUS_RESET
    d.qt.cfg_write(0, Tacc.RP_DEVFN, BRIDGE_CONTROL, v, 2)


def test_root_port_reports_link_active_for_the_pf(rdev):
    """DLLLARC is advertised (16 GT/s port) and DLLLA is set: before patch 0007 q35's
    ACPI hotplug handler left it 0 for the cold-plugged PF."""
    assert rp_reg(rdev, LNKCAP, 4) & LNKCAP_DLLLARC
    assert rp_reg(rdev, LNKSTA) & LNKSTA_DLLLA


def test_secondary_bus_reset_resets_the_pf_and_retrains(rdev):
    """While Secondary Bus Reset is held the link is down (DLLLA 0) and the PF has been
    reset (Command 0, BARs 0, VF Enable 0); after the bit is cleared the link is up
    and the PF, its BARs programmed again, answers with its ID."""
    qt = rdev.qt
    sr = qt.find_ext_cap(1, 0, 0x10)
    qt.cfg_write(1, 0, sr + SRIOV_NUM_VF, 1, 2)
    qt.cfg_write(1, 0, sr + SRIOV_CTRL, SRIOV_VFE, 2)
    assert qt.cfg_read(1, 0, sr + SRIOV_CTRL, 2) & SRIOV_VFE
    assert rdev.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
    set_sbr(rdev, True)
    try:
        assert not rp_reg(rdev, LNKSTA) & LNKSTA_DLLLA
        assert qt.cfg_read(1, 0, 0x04, 2) == 0            # Command
        assert qt.cfg_read(1, 0, 0x10, 4) & ~0xF == 0     # BAR0
        assert not qt.cfg_read(1, 0, sr + SRIOV_CTRL, 2) & SRIOV_VFE
    finally:
        set_sbr(rdev, False)
    assert rp_reg(rdev, LNKSTA) & LNKSTA_DLLLA
    assert qt.cfg_read(1, 0, 0x00, 4) == hw.TACC_PCI_DEVICE_ID_PF << 16 | hw.TACC_PCI_VENDOR_ID
    for bar, addr in PF_BARS.items():
        qt.set_bar(1, 0, 0x10 + 4 * bar, addr, True)
    qt.cfg_write(1, 0, 0x04, 0x0006, 2)
    assert rdev.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
