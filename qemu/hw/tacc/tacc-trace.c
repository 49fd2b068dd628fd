/*
 * tacc: device trace ring and device-side counter sampling.
 *
 * Trace: one 64-byte record per executed command, DMA-written to the
 * driver's ring (TRACE_BASE, TRACE_SIZE entries).  The producer index
 * (TRACE_PROD, and the optional write-back) is free running; when
 * PROD - CONS == SIZE the record is dropped and counted, never written over
 * an unread one.  A sequence number gap is a drop.
 *
 * Sampling: every SAMPLE_PERIOD ns of virtual time, a snapshot of the
 * function's counter page (plus the global page on the PF) goes to the
 * sample ring with the same producer/consumer/drop rules.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "tacc.h"
#include "trace.h"

void tacc_ring_wb(TaccFunc *f, uint64_t wb, uint32_t prod, uint32_t dropped)
{
    struct tacc_ring_wb w = {
        .prod = cpu_to_le32(prod),
        .dropped = cpu_to_le32(dropped),
    };

    if (wb && !(wb & 7) &&
        tacc_func_dma(f, wb, &w, sizeof(w), true) == MEMTX_OK) {
        tacc_link_ctrl(f, true, wb, sizeof(w));
    }
}

static bool tacc_ring_ok(uint64_t base, uint32_t size, uint32_t align)
{
    return base && !(base & (align - 1)) && size >= 2 && size <= (1u << 20) &&
           is_power_of_2(size);
}

static bool tacc_trace_on(TaccFunc *f)
{
    bool v3 = f->trace_ctrl & TACC_TRACE_CTRL_V3;

    return (f->trace_ctrl & TACC_TRACE_CTRL_ENABLE) &&
           tacc_ring_ok(f->trace_base, f->trace_size, v3 ? 128 : 64);
}

void tacc_trace_record(TaccFunc *f, TaccUnit *u, uint64_t end_ps)
{
    struct tacc_trace_rec3 r3;
    struct tacc_trace_rec *r = &r3.rec;
    const TaccCmd *c = &u->cmd;
    const struct tacc_desc *d = &c->d;

    if (!tacc_trace_on(f)) {
        return;
    }
    memset(&r3, 0, sizeof(r3));
    r->opcode = d->opcode;
    r->engine = u->engine;
    r->queue = u->q;
    r->ctx = cpu_to_le16(d->ctx);
    r->job = cpu_to_le32(d->job);
    r->tag = cpu_to_le64(d->tag);
    r->t_fetch = cpu_to_le64(c->t_fetch_ps / PS_PER_NS);
    r->t_start = cpu_to_le64((c->list_start_ps ? c->list_start_ps
                                               : u->start_ps) / PS_PER_NS);
    r->t_end = cpu_to_le64(end_ps / PS_PER_NS);
    r->bytes = cpu_to_le32(MIN(u->res.bytes, UINT32_MAX));
    r->tlps = cpu_to_le32(MIN(u->res.h2d_tlps + u->res.d2h_tlps, UINT32_MAX));
    r->index = cpu_to_le16(d->index);
    r->status = cpu_to_le16(u->res.status);
    r->tlb_misses = cpu_to_le16(MIN(u->res.tlb_misses, UINT16_MAX));
    /* version 3: what places the command on the roofline */
    r3.flops = cpu_to_le64(u->res.flops);
    r3.devmem_rd = cpu_to_le64(u->res.devmem_rd);
    r3.devmem_wr = cpu_to_le64(u->res.devmem_wr);
    r3.list_id = cpu_to_le32(c->list_id);
    r3.list_index = cpu_to_le16(c->list_index);
    switch (d->opcode) {
    case TACC_OP_GEMM:
        r3.dtype = d->gemm.dtype_ab;
        r3.sub_op = d->gemm.gflags;
        break;
    case TACC_OP_ELTWISE:
        r3.dtype = d->eltwise.dtype_a;
        r3.sub_op = d->eltwise.op;
        break;
    case TACC_OP_SOFTMAX:
        r3.dtype = d->softmax.dtype_x;
        break;
    case TACC_OP_NORM:
        r3.dtype = d->norm.dtype_x;
        r3.sub_op = d->norm.kind;
        break;
    case TACC_OP_GATHER:
        r3.dtype = d->gather.dtype;
        break;
    }
    tacc_trace_put3(f, &r3);
}

void tacc_trace_put(TaccFunc *f, struct tacc_trace_rec *r)
{
    struct tacc_trace_rec3 r3;

    memset(&r3, 0, sizeof(r3));
    r3.rec = *r;
    tacc_trace_put3(f, &r3);
}

/*
 * Append one record to the function's ring (version, function and sequence
 * set here; 64 bytes, or all 128 with TRACE_CTRL.V3), or drop it: a dropped
 * record still uses its sequence number.
 */
void tacc_trace_put3(TaccFunc *f, struct tacc_trace_rec3 *r3)
{
    TaccState *s = f->pf;
    struct tacc_trace_rec *r = &r3->rec;
    bool v3 = f->trace_ctrl & TACC_TRACE_CTRL_V3;
    uint32_t rsize = v3 ? TACC_TRACE_REC3_SIZE : TACC_TRACE_REC_SIZE;
    uint32_t used;

    if (!tacc_trace_on(f)) {
        return;
    }
    r->version = v3 ? TACC_TRACE_VERSION_3 : TACC_TRACE_VERSION;
    r->func = cpu_to_le16(f->fn);
    r->seq = cpu_to_le32(f->trace_seq++);
    tacc_counters_begin(s);
    used = f->trace_prod - f->trace_cons;
    if (used >= f->trace_size) {
        f->trace_dropped++;
        f->cnt[TACC_CNT_trace_dropped]++;
        s->gt.trace_dropped++;
        trace_tacc_trace_drop(f->fn, f->trace_seq - 1);
    } else {
        uint64_t a = f->trace_base +
                     (uint64_t)(f->trace_prod & (f->trace_size - 1)) * rsize;
        if (tacc_func_dma(f, a, r3, rsize, true) != MEMTX_OK) {
            f->cnt[TACC_CNT_dma_errors]++;
            s->gt.dma_errors++;
            tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
            return;
        }
        tacc_link_ctrl(f, true, a, rsize);
        f->trace_prod++;
        f->cnt[TACC_CNT_trace_records]++;
        s->gt.trace_records++;
        if (f->trace_prod - f->trace_cons == f->trace_size / 2) {
            tacc_irq_cause(f, TACC_IRQ_TRACE);
        }
    }
    tacc_ring_wb(f, f->trace_wb, f->trace_prod, f->trace_dropped);
}

void tacc_sample_rearm(TaccFunc *f)
{
    if (f->sample_period && f->sample_period < TACC_SAMPLE_MIN_PERIOD_NS) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d: sample period %u < %u\n",
                      f->fn, f->sample_period, TACC_SAMPLE_MIN_PERIOD_NS);
    }
    if (f->sample_period >= TACC_SAMPLE_MIN_PERIOD_NS &&
        tacc_ring_ok(f->sample_base, f->sample_size, 8) &&
        tacc_func_active(f) && !tacc_vfmig_stopped(f)) {
        timer_mod(&f->sample_timer,
                  qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL) + f->sample_period);
    } else {
        timer_del(&f->sample_timer);
    }
}

static void tacc_sample_timer_locked(TaccFunc *f)
{
    TaccState *s = f->pf;
    uint8_t buf[TACC_SAMPLE_SIZE];
    struct tacc_sample_hdr h;
    uint64_t *slots = (uint64_t *)(buf + sizeof(h));
    int64_t now = qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL);
    int64_t dev_now = now + s->dev_clock_off;

    if (!tacc_func_active(f) || f->sample_period < TACC_SAMPLE_MIN_PERIOD_NS ||
        !tacc_ring_ok(f->sample_base, f->sample_size, 8) ||
        tacc_vfmig_stopped(f)) {
        return;
    }
    tacc_sched_poll(s);     /* counters to now (or to where host work waits) */
    tacc_counters_end(s);
    memset(buf, 0, sizeof(buf));
    h.version = cpu_to_le32(TACC_CNT_VERSION);
    h.nslots = cpu_to_le32(f->fn ? TACC_SAMPLE_SLOTS : 2 * TACC_SAMPLE_SLOTS);
    h.seq = cpu_to_le64(f->sample_seq++);
    h.devclk = cpu_to_le64(dev_now);
    memcpy(buf, &h, sizeof(h));
    for (int i = 0; i < TACC_SAMPLE_SLOTS; i++) {
        uint64_t v = f->cnt[i];
        if (i == TACC_CNT_SLOT_HDR) {
            v = TACC_CNT_HDR(TACC_FUNC_CNT_END);
        } else if (i == TACC_CNT_SLOT_GEN) {
            v = s->cnt_gen;
        }
        slots[i] = cpu_to_le64(v);
        if (!f->fn) {
            v = s->gcnt[i];
            if (i == TACC_CNT_SLOT_HDR) {
                v = TACC_CNT_HDR(TACC_GLOBAL_CNT_END);
            } else if (i == TACC_CNT_SLOT_GEN) {
                v = s->cnt_gen;
            } else if (i == TACC_CNT_uptime_ticks) {
                v = dev_now;
            }
            slots[TACC_SAMPLE_SLOTS + i] = cpu_to_le64(v);
        }
    }

    if (f->sample_prod - f->sample_cons >= f->sample_size) {
        f->sample_dropped++;
    } else {
        uint64_t a = f->sample_base +
                     (uint64_t)(f->sample_prod & (f->sample_size - 1)) *
                     TACC_SAMPLE_SIZE;
        if (tacc_func_dma(f, a, buf, sizeof(buf), true) == MEMTX_OK) {
            tacc_link_ctrl(f, true, a, sizeof(buf));
            f->sample_prod++;
            if (f->sample_prod - f->sample_cons == f->sample_size / 2) {
                tacc_irq_cause(f, TACC_IRQ_SAMPLE);
            }
        } else {
            f->cnt[TACC_CNT_dma_errors]++;
            tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
        }
    }
    tacc_ring_wb(f, f->sample_wb, f->sample_prod, f->sample_dropped);
    trace_tacc_sample(f->fn, f->sample_prod, f->sample_dropped);
    timer_mod(&f->sample_timer, now + f->sample_period);
}

/* An entry point: engages the function's MemReentrancyGuard and tacc_enter. */
void tacc_sample_timer(void *opaque)
{
    TaccFunc *f = opaque;
    MemReentrancyGuard *g = &DEVICE(f)->mem_reentrancy_guard;
    bool engaged = g->engaged_in_io;

    if (!tacc_enter(f->pf, f, "sample timer")) {
        return;
    }
    g->engaged_in_io = true;
    tacc_sample_timer_locked(f);
    g->engaged_in_io = engaged;
    tacc_leave(f->pf);
}
