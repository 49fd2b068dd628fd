"""Features combined under a hostile guest (docs/hardware.md section 8, "What a guest
cannot do to QEMU"): TLP capture with virtio traffic, the PF ejected while a
virtio-tacc-pci links it, the device's own DMA aimed at the root port's config space.
Each test boots its own QEMU when the previous state could not be reused."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_fence
from tacc.pcie import CPLD, F_CTRL, TLP_DTYPE
from tacc.testing.qtest import QEMU, QTestError
from tacc.testing.taccdev import DEVMEM_VA, Tacc
from tacc.testing.virtiodev import Job, VirtioTacc, device_arg

WIN = "devmem-base=0xc000000,devmem-size=0x4000000"
HOST_VA = 0x1000_0000


def _virtio_qemu(props: str = "sriov-max-vfs=2",
                 root_port: str | None = None) -> tuple[Tacc, VirtioTacc]:
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc(props, extra=device_arg(props=WIN), root_port=root_port)
    d.root0 = d.map_default(0x2000_0000, 256 << 20)
    return d, VirtioTacc(d)


def _alive(d: Tacc) -> None:
    assert not d.qt.died(), d.qt.died()
    assert d.pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


def _virtio_copy_job(v: VirtioTacc) -> tuple[int, int]:
    """A context with a host BO and a COPY_H2D job on ring 0 of 64 KiB; returns
    (ctx, the submit's status)."""
    c = v.ctx_create()
    size = 128 << 10
    a = v.dev.alloc(size)
    v.qt.memwrite(a, bytes(range(256)) * (size // 256))
    h = v.bo_host(c, a, size)
    assert v.bind(c, h, HOST_VA, size) == hw.TACC_VIRTIO_OK
    st, hd = v.bo_create(c, 1 << 20, devmem=True)
    assert st == hw.TACC_VIRTIO_OK
    assert v.bind(c, hd, DEVMEM_VA, 1 << 20) == hw.TACC_VIRTIO_OK
    v.submit([Job(c, 0, 1, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEVMEM_VA, 64 << 10)])])
    (st, _, _, _), = v.wait_used(1)
    return c, st


# ------------------------------------------------------ TLP capture + virtio --
def test_tlp_capture_of_virtio_traffic():
    """TLPCAP_FUNCS = 0 (all functions) with virtio-tacc traffic: its requests and
    its commands' TLPs are recorded as function TACC_FN_VIRTIO with the requester ID
    of the virtio-pci proxy (QEMU died with SIGSEGV in tacc_tlpcap_rec before)."""
    d, v = _virtio_qemu()
    try:
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, d.root0)
        assert v.init()
        ring, size = d.alloc(1 << 16 << 6), 1 << 16
        pf.w64(hw.TACC_REG_TLPCAP_BASE, ring)
        pf.w32(hw.TACC_REG_TLPCAP_SIZE, size)
        pf.w32(hw.TACC_REG_TLPCAP_FUNCS, 0)
        pf.w32(hw.TACC_REG_TLPCAP_CTRL, hw.TACC_TLPCAP_CTRL_ENABLE)
        _, st = _virtio_copy_job(v)
        assert st == hw.TACC_VIRTIO_OK
        _alive(d)
        prod = pf.r32(hw.TACC_REG_TLPCAP_PROD)
        pf.w32(hw.TACC_REG_TLPCAP_CTRL, 0)  # flushes the batch
        recs = np.frombuffer(d.qt.memread(ring, prod * 64), TLP_DTYPE)
        vrec = recs[recs["func"] == hw.TACC_FN_VIRTIO]
        assert len(vrec) > 0
        assert set(vrec["req_id"]) == {v.devfn}  # bus 0: the BDF is the devfn
        cmd = vrec[(vrec["flags"] & F_CTRL) == 0]
        assert cmd["payload"][cmd["kind"] == CPLD].sum() == 64 << 10  # its CplD data
        assert (vrec["flags"] & F_CTRL).any()  # and its requests' control traffic
    finally:
        d.close()


# ------------------------------------------------------- PF eject + virtio --
# q35 ACPI PCI hotplug (ICH9 LPC): bsel 0 is the first hotpluggable bus, the root
# port's secondary bus (pcie.0 is not hotpluggable)
PCIHP_EJ, PCIHP_SEL = 0xCC8, 0xCD0


def test_pf_device_del_refused_while_virtio_links_it():
    d, v = _virtio_qemu(root_port="")
    try:
        with pytest.raises(QTestError, match="virtio-tacc"):
            d.qt.qmp.cmd("device_del", id="tacc0")
        _alive(d)
    finally:
        d.close()


def test_pf_ejected_by_guest_while_virtio_links_it():
    """The guest ejects the PF through ACPI PCI hotplug (no device_del: the guest's
    own eject) while the virtio function has a context and a finished job; then it
    uses the virtio function.  It reports DEVICE_NEEDS_RESET and serves nothing, QEMU
    lives (use after free in tacc_lpm_up before)."""
    d, v = _virtio_qemu(root_port="")
    try:
        assert v.init()
        c, st = _virtio_copy_job(v)
        assert st == hw.TACC_VIRTIO_OK
        d.qt.outl(PCIHP_SEL, 0)
        d.qt.outl(PCIHP_EJ, 1 << (d.pf.devfn >> 3))
        assert d.qt.find_devices(hw.TACC_PCI_VENDOR_ID, hw.TACC_PCI_DEVICE_ID_PF, bus=1) == []
        v.subq.add([v.batch([Job(c, 0, 2, [d_copy(hw.TACC_OP_COPY_H2D, HOST_VA, DEVMEM_VA,
                                                  4096)])])], 64)
        v.subq.kick()
        v.ctrlq.add([struct.pack("<HBBIQ", hw.TACC_VIRTIO_CTX_CREATE,
                                 hw.TACC_VIRTIO_MSG_VERSION, 0, 0, 0)], 16)
        v.ctrlq.kick()
        d.qt.clock_step(10**8)
        assert not d.qt.died(), d.qt.died()
        assert v.status() & 64  # VIRTIO_CONFIG_S_NEEDS_RESET
        assert v.config()["devmem_size"] == 0
        # a reset does not revive it: FEATURES_OK is refused
        assert not v.init()
        d.qt.clock_step(10**7)
        assert not d.qt.died(), d.qt.died()
    finally:
        d.close()


# --------------------------------------- the device's DMA into the root port --
@pytest.fixture(scope="module")
def rpdev():
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    d = Tacc("sriov-max-vfs=2", root_port="")
    d.root0 = d.map_default()
    yield d
    d.close()


PWR_OFF, PIC_OFF = 0x0400, 0x0300  # Slot Control: Power Controller off, Power Indicator off


@pytest.mark.parametrize("sltctl", [PWR_OFF | 0x100, PWR_OFF | PIC_OFF],
                         ids=["power-off", "power-off-eject"])
def test_fence_into_root_port_slot_control(rpdev, sltctl):
    """A FENCE whose write-back address is the root port's Slot Control (through
    ECAM): powering the slot off resets the device, with the indicator off too it
    ejects it, in the middle of the device's own completion.  The device's DMA never
    reaches config space: the fence ends with DMA_ERROR, the slot keeps its power
    and the device its state (f_count underflow / use after free before)."""
    d = rpdev
    qt, pf = d.qt, d.pf
    pf.reset()
    pf.set_ptbr(0, d.root0)
    d.reset_alloc()
    exp = qt.find_cap(0, Tacc.RP_DEVFN, 0x10)
    # the 8 bytes of Slot Capabilities (RO) and Slot Control/Status (exp 0x54 here)
    slt = qt.ecam(0, Tacc.RP_DEVFN, exp + 0x14)
    assert slt % 8 == 0
    before = qt.cfg_read(0, Tacc.RP_DEVFN, exp + 0x18, 2)
    pf.root = d.pt.new_root()
    d.pt.map(pf.root, 0, 0, 0x2000_0000, huge=True)
    # the fence's VA is the bus address of Slot Control (ECAM is above 2 GiB)
    d.pt.map(pf.root, slt & ~0x1FFFFF, slt & ~0x1FFFFF, 2 << 20, huge=True)
    d.pt.flush()
    pf.set_ptbr(0, pf.root)
    fence = d.alloc(4096)
    cqe = pf.run_job(0, [d_fence(fence, 1), d_fence(slt, sltctl << 32)])
    assert not qt.died(), qt.died()
    assert cqe.status == hw.TACC_ST_DMA_ERROR
    assert qt.cfg_read(0, Tacc.RP_DEVFN, exp + 0x18, 2) == before
    assert qt.find_devices(hw.TACC_PCI_VENDOR_ID, hw.TACC_PCI_DEVICE_ID_PF, bus=1) == [0]
    assert pf.qstatus(0) & hw.TACC_Q_STATUS_IDLE
    assert qt.readq(fence) == 1
    # the queue runs on
    assert pf.run_job(0, [d_fence(fence, 2)]).status == hw.TACC_ST_OK
    assert qt.readq(fence) == 2


def test_cq_into_root_port_config(rpdev):
    """The CQ base is the root port's config space (ECAM page): the CQE write is
    refused as a DMA error, the port's Command register keeps bus mastering."""
    d = rpdev
    qt, pf = d.qt, d.pf
    pf.reset()
    pf.set_ptbr(0, d.root0)
    d.reset_alloc()
    cmd = qt.cfg_read(0, Tacc.RP_DEVFN, 0x04, 2)
    b = 0x1000
    pf.w32(b + hw.TACC_Q_CTRL, 0)
    pf.w64(b + hw.TACC_Q_CQ_BASE, qt.ecam(0, Tacc.RP_DEVFN, 0))
    pf.w32(b + hw.TACC_Q_CTRL, hw.TACC_Q_CTRL_ENABLE)
    job, ds = pf.job_of(0, [d_fence(d.alloc(4096), 1)])
    pf.submit(0, ds)
    qt.clock_step(10**7)
    assert not qt.died(), qt.died()
    assert qt.cfg_read(0, Tacc.RP_DEVFN, 0x04, 2) == cmd
    assert pf.qstatus(0) & hw.TACC_Q_STATUS_ERROR, hex(pf.qstatus(0))
    assert pf.cnt("dma_errors") >= 1



# ------------------------------------- FENCE to device memory, window moved --
def test_devmem_fence_lands_in_the_window_at_completion(rpdev):
    """A VF's FENCE to device memory is resolved against its window when it completes:
    the PF moves the VF's window between dispatch and completion, the value lands in
    the new window (it landed in the old range, another function's memory, before)."""
    d = rpdev
    qt, pf = d.qt, d.pf
    pf.reset()
    pf.set_ptbr(0, d.root0)
    d.reset_alloc()
    (vf,) = d.enable_vfs(1)
    old, new, size = 64 << 20, 96 << 20, 16 << 20
    pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), old)
    pf.w64(hw.TACC_REG_VF_DEVMEM_SIZE(0), size)
    vf.reset()
    vf.set_ptbr(0, d.root0)  # DEVMEM_VA + x: window offset x
    off = 0x1000
    job, ds = vf.job_of(0, [d_fence(DEVMEM_VA + off, 0x5EED)])
    vf.submit(0, ds)  # dispatched now, completes cmd-latency later
    pf.w64(hw.TACC_REG_VF_DEVMEM_BASE(0), new)  # the PF moves the window before that
    qt.clock_step(10**7)
    (cqe,) = vf.cqes(0)
    assert cqe.job == job and cqe.status == hw.TACC_ST_OK
    host = d.alloc(4096)
    for base, want in ((new, 0x5EED), (old, 0)):
        pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + base + off, host, 8)])
        assert qt.readq(host) == want, hex(base)
    d.enable_vfs(0)


# ------------------------------------------------- a realize that fails late --
# each fails after device memory, the TLB, the bottom halves, MSI-X, the PCIe
# capabilities and (with VFs) SR-IOV's VFs exist: the last step, L1 PM Substates
LATE_FAILURES = [{"sriov-max-vfs": 4, "l1ss-t-power-on-us": 3},
                 {"sriov-max-vfs": 0, "l1ss-t-power-on-us": 3}]
ROOT_PORTS = 3


def root_ports_qemu():
    """A q35 with ROOT_PORTS empty root ports rp0.. (no tacc device)."""
    from tacc.testing.qtest import QTest

    return QTest([a for i in range(ROOT_PORTS) for a in (
        "-device", f"pcie-root-port,id=rp{i},bus=pcie.0,addr=0{2 + i}.0,chassis={1 + i},"
        f"slot={1 + i}")])


def hotplug_after_failures(qt, bad: dict) -> None:
    """On each root port: a device_add whose realize fails late (its error returned),
    then a good PF with 2 VFs in the same slot, realized."""
    for i in range(ROOT_PORTS):
        with pytest.raises(QTestError, match="T_POWER_ON 3 us"):
            qt.qmp.cmd("device_add", driver="tacc", id=f"bad{i}", bus=f"rp{i}", **bad)
        qt.qmp.cmd("device_add", driver="tacc", id=f"good{i}", bus=f"rp{i}",
                   **{"sriov-max-vfs": 2})
        assert qt.qmp.cmd("qom-get", path=f"/machine/peripheral/good{i}",
                          property="realized") is True


@pytest.mark.parametrize("bad", LATE_FAILURES, ids=["with-vfs", "no-vfs"])
def test_failed_hotplug_leaves_the_slot_usable(bad):
    """device_add of a PF whose realize fails at its last step returns the error and
    undoes the rest: the same slot then takes a good PF with VFs (before: the failed
    PF's VFs stayed on the bus: "PCI: 0.0 indicates single function, but 0.1 is
    already populated"), and QEMU lives."""
    if not QEMU.exists():
        pytest.skip(f"{QEMU} not built (make qemu)")
    qt = root_ports_qemu()
    try:
        hotplug_after_failures(qt, bad)
        assert not qt.died(), qt.died()
    finally:
        qt.close()

