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
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
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

/*
 * TACC_LINKPM_EN_* the link may use: both ends enable the state.  A device
 * on a root bus (an integrated endpoint) has no link, so no ASPM.
 */
uint32_t tacc_lpm_enabled(TaccState *s)
{
    PCIDevice *pdev = PCI_DEVICE(s);
    PCIDevice *up = pci_bridge_get_device(pci_get_bus(pdev));
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
    return en;
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

    *l0s_at = idle0 + tacc_scale_ps(s, (uint64_t)s->aspm_l0s_entry_ns * PS_PER_NS);
    *l1_at = idle0 + tacc_scale_ps(s, (uint64_t)s->aspm_l1_entry_ns * PS_PER_NS);
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
    if (st == TACC_LINKPM_L1) {
        v->l1_entries++;
        v->l1_ps += t - l1_at;
    }
    v->state = st;
}

/*
 * The counters as of @t without changing the model (register and counter
 * reads): the committed ones plus the idle period the link is in now.
 */
void tacc_lpm_view(TaccState *s, uint64_t t, TaccLinkPm *v)
{
    *v = s->lpm;
    v->state = TACC_LINKPM_L0;
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
    exit_ps = tacc_scale_ps(s, (uint64_t)(v.state == TACC_LINKPM_L1 ?
                                          s->aspm_l1_exit_ns :
                                          s->aspm_l0s_exit_ns) * PS_PER_NS);
    if (v.state == TACC_LINKPM_L1) {
        v.l1_exits++;
    } else {
        v.l0s_exits++;
    }
    v.exit_ps += exit_ps;
    tacc_counters_begin(s);
    s->lpm = v;
    s->lpm_wake_ps = t + exit_ps;
    trace_tacc_linkpm_exit(v.state, t / PS_PER_NS, exit_ps / PS_PER_NS);
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
    if (v.state == TACC_LINKPM_L1) {
        v.l1_exits++;
    } else if (v.state == TACC_LINKPM_L0S) {
        v.l0s_exits++;
    }
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
            tacc_lpm_enabled(s);
        break;
    case TACC_REG_LINKPM_L0S_EXIT & ~7ull:
        r = (uint64_t)s->aspm_l1_entry_ns << 32 | s->aspm_l0s_exit_ns;
        break;
    case TACC_REG_LINKPM_L1_EXIT & ~7ull:
        r = s->aspm_l1_exit_ns;
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

    /* QEMU's PCIExpLinkSpeed code is the generation (8 GT/s = 3), width the lanes */
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
