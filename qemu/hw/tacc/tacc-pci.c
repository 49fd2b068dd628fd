/*
 * tacc: emulated PCIe ML accelerator - PCI functions.
 *
 * PF "tacc" (-device tacc) and VF "tacc-vf" (created by SR-IOV, not user
 * creatable).  Both are a TaccFunc: own BAR0 registers, BAR2 counters, BAR4
 * MSI-X, queues, contexts, trace and sample rings.  The PF's TaccState also
 * holds what all functions share: device memory, engines, link, TLB.
 *
 * Vendor 0x7acc / devices 0x0001 (PF), 0x0002 (VF) are NOT allocated by the
 * PCI-SIG: private IDs of an emulated device.
 *
 * Fault injection (qom-set at run time on the PF):
 *   x-fi-hang-engine=N   engine N stops completing (-1: none; clearing resumes)
 *   x-fi-fail-next-dma   the next command data DMA fails (self-clearing)
 *   x-fi-corrupt-next-cqe the next CQE is written corrupted (self-clearing)
 *   x-fi-fatal           fatal error on every function (until function reset)
 *   x-fi-tlb-inv-stall   TLB_INV neither invalidates nor completes (until cleared)
 * Ground truth (qom-get, read-only): x-gt-* properties, see docs/hardware.md.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "qemu/units.h"
#include "qemu/module.h"
#include "qapi/error.h"
#include "qapi/visitor.h"
#include "hw/pci/msi.h"
#include "hw/pci/msix.h"
#include "hw/pci/pcie.h"
#include "hw/pci/pcie_aer.h"
#include "hw/pci/pcie_sriov.h"
#include "hw/pci/pci_host.h"
#include "hw/qdev-properties.h"
#include "migration/vmstate.h"
#include "block/aio-wait.h"
#include "tacc.h"
#include "trace.h"

#define TACC_PM_CAP         0x40
#define TACC_MSIX_CAP       0x60
#define TACC_EXP_CAP        0x80
#define TACC_AER_CAP        0x100
#define TACC_SRIOV_CAP      0x148   /* after AER (PCI_ERR_SIZEOF) */
#define TACC_L1SS_CAP       0x188   /* after SR-IOV (its SIZEOF) */

/* ---------------------------------------------------------- helpers ---- */

/* Device time, ns: the virtual clock, continued across a migration. */
int64_t tacc_dev_ns(TaccState *s)
{
    return qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL) + s->dev_clock_off;
}

uint64_t tacc_now_ps(TaccState *s)
{
    return (uint64_t)tacc_dev_ns(s) * PS_PER_NS;
}

TaccFunc *tacc_func(TaccState *s, int fn)
{
    PCIDevice *vf;

    if (fn == 0) {
        return &s->func;
    }
    if (fn == TACC_FN_VIRTIO) {
        return s->virtio;
    }
    if (fn > s->total_vfs) {
        return NULL;
    }
    vf = pcie_sriov_get_vf_at_index(PCI_DEVICE(s), fn - 1);
    return vf ? TACC_FUNC(vf) : NULL;
}

static uint8_t tacc_pm_state(PCIDevice *pdev)
{
    return pci_get_word(pdev->config + pdev->pm_cap + PCI_PM_CTRL) &
           PCI_PM_CTRL_STATE_MASK;
}

/* Enabled (VF), powered (D0) */
bool tacc_func_active(TaccFunc *f)
{
    PCIDevice *pdev;

    if (f->ops) {
        return f->ops->active(f);
    }
    pdev = PCI_DEVICE(f);
    return pdev->enabled && tacc_pm_state(pdev) == 0;
}

void tacc_window(TaccFunc *f, uint64_t *base, uint64_t *size)
{
    TaccState *s = f->pf;
    uint64_t b, sz;

    if (!f->fn) {
        *base = 0;
        *size = s->devmem_size;
        return;
    }
    if (f->fn == TACC_FN_VIRTIO) {
        b = s->virtio_mem_base;
        sz = s->virtio_mem_size;
    } else {
        b = s->vf_mem_base[f->fn - 1];
        sz = s->vf_mem_size[f->fn - 1];
    }
    if (b > s->devmem_size || sz > s->devmem_size - b) {
        b = sz = 0;         /* invalid partition: no device memory */
    }
    *base = b;
    *size = sz;
}

/* The DMA address space of a function: its own, behind the vIOMMU. */
AddressSpace *tacc_func_as(TaccFunc *f)
{
    return f->ops ? f->ops->dma_as(f) : pci_get_address_space(PCI_DEVICE(f));
}

/*
 * A memory request of the device never becomes a configuration request: the
 * host bridge's ECAM window is decoded for the CPU, not for DMA (an inbound
 * request there is an Unsupported Request on real root complexes).  QEMU's
 * q35 would route it to config space, where a CQE or a fence could power the
 * device's slot off, reset it or eject it in the middle of its own
 * operation.  True if [addr, addr + len) reaches a host bridge's registers.
 */
static bool tacc_dma_reaches_host_bridge(AddressSpace *as, hwaddr addr,
                                         hwaddr len, bool write)
{
    RCU_READ_LOCK_GUARD();
    while (len) {
        hwaddr xlat, l = len;
        MemoryRegion *mr = address_space_translate(as, addr, &xlat, &l, write,
                                                   MEMTXATTRS_UNSPECIFIED);

        if (mr->owner && object_dynamic_cast(mr->owner, TYPE_PCI_HOST_BRIDGE)) {
            return true;
        }
        if (!l) {
            break;
        }
        addr += l;
        len -= l;
    }
    return false;
}

static bool tacc_config_dma_refused(TaccFunc *f, AddressSpace *as,
                                    uint64_t addr, uint64_t len, bool write)
{
    if (!tacc_dma_reaches_host_bridge(as, addr, len, write)) {
        return false;
    }
    qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d: DMA %s 0x%" PRIx64 "+%" PRIu64
                  " reaches the host bridge's config window: refused "
                  "(Unsupported Request)\n", f->fn, write ? "write" : "read",
                  addr, len);
    f->pf->config_dma_refused++;
    return true;
}

MemTxResult tacc_func_dma(TaccFunc *f, uint64_t addr, void *buf, uint64_t len,
                          bool write)
{
    AddressSpace *as = tacc_func_as(f);
    TaccState *s = f->pf;
    MemTxResult r;

    if (tacc_config_dma_refused(f, as, addr, len, write)) {
        return MEMTX_DECODE_ERROR;
    }
    if (write) {
        tacc_vfmig_dirty(f, addr, len);     /* a VF's, when logged */
    }
    s->dma_depth++;
    r = dma_memory_rw(as, addr, buf, len,
                      write ? DMA_DIRECTION_FROM_DEVICE
                            : DMA_DIRECTION_TO_DEVICE,
                      MEMTXATTRS_UNSPECIFIED);
    s->dma_depth--;
    return r;
}

/* Per-VF policy (TACC_CAP_VF_POLICY): the queues function f may enable. */
uint32_t tacc_queue_mask(TaccFunc *f)
{
    /* the PF and the virtio function (TACC_FN_VIRTIO) have every queue */
    return f->fn && f->fn <= TACC_MAX_VFS ? f->pf->vf_queue_mask[f->fn - 1]
                                          : TACC_QUEUE_MASK_ALL;
}

/*
 * Reset values of the PF's per-VF policy: no window, weight 1 and, with
 * @masks, all queues.  The queue masks are writable only while VF Enable
 * is clear, so they survive a PF reset that leaves the VFs enabled.
 */
void tacc_policy_reset(TaccState *s, bool masks)
{
    memset(s->vf_mem_base, 0, sizeof(s->vf_mem_base));
    memset(s->vf_mem_size, 0, sizeof(s->vf_mem_size));
    memset(s->deficit, 0, sizeof(s->deficit));
    for (int i = 0; i < TACC_NUM_FUNCS; i++) {
        s->arb_weight[i] = 1;
    }
    for (int i = 0; i < TACC_MAX_VFS && masks; i++) {
        s->vf_queue_mask[i] = TACC_QUEUE_MASK_ALL;
    }
}

void tacc_msix_notify(TaccFunc *f, unsigned vector)
{
    PCIDevice *pdev;

    if (f->ops) {
        f->ops->notify(f, vector);
        return;
    }
    pdev = PCI_DEVICE(f);
    if (msix_enabled(pdev)) {
        MSIMessage msg = msix_get_message(pdev, vector);

        /* a message aimed at ECAM is a DMA like any other (tacc_func_dma) */
        if (!msix_is_masked(pdev, vector) &&
            tacc_config_dma_refused(f, pci_get_address_space(pdev),
                                    msg.address, 4, true)) {
            return;
        }
        f->pf->dma_depth++;
        msix_notify(pdev, vector);
        f->pf->dma_depth--;
        tacc_link_ctrl(f, true, msg.address, TACC_LINK_MSI_BYTES);
        tacc_counters_begin(f->pf);
        f->cnt[TACC_CNT_irqs]++;
        f->pf->gt.irqs++;
        trace_tacc_irq(f->fn, vector);
    }
}

/* Raise the vectors of @causes (already set in IRQ_STATUS and unmasked). */
void tacc_irq_fire(TaccFunc *f, uint32_t causes)
{
    if (causes & ~(TACC_IRQ_TRACE | TACC_IRQ_SAMPLE)) {
        tacc_msix_notify(f, TACC_MSIX_ERROR);
    }
    if (causes & (TACC_IRQ_TRACE | TACC_IRQ_SAMPLE)) {
        tacc_msix_notify(f, TACC_MSIX_TRACE);
    }
}

void tacc_irq_cause(TaccFunc *f, uint32_t cause)
{
    f->irq_status |= cause;
    tacc_irq_fire(f, cause & f->irq_mask);
}

/*
 * Re-entrancy.  The guest chooses where the device's DMA, write-backs and
 * MSI-X messages go, and may aim them at the registers (or the config space
 * through ECAM) of any function of this very device, which would then change
 * queues, contexts or resets under a command in progress.  QEMU's
 * MemReentrancyGuard only covers the function whose MMIO is being
 * dispatched; tacc work also runs from timers and crosses functions (PF and
 * VFs share engines).  So every entry point (BAR accesses, config writes,
 * timers, QOM actions) counts itself in the PF's state, the scheduler counts
 * too (in_run), and an access that arrives while one is active can only be
 * the device's own: it is refused (writes dropped, reads return 0).
 */
/* CPU time of the calling thread (the main loop, or a vCPU holding the BQL) */
static int64_t tacc_thread_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * NANOSECONDS_PER_SECOND + ts.tv_nsec;
}

bool tacc_enter(TaccState *s, TaccFunc *f, const char *what)
{
    if (s->depth || s->in_run) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d: re-entrant %s refused (the device's own "
                      "DMA or MSI-X aimed at its registers)\n", f->fn, what);
        trace_tacc_reentrant(f->fn, what);
        s->reentrant_refused++;
        return false;
    }
    if (!s->depth++) {
        s->turn_cpu_t0 = tacc_thread_cpu_ns();
        s->turn_what = what;
    }
    return true;
}

void tacc_leave(TaccState *s)
{
    assert(s->depth);
    if (!--s->depth) {
        int64_t ns = tacc_thread_cpu_ns() - s->turn_cpu_t0;

        s->entry_cpu_ns += ns;
        if (ns > (int64_t)s->worst_turn_ns) {
            s->worst_turn_ns = ns;
            trace_tacc_worst_turn(s->turn_what, ns);
        }
    }
}

/* Function reset: CTRL.RESET, FLR, D3hot->D0, VF enable/disable. */
void tacc_func_reset(TaccFunc *f)
{
    TaccState *s = f->pf;

    trace_tacc_func_reset(f->fn);
    tacc_func_abort_all(f);
    f->ctrl = 0;
    f->status_fatal = 0;
    f->irq_status = f->irq_mask = f->scratch = 0;
    memset(f->ptbr, 0, sizeof(f->ptbr));
    f->fault_addr = f->fault_tag = 0;
    f->fault_info = 0;
    f->tlb_inv_seq = f->tlb_inv_done = 0;
    f->trace_base = f->trace_wb = 0;
    f->trace_size = f->trace_ctrl = f->trace_prod = f->trace_cons = 0;
    f->trace_dropped = f->trace_seq = 0;
    f->sample_base = f->sample_wb = f->sample_seq = 0;
    f->sample_size = f->sample_period = f->sample_prod = f->sample_cons = 0;
    f->sample_dropped = 0;
    timer_del(&f->sample_timer);
    tacc_counters_begin(s);
    memset(f->cnt, 0, sizeof(f->cnt));
    memset(f->busy_ps, 0, sizeof(f->busy_ps));
    f->stall_ps = 0;
    if (s->tlb) {
        tacc_tlb_invalidate(s, f->fn, -1);
    }
    if (!f->fn) {
        tacc_tlpcap_reset(s);
        tacc_vfmig_reset(s);
        tacc_policy_reset(s, !pcie_sriov_num_vfs(PCI_DEVICE(s)));
        if (!s->virtio_window_busy || !s->virtio_window_busy(s->virtio)) {
            s->virtio_mem_base = s->virtio_mem_reset[0];
            s->virtio_mem_size = s->virtio_mem_reset[1];
        }
    }
    if (!s->in_run) {
        tacc_sched_poll(s);
    }
}

static void tacc_fatal(TaccState *s)
{
    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        TaccFunc *f = tacc_func(s, fn);
        if (!f) {
            continue;
        }
        for (int q = 0; q < TACC_NUM_QUEUES; q++) {
            tacc_queue_reset(f, q);
            f->q[q].ctrl = 0;
        }
        f->status_fatal = 1;
        tacc_irq_cause(f, TACC_IRQ_FATAL);
    }
    /* and an AER uncorrectable internal error from the PF */
    {
        PCIEAERErr err = {
            .status = PCI_ERR_UNC_INTN,
            .source_id = pci_requester_id(PCI_DEVICE(s)),
        };
        pcie_aer_inject_error(PCI_DEVICE(s), &err);
    }
    tacc_sched_poll(s);
}

/* ------------------------------------------------------ config space ---- */

/* DEVCTL's MPS/MRRS at power-on: the mps/mrrs properties (firmware's) */
static void tacc_devctl_preset(TaccState *s, PCIDevice *pdev)
{
    uint8_t *exp = pdev->config + pdev->exp.exp_cap;
    unsigned mps = ctz32(s->mps_cap) - 7, mrrs = ctz32(s->mrrs_cap) - 7;

    pci_word_test_and_clear_mask(exp + PCI_EXP_DEVCTL,
                                 PCI_EXP_DEVCTL_PAYLOAD |
                                 PCI_EXP_DEVCTL_READRQ);
    pci_word_test_and_set_mask(exp + PCI_EXP_DEVCTL, mps << 5 | mrrs << 12);
    if (!pci_is_vf(pdev)) {     /* the link's: a VF's realize leaves them */
        s->mps = s->mps_cap;
        s->mrrs = s->mrrs_cap;
    }
}

/*
 * The PF's DEVCTL was written: the link model takes its Max_Payload_Size and
 * Max_Read_Request_Size from now on, up to what the device supports (an MPS
 * above DEVCAP's is a software error: PCIe r6.0 7.5.3.4; reserved encodings
 * too), for transfers timed after the write.
 */
static void tacc_link_params_update(TaccState *s, PCIDevice *pdev)
{
    uint16_t ctl = pci_get_word(pdev->config + pdev->exp.exp_cap +
                                PCI_EXP_DEVCTL);
    unsigned mps_code = (ctl & PCI_EXP_DEVCTL_PAYLOAD) >> 5;
    unsigned rrq_code = (ctl & PCI_EXP_DEVCTL_READRQ) >> 12;
    uint32_t mps = mps_code <= 5 ? 128u << mps_code : 4096;
    uint32_t mrrs = rrq_code <= 5 ? 128u << rrq_code : 4096;

    if (mps > s->mps_cap || mps_code > 5) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: Device Control MPS code %u above the supported %u bytes\n",
                      mps_code, s->mps_cap);
    }
    if (rrq_code > 5) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: Device Control MRRS code %u is reserved\n",
                      rrq_code);
    }
    s->mps = MIN(mps, s->mps_cap);
    s->mrrs = MIN(mrrs, s->mrrs_cap);   /* the DMA engine's largest request */
    trace_tacc_link_params(s->mps, s->mrrs);
}

static void tacc_write_config_locked(PCIDevice *pdev, uint32_t addr,
                                     uint32_t val, int len)
{
    TaccFunc *f = TACC_FUNC(pdev);
    uint8_t old = tacc_pm_state(pdev), new;
    uint32_t l1ss_ctl1 = 0;

    if (!pci_is_vf(pdev)) {
        /* ASPM Control, LTR or L1 PM Substates may change (tacc-linkpm.c) */
        l1ss_ctl1 = tacc_lpm_config_write(f->pf, pdev, addr, len);
    }
    pci_default_write_config(pdev, addr, val, len);
    if (!pci_is_vf(pdev)) {
        tacc_lpm_config_written(f->pf, pdev, addr, len, l1ss_ctl1);
    }
    if (!pci_is_vf(pdev) && pdev->exp.exp_cap &&
        ranges_overlap(addr, len, pdev->exp.exp_cap + PCI_EXP_DEVCTL, 2)) {
        tacc_link_params_update(f->pf, pdev);
    }
    pcie_aer_write_config(pdev, addr, val, len);
    pcie_cap_flr_write_config(pdev, addr, val, len);
    new = tacc_pm_state(pdev);
    if (old != new) {
        trace_tacc_pm(f->fn, old, new);
        if (new == 3) {
            /* D3hot: the device stops and loses its queue state */
            tacc_func_abort_all(f);
            timer_del(&f->sample_timer);
            tacc_sched_poll(f->pf);
        } else if (new == 0) {
            tacc_func_reset(f);     /* No_Soft_Reset = 0 */
        }
    }
}

static void tacc_write_config(PCIDevice *pdev, uint32_t addr, uint32_t val,
                              int len)
{
    TaccFunc *f = TACC_FUNC(pdev);

    if (!tacc_enter(f->pf, f, "config write")) {
        return;
    }
    tacc_write_config_locked(pdev, addr, val, len);
    tacc_leave(f->pf);
}

/* A device reset of one function (machine, bus, slot power, FLR). */
static void tacc_device_reset(TaccFunc *f)
{
    DeviceState *dev = DEVICE(f);
    PCIDevice *pdev = PCI_DEVICE(dev);

    tacc_func_reset(f);
    if (!pci_is_vf(pdev)) {
        pcie_sriov_pf_reset(pdev);
        tacc_policy_reset(TACC(dev), true);
        /* the link retrains: L0, ASPM disabled */
        pci_word_test_and_clear_mask(pdev->config + pdev->exp.exp_cap +
                                     PCI_EXP_LNKCTL, PCI_EXP_LNKCTL_ASPMC);
        tacc_lpm_reset_l1ss(pdev);
        tacc_lpm_reset(TACC(dev));
        /*
         * A device reset returns MPS/MRRS to the presets; an FLR leaves them
         * (PCIe r6.0 6.6.2: FLR does not modify Max_Payload_Size; QEMU runs
         * this with DEVCTL's Initiate FLR bit still set).
         */
        if (!(pci_get_word(pdev->config + pdev->exp.exp_cap + PCI_EXP_DEVCTL) &
              PCI_EXP_DEVCTL_BCR_FLR)) {
            tacc_devctl_preset(TACC(dev), pdev);
        }
    }
}

/*
 * Resets that arrive while the device is inside its own operation (the
 * scheduler, one of its DMAs or MSI-X messages: another device's side effect
 * of them) would pull queues and units from under it.  They are deferred to
 * a guarded bottom half; the PCI core has already reset config space (bus
 * mastering is off), the device's own state follows right after.
 */
static void tacc_reset_bh(void *opaque)
{
    TaccState *s = opaque;
    uint32_t pending = s->reset_pending;

    s->reset_pending = 0;
    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        TaccFunc *f = tacc_func(s, fn);

        if ((pending & BIT(fn)) && f && !f->ops) {
            tacc_device_reset(f);
        }
    }
}

static void tacc_reset_hold(Object *obj, ResetType type)
{
    TaccFunc *f = TACC_FUNC(obj);
    TaccState *s = f->pf;

    if (s && (s->in_run || s->dma_depth) && s->reset_bh) {
        trace_tacc_reset_deferred(f->fn);
        s->reset_pending |= BIT(f->fn);
        qemu_bh_schedule(s->reset_bh);
        return;
    }
    if (s) {
        s->reset_pending &= ~BIT(f->fn);
    }
    tacc_device_reset(f);
}

/* ------------------------------------------------------- quiescing ---- */

/*
 * Finish the host work the device has in progress: the model's big
 * copies/eltwise/FILL/GEMM gathers (inline, as a register read would), every
 * GEMM in the thread pool (its result waits in host memory for the command's
 * modelled completion; the main AioContext is polled until its completion
 * callback has run), the aborted GEMMs still in the pool and a deferred
 * reset.  Modelled time is not changed by it.  Then the device has nothing
 * running on the host and its state can be saved (tacc-vmstate.c).  Called
 * when the VM stops, never while it runs.
 */
void tacc_quiesce(TaccState *s)
{
    if (s->reset_pending && !s->in_run && !s->dma_depth) {
        tacc_reset_bh(s);
    }
    if (!tacc_enter(s, &s->func, "quiesce")) {
        return;
    }
    for (;;) {
        tacc_sched_run(s);      /* may complete a GEMM or dispatch one */
        if (!tacc_gemm_busy(s)) {
            break;
        }
        AIO_WAIT_WHILE(NULL, tacc_gemm_busy(s));
    }
    tacc_leave(s);
    trace_tacc_quiesce(tacc_dev_ns(s));
}

/*
 * The VM stops (a migration's last stage, a snapshot, a pause): quiesce,
 * before the last pass over RAM, so the data the host work wrote is in it.
 * The device writes its memory through a pointer, not the memory API, so
 * all of it is marked dirty for that pass (zero pages cost little).
 */
static void tacc_vm_state_change(void *opaque, bool running, RunState state)
{
    TaccState *s = opaque;

    if (running) {
        if (s->mig_reclock) {
            tacc_vmstate_reclock(s);
        }
        /* a stop the source began counts here too (it is migrated) */
        if (s->vm_stop_host_ns) {
            int64_t d = qemu_clock_get_ns(QEMU_CLOCK_HOST) - s->vm_stop_host_ns;

            s->vm_paused_ns += MAX(d, 0);
            s->vm_stop_host_ns = 0;
            trace_tacc_vm_resumed(d, s->vm_paused_ns);
        }
        return;
    }
    if (!s->vm_stop_host_ns) {
        s->vm_stop_host_ns = qemu_clock_get_ns(QEMU_CLOCK_HOST);
    }
    tacc_quiesce(s);
    memory_region_set_dirty(&s->devmem_mr, 0, s->devmem_size);
}

/* ----------------------------------------------------------- realize ---- */

/*
 * VF BARs: 64-bit prefetchable, so a bridge's (64-bit) prefetchable window can
 * hold them; every driver maps them uncached (docs/hardware.md section 1).
 */
#define TACC_VF_BAR_TYPE        (PCI_BASE_ADDRESS_SPACE_MEMORY | \
                                 PCI_BASE_ADDRESS_MEM_TYPE_64 | \
                                 PCI_BASE_ADDRESS_MEM_PREFETCH)

static bool tacc_init_func(TaccFunc *f, Error **errp)
{
    PCIDevice *pdev = PCI_DEVICE(f);
    TaccState *s = f->pf;
    uint8_t t;
    int ret;

    pdev->config[PCI_INTERRUPT_PIN] = 0;
    pdev->config_write = tacc_write_config;

    memory_region_init_io(&f->bar0, OBJECT(f), &tacc_bar0_ops, f, "tacc-regs",
                          TACC_BAR_REGS_SIZE);
    memory_region_init_io(&f->bar2, OBJECT(f), &tacc_bar2_ops, f,
                          "tacc-counters", TACC_BAR_COUNTERS_SIZE);
    memory_region_init(&f->bar4, OBJECT(f), "tacc-msix", TACC_MSIX_BAR_SIZE);
    /*
     * VF BARs are 64-bit prefetchable (what vfio-pci and a VMM expect); they
     * are registered with their type, which needs qemu/patches/0002 on 10.0.
     */
    t = pci_is_vf(pdev) ? TACC_VF_BAR_TYPE :
        PCI_BASE_ADDRESS_SPACE_MEMORY | PCI_BASE_ADDRESS_MEM_TYPE_64;
    pci_register_bar(pdev, TACC_BAR_REGS, t, &f->bar0);
    pci_register_bar(pdev, TACC_BAR_COUNTERS, t, &f->bar2);
    pci_register_bar(pdev, TACC_BAR_MSIX, t, &f->bar4);
    ret = msix_init(pdev, TACC_MSIX_VECTORS, &f->bar4, TACC_BAR_MSIX, 0,
                    &f->bar4, TACC_BAR_MSIX, TACC_MSIX_PBA_OFFSET,
                    TACC_MSIX_CAP,
                    errp);
    if (ret < 0) {
        return false;
    }
    for (int v = 0; v < TACC_MSIX_VECTORS; v++) {
        msix_vector_use(pdev, v);
    }

    if (pci_pm_init(pdev, TACC_PM_CAP, errp) < 0) {
        goto err_msix;
    }
    pci_set_word(pdev->config + pdev->pm_cap + PCI_PM_PMC, PCI_PM_CAP_VER_1_2);
    pci_set_word(pdev->wmask + pdev->pm_cap + PCI_PM_CTRL,
                 PCI_PM_CTRL_STATE_MASK);

    if (pcie_endpoint_cap_init(pdev, TACC_EXP_CAP) < 0) {
        error_setg(errp, "tacc: PCIe capability");
        goto err_msix;
    }
    pcie_cap_fill_link_ep_usp(pdev, s->link_width,
                              s->link_gen == 3 ? QEMU_PCI_EXP_LNK_8GT :
                              s->link_gen == 5 ? QEMU_PCI_EXP_LNK_32GT :
                              QEMU_PCI_EXP_LNK_16GT);
    /*
     * Advertise the mps property as supported (DEVCAP), preset MPS/MRRS in
     * DEVCTL to the properties (as firmware would) and let the OS program
     * both (the PF's; a VF's are RsvdP): the timing model uses what DEVCTL
     * holds, up to the properties (tacc_link_params_update, LINK_PARAMS).
     */
    {
        uint8_t *exp = pdev->config + pdev->exp.exp_cap;
        unsigned mps = ctz32(s->mps_cap) - 7;

        pci_long_test_and_clear_mask(exp + PCI_EXP_DEVCAP,
                                     PCI_EXP_DEVCAP_PAYLOAD);
        pci_long_test_and_set_mask(exp + PCI_EXP_DEVCAP, mps);
        tacc_devctl_preset(s, pdev);
        if (!pci_is_vf(pdev)) {
            pci_word_test_and_set_mask(pdev->wmask + pdev->exp.exp_cap +
                                       PCI_EXP_DEVCTL,
                                       PCI_EXP_DEVCTL_PAYLOAD |
                                       PCI_EXP_DEVCTL_READRQ);
        }
    }
    if (!pci_is_vf(pdev)) {
        tacc_lpm_init_cap(s, pdev);     /* ASPM L0s + L1 (tacc-linkpm.c) */
        s->lnk_gen = s->link_gen;       /* trained at full speed and width */
        s->lnk_width = s->link_width;
    }
    pcie_cap_flr_init(pdev);
    pcie_cap_deverr_init(pdev);
    if (pcie_aer_init(pdev, PCI_ERR_VER, TACC_AER_CAP, PCI_ERR_SIZEOF,
                      errp) < 0) {
        goto err_exp;
    }

    timer_init_ns(&f->sample_timer, QEMU_CLOCK_VIRTUAL, tacc_sample_timer, f);
    return true;

err_exp:
    pcie_cap_exit(pdev);
err_msix:
    msix_unuse_all_vectors(pdev);
    msix_uninit(pdev, &f->bar4, &f->bar4);
    return false;
}

static void tacc_exit_func(TaccFunc *f)
{
    PCIDevice *pdev = PCI_DEVICE(f);

    timer_del(&f->sample_timer);
    msix_unuse_all_vectors(pdev);
    msix_uninit(pdev, &f->bar4, &f->bar4);
    pcie_aer_exit(pdev);
    pcie_cap_exit(pdev);
}

static void tacc_pf_realize(PCIDevice *pdev, Error **errp)
{
    TaccState *s = TACC(pdev);
    TaccFunc *f = &s->func;

    if (s->link_gen < 3 || s->link_gen > 5) {
        error_setg(errp, "tacc: link-gen must be 3, 4 or 5");
        return;
    }
    if (!s->link_width || s->link_width > 16 || !is_power_of_2(s->link_width)) {
        error_setg(errp, "tacc: link-width must be 1, 2, 4, 8 or 16");
        return;
    }
    if (!is_power_of_2(s->mps_cap) || s->mps_cap < 128 || s->mps_cap > 4096 ||
        !is_power_of_2(s->mrrs_cap) || s->mrrs_cap < 128 ||
        s->mrrs_cap > 4096) {
        error_setg(errp, "tacc: mps/mrrs must be powers of two in 128..4096");
        return;
    }
    if (!s->aspm_l0s_entry_ns || !s->aspm_l1_entry_ns ||
        s->aspm_l0s_exit_ns > 1000000 || s->aspm_l1_exit_ns > 1000000 ||
        s->aspm_l11_exit_ns > 1000000) {
        error_setg(errp, "tacc: aspm-*-entry-ns must be >= 1, "
                   "aspm-*-exit-ns <= 1000000");
        return;
    }
    if (s->rcb != 64 && s->rcb != 128) {
        error_setg(errp, "tacc: rcb must be 64 or 128");
        return;
    }
    if (s->tags < 1 || s->tags > 1024 || s->posted_credits < 1 ||
        s->posted_credits > 65536) {
        error_setg(errp, "tacc: tags must be 1..1024, posted-credits 1..65536");
        return;
    }
    if (s->posted_hdr_credits < 1 || s->posted_hdr_credits > 4096) {
        error_setg(errp, "tacc: posted-hdr-credits 1..4096");
        return;
    }
    if (s->total_vfs > TACC_MAX_VFS) {
        error_setg(errp, "tacc: at most %d VFs", TACC_MAX_VFS);
        return;
    }
    if (!s->tlb_entries || s->tlb_entries > 65536) {
        error_setg(errp, "tacc: tlb-entries must be 1..65536");
        return;
    }
    if (s->devmem_size < 4 * KiB || s->devmem_size > 16 * GiB) {
        error_setg(errp, "tacc: devmem-size must be 4 KiB .. 16 GiB");
        return;
    }

    f->pf = s;
    f->fn = 0;
    /*
     * Device memory is RAM of its own (lazily backed by the OS), registered
     * for migration under the device's path: it moves with guest RAM.
     */
    if (!memory_region_init_ram(&s->devmem_mr, OBJECT(s), "tacc.devmem",
                                s->devmem_size, errp)) {
        return;
    }
    s->devmem = memory_region_get_ram_ptr(&s->devmem_mr);
    s->tlb = g_new0(TaccTlbEntry, s->tlb_entries);
    tacc_policy_reset(s, true);
    timer_init_ns(&s->timer, QEMU_CLOCK_VIRTUAL, tacc_sched_timer, s);
    s->host_bh = qemu_bh_new_guarded(tacc_host_bh, s,
                                     &DEVICE(s)->mem_reentrancy_guard);
    s->reset_bh = qemu_bh_new_guarded(tacc_reset_bh, s,
                                      &DEVICE(s)->mem_reentrancy_guard);
    s->vfmig_bh = qemu_bh_new_guarded(tacc_vfmig_bh, s,
                                      &DEVICE(s)->mem_reentrancy_guard);

    if (!tacc_init_func(f, errp)) {
        goto err_mem;
    }
    if (s->total_vfs) {
        if (!pcie_sriov_pf_init(pdev, TACC_SRIOV_CAP, TYPE_TACC_VF,
                                TACC_PCI_DEVICE_ID_VF, s->total_vfs,
                                s->total_vfs, 1, 1, errp)) {
            goto err_func;
        }
        /* 64-bit prefetchable: docs/hardware.md section 1, qemu/patches/0002 */
        pcie_sriov_pf_init_vf_bar(pdev, TACC_BAR_REGS, TACC_VF_BAR_TYPE,
                                  TACC_BAR_REGS_SIZE);
        pcie_sriov_pf_init_vf_bar(pdev, TACC_BAR_COUNTERS, TACC_VF_BAR_TYPE,
                                  TACC_BAR_COUNTERS_SIZE);
        pcie_sriov_pf_init_vf_bar(pdev, TACC_BAR_MSIX, TACC_VF_BAR_TYPE,
                                  TACC_MSIX_BAR_SIZE);
    }
    if (!tacc_lpm_init_l1ss(s, pdev, TACC_L1SS_CAP, errp)) {  /* L1.1/L1.2 */
        goto err_sriov;
    }
    /* last: a realize that failed leaves no handler behind (exit is not run) */
    s->vmse = qemu_add_vm_change_state_handler(tacc_vm_state_change, s);
    return;

    /*
     * Undo in reverse, as tacc_pf_exit would (it is not run for a realize
     * that failed): the VFs leave the bus, the RAM block's migration name is
     * free for the next device in this slot, nothing stays allocated.
     */
err_sriov:
    if (s->total_vfs) {
        pcie_sriov_pf_exit(pdev);
    }
err_func:
    tacc_exit_func(f);
err_mem:
    qemu_bh_delete(s->vfmig_bh);
    s->vfmig_bh = NULL;
    qemu_bh_delete(s->reset_bh);
    s->reset_bh = NULL;
    qemu_bh_delete(s->host_bh);
    s->host_bh = NULL;
    g_free(s->tlb);
    s->tlb = NULL;
    vmstate_unregister_ram(&s->devmem_mr, DEVICE(s));
    s->devmem = NULL;
}

static void tacc_vf_realize(PCIDevice *pdev, Error **errp)
{
    TaccFunc *f = TACC_FUNC(pdev);

    f->pf = TACC(pcie_sriov_get_pf(pdev));
    f->fn = pcie_sriov_vf_number(pdev) + 1;
    tacc_init_func(f, errp);
}

static void tacc_pf_exit(PCIDevice *pdev)
{
    TaccState *s = TACC(pdev);

    /*
     * A guest can eject the PF (ACPI PCI hotplug, a slot powered off) even
     * while a virtio-tacc function drives it (device_del is refused then):
     * that function lets go of it first and stays broken until removed.
     */
    if (s->virtio) {
        s->virtio_detach(s->virtio);
        assert(!s->virtio);
    }
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        s->unit[i].busy = false;
        tacc_gemm_job_free(s, s->unit[i].res.gemm);
        s->unit[i].res.gemm = NULL;
        tacc_exec_drop(&s->unit[i].res);
    }
    s->host_unit = NULL;
    /* cancelled jobs still in the pool: their completion frees them alone */
    for (TaccGemmJob *j = s->orphans; j; j = j->next) {
        j->s = NULL;
    }
    s->orphans = NULL;
    if (s->vmse) {
        qemu_del_vm_change_state_handler(s->vmse);
        s->vmse = NULL;
    }
    tacc_vfmig_reset(s);                /* a SAVE or LOAD in progress ends */
    qemu_bh_delete(s->vfmig_bh);
    s->vfmig_bh = NULL;
    qemu_bh_delete(s->host_bh);
    qemu_bh_delete(s->reset_bh);
    s->reset_bh = NULL;
    timer_del(&s->timer);
    if (s->total_vfs) {
        pcie_sriov_pf_exit(pdev);
    }
    tacc_exit_func(&s->func);
    vmstate_unregister_ram(&s->devmem_mr, DEVICE(s));
    s->devmem = NULL;
    g_free(s->tlb);
}

static void tacc_vf_exit(PCIDevice *pdev)
{
    TaccFunc *f = TACC_FUNC(pdev);

    tacc_func_abort_all(f);
    tacc_vfmig_vf_gone(f->pf, f->fn);
    tacc_exit_func(f);
}

/* ------------------------------------------- QOM: faults, ground truth ---- */

static void tacc_get_hang(Object *obj, Visitor *v, const char *name,
                          void *opaque, Error **errp)
{
    visit_type_int32(v, name, &TACC(obj)->fi_hang_engine, errp);
}

static void tacc_set_hang(Object *obj, Visitor *v, const char *name,
                          void *opaque, Error **errp)
{
    TaccState *s = TACC(obj);
    int32_t val;

    if (!visit_type_int32(v, name, &val, errp)) {
        return;
    }
    if (val < -1 || val >= TACC_NUM_ENGINES) {
        error_setg(errp, "x-fi-hang-engine: -1 or 0..%d", TACC_NUM_ENGINES - 1);
        return;
    }
    trace_tacc_fi_hang(val);
    s->fi_hang_engine = val;
    if (val < 0) {
        /* resumed engines finish no earlier than now */
        uint64_t now = tacc_now_ps(s);
        for (int e = 0; e < TACC_NUM_ENGINES; e++) {
            s->unit[e].next_ps = MAX(s->unit[e].next_ps, now);
        }
    }
    tacc_sched_poll(s);
}

static bool tacc_get_fail_dma(Object *obj, Error **errp)
{
    return TACC(obj)->fi_fail_next_dma;
}

static void tacc_set_fail_dma(Object *obj, bool v, Error **errp)
{
    TACC(obj)->fi_fail_next_dma = v;
}

static bool tacc_get_corrupt(Object *obj, Error **errp)
{
    return TACC(obj)->fi_corrupt_next_cqe;
}

static void tacc_set_corrupt(Object *obj, bool v, Error **errp)
{
    TACC(obj)->fi_corrupt_next_cqe = v;
}

static bool tacc_get_fatal(Object *obj, Error **errp)
{
    return TACC(obj)->fi_fatal;
}

static void tacc_set_fatal(Object *obj, bool v, Error **errp)
{
    TaccState *s = TACC(obj);

    s->fi_fatal = v;
    if (v && qdev_is_realized(DEVICE(obj)) &&
        tacc_enter(s, &s->func, "x-fi-fatal")) {
        trace_tacc_fi_fatal();
        tacc_fatal(s);
        tacc_leave(s);
    }
}

static bool tacc_get_tlb_stall(Object *obj, Error **errp)
{
    return TACC(obj)->fi_tlb_inv_stall;
}

static void tacc_set_tlb_stall(Object *obj, bool v, Error **errp)
{
    TACC(obj)->fi_tlb_inv_stall = v;
}

typedef struct TaccGtProp {
    const char *name;
    size_t off;             /* in TaccState */
    bool ps_to_ns;
} TaccGtProp;

#define GT(n, f)        { n, offsetof(TaccState, gt.f), false }
#define GT_NS(n, f)     { n, offsetof(TaccState, gt.f), true }
static const TaccGtProp tacc_gt_props[] = {
    GT("x-gt-h2d-bytes", h2d_bytes),
    GT("x-gt-d2h-bytes", d2h_bytes),
    GT("x-gt-h2d-link-bytes", h2d_link_bytes),
    GT("x-gt-d2h-link-bytes", d2h_link_bytes),
    GT_NS("x-gt-busy-ns-dma-h2d", busy_ps[0]),
    GT_NS("x-gt-busy-ns-dma-d2h", busy_ps[1]),
    GT_NS("x-gt-busy-ns-compute0", busy_ps[2]),
    GT_NS("x-gt-busy-ns-compute1", busy_ps[3]),
    GT_NS("x-gt-busy-ns-compute2", busy_ps[4]),
    GT_NS("x-gt-busy-ns-compute3", busy_ps[5]),
    GT("x-gt-trace-records", trace_records),
    GT("x-gt-trace-dropped", trace_dropped),
    GT("x-gt-cmds", cmds),
    GT("x-gt-jobs", jobs),
    GT("x-gt-mmu-faults", faults),
    GT("x-gt-dma-errors", dma_errors),
    GT("x-gt-irqs", irqs),
    GT("x-gt-flops", flops),
};

static void tacc_get_gt(Object *obj, Visitor *v, const char *name,
                        void *opaque, Error **errp)
{
    TaccState *s = TACC(obj);
    const TaccGtProp *p = opaque;
    uint64_t val;

    tacc_sched_run(s);
    val = *(uint64_t *)((uint8_t *)s + p->off);
    if (p->ps_to_ns) {
        val /= PS_PER_NS;
    }
    visit_type_uint64(v, name, &val, errp);
}

static void tacc_get_link_busy(Object *obj, Visitor *v, const char *name,
                               void *opaque, Error **errp)
{
    TaccState *s = TACC(obj);
    uint64_t val;

    tacc_sched_run(s);
    val = s->link_busy_ps[opaque ? 1 : 0] / PS_PER_NS;
    visit_type_uint64(v, name, &val, errp);
}

#define TACC_TIME_SCALE_MAX     10000000u  /* 10,000x slower than nominal */

static void tacc_get_time_scale(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    visit_type_uint32(v, name, &TACC(obj)->time_scale, errp);
}

/*
 * time-scale is settable at run time too (qom-set): commands already timed
 * keep their times, later ones use the new scale.  Tests use it to give the
 * device the host/device balance of real hardware for one workload.
 */
static void tacc_set_time_scale(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    uint32_t val;

    if (!visit_type_uint32(v, name, &val, errp)) {
        return;
    }
    if (val < 1 || val > TACC_TIME_SCALE_MAX) {
        error_setg(errp, "time-scale: 1..%u (x 1000)", TACC_TIME_SCALE_MAX);
        return;
    }
    trace_tacc_time_scale(val);
    TACC(obj)->time_scale = val;
}

/*
 * x-gemm-wait: the model is stopped at a GEMM's completion whose thread-pool
 * worker has not finished, or whose completion callback has not resumed the
 * model yet (tacc-sched.c "host work").  Tests poll it to let such a
 * completion happen before they read the CQ.  It does not move the model (a
 * read would finish a sliced copy inline).
 */
static bool tacc_get_gemm_wait(Object *obj, Error **errp)
{
    TaccState *s = TACC(obj);

    return s->host_unit && s->host_gemm;
}

/*
 * x-worst-turn-ns: the most CPU time one entry into the device (a register
 * access, a doorbell, a slice of host work, a timer, a virtio kick) took on
 * the thread that made it, since creation or the last write (any value
 * resets it and x-entry-cpu-ns, the sum over all entries, to 0).  Such an
 * entry holds the main loop (or the BQL) for that long: docs/hardware.md
 * section 9, "Host work".
 */
static void tacc_get_worst_turn(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    visit_type_uint64(v, name, opaque ? &TACC(obj)->entry_cpu_ns :
                      &TACC(obj)->worst_turn_ns, errp);
}

static void tacc_set_worst_turn(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    uint64_t val;

    if (visit_type_uint64(v, name, &val, errp)) {
        TACC(obj)->worst_turn_ns = 0;
        TACC(obj)->entry_cpu_ns = 0;
    }
}

static void tacc_get_host_slice(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    visit_type_size(v, name, &TACC(obj)->host_slice, errp);
}

/*
 * x-host-slice is settable at run time too (qom-set): the host work of a
 * big copy/eltwise/FILL/gather takes the new slice from its next main-loop
 * turn on.  Modelled time does not depend on it (tacc-sched.c "host work").
 */
static void tacc_set_host_slice(Object *obj, Visitor *v, const char *name,
                                void *opaque, Error **errp)
{
    uint64_t val;

    if (!visit_type_size(v, name, &val, errp)) {
        return;
    }
    if (val < 64 * KiB || val % (64 * KiB)) {
        error_setg(errp, "tacc: x-host-slice must be a multiple of 64 KiB");
        return;
    }
    TACC(obj)->host_slice = val;
}

static void tacc_pf_instance_init(Object *obj)
{
    TaccState *s = TACC(obj);

    s->fi_hang_engine = -1;
    s->time_scale = 1000;
    s->host_slice = 16 * MiB;
    object_property_add(obj, "x-host-slice", "size", tacc_get_host_slice,
                        tacc_set_host_slice, NULL, NULL);
    object_property_add(obj, "time-scale", "uint32", tacc_get_time_scale,
                        tacc_set_time_scale, NULL, NULL);
    object_property_add(obj, "x-fi-hang-engine", "int32", tacc_get_hang,
                        tacc_set_hang, NULL, NULL);
    object_property_add_bool(obj, "x-fi-fail-next-dma", tacc_get_fail_dma,
                             tacc_set_fail_dma);
    object_property_add_bool(obj, "x-fi-corrupt-next-cqe", tacc_get_corrupt,
                             tacc_set_corrupt);
    object_property_add_bool(obj, "x-fi-fatal", tacc_get_fatal, tacc_set_fatal);
    object_property_add_bool(obj, "x-fi-tlb-inv-stall", tacc_get_tlb_stall,
                             tacc_set_tlb_stall);
    object_property_add_bool(obj, "x-gemm-wait", tacc_get_gemm_wait, NULL);
    object_property_add(obj, "x-worst-turn-ns", "uint64", tacc_get_worst_turn,
                        tacc_set_worst_turn, NULL, NULL);
    object_property_add(obj, "x-entry-cpu-ns", "uint64", tacc_get_worst_turn,
                        NULL, NULL, (void *)1);
    for (size_t i = 0; i < ARRAY_SIZE(tacc_gt_props); i++) {
        object_property_add(obj, tacc_gt_props[i].name, "uint64", tacc_get_gt,
                            NULL, NULL, (void *)&tacc_gt_props[i]);
    }
    object_property_add(obj, "x-gt-link-busy-ns-h2d", "uint64",
                        tacc_get_link_busy, NULL, NULL, NULL);
    object_property_add(obj, "x-gt-link-busy-ns-d2h", "uint64",
                        tacc_get_link_busy, NULL, NULL, (void *)1);
    tacc_link_fault_props(obj);
}

static const Property tacc_props[] = {
    DEFINE_PROP_SIZE("devmem-size", TaccState, devmem_size, 256 * MiB),
    DEFINE_PROP_UINT8("link-gen", TaccState, link_gen, 4),
    DEFINE_PROP_UINT8("link-width", TaccState, link_width, 16),
    DEFINE_PROP_UINT32("mps", TaccState, mps_cap, 256),
    DEFINE_PROP_UINT32("mrrs", TaccState, mrrs_cap, 512),
    DEFINE_PROP_UINT32("rcb", TaccState, rcb, 64),
    DEFINE_PROP_UINT32("tags", TaccState, tags, 32),
    DEFINE_PROP_UINT32("posted-credits", TaccState, posted_credits, 1024),
    DEFINE_PROP_UINT32("posted-hdr-credits", TaccState, posted_hdr_credits, 64),
    DEFINE_PROP_BOOL("link-ctrl-cost", TaccState, link_ctrl_cost, true),
    DEFINE_PROP_UINT32("aspm-l0s-entry-ns", TaccState, aspm_l0s_entry_ns, 1000),
    DEFINE_PROP_UINT32("aspm-l0s-exit-ns", TaccState, aspm_l0s_exit_ns, 256),
    DEFINE_PROP_UINT32("aspm-l1-entry-ns", TaccState, aspm_l1_entry_ns, 10000),
    DEFINE_PROP_UINT32("aspm-l1-exit-ns", TaccState, aspm_l1_exit_ns, 2000),
    /* L1 PM Substates (docs/hardware.md "L1 PM Substates") */
    DEFINE_PROP_BOOL("l1ss", TaccState, l1ss, true),
    DEFINE_PROP_UINT8("l1ss-cm-restore-us", TaccState, l1ss_cm_restore_us, 10),
    DEFINE_PROP_UINT32("l1ss-t-power-on-us", TaccState, l1ss_t_power_on_us, 10),
    DEFINE_PROP_UINT32("aspm-l11-exit-ns", TaccState, aspm_l11_exit_ns, 4000),
    DEFINE_PROP_UINT32("ltr-latency-ns", TaccState, ltr_ns, 1000000),
    DEFINE_PROP_UINT32("tlb-entries", TaccState, tlb_entries, 128),
    DEFINE_PROP_UINT32("cmd-latency-ns", TaccState, cmd_latency_ns, 100),
    DEFINE_PROP_UINT32("read-latency-ns", TaccState, read_latency_ns, 600),
    DEFINE_PROP_UINT32("write-latency-ns", TaccState, write_latency_ns, 200),
    DEFINE_PROP_UINT32("walk-latency-ns", TaccState, walk_latency_ns, 500),
    /* one NVIDIA L4 over 4 engines: docs/hardware.md section 14 */
    DEFINE_PROP_UINT32("compute-gflops", TaccState, compute_gflops, 7575),
    DEFINE_PROP_UINT32("bf16-gflops", TaccState, bf16_gflops, 30250),
    DEFINE_PROP_UINT32("devmem-gbps", TaccState, devmem_gbps, 300),
    DEFINE_PROP_UINT8("sriov-max-vfs", TaccState, total_vfs, TACC_MAX_VFS),
    DEFINE_PROP_SIZE("x-gemm-host-max", TaccState, gemm_host_max, 1 * GiB),
};

static void tacc_func_class_init(ObjectClass *oc, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(oc);
    PCIDeviceClass *pc = PCI_DEVICE_CLASS(oc);
    ResettableClass *rc = RESETTABLE_CLASS(oc);

    pc->vendor_id = TACC_PCI_VENDOR_ID;
    pc->class_id = TACC_PCI_CLASS >> 8;
    pc->revision = TACC_PCI_REVISION;
    rc->phases.hold = tacc_reset_hold;
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
}

static void tacc_pf_class_init(ObjectClass *oc, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(oc);
    PCIDeviceClass *pc = PCI_DEVICE_CLASS(oc);

    pc->realize = tacc_pf_realize;
    pc->exit = tacc_pf_exit;
    pc->device_id = TACC_PCI_DEVICE_ID_PF;
    dc->desc = "tacc ML accelerator (PF)";
    dc->vmsd = &tacc_vmstate_pf;
    device_class_set_props(dc, tacc_props);
}

static void tacc_vf_class_init(ObjectClass *oc, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(oc);
    PCIDeviceClass *pc = PCI_DEVICE_CLASS(oc);

    pc->realize = tacc_vf_realize;
    pc->exit = tacc_vf_exit;
    pc->device_id = TACC_PCI_DEVICE_ID_VF;
    dc->desc = "tacc ML accelerator (VF)";
    dc->vmsd = &tacc_vmstate_vf;
    dc->user_creatable = false;
}

static const TypeInfo tacc_types[] = {
    {
        .name = TYPE_TACC_FUNC,
        .parent = TYPE_PCI_DEVICE,
        .abstract = true,
        .instance_size = sizeof(TaccFunc),
        .class_init = tacc_func_class_init,
        .interfaces = (InterfaceInfo[]) {
            { INTERFACE_PCIE_DEVICE },
            { }
        },
    }, {
        .name = TYPE_TACC,
        .parent = TYPE_TACC_FUNC,
        .instance_size = sizeof(TaccState),
        .instance_init = tacc_pf_instance_init,
        .class_init = tacc_pf_class_init,
    }, {
        .name = TYPE_TACC_VF,
        .parent = TYPE_TACC_FUNC,
        .instance_size = sizeof(TaccFunc),
        .class_init = tacc_vf_class_init,
    },
};

DEFINE_TYPES(tacc_types)
