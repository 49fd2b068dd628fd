"""Identity, capabilities and registers."""

from tacc import hw


def test_config_space(dev):
    qt = dev.qt
    assert qt.cfg_read(0, 0x08, 0) == hw.TACC_PCI_DEVICE_ID_PF << 16 | hw.TACC_PCI_VENDOR_ID
    assert qt.cfg_read(0, 0x08, 8) >> 8 == hw.TACC_PCI_CLASS
    assert qt.cfg_read(0, 0x08, 8) & 0xFF == hw.TACC_PCI_REVISION
    assert qt.find_cap(0, 0x08, 0x01)  # PM
    msix = qt.find_cap(0, 0x08, 0x11)
    assert msix and (qt.cfg_read(0, 0x08, msix + 2, 2) & 0x7FF) + 1 == hw.TACC_MSIX_VECTORS
    exp = qt.find_cap(0, 0x08, 0x10)
    lnkcap = qt.cfg_read(0, 0x08, exp + 0x0C)
    assert lnkcap & 0xF == 4 and (lnkcap >> 4) & 0x3F == 16  # Gen4 x16
    lnksta = qt.cfg_read(0, 0x08, exp + 0x12, 2)
    assert lnksta & 0xF == 4 and (lnksta >> 4) & 0x3F == 16
    assert qt.cfg_read(0, 0x08, exp + 4) & (1 << 28)  # FLR capable
    assert qt.find_ext_cap(0, 0x08, 0x10)  # SR-IOV
    assert qt.bar_size(0, 0x08, 0x10) == (hw.TACC_BAR_REGS_SIZE, True)
    assert qt.bar_size(0, 0x08, 0x18) == (hw.TACC_BAR_COUNTERS_SIZE, True)


def test_id_registers(pf):
    assert pf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
    assert pf.r32(hw.TACC_REG_VERSION) == hw.TACC_HW_VERSION_MAJOR << 16 | hw.TACC_HW_VERSION_MINOR
    caps = pf.r32(hw.TACC_REG_CAPS)
    assert caps & hw.TACC_CAP_SRIOV and not caps & hw.TACC_CAP_VF
    assert caps & hw.TACC_CAP_MMU_2M and caps & hw.TACC_CAP_TRACE and caps & hw.TACC_CAP_SAMPLING
    assert pf.r32(hw.TACC_REG_FUNC) == 0
    assert pf.r32(hw.TACC_REG_NUM_QUEUES) == hw.TACC_NUM_QUEUES
    assert pf.r32(hw.TACC_REG_NUM_CONTEXTS) == hw.TACC_NUM_CONTEXTS
    assert pf.r32(hw.TACC_REG_NUM_ENGINES) == hw.TACC_NUM_ENGINES
    assert pf.r32(hw.TACC_REG_MSIX_VECTORS) == hw.TACC_MSIX_VECTORS
    assert pf.r64(hw.TACC_REG_DEVMEM_SIZE) == 256 << 20
    assert pf.r32(hw.TACC_REG_LINK_CAP) == 4 | 16 << hw.TACC_LINK_WIDTH_SHIFT
    assert pf.r32(hw.TACC_REG_LINK_STATUS) == 4 | 16 << hw.TACC_LINK_WIDTH_SHIFT
    assert pf.r32(hw.TACC_REG_LINK_PARAMS) == 256 | 512 << 16
    assert pf.r32(hw.TACC_REG_TLB_ENTRIES) == 128
    assert pf.r32(hw.TACC_REG_CLOCK_HZ) == hw.TACC_CLOCK_HZ
    assert pf.r32(hw.TACC_REG_TIME_SCALE) == 1000
    st = pf.r32(hw.TACC_REG_STATUS)
    assert st & hw.TACC_STATUS_READY and st & hw.TACC_STATUS_IDLE and not st & hw.TACC_STATUS_FATAL


def test_scratch_and_clock(dev, pf):
    pf.w32(hw.TACC_REG_SCRATCH, 0xDEADBEEF)
    assert pf.r32(hw.TACC_REG_SCRATCH) == 0xDEADBEEF
    t0 = pf.r64(hw.TACC_REG_DEVCLK)
    assert t0 == dev.qt.clock()
    dev.qt.clock_step(12345)
    assert pf.r64(hw.TACC_REG_DEVCLK) == t0 + 12345
    # LO read latches HI
    lo = pf.r32(hw.TACC_REG_DEVCLK)
    hi = pf.r32(hw.TACC_REG_DEVCLK + 4)
    assert hi << 32 | lo == t0 + 12345
    assert pf.r64(hw.TACC_REG_HOSTCLK) > 1_600_000_000 * 10**9


def test_counter_block_header(pf):
    assert pf.cnt(slot=0) == 1 << 32 | (max(hw.FUNC_COUNTERS.values()) + 1)
    assert pf.cnt(slot=1) % 2 == 0  # generation: even when consistent
    assert pf.dev.qt.readq(pf.bar2 + hw.TACC_CNT_GLOBAL_PAGE) == 1 << 32 | (
        max(hw.GLOBAL_COUNTERS.values()) + 1)
    assert pf.gcnt("uptime_ticks") == pf.dev.qt.clock()


def test_qemu_dies_with_its_test_process(tmp_path):
    """A test process killed mid-run (pytest-timeout's SIGKILL, a Ctrl-C'd make, CI's
    limit) takes its qtest QEMU with it: QEMU does not exit when the qtest socket closes,
    and one left behind (found spinning at a third of a core for 36 min, session 7)
    steals CPU from every later run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "qemu.pid"
    code = ("import sys, time; from tacc.testing.qtest import QTest; "
            f"q = QTest([]); open({str(pidfile)!r}, 'w').write(str(q.proc.pid)); "
            "time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert child.poll() is None and time.monotonic() < deadline, "no QEMU started"
        time.sleep(0.1)
    qemu = int(pidfile.read_text())
    os.kill(qemu, 0)  # it runs
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(qemu, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{qemu}/stat") as f:
            if f.read().split(") ", 1)[1].startswith("Z"):
                return  # a zombie: dead, its parent gone with the reaper pending
        time.sleep(0.1)
    os.kill(qemu, signal.SIGKILL)
    raise AssertionError(f"QEMU {qemu} outlived its test process by 10 s")
