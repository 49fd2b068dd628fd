"""Link power management (hw 1.2, TACC_CAP_LINK_PM, docs/hardware.md "Link power
management"): the tacc PF behind a pcie-root-port (qemu/patches/0004), ASPM L0s/L1
enabled through both ends' Link Control, an idle link enters the state after its entry
threshold and the next TLP pays the exit latency; counters and registers agree."""

import subprocess

import pytest
from conftest import map_ctx0
from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import DEVMEM_VA, LinkModel, Tacc

LNKCAP, LNKCTL = 0x0C, 0x10
ASPM_L0S, ASPM_L1 = 1, 2
L0S_ENTRY, L0S_EXIT, L1_ENTRY, L1_EXIT = 1000, 256, 10000, 2000  # device defaults, ns
N = 64 * 1024


@pytest.fixture(scope="module")
def rdev():
    """A QEMU of its own: tacc at 01:00.0 behind a pcie-root-port at 00:01.0."""
    d = Tacc("sriov-max-vfs=0", root_port="")
    d.root0 = map_ctx0(d)
    yield d
    d.close()


def exp(d: Tacc, rp: bool) -> tuple[int, int, int]:
    """(bus, devfn, PCIe capability offset) of the root port or the PF."""
    bus, devfn = (0, Tacc.RP_DEVFN) if rp else (1, 0)
    return bus, devfn, d.qt.find_cap(bus, devfn, 0x10)


def set_aspm(d: Tacc, dev_bits: int, rp_bits: int):
    """Write ASPM Control (LNKCTL[1:0]) of the PF and of the root port in Linux's order
    (pcie_config_aspm_link): enabling L1 upstream first, otherwise downstream first."""
    order = ((True, rp_bits), (False, dev_bits))
    for rp, bits in order if (dev_bits | rp_bits) & ASPM_L1 else order[::-1]:
        bus, devfn, cap = exp(d, rp)
        v = d.qt.cfg_read(bus, devfn, cap + LNKCTL, 2)
        d.qt.cfg_write(bus, devfn, cap + LNKCTL, (v & ~3) | bits, 2)


# L1 PM Substates (docs/hardware.md "L1 PM Substates"; qemu/patches/0006)
L1SS_ID, L1SS_CAP, L1SS_CTL1, L1SS_CTL2 = 0x1E, 0x04, 0x08, 0x0C
SS_PCIPM_L12, SS_PCIPM_L11, SS_ASPM_L12, SS_ASPM_L11, SS_ALL = 1, 2, 4, 8, 0xF
DEVCAP2, DEVCTL2, DEVCAP2_LTR, DEVCTL2_LTR_EN = 0x24, 0x28, 0x800, 0x400
L11_EXIT = 4000  # aspm-l11-exit-ns default
RP_CMRT, RP_TPON, PF_CMRT, PF_TPON = 40, 44, 10, 10  # us: port and device defaults
# what Linux's aspm_calc_l12_info programs: T_POWER_ON and Common_Mode_Restore_Time the
# larger of both ends' (44 us: scale 0 (2 us) x 22; 40 us), LTR_L1.2_THRESHOLD
# 2 + 4 + 40 + 44 = 90 us, encoded scale 2 (1024 ns) x 88 = 90112 ns
CTL2 = 22 << 3
CTL1_TIMING = 88 << 16 | 2 << 29
THRESHOLD = 88 * 1024
L12_EXIT = L11_EXIT + (RP_TPON + RP_CMRT) * 1000  # 88 us


def l1ss_at(d: Tacc, rp: bool) -> tuple[int, int, int]:
    """(bus, devfn, L1 PM Substates capability offset) of the root port or the PF."""
    bus, devfn = (0, Tacc.RP_DEVFN) if rp else (1, 0)
    return bus, devfn, d.qt.find_ext_cap(bus, devfn, L1SS_ID)


def set_l1ss(d: Tacc, pf_en: int, rp_en: int, ltr: bool = True,
             ctl1_timing: int = CTL1_TIMING, ctl2: int = CTL2, cmrt: int = RP_CMRT):
    """Program LTR and L1 PM Substates as Linux does (pci_configure_ltr: LTR Enable on
    the root port, then the device; aspm_calc_l12_info: L1.2 off, T_POWER_ON in both,
    Common_Mode_Restore_Time in the root port, LTR_L1.2_THRESHOLD in both;
    pcie_config_aspm_l1ss: enables cleared child first, set parent first).  Callers
    bracket it with ASPM L1 off, as pcie_config_aspm_link does."""
    qt = d.qt
    for rp in (True, False):
        bus, devfn, cap = exp(d, rp)
        v = qt.cfg_read(bus, devfn, cap + DEVCTL2, 2)
        qt.cfg_write(bus, devfn, cap + DEVCTL2,
                     v | DEVCTL2_LTR_EN if ltr else v & ~DEVCTL2_LTR_EN, 2)
    for rp in (False, True):
        bus, devfn, ss = l1ss_at(d, rp)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, 0)
    for rp in (True, False):
        bus, devfn, ss = l1ss_at(d, rp)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL2, ctl2)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, ctl1_timing | (cmrt << 8 if rp else 0))
    for rp, en in ((True, rp_en), (False, pf_en)):
        bus, devfn, ss = l1ss_at(d, rp)
        v = qt.cfg_read(bus, devfn, ss + L1SS_CTL1)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, v | en)


def clear_l1ss(d: Tacc):
    """L1 PM Substates Control 1/2 and LTR Enable of both ends back to 0 (reset)."""
    set_l1ss(d, 0, 0, ltr=False, ctl1_timing=0, ctl2=0, cmrt=0)


@pytest.fixture
def rpf(rdev):
    set_aspm(rdev, 0, 0)
    clear_l1ss(rdev)
    rdev.pf.reset()
    rdev.pf.set_ptbr(0, rdev.root0)
    rdev.reset_alloc()
    return rdev.pf


def lpm(pf) -> dict[str, int]:
    names = ("L0S_ENTRIES", "L0S_EXITS", "L0S_TICKS", "L1_ENTRIES", "L1_EXITS", "L1_TICKS",
             "EXIT_TICKS")
    return {n.lower(): pf.r64(getattr(hw, "TACC_REG_LINKPM_" + n)) for n in names}


def test_both_ends_advertise_l0s_l1_and_take_aspm_control(rdev, rpf):
    """LNKCAP: L0s + L1 with exit latencies on both ends (before 0004 the root port
    advertised L0s only and ASPM Control read back 0 whatever the OS wrote)."""
    qt = rdev.qt
    for rp, l0s_code, l1_code in ((True, 2, 2), (False, 3, 2)):  # 256 ns: 256-512; 2 us: 2-4
        bus, devfn, cap = exp(rdev, rp)
        lnkcap = qt.cfg_read(bus, devfn, cap + LNKCAP)
        assert (lnkcap >> 10) & 3 == 3, (rp, hex(lnkcap))
        assert ((lnkcap >> 12) & 7, (lnkcap >> 15) & 7) == (l0s_code, l1_code), (rp, hex(lnkcap))
    set_aspm(rdev, ASPM_L1, ASPM_L1 | ASPM_L0S)
    for rp, want in ((True, 3), (False, 2)):
        bus, devfn, cap = exp(rdev, rp)
        assert qt.cfg_read(bus, devfn, cap + LNKCTL, 2) & 3 == want, rp
    bus, devfn, cap = exp(rdev, False)
    assert (qt.cfg_read(bus, devfn, cap + 4) >> 6) & 0x3F == 0x3F  # acceptable: no limit
    assert rpf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_LINK_PM
    st = rpf.r32(hw.TACC_REG_LINKPM_STATE)
    assert st & (hw.TACC_LINKPM_EN_L0S | hw.TACC_LINKPM_EN_L1) == hw.TACC_LINKPM_EN_L1
    assert [rpf.r32(getattr(hw, "TACC_REG_LINKPM_" + r)) for r in
            ("L0S_ENTRY", "L0S_EXIT", "L1_ENTRY", "L1_EXIT")] == [L0S_ENTRY, L0S_EXIT,
                                                                   L1_ENTRY, L1_EXIT]


def copy_after_idle(d: Tacc, pf, idle_ns: int, wake_ns: int = 0, scale: int = 1,
                    exit_ns: int = 0):
    """A warm COPY_H2D (TLB), the same copy again (its descriptor fetch wakes the link
    from what a second of idleness left: wake_ns of exit latency), then idle_ns after
    that copy's completion a third one: (its CQE, its doorbell's time, link PM
    registers before and after it)."""
    lm, src = LinkModel(), d.alloc(N)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])
    _, ds = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])
    t1 = d.qt.clock()
    pf.submit(0, ds)
    d.qt.clock_step(wake_ns + scale * lm.copy_ps(N, True) // 1000 + 10)
    (c1,) = pf.cqes(0)
    assert c1.start - t1 == wake_ns
    before = lpm(pf)  # the link just carried the CQE: in L0
    d.qt.clock_step(c1.end + idle_ns - d.qt.clock())
    _, ds = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])
    t_db = d.qt.clock()
    pf.submit(0, ds)
    d.qt.clock_step(exit_ns + scale * lm.copy_ps(N, True) // 1000 + 10)  # exit_ns: expected
    cq = pf.cqes(0)
    assert len(cq) == 1 and cq[0].status == hw.TACC_ST_OK
    return cq[0], t_db, before, lpm(pf)


def delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


def test_l1_exit_latency_is_what_the_first_copy_after_idle_pays(rdev, rpf):
    """L1 on both ends, the link idle longer than the L1 entry threshold: the copy's
    descriptor fetch wakes the link, so the command starts exactly the L1 exit latency
    after the doorbell and lasts the formula; without ASPM it starts at the doorbell."""
    lm = LinkModel()
    off, t_off, _, _ = copy_after_idle(rdev, rpf, 100_000)
    assert off.start == t_off
    assert abs((off.end - off.start) * 1000 - lm.copy_ps(N, True)) < 1000
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    on, t_on, b, a = copy_after_idle(rdev, rpf, 100_000, L1_EXIT, exit_ns=L1_EXIT)
    assert on.start - t_on == L1_EXIT  # added latency == the modelled exit latency
    assert on.end - on.start == off.end - off.start
    d = delta(b, a)
    assert (d["l1_entries"], d["l1_exits"], d["exit_ticks"]) == (1, 1, L1_EXIT), d
    # residency: from L1 entry (entry threshold after the link's last TLP) to the wake
    assert 100_000 - L1_ENTRY - 1000 < d["l1_ticks"] <= 100_000 - L1_ENTRY, d
    assert d["l0s_entries"] == 0


def test_l1_needs_both_ends(rdev, rpf):
    """The device enables L1, its root port does not: the link stays in L0."""
    set_aspm(rdev, ASPM_L1, 0)
    cq, t_db, b, a = copy_after_idle(rdev, rpf, 100_000)
    assert cq.start == t_db and delta(b, a) == dict.fromkeys(b, 0)
    assert not rpf.r32(hw.TACC_REG_LINKPM_STATE) & hw.TACC_LINKPM_EN_L1


def test_l0s_short_idle_then_l1_long_idle(rdev, rpf):
    """L0s and L1 both on: an idle gap between the thresholds costs the L0s exit, a
    longer one goes L0s -> L1 and costs the L1 exit; a gap below both costs nothing."""
    set_aspm(rdev, ASPM_L0S | ASPM_L1, ASPM_L0S | ASPM_L1)
    cq, t_db, b, a = copy_after_idle(rdev, rpf, 5_000, L1_EXIT, exit_ns=L0S_EXIT)
    d = delta(b, a)
    assert cq.start - t_db == L0S_EXIT
    assert (d["l0s_entries"], d["l0s_exits"], d["l1_entries"]) == (1, 1, 0), d
    cq, t_db, b, a = copy_after_idle(rdev, rpf, 50_000, L1_EXIT, exit_ns=L1_EXIT)
    d = delta(b, a)
    assert cq.start - t_db == L1_EXIT
    assert (d["l0s_entries"], d["l0s_exits"], d["l1_entries"], d["l1_exits"]) == (1, 0, 1, 1)
    assert L1_ENTRY - L0S_ENTRY - 1 <= d["l0s_ticks"] <= L1_ENTRY - L0S_ENTRY + 1, d
    cq, t_db, b, a = copy_after_idle(rdev, rpf, 500, L1_EXIT)
    assert cq.start == t_db and delta(b, a)["exit_ticks"] == 0


def test_registers_count_the_state_the_link_is_in(rdev, rpf):
    """A read during L1 counts the entry and the residency so far; the global counters
    (BAR2 page 1) say the same as the registers."""
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    cq, _, b, _ = copy_after_idle(rdev, rpf, 100, L1_EXIT)
    rdev.qt.clock_step(cq.end + L1_ENTRY + 30_000 - rdev.qt.clock())
    st = rpf.r32(hw.TACC_REG_LINKPM_STATE)
    assert st & hw.TACC_LINKPM_STATE_MASK == hw.TACC_LINKPM_L1
    d = delta(b, lpm(rpf))
    assert d["l1_entries"] == 1 and d["l1_exits"] == 0
    assert 29_990 <= d["l1_ticks"] <= 30_000, d
    a = lpm(rpf)
    for reg, cnt in (("l1_entries", "link_l1_entries"), ("l1_exits", "link_l1_exits"),
                     ("l1_ticks", "link_l1_ticks"), ("l0s_entries", "link_l0s_entries"),
                     ("l0s_exits", "link_l0s_exits"), ("l0s_ticks", "link_l0s_ticks"),
                     ("exit_ticks", "link_pm_exit_ticks")):
        assert rpf.gcnt(cnt) == a[reg], cnt


def test_time_scale_scales_entry_and_exit(rdev, rpf):
    """time-scale multiplies the thresholds and the exit latency like every duration."""
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    rdev.qom_set("time-scale", 2000)
    try:
        cq, t_db, _, _ = copy_after_idle(rdev, rpf, 15_000, 2 * L1_EXIT, 2)  # < 2 x L1 entry
        assert cq.start == t_db
        cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, 2 * L1_EXIT, 2, 2 * L1_EXIT)
        assert cq.start - t_db == 2 * L1_EXIT
    finally:
        rdev.qom_set("time-scale", 1000)


def test_link_pm_registers_are_pf_only_and_read_only(rdev, rpf):
    """A write is ignored (LOG_GUEST_ERROR); QEMU keeps running."""
    rpf.w32(hw.TACC_REG_LINKPM_L1_EXIT, 7)
    assert rpf.r32(hw.TACC_REG_LINKPM_L1_EXIT) == L1_EXIT
    assert rpf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC


@pytest.mark.parametrize("bad", ["aspm-l1-entry-ns=0", "aspm-l0s-entry-ns=0",
                                 "aspm-l1-exit-ns=1000001"])
def test_bad_aspm_properties_are_refused(bad):
    r = subprocess.run([str(QEMU), "-machine", "q35", "-accel", "qtest", "-display", "none",
                        "-nodefaults", "-L", "/usr/share/seabios", "-L", "/usr/share/qemu",
                        "-device", "tacc," + bad], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "aspm-" in r.stderr, r.stderr


def test_trace_record_t_fetch_is_the_doorbell(rdev, rpf):
    """The first command after idle: its trace record's t_start - t_fetch is the L1
    exit latency (t_fetch = when the fetch was issued), the next one's 100 ns later."""
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    rpf.trace_enable(size=256)
    rdev.qt.clock_step(100_000)
    _, ds = rpf.job_of(0, [desc(hw.TACC_OP_NOP), desc(hw.TACC_OP_NOP)])
    t_db = rdev.qt.clock()
    rpf.submit(0, ds)
    rdev.qt.clock_step(10_000)
    recs = rpf.trace_read(0, 2)
    assert [r.t_fetch for r in recs] == [t_db, t_db]
    assert [r.t_start - r.t_fetch for r in recs] == [L1_EXIT, L1_EXIT + 100]


# ------------------------------------------------------------- link faults ----
LNKSTA = 0x12


def lnk(d: Tacc, rp: bool, off: int) -> tuple[int, int]:
    """(speed code = generation, width) of LNKCAP (off 0x0C) or LNKSTA (0x12)."""
    bus, devfn, cap = exp(d, rp)
    v = d.qt.cfg_read(bus, devfn, cap + off, 4 if off == LNKCAP else 2)
    return v & 0xF, (v >> 4) & 0x3F


def copy_ticks(pf) -> int:
    src = pf.dev.alloc(N)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])  # TLB warm
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])
    return cq.end - cq.start


def test_link_degraded_at_run_time(rdev, rpf):
    """qom-set x-link-gen-now / x-link-width-now: the link retrains at Gen3 x4; the PF's
    Link Status, its root port's (which follows it) and BAR0 LINK_STATUS say so while
    LNKCAP / LINK_CAP keep Gen4 x16, and a copy takes the Gen3 x4 formula; 0 restores."""
    try:
        rdev.qom_set("x-link-gen-now", 3)
        rdev.qom_set("x-link-width-now", 4)
        assert (rdev.qom_get("x-link-gen-now"), rdev.qom_get("x-link-width-now")) == (3, 4)
        assert lnk(rdev, False, LNKSTA) == lnk(rdev, True, LNKSTA) == (3, 4)
        assert lnk(rdev, False, LNKCAP) == (4, 16)
        assert rpf.r32(hw.TACC_REG_LINK_STATUS) == 3 | 4 << hw.TACC_LINK_WIDTH_SHIFT
        assert rpf.r32(hw.TACC_REG_LINK_CAP) == 4 | 16 << hw.TACC_LINK_WIDTH_SHIFT
        slow = copy_ticks(rpf)
        assert abs(slow * 1000 - LinkModel(gen=3, width=4).copy_ps(N, True)) < 1000
    finally:
        rdev.qom_set("x-link-gen-now", 0)
        rdev.qom_set("x-link-width-now", 0)
    assert lnk(rdev, False, LNKSTA) == (4, 16)
    assert abs(copy_ticks(rpf) * 1000 - LinkModel().copy_ps(N, True)) < 1000


@pytest.mark.parametrize("prop,bad", [("x-link-width-now", 3), ("x-link-width-now", 32),
                                      ("x-link-gen-now", 2), ("x-link-gen-now", 5)])
def test_link_degrade_refuses_what_the_link_cannot_train_to(rdev, rpf, prop, bad):
    """Above capable (Gen4 x16), not a width, or below Gen3 (the model's 128b/130b
    encoding): a QMP error, the link unchanged."""
    with pytest.raises(Exception, match=prop):
        rdev.qom_set(prop, bad)
    assert lnk(rdev, False, LNKSTA) == (4, 16)


def test_enabling_l1_does_not_count_the_idle_before_it(rdev, rpf):
    """A link idle for 1 s with ASPM off, then L1 enabled (the root port first, the PF
    last, as Linux does): no L1 residency before the PF's write, and a copy 5 us later
    (under the entry threshold) pays nothing; disabling leaves L1 (an exit, no cost)."""
    src = rdev.alloc(N)
    rpf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])  # 1 s idle after
    b = lpm(rpf)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    assert delta(b, lpm(rpf)) == dict.fromkeys(b, 0)
    rdev.qt.clock_step(5_000)
    _, ds = rpf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, src, DEVMEM_VA, N)])
    t_db = rdev.qt.clock()
    rpf.submit(0, ds)
    rdev.qt.clock_step(100_000)
    (cq,) = rpf.cqes(0)
    assert cq.start == t_db
    b = lpm(rpf)  # in L1 now: 100 us idle
    set_aspm(rdev, 0, 0)
    d = delta(b, lpm(rpf))
    assert (d["l1_entries"], d["l1_exits"], d["exit_ticks"]) == (0, 1, 0), d


def test_virtio_submit_wakes_the_link_from_l1():
    """A virtio-tacc function's DMA crosses the PF's link: after 100 us idle with L1 on
    both ends, a submit of NOP jobs (no payload: only the request's descriptor and
    message reads reach the link) wakes the link from L1 and pays the L1 exit latency,
    as the PF's descriptor fetch does (before: the link stayed in L1, no exit)."""
    from tacc.testing.virtiodev import Job, VirtioTacc, device_arg

    d = Tacc("sriov-max-vfs=0", root_port="",
             extra=device_arg(props=f"devmem-base={192 << 20:#x},devmem-size={64 << 20:#x}"))
    try:
        v = VirtioTacc(d)
        assert v.init()
        c = v.ctx_create()
        set_aspm(d, ASPM_L1, ASPM_L1)
        pf = d.pf
        d.qt.clock_step(100_000)  # idle: the link enters L1
        assert pf.r32(hw.TACC_REG_LINKPM_STATE) & hw.TACC_LINKPM_STATE_MASK == hw.TACC_LINKPM_L1
        b = lpm(pf)
        v.submit([Job(c, 0, 1, [desc(hw.TACC_OP_NOP)], tag=0x19_0002)])
        [(st, nj, failed, _)] = v.wait_used()
        assert (st, nj, failed) == (0, 1, 0)
        dl = delta(b, lpm(pf))
        assert (dl["l1_exits"], dl["exit_ticks"]) == (1, L1_EXIT), dl
        assert v.cnt("ctrl_h2d_tlps") > 0  # the request's reads, counted as control traffic
    finally:
        d.close()


# ---------------------------------------------------- L1 PM Substates ----


def lpm_ss(pf) -> dict[str, int]:
    """L1.1/L1.2 counters (RO32 counts, RO64 residency) and what L1 counts too."""
    r = {n.lower(): pf.r32(getattr(hw, "TACC_REG_LINKPM_" + n))
         for n in ("L11_ENTRIES", "L11_EXITS", "L12_ENTRIES", "L12_EXITS")}
    r |= {n.lower(): pf.r64(getattr(hw, "TACC_REG_LINKPM_" + n))
          for n in ("L11_TICKS", "L12_TICKS", "L1_ENTRIES", "L1_EXITS", "L1_TICKS",
                    "EXIT_TICKS")}
    return r


def substate(pf) -> int:
    st = pf.r32(hw.TACC_REG_LINKPM_STATE)
    return (st & hw.TACC_LINKPM_SUB_MASK) >> hw.TACC_LINKPM_SUB_SHIFT


def test_l1ss_capability_on_both_ends_with_spec_layout(rdev, rpf):
    """Both ends have the L1 PM Substates extended capability (ID 0x1E, version 1):
    Capabilities: ASPM and PCI-PM L1.1/L1.2 and L1 PM Substates supported, Port
    Common_Mode_Restore_Time and T_POWER_ON of the properties; Control 1 and 2 are 0 and
    take exactly their defined fields; DEVCAP2 advertises LTR and DEVCTL2's LTR enable
    sticks (before 0006: no capability on either end, LTR not supported)."""
    qt = rdev.qt
    for rp, cmrt, tpon in ((True, RP_CMRT, RP_TPON), (False, PF_CMRT, PF_TPON)):
        bus, devfn, ss = l1ss_at(rdev, rp)
        assert ss, ("no L1 PM Substates capability", rp)
        assert (qt.cfg_read(bus, devfn, ss) >> 16) & 0xF == 1, rp
        cap = qt.cfg_read(bus, devfn, ss + L1SS_CAP)
        assert cap & 0x1F == 0x1F, (rp, hex(cap))
        assert (cap >> 8) & 0xFF == cmrt, (rp, hex(cap))
        assert ((cap >> 16) & 3, (cap >> 19) & 0x1F) == (0, tpon // 2), (rp, hex(cap))
        assert qt.cfg_read(bus, devfn, ss + L1SS_CTL1) == 0
        assert qt.cfg_read(bus, devfn, ss + L1SS_CTL2) == 0
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, 0xFFFF_FFFF)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL2, 0xFFFF_FFFF)
        # [3:0] enables, [15:8] Common_Mode_Restore_Time, [25:16] / [31:29] threshold
        assert qt.cfg_read(bus, devfn, ss + L1SS_CTL1) == 0xE3FF_FF0F, rp
        assert qt.cfg_read(bus, devfn, ss + L1SS_CTL2) == 0xFB, rp  # T_POWER_ON
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, 0)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL2, 0)
        _, _, pcie = exp(rdev, rp)
        assert qt.cfg_read(bus, devfn, pcie + DEVCAP2) & DEVCAP2_LTR, rp
    set_l1ss(rdev, SS_ALL, SS_ALL)
    for rp in (True, False):
        bus, devfn, pcie = exp(rdev, rp)
        assert qt.cfg_read(bus, devfn, pcie + DEVCTL2, 2) & DEVCTL2_LTR_EN, rp
    en = hw.TACC_LINKPM_EN_L1_1 | hw.TACC_LINKPM_EN_L1_2 | hw.TACC_LINKPM_LTR_L1_2
    assert rpf.r32(hw.TACC_REG_LINKPM_STATE) & en == en
    assert rpf.r32(hw.TACC_REG_LINKPM_L12_EXIT) == L12_EXIT
    assert rpf.r32(hw.TACC_REG_LINKPM_L12_THRESHOLD) == THRESHOLD
    assert rpf.r32(hw.TACC_REG_LINKPM_LTR) == 1_000_000
    assert rpf.r32(hw.TACC_REG_LINKPM_L11_EXIT) == L11_EXIT


def test_l1_2_exit_is_what_the_first_copy_after_idle_pays(rdev, rpf):
    """ASPM L1 and L1.2 on both ends, LTR on both ends, the device's LTR (1 ms) above
    the threshold (90112 ns): the idle link is in L1.2, and the first copy after idle
    starts exactly the L1.2 exit latency after its doorbell: L1.1's 4 us + T_POWER_ON
    44 us + Common_Mode_Restore_Time 40 us, the values the OS programmed; the copy itself
    lasts what it lasts with ASPM off."""
    set_l1ss(rdev, SS_ALL, SS_ALL)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    b0 = lpm_ss(rpf)
    cq, t_db, b, a = copy_after_idle(rdev, rpf, 200_000, L12_EXIT, exit_ns=L12_EXIT)
    assert cq.start - t_db == L12_EXIT
    assert abs((cq.end - cq.start) * 1000 - LinkModel().copy_ps(N, True)) < 1000
    d = delta(b, a)
    assert (d["l1_entries"], d["l1_exits"], d["exit_ticks"]) == (1, 1, L12_EXIT), d
    ss = delta(b_ss := lpm_ss(rpf), lpm_ss(rpf))
    assert ss == dict.fromkeys(b_ss, 0)  # reads change nothing
    rdev.qt.clock_step(cq.end + L1_ENTRY + 50_000 - rdev.qt.clock())
    assert substate(rpf) == hw.TACC_LINKPM_L1_2
    s = delta(b0, lpm_ss(rpf))
    assert (s["l12_entries"], s["l12_exits"], s["l11_entries"]) == (3, 2, 0), s
    assert s["l12_entries"] == s["l1_entries"] and s["l12_ticks"] == s["l1_ticks"], s
    assert 50_000 - 10 <= lpm_ss(rpf)["l12_ticks"] - b_ss["l12_ticks"] <= 50_000


def test_l1_1_only_pays_the_l1_1_exit(rdev, rpf):
    """ASPM L1.1 (not L1.2) on both ends: the link idles in L1.1 and the first copy pays
    aspm-l11-exit-ns; the L1.1 counters count it, the L1.2 ones stay."""
    set_l1ss(rdev, SS_ASPM_L11, SS_ASPM_L11)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    b = lpm_ss(rpf)
    cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, L11_EXIT, exit_ns=L11_EXIT)
    assert cq.start - t_db == L11_EXIT
    d = delta(b, lpm_ss(rpf))
    assert (d["l11_entries"], d["l11_exits"], d["l12_entries"]) == (2, 2, 0), d
    assert d["exit_ticks"] == 2 * L11_EXIT and d["l1_exits"] == 2, d
    assert d["l11_ticks"] == d["l1_ticks"] > 100_000 - L1_ENTRY - 1000, d


def test_l1_2_needs_ltr_at_or_above_the_threshold(rdev, rpf):
    """L1.1 and L1.2 on both ends, but LTR_L1.2_THRESHOLD programmed above the device's
    LTR (1023 x 33554432 ns = 34 s): L1.1, not L1.2; LTR disabled on the device (so it
    sends no LTR and ASPM L1.2 is not allowed): L1.1 as well."""
    set_l1ss(rdev, SS_ALL, SS_ALL, ctl1_timing=1023 << 16 | 5 << 29)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    assert not rpf.r32(hw.TACC_REG_LINKPM_STATE) & hw.TACC_LINKPM_LTR_L1_2
    cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, L11_EXIT, exit_ns=L11_EXIT)
    assert cq.start - t_db == L11_EXIT
    set_aspm(rdev, 0, 0)
    set_l1ss(rdev, SS_ALL, SS_ALL)
    bus, devfn, pcie = exp(rdev, False)
    v = rdev.qt.cfg_read(bus, devfn, pcie + DEVCTL2, 2)
    rdev.qt.cfg_write(bus, devfn, pcie + DEVCTL2, v & ~DEVCTL2_LTR_EN, 2)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    st = rpf.r32(hw.TACC_REG_LINKPM_STATE)
    assert not st & (hw.TACC_LINKPM_EN_L1_2 | hw.TACC_LINKPM_LTR_L1_2), hex(st)
    cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, L11_EXIT, exit_ns=L11_EXIT)
    assert cq.start - t_db == L11_EXIT


def test_l1ss_on_one_end_only_is_plain_l1(rdev, rpf):
    """The PF enables every substate, its root port none: the link uses plain L1 (L1.0)
    and pays the L1 exit latency; no L1.1/L1.2 entries."""
    set_l1ss(rdev, SS_ALL, 0)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    b = lpm_ss(rpf)
    cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, L1_EXIT, exit_ns=L1_EXIT)
    assert cq.start - t_db == L1_EXIT
    d = delta(b, lpm_ss(rpf))
    assert d["l1_exits"] == 2 and d["l11_entries"] == d["l12_entries"] == 0, d
    st = rpf.r32(hw.TACC_REG_LINKPM_STATE)
    assert not st & (hw.TACC_LINKPM_EN_L1_1 | hw.TACC_LINKPM_EN_L1_2), hex(st)


def test_l1ss_counters_are_global_counters(rdev, rpf):
    """The global counters (BAR2 page 1) say what the registers say, during L1.2."""
    set_l1ss(rdev, SS_ALL, SS_ALL)
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    rdev.qt.clock_step(100_000)
    s = lpm_ss(rpf)
    for reg in ("l11_entries", "l11_exits", "l11_ticks", "l12_entries", "l12_exits",
                "l12_ticks"):
        assert rpf.gcnt("link_" + reg) == s[reg], reg


@pytest.mark.parametrize("ctl1,ctl2", [
    (0xFFFF_FFFF, 0xFFFF_FFFF),  # threshold scale 7, T_POWER_ON scale 3: reserved
    (0x1F | 6 << 29, 3),
    (0xF | 0xFF << 8 | 0x3FF << 16 | 5 << 29, 0x1F << 3 | 2),  # the largest legal
])
def test_bad_l1ss_writes_never_crash_qemu(rdev, rpf, ctl1, ctl2):
    """Reserved scales, timing rewritten while L1.2 is enabled, byte writes across the
    registers: LOG_GUEST_ERROR, QEMU keeps running, the model goes on with what the
    registers hold (a reserved threshold scale: never L1.2, a reserved T_POWER_ON
    scale: 0 us); a copy after idle completes."""
    set_l1ss(rdev, SS_ALL, SS_ALL)
    qt = rdev.qt
    for rp in (True, False):
        bus, devfn, ss = l1ss_at(rdev, rp)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, ctl1)  # L1.2 is enabled: timing changes
        qt.cfg_write(bus, devfn, ss + L1SS_CTL2, ctl2)
        for off in range(ss + 6, ss + 0x11):
            qt.cfg_write(bus, devfn, off, qt.cfg_read(bus, devfn, off, 1) ^ 0x5A, 1)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL1, ctl1)
        qt.cfg_write(bus, devfn, ss + L1SS_CTL2, ctl2)
        qt.cfg_write(bus, devfn, ss + L1SS_CAP, 0)  # read-only
        assert qt.cfg_read(bus, devfn, ss + L1SS_CAP) & 0x1F == 0x1F
    assert rpf.r32(hw.TACC_REG_ID) == hw.TACC_ID_MAGIC
    set_aspm(rdev, ASPM_L1, ASPM_L1)
    st = rpf.r32(hw.TACC_REG_LINKPM_STATE)
    scale = ctl1 >> 29
    assert bool(st & hw.TACC_LINKPM_LTR_L1_2) == (scale <= 5 and 1_000_000 >= (
        (ctl1 >> 16) & 0x3FF) * 32 ** scale), hex(st)
    exit_ns = rpf.r32(hw.TACC_REG_LINKPM_L12_EXIT)
    tpon = [2, 10, 100, 0][ctl2 & 3] * ((ctl2 >> 3) & 0x1F)
    assert exit_ns == L11_EXIT + (tpon + ((ctl1 >> 8) & 0xFF)) * 1000
    want = exit_ns if st & hw.TACC_LINKPM_LTR_L1_2 else L11_EXIT
    cq, t_db, _, _ = copy_after_idle(rdev, rpf, 100_000, want, exit_ns=want)
    assert cq.status == hw.TACC_ST_OK and cq.start - t_db == want


def test_l1ss_off_has_neither_capability_nor_ltr():
    """l1ss=off (device) and x-l1ss=off,x-ltr=off (root port): no L1 PM Substates
    capability, DEVCAP2 without LTR, plain L1 only."""
    d = Tacc("sriov-max-vfs=0,l1ss=off", root_port="x-l1ss=off,x-ltr=off")
    try:
        for rp in (True, False):
            assert l1ss_at(d, rp)[2] == 0, rp
            bus, devfn, pcie = exp(d, rp)
            assert not d.qt.cfg_read(bus, devfn, pcie + DEVCAP2) & DEVCAP2_LTR, rp
    finally:
        d.close()


@pytest.mark.parametrize("dev,bad,msg", [
    ("tacc,l1ss-t-power-on-us=33", "", "T_POWER_ON 33 us"),
    ("tacc,aspm-l11-exit-ns=1000001", "", "aspm-"),
    ("pcie-root-port,id=rp0,chassis=1,x-l1ss-t-power-on-us=3101", "", "T_POWER_ON 3101"),
])
def test_bad_l1ss_properties_are_refused(dev, bad, msg):
    r = subprocess.run([str(QEMU), "-machine", "q35", "-accel", "qtest", "-display", "none",
                        "-nodefaults", "-L", "/usr/share/seabios", "-L", "/usr/share/qemu",
                        "-device", dev + bad], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and msg in r.stderr, r.stderr


def test_l1ss_capability_survives_reset_behind_sr_iov():
    """With SR-IOV (the default PF), the L1 PM Substates capability right after the
    SR-IOV capability (0x148 + 0x40) is intact after the machine's reset: QEMU 10.0's
    pcie_sriov_pf_reset wrote PCI_NUM_REGIONS (7) VF BAR quads from BAR0, 4 bytes past
    the capability's 0x40 bytes, zeroing the next capability's header (qemu/patches/0008)."""
    d = Tacc("", root_port="")
    try:
        caps, p = [], 0x100
        while p:
            h = d.qt.cfg_read(1, 0, p)
            caps.append((p, h & 0xFFFF))
            p = h >> 20
        assert caps == [(0x100, 0x01), (0x148, 0x10), (0x188, L1SS_ID)], caps
        assert d.qt.cfg_read(1, 0, 0x188 + L1SS_CAP) & 0x1F == 0x1F
    finally:
        d.close()
