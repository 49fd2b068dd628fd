/*
 * tacc: queues, descriptor fetch, engines, arbitration and the event loop.
 *
 * Modelled time runs in picoseconds on QEMU's virtual clock.  Each queue
 * executes its commands in order, one at a time; a command runs on a unit:
 * one of the shared engines (DMA H2D, DMA D2H, 4 compute) or the queue's
 * own local unit (NOP, FENCE, TIMESTAMP, BARRIER).  A unit's command goes
 * through three phases: pre (fixed latency, page walks, compute), link (the
 * payload crosses the PCIe link in TACC_CHUNK_BYTES steps, each reserving
 * the link direction(s) it needs, so concurrent transfers of all functions
 * interleave), post (read/write latency).  Events are processed in time
 * order; a free engine picks its next command by deficit round-robin over
 * functions (ARB_WEIGHT: shares of the engine's bytes), then round-robin over
 * a function's queues.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "hw/pci/msix.h"
#include "system/cpu-timers.h"
#include "system/qtest.h"
#include "tacc.h"
#include "trace.h"

static bool tacc_unit_hung(TaccState *s, TaccUnit *u)
{
    return u->busy && u->engine < TACC_NUM_ENGINES &&
           s->fi_hang_engine == u->engine;
}

static bool tacc_queue_on(TaccFunc *f, TaccQueue *q)
{
    return (q->ctrl & TACC_Q_CTRL_ENABLE) && !(q->status & TACC_Q_STATUS_ERROR);
}

uint32_t tacc_queue_status(TaccFunc *f, int qi)
{
    TaccQueue *q = &f->q[qi];
    uint32_t st = q->status;

    if (!q->running && !q->f_count && !q->cqe_pending) {
        st |= TACC_Q_STATUS_IDLE;
    }
    if (q->running) {
        for (int e = 0; e < TACC_NUM_ENGINES; e++) {
            TaccUnit *u = &f->pf->unit[e];
            if (u->busy && u->fn == f->fn && u->q == qi &&
                tacc_unit_hung(f->pf, u)) {
                st |= TACC_Q_STATUS_HUNG;
            }
        }
    }
    return st;
}

bool tacc_func_idle(TaccFunc *f)
{
    for (int q = 0; q < TACC_NUM_QUEUES; q++) {
        if (!(tacc_queue_status(f, q) & TACC_Q_STATUS_IDLE)) {
            return false;
        }
    }
    return true;
}

static void tacc_queue_error(TaccFunc *f, int qi, const char *why)
{
    qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: %s\n", f->fn, qi, why);
    trace_tacc_queue_error(f->fn, qi, why);
    f->q[qi].status |= TACC_Q_STATUS_ERROR;
    tacc_irq_cause(f, TACC_IRQ_QUEUE_ERROR);
}

/* ------------------------------------------------------------ fetch ---- */

/*
 * Put one fetched descriptor at the tail of queue qi's FIFO; false if it is
 * full.  The SQ fetch below and a backend that feeds a queue itself
 * (TaccFuncOps.fetch: virtio-tacc) both come through here.
 */
bool tacc_fifo_push(TaccFunc *f, int qi, const struct tacc_desc *d,
                    uint64_t t_ps)
{
    TaccQueue *q = &f->q[qi];
    TaccCmd *c;

    if (q->f_count >= TACC_FIFO_DEPTH) {
        return false;
    }
    c = &q->fifo[(q->f_head + q->f_count) % TACC_FIFO_DEPTH];
    /*
     * The whole slot: a free slot may hold anything a loaded state put there
     * (a migration stream, a VF LOAD), e.g. a listed flag that would make this
     * command wait for a LIST that never comes, even after an FLR.
     */
    *c = (TaccCmd) {
        .d = *d,        /* little-endian host assumed for the layout */
        .t_fetch_ps = t_ps,
        .seq = ++f->pf->fetch_seq,
    };
    tacc_counters_begin(f->pf);
    q->f_count++;
    if (!q->running && q->f_count == 1) {
        q->ready_ps = MAX(q->ready_ps, t_ps);
    }
    f->cnt[TACC_CNT_queue0_depth_hwm + qi] =
        MAX(f->cnt[TACC_CNT_queue0_depth_hwm + qi], q->f_count);
    trace_tacc_fetch(f->fn, qi, c->d.opcode, c->d.job, c->d.index);
    return true;
}

static void tacc_fetch(TaccFunc *f, int qi, uint64_t t_ps)
{
    TaccQueue *q = &f->q[qi];
    struct tacc_desc d;
    uint64_t t_up;

    if (f->ops) {
        if (tacc_queue_on(f, q)) {
            f->ops->fetch(f, qi, t_ps);
        }
        return;
    }
    if (!q->sq_size || tacc_vfmig_stopped(f)) {
        return;     /* never enabled with it; or a VF stopped for migration */
    }
    while (tacc_queue_on(f, q) && q->f_count < TACC_FIFO_DEPTH &&
           q->sq_head != q->sq_tail) {
        uint64_t addr = q->sq_base + (uint64_t)q->sq_head * TACC_DESC_SIZE;

        if (tacc_func_dma(f, addr, &d, TACC_DESC_SIZE, false) != MEMTX_OK) {
            f->cnt[TACC_CNT_dma_errors]++;
            f->pf->gt.dma_errors++;
            tacc_queue_error(f, qi, "descriptor fetch DMA failed");
            return;
        }
        /*
         * The descriptor arrives once the link is up (out of L0s/L1): the
         * command is ready then, an event of the scheduler (lpm_fetch_ps).
         */
        t_up = tacc_link_ctrl(f, false, addr, TACC_DESC_SIZE);
        if (t_up > t_ps) {
            TaccState *s = f->pf;

            if (!s->lpm_fetch_ps || t_up < s->lpm_fetch_ps) {
                s->lpm_fetch_ps = t_up;
            }
        }
        q->sq_head = (q->sq_head + 1) % q->sq_size;
        if (tacc_fifo_push(f, qi, &d, MAX(t_ps, t_up))) {
            /* t_fetch: when the fetch was issued (trace records) */
            q->fifo[(q->f_head + q->f_count - 1) % TACC_FIFO_DEPTH].t_fetch_ps =
                t_ps;
        }
    }
}

/* ------------------------------------------------------- completion ---- */

static bool tacc_cq_write(TaccFunc *f, int qi, struct tacc_cqe *cqe)
{
    TaccQueue *q = &f->q[qi];
    TaccState *s = f->pf;
    struct tacc_cqe out = *cqe;

    if (f->ops) {
        f->cnt[TACC_CNT_jobs_completed]++;
        s->gt.jobs++;
        trace_tacc_cqe(f->fn, qi, cqe->job, cqe->status, cqe->start, cqe->end);
        f->ops->complete(f, qi, cqe);
        return true;
    }
    if (!q->cq_size) {
        tacc_queue_error(f, qi, "completion with no CQ");
        return true;
    }
    if ((q->cq_tail + 1) % q->cq_size == q->cq_head) {
        return false;                   /* full: retried on CQ_HEAD write */
    }
    if (s->fi_corrupt_next_cqe) {
        s->fi_corrupt_next_cqe = false;
        out.job = ~out.job;
        out.status = TACC_ST_CORRUPT;
        trace_tacc_fi_corrupt_cqe(f->fn, qi);
    }
    if (tacc_func_dma(f, q->cq_base + (uint64_t)q->cq_tail * TACC_CQE_SIZE,
                      &out, TACC_CQE_SIZE, true) != MEMTX_OK) {
        f->cnt[TACC_CNT_dma_errors]++;
        s->gt.dma_errors++;
        tacc_queue_error(f, qi, "completion DMA failed");
        return true;
    }
    tacc_link_ctrl(f, true, q->cq_base + (uint64_t)q->cq_tail * TACC_CQE_SIZE,
                   TACC_CQE_SIZE);
    q->cq_tail = (q->cq_tail + 1) % q->cq_size;
    f->cnt[TACC_CNT_jobs_completed]++;
    s->gt.jobs++;
    trace_tacc_cqe(f->fn, qi, cqe->job, cqe->status, cqe->start, cqe->end);
    return true;
}

static void tacc_queue_irq(TaccFunc *f, int qi)
{
    if (f->q[qi].ctrl & TACC_Q_CTRL_IRQ) {
        tacc_msix_notify(f, TACC_MSIX_QUEUE(qi));
    }
}

static void tacc_unit_free(TaccState *s, TaccUnit *u)
{
    u->busy = false;
    if (s->host_unit == u) {
        s->host_unit = NULL;    /* aborted while the model waited for it */
    }
    tacc_exec_drop(&u->res);
    if (u->res.gemm) {          /* aborted: drop the result */
        tacc_gemm_job_free(s, u->res.gemm);
        u->res.gemm = NULL;
    }
}

/* Engine busy time is charged to the function and to the ground truth. */
static void tacc_charge_engine(TaccFunc *f, TaccUnit *u, uint64_t end_ps)
{
    TaccState *s = f->pf;
    uint64_t busy = end_ps - u->start_ps;

    if (u->engine >= TACC_NUM_ENGINES) {
        return;
    }
    tacc_counters_begin(s);
    f->busy_ps[u->engine] += busy;
    f->cnt[TACC_CNT_busy_dma_h2d + u->engine] =
        f->busy_ps[u->engine] / PS_PER_NS;
    f->cnt[TACC_CNT_cmds_dma_h2d + u->engine]++;
    s->gt.busy_ps[u->engine] += busy;
}

static void tacc_unit_complete(TaccState *s, TaccUnit *u, uint64_t t)
{
    TaccFunc *f = tacc_func(s, u->fn);
    TaccResult *r = &u->res;
    TaccQueue *q;
    TaccCmd *c = &u->cmd;

    if (!f) {
        tacc_unit_free(s, u);
        return;
    }
    u->busy = false;
    q = &f->q[u->q];
    tacc_counters_begin(s);

    if (r->gemm) {
        r->status = tacc_gemm_finish(f, u->q, c, r);
    }
    tacc_copy_land(f, u->q, c, r);      /* the last step's data */
    if (r->post_write && r->status == TACC_ST_OK) {
        uint64_t v = c->d.opcode == TACC_OP_TIMESTAMP ? t / PS_PER_NS
                                                       : r->post_value;
        uint64_t le = cpu_to_le64(v);
        uint64_t wbase, wsize;

        tacc_window(f, &wbase, &wsize);
        if (r->post_write_devmem && r->post_addr < wsize &&
            8 <= wsize - r->post_addr) {
            /* the window the function has now (the PF may have moved it) */
            memcpy(s->devmem + wbase + r->post_addr, &le, 8);
        } else if (r->post_write_devmem) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d: fence/timestamp at "
                          "window offset 0x%" PRIx64 " outside its window now\n",
                          f->fn, r->post_addr);
            r->status = TACC_ST_MMU_FAULT;
        } else if (tacc_dma_write(f, r->post_addr, &le, 8) != MEMTX_OK) {
            f->cnt[TACC_CNT_dma_errors]++;
            s->gt.dma_errors++;
            tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
            r->status = TACC_ST_DMA_ERROR;
        }
    }

    /* counters */
    f->cnt[TACC_CNT_h2d_bytes] += r->h2d_bytes;
    f->cnt[TACC_CNT_d2h_bytes] += r->d2h_bytes;
    f->cnt[TACC_CNT_h2d_tlps] += r->h2d_tlps;
    f->cnt[TACC_CNT_d2h_tlps] += r->d2h_tlps;
    f->cnt[TACC_CNT_h2d_link_bytes] += r->h2d_link;
    f->cnt[TACC_CNT_d2h_link_bytes] += r->d2h_link;
    f->cnt[TACC_CNT_d2h_req_tlps] += r->req_tlps;
    f->cnt[TACC_CNT_dllp_h2d_bytes] += r->dllp_bytes[0];
    f->cnt[TACC_CNT_dllp_d2h_bytes] += r->dllp_bytes[1];
    f->cnt[TACC_CNT_tlb_hits] += r->tlb_hits;
    f->cnt[TACC_CNT_tlb_misses] += r->tlb_misses;
    f->cnt[TACC_CNT_tlb_walk_reads] += r->walk_reads;
    f->cnt[TACC_CNT_flops] += r->flops;
    if (r->bf16) {
        f->cnt[TACC_CNT_flops_bf16] += r->flops;
    }
    f->cnt[TACC_CNT_compute_ideal_ticks] += r->ideal_ps / PS_PER_NS;
    f->cnt[TACC_CNT_devmem_read_bytes] += r->devmem_rd;
    f->cnt[TACC_CNT_devmem_write_bytes] += r->devmem_wr;
    f->cnt[TACC_CNT_cmds_completed]++;
    f->stall_ps += u->stall_ps;
    f->cnt[TACC_CNT_link_stall_ticks] = f->stall_ps / PS_PER_NS;
    tacc_charge_engine(f, u, t);
    s->gcnt[TACC_CNT_link_h2d_bytes] += r->h2d_link;
    s->gcnt[TACC_CNT_link_d2h_bytes] += r->d2h_link;
    s->gcnt[TACC_CNT_link_h2d_payload] += r->h2d_bytes;
    s->gcnt[TACC_CNT_link_d2h_payload] += r->d2h_bytes;
    s->gt.h2d_bytes += r->h2d_bytes;
    s->gt.d2h_bytes += r->d2h_bytes;
    s->gt.h2d_link_bytes += r->h2d_link;
    s->gt.d2h_link_bytes += r->d2h_link;
    s->gt.cmds++;
    s->gt.flops += r->flops;

    tacc_trace_record(f, u, t);
    trace_tacc_complete(f->fn, u->q, u->engine, c->d.job, c->d.index,
                        r->status, u->start_ps / PS_PER_NS, t / PS_PER_NS);

    if (c->listed) {
        /* a listed command: the LIST at the FIFO head goes on (tacc-list.c) */
        f->cnt[TACC_CNT_list_cmds]++;
        q->running = false;
        q->ready_ps = t;
        tacc_list_step(f, u->q, c, r->status);
        return;
    }
    if (q->list_on) {
        /* the LIST's end: it leaves the FIFO like any command */
        f->cnt[TACC_CNT_list_launches]++;
        if (r->status == TACC_ST_NOT_PERMITTED || r->status == TACC_ST_BAD_LIST) {
            f->cnt[TACC_CNT_list_errors]++;
        }
        tacc_list_reset(q);
    }

    /* the queue moves on */
    q->f_head = (q->f_head + 1) % TACC_FIFO_DEPTH;
    q->f_count--;
    q->running = false;
    q->ready_ps = t;

    if (r->status != TACC_ST_OK || (c->d.flags & TACC_DESC_F_LAST)) {
        struct tacc_cqe cqe = {
            .job = cpu_to_le32(c->d.job),
            .status = cpu_to_le16(r->status),
            .queue = u->q,
            .tag = cpu_to_le64(c->d.tag),
            .start = cpu_to_le64(q->job_start_ps / PS_PER_NS),
            .end = cpu_to_le64(t / PS_PER_NS),
        };
        q->job_open = false;
        q->skipping = r->status != TACC_ST_OK &&
                      !(c->d.flags & TACC_DESC_F_LAST);
        if (!tacc_cq_write(f, u->q, &cqe)) {
            q->cqe_pending = true;
            q->pending_cqe = cqe;
            q->pending_irq = true;
        } else {
            tacc_queue_irq(f, u->q);
        }
    } else if (c->d.flags & TACC_DESC_F_IRQ) {
        tacc_queue_irq(f, u->q);
    }
    tacc_fetch(f, u->q, t);
}

/* The TLPs of a link step go to the TLP capture, when it is on. */
static void tacc_unit_tlpcap(TaccState *s, TaccUnit *u, uint64_t pos,
                             uint64_t c, uint64_t st)
{
    TaccFunc *f = tacc_func(s, u->fn);
    const struct tacc_desc *d = &u->cmd.d;
    bool h2d = u->res.link_kind == TACC_LINK_H2D;
    TaccTlpSrc t = {
        .f = f, .q = u->q, .cmd = &u->cmd, .len = u->res.link_payload,
    };

    if (!f || !tacc_tlpcap_wanted(s, f, false)) {
        return;
    }
    if (u->res.post_write) {            /* fence, timestamp: a bus address */
        t.bus = true;
        t.host = t.dev_off = u->res.post_addr;
    } else {
        t.host = h2d ? d->copy.src : d->copy.dst;
        t.dev_off = h2d ? d->copy.dst : d->copy.src;
    }
    if (h2d) {
        tacc_tlpcap_read(s, &t, pos, c, st);
    } else {
        tacc_tlpcap_write(s, &t, pos, c, st);
    }
}

/*
 * One link step of a unit at time t: the next chunk of its payload.  The
 * step's primary direction (down for a host read's completions, up for a
 * host write) is reserved for t_link(its bytes) from when it is free: the
 * step waits for it (link_stall_ticks).  The other direction's bytes (read
 * requests, DLLPs) interleave with whatever that direction carries, TLP by
 * TLP, so they extend its occupancy (delaying the transfers behind them)
 * without waiting for it.  The step lasts at least its own bytes' time in
 * each direction and what flow control allows (tags: tacc_link_fc_ps,
 * posted credits: tacc_link_posted).
 */
static void tacc_unit_link_step(TaccState *s, TaccUnit *u, uint64_t t)
{
    uint64_t c = MIN(u->link_left, TACC_CHUNK_BYTES);
    uint64_t pos = u->res.link_payload - u->link_left;
    int prim = u->res.link_kind == TACC_LINK_H2D ? 0 : 1;
    uint64_t st, end;
    TaccLinkCount lc;

    /* a link in L0s/L1 first leaves it (tacc-linkpm.c): the step pays that */
    t = tacc_lpm_wake(s, t);
    st = t;
    /* the TLPs that start in [pos, pos + c): see tacc_link_cost() */
    tacc_link_cost(s, &u->res, pos, c, &lc);
    end = t + tacc_link_fc_ps(s, u->res.link_kind, c, lc.tlps[1]);
    for (int d = 0; d < 2; d++) {
        uint64_t dur;
        if (!lc.bytes[d]) {
            continue;
        }
        dur = tacc_link_ps(s, lc.bytes[d]);
        if (d == prim) {
            st = MAX(t, s->link_free_ps[d]);
            s->link_free_ps[d] = st + dur;
            end = MAX(end, st + dur);
        } else {
            s->link_free_ps[d] = MAX(t, s->link_free_ps[d]) + dur;
            end = MAX(end, t + dur);
        }
        s->link_busy_ps[d] += dur;
    }
    if (u->res.link_kind == TACC_LINK_D2H) {
        /* posted credits: taken when the step's writes go out */
        end = MAX(end, tacc_link_posted(s, st, lc.tlps[1], c));
    }
    u->stall_ps += st - t;
    tacc_lpm_busy(s, end);
    tacc_unit_tlpcap(s, u, pos, c, st);
    u->link_left -= c;
    u->res.land_len = c;        /* lands when the step ends */
    u->next_ps = end;
}

static void tacc_unit_step(TaccState *s, TaccUnit *u, uint64_t t)
{
    TaccFunc *f;

    switch (u->phase) {
    case TACC_PHASE_PRE:
    case TACC_PHASE_LINK:
        if (u->link_left && u->res.land_len) {
            /* the previous step ended: its data lands */
            f = tacc_func(s, u->fn);
            if (f && !tacc_copy_land(f, u->q, &u->cmd, &u->res)) {
                u->link_left = 0;       /* a DMA error ends the copy */
            }
        }
        if (u->link_left) {
            u->phase = TACC_PHASE_LINK;
            tacc_unit_link_step(s, u, t);
            return;
        }
        u->phase = TACC_PHASE_POST;
        u->next_ps = t + u->res.post_ps;
        return;
    default:
        tacc_unit_complete(s, u, t);
    }
}

/* ---------------------------------------------------------- dispatch ---- */

static TaccCmd *tacc_queue_head(TaccFunc *f, int qi, uint64_t t);

/*
 * A BARRIER of queue qi starts when every command the function's other
 * enabled queues fetched before it has completed (docs/hardware.md section
 * 3).  A queue runs in order, so its oldest command is its head (running or
 * not); barriers wait only for older commands, so two queues' barriers never
 * wait for each other.
 */
static bool tacc_barrier_ok(TaccFunc *f, int qi, uint64_t t)
{
    uint64_t seq = f->q[qi].fifo[f->q[qi].f_head].seq;

    for (int o = 0; o < TACC_NUM_QUEUES; o++) {
        TaccQueue *q = &f->q[o];
        if (o == qi || !tacc_queue_on(f, q)) {
            continue;
        }
        if (!q->running) {
            tacc_queue_head(f, o, t);   /* drops what a failed job skips */
        }
        if (q->f_count && q->fifo[q->f_head].seq < seq) {
            return false;
        }
    }
    return true;
}

static bool tacc_func_runs(TaccFunc *f)
{
    return f && (f->ctrl & TACC_CTRL_ENABLE) && !f->status_fatal &&
           tacc_func_active(f) && !tacc_vfmig_stopped(f);
}

/*
 * Is the head command of queue qi ready to start at time t?  Drops the
 * commands a failed job skips on the way.
 */
static TaccCmd *tacc_queue_head(TaccFunc *f, int qi, uint64_t t)
{
    TaccQueue *q = &f->q[qi];

    while (tacc_queue_on(f, q) && !q->running && !q->cqe_pending &&
           q->f_count && q->ready_ps <= t) {
        TaccCmd *c = &q->fifo[q->f_head];
        if (!q->skipping) {
            /* a LIST: the listed command it runs now */
            return c->d.opcode == TACC_OP_LIST ? tacc_list_head(f, qi, t) : c;
        }
        trace_tacc_skip(f->fn, qi, c->d.job, c->d.index);
        if (c->d.flags & TACC_DESC_F_LAST) {
            q->skipping = false;
        }
        q->f_head = (q->f_head + 1) % TACC_FIFO_DEPTH;
        q->f_count--;
        tacc_fetch(f, qi, t);
    }
    return NULL;
}

static void tacc_start_timing(TaccUnit *u, uint64_t t)
{
    u->link_left = u->res.link_kind != TACC_LINK_NONE ? u->res.link_payload : 0;
    u->next_ps = t + u->res.pre_ps;
}

static void tacc_start(TaccState *s, TaccFunc *f, int qi, int unit,
                       uint64_t t)
{
    TaccQueue *q = &f->q[qi];
    TaccUnit *u = &s->unit[unit];

    u->busy = true;
    u->fn = f->fn;
    u->q = qi;
    u->engine = unit < TACC_NUM_ENGINES ? unit : TACC_ENGINE_LOCAL;
    u->cmd = q->list_on ? q->list_cur : q->fifo[q->f_head];
    if (u->cmd.listed && !q->list_start_ps) {
        q->list_start_ps = t;
    }
    u->start_ps = t;
    u->stall_ps = 0;
    u->phase = TACC_PHASE_PRE;
    q->running = true;
    if (!q->job_open) {
        q->job_open = true;
        q->job_start_ps = t;
    }
    tacc_exec(f, qi, &u->cmd, t, &u->res);
    trace_tacc_dispatch(f->fn, qi, unit, u->cmd.d.opcode, t / PS_PER_NS);
    if (u->res.work) {
        /* host work left: the model waits here (see "host work" below) */
        s->host_unit = u;
        s->host_gemm = false;
        s->host_t = t;
        u->next_ps = t;
        trace_tacc_host_wait(f->fn, qi, t / PS_PER_NS, false);
        return;
    }
    tacc_start_timing(u, t);
}

/*
 * Arbitration cost of a command (tacc_hw.h TACC_REG_ARB_WEIGHT): the bytes
 * a copy or fill moves, one quantum for anything else.  A bad length (it
 * fails at once) costs at most the largest valid one.
 */
static uint64_t tacc_arb_cost(const TaccCmd *c)
{
    switch (c->d.opcode) {
    case TACC_OP_COPY_H2D:
    case TACC_OP_COPY_D2H:
    case TACC_OP_COPY_D2D:
        return MIN(c->d.copy.len, TACC_COPY_MAX_LEN);
    case TACC_OP_FILL:
        return MIN(c->d.fill.len, TACC_COPY_MAX_LEN);
    default:
        return TACC_ARB_QUANTUM;
    }
}

static uint64_t tacc_arb_quantum(TaccState *s, int fn)
{
    return (uint64_t)MAX(s->arb_weight[fn], 1) * TACC_ARB_QUANTUM;
}

/*
 * The queue (round-robin from the function's pointer) whose head is of
 * class cls, or -1.
 */
static int tacc_arb_head(TaccFunc *f, int cls, uint64_t t, uint64_t *cost)
{
    if (!tacc_func_runs(f)) {
        return -1;
    }
    for (int j = 0; j < TACC_NUM_QUEUES; j++) {
        int qi = (f->rr_queue[cls] + j) % TACC_NUM_QUEUES;
        TaccCmd *c = tacc_queue_head(f, qi, t);

        if (c && tacc_cmd_class(c) == cls) {
            *cost = tacc_arb_cost(c);
            return qi;
        }
    }
    return -1;
}

/*
 * A whole round passed and no backlogged function's deficit covers its
 * head: add the rounds it takes until the first one does (what that many
 * turns would add), so a big command costs no loop per quantum.
 */
static void tacc_arb_skip_rounds(TaccState *s, int cls, const int *hq,
                                 const uint64_t *cost)
{
    uint64_t k = UINT64_MAX;

    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        if (hq[fn] >= 0) {
            uint64_t q = tacc_arb_quantum(s, fn);
            uint64_t need = cost[fn] - s->deficit[cls][fn];

            k = MIN(k, need / q + (need % q != 0));
        }
    }
    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        if (hq[fn] >= 0 && k > 1) {
            s->deficit[cls][fn] += (k - 1) * tacc_arb_quantum(s, fn);
        }
    }
}

/*
 * Deficit round-robin over functions (the turn holder runs head commands
 * while its deficit covers their cost; each new turn adds weight * quantum;
 * a function with nothing to run loses its deficit), round-robin over a
 * function's queues.
 */
static bool tacc_arbitrate(TaccState *s, int cls, uint64_t t,
                           TaccFunc **pf, int *pq)
{
    uint64_t cost[TACC_NUM_FUNCS];
    int hq[TACC_NUM_FUNCS];
    bool any = false;

    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        hq[fn] = tacc_arb_head(tacc_func(s, fn), cls, t, &cost[fn]);
        if (hq[fn] < 0) {
            s->deficit[cls][fn] = 0;
        }
        any |= hq[fn] >= 0;
    }
    if (!any) {
        return false;
    }
    for (int passes = 0;; passes++) {
        int fn = s->rr_fn[cls];

        if (hq[fn] >= 0 && s->deficit[cls][fn] >= cost[fn]) {
            s->deficit[cls][fn] -= cost[fn];
            *pf = tacc_func(s, fn);
            *pq = hq[fn];
            (*pf)->rr_queue[cls] = (hq[fn] + 1) % TACC_NUM_QUEUES;
            return true;
        }
        if (passes == TACC_NUM_FUNCS) {
            tacc_arb_skip_rounds(s, cls, hq, cost);
            passes = 0;
        }
        fn = (fn + 1) % TACC_NUM_FUNCS;     /* the turn passes */
        s->rr_fn[cls] = fn;
        if (hq[fn] >= 0) {
            s->deficit[cls][fn] += tacc_arb_quantum(s, fn);
        }
    }
}

static void tacc_dispatch(TaccState *s, uint64_t t)
{
    bool progress = true;

    while (progress) {
        progress = false;
        /* queue-local commands */
        for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
            TaccFunc *f = tacc_func(s, fn);
            if (!tacc_func_runs(f)) {
                continue;
            }
            for (int qi = 0; qi < TACC_NUM_QUEUES; qi++) {
                TaccCmd *c = tacc_queue_head(f, qi, t);
                if (!c || tacc_cmd_class(c) != TACC_CLASS_LOCAL) {
                    continue;
                }
                if (c->d.opcode == TACC_OP_BARRIER && !c->preset &&
                    !tacc_barrier_ok(f, qi, t)) {
                    continue;
                }
                tacc_start(s, f, qi, TACC_UNIT_LOCAL(fn, qi), t);
                progress = true;
                if (s->host_unit) {
                    return;
                }
            }
        }
        /* shared engines */
        for (int e = 0; e < TACC_NUM_ENGINES; e++) {
            int cls = e == TACC_ENGINE_DMA_H2D ? TACC_CLASS_H2D :
                      e == TACC_ENGINE_DMA_D2H ? TACC_CLASS_D2H :
                      TACC_CLASS_COMPUTE;
            TaccFunc *f;
            int qi;

            if (s->unit[e].busy || !tacc_arbitrate(s, cls, t, &f, &qi)) {
                continue;
            }
            tacc_start(s, f, qi, e, t);
            progress = true;
            if (s->host_unit) {
                return;         /* the rest of this dispatch waits for it */
            }
        }
    }
}

/* ---------------------------------------------------------- the loop ---- */

static TaccUnit *tacc_next_event(TaccState *s)
{
    TaccUnit *best = NULL;

    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccUnit *u = &s->unit[i];
        if (u->busy && !tacc_unit_hung(s, u) &&
            (!best || u->next_ps < best->next_ps)) {
            best = u;
        }
    }
    return best;
}

/*
 * Host work.  The model computes a command's result when it is dispatched
 * (copies, eltwise) or on a worker thread (big GEMMs) and needs it to go on:
 * a copy's duration depends on the bytes it moved before a fault, a GEMM's
 * C is written at its completion.  When that host work is not finished, the
 * model stops at that point (s->host_unit, at modelled time s->host_t) and
 * nothing of the device advances past it:
 *  - the rest of a big copy/eltwise/FILL/GEMM operand gather is done
 *    host_slice bytes per main-loop turn by host_bh (a guarded bottom half),
 *    so the main loop, QMP, qtest and other devices keep running; doorbells
 *    do not wait for it (tacc-regs.c);
 *  - a big GEMM computes on QEMU's thread pool; when its completion is due
 *    before the worker has finished, the model stops there and the pool's
 *    completion callback (tacc_gemm_done) resumes it through host_bh.
 *    Nothing waits for a worker, register accesses included: until then
 *    registers show the device at that completion point.
 * Under -icount the device's timer is kept due while the model is stopped at
 * either kind, so the guest's clock does not run on meanwhile (the guest sees
 * the CQE and interrupt at the modelled time, as if the host had kept up).
 * A register access that reflects the model (most of them: tacc_sched_run)
 * first finishes a sliced copy/eltwise/FILL/gather inline, so registers never
 * show a state the device had not reached yet; the identity/clock/scratch
 * registers do not wait.  Modelled time does not depend on any of this.
 */
static bool tacc_host_ready(TaccState *s)
{
    TaccUnit *u = s->host_unit;

    if (s->host_gemm) {
        return !u->res.gemm || !u->res.gemm->in_pool;
    }
    return !u->res.work;
}

/* Is the model stopped at a big copy/eltwise/FILL/GEMM gather? */
bool tacc_host_pending(TaccState *s)
{
    return s->host_unit && !s->host_gemm;
}

/* A due completion whose GEMM worker has not finished yet. */
static bool tacc_unit_waits_host(TaccUnit *u)
{
    TaccGemmJob *j = u->res.gemm;

    return u->phase == TACC_PHASE_POST && j && j->in_pool;
}

/*
 * Finish the host work (a copy/eltwise/FILL/gather inline if not done yet;
 * a GEMM's worker has finished) and resume the model.
 */
static void tacc_host_finish(TaccState *s)
{
    TaccUnit *u = s->host_unit;
    TaccFunc *f = tacc_func(s, u->fn);

    s->ev_ps = s->host_t;
    if (s->host_gemm) {
        s->host_unit = NULL;
        return;
    }
    if (f) {
        tacc_exec_continue(f, u->q, &u->cmd, &u->res, UINT64_MAX);
    }
    s->host_unit = NULL;
    tacc_start_timing(u, s->host_t);
    tacc_dispatch(s, s->host_t);        /* the rest of the dispatch at host_t */
}

/*
 * Process the device's events up to modelled time @now.  False if it stopped
 * at host work that is not finished: a GEMM worker, or (only without
 * @wait_host) a sliced copy/eltwise/FILL/gather.
 */
static bool tacc_advance_to(TaccState *s, uint64_t now, bool wait_host)
{
    TaccUnit *u;

    for (;;) {
        if (s->host_unit) {
            /*
             * A GEMM completion waits for the pool's completion callback
             * (never for the worker itself).  Big copies, eltwise, FILL and
             * GEMM gathers go on in slices from host_bh.
             */
            if (!tacc_host_ready(s) && (s->host_gemm || !wait_host)) {
                return false;
            }
            tacc_host_finish(s);
            continue;
        }
        u = tacc_next_event(s);
        if (s->lpm_fetch_ps && s->lpm_fetch_ps <= now &&
            (!u || s->lpm_fetch_ps <= u->next_ps)) {
            /* descriptors fetched over a waking link are ready now */
            s->ev_ps = s->lpm_fetch_ps;
            s->lpm_fetch_ps = 0;
            tacc_dispatch(s, s->ev_ps);
            continue;
        }
        if (u && u->next_ps <= now) {
            uint64_t t = u->next_ps;
            if (tacc_unit_waits_host(u)) {
                s->host_unit = u;
                s->host_gemm = true;
                s->host_t = t;
                trace_tacc_host_wait(u->fn, u->q, t / PS_PER_NS, true);
                continue;
            }
            s->ev_ps = t;
            tacc_unit_step(s, u, t);
            tacc_dispatch(s, t);
            continue;
        }
        s->ev_ps = now;
        tacc_dispatch(s, now);
        if (s->host_unit) {
            continue;
        }
        u = tacc_next_event(s);
        if (!u || u->next_ps > now) {
            return true;
        }
    }
}

static void tacc_sched_advance(TaccState *s, bool wait_host)
{
    uint64_t now;
    TaccUnit *u = NULL;

    if (s->in_run) {
        return;
    }
    s->in_run = true;
    now = tacc_now_ps(s);
    tacc_advance_to(s, now, wait_host);
    u = s->host_unit ? NULL : tacc_next_event(s);
    s->gcnt[TACC_CNT_link_h2d_busy_ticks] = s->link_busy_ps[0] / PS_PER_NS;
    s->gcnt[TACC_CNT_link_d2h_busy_ticks] = s->link_busy_ps[1] / PS_PER_NS;
    tacc_lpm_counters(s, now);
    tacc_counters_end(s);

    if (s->host_unit) {
        if (icount_enabled() && !qtest_enabled()) {
            /*
             * Keep the guest's clock where the device stopped, whatever host
             * work it waits for: a due timer gives the vCPU no instructions
             * to run, and an idle vCPU's clock cannot jump to its next timer.
             */
            timer_mod(&s->timer, qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL) + 1);
        } else {
            timer_del(&s->timer);
        }
        /* host_bh resumes the model (for a GEMM: once tacc_gemm_done ran) */
        if (!s->host_gemm) {
            qemu_bh_schedule(s->host_bh);
        }
    } else if (u || s->lpm_fetch_ps) {
        uint64_t next = u ? u->next_ps : UINT64_MAX;

        if (s->lpm_fetch_ps) {
            next = MIN(next, s->lpm_fetch_ps);
        }
        timer_mod(&s->timer, DIV_ROUND_UP(next, PS_PER_NS) - s->dev_clock_off);
    } else {
        timer_del(&s->timer);
    }
    s->in_run = false;
}

/* Bring the model to "now" (register accesses, resets, QOM). */
void tacc_sched_run(TaccState *s)
{
    tacc_sched_advance(s, true);
}

/* Bring the model as far as it goes without waiting for host work (timers). */
void tacc_sched_poll(TaccState *s)
{
    tacc_sched_advance(s, false);
}

/* One slice of host work per main-loop turn, then the model goes on. */
void tacc_host_bh(void *opaque)
{
    TaccState *s = opaque;
    TaccUnit *u = s->host_unit;

    if (!tacc_enter(s, &s->func, "host work")) {
        qemu_bh_schedule(s->host_bh);   /* a nested main-loop poll: later */
        return;
    }
    if (u && !s->host_gemm) {
        TaccFunc *f = tacc_func(s, u->fn);
        if (f) {
            tacc_exec_continue(f, u->q, &u->cmd, &u->res, s->host_slice);
        }
    }
    tacc_sched_advance(s, false);
    tacc_leave(s);
}

/*
 * The scheduler's timer is an entry point like an MMIO access: it engages
 * the PF's MemReentrancyGuard (QEMU refuses the PF's own DMA into its BARs)
 * and the device-wide guard (tacc_enter: all functions, config space).  It
 * never waits for host work (host_bh resumes the model).
 */
void tacc_sched_timer(void *opaque)
{
    TaccState *s = opaque;
    MemReentrancyGuard *g = &DEVICE(s)->mem_reentrancy_guard;
    bool engaged = g->engaged_in_io;

    if (!tacc_enter(s, &s->func, "scheduler timer")) {
        return;
    }
    g->engaged_in_io = true;
    tacc_sched_advance(s, false);
    g->engaged_in_io = engaged;
    tacc_leave(s);
}

/* ------------------------------------------------- register actions ---- */

static bool tacc_pow2_in(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v >= lo && v <= hi && is_power_of_2(v);
}

/*
 * A doorbell does not wait for host work (a big copy, FILL or GEMM gather
 * going on in slices, tacc-regs.c): it fetches at "now" and the model takes
 * the commands when it gets there.
 */
void tacc_queue_doorbell(TaccFunc *f, int qi, uint32_t tail)
{
    tacc_queue_doorbell_at(f, qi, tail, tacc_now_ps(f->pf));
    tacc_sched_poll(f->pf);
}

void tacc_queue_doorbell_at(TaccFunc *f, int qi, uint32_t tail, uint64_t t)
{
    TaccQueue *q = &f->q[qi];

    trace_tacc_doorbell(f->fn, qi, tail);
    if (!tacc_queue_on(f, q)) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d q%d: doorbell on a disabled queue\n",
                      f->fn, qi);
        return;
    }
    if (!q->sq_size || tail >= q->sq_size) {
        tacc_queue_error(f, qi, "SQ tail beyond the ring");
        return;
    }
    q->sq_tail = tail;
    tacc_fetch(f, qi, t);
}

/* Abort whatever queue qi of f has on a unit (trace record: ABORTED). */
static void tacc_queue_abort(TaccFunc *f, int qi)
{
    TaccState *s = f->pf;
    uint64_t now = tacc_now_ps(s);

    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccUnit *u = &s->unit[i];
        if (u->busy && u->fn == f->fn && u->q == qi) {
            u->res.status = TACC_ST_ABORTED;
            tacc_charge_engine(f, u, MAX(now, u->start_ps));
            tacc_trace_record(f, u, MAX(now, u->start_ps));
            tacc_unit_free(s, u);
        }
    }
}

void tacc_queue_reset(TaccFunc *f, int qi)
{
    TaccQueue *q = &f->q[qi];

    tacc_queue_abort(f, qi);
    q->sq_head = q->sq_tail = q->cq_head = q->cq_tail = 0;
    q->f_head = q->f_count = 0;
    tacc_list_reset(q);
    q->running = q->skipping = q->job_open = q->cqe_pending = false;
    q->pending_irq = false;
    q->status = 0;
    q->ready_ps = 0;
    trace_tacc_queue_reset(f->fn, qi);
    if (f->ops) {
        f->ops->queue_reset(f, qi);
    }
}

/* The ring registers an enable checks; NULL if they are good. */
static const char *tacc_queue_bad_ring(TaccQueue *q)
{
    if ((q->sq_base & 0xfff) || (q->cq_base & 0xfff)) {
        return "ring base not 4 KiB aligned";
    }
    if (!tacc_pow2_in(q->sq_size, 2, 4096) ||
        !tacc_pow2_in(q->cq_size, 2, 4096)) {
        return "ring size not a power of two in 2..4096";
    }
    return NULL;
}

/*
 * Every enable (also ENABLE | RESET of a queue that was on) validates the
 * ring; a refused enable leaves ENABLE clear and STATUS.ERROR set, so no
 * queue ever runs with a ring that failed validation.
 */
void tacc_queue_ctrl(TaccFunc *f, int qi, uint32_t val)
{
    TaccQueue *q = &f->q[qi];
    bool was_on = q->ctrl & TACC_Q_CTRL_ENABLE;
    const char *bad;

    if (val & TACC_Q_CTRL_RESET) {
        tacc_queue_reset(f, qi);
        val &= ~TACC_Q_CTRL_RESET;
        was_on = false;                 /* RESET | ENABLE enables afresh */
        q->ctrl = 0;
    }
    if ((val & TACC_Q_CTRL_ENABLE) && !(tacc_queue_mask(f) & BIT(qi))) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d: queue %d is outside the function's "
                      "QUEUE_MASK 0x%x: enable refused\n", f->fn, qi,
                      tacc_queue_mask(f));
        val &= ~TACC_Q_CTRL_ENABLE;
    }
    if (!(val & TACC_Q_CTRL_ENABLE) && was_on) {
        tacc_queue_reset(f, qi);        /* disabling aborts like RESET */
    }
    if ((val & TACC_Q_CTRL_ENABLE) && !was_on) {
        tacc_queue_reset(f, qi);
        bad = tacc_queue_bad_ring(q);
        if (bad) {
            q->ctrl = val & TACC_Q_CTRL_IRQ;
            tacc_queue_error(f, qi, bad);
            return;
        }
    }
    q->ctrl = val & (TACC_Q_CTRL_ENABLE | TACC_Q_CTRL_IRQ);
    tacc_sched_poll(f->pf);
}

void tacc_queue_cq_head(TaccFunc *f, int qi, uint32_t head)
{
    TaccQueue *q = &f->q[qi];

    if (!q->cq_size || head >= q->cq_size) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d q%d: CQ head %u beyond ring\n",
                      f->fn, qi, head);
        return;
    }
    q->cq_head = head;
    if (q->cqe_pending && !tacc_vfmig_stopped(f) &&
        tacc_cq_write(f, qi, &q->pending_cqe)) {
        q->cqe_pending = false;
        if (q->pending_irq) {
            tacc_queue_irq(f, qi);
        }
        q->pending_irq = false;
    }
    tacc_sched_poll(f->pf);
}

/*
 * A VF resumed after a migration stop: fetch what its doorbells asked for
 * while it was stopped, and run.
 */
void tacc_func_kick(TaccFunc *f)
{
    uint64_t t = tacc_now_ps(f->pf);

    for (int qi = 0; qi < TACC_NUM_QUEUES; qi++) {
        if (f->q[qi].cqe_pending) {
            /* a completion that waited for CQ space: its head may have moved */
            tacc_queue_cq_head(f, qi, f->q[qi].cq_head);
        }
        tacc_fetch(f, qi, t);
    }
    tacc_sched_poll(f->pf);
}

void tacc_func_abort_all(TaccFunc *f)
{
    for (int q = 0; q < TACC_NUM_QUEUES; q++) {
        TaccQueue *qq = &f->q[q];
        tacc_queue_reset(f, q);
        qq->ctrl = 0;
        qq->sq_base = qq->cq_base = 0;
        qq->sq_size = qq->cq_size = 0;
    }
}
