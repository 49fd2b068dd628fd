/*
 * tacc: link power management (ASPM L0s/L1) of the device's link.
 *
 * docs/hardware.md "Link power management (TACC_CAP_LINK_PM)".  The link
 * is one state machine (both directions together): it is idle from the end
 * of its last TLP (lpm_last_ps); after aspm-l0s-entry-ns of idleness it is
 * in L0s, after aspm-l1-entry-ns in L1, if both ends' Link Control enables
 * the state (ASPM Control of this device's PCIe capability AND of the
 * upstream port's: qemu/patches/0004 makes the pcie-root-port's writable).
 * The next TLP wakes it: the link is usable again only after the state's
 * exit latency (aspm-*-exit-ns, scaled by time-scale), which that TLP and
 * every transfer behind it pay.  States are resolved lazily, when the next
 * TLP comes (tacc_lpm_wake) or a register is read (tacc_lpm_view).
 *
 * L1 PM Substates (docs/hardware.md "L1 PM Substates"): the link enters L1
 * in the substate both ends' L1 PM Substates Control 1 allow: L1.2 when
 * ASPM L1.2 is enabled on both ends, LTR on both ends (DEVCTL2) and the
 * latency tolerance this device reports (ltr-latency-ns) is at least both
 * ends' LTR_L1.2_THRESHOLD; else L1.1 if ASPM L1.1 is enabled on both ends;
 * else L1.0 (plain L1).  Leaving L1.1 costs aspm-l11-exit-ns, L1.2 that plus
 * T_POWER_ON (the larger of both ends' L1SS Control 2) and the root port's
 * Common_Mode_Restore_Time (its L1SS Control 1): what the OS programmed.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "qemu/range.h"
#include "qapi/error.h"
#include "qapi/visitor.h"
#include "hw/pci/pci_bridge.h"
#include "hw/pci/pcie.h"
#include "tacc.h"
#include "trace.h"

/* ASPM Control bits (LNKCTL[1:0]) of @d's PCIe capability */
static uint16_t tacc_lpm_aspmc(PCIDevice *d)
{
    if (!d || !pci_is_express(d) || !d->exp.exp_cap) {
        return 0;
    }
    return pci_get_word(d->config + d->exp.exp_cap + PCI_EXP_LNKCTL) &
           PCI_EXP_LNKCTL_ASPMC;
}

/* L1 PM Substates register @reg of @d (0: no such capability) */
static uint32_t tacc_lpm_l1ss(PCIDevice *d, int reg)
{
    uint16_t pos;

    if (!d || !pci_is_express(d)) {
        return 0;
    }
    pos = pcie_find_capability(d, PCI_EXT_CAP_ID_L1SS);
    return pos ? pci_get_long(d->config + pos + reg) : 0;
}

/* LTR_L1.2_THRESHOLD of an L1SS Control 1 value, ns (scales 6, 7: reserved) */
static uint64_t tacc_lpm_l12_threshold(uint32_t ctl1)
{
    static const uint64_t unit_ns[] = { 1, 32, 1024, 32768, 1048576, 33554432 };
    uint32_t scale = (ctl1 & PCI_L1SS_CTL1_LTR_L12_TH_SCALE) >>
                     ctz32(PCI_L1SS_CTL1_LTR_L12_TH_SCALE);
    uint64_t value = (ctl1 & PCI_L1SS_CTL1_LTR_L12_TH_VALUE) >>
                     ctz32(PCI_L1SS_CTL1_LTR_L12_TH_VALUE);

    return scale < ARRAY_SIZE(unit_ns) ? value * unit_ns[scale] : UINT64_MAX;
}

/* The link's upstream port (NULL: @s is on a root bus, it has no link) */
static PCIDevice *tacc_lpm_up(TaccState *s)
{
    return pci_bridge_get_device(pci_get_bus(PCI_DEVICE(s)));
}

/* LTR_L1.2_THRESHOLD in effect, ns: the larger of both ends' */
static uint64_t tacc_lpm_threshold(TaccState *s)
{
    return MAX(tacc_lpm_l12_threshold(tacc_lpm_l1ss(PCI_DEVICE(s),
                                                    PCI_L1SS_CTL1)),
               tacc_lpm_l12_threshold(tacc_lpm_l1ss(tacc_lpm_up(s),
                                                    PCI_L1SS_CTL1)));
}

/*
 * L1.2 exit latency as programmed, ns: L1.1's, then T_POWER_ON (the larger
 * of both ends' L1SS Control 2) and the Common_Mode_Restore_Time of the
 * root port's L1SS Control 1 (Linux programs it in the downstream port).
 */
static uint64_t tacc_lpm_l12_exit_ns(TaccState *s)
{
    PCIDevice *up = tacc_lpm_up(s);
    uint32_t t_power_on = MAX(
        pcie_l1ss_t_power_on_us(tacc_lpm_l1ss(PCI_DEVICE(s), PCI_L1SS_CTL2)),
        pcie_l1ss_t_power_on_us(tacc_lpm_l1ss(up, PCI_L1SS_CTL2)));
    uint32_t cm_restore = (tacc_lpm_l1ss(up, PCI_L1SS_CTL1) &
                           PCI_L1SS_CTL1_CM_RESTORE_TIME) >>
                          ctz32(PCI_L1SS_CTL1_CM_RESTORE_TIME);

    return s->aspm_l11_exit_ns + (uint64_t)(t_power_on + cm_restore) * 1000;
}

/* TACC_LINKPM_EN_L1_1, _EN_L1_2, _LTR_L1_2 of the link */
static uint32_t tacc_lpm_l1ss_enabled(TaccState *s, PCIDevice *up)
{
    PCIDevice *pdev = PCI_DEVICE(s);
    uint32_t both = tacc_lpm_l1ss(pdev, PCI_L1SS_CTL1) &
                    tacc_lpm_l1ss(up, PCI_L1SS_CTL1);
    uint32_t en = 0;

    if (both & PCI_L1SS_CTL1_ASPM_L1_1) {
        en |= TACC_LINKPM_EN_L1_1;
    }
    if ((both & PCI_L1SS_CTL1_ASPM_L1_2) && pcie_cap_is_ltr_enabled(pdev) &&
        pcie_cap_is_ltr_enabled(up)) {
        en |= TACC_LINKPM_EN_L1_2;
    }
    if (pcie_cap_is_ltr_enabled(pdev) && s->ltr_ns >= tacc_lpm_threshold(s)) {
        en |= TACC_LINKPM_LTR_L1_2;     /* its LTR messages allow L1.2 */
    }
    return en;
}

/*
 * TACC_LINKPM_EN_* the link may use: both ends enable the state.  A device
 * on a root bus (an integrated endpoint) has no link, so no ASPM.
 */
uint32_t tacc_lpm_enabled(TaccState *s)
{
    PCIDevice *pdev = PCI_DEVICE(s);
    PCIDevice *up = tacc_lpm_up(s);
    uint16_t both = tacc_lpm_aspmc(pdev) & tacc_lpm_aspmc(up);
    uint32_t en = 0;

    if (!up) {
        return 0;
    }
    if (both & PCI_EXP_LNKCTL_ASPM_L0S) {
        en |= TACC_LINKPM_EN_L0S;
    }
    if (both & PCI_EXP_LNKCTL_ASPM_L1) {
        en |= TACC_LINKPM_EN_L1;
    }
    return en | tacc_lpm_l1ss_enabled(s, up);
}

/* The L1 substate the link enters with @en: L1.2, else L1.1, else L1.0 */
static int tacc_lpm_sub(uint32_t en)
{
    if ((en & TACC_LINKPM_EN_L1_2) && (en & TACC_LINKPM_LTR_L1_2)) {
        return TACC_LINKPM_L1_2;
    }
    return en & TACC_LINKPM_EN_L1_1 ? TACC_LINKPM_L1_1 : TACC_LINKPM_L1_0;
}

/*
 * The state the link has reached at @t (>= its wake time) with @en, and
 * since when: L1 after l1 entry, else L0s after l0s entry, else L0.
 */
static int tacc_lpm_state_at(TaccState *s, uint32_t en, uint64_t t,
                             uint64_t *l0s_at, uint64_t *l1_at)
{
    uint64_t idle0 = MAX(s->lpm_last_ps, s->lpm_wake_ps);
    int st = TACC_LINKPM_L0;

    *l0s_at = idle0 +
              tacc_scale_ps(s, (uint64_t)s->aspm_l0s_entry_ns * PS_PER_NS);
    *l1_at = idle0 +
             tacc_scale_ps(s, (uint64_t)s->aspm_l1_entry_ns * PS_PER_NS);
    if (t <= idle0) {
        return st;
    }
    if ((en & TACC_LINKPM_EN_L0S) && t >= *l0s_at &&
        (!(en & TACC_LINKPM_EN_L1) || *l0s_at < *l1_at)) {
        st = TACC_LINKPM_L0S;
    }
    if ((en & TACC_LINKPM_EN_L1) && t >= *l1_at) {
        st = TACC_LINKPM_L1;
    }
    return st;
}

/*
 * Add the idle period that ends at @t to @v: the entries it made and the
 * residency it had up to @t (L0s until L1 was entered, if it was).
 */
static void tacc_lpm_account(TaccState *s, uint32_t en, uint64_t t,
                             TaccLinkPm *v)
{
    uint64_t l0s_at, l1_at;
    int st = tacc_lpm_state_at(s, en, t, &l0s_at, &l1_at);
    bool l0s = (en & TACC_LINKPM_EN_L0S) && t >= l0s_at &&
               (!(en & TACC_LINKPM_EN_L1) || l0s_at < l1_at);

    if (l0s) {
        v->l0s_entries++;
        v->l0s_ps += (st == TACC_LINKPM_L1 ? l1_at : t) - l0s_at;
    }
    v->sub = TACC_LINKPM_L1_0;
    if (st == TACC_LINKPM_L1) {
        v->l1_entries++;
        v->l1_ps += t - l1_at;
        v->sub = tacc_lpm_sub(en);      /* entered with L1 */
    }
    if (v->sub == TACC_LINKPM_L1_1) {
        v->l11_entries++;
        v->l11_ps += t - l1_at;
    } else if (v->sub == TACC_LINKPM_L1_2) {
        v->l12_entries++;
        v->l12_ps += t - l1_at;
    }
    v->state = st;
}

/* @v's state is left: count the exit (of L1, and of its substate) */
static void tacc_lpm_count_exit(TaccLinkPm *v)
{
    if (v->state == TACC_LINKPM_L0S) {
        v->l0s_exits++;
    } else if (v->state == TACC_LINKPM_L1) {
        v->l1_exits++;
        v->l11_exits += v->sub == TACC_LINKPM_L1_1;
        v->l12_exits += v->sub == TACC_LINKPM_L1_2;
    }
}

/* Exit latency of @v's state, ns (before time-scale) */
static uint64_t tacc_lpm_exit_ns(TaccState *s, const TaccLinkPm *v)
{
    if (v->state == TACC_LINKPM_L0S) {
        return s->aspm_l0s_exit_ns;
    }
    switch (v->sub) {
    case TACC_LINKPM_L1_1:
        return s->aspm_l11_exit_ns;
    case TACC_LINKPM_L1_2:
        return tacc_lpm_l12_exit_ns(s);
    }
    return s->aspm_l1_exit_ns;
}

/*
 * The counters as of @t without changing the model (register and counter
 * reads): the committed ones plus the idle period the link is in now.
 */
void tacc_lpm_view(TaccState *s, uint64_t t, TaccLinkPm *v)
{
    *v = s->lpm;
    v->state = TACC_LINKPM_L0;
    v->sub = TACC_LINKPM_L1_0;
    if (t >= s->lpm_wake_ps) {
        tacc_lpm_account(s, tacc_lpm_enabled(s), t, v);
    }
}

/*
 * A TLP is to be sent at @t: if the link is in L0s or L1, it leaves the
 * state now and is usable after the exit latency.  Returns the time the
 * link can carry the TLP (>= t).
 */
uint64_t tacc_lpm_wake(TaccState *s, uint64_t t)
{
    uint32_t en;
    uint64_t exit_ps;
    TaccLinkPm v;

    if (t < s->lpm_wake_ps) {
        return s->lpm_wake_ps;          /* already leaving a state */
    }
    en = tacc_lpm_enabled(s);
    if (!en || t <= s->lpm_last_ps) {
        return t;
    }
    v = s->lpm;
    tacc_lpm_account(s, en, t, &v);
    if (v.state == TACC_LINKPM_L0) {
        return t;
    }
    exit_ps = tacc_scale_ps(s, tacc_lpm_exit_ns(s, &v) * PS_PER_NS);
    tacc_lpm_count_exit(&v);
    v.exit_ps += exit_ps;
    tacc_counters_begin(s);
    s->lpm = v;
    s->lpm_wake_ps = t + exit_ps;
    trace_tacc_linkpm_exit(v.state, v.sub, t / PS_PER_NS, exit_ps / PS_PER_NS);
    return s->lpm_wake_ps;
}

/*
 * The PF's Link Control is written (the OS changes ASPM Control): what the
 * link did until now counts with the old enables (a link in L0s/L1 that is
 * no longer allowed to be there leaves it, with no TLP to pay the exit), and
 * the idle period restarts now, so a state just enabled is entered an entry
 * threshold from now, not retroactively.  Linux writes the upstream port
 * first when it enables ASPM and the PF first when it disables it, so the
 * PF's write is when the link's enables change.
 */
void tacc_lpm_settle(TaccState *s, uint64_t t)
{
    TaccLinkPm v = s->lpm;

    if (t < s->lpm_wake_ps) {
        return;
    }
    tacc_lpm_account(s, tacc_lpm_enabled(s), t, &v);
    tacc_lpm_count_exit(&v);
    tacc_counters_begin(s);
    s->lpm = v;
    tacc_lpm_busy(s, t);
}

/* The link carries traffic until @end_ps: it is not idle before that. */
void tacc_lpm_busy(TaccState *s, uint64_t end_ps)
{
    s->lpm_last_ps = MAX(s->lpm_last_ps, end_ps);
}

/* Global counters of the link's power states, as of @t (ps). */
void tacc_lpm_counters(TaccState *s, uint64_t t)
{
    TaccLinkPm v;

    tacc_lpm_view(s, t, &v);
    s->gcnt[TACC_CNT_link_l0s_entries] = v.l0s_entries;
    s->gcnt[TACC_CNT_link_l0s_exits] = v.l0s_exits;
    s->gcnt[TACC_CNT_link_l0s_ticks] = v.l0s_ps / PS_PER_NS;
    s->gcnt[TACC_CNT_link_l1_entries] = v.l1_entries;
    s->gcnt[TACC_CNT_link_l1_exits] = v.l1_exits;
    s->gcnt[TACC_CNT_link_l1_ticks] = v.l1_ps / PS_PER_NS;
    s->gcnt[TACC_CNT_link_pm_exit_ticks] = v.exit_ps / PS_PER_NS;
    s->gcnt[TACC_CNT_link_l11_entries] = v.l11_entries;
    s->gcnt[TACC_CNT_link_l11_exits] = v.l11_exits;
    s->gcnt[TACC_CNT_link_l11_ticks] = v.l11_ps / PS_PER_NS;
    s->gcnt[TACC_CNT_link_l12_entries] = v.l12_entries;
    s->gcnt[TACC_CNT_link_l12_exits] = v.l12_exits;
    s->gcnt[TACC_CNT_link_l12_ticks] = v.l12_ps / PS_PER_NS;
}

/* PF BAR0 0x700..0x77f; false: not a register of this block */
bool tacc_lpm_reg_read(TaccState *s, hwaddr addr, unsigned size,
                       uint64_t *val)
{
    TaccLinkPm v;
    uint64_t r;

    tacc_lpm_view(s, tacc_now_ps(s), &v);
    switch (addr & ~7ull) {
    case TACC_REG_LINKPM_STATE & ~7ull:
        r = (uint64_t)s->aspm_l0s_entry_ns << 32 | v.state |
            v.sub << TACC_LINKPM_SUB_SHIFT | tacc_lpm_enabled(s);
        break;
    case TACC_REG_LINKPM_L0S_EXIT & ~7ull:
        r = (uint64_t)s->aspm_l1_entry_ns << 32 | s->aspm_l0s_exit_ns;
        break;
    case TACC_REG_LINKPM_L1_EXIT & ~7ull:
        r = (uint64_t)s->aspm_l11_exit_ns << 32 | s->aspm_l1_exit_ns;
        break;
    case TACC_REG_LINKPM_L0S_ENTRIES:
        r = v.l0s_entries;
        break;
    case TACC_REG_LINKPM_L0S_EXITS:
        r = v.l0s_exits;
        break;
    case TACC_REG_LINKPM_L0S_TICKS:
        r = v.l0s_ps / PS_PER_NS;
        break;
    case TACC_REG_LINKPM_L1_ENTRIES:
        r = v.l1_entries;
        break;
    case TACC_REG_LINKPM_L1_EXITS:
        r = v.l1_exits;
        break;
    case TACC_REG_LINKPM_L1_TICKS:
        r = v.l1_ps / PS_PER_NS;
        break;
    case TACC_REG_LINKPM_EXIT_TICKS:
        r = v.exit_ps / PS_PER_NS;
        break;
    case TACC_REG_LINKPM_L11_ENTRIES:       /* and L11_EXITS: RO32 each */
        r = v.l11_exits << 32 | (uint32_t)v.l11_entries;
        break;
    case TACC_REG_LINKPM_L11_TICKS:
        r = v.l11_ps / PS_PER_NS;
        break;
    case TACC_REG_LINKPM_L12_ENTRIES:       /* and L12_EXITS */
        r = v.l12_exits << 32 | (uint32_t)v.l12_entries;
        break;
    case TACC_REG_LINKPM_L12_TICKS:
        r = v.l12_ps / PS_PER_NS;
        break;
    case TACC_REG_LINKPM_L12_EXIT:          /* and L12_THRESHOLD */
        r = (uint64_t)MIN(tacc_lpm_threshold(s), UINT32_MAX) << 32 |
            MIN(tacc_lpm_l12_exit_ns(s), UINT32_MAX);
        break;
    case TACC_REG_LINKPM_LTR:
        r = s->ltr_ns;
        break;
    default:
        return false;
    }
    if (size == 4) {
        r = (addr & 4) ? r >> 32 : (uint32_t)r;
    } else if (addr & 7) {
        return false;
    }
    *val = r;
    return true;
}

/* Device creation and device reset: the link is retrained, in L0, idle. */
void tacc_lpm_reset(TaccState *s)
{
    memset(&s->lpm, 0, sizeof(s->lpm));
    s->lpm_wake_ps = 0;
    s->lpm_last_ps = tacc_now_ps(s);
}

/*
 * LNKCAP code of an exit latency (PCIe r5.0 7.5.3.6): the smallest code c
 * with ns < base << c (L0s: base 64 ns, L1: 1 us), 7 = "more than".
 */
static uint32_t tacc_lpm_code(uint32_t ns, uint32_t base)
{
    uint32_t c = 0;

    while (c < 7 && ns >= (base << c)) {
        c++;
    }
    return c;
}

/*
 * The PCIe capability's ASPM fields: LNKCAP L0s + L1 with the exit
 * latencies of the properties, DEVCAP acceptable latencies "no limit" (the
 * device tolerates any exit latency, so the OS's ASPM latency check
 * passes), ASPM Control writable in Link Control.
 */
void tacc_lpm_init_cap(TaccState *s, PCIDevice *pdev)
{
    uint8_t *exp = pdev->config + pdev->exp.exp_cap;

    pci_long_test_and_clear_mask(exp + PCI_EXP_LNKCAP,
                                 PCI_EXP_LNKCAP_ASPMS | PCI_EXP_LNKCAP_L0SEL |
                                 PCI_EXP_LNKCAP_L1EL);
    pci_long_test_and_set_mask(exp + PCI_EXP_LNKCAP,
        PCI_EXP_LNKCAP_ASPM_L0S | PCI_EXP_LNKCAP_ASPM_L1 |
        tacc_lpm_code(s->aspm_l0s_exit_ns, 64) << ctz32(PCI_EXP_LNKCAP_L0SEL) |
        tacc_lpm_code(s->aspm_l1_exit_ns, 1000) << ctz32(PCI_EXP_LNKCAP_L1EL));
    pci_long_test_and_set_mask(exp + PCI_EXP_DEVCAP,
                               PCI_EXP_DEVCAP_L0S | PCI_EXP_DEVCAP_L1);
    pci_word_test_and_set_mask(pdev->wmask + pdev->exp.exp_cap + PCI_EXP_LNKCTL,
                               PCI_EXP_LNKCTL_ASPMC);
}

/*
 * L1 PM Substates (docs/hardware.md "L1 PM Substates"): the capability
 * (ASPM and PCI-PM L1.1/L1.2, Port Common_Mode_Restore_Time and T_POWER_ON
 * of the l1ss-* properties) at @offset and the LTR mechanism ASPM L1.2
 * needs (DEVCAP2 LTR, DEVCTL2 LTR enable writable): qemu/patches/0006.
 */
bool tacc_lpm_init_l1ss(TaccState *s, PCIDevice *pdev, uint16_t offset,
                        Error **errp)
{
    if (!s->l1ss) {
        return true;
    }
    pcie_cap_ltr_init(pdev);
    return pcie_l1ss_init(pdev, offset, s->l1ss_cm_restore_us,
                          s->l1ss_t_power_on_us, errp);
}

/*
 * Does a config write at @addr, @len touch @size bytes at @off of a
 * capability at @cap?
 */
static bool tacc_lpm_hits(uint32_t addr, int len, uint16_t cap, int off,
                          int size)
{
    return cap && ranges_overlap(addr, len, cap + off, size);
}

/*
 * A config write of the PF is about to happen: if it may change what the
 * link may enter (Link Control, DEVCTL2's LTR enable, L1SS Control 1/2),
 * settle the link with the old enables first (tacc_lpm_settle).  Returns
 * L1SS Control 1 before the write, for tacc_lpm_config_written.
 */
uint32_t tacc_lpm_config_write(TaccState *s, PCIDevice *pdev, uint32_t addr,
                               int len)
{
    uint16_t exp = pdev->exp.exp_cap;
    uint16_t l1ss = pcie_find_capability(pdev, PCI_EXT_CAP_ID_L1SS);

    if (tacc_lpm_hits(addr, len, exp, PCI_EXP_LNKCTL, 2) ||
        tacc_lpm_hits(addr, len, exp, PCI_EXP_DEVCTL2, 2) ||
        tacc_lpm_hits(addr, len, l1ss, PCI_L1SS_CTL1, 8)) {
        tacc_lpm_settle(s, tacc_now_ps(s));
    }
    return tacc_lpm_l1ss(pdev, PCI_L1SS_CTL1);
}

/*
 * The write is done: a value the spec reserves, or L1.2 timing changed while
 * L1.2 was enabled (PCIe r5.0 7.8.3.3: undefined), is the guest's error; the
 * model goes on with what the register holds (a reserved threshold scale:
 * L1.2 never entered; a reserved T_POWER_ON scale: 0 us).
 */
void tacc_lpm_config_written(TaccState *s, PCIDevice *pdev, uint32_t addr,
                             int len, uint32_t old_ctl1)
{
    uint16_t l1ss = pcie_find_capability(pdev, PCI_EXT_CAP_ID_L1SS);
    uint32_t ctl1 = tacc_lpm_l1ss(pdev, PCI_L1SS_CTL1);
    uint32_t ctl2 = tacc_lpm_l1ss(pdev, PCI_L1SS_CTL2);
    uint32_t timing = PCI_L1SS_CTL1_CM_RESTORE_TIME |
                      PCI_L1SS_CTL1_LTR_L12_TH_VALUE |
                      PCI_L1SS_CTL1_LTR_L12_TH_SCALE;

    if (!tacc_lpm_hits(addr, len, l1ss, PCI_L1SS_CTL1, 8)) {
        return;
    }
    if (tacc_lpm_l12_threshold(ctl1) == UINT64_MAX) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: L1SS Control 1 0x%x: "
                      "LTR_L1.2_THRESHOLD scale %u is reserved\n", ctl1,
                      ctl1 >> ctz32(PCI_L1SS_CTL1_LTR_L12_TH_SCALE));
    }
    if ((ctl2 & PCI_L1SS_CTL2_T_PWR_ON_SCALE) == 3) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: L1SS Control 2 0x%x: "
                      "T_POWER_ON scale 3 is reserved\n", ctl2);
    }
    if ((old_ctl1 & PCI_L1SS_CTL1_L1_2_MASK) &&
        ((old_ctl1 ^ ctl1) & timing)) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: L1SS Control 1 0x%x -> 0x%x: "
                      "L1.2 timing changed while L1.2 is enabled\n",
                      old_ctl1, ctl1);
    }
}

/* Device reset: LTR and the L1 PM Substates controls are 0 (link retrains) */
void tacc_lpm_reset_l1ss(PCIDevice *pdev)
{
    pcie_cap_ltr_reset(pdev);
    pcie_l1ss_reset(pdev);
}

/* ------------------------------------------------------- link faults ---- */

/*
 * Speed/width degradation at run time (docs/hardware.md "Link faults"): QOM
 * x-link-gen-now / x-link-width-now (qom-set; 0 = as capable) retrain the
 * link at a lower rate or width.  Link Status (the PCIe capability's, which
 * the root port's follows on read, pcie_sync_bridge_lnk, and BAR0
 * LINK_STATUS) shows it, and the link model times every transfer from then
 * on with it; transfers already timed keep their times.  LNKCAP and BAR0
 * LINK_CAP keep the capable values.
 */
static void tacc_link_lnksta(TaccState *s)
{
    PCIDevice *pdev = PCI_DEVICE(s);
    uint8_t *exp = pdev->config + pdev->exp.exp_cap;

    /* QEMU's PCIExpLinkSpeed code is the generation (8 GT/s = 3) */
    pci_word_test_and_clear_mask(exp + PCI_EXP_LNKSTA,
                                 PCI_EXP_LNKSTA_CLS | PCI_EXP_LNKSTA_NLW);
    pci_word_test_and_set_mask(exp + PCI_EXP_LNKSTA,
                               QEMU_PCI_EXP_LNKSTA_NLW(s->lnk_width) |
                               QEMU_PCI_EXP_LNKSTA_CLS(s->lnk_gen));
}

static void tacc_get_link_now(Object *obj, Visitor *v, const char *name,
                              void *opaque, Error **errp)
{
    TaccState *s = TACC(obj);
    uint8_t val = opaque ? s->lnk_width : s->lnk_gen;

    visit_type_uint8(v, name, &val, errp);
}

static void tacc_set_link_now(Object *obj, Visitor *v, const char *name,
                              void *opaque, Error **errp)
{
    TaccState *s = TACC(obj);
    bool width = opaque;
    uint8_t cap = width ? s->link_width : s->link_gen, val;

    if (!visit_type_uint8(v, name, &val, errp)) {
        return;
    }
    val = val ? val : cap;
    if (width ? !is_power_of_2(val) || val > cap : val < 3 || val > cap) {
        error_setg(errp, "%s: %s (capable: %u; 0 = capable)", name,
                   width ? "lanes 1, 2, 4, 8, 16" : "generation 3..5", cap);
        return;
    }
    if (!DEVICE(obj)->realized) {
        error_setg(errp, "%s: set at run time (qom-set)", name);
        return;
    }
    tacc_sched_run(s);          /* what happened until now, at the old rate */
    if (width) {
        s->lnk_width = val;
    } else {
        s->lnk_gen = val;
    }
    tacc_link_lnksta(s);
    trace_tacc_link_retrain(s->lnk_gen, s->lnk_width);
}

void tacc_link_fault_props(Object *obj)
{
    object_property_add(obj, "x-link-gen-now", "uint8", tacc_get_link_now,
                        tacc_set_link_now, NULL, NULL);
    object_property_add(obj, "x-link-width-now", "uint8", tacc_get_link_now,
                        tacc_set_link_now, NULL, (void *)1);
}
