/*
 * tacc: device MMU.
 *
 * Per-function contexts, each with a 3-level page table in host memory
 * (IOVAs, read through the vIOMMU with DMA reads on the function's own
 * address space).  One device-wide, fully associative, LRU TLB of
 * "tlb-entries" entries, tagged with (function, context).  Every PTE read
 * by a walk costs walk-latency-ns of modelled time.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "tacc.h"
#include "trace.h"

static void tacc_xlate_fill(TaccXlate *x, uint64_t va, uint64_t pte,
                            unsigned shift)
{
    uint64_t mask = (1ull << shift) - 1;

    x->addr = ((pte & TACC_PTE_ADDR_MASK) & ~mask) | (va & mask);
    x->page_left = (1ull << shift) - (va & mask);
    x->devmem = pte & TACC_PTE_DEVMEM;
    x->writable = pte & TACC_PTE_WRITE;
}

void tacc_tlb_invalidate(TaccState *s, int fn, int ctx)
{
    for (uint32_t i = 0; i < s->tlb_entries; i++) {
        TaccTlbEntry *e = &s->tlb[i];
        if (e->valid && (fn < 0 || e->fn == fn) && (ctx < 0 || e->ctx == ctx)) {
            e->valid = false;
        }
    }
    trace_tacc_tlb_inv(fn, ctx);
}

/* Returns 0 or an enum tacc_fault_type. */
int tacc_mmu_translate(TaccFunc *f, unsigned ctx, uint64_t va,
                       TaccXlate *x, TaccResult *res)
{
    TaccState *s = f->pf;
    TaccTlbEntry *victim = NULL;
    uint64_t table, pte = 0;
    unsigned shift = TACC_PAGE_SHIFT;

    if (ctx >= TACC_NUM_CONTEXTS) {
        return TACC_FAULT_BAD_CTX;
    }
    if (va >> TACC_VA_BITS) {
        return TACC_FAULT_UNMAPPED;
    }

    for (uint32_t i = 0; i < s->tlb_entries; i++) {
        TaccTlbEntry *e = &s->tlb[i];
        if (e->valid && e->fn == f->fn && e->ctx == ctx &&
            (va >> e->shift) == e->vpn) {
            e->lru = ++s->tlb_clock;
            res->tlb_hits++;
            tacc_xlate_fill(x, va, e->pte, e->shift);
            return 0;
        }
        if (!victim || (victim->valid && (!e->valid || e->lru < victim->lru))) {
            victim = e;
        }
    }

    res->tlb_misses++;
    if (!(f->ptbr[ctx] & TACC_PTBR_VALID)) {
        return TACC_FAULT_BAD_CTX;
    }
    table = f->ptbr[ctx] & TACC_PTE_ADDR_MASK;
    for (int level = 0; level < 3; level++) {
        unsigned idx = (va >> (30 - 9 * level)) & (TACC_PT_ENTRIES - 1);
        uint64_t addr = table + idx * 8;

        res->walk_reads++;
        res->pre_ps += tacc_scale_ps(s, s->walk_latency_ns * PS_PER_NS);
        if (f->ops && f->ops->pt_read ? !f->ops->pt_read(f, addr, &pte)
            : tacc_func_dma(f, addr, &pte, 8, false) != MEMTX_OK) {
            trace_tacc_walk_dma_error(f->fn, ctx, va, addr);
            return TACC_FAULT_WALK_DMA;
        }
        pte = le64_to_cpu(pte);
        trace_tacc_walk(f->fn, ctx, va, level, pte);
        if (!(pte & TACC_PTE_VALID)) {
            return TACC_FAULT_UNMAPPED;
        }
        if (level == 0) {
            if (pte & TACC_PTE_HUGE) {
                return TACC_FAULT_UNMAPPED;     /* level 0 is never a leaf */
            }
        } else if (level == 1 && (pte & TACC_PTE_HUGE)) {
            shift = TACC_HUGE_SHIFT;
            break;
        } else if (level == 2) {
            break;
        }
        table = pte & TACC_PTE_ADDR_MASK;
    }

    if (victim) {
        victim->valid = true;
        victim->fn = f->fn;
        victim->ctx = ctx;
        victim->shift = shift;
        victim->vpn = va >> shift;
        victim->pte = pte;
        victim->lru = ++s->tlb_clock;
    }
    tacc_xlate_fill(x, va, pte, shift);
    return 0;
}
