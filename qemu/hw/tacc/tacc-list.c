/*
 * tacc: command lists (TACC_OP_LIST, docs/hardware.md section 14).
 *
 * A LIST at the head of a queue makes the queue run the listed commands
 * one after another instead of its FIFO: tacc_list_head() gives the
 * scheduler the current listed command (read through the MMU from list
 * memory, its patches applied, checked for what only a list forbids), and
 * tacc_list_step() moves on when it completes.  After the last command (or
 * the first failing one) the LIST itself runs as a local command carrying
 * the list's status: its record, and its completion entry when it ends the
 * job.  The list is never copied whole nor written: it is read command by
 * command, so the host may rebuild it between launches, and count bounds
 * what one launch can do (no nesting: a listed LIST is refused).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "tacc.h"

void tacc_list_reset(TaccQueue *q)
{
    q->list_on = q->list_cur_ok = q->list_end = false;
    q->list_pos = q->list_patch = 0;
    q->list_status = 0;
    q->list_fail_tag = 0;
    q->list_start_ps = 0;
}

/* The LIST descriptor's own checks. */
static uint16_t tacc_list_check(const struct tacc_desc *d)
{
    if (!d->list.list_id || d->list.rsvd || d->list.rsvd2 ||
        (!d->list.npatch && d->list.patches)) {
        return TACC_ST_BAD_LIST;
    }
    if (!d->list.count || d->list.count > TACC_LIST_MAX_CMDS ||
        d->list.npatch > TACC_LIST_MAX_PATCHES) {
        return TACC_ST_BAD_LENGTH;
    }
    if ((d->list.list & (TACC_DESC_SIZE - 1)) ||
        (d->list.patches & (TACC_LIST_PATCH_SIZE - 1))) {
        return TACC_ST_BAD_ALIGN;
    }
    return TACC_ST_OK;
}

/* Apply one patch entry to a fetched payload; false if it is malformed. */
static bool tacc_list_patch(struct tacc_desc *d, const struct tacc_list_patch *p,
                            const uint32_t *params)
{
    unsigned off = le16_to_cpu(p->offset);
    uint64_t mult = le64_to_cpu(p->mult);
    uint32_t v;

    if (p->param >= TACC_LIST_PARAMS) {
        return false;
    }
    v = le32_to_cpu(params[p->param]);
    switch (p->op) {
    case TACC_PATCH_SET32:
        if ((off & 3) || off + 4 > sizeof(d->payload) || mult) {
            return false;
        }
        stl_le_p(d->payload + off, v);
        return true;
    case TACC_PATCH_ADD32:
        if ((off & 3) || off + 4 > sizeof(d->payload)) {
            return false;
        }
        stl_le_p(d->payload + off,
                 ldl_le_p(d->payload + off) + (uint32_t)(v * mult));
        return true;
    case TACC_PATCH_ADD64:
        if ((off & 7) || off + 8 > sizeof(d->payload)) {
            return false;
        }
        stq_le_p(d->payload + off, ldq_le_p(d->payload + off) + v * mult);
        return true;
    default:
        return false;
    }
}

/*
 * Fetch listed command q->list_pos into q->list_cur: the descriptor, then
 * the patches of that command (the table is sorted by command).  The fetch
 * is timed like an operand read: walks, then device-memory bandwidth or a
 * host read over the link (docs/hardware.md section 14).
 */
static void tacc_list_fetch(TaccFunc *f, int qi, TaccCmd *lc, uint64_t t)
{
    TaccState *s = f->pf;
    TaccQueue *q = &f->q[qi];
    const struct tacc_desc *ld = &lc->d;
    TaccCmd *cur = &q->list_cur;
    TaccResult sc;
    uint64_t total = TACC_DESC_SIZE, host;
    uint16_t st;

    memset(cur, 0, sizeof(*cur));
    memset(&sc, 0, sizeof(sc));
    cur->t_fetch_ps = t;
    cur->seq = lc->seq;
    cur->listed = true;
    cur->list_id = ld->list.list_id;
    cur->list_index = ld->index;
    st = tacc_exec_read(f, qi, lc, ld->list.list +
                        (uint64_t)q->list_pos * TACC_DESC_SIZE,
                        &cur->d, TACC_DESC_SIZE, &sc);
    while (!st && q->list_patch < ld->list.npatch) {
        struct tacc_list_patch p;

        st = tacc_exec_read(f, qi, lc, ld->list.patches +
                            (uint64_t)q->list_patch * TACC_LIST_PATCH_SIZE,
                            &p, sizeof(p), &sc);
        total += sizeof(p);
        if (st || le32_to_cpu(p.cmd) > q->list_pos) {
            break;              /* a later command's (or a fault) */
        }
        if (le32_to_cpu(p.cmd) < q->list_pos ||
            !tacc_list_patch(&cur->d, &p, ld->list.params)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: list %u patch %u "
                          "malformed\n", f->fn, qi, ld->list.list_id,
                          q->list_patch);
            st = TACC_ST_BAD_LIST;
            break;
        }
        q->list_patch++;
    }
    if (st) {
        cur->d.opcode = TACC_OP_LIST;   /* the record shows the list failing */
    } else if (cur->d.flags) {
        st = TACC_ST_BAD_LIST;
    } else if (cur->d.opcode == TACC_OP_FILL || cur->d.opcode == TACC_OP_BARRIER) {
        st = TACC_ST_NOT_PERMITTED;     /* kernel only / waits on other queues */
    } else if (cur->d.opcode == TACC_OP_LIST) {
        st = TACC_ST_BAD_LIST;          /* depth TACC_LIST_MAX_DEPTH */
    }
    if (st && st != TACC_ST_MMU_FAULT && st != TACC_ST_BAD_CTX) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: list %u command %u "
                      "refused: status %u\n", f->fn, qi, ld->list.list_id,
                      q->list_pos, st);
    }
    /* it runs in the LIST's context and job, at its place in the list */
    cur->d.ctx = ld->ctx;
    cur->d.job = ld->job;
    cur->d.index = q->list_pos;
    cur->d.flags = 0;
    cur->preset = st;
    /* the fetch's time: walks, and the bytes from where the list lives */
    host = total > sc.devmem_rd ? total - sc.devmem_rd : 0;
    cur->fetch_hits = sc.tlb_hits;
    cur->fetch_misses = sc.tlb_misses;
    cur->fetch_walks = sc.walk_reads;
    cur->fetch_ps = tacc_scale_ps(s, (uint64_t)s->walk_latency_ns *
                                  sc.walk_reads * PS_PER_NS) +
                    tacc_roofline_ps(s, 0, sc.devmem_rd, false);
    if (host) {
        cur->fetch_ps += tacc_scale_ps(s, s->read_latency_ns * PS_PER_NS) +
                         tacc_link_ps(s, host);
    }
    tacc_counters_begin(s);
    f->cnt[TACC_CNT_devmem_read_bytes] += sc.devmem_rd;
}

/* The command queue qi runs now for the LIST at its head. */
TaccCmd *tacc_list_head(TaccFunc *f, int qi, uint64_t t)
{
    TaccQueue *q = &f->q[qi];
    TaccCmd *lc = &q->fifo[q->f_head];
    TaccCmd *cur = &q->list_cur;

    if (!q->list_on) {
        uint16_t st = tacc_list_check(&lc->d);

        tacc_list_reset(q);
        q->list_on = true;
        if (st) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: bad LIST: "
                          "status %u\n", f->fn, qi, st);
            q->list_status = st;
            q->list_fail_tag = lc->d.tag;
            q->list_end = true;
        }
    }
    if (q->list_cur_ok) {
        return cur;
    }
    if (q->list_end) {
        /* the LIST itself: a local command carrying the list's status */
        *cur = *lc;
        cur->preset = q->list_status;
        cur->list_id = lc->d.list.list_id;
        cur->list_index = lc->d.index;
        cur->list_start_ps = q->list_start_ps;
        if (q->list_status) {
            cur->d.tag = q->list_fail_tag;      /* the CQE names the culprit */
        }
    } else {
        tacc_list_fetch(f, qi, lc, t);
    }
    q->list_cur_ok = true;
    return cur;
}

/*
 * Listed command @c of queue qi completed with @status: the next one, or
 * the LIST's end.  True when the list goes on.
 */
bool tacc_list_step(TaccFunc *f, int qi, const TaccCmd *c, uint16_t status)
{
    TaccQueue *q = &f->q[qi];
    const struct tacc_desc *ld = &q->fifo[q->f_head].d;

    q->list_cur_ok = false;
    if (status != TACC_ST_OK) {
        q->list_status = status;
        q->list_fail_tag = c->d.tag;
        q->list_end = true;
    } else if (++q->list_pos >= ld->list.count) {
        q->list_end = true;
    }
    return !q->list_end;
}
