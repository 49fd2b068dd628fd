/*
 * tacc: TLP capture, a software PCIe analyzer at the link model
 * (docs/hardware.md section 11, TACC_CAP_TLP_CAPTURE, PF registers
 * 0x600-0x6ff).
 *
 * Every TLP the link model charges (tacc-model.c: the formulas of section 9)
 * is enumerated here, one by one, when capture is on: a host read's read
 * requests and the root port's completions, a host write's memory writes,
 * for commands and for control traffic alike.  Each TLP that passes the
 * filters (functions, kinds, address range, control traffic) becomes a
 * struct tacc_tlp_rec in the driver's ring (same producer/consumer/drop
 * rules as the trace ring).  The analyzer sits outside the link: its own
 * ring writes are neither link traffic nor counted.
 *
 * Timestamps: a link step's TLPs of its primary direction follow each other
 * at link speed from the step's start; a read request is stamped when the
 * down direction starts carrying its data, its completions read-latency-ns
 * later (the model charges the round trip once per transfer; here each
 * request sees it, so request -> completion latency is read-latency-ns).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/log.h"
#include "hw/pci/pci_bus.h"
#include "tacc.h"
#include "trace.h"

#define TACC_TLPCAP_BATCH   64      /* records per ring DMA */

static bool tacc_tlpcap_on(TaccState *s)
{
    return (s->tc_ctrl & TACC_TLPCAP_CTRL_ENABLE) && s->tc_base &&
           s->tc_size >= 2 && s->tc_size <= TACC_TLPCAP_MAX_ENTRIES &&
           is_power_of_2(s->tc_size);
}

bool tacc_tlpcap_wanted(TaccState *s, TaccFunc *f, bool ctrl)
{
    if (!tacc_tlpcap_on(s)) {
        return false;
    }
    if (ctrl && (s->tc_ctrl & TACC_TLPCAP_CTRL_NO_CTRL)) {
        return false;
    }
    return !s->tc_funcs || (s->tc_funcs & (1u << f->fn));
}

/* Write the batched records to the ring (records already counted in PROD). */
static void tacc_tlpcap_flush(TaccState *s)
{
    uint32_t first = s->tc_prod - s->tc_nbuf;

    for (uint32_t i = 0; i < s->tc_nbuf;) {
        uint32_t slot = (first + i) & (s->tc_size - 1);
        uint32_t n = MIN(s->tc_nbuf - i, s->tc_size - slot);

        if (tacc_func_dma(&s->func,
                          s->tc_base + (uint64_t)slot * TACC_TLP_REC_SIZE,
                          &s->tc_buf[i], n * TACC_TLP_REC_SIZE,
                          true) != MEMTX_OK) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: TLP capture ring DMA failed\n");
            s->tc_ctrl &= ~TACC_TLPCAP_CTRL_ENABLE;
            break;
        }
        i += n;
    }
    s->tc_nbuf = 0;
    if (s->tc_wb) {
        struct tacc_ring_wb w = {
            .prod = cpu_to_le32(s->tc_prod),
            .dropped = cpu_to_le32(s->tc_dropped),
        };
        tacc_func_dma(&s->func, s->tc_wb, &w, sizeof(w), true);
    }
}

static void tacc_tlpcap_put(TaccState *s, struct tacc_tlp_rec *r)
{
    uint64_t a = le64_to_cpu(r->addr);

    if (s->tc_kinds && !(s->tc_kinds & (1u << r->kind))) {
        return;
    }
    if (s->tc_addr_hi && (a < s->tc_addr_lo || a >= s->tc_addr_hi)) {
        return;
    }
    r->seq = cpu_to_le32(s->tc_seq++);
    if (s->tc_prod - s->tc_cons >= s->tc_size) {
        s->tc_dropped++;
        return;
    }
    s->tc_buf[s->tc_nbuf++] = *r;
    s->tc_prod++;
    if (s->tc_nbuf == TACC_TLPCAP_BATCH) {
        tacc_tlpcap_flush(s);
    }
}

/* Byte enables of a DW-granular TLP of @len bytes at @addr. */
static uint8_t tacc_tlp_be(uint64_t addr, uint64_t len)
{
    unsigned o = addr & 3, e = (addr + len) & 3;
    uint8_t first = (0xf << o) & 0xf, last = e ? (0xf >> (4 - e)) : 0xf;

    if (((addr & 3) + len) <= 4) {
        return first & last;            /* one DW: last BE is 0 */
    }
    return first | last << 4;
}

static uint16_t tacc_tlp_dws(uint64_t addr, uint64_t len)
{
    return (uint16_t)(((addr & 3) + len + 3) / 4);
}

/* Bus address of host-side byte @x of the transfer. */
static uint64_t tacc_tlpcap_addr(TaccTlpSrc *t, uint64_t x)
{
    uint64_t va = t->host + x, page = va & ~(uint64_t)(TACC_LINK_RD_BOUNDARY - 1);
    TaccResult scratch;
    TaccXlate xl;

    if (t->bus) {
        return va;                      /* control traffic, fences: bus addresses */
    }
    if (t->page_va != page + 1) {
        memset(&scratch, 0, sizeof(scratch));
        t->page_bus = 0;
        if (!tacc_mmu_translate(t->f, t->cmd->d.ctx, page, &xl, &scratch)) {
            t->page_bus = xl.addr;
        }
        t->page_va = page + 1;
    }
    return t->page_bus + (va - page);
}

static void tacc_tlpcap_rec(TaccTlpSrc *t, struct tacc_tlp_rec *r, uint8_t kind,
                            uint64_t t_ps, uint64_t addr, uint64_t len)
{
    TaccFunc *f = t->f;
    PCIDevice *pf = PCI_DEVICE(f->pf);
    PCIDevice *rp = pci_get_bus(pf)->parent_dev;

    memset(r, 0, sizeof(*r));
    r->version = TACC_TLP_VERSION;
    r->kind = kind;
    r->t_ps = cpu_to_le64(t_ps);
    r->addr = cpu_to_le64(addr);
    r->func = f->fn;
    /*
     * The virtio function is no PCI function of this device: its TLPs are
     * charged on the PF's link (its DMA shares it) and carry the requester
     * ID its DMA has, the virtio-pci proxy's (docs/hardware.md section 11).
     */
    r->req_id = cpu_to_le16(f->ops ? f->ops->requester_id(f)
                                   : pci_requester_id(PCI_DEVICE(f)));
    r->flags = (kind != TACC_TLP_CPLD ? TACC_TLP_F_UP : 0) |
               (t->cmd ? 0 : TACC_TLP_F_CTRL);
    if (t->cmd) {
        r->cmd_tag = cpu_to_le64(t->cmd->d.tag);
        r->job = cpu_to_le32(t->cmd->d.job);
        r->ctx = cpu_to_le16(t->cmd->d.ctx);
        r->queue = t->q;
    } else {
        r->queue = 0xff;
    }
    switch (kind) {
    case TACC_TLP_MRD:
        r->fmt_type = TACC_TLP_FMT_MRD64;
        r->payload = cpu_to_le16(len);
        r->link_bytes = cpu_to_le16(TACC_LINK_MRD_BYTES);
        r->len_dw = cpu_to_le16(tacc_tlp_dws(addr, len));
        r->be = tacc_tlp_be(addr, len);
        break;
    case TACC_TLP_MWR:
        r->fmt_type = TACC_TLP_FMT_MWR64;
        r->payload = cpu_to_le16(len);
        r->link_bytes = cpu_to_le16(len + TACC_LINK_MWR_OVERHEAD);
        r->len_dw = cpu_to_le16(tacc_tlp_dws(addr, len));
        r->be = tacc_tlp_be(addr, len);
        break;
    default:
        r->fmt_type = TACC_TLP_FMT_CPLD;
        r->payload = cpu_to_le16(len);
        r->link_bytes = cpu_to_le16(len + TACC_LINK_CPL_OVERHEAD);
        r->len_dw = cpu_to_le16(tacc_tlp_dws(addr, len));
        r->lower_addr = addr & 0x7f;
        r->cpl_id = cpu_to_le16(rp ? pci_get_bdf(rp) : 0);
        break;
    }
}

/* next cut after x for a period p of host address h + x (x < n) */
static uint64_t tacc_next_cut(uint64_t h, uint64_t x, uint64_t p)
{
    return x + p - (h + x) % p;
}

/*
 * The read requests (and their completions) that start in payload bytes
 * [pos, pos + c) of a host read of t->len bytes; down-direction slots start
 * at @t_ps.  Request boundaries: multiples of MRRS from the transfer's
 * start and 4 KiB boundaries of the host address; completion boundaries:
 * request boundaries and RCB boundaries of the host address (section 9).
 */
void tacc_tlpcap_read(TaccState *s, TaccTlpSrc *t, uint64_t pos, uint64_t c,
                      uint64_t t_ps)
{
    uint64_t h = t->host % TACC_LINK_RD_BOUNDARY, rd;
    uint64_t x = pos, down = 0;
    struct tacc_tlp_rec r;

    rd = tacc_scale_ps(s, s->read_latency_ns * PS_PER_NS);
    while (x < pos + c && x < t->len) {
        uint64_t e = MIN(MIN((x / s->mrrs + 1) * s->mrrs,
                             tacc_next_cut(h, x, TACC_LINK_RD_BOUNDARY)), t->len);
        uint16_t tag = s->tc_tag[t->f->fn]++ % s->tags;
        uint64_t addr = tacc_tlpcap_addr(t, x);
        uint64_t y = x;

        tacc_tlpcap_rec(t, &r, TACC_TLP_MRD, t_ps + tacc_link_ps(s, down),
                        addr, e - x);
        r.tag = cpu_to_le16(tag);
        tacc_tlpcap_put(s, &r);
        while (y < e) {
            uint64_t z = MIN(tacc_next_cut(h, y, s->rcb), e);

            tacc_tlpcap_rec(t, &r, TACC_TLP_CPLD,
                            t_ps + tacc_link_ps(s, down) + rd,
                            tacc_tlpcap_addr(t, y), z - y);
            r.tag = cpu_to_le16(tag);
            r.byte_count = cpu_to_le16(e - y);
            tacc_tlpcap_put(s, &r);
            down += z - y + TACC_LINK_CPL_OVERHEAD;
            y = z;
        }
        x = e;
    }
    if (s->tc_nbuf) {
        tacc_tlpcap_flush(s);
    }
}

/*
 * The memory writes that start in payload bytes [pos, pos + c) of a host
 * write: cut at MPS boundaries of the device-side (t->dev_off) and of the
 * host-side address; up-direction slots start at @t_ps.
 */
void tacc_tlpcap_write(TaccState *s, TaccTlpSrc *t, uint64_t pos, uint64_t c,
                       uint64_t t_ps)
{
    uint64_t h = t->host % s->mps, d = t->dev_off % s->mps;
    uint64_t x = pos, up = 0;
    struct tacc_tlp_rec r;

    /* the first write starting at or after pos: pos is a step boundary */
    while (x < pos + c && x < t->len) {
        uint64_t e = MIN(MIN(tacc_next_cut(d, x, s->mps),
                             tacc_next_cut(h, x, s->mps)), t->len);

        tacc_tlpcap_rec(t, &r, TACC_TLP_MWR, t_ps + tacc_link_ps(s, up),
                        tacc_tlpcap_addr(t, x), e - x);
        tacc_tlpcap_put(s, &r);
        up += e - x + TACC_LINK_MWR_OVERHEAD;
        x = e;
    }
    if (s->tc_nbuf) {
        tacc_tlpcap_flush(s);
    }
}

/* The capture block's 64-bit registers (RW64: one 8-byte or two 4-byte accesses). */
static uint64_t *tacc_tlpcap_reg64(TaccState *s, hwaddr reg)
{
    switch (reg) {
    case TACC_REG_TLPCAP_BASE:
        return &s->tc_base;
    case TACC_REG_TLPCAP_WB:
        return &s->tc_wb;
    case TACC_REG_TLPCAP_ADDR_LO:
        return &s->tc_addr_lo;
    case TACC_REG_TLPCAP_ADDR_HI:
        return &s->tc_addr_hi;
    default:
        return NULL;
    }
}

/* A register write of the capture block (PF only, 0x600-0x6ff). */
bool tacc_tlpcap_reg_write(TaccState *s, hwaddr addr, uint64_t val, unsigned size)
{
    uint64_t *r = tacc_tlpcap_reg64(s, addr & ~7ull);

    if (r) {
        if (size == 8) {
            *r = val;
        } else {
            *r = deposit64(*r, (addr & 4) ? 32 : 0, 32, val);
        }
        return true;
    }
    if (size != 4) {
        return false;
    }
    switch (addr) {
    case TACC_REG_TLPCAP_SIZE:
        if (val < 2 || val > TACC_TLPCAP_MAX_ENTRIES || !is_power_of_2(val)) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: bad TLPCAP_SIZE %" PRIu64 "\n",
                          val);
            return true;
        }
        s->tc_size = val;
        return true;
    case TACC_REG_TLPCAP_CTRL:
        if ((val & TACC_TLPCAP_CTRL_ENABLE) &&
            !(s->tc_ctrl & TACC_TLPCAP_CTRL_ENABLE)) {
            s->tc_prod = s->tc_cons = s->tc_dropped = s->tc_seq = 0;
            s->tc_nbuf = 0;
        }
        s->tc_ctrl = val & (TACC_TLPCAP_CTRL_ENABLE | TACC_TLPCAP_CTRL_NO_CTRL);
        return true;
    case TACC_REG_TLPCAP_CONS:
        if ((uint32_t)(val - s->tc_cons) > s->tc_prod - s->tc_cons) {
            qemu_log_mask(LOG_GUEST_ERROR, "tacc: TLPCAP_CONS beyond PROD\n");
            return true;
        }
        s->tc_cons = val;
        return true;
    case TACC_REG_TLPCAP_FUNCS:
        s->tc_funcs = val;
        return true;
    case TACC_REG_TLPCAP_KINDS:
        s->tc_kinds = val;
        return true;
    default:
        return false;
    }
}

bool tacc_tlpcap_reg_read(TaccState *s, hwaddr addr, unsigned size,
                          uint64_t *val)
{
    uint64_t *r = tacc_tlpcap_reg64(s, addr & ~7ull);

    if (r) {
        *val = size == 8 ? *r : (addr & 4) ? *r >> 32 : (uint32_t)*r;
        return true;
    }
    if (size != 4) {
        return false;
    }
    switch (addr) {
    case TACC_REG_TLPCAP_SIZE:
        *val = s->tc_size;
        return true;
    case TACC_REG_TLPCAP_CTRL:
        *val = s->tc_ctrl;
        return true;
    case TACC_REG_TLPCAP_PROD:
        *val = s->tc_prod;
        return true;
    case TACC_REG_TLPCAP_CONS:
        *val = s->tc_cons;
        return true;
    case TACC_REG_TLPCAP_DROPPED:
        *val = s->tc_dropped;
        return true;
    case TACC_REG_TLPCAP_FUNCS:
        *val = s->tc_funcs;
        return true;
    case TACC_REG_TLPCAP_KINDS:
        *val = s->tc_kinds;
        return true;
    default:
        return false;
    }
}

/* Reset of the PF (function reset, FLR, D3hot -> D0): capture stops. */
void tacc_tlpcap_reset(TaccState *s)
{
    s->tc_base = s->tc_wb = s->tc_addr_lo = s->tc_addr_hi = 0;
    s->tc_size = s->tc_ctrl = s->tc_prod = s->tc_cons = 0;
    s->tc_dropped = s->tc_seq = s->tc_funcs = s->tc_kinds = 0;
    s->tc_nbuf = 0;
    memset(s->tc_tag, 0, sizeof(s->tc_tag));
}
