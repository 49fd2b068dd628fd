/*
 * tacc: BAR0 registers and the BAR2 counter block.
 *
 * Accesses are 4 or 8 bytes, naturally aligned.  A 64-bit register can be
 * accessed as one 8-byte access or as two 4-byte halves; reading the LO
 * half of DEVCLK/HOSTCLK latches the HI half.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "qemu/timer.h"
#include "hw/pci/pcie_sriov.h"
#include "tacc.h"
#include "trace.h"

/*
 * Counter generation: made odd before the first counter change of an
 * update, even again when the update is complete.  It only moves when
 * counters do, so a reader's "read gen, counters, gen" converges.
 */
void tacc_counters_begin(TaccState *s)
{
    if (!(s->cnt_gen & 1)) {
        s->cnt_gen++;
    }
}

void tacc_counters_end(TaccState *s)
{
    if (s->cnt_gen & 1) {
        s->cnt_gen++;
    }
}

/* Read a 64-bit register value (reg = aligned offset of its LO half). */
static bool tacc_reg64(TaccFunc *f, hwaddr reg, uint64_t *v)
{
    TaccState *s = f->pf;
    uint64_t base, size;

    switch (reg) {
    case TACC_REG_DEVMEM_SIZE:
        tacc_window(f, &base, &size);
        *v = size;
        return true;
    case TACC_REG_DEVCLK:
        *v = tacc_dev_ns(s);
        return true;
    case TACC_REG_HOSTCLK:
        *v = qemu_clock_get_ns(QEMU_CLOCK_HOST);
        return true;
    case TACC_REG_VM_PAUSED_NS:
        *v = s->vm_paused_ns;
        return true;
    case TACC_REG_FAULT_ADDR:
        *v = f->fault_addr;
        return true;
    case TACC_REG_FAULT_TAG:
        *v = f->fault_tag;
        return true;
    case TACC_REG_TRACE_BASE:
        *v = f->trace_base;
        return true;
    case TACC_REG_TRACE_WB:
        *v = f->trace_wb;
        return true;
    case TACC_REG_SAMPLE_BASE:
        *v = f->sample_base;
        return true;
    case TACC_REG_SAMPLE_WB:
        *v = f->sample_wb;
        return true;
    }
    if (reg >= TACC_REG_CTX_PTBR(0) &&
        reg < TACC_REG_CTX_PTBR(TACC_NUM_CONTEXTS)) {
        *v = f->ptbr[(reg - TACC_REG_CTX_PTBR(0)) / 8];
        return true;
    }
    if (!f->fn && reg >= TACC_REG_VF_DEVMEM_BASE(0) &&
        reg < TACC_REG_VF_DEVMEM_BASE(TACC_MAX_VFS)) {
        int vf = (reg - TACC_REG_VF_DEVMEM_BASE(0)) / 0x10;
        *v = (reg & 8) ? s->vf_mem_size[vf] : s->vf_mem_base[vf];
        return true;
    }
    if (!f->fn && s->virtio && (reg == TACC_REG_VIRTIO_DEVMEM_BASE ||
                                reg == TACC_REG_VIRTIO_DEVMEM_SIZE)) {
        *v = reg == TACC_REG_VIRTIO_DEVMEM_SIZE ? s->virtio_mem_size
                                                : s->virtio_mem_base;
        return true;
    }
    if (reg >= TACC_QUEUE_BASE(0) && reg < TACC_QUEUE_BASE(TACC_NUM_QUEUES)) {
        TaccQueue *q = &f->q[(reg - TACC_QUEUE_BASE(0)) / 0x100];
        switch (reg & 0xff) {
        case TACC_Q_SQ_BASE:
            *v = q->sq_base;
            return true;
        case TACC_Q_CQ_BASE:
            *v = q->cq_base;
            return true;
        }
    }
    return false;
}

static uint32_t tacc_reg32(TaccFunc *f, hwaddr addr, bool *ok)
{
    TaccState *s = f->pf;

    *ok = true;
    switch (addr) {
    case TACC_REG_ID:
        return TACC_ID_MAGIC;
    case TACC_REG_VERSION:
        return TACC_HW_VERSION_MAJOR << 16 | TACC_HW_VERSION_MINOR;
    case TACC_REG_CAPS:
        return (f->fn ? TACC_CAP_VF : (s->total_vfs ? TACC_CAP_SRIOV : 0)) |
               TACC_CAP_MMU_2M | TACC_CAP_TRACE | TACC_CAP_SAMPLING |
               TACC_CAP_FILL | TACC_CAP_TLB_INV_DONE | TACC_CAP_VF_POLICY |
               (s->link_ctrl_cost ? TACC_CAP_LINK_CTRL_COST : 0) |
               (f->fn ? 0 : TACC_CAP_TLP_CAPTURE | TACC_CAP_LINK_PM) |
               (f->fn || !s->total_vfs ? 0 : TACC_CAP_VF_MIGRATION) |
               (!f->fn && s->virtio ? TACC_CAP_VIRTIO_FN : 0) |
               TACC_CAP_HW13 | TACC_CAP_HW15 | TACC_CAP_VM_PAUSED;
    case TACC_REG_FUNC:
        return f->fn;
    case TACC_REG_NUM_QUEUES:
        return TACC_NUM_QUEUES;
    case TACC_REG_NUM_CONTEXTS:
        return TACC_NUM_CONTEXTS;
    case TACC_REG_NUM_ENGINES:
        return TACC_NUM_ENGINES;
    case TACC_REG_MSIX_VECTORS:
        return TACC_MSIX_VECTORS;
    case TACC_REG_LINK_CAP:
        return s->link_gen | (s->link_width << TACC_LINK_WIDTH_SHIFT);
    case TACC_REG_LINK_STATUS:         /* negotiated: x-link-*-now */
        return s->lnk_gen | (s->lnk_width << TACC_LINK_WIDTH_SHIFT);
    case TACC_REG_LINK_PARAMS:
        return s->mps | s->mrrs << 16;
    case TACC_REG_TLB_ENTRIES:
        return s->tlb_entries;
    case TACC_REG_CLOCK_HZ:
        return TACC_CLOCK_HZ;
    case TACC_REG_TIME_SCALE:
        return s->time_scale;
    case TACC_REG_CTRL:
        return f->ctrl;
    case TACC_REG_STATUS:
        return TACC_STATUS_READY |
               (f->status_fatal ? TACC_STATUS_FATAL : 0) |
               (tacc_func_idle(f) ? TACC_STATUS_IDLE : 0);
    case TACC_REG_IRQ_STATUS:
        return f->irq_status;
    case TACC_REG_IRQ_MASK:
        return f->irq_mask;
    case TACC_REG_SCRATCH:
        return f->scratch;
    case TACC_REG_PEAK_FP32_GFLOPS:
        return s->compute_gflops;
    case TACC_REG_PEAK_BF16_GFLOPS:
        return s->bf16_gflops;
    case TACC_REG_DEVMEM_GBPS:
        return s->devmem_gbps;
    case TACC_REG_FAULT_INFO:
        return f->fault_info;
    case TACC_REG_TLB_INV_SEQ:
        return f->tlb_inv_seq;
    case TACC_REG_TLB_INV_DONE:
        return f->tlb_inv_done;
    case TACC_REG_TRACE_SIZE:
        return f->trace_size;
    case TACC_REG_TRACE_CTRL:
        return f->trace_ctrl;
    case TACC_REG_TRACE_PROD:
        return f->trace_prod;
    case TACC_REG_TRACE_CONS:
        return f->trace_cons;
    case TACC_REG_TRACE_DROPPED:
        return f->trace_dropped;
    case TACC_REG_SAMPLE_SIZE:
        return f->sample_size;
    case TACC_REG_SAMPLE_PERIOD:
        return f->sample_period;
    case TACC_REG_SAMPLE_PROD:
        return f->sample_prod;
    case TACC_REG_SAMPLE_CONS:
        return f->sample_cons;
    case TACC_REG_SAMPLE_DROPPED:
        return f->sample_dropped;
    }
    if (!f->fn && addr >= TACC_REG_ARB_WEIGHT(0) &&
        addr < TACC_REG_ARB_WEIGHT(TACC_NUM_FUNCS)) {
        return s->arb_weight[(addr - TACC_REG_ARB_WEIGHT(0)) / 4];
    }
    if (addr == TACC_REG_QUEUE_MASK) {
        return tacc_queue_mask(f);
    }
    if (!f->fn && addr >= TACC_REG_VF_QUEUE_MASK(0) &&
        addr < TACC_REG_VF_QUEUE_MASK(TACC_MAX_VFS)) {
        return s->vf_queue_mask[(addr - TACC_REG_VF_QUEUE_MASK(0)) / 4];
    }
    if (addr >= TACC_QUEUE_BASE(0) && addr < TACC_QUEUE_BASE(TACC_NUM_QUEUES)) {
        int qi = (addr - TACC_QUEUE_BASE(0)) / 0x100;
        TaccQueue *q = &f->q[qi];
        switch (addr & 0xff) {
        case TACC_Q_SQ_SIZE:
            return q->sq_size;
        case TACC_Q_SQ_TAIL:
            return q->sq_tail;
        case TACC_Q_SQ_HEAD:
            return q->sq_head;
        case TACC_Q_CQ_SIZE:
            return q->cq_size;
        case TACC_Q_CQ_HEAD:
            return q->cq_head;
        case TACC_Q_CQ_TAIL:
            return q->cq_tail;
        case TACC_Q_CTRL:
            return q->ctrl;
        case TACC_Q_STATUS:
            return tacc_queue_status(f, qi);
        case TACC_Q_DEPTH:
            return q->f_count;
        }
    }
    *ok = false;
    return 0;
}

/* Registers that do not depend on the model: no wait for host work. */
static bool tacc_reg_static(hwaddr addr)
{
    return addr < TACC_REG_CTRL || (addr & ~7ull) == TACC_REG_DEVCLK ||
           (addr & ~7ull) == TACC_REG_HOSTCLK ||
           (addr & ~7ull) == TACC_REG_VM_PAUSED_NS ||
           addr == TACC_REG_SCRATCH ||
           (addr >= TACC_REG_PEAK_FP32_GFLOPS && addr <= TACC_REG_DEVMEM_GBPS);
}

/* DEVCLK and HOSTCLK: a LO read latches HI, one latch per register */
static uint32_t *tacc_clk_latch(TaccFunc *f, hwaddr reg)
{
    return reg == TACC_REG_DEVCLK ? &f->clk_latch[0] :
           reg == TACC_REG_HOSTCLK ? &f->clk_latch[1] : NULL;
}

static uint64_t tacc_bar0_read_locked(TaccFunc *f, hwaddr addr, unsigned size)
{
    uint64_t v = 0, v64;
    hwaddr reg = addr & ~7ull;
    uint32_t *latch = tacc_clk_latch(f, reg);
    bool ok;

    if (!tacc_reg_static(addr)) {
        tacc_sched_run(f->pf);  /* registers reflect the modelled "now" */
    }
    if (!f->fn && addr >= TACC_REG_TLPCAP_BASE && addr < TACC_REG_TLPCAP_END) {
        if (!tacc_tlpcap_reg_read(f->pf, addr, size, &v)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: bad TLP capture read 0x%"
                          HWADDR_PRIx "/%u\n", addr, size);
        }
    } else if (!f->fn && addr >= TACC_REG_VFMIG_CMD &&
               addr < TACC_REG_VFMIG_END) {
        if (!tacc_vfmig_reg_read(f->pf, addr, size, &v)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: bad VF migration read 0x%"
                          HWADDR_PRIx "/%u\n", addr, size);
        }
    } else if (!f->fn && addr >= TACC_REG_LINKPM_STATE &&
               addr < TACC_REG_LINKPM_END) {
        if (!tacc_lpm_reg_read(f->pf, addr, size, &v)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: bad link PM read 0x%"
                          HWADDR_PRIx "/%u\n", addr, size);
        }
    } else if (tacc_reg64(f, reg, &v64)) {
        if (size == 8) {
            v = v64;
        } else if (addr & 4) {
            v = latch ? *latch : v64 >> 32;
        } else {
            v = (uint32_t)v64;
            if (latch) {
                *latch = v64 >> 32;
            }
        }
    } else if (size == 4) {
        v = tacc_reg32(f, addr, &ok);
        if (!ok) {
            qemu_log_mask(LOG_GUEST_ERROR,
                          "tacc: fn%d: read of unknown register 0x%"
                          HWADDR_PRIx "\n", f->fn, addr);
        }
    } else {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d: 8-byte read of 32-bit register 0x%"
                      HWADDR_PRIx "\n", f->fn, addr);
    }
    trace_tacc_mmio_read(f->fn, addr, size, v);
    return v;
}

static uint64_t tacc_bar0_read(void *opaque, hwaddr addr, unsigned size)
{
    TaccFunc *f = opaque;
    uint64_t v;

    if (!tacc_enter(f->pf, f, "register read")) {
        return 0;
    }
    v = tacc_bar0_read_locked(f, addr, size);
    tacc_leave(f->pf);
    return v;
}

static void tacc_set64(uint64_t *r, hwaddr addr, uint64_t val, unsigned size)
{
    if (size == 8) {
        *r = val;
    } else if (addr & 4) {
        *r = deposit64(*r, 32, 32, val);
    } else {
        *r = deposit64(*r, 0, 32, val);
    }
}

/*
 * Write-back addresses (struct tacc_ring_wb, 8 bytes) must be 8-byte
 * aligned: a misaligned one is refused (the register keeps its value) with
 * the DMA_ERROR cause.
 */
static void tacc_set_wb(TaccFunc *f, uint64_t *r, hwaddr addr, uint64_t val,
                        unsigned size, const char *name)
{
    uint64_t v = *r;

    tacc_set64(&v, addr, val, size);
    if (v & 7) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d: %s 0x%" PRIx64 " not 8-byte aligned: "
                      "refused\n", f->fn, name, v);
        tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
        return;
    }
    *r = v;
}

/* IRQ_MASK: a cause that is pending when it gets unmasked fires now. */
static void tacc_set_irq_mask(TaccFunc *f, uint32_t val)
{
    uint32_t fire = val & ~f->irq_mask & f->irq_status;

    f->irq_mask = val;
    tacc_irq_fire(f, fire);
}

/* ARB_WEIGHT(fn): 0 .. TACC_ARB_WEIGHT_MAX, a bigger value is refused. */
static void tacc_set_weight(TaccState *s, int fn, uint64_t val)
{
    if (val > TACC_ARB_WEIGHT_MAX) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: ARB_WEIGHT(%d) = %" PRIu64 " above %u: refused\n",
                      fn, val, TACC_ARB_WEIGHT_MAX);
        return;
    }
    s->arb_weight[fn] = val;
}

/*
 * VF_QUEUE_MASK(vf): non-empty, within the VF's queues, and only while VF
 * Enable is clear (a VF's queues do not vanish under its driver).
 */
static void tacc_set_vf_queue_mask(TaccState *s, int vf, uint64_t val)
{
    const char *bad = NULL;

    if (pcie_sriov_num_vfs(PCI_DEVICE(s))) {
        bad = "while VFs are enabled";
    } else if (!val || (val & ~(uint64_t)TACC_QUEUE_MASK_ALL)) {
        bad = "not a non-empty mask of the VF's queues";
    }
    if (bad) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: VF_QUEUE_MASK(%d) = 0x%" PRIx64 " %s: refused\n",
                      vf, val, bad);
        return;
    }
    s->vf_queue_mask[vf] = val;
}

static void tacc_bar0_write_locked(TaccFunc *f, hwaddr addr, uint64_t val,
                                   unsigned size)
{
    TaccState *s = f->pf;
    hwaddr reg = addr & ~7ull;

    trace_tacc_mmio_write(f->fn, addr, size, val);
    if (size == 4 && reg >= TACC_QUEUE_BASE(0) &&
        reg < TACC_QUEUE_BASE(TACC_NUM_QUEUES) &&
        (addr & 0xff) == TACC_Q_SQ_TAIL && tacc_host_pending(s)) {
        /* does not wait for the host work (docs/hardware.md section 9) */
        tacc_queue_doorbell(f, (reg - TACC_QUEUE_BASE(0)) / 0x100, val);
        return;
    }
    tacc_sched_run(s);
    if (size == 8 && (addr & 7)) {
        goto bad;
    }

    if (reg >= TACC_REG_CTX_PTBR(0) &&
        reg < TACC_REG_CTX_PTBR(TACC_NUM_CONTEXTS)) {
        tacc_set64(&f->ptbr[(reg - TACC_REG_CTX_PTBR(0)) / 8], addr, val, size);
        return;
    }
    if (!f->fn && addr >= TACC_REG_TLPCAP_BASE && addr < TACC_REG_TLPCAP_END) {
        if (!tacc_tlpcap_reg_write(s, addr, val, size)) {
            goto bad;
        }
        return;
    }
    if (!f->fn && addr >= TACC_REG_VFMIG_CMD && addr < TACC_REG_VFMIG_END) {
        if (!tacc_vfmig_reg_write(s, addr, val, size)) {
            goto bad;
        }
        return;
    }
    if (reg >= TACC_QUEUE_BASE(0) && reg < TACC_QUEUE_BASE(TACC_NUM_QUEUES)) {
        int qi = (reg - TACC_QUEUE_BASE(0)) / 0x100;
        TaccQueue *q = &f->q[qi];

        switch (addr & 0xff) {
        case TACC_Q_SQ_BASE:
        case TACC_Q_SQ_BASE + 4:
            if (q->ctrl & TACC_Q_CTRL_ENABLE) {
                goto busy;
            }
            tacc_set64(&q->sq_base, addr, val, size);
            return;
        case TACC_Q_CQ_BASE:
        case TACC_Q_CQ_BASE + 4:
            if (q->ctrl & TACC_Q_CTRL_ENABLE) {
                goto busy;
            }
            tacc_set64(&q->cq_base, addr, val, size);
            return;
        case TACC_Q_SQ_SIZE:
            if (q->ctrl & TACC_Q_CTRL_ENABLE) {
                goto busy;
            }
            q->sq_size = val;
            return;
        case TACC_Q_CQ_SIZE:
            if (q->ctrl & TACC_Q_CTRL_ENABLE) {
                goto busy;
            }
            q->cq_size = val;
            return;
        case TACC_Q_SQ_TAIL:
            tacc_queue_doorbell(f, qi, val);
            return;
        case TACC_Q_CQ_HEAD:
            tacc_queue_cq_head(f, qi, val);
            return;
        case TACC_Q_CTRL:
            tacc_queue_ctrl(f, qi, val);
            return;
        }
        goto bad;
    }
    if (!f->fn && reg >= TACC_REG_VF_DEVMEM_BASE(0) &&
        reg < TACC_REG_VF_DEVMEM_BASE(TACC_MAX_VFS)) {
        int vf = (reg - TACC_REG_VF_DEVMEM_BASE(0)) / 0x10;
        tacc_set64((reg & 8) ? &s->vf_mem_size[vf] : &s->vf_mem_base[vf],
                   addr, val, size);
        tacc_tlb_invalidate(s, vf + 1, -1);
        return;
    }
    if (!f->fn && s->virtio && (reg == TACC_REG_VIRTIO_DEVMEM_BASE ||
                                reg == TACC_REG_VIRTIO_DEVMEM_SIZE)) {
        if (s->virtio_window_busy(s->virtio)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: virtio function window "
                          "write refused: device-memory BOs exist\n");
            return;
        }
        tacc_set64(reg == TACC_REG_VIRTIO_DEVMEM_SIZE ? &s->virtio_mem_size
                                                      : &s->virtio_mem_base,
                   addr, val, size);
        tacc_tlb_invalidate(s, TACC_FN_VIRTIO, -1);
        return;
    }
    if (!f->fn && addr >= TACC_REG_ARB_WEIGHT(0) &&
        addr < TACC_REG_ARB_WEIGHT(TACC_NUM_FUNCS) && size == 4) {
        tacc_set_weight(s, (addr - TACC_REG_ARB_WEIGHT(0)) / 4, val);
        return;
    }
    if (!f->fn && addr >= TACC_REG_VF_QUEUE_MASK(0) &&
        addr < TACC_REG_VF_QUEUE_MASK(TACC_MAX_VFS) && size == 4) {
        tacc_set_vf_queue_mask(s, (addr - TACC_REG_VF_QUEUE_MASK(0)) / 4, val);
        return;
    }

    switch (reg) {
    case TACC_REG_TRACE_BASE:
        tacc_set64(&f->trace_base, addr, val, size);
        return;
    case TACC_REG_TRACE_WB:
        tacc_set_wb(f, &f->trace_wb, addr, val, size, "TRACE_WB");
        return;
    case TACC_REG_SAMPLE_BASE:
        tacc_set64(&f->sample_base, addr, val, size);
        return;
    case TACC_REG_SAMPLE_WB:
        tacc_set_wb(f, &f->sample_wb, addr, val, size, "SAMPLE_WB");
        return;
    }
    if (size != 4) {
        goto bad;
    }
    switch (addr) {
    case TACC_REG_CTRL:
        if (val & TACC_CTRL_RESET) {
            tacc_func_reset(f);
        }
        f->ctrl = val & TACC_CTRL_ENABLE;
        tacc_sched_poll(s);
        return;
    case TACC_REG_IRQ_STATUS:
        f->irq_status &= ~val;
        return;
    case TACC_REG_IRQ_MASK:
        tacc_set_irq_mask(f, val);
        return;
    case TACC_REG_SCRATCH:
        f->scratch = val;
        return;
    case TACC_REG_TLB_INV:
        if (s->fi_tlb_inv_stall) {
            /* fault injection: the invalidation never completes */
            trace_tacc_tlb_inv_stalled(f->fn, val);
            return;
        }
        if (val & TACC_TLB_INV_ALL) {
            tacc_tlb_invalidate(s, f->fn, -1);
        } else if (val < TACC_NUM_CONTEXTS) {
            tacc_tlb_invalidate(s, f->fn, val);
        } else {
            goto bad;
        }
        /*
         * The model's TLB holds no entry a later walk could use once
         * tacc_tlb_invalidate() returns, and the write-backs at completion
         * (GEMM C, fence, timestamp) translate again: complete at once.
         */
        f->tlb_inv_done = f->tlb_inv_seq;
        trace_tacc_tlb_inv_done(f->fn, f->tlb_inv_done);
        return;
    case TACC_REG_TLB_INV_SEQ:
        f->tlb_inv_seq = val;
        return;
    case TACC_REG_FAULT_CLEAR:
        if (val & 1) {
            f->fault_info = 0;
            f->fault_addr = 0;
            f->fault_tag = 0;
        }
        return;
    case TACC_REG_TRACE_SIZE:
        f->trace_size = val;
        return;
    case TACC_REG_TRACE_CTRL:
        /* the record version (V3) is latched when the ring is enabled */
        if ((val & TACC_TRACE_CTRL_ENABLE) &&
            !(f->trace_ctrl & TACC_TRACE_CTRL_ENABLE)) {
            f->trace_prod = f->trace_cons = 0;
            f->trace_ctrl = val & (TACC_TRACE_CTRL_ENABLE | TACC_TRACE_CTRL_V3);
        } else if (val & TACC_TRACE_CTRL_ENABLE) {
            f->trace_ctrl = TACC_TRACE_CTRL_ENABLE |
                            (f->trace_ctrl & TACC_TRACE_CTRL_V3);
        } else {
            f->trace_ctrl = val & TACC_TRACE_CTRL_V3;
        }
        return;
    case TACC_REG_TRACE_CONS:
        f->trace_cons = val;
        return;
    case TACC_REG_SAMPLE_SIZE:
        f->sample_size = val;
        return;
    case TACC_REG_SAMPLE_PERIOD:
        if (val && !f->sample_period) {
            f->sample_prod = f->sample_cons = 0;
        }
        f->sample_period = val;
        tacc_sample_rearm(f);
        return;
    case TACC_REG_SAMPLE_CONS:
        f->sample_cons = val;
        return;
    }
bad:
    qemu_log_mask(LOG_GUEST_ERROR,
                  "tacc: fn%d: bad write 0x%" PRIx64 " to 0x%" HWADDR_PRIx
                  " size %u\n", f->fn, val, addr, size);
    return;
busy:
    qemu_log_mask(LOG_GUEST_ERROR,
                  "tacc: fn%d: ring register 0x%" HWADDR_PRIx
                  " written while the queue is enabled\n", f->fn, addr);
}

static void tacc_bar0_write(void *opaque, hwaddr addr, uint64_t val,
                            unsigned size)
{
    TaccFunc *f = opaque;

    if (!tacc_enter(f->pf, f, "register write")) {
        return;
    }
    tacc_bar0_write_locked(f, addr, val, size);
    tacc_leave(f->pf);
}

const MemoryRegionOps tacc_bar0_ops = {
    .read = tacc_bar0_read,
    .write = tacc_bar0_write,
    .endianness = DEVICE_LITTLE_ENDIAN,
    .valid = {
        .min_access_size = 4,
        .max_access_size = 8,
    },
    .impl = {
        .min_access_size = 4,
        .max_access_size = 8,
    },
};

/* BAR2: page 0 function counters, page 1 global counters (PF only). */
static uint64_t tacc_bar2_read(void *opaque, hwaddr addr, unsigned size)
{
    TaccFunc *f = opaque;
    TaccState *s = f->pf;
    bool global = addr >= TACC_CNT_GLOBAL_PAGE;
    unsigned slot = (addr & (TACC_CNT_GLOBAL_PAGE - 1)) / 8;
    uint64_t v = 0;

    if (!tacc_enter(s, f, "counter read")) {
        return 0;
    }
    tacc_sched_run(s);
    tacc_counters_end(s);
    if (slot == TACC_CNT_SLOT_HDR) {
        v = global ? (f->fn ? 0 : TACC_CNT_HDR(TACC_GLOBAL_CNT_END))
                   : TACC_CNT_HDR(TACC_FUNC_CNT_END);
    } else if (slot == TACC_CNT_SLOT_GEN) {
        v = s->cnt_gen;
    } else if (slot < TACC_SAMPLE_SLOTS) {
        if (!global) {
            v = f->cnt[slot];
        } else if (!f->fn) {
            v = slot == TACC_CNT_uptime_ticks
                ? (uint64_t)tacc_dev_ns(s)
                : s->gcnt[slot];
        }
    }
    if (size == 4) {
        v = (addr & 4) ? v >> 32 : (uint32_t)v;
    }
    tacc_leave(s);
    return v;
}

static void tacc_bar2_write(void *opaque, hwaddr addr, uint64_t val,
                            unsigned size)
{
    qemu_log_mask(LOG_GUEST_ERROR, "tacc: write to read-only counter block\n");
}

const MemoryRegionOps tacc_bar2_ops = {
    .read = tacc_bar2_read,
    .write = tacc_bar2_write,
    .endianness = DEVICE_LITTLE_ENDIAN,
    .valid = {
        .min_access_size = 4,
        .max_access_size = 8,
    },
    .impl = {
        .min_access_size = 4,
        .max_access_size = 8,
    },
};
