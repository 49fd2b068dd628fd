/*
 * tacc: timing model (PCIe link, compute, device memory).
 *
 * Every duration is computed here, in picoseconds of modelled time, and
 * documented in docs/hardware.md ("Timing model").  The formulas must stay
 * in step with that document and with tools/bench/bench_link.py.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "tacc.h"

unsigned tacc_link_rate_gt(TaccState *s)
{
    switch (s->lnk_gen) {     /* negotiated (x-link-gen-now) */
    case 3:
        return 8;
    case 5:
        return 32;
    default:
        return 16;
    }
}

uint64_t tacc_scale_ps(TaccState *s, uint64_t ps)
{
    if (s->time_scale == 1000) {
        return ps;
    }
    return muldiv64(ps, s->time_scale, 1000);
}

/*
 * Time to move @bytes over one direction of the link, SKP ordered sets
 * included (one block after every TACC_LINK_SKP_INTERVAL data blocks):
 *   bytes * 8 bit / (lanes * rate GT/s * 128/130) * (SKP + 1) / SKP
 * = ceil(bytes * 8 * 130 * 1000 * 371 / (lanes * rate * 128 * 370)) ps
 */
static uint64_t tacc_link_raw_ps(TaccState *s, uint64_t bytes)
{
    uint64_t den = (uint64_t)s->lnk_width * tacc_link_rate_gt(s) *
                   TACC_LINK_ENC_NUM * TACC_LINK_SKP_INTERVAL;
    uint64_t num = 8 * TACC_LINK_ENC_DEN * 1000 *
                   (TACC_LINK_SKP_INTERVAL + 1);
    /* bytes < 2^34 here (steps, control traffic), so no overflow */
    return (bytes * num + den - 1) / den;
}

uint64_t tacc_link_ps(TaccState *s, uint64_t bytes)
{
    return tacc_scale_ps(s, tacc_link_raw_ps(s, bytes));
}

/* #{x in (0, len) : (off + x) % period == 0}, off < period */
static uint64_t tacc_cuts(uint64_t off, uint64_t len, uint64_t period)
{
    return len ? (off % period + len - 1) / period : 0;
}

/*
 * Payload TLPs of the first @len bytes of a memory write (D2H) whose
 * host-side and device-side addresses start at offsets @host_off and
 * @dev_off: the DMA engine moves bursts of at most MPS bytes that never
 * cross an MPS boundary of the device-side address and splits each burst
 * again at the MPS boundaries of the host-side address, so [0, len) is cut
 * at every x in (0, len) where (dev_off + x) or (host_off + x) is a
 * multiple of MPS:
 *   tlps = 1 + cuts(dev_off) + (same offset mod MPS ? 0 : cuts(host_off))
 * Aligned, this is ceil(len / MPS).
 */
uint64_t tacc_link_tlps(TaccState *s, uint64_t len, uint64_t host_off,
                        uint64_t dev_off)
{
    uint64_t h = host_off % s->mps, d = dev_off % s->mps;

    if (!len) {
        return 0;
    }
    return 1 + tacc_cuts(d, len, s->mps) +
           (h != d ? tacc_cuts(h, len, s->mps) : 0);
}

/*
 * Read requests of the first @len bytes of a host read starting at host
 * offset @host_off: MRRS bytes each from the start of the transfer, and
 * never across a 4 KiB boundary of the host address.  The 4 KiB cuts fall
 * on MRRS cuts exactly when host_off is MRRS-aligned (MRRS divides 4096):
 *   reqs = 1 + (len - 1) / MRRS + (host_off % MRRS ? cuts_4K(host_off) : 0)
 */
uint64_t tacc_link_reqs(TaccState *s, uint64_t len, uint64_t host_off)
{
    uint64_t h = host_off % TACC_LINK_RD_BOUNDARY;

    if (!len) {
        return 0;
    }
    return 1 + (len - 1) / s->mrrs +
           (h % s->mrrs ? tacc_cuts(h, len, TACC_LINK_RD_BOUNDARY) : 0);
}

/*
 * Completions of those requests: the root port cuts each request's data at
 * its Read Completion Boundary (rcb-aligned host addresses), so [0, len) is
 * cut at every RCB boundary of the host address and at every request
 * boundary; 4 KiB cuts are RCB boundaries, MRRS cuts are when host_off is
 * RCB-aligned:
 *   cpls = 1 + cuts_RCB(host_off) + (host_off % RCB ? (len - 1) / MRRS : 0)
 */
uint64_t tacc_link_cpls(TaccState *s, uint64_t len, uint64_t host_off)
{
    uint64_t h = host_off % s->rcb;

    if (!len) {
        return 0;
    }
    return 1 + tacc_cuts(h, len, s->rcb) + (h ? (len - 1) / s->mrrs : 0);
}

/* DLLPs that acknowledge (or return the credits of) @tlps TLPs */
static uint64_t tacc_dllps(uint64_t tlps, uint64_t per)
{
    return DIV_ROUND_UP(tlps, per);
}

/*
 * The prefix counts of the first @len payload bytes of a transfer of
 * @kind (TACC_LINK_H2D: a host read, TACC_LINK_D2H: a host write).
 */
void tacc_link_prefix(TaccState *s, int kind, uint64_t len, uint64_t host_off,
                      uint64_t dev_off, TaccLinkCount *c)
{
    memset(c, 0, sizeof(*c));
    if (kind == TACC_LINK_H2D) {
        uint64_t reqs = tacc_link_reqs(s, len, host_off);
        uint64_t cpls = tacc_link_cpls(s, len, host_off);

        c->tlps[0] = cpls;
        c->tlps[1] = reqs;
        c->dllp[0] = tacc_dllps(reqs, TACC_LINK_ACK_TLPS) +
                     tacc_dllps(reqs, TACC_LINK_FC_TLPS);
        c->dllp[1] = tacc_dllps(cpls, TACC_LINK_ACK_TLPS);
        c->bytes[0] = len + cpls * TACC_LINK_CPL_OVERHEAD;
        c->bytes[1] = reqs * TACC_LINK_MRD_BYTES;
    } else if (kind == TACC_LINK_D2H) {
        uint64_t w = tacc_link_tlps(s, len, host_off, dev_off);

        c->tlps[1] = w;
        c->dllp[0] = tacc_dllps(w, TACC_LINK_ACK_TLPS) +
                     tacc_dllps(w, TACC_LINK_FC_TLPS);
        c->bytes[1] = len + w * TACC_LINK_MWR_OVERHEAD;
    }
    for (int d = 0; d < 2; d++) {
        c->bytes[d] += c->dllp[d] * TACC_LINK_DLLP_BYTES;
    }
}

/*
 * Link counts of payload bytes [pos, pos + len) of the transfer described
 * by @r (link_kind, link_host_off, link_dev_off): a part is charged the TLPs
 * and DLLPs that start in it (prefix differences), so the link steps of a
 * transfer add up to the whole transfer's count and a step boundary that is
 * not a cut costs nothing.
 */
void tacc_link_cost(TaccState *s, const TaccResult *r, uint64_t pos,
                    uint64_t len, TaccLinkCount *c)
{
    TaccLinkCount a, b;

    tacc_link_prefix(s, r->link_kind, pos, r->link_host_off, r->link_dev_off,
                     &a);
    tacc_link_prefix(s, r->link_kind, pos + len, r->link_host_off,
                     r->link_dev_off, &b);
    for (int d = 0; d < 2; d++) {
        c->tlps[d] = b.tlps[d] - a.tlps[d];
        c->dllp[d] = b.dllp[d] - a.dllp[d];
        c->bytes[d] = b.bytes[d] - a.bytes[d];
    }
}

/*
 * The lower bound of a host read's link step that flow control sets: at
 * most "tags" read requests outstanding, each for read-latency-ns, so its
 * requests take at least reqs * T_rd / tags.
 */
uint64_t tacc_link_fc_ps(TaccState *s, int kind, uint64_t payload,
                         uint64_t reqs)
{
    if (kind == TACC_LINK_H2D) {
        return tacc_scale_ps(s, DIV_ROUND_UP(reqs * s->read_latency_ns *
                                             PS_PER_NS, s->tags));
    }
    return 0;
}

/*
 * The credit loop of a posted write (unscaled ps): the root port frees a
 * TLP's credits write-latency-ns after it took it, returns them with one
 * UpdateFC DLLP per TACC_LINK_FC_TLPS TLPs (so a batch's link time), and
 * the DLLP itself crosses the link:
 *   L = T_wr + FC_TLPS * t_link(MPS + 24) + t_link(8)
 */
static uint64_t tacc_link_fc_loop_ps(TaccState *s)
{
    return (uint64_t)s->write_latency_ns * PS_PER_NS +
           TACC_LINK_FC_TLPS * tacc_link_raw_ps(s, s->mps +
                                                TACC_LINK_MWR_OVERHEAD) +
           tacc_link_raw_ps(s, TACC_LINK_DLLP_BYTES);
}

/*
 * Take @n credits of a pool of @pool credits that returns @pool credits per
 * @loop ps at time @t: the pool's theoretical return time advances by
 * n * loop / pool from max(itself, t); what is taken may be on the link no
 * later than one loop before it (a full pool lets a burst go at link rate,
 * a long transfer runs at pool / loop).  Returns that earliest end (0 if
 * the pool does not bind).
 */
static uint64_t tacc_posted_take(TaccPostedPool *p, uint64_t t, uint64_t n,
                                 uint64_t loop, uint64_t pool)
{
    uint64_t q, ceil_tat;

    if (p->tat_ps < t) {
        p->tat_ps = t;
        p->tat_rem = 0;
    }
    q = p->tat_rem + n * loop;
    p->tat_ps += q / pool;
    p->tat_rem = q % pool;
    ceil_tat = p->tat_ps + (p->tat_rem ? 1 : 0);
    return ceil_tat > loop ? ceil_tat - loop : 0;
}

/*
 * Posted-write flow control of a host write's link step of @tlps write
 * TLPs and @payload bytes sent from @t: the root port's posted header
 * credits (posted-hdr-credits, one per TLP) and data credits
 * (posted-credits, 16 bytes each), each returned one credit loop after it
 * was taken.  Returns the earliest time the step may end.
 */
uint64_t tacc_link_posted(TaccState *s, uint64_t t, uint64_t tlps,
                          uint64_t payload)
{
    uint64_t loop = tacc_scale_ps(s, tacc_link_fc_loop_ps(s));
    uint64_t h = tacc_posted_take(&s->ph_pool, t, tlps, loop,
                                  s->posted_hdr_credits);
    uint64_t d = tacc_posted_take(&s->pd_pool, t,
                                  DIV_ROUND_UP(payload, TACC_LINK_FC_UNIT),
                                  loop, s->posted_credits);

    return MAX(h, d);
}

/* Time of what the model does now: the event it processes, or now. */
uint64_t tacc_ev_ps(TaccState *s)
{
    return s->in_run ? s->ev_ps : tacc_now_ps(s);
}

/*
 * Control traffic of function @f: a host read (descriptor fetch) or write
 * (completion entry, MSI-X message, trace record, counter sample, ring
 * write-back) of @len bytes at bus address @iova, at the model's current
 * time.  Its TLPs and link bytes (DLLPs included, as for commands) are
 * always counted (ctrl_* counters, global link bytes); with the
 * "link-ctrl-cost" property (TACC_CAP_LINK_CTRL_COST) it also reserves the
 * link direction(s) it uses, so it delays the transfers behind it.  A link
 * in L0s/L1 leaves it first: returns the time the link carries the TLPs
 * (the current time, or later by an ASPM exit latency).
 */
uint64_t tacc_link_ctrl(TaccFunc *f, bool write, uint64_t iova, uint64_t len)
{
    TaccState *s = f->pf;
    uint64_t t = tacc_ev_ps(s), off = iova % TACC_LINK_RD_BOUNDARY, st;
    uint64_t end;
    TaccLinkCount c;

    /* a link in L0s/L1 leaves it first (tacc-linkpm.c) */
    t = tacc_lpm_wake(s, t);
    st = t;
    end = t;

    tacc_link_prefix(s, write ? TACC_LINK_D2H : TACC_LINK_H2D, len, off, off,
                     &c);
    tacc_counters_begin(s);
    f->cnt[TACC_CNT_ctrl_h2d_tlps] += c.tlps[0];
    f->cnt[TACC_CNT_ctrl_d2h_tlps] += c.tlps[1];
    f->cnt[TACC_CNT_ctrl_h2d_link_bytes] += c.bytes[0];
    f->cnt[TACC_CNT_ctrl_d2h_link_bytes] += c.bytes[1];
    f->cnt[TACC_CNT_ctrl_dllp_h2d_bytes] += c.dllp[0] * TACC_LINK_DLLP_BYTES;
    f->cnt[TACC_CNT_ctrl_dllp_d2h_bytes] += c.dllp[1] * TACC_LINK_DLLP_BYTES;
    s->gcnt[TACC_CNT_link_h2d_bytes] += c.bytes[0];
    s->gcnt[TACC_CNT_link_d2h_bytes] += c.bytes[1];
    if (s->link_ctrl_cost) {
        /* the TLPs' direction: a read's completions come down, a write goes up */
        st = MAX(t, s->link_free_ps[write]);
    }
    for (int d = 0; d < 2; d++) {
        uint64_t dur = tacc_link_ps(s, c.bytes[d]);

        if (!c.bytes[d]) {
            continue;
        }
        end = MAX(end, t + dur);
        if (s->link_ctrl_cost) {
            s->link_free_ps[d] = MAX(t, s->link_free_ps[d]) + dur;
            s->link_busy_ps[d] += dur;
            end = MAX(end, s->link_free_ps[d]);
        }
    }
    tacc_lpm_busy(s, end);
    if (tacc_tlpcap_wanted(s, f, true)) {
        TaccTlpSrc src = {
            .f = f, .bus = true, .host = iova, .dev_off = iova, .len = len,
        };
        if (write) {
            tacc_tlpcap_write(s, &src, 0, len, st);
        } else {
            tacc_tlpcap_read(s, &src, 0, len, st);
        }
    }
    return t;
}

/*
 * Compute engine time: the larger of the arithmetic time and the device
 * memory time (a roofline):  max(flops / F, bytes / BW_devmem).
 *   flops * 1000 / gflops  ps,   bytes * 1000 / gbps  ps
 */
/*
 * The roofline of a compute command (docs/hardware.md section 14):
 * max(flops / peak of its dtype, device-memory bytes / bandwidth), scaled.
 */
uint64_t tacc_roofline_ps(TaccState *s, uint64_t flops, uint64_t devmem_bytes,
                          bool bf16)
{
    uint32_t peak = bf16 ? s->bf16_gflops : s->compute_gflops;
    uint64_t c = muldiv64(flops, 1000, MAX(peak, 1));
    uint64_t m = muldiv64(devmem_bytes, 1000, MAX(s->devmem_gbps, 1));

    return tacc_scale_ps(s, MAX(c, m));
}

uint64_t tacc_compute_ps(TaccState *s, uint64_t flops, uint64_t devmem_bytes)
{
    uint64_t c = muldiv64(flops, 1000, MAX(s->compute_gflops, 1));
    uint64_t m = muldiv64(devmem_bytes, 1000, MAX(s->devmem_gbps, 1));

    return tacc_scale_ps(s, MAX(c, m));
}
/* timing model: see docs/hardware.md section 9 */
