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

void tacc_trace_record(TaccFunc *f, TaccUnit *u, uint64_t end_ps)
{
    struct tacc_trace_rec r;

    if (!(f->trace_ctrl & 1) ||
        !tacc_ring_ok(f->trace_base, f->trace_size, 64)) {
        return;
    }
    memset(&r, 0, sizeof(r));
    r.opcode = u->cmd.d.opcode;
    r.engine = u->engine;
    r.queue = u->q;
    r.ctx = cpu_to_le16(u->cmd.d.ctx);
    r.job = cpu_to_le32(u->cmd.d.job);
    r.tag = cpu_to_le64(u->cmd.d.tag);
    r.t_fetch = cpu_to_le64(u->cmd.t_fetch_ps / PS_PER_NS);
    r.t_start = cpu_to_le64(u->start_ps / PS_PER_NS);
    r.t_end = cpu_to_le64(end_ps / PS_PER_NS);
    r.bytes = cpu_to_le32(MIN(u->res.bytes, UINT32_MAX));
    r.tlps = cpu_to_le32(MIN(u->res.h2d_tlps + u->res.d2h_tlps, UINT32_MAX));
    r.index = cpu_to_le16(u->cmd.d.index);
    r.status = cpu_to_le16(u->res.status);
    r.tlb_misses = cpu_to_le16(MIN(u->res.tlb_misses, UINT16_MAX));
    tacc_trace_put(f, &r);
}

/*
 * Append one record to the function's ring (version, function and sequence
 * set here), or drop it: a dropped record still uses its sequence number.
 */
void tacc_trace_put(TaccFunc *f, struct tacc_trace_rec *r)
{
    TaccState *s = f->pf;
    uint32_t used;

    if (!(f->trace_ctrl & 1) ||
        !tacc_ring_ok(f->trace_base, f->trace_size, 64)) {
        return;
    }
    r->version = TACC_TRACE_VERSION;
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
                     (uint64_t)(f->trace_prod & (f->trace_size - 1)) *
                     TACC_TRACE_REC_SIZE;
        if (tacc_func_dma(f, a, r, sizeof(*r), true) != MEMTX_OK) {
            f->cnt[TACC_CNT_dma_errors]++;
            s->gt.dma_errors++;
            tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
            return;
        }
        tacc_link_ctrl(f, true, a, sizeof(*r));
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
        tacc_func_active(f)) {
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

    if (!tacc_func_active(f) || f->sample_period < TACC_SAMPLE_MIN_PERIOD_NS ||
        !tacc_ring_ok(f->sample_base, f->sample_size, 8)) {
        return;
    }
    tacc_sched_poll(s);     /* counters to now (or to where host work waits) */
    tacc_counters_end(s);
    memset(buf, 0, sizeof(buf));
    h.version = cpu_to_le32(TACC_CNT_VERSION);
    h.nslots = cpu_to_le32(f->fn ? TACC_SAMPLE_SLOTS : 2 * TACC_SAMPLE_SLOTS);
    h.seq = cpu_to_le64(f->sample_seq++);
    h.devclk = cpu_to_le64(now);
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
                v = now;
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
