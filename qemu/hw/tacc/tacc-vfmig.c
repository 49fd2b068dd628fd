/*
 * tacc: the PF's admin operations on one of its VFs for VFIO live
 * migration (TACC_CAP_VF_MIGRATION, hw 1.4): stop and resume a VF, save
 * and load its state as a self-describing blob in a host buffer (the PF's
 * DMA), and log the IOVA pages the VF's DMA writes.
 *
 * docs/hardware.md section 16 is the contract.  The blob is a struct
 * tacc_vfstate_hdr, the VF's registers and queues in the encoding of its
 * migration section ("tacc/func-regs", tacc-vmstate.c), then its
 * device-memory window.  LOAD reads the whole blob into host memory first,
 * checks header, lengths, CRC and function, then the same post_load checks
 * as a migration on a scratch copy; nothing changes unless all pass.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/bitmap.h"
#include "qemu/log.h"
#include <zlib.h>
#include "tacc.h"
#include "trace.h"

#define TACC_VFMIG_BOUNCE       (64 * 1024)

static const char *const tacc_vfmig_op_name[] = {
    [TACC_VFMIG_OP_QUERY] = "QUERY",
    [TACC_VFMIG_OP_STOP] = "STOP",
    [TACC_VFMIG_OP_RESUME] = "RESUME",
    [TACC_VFMIG_OP_SAVE] = "SAVE",
    [TACC_VFMIG_OP_LOAD] = "LOAD",
    [TACC_VFMIG_OP_LOG_START] = "LOG_START",
    [TACC_VFMIG_OP_LOG_STOP] = "LOG_STOP",
    [TACC_VFMIG_OP_LOG_REPORT] = "LOG_REPORT",
};

static void tacc_vfmig_job_end(TaccState *s, uint16_t st);

static bool tacc_is_vf(int fn)
{
    return fn >= 1 && fn <= TACC_MAX_VFS;
}

bool tacc_vfmig_stopped(TaccFunc *f)
{
    return !f->ops && tacc_is_vf(f->fn) && f->pf->vf_stopped[f->fn - 1];
}

/* A VF's DMA write of [addr, +len): its pages in the logged range are dirty */
void tacc_vfmig_dirty(TaccFunc *f, uint64_t addr, uint64_t len)
{
    TaccDirtyLog *l;
    uint64_t lo, hi;

    if (f->ops || !tacc_is_vf(f->fn) || !len) {
        return;
    }
    l = &f->pf->vf_log[f->fn - 1];
    if (!l->on) {
        return;
    }
    lo = MAX(addr, l->iova);
    hi = MIN(addr + len - 1, l->iova + l->len - 1);    /* inclusive */
    if (addr + len - 1 < addr || lo > hi) {
        return;                 /* wraps, or outside the range */
    }
    bitmap_set(l->bmap, (lo - l->iova) >> l->shift,
               ((hi - l->iova) >> l->shift) - ((lo - l->iova) >> l->shift) + 1);
}

static void tacc_vfmig_log_off(TaccDirtyLog *l)
{
    g_free(l->bmap);
    memset(l, 0, sizeof(*l));
}

/* A VF migration in progress: a stopped VF or a dirty log (no PF VMState) */
bool tacc_vfmig_busy(TaccState *s)
{
    for (int v = 0; v < TACC_MAX_VFS; v++) {
        if (s->vf_stopped[v] || s->vf_log[v].on) {
            return true;
        }
    }
    return false;
}

void tacc_vfmig_vf_gone(TaccState *s, int fn)
{
    if (s->vfmig_job.op && s->vfmig_job.fn == fn) {
        tacc_vfmig_job_end(s, TACC_VFMIG_ST_BAD_FN);
    }
    if (tacc_is_vf(fn)) {
        s->vf_stopped[fn - 1] = false;
        tacc_vfmig_log_off(&s->vf_log[fn - 1]);
    }
}

/* PF function reset, PF FLR, device reset: every VF runs, no log */
void tacc_vfmig_reset(TaccState *s)
{
    bool cancelled = s->vfmig_job.op;   /* a SAVE or LOAD ends unfinished */

    for (int fn = 1; fn <= TACC_MAX_VFS; fn++) {
        tacc_vfmig_vf_gone(s, fn);
    }
    s->vfmig_addr = s->vfmig_len = s->vfmig_result = 0;
    s->vfmig_log_iova = s->vfmig_log_len = 0;
    s->vfmig_cmd = s->vfmig_log_shift = 0;
    s->vfmig_status = cancelled ? TACC_VFMIG_ST_BAD_STATE : TACC_VFMIG_ST_OK;
}

static uint32_t tacc_vfmig_state(TaccState *s, int fn)
{
    uint32_t st = s->vf_log[fn - 1].on ? TACC_VFMIG_STATE_LOGGING : 0;

    if (!s->vf_stopped[fn - 1]) {
        return st | TACC_VFMIG_RUNNING;
    }
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        if (s->unit[i].busy && s->unit[i].fn == fn) {
            return st | TACC_VFMIG_STOPPING;
        }
    }
    return st | TACC_VFMIG_STOPPED;
}

static bool tacc_vfmig_is_stopped(TaccState *s, int fn)
{
    return (tacc_vfmig_state(s, fn) & TACC_VFMIG_STATE_MASK) ==
           TACC_VFMIG_STOPPED;
}

/* CRC-32 of @len bytes (zlib's; crc32_z takes a size_t) */
static uint32_t tacc_crc(uint32_t crc, const void *p, size_t len)
{
    return crc32_z(crc, p, len);
}

static uint16_t tacc_vfmig_query(TaccState *s, TaccFunc *vf, bool save)
{
    g_autofree uint8_t *regs = NULL;
    TaccVfmigJob *j = &s->vfmig_job;
    size_t rlen;
    uint64_t base, wsize, total;
    struct tacc_vfstate_hdr h;

    if (save && !tacc_vfmig_is_stopped(s, vf->fn)) {
        return TACC_VFMIG_ST_BAD_STATE;
    }
    tacc_window(vf, &base, &wsize);
    rlen = tacc_vmstate_func_save_buf(vf, &regs);
    total = sizeof(h) + rlen + wsize;
    s->vfmig_result = total;
    if (!save) {
        return TACC_VFMIG_ST_OK;
    }
    if (s->vfmig_len < total || (s->vfmig_addr & 7)) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    memset(&h, 0, sizeof(h));
    h.magic = cpu_to_le32(TACC_VFSTATE_MAGIC);
    h.version = cpu_to_le16(TACC_VFSTATE_VERSION);
    h.hdr_size = cpu_to_le16(sizeof(h));
    h.fn = cpu_to_le16(vf->fn);
    h.total_len = cpu_to_le64(total);
    h.regs_len = cpu_to_le64(rlen);
    h.devmem_len = cpu_to_le64(wsize);
    h.hw_version = cpu_to_le32(TACC_HW_VERSION_MAJOR << 16 |
                               TACC_HW_VERSION_MINOR);
    h.regs_version = cpu_to_le32(tacc_vmstate_func_regs.version_id);
    h.dev_ns = cpu_to_le64(tacc_dev_ns(s));
    if (tacc_func_dma(&s->func, s->vfmig_addr + sizeof(h), regs, rlen, true)) {
        return TACC_VFMIG_ST_DMA_ERROR;
    }
    /* the window follows slice by slice (tacc_vfmig_bh), the header last */
    *j = (TaccVfmigJob) {
        .op = TACC_VFMIG_OP_SAVE, .fn = vf->fn, .base = base, .wsize = wsize,
        .addr = s->vfmig_addr, .len = total, .rlen = rlen, .hdr = h,
        .crc = tacc_crc(tacc_crc(0, &h, sizeof(h)), regs, rlen),
    };
    qemu_bh_schedule(s->vfmig_bh);
    return TACC_VFMIG_ST_BUSY;
}

static uint16_t tacc_vfmig_load(TaccState *s, TaccFunc *vf)
{
    TaccVfmigJob *j = &s->vfmig_job;
    uint64_t base, wsize, len = s->vfmig_len;
    uint8_t *blob;

    if (!tacc_vfmig_is_stopped(s, vf->fn)) {
        return TACC_VFMIG_ST_BAD_STATE;
    }
    if (s->vfmig_addr & 7) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    tacc_window(vf, &base, &wsize);
    /* a header, at most TACC_VFSTATE_REGS_MAX of registers, the window */
    if (len < sizeof(struct tacc_vfstate_hdr) ||
        len > sizeof(struct tacc_vfstate_hdr) + TACC_VFSTATE_REGS_MAX + wsize) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    blob = g_try_malloc(len);
    if (!blob) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    /* read slice by slice (tacc_vfmig_bh), checked whole, then applied */
    *j = (TaccVfmigJob) {
        .op = TACC_VFMIG_OP_LOAD, .fn = vf->fn, .base = base, .wsize = wsize,
        .addr = s->vfmig_addr, .len = len, .blob = blob,
    };
    qemu_bh_schedule(s->vfmig_bh);
    return TACC_VFMIG_ST_BUSY;
}

/* LOAD, the blob read whole: the checks in their order; the registers go in */
static uint16_t tacc_vfmig_load_check(TaccState *s, TaccFunc *vf,
                                      TaccVfmigJob *j)
{
    const struct tacc_vfstate_hdr *h = &j->hdr;
    uint64_t rlen = le64_to_cpu(h->regs_len), len = j->len;

    if (le32_to_cpu(h->magic) != TACC_VFSTATE_MAGIC) {
        return TACC_VFMIG_ST_BAD_MAGIC;
    }
    if (le16_to_cpu(h->version) != TACC_VFSTATE_VERSION ||
        le16_to_cpu(h->hdr_size) != sizeof(*h) ||
        le32_to_cpu(h->regs_version) != tacc_vmstate_func_regs.version_id) {
        return TACC_VFMIG_ST_BAD_VERSION;
    }
    if (le64_to_cpu(h->total_len) != len || rlen > TACC_VFSTATE_REGS_MAX ||
        le64_to_cpu(h->devmem_len) > len ||
        sizeof(*h) + rlen + le64_to_cpu(h->devmem_len) != len) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    if (j->crc != le32_to_cpu(h->crc)) {
        return TACC_VFMIG_ST_BAD_CRC;
    }
    if (le16_to_cpu(h->fn) != vf->fn) {
        return TACC_VFMIG_ST_WRONG_FN;
    }
    if (le64_to_cpu(h->devmem_len) != j->wsize) {
        return TACC_VFMIG_ST_MISMATCH;
    }
    tacc_counters_begin(s);
    if (tacc_vmstate_func_load_buf(vf, j->blob + sizeof(*h), rlen)) {
        tacc_counters_end(s);
        return TACC_VFMIG_ST_BAD_DATA;
    }
    tacc_counters_end(s);
    j->rlen = rlen;
    return TACC_VFMIG_ST_OK;
}

static void tacc_vfmig_log_refusal(unsigned op, unsigned fn, uint16_t st)
{
    qemu_log_mask(LOG_GUEST_ERROR, "tacc: VF migration: %s of fn%u "
                  "refused: status %u\n",
                  op < ARRAY_SIZE(tacc_vfmig_op_name) &&
                  tacc_vfmig_op_name[op] ? tacc_vfmig_op_name[op] : "op",
                  fn, st);
}

/* The SAVE or LOAD in progress ends with @st (a cancel, a refusal, done) */
static void tacc_vfmig_job_end(TaccState *s, uint16_t st)
{
    TaccVfmigJob *j = &s->vfmig_job;
    unsigned op = j->op, fn = j->fn;

    if (!op) {
        return;
    }
    g_free(j->blob);
    memset(j, 0, sizeof(*j));
    s->vfmig_status = st;
    trace_tacc_vfmig_cmd(op, fn, st, s->vfmig_result);
    if (st != TACC_VFMIG_ST_OK) {
        tacc_vfmig_log_refusal(op, fn, st);
    }
}

/*
 * One slice (x-host-slice bytes) of the SAVE or LOAD in progress per
 * main-loop turn: SAVE's window out (CRC as it goes, the header last),
 * LOAD's blob in (CRC as it goes), its checks, then its window in.
 */
void tacc_vfmig_bh(void *opaque)
{
    TaccState *s = opaque;
    TaccVfmigJob *j = &s->vfmig_job;
    uint64_t base, wsize, end, n;
    TaccFunc *vf;
    uint16_t st = TACC_VFMIG_ST_OK;

    if (!j->op) {
        return;
    }
    if (!tacc_enter(s, &s->func, "VF migration")) {
        qemu_bh_schedule(s->vfmig_bh);  /* a nested main-loop poll: later */
        return;
    }
    vf = tacc_func(s, j->fn);
    tacc_window(vf, &base, &wsize);
    if (base != j->base || wsize != j->wsize) {    /* the PF moved it */
        st = j->op == TACC_VFMIG_OP_SAVE ? TACC_VFMIG_ST_BAD_STATE
                                          : TACC_VFMIG_ST_MISMATCH;
        goto done;
    }
    end = j->op == TACC_VFMIG_OP_LOAD && !j->apply ? j->len : j->wsize;
    n = MIN(s->host_slice, end - j->pos);
    if (j->op == TACC_VFMIG_OP_SAVE) {
        j->crc = tacc_crc(j->crc, s->devmem + base + j->pos, n);
        if (tacc_func_dma(&s->func, j->addr + sizeof(j->hdr) + j->rlen + j->pos,
                          s->devmem + base + j->pos, n, true)) {
            st = TACC_VFMIG_ST_DMA_ERROR;
            goto done;
        }
        j->pos += n;
        if (j->pos == end) {
            j->hdr.crc = cpu_to_le32(j->crc);
            if (tacc_func_dma(&s->func, j->addr, &j->hdr, sizeof(j->hdr),
                              true)) {
                st = TACC_VFMIG_ST_DMA_ERROR;
                goto done;
            }
            trace_tacc_vfmig_save(j->fn, j->rlen, j->wsize, j->crc);
            goto done;
        }
    } else if (!j->apply) {
        if (tacc_func_dma(&s->func, j->addr + j->pos, j->blob + j->pos, n,
                          false)) {
            st = TACC_VFMIG_ST_DMA_ERROR;
            goto done;
        }
        if (!j->pos) {  /* the first slice holds the header: CRC without it */
            memcpy(&j->hdr, j->blob, sizeof(j->hdr));
            memset(j->blob + offsetof(struct tacc_vfstate_hdr, crc), 0,
                   sizeof(j->hdr.crc));
        }
        j->crc = tacc_crc(j->crc, j->blob + j->pos, n);
        j->pos += n;
        if (j->pos == end) {
            st = tacc_vfmig_load_check(s, vf, j);
            if (st != TACC_VFMIG_ST_OK) {
                goto done;
            }
            j->apply = true;
            j->pos = 0;
        }
    } else {
        memcpy(s->devmem + base + j->pos,
               j->blob + sizeof(j->hdr) + j->rlen + j->pos, n);
        memory_region_set_dirty(&s->devmem_mr, base + j->pos, n);
        j->pos += n;
        if (j->pos == end) {
            tacc_tlb_invalidate(s, vf->fn, -1);
            timer_del(&vf->sample_timer);       /* stopped: RESUME re-arms it */
            trace_tacc_vfmig_load(vf->fn, j->rlen, j->wsize);
            goto done;
        }
    }
    qemu_bh_schedule(s->vfmig_bh);
    tacc_leave(s);
    return;

done:
    tacc_vfmig_job_end(s, st);
    tacc_leave(s);
}

static uint16_t tacc_vfmig_log_start(TaccState *s, TaccFunc *vf)
{
    TaccDirtyLog *l = &s->vf_log[vf->fn - 1];
    uint64_t iova = s->vfmig_log_iova, len = s->vfmig_log_len;
    uint32_t shift = s->vfmig_log_shift;
    uint64_t mask;

    if (l->on) {
        return TACC_VFMIG_ST_BAD_STATE;
    }
    if (shift < TACC_VFMIG_PGSHIFT_MIN || shift > TACC_VFMIG_PGSHIFT_MAX) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    mask = (1ull << shift) - 1;
    if (!len || (iova & mask) || (len & mask) || iova + len - 1 < iova ||
        (len >> shift) > TACC_VFMIG_LOG_MAX_PAGES) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    l->iova = iova;
    l->len = len;
    l->shift = shift;
    l->bmap = bitmap_new(len >> shift);
    l->on = true;
    return TACC_VFMIG_ST_OK;
}

static uint16_t tacc_vfmig_log_report(TaccState *s, TaccFunc *vf)
{
    TaccDirtyLog *l = &s->vf_log[vf->fn - 1];
    uint64_t iova = s->vfmig_log_iova, len = s->vfmig_log_len;
    uint64_t first, n, bytes;
    g_autofree uint64_t *out = NULL;

    if (!l->on) {
        return TACC_VFMIG_ST_BAD_STATE;
    }
    if (!len || ((iova | len) & ((1ull << l->shift) - 1)) ||
        iova < l->iova || iova + len - 1 < iova ||
        iova + len - 1 > l->iova + l->len - 1) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    first = (iova - l->iova) >> l->shift;
    n = len >> l->shift;
    bytes = DIV_ROUND_UP(n, 64) * 8;
    s->vfmig_result = bytes;
    if (s->vfmig_len < bytes || (s->vfmig_addr & 7)) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    out = g_new0(uint64_t, bytes / 8);
    for (uint64_t i = find_next_bit(l->bmap, first + n, first);
         i < first + n; i = find_next_bit(l->bmap, first + n, i + 1)) {
        out[(i - first) / 64] |= 1ull << ((i - first) % 64);
    }
    for (uint64_t w = 0; w < bytes / 8; w++) {
        out[w] = cpu_to_le64(out[w]);
    }
    if (tacc_func_dma(&s->func, s->vfmig_addr, out, bytes, true)) {
        return TACC_VFMIG_ST_DMA_ERROR;     /* the bits stay set */
    }
    bitmap_clear(l->bmap, first, n);
    return TACC_VFMIG_ST_OK;
}

static void tacc_vfmig_cmd(TaccState *s, uint32_t cmd)
{
    unsigned op = cmd & 0xff, fn = (cmd >> TACC_VFMIG_CMD_FN_SHIFT) & 0xff;
    TaccFunc *vf = tacc_is_vf(fn) && fn <= s->total_vfs ? tacc_func(s, fn)
                                                         : NULL;
    uint16_t st;

    if (s->vfmig_job.op) {      /* a SAVE or LOAD still runs: ignored */
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: VF migration: command 0x%x "
                      "while an operation runs (STATUS BUSY): ignored\n", cmd);
        return;
    }
    s->vfmig_cmd = cmd;
    s->vfmig_result = 0;
    if (op < TACC_VFMIG_OP_QUERY || op > TACC_VFMIG_OP_LOG_REPORT ||
        (cmd >> 16)) {
        st = TACC_VFMIG_ST_BAD_OP;
    } else if (!vf) {
        st = TACC_VFMIG_ST_BAD_FN;
    } else {
        switch (op) {
        case TACC_VFMIG_OP_QUERY:
            st = tacc_vfmig_query(s, vf, false);
            break;
        case TACC_VFMIG_OP_STOP:
            s->vf_stopped[fn - 1] = true;
            timer_del(&vf->sample_timer);
            st = TACC_VFMIG_ST_OK;
            break;
        case TACC_VFMIG_OP_RESUME:
            s->vf_stopped[fn - 1] = false;
            tacc_sample_rearm(vf);
            tacc_func_kick(vf);
            st = TACC_VFMIG_ST_OK;
            break;
        case TACC_VFMIG_OP_SAVE:
            st = tacc_vfmig_query(s, vf, true);
            break;
        case TACC_VFMIG_OP_LOAD:
            st = tacc_vfmig_load(s, vf);
            break;
        case TACC_VFMIG_OP_LOG_START:
            st = tacc_vfmig_log_start(s, vf);
            break;
        case TACC_VFMIG_OP_LOG_STOP:
            st = s->vf_log[fn - 1].on ? TACC_VFMIG_ST_OK
                                      : TACC_VFMIG_ST_BAD_STATE;
            tacc_vfmig_log_off(&s->vf_log[fn - 1]);
            break;
        default:
            st = tacc_vfmig_log_report(s, vf);
            break;
        }
    }
    s->vfmig_status = st;
    trace_tacc_vfmig_cmd(op, fn, st, s->vfmig_result);
    if (st != TACC_VFMIG_ST_OK && st != TACC_VFMIG_ST_BUSY) {
        tacc_vfmig_log_refusal(op, fn, st);
    }
}

static uint64_t *tacc_vfmig_reg64(TaccState *s, hwaddr reg)
{
    switch (reg) {
    case TACC_REG_VFMIG_ADDR:
        return &s->vfmig_addr;
    case TACC_REG_VFMIG_LEN:
        return &s->vfmig_len;
    case TACC_REG_VFMIG_RESULT:
        return &s->vfmig_result;
    case TACC_REG_VFMIG_LOG_IOVA:
        return &s->vfmig_log_iova;
    case TACC_REG_VFMIG_LOG_LEN:
        return &s->vfmig_log_len;
    }
    return NULL;
}

bool tacc_vfmig_reg_read(TaccState *s, hwaddr addr, unsigned size,
                         uint64_t *val)
{
    uint64_t *r = tacc_vfmig_reg64(s, addr & ~7ull);

    if (r) {
        *val = size == 8 ? *r : (addr & 4) ? *r >> 32 : (uint32_t)*r;
        return size == 4 || !(addr & 4);
    }
    if (size != 4) {
        return false;
    }
    switch (addr) {
    case TACC_REG_VFMIG_CMD:
        *val = s->vfmig_cmd;
        return true;
    case TACC_REG_VFMIG_STATUS:
        *val = s->vfmig_status;
        return true;
    case TACC_REG_VFMIG_LOG_PGSHIFT:
        *val = s->vfmig_log_shift;
        return true;
    }
    if (addr >= TACC_REG_VFMIG_VF_STATE(0) &&
        addr < TACC_REG_VFMIG_VF_STATE(TACC_MAX_VFS)) {
        *val = tacc_vfmig_state(s, (addr - TACC_REG_VFMIG_VF_STATE(0)) / 4
                                   + 1);
        return true;
    }
    return false;
}

bool tacc_vfmig_reg_write(TaccState *s, hwaddr addr, uint64_t val,
                          unsigned size)
{
    hwaddr reg = addr & ~7ull;
    uint64_t *r = tacc_vfmig_reg64(s, reg);

    if (r && reg != TACC_REG_VFMIG_RESULT) {
        if (size == 8) {
            *r = val;
        } else {
            *r = deposit64(*r, (addr & 4) ? 32 : 0, 32, val);
        }
        return size == 4 || !(addr & 4);
    }
    if (size != 4) {
        return false;
    }
    switch (addr) {
    case TACC_REG_VFMIG_CMD:
        tacc_vfmig_cmd(s, val);
        return true;
    case TACC_REG_VFMIG_LOG_PGSHIFT:
        s->vfmig_log_shift = val;
        return true;
    }
    return false;
}
