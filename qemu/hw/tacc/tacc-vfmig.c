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
    if (tacc_is_vf(fn)) {
        s->vf_stopped[fn - 1] = false;
        tacc_vfmig_log_off(&s->vf_log[fn - 1]);
    }
}

/* PF function reset, PF FLR, device reset: every VF runs, no log */
void tacc_vfmig_reset(TaccState *s)
{
    for (int fn = 1; fn <= TACC_MAX_VFS; fn++) {
        tacc_vfmig_vf_gone(s, fn);
    }
    s->vfmig_addr = s->vfmig_len = s->vfmig_result = 0;
    s->vfmig_log_iova = s->vfmig_log_len = 0;
    s->vfmig_cmd = s->vfmig_status = s->vfmig_log_shift = 0;
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
    size_t rlen;
    uint64_t base, wsize, total;
    struct tacc_vfstate_hdr h;
    uint32_t crc;

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
    crc = tacc_crc(0, &h, sizeof(h));
    crc = tacc_crc(crc, regs, rlen);
    crc = tacc_crc(crc, s->devmem + base, wsize);
    h.crc = cpu_to_le32(crc);
    if (tacc_func_dma(&s->func, s->vfmig_addr, &h, sizeof(h), true) ||
        tacc_func_dma(&s->func, s->vfmig_addr + sizeof(h), regs, rlen, true) ||
        tacc_func_dma(&s->func, s->vfmig_addr + sizeof(h) + rlen,
                      s->devmem + base, wsize, true)) {
        return TACC_VFMIG_ST_DMA_ERROR;
    }
    trace_tacc_vfmig_save(vf->fn, rlen, wsize, crc);
    return TACC_VFMIG_ST_OK;
}

static uint16_t tacc_vfmig_load(TaccState *s, TaccFunc *vf)
{
    g_autofree uint8_t *blob = NULL;
    struct tacc_vfstate_hdr h;
    uint64_t base, wsize, len = s->vfmig_len, rlen;
    uint32_t crc;

    if (!tacc_vfmig_is_stopped(s, vf->fn)) {
        return TACC_VFMIG_ST_BAD_STATE;
    }
    if (s->vfmig_addr & 7) {
        return TACC_VFMIG_ST_BAD_ARG;
    }
    tacc_window(vf, &base, &wsize);
    /* a header, at most TACC_VFSTATE_REGS_MAX of registers, the window */
    if (len < sizeof(h) || len > sizeof(h) + TACC_VFSTATE_REGS_MAX + wsize) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    blob = g_try_malloc(len);
    if (!blob) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    if (tacc_func_dma(&s->func, s->vfmig_addr, blob, len, false)) {
        return TACC_VFMIG_ST_DMA_ERROR;
    }
    memcpy(&h, blob, sizeof(h));
    if (le32_to_cpu(h.magic) != TACC_VFSTATE_MAGIC) {
        return TACC_VFMIG_ST_BAD_MAGIC;
    }
    if (le16_to_cpu(h.version) != TACC_VFSTATE_VERSION ||
        le16_to_cpu(h.hdr_size) != sizeof(h) ||
        le32_to_cpu(h.regs_version) != tacc_vmstate_func_regs.version_id) {
        return TACC_VFMIG_ST_BAD_VERSION;
    }
    rlen = le64_to_cpu(h.regs_len);
    if (le64_to_cpu(h.total_len) != len || rlen > TACC_VFSTATE_REGS_MAX ||
        le64_to_cpu(h.devmem_len) > len ||
        sizeof(h) + rlen + le64_to_cpu(h.devmem_len) != len) {
        return TACC_VFMIG_ST_BAD_LENGTH;
    }
    crc = le32_to_cpu(h.crc);
    memset(blob + offsetof(struct tacc_vfstate_hdr, crc), 0, sizeof(h.crc));
    if (tacc_crc(0, blob, len) != crc) {
        return TACC_VFMIG_ST_BAD_CRC;
    }
    if (le16_to_cpu(h.fn) != vf->fn) {
        return TACC_VFMIG_ST_WRONG_FN;
    }
    if (le64_to_cpu(h.devmem_len) != wsize) {
        return TACC_VFMIG_ST_MISMATCH;
    }
    tacc_counters_begin(s);
    if (tacc_vmstate_func_load_buf(vf, blob + sizeof(h), rlen)) {
        tacc_counters_end(s);
        return TACC_VFMIG_ST_BAD_DATA;
    }
    tacc_counters_end(s);
    memcpy(s->devmem + base, blob + sizeof(h) + rlen, wsize);
    memory_region_set_dirty(&s->devmem_mr, base, wsize);
    tacc_tlb_invalidate(s, vf->fn, -1);
    timer_del(&vf->sample_timer);       /* stopped: RESUME re-arms it */
    trace_tacc_vfmig_load(vf->fn, rlen, wsize);
    return TACC_VFMIG_ST_OK;
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
    if (st != TACC_VFMIG_ST_OK) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: VF migration: %s of fn%u "
                      "refused: status %u\n",
                      op < ARRAY_SIZE(tacc_vfmig_op_name) &&
                      tacc_vfmig_op_name[op] ? tacc_vfmig_op_name[op] : "op",
                      fn, st);
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
