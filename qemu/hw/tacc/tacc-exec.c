/*
 * tacc: functional execution of commands.
 *
 * tacc_exec() runs when a command is dispatched to its unit: it validates
 * the descriptor, translates every operand through the device MMU, moves
 * the data / computes the result, and fills a TaccResult with what the
 * timing model and the counters need.  Results are real (GEMM, eltwise).
 * Writes that must not become visible before the modelled completion time
 * (fence, timestamp) are deferred to the completion (post_write).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include <math.h>
#include "qemu/log.h"
#include "qemu/cutils.h"
#include "block/thread-pool.h"
#include "tacc.h"
#include "trace.h"

#define TACC_XFER_BUF   (64 * 1024)

enum tacc_engine_class tacc_op_class(uint8_t opcode)
{
    switch (opcode) {
    case TACC_OP_COPY_H2D:
    case TACC_OP_COPY_D2D:
    case TACC_OP_FILL:
        return TACC_CLASS_H2D;
    case TACC_OP_COPY_D2H:
        return TACC_CLASS_D2H;
    case TACC_OP_GEMM:
    case TACC_OP_ELTWISE:
    case TACC_OP_SOFTMAX:
    case TACC_OP_NORM:
    case TACC_OP_GATHER:
        return TACC_CLASS_COMPUTE;
    default:
        return TACC_CLASS_LOCAL;       /* incl. bad opcodes, LIST: fail fast */
    }
}

/* Does a descriptor use hw 1.3 (docs/hardware.md section 14)? */
bool tacc_desc_hw13(const struct tacc_desc *d)
{
    size_t from;

    switch (d->opcode) {
    case TACC_OP_GEMM:
        from = offsetof(struct tacc_desc, gemm.dtype_ab);
        break;
    case TACC_OP_ELTWISE:
        if (d->eltwise.op >= TACC_ELT_GELU) {
            return true;
        }
        from = offsetof(struct tacc_desc, eltwise.dtype_a);
        break;
    default:
        return d->opcode >= TACC_OP_SOFTMAX && d->opcode < TACC_OP_MAX;
    }
    from -= offsetof(struct tacc_desc, payload);
    return !buffer_is_zero(d->payload + from, sizeof(d->payload) - from);
}

/* A command that fails before running (a refused listed command) is local. */
enum tacc_engine_class tacc_cmd_class(const TaccCmd *c)
{
    return c->preset ? TACC_CLASS_LOCAL : tacc_op_class(c->d.opcode);
}

/* Data DMA of a command: honours the fail-next-DMA fault injection. */
static MemTxResult tacc_dma_rw(TaccFunc *f, uint64_t iova, void *buf,
                               uint64_t len, bool write)
{
    TaccState *s = f->pf;
    MemTxResult r;

    if (s->fi_fail_next_dma) {
        s->fi_fail_next_dma = false;
        trace_tacc_fi_dma_fail(f->fn, iova);
        return MEMTX_ERROR;
    }
    r = tacc_func_dma(f, iova, buf, len, write);
    if (r != MEMTX_OK) {
        trace_tacc_dma_error(f->fn, iova, len, write);
    }
    return r;
}

MemTxResult tacc_dma_read(TaccFunc *f, uint64_t iova, void *buf, uint64_t len)
{
    return tacc_dma_rw(f, iova, buf, len, false);
}

MemTxResult tacc_dma_write(TaccFunc *f, uint64_t iova, const void *buf,
                           uint64_t len)
{
    return tacc_dma_rw(f, iova, (void *)buf, len, true);
}

static uint16_t tacc_fault(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                           int type, bool write, TaccResult *res)
{
    tacc_counters_begin(f->pf);
    f->cnt[TACC_CNT_mmu_faults]++;
    f->pf->gt.faults++;
    res->fault = true;
    trace_tacc_mmu_fault(f->fn, c->d.ctx, va, type, write);
    if (!(f->fault_info & TACC_FAULT_VALID)) {
        f->fault_addr = va;
        f->fault_tag = c->d.tag;
        f->fault_info = (c->d.ctx & TACC_FAULT_CTX_MASK) |
                        ((q << TACC_FAULT_QUEUE_SHIFT) & TACC_FAULT_QUEUE_MASK) |
                        ((type << TACC_FAULT_TYPE_SHIFT) & TACC_FAULT_TYPE_MASK) |
                        (write ? TACC_FAULT_WRITE : 0) | TACC_FAULT_VALID;
    }
    tacc_irq_cause(f, TACC_IRQ_MMU_FAULT);
    return type == TACC_FAULT_BAD_CTX ? TACC_ST_BAD_CTX : TACC_ST_MMU_FAULT;
}

static uint16_t tacc_dma_fail(TaccFunc *f)
{
    tacc_counters_begin(f->pf);
    f->cnt[TACC_CNT_dma_errors]++;
    f->pf->gt.dma_errors++;
    tacc_irq_cause(f, TACC_IRQ_DMA_ERROR);
    return TACC_ST_DMA_ERROR;
}

enum { KIND_ANY, KIND_HOST, KIND_DEVMEM };

/*
 * Read or write @len bytes at device VA @va of the command's context.
 * @kind restricts the memory the pages may map.  Returns a tacc_status.
 * *@done gets the bytes transferred before any error.  A NULL @buf only
 * translates (and counts the device-memory bytes the copy will move): the
 * data of a host copy lands later, step by step (tacc_copy_land).
 */
static uint16_t tacc_va_rw(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                           void *buf, uint64_t len, bool write, int kind,
                           TaccResult *res, uint64_t *done)
{
    TaccState *s = f->pf;
    uint64_t wbase, wsize;
    uint8_t *p = buf;

    tacc_window(f, &wbase, &wsize);
    *done = 0;
    while (len) {
        TaccXlate x;
        uint64_t n;
        int ft = tacc_mmu_translate(f, c->d.ctx, va, &x, res);

        if (!ft && write && !x.writable) {
            ft = TACC_FAULT_PERMISSION;
        }
        if (!ft && ((kind == KIND_HOST && x.devmem) ||
                    (kind == KIND_DEVMEM && !x.devmem))) {
            ft = TACC_FAULT_MEM_KIND;
        }
        n = MIN(len, x.page_left);
        if (!ft && x.devmem && (x.addr >= wsize || n > wsize - x.addr)) {
            ft = TACC_FAULT_DEVMEM_RANGE;
        }
        if (ft) {
            return tacc_fault(f, q, c, va, ft, write, res);
        }
        if (x.devmem) {
            if (write) {
                if (p) {
                    memcpy(s->devmem + wbase + x.addr, p, n);
                }
                res->devmem_wr += n;
            } else {
                if (p) {
                    memcpy(p, s->devmem + wbase + x.addr, n);
                }
                res->devmem_rd += n;
            }
        } else if (p && tacc_dma_rw(f, x.addr, p, n, write) != MEMTX_OK) {
            return tacc_dma_fail(f);
        }
        va += n;
        p = p ? p + n : NULL;
        len -= n;
        *done += n;
    }
    return TACC_ST_OK;
}

/* Read @len bytes at @va of @c's context, host or device memory. */
uint16_t tacc_exec_read(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                        void *buf, uint64_t len, TaccResult *res)
{
    uint64_t done;

    return tacc_va_rw(f, q, c, va, buf, len, false, KIND_ANY, res, &done);
}

/* Translate [va, va+len) for a devmem write without moving data. */
static uint16_t tacc_va_probe(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                              uint64_t len, TaccResult *res)
{
    uint64_t wbase, wsize;

    tacc_window(f, &wbase, &wsize);
    while (len) {
        TaccXlate x;
        uint64_t n;
        int ft = tacc_mmu_translate(f, c->d.ctx, va, &x, res);

        if (!ft && !x.writable) {
            ft = TACC_FAULT_PERMISSION;
        }
        if (!ft && !x.devmem) {
            ft = TACC_FAULT_MEM_KIND;
        }
        n = MIN(len, x.page_left);
        if (!ft && (x.addr >= wsize || n > wsize - x.addr)) {
            ft = TACC_FAULT_DEVMEM_RANGE;
        }
        if (ft) {
            return tacc_fault(f, q, c, va, ft, true, res);
        }
        va += n;
        len -= n;
    }
    return TACC_ST_OK;
}

static void tacc_copy_kinds(TaccCmd *c, int *skind, int *dkind)
{
    *skind = c->d.opcode == TACC_OP_COPY_H2D ? KIND_HOST : KIND_DEVMEM;
    *dkind = c->d.opcode == TACC_OP_COPY_D2H ? KIND_HOST : KIND_DEVMEM;
}

/*
 * Copies and eltwise run at dispatch, but at most @budget bytes of host work
 * at a time: what is left is continued by tacc_exec_continue() (from the
 * host-work bottom half, one slice per main-loop turn).  The order of every
 * access (translations, faults, DMA) is the one a single pass makes, so
 * results and modelled time do not depend on the slicing.
 */
static bool tacc_copy_run(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                          uint64_t budget)
{
    uint64_t len = c->d.copy.len;
    int skind, dkind;
    /* host copies only translate now: their data lands step by step */
    uint8_t *buf = c->d.opcode == TACC_OP_COPY_D2D ? res->work_buf : NULL;

    tacc_copy_kinds(c, &skind, &dkind);
    while (res->work_pos < len) {
        uint64_t moved = res->work_pos;
        uint64_t n = MIN(len - moved, TACC_XFER_BUF), got, put;

        if (!budget) {
            return false;
        }
        budget -= MIN(budget, n);
        res->status = tacc_va_rw(f, q, c, c->d.copy.src + moved, buf,
                                 n, false, skind, res, &got);
        if (res->status == TACC_ST_OK) {
            res->status = tacc_va_rw(f, q, c, c->d.copy.dst + moved,
                                     buf, n, true, dkind, res, &put);
        } else {
            put = 0;
        }
        res->work_pos += put;
        if (res->status != TACC_ST_OK) {
            break;
        }
    }
    return true;
}

/*
 * What a host copy of @moved payload bytes costs the link and counts:
 * H2D (host side src, device side dst): completions down, read requests up;
 * D2H (host side dst, device side src): memory writes up; DLLPs both ways.
 * Device VAs map page to page (pages >= 4 KiB), so a VA's offset modulo
 * 4 KiB is its bus address's.
 */
static void tacc_copy_account(TaccFunc *f, TaccCmd *c, TaccResult *res,
                              uint64_t moved)
{
    TaccState *s = f->pf;
    bool h2d = c->d.opcode == TACC_OP_COPY_H2D;
    uint64_t host = h2d ? c->d.copy.src : c->d.copy.dst;
    uint64_t dev = h2d ? c->d.copy.dst : c->d.copy.src;
    TaccLinkCount lc;

    res->bytes = moved;
    res->link_kind = h2d ? TACC_LINK_H2D : TACC_LINK_D2H;
    res->link_payload = moved;
    res->link_host_off = host % TACC_LINK_RD_BOUNDARY;
    res->link_dev_off = dev % TACC_LINK_RD_BOUNDARY;
    tacc_link_cost(s, res, 0, moved, &lc);
    res->h2d_bytes = h2d ? moved : 0;
    res->d2h_bytes = h2d ? 0 : moved;
    res->h2d_tlps = h2d ? lc.tlps[0] : 0;
    res->d2h_tlps = h2d ? 0 : lc.tlps[1];
    res->req_tlps = h2d ? lc.tlps[1] : 0;
    res->h2d_link = lc.bytes[0];
    res->d2h_link = lc.bytes[1];
    res->dllp_bytes[0] = lc.dllp[0] * TACC_LINK_DLLP_BYTES;
    res->dllp_bytes[1] = lc.dllp[1] * TACC_LINK_DLLP_BYTES;
    if (h2d) {
        res->devmem_wr = moved;
    } else {
        res->devmem_rd = moved;
    }
}

static void tacc_copy_finish(TaccFunc *f, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    uint64_t moved = res->work_pos;

    res->bytes = moved;
    switch (c->d.opcode) {
    case TACC_OP_COPY_H2D:
        tacc_copy_account(f, c, res, moved);
        res->post_ps = tacc_scale_ps(s, s->read_latency_ns * PS_PER_NS);
        res->land = true;
        break;
    case TACC_OP_COPY_D2H:
        tacc_copy_account(f, c, res, moved);
        res->post_ps = tacc_scale_ps(s, s->write_latency_ns * PS_PER_NS);
        res->land = true;
        break;
    default:        /* D2D: device memory only */
        res->pre_ps += tacc_compute_ps(s, 0, res->devmem_rd + res->devmem_wr);
        break;
    }
}

/*
 * Land payload bytes [land_pos, land_pos + land_len) of a host copy: the
 * data of a link step moves when that step ends (the last step's at the
 * command's completion), so a driver that reads the destination before the
 * completion sees what was there before (docs/hardware.md section 9).  The
 * translations were made and counted at dispatch; a job's mappings do not
 * change while it runs, so they are repeated here uncounted.  A DMA error
 * ends the copy: the bytes landed before it are the command's, and false
 * is returned (the link phase stops).
 */
bool tacc_copy_land(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    uint64_t pos = res->land_pos, n = res->land_len, got = 0, put = 0;
    TaccResult scratch;
    int skind, dkind;
    uint16_t st;
    uint8_t *buf;

    if (!res->land || !n) {
        return true;
    }
    res->land_len = 0;
    memset(&scratch, 0, sizeof(scratch));
    tacc_copy_kinds(c, &skind, &dkind);
    buf = g_malloc(n);
    st = tacc_va_rw(f, q, c, c->d.copy.src + pos, buf, n, false, skind,
                    &scratch, &got);
    if (st == TACC_ST_OK) {
        st = tacc_va_rw(f, q, c, c->d.copy.dst + pos, buf, n, true, dkind,
                        &scratch, &put);
    }
    g_free(buf);
    res->land_pos = pos + put;
    if (st == TACC_ST_OK) {
        return true;
    }
    res->status = st;
    tacc_copy_account(f, c, res, pos + put);
    trace_tacc_exec(f->fn, q, c->d.opcode, c->d.job, c->d.index, st,
                    res->bytes, res->work_start_ps / PS_PER_NS);
    return false;
}

/*
 * FILL: store a 64-bit pattern over [dst, dst + len) of the function's
 * device-memory window.  No MMU (the addresses are window offsets), so a
 * driver can scrub memory no context maps; the window bounds it.  Timed
 * and counted like a D2D copy's write half: device-memory write bandwidth
 * on the DMA H2D engine, devmem_write_bytes.  The stores are host work like
 * a copy's (tacc_fill_run: x-host-slice bytes per main-loop turn).
 */
static void tacc_exec_fill(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    uint64_t dst = c->d.fill.dst, len = c->d.fill.len, wbase, wsize;

    if (!len || len >= TACC_COPY_MAX_LEN || (len & 7)) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (dst & 7) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    tacc_window(f, &wbase, &wsize);
    if (dst >= wsize || len > wsize - dst) {
        res->status = tacc_fault(f, q, c, dst, TACC_FAULT_DEVMEM_RANGE, true,
                                 res);
        return;
    }
    trace_tacc_fill(f->fn, q, dst, len, c->d.fill.value);
    res->work = TACC_WORK_FILL;
}

/* Store up to @budget bytes of a FILL; true when it is done. */
static bool tacc_fill_run(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                          uint64_t budget)
{
    uint64_t dst = c->d.fill.dst, len = c->d.fill.len, wbase, wsize;
    uint64_t pos = res->work_pos, n = MIN(len - pos, MAX(budget, 8));
    uint64_t le = cpu_to_le64(c->d.fill.value);
    uint8_t *p;

    if (!budget) {
        return false;
    }
    /* re-validated per slice: what was checked at dispatch may have moved */
    tacc_window(f, &wbase, &wsize);
    if (dst >= wsize || len > wsize - dst) {
        res->status = tacc_fault(f, q, c, dst + pos, TACC_FAULT_DEVMEM_RANGE,
                                 true, res);
        len = pos;
        n = 0;
        wbase = dst = 0;    /* nothing is stored */
    }
    p = f->pf->devmem + wbase + dst;
    if (!c->d.fill.value) {
        memset(p + pos, 0, n);
    } else {
        for (uint64_t i = pos; i < pos + n; i += 8) {
            memcpy(p + i, &le, 8);
        }
    }
    res->work_pos += n;
    if (res->work_pos < len) {
        return false;
    }
    res->devmem_wr = len;      /* the bytes stored (all, unless a fault) */
    res->bytes = len;
    res->pre_ps += tacc_compute_ps(f->pf, 0, len);
    return true;
}

static void tacc_exec_copy(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    uint64_t len = c->d.copy.len;

    if (len == 0 || len >= TACC_COPY_MAX_LEN) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    res->work = TACC_WORK_COPY;
    res->work_buf = g_malloc(MIN(len, TACC_XFER_BUF));
}

static bool tacc_f32_aligned(uint64_t a)
{
    return !(a & 3);
}

static float tacc_f32(uint32_t bits)
{
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

enum {
    GEMM_GATHER_A, GEMM_GATHER_B, GEMM_GATHER_C, GEMM_GATHER_BIAS,
    GEMM_PROBE_C, GEMM_DONE,
};

/* Pure math, no device state: runs on a thread-pool worker. */
static int tacc_gemm_work(void *opaque)
{
    tacc_ops_gemm(opaque);
    return 0;
}

static void tacc_gemm_free_bufs(TaccGemmJob *j)
{
    g_free(j->A);
    g_free(j->B);
    g_free(j->C);
    g_free(j->bias);
    g_free(j);
}

static void tacc_gemm_free(TaccState *s, TaccGemmJob *j)
{
    if (s) {
        s->gemm_host_bytes[j->fn] -= j->host_bytes;
    }
    tacc_gemm_free_bufs(j);
}

/*
 * The thread pool's completion callback (main loop): the only place a job
 * that went to the pool is freed once aborted.  A job still on its unit has
 * its result ready: the model, if it stopped at the command's completion
 * waiting for it (tacc-sched.c "host work"), goes on from host_bh.
 */
static void tacc_gemm_done(void *opaque, int ret)
{
    TaccGemmJob *j = opaque;
    TaccState *s = j->s;

    j->in_pool = false;
    trace_tacc_gemm_done(j->fn, j->batch, j->m, j->n, j->k,
                         qatomic_read(&j->cancel));
    if (!s) {
        tacc_gemm_free_bufs(j);         /* the device was unplugged */
        return;
    }
    if (qatomic_read(&j->cancel)) {
        TaccGemmJob **pp = &s->orphans;

        while (*pp != j) {
            pp = &(*pp)->next;
        }
        *pp = j->next;
        tacc_gemm_free(s, j);
        return;
    }
    if (s->host_unit && s->host_gemm && s->host_unit->res.gemm == j) {
        qemu_bh_schedule(s->host_bh);
    }
}

/*
 * Drop a GEMM (reset, abort, unplug).  A job still in the thread pool is
 * told to stop at its next batch and parked on s->orphans: its completion
 * callback frees it.  Nothing waits for the worker.
 */
void tacc_gemm_job_free(TaccState *s, TaccGemmJob *j)
{
    if (!j) {
        return;
    }
    if (j->in_pool) {
        qatomic_set(&j->cancel, true);
        j->next = s->orphans;
        s->orphans = j;
        return;
    }
    tacc_gemm_free(s, j);
}

/* Does a GEMM of the device still run in the thread pool? */
bool tacc_gemm_busy(TaccState *s)
{
    if (s->orphans) {
        return true;
    }
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccGemmJob *j = s->unit[i].res.gemm;

        if (j && j->in_pool) {
            return true;
        }
    }
    return false;
}

static bool tacc_aligned(uint64_t a, unsigned dt)
{
    return !(a & (tacc_dtype_size(dt) - 1));
}

static bool tacc_dt_float(unsigned dt)
{
    return dt == TACC_DT_FP32 || dt == TACC_DT_BF16;
}

/* Bytes from the first to the last element of @rows rows of @cols, ld @ld. */
static uint64_t tacc_rows_extent(uint64_t rows, uint64_t cols, uint64_t ld,
                                 unsigned dt)
{
    return ((rows - 1) * ld + cols) * tacc_dtype_size(dt);
}

/*
 * Read @rows rows of @cols elements of @dt (@ld elements apart) at @va into
 * packed fp32 @dst: only the elements move (and count as device-memory
 * bytes), not the padding between rows.
 */
static uint16_t tacc_rows_rd(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                             uint64_t rows, uint64_t cols, uint64_t ld,
                             unsigned dt, float *dst, TaccResult *res)
{
    size_t es = tacc_dtype_size(dt);
    uint64_t done;

    for (uint64_t r = 0; r < rows; r++) {
        float *row = dst + r * cols;
        /* bf16: read into the row's upper half, widen forward in place */
        uint8_t *raw = (uint8_t *)row + cols * (4 - es);
        uint16_t st = tacc_va_rw(f, q, c, va + r * ld * es, raw, cols * es,
                                 false, KIND_DEVMEM, res, &done);
        if (st) {
            return st;
        }
        tacc_widen(raw, dt, row, cols);
    }
    return TACC_ST_OK;
}

/* Write packed fp32 @src as @rows rows of @dt at @va (narrowed per row). */
static uint16_t tacc_rows_wr(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                             uint64_t rows, uint64_t cols, uint64_t ld,
                             unsigned dt, const float *src, TaccResult *res)
{
    size_t es = tacc_dtype_size(dt);
    g_autofree uint8_t *raw = g_malloc(cols * es);
    uint64_t done;

    for (uint64_t r = 0; r < rows; r++) {
        uint16_t st;

        tacc_narrow(src + r * cols, dt, raw, cols);
        st = tacc_va_rw(f, q, c, va + r * ld * es, raw, cols * es, true,
                        KIND_DEVMEM, res, &done);
        if (st) {
            return st;
        }
    }
    return TACC_ST_OK;
}

/* Translate (and permission-check) the rows a command will write. */
static uint16_t tacc_rows_probe(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                                uint64_t rows, uint64_t cols, uint64_t ld,
                                unsigned dt, TaccResult *res)
{
    size_t es = tacc_dtype_size(dt);

    for (uint64_t r = 0; r < rows; r++) {
        uint16_t st = tacc_va_probe(f, q, c, va + r * ld * es, cols * es, res);
        if (st) {
            return st;
        }
    }
    return TACC_ST_OK;
}

static void *tacc_try_floats(uint64_t n)
{
    return n > SIZE_MAX / 4 ? NULL : g_try_malloc(MAX(n, 1) * 4);
}

/* Write C back (at the command's modelled completion). */
uint16_t tacc_gemm_finish(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccGemmJob *j = res->gemm;
    uint64_t wr0 = res->devmem_wr;
    uint32_t hits0 = res->tlb_hits, misses0 = res->tlb_misses;
    uint32_t walks0 = res->walk_reads;
    size_t es = tacc_dtype_size(c->d.gemm.dtype_c);
    uint16_t st = TACC_ST_OK;

    assert(!j->in_pool);    /* the model waits for the completion callback */
    for (uint64_t i = 0; i < j->batch && st == TACC_ST_OK; i++) {
        st = tacc_rows_wr(f, q, c, c->d.gemm.c + i * c->d.gemm.stride_c * es,
                          j->m, j->n, c->d.gemm.ldc, c->d.gemm.dtype_c,
                          j->C + i * j->m * j->n, res);
    }
    /*
     * Already counted (and timed) at dispatch: the bytes, and the translation
     * of every row of C (tacc_rows_probe).  The write-back reuses those
     * translations; walks it repeats after the TLB evicted them are neither
     * timed nor counted, so the command's tlb_* figures are the ones its time
     * paid for (docs/hardware.md section 9).
     */
    res->devmem_wr = wr0;
    res->tlb_hits = hits0;
    res->tlb_misses = misses0;
    res->walk_reads = walks0;
    tacc_gemm_job_free(f->pf, j);
    res->gemm = NULL;
    return st;
}

/* The descriptor checks of a GEMM (docs/hardware.md sections 3 and 14). */
static uint16_t tacc_gemm_check(const struct tacc_desc *d, uint64_t wsize)
{
    uint64_t m = d->gemm.m, n = d->gemm.n, k = d->gemm.k;
    uint64_t batch = d->gemm.batch ? d->gemm.batch : 1;
    bool ta = d->gemm.gflags & TACC_GEMM_F_TRANS_A;
    bool tb = d->gemm.gflags & TACC_GEMM_F_TRANS_B;
    bool bias = d->gemm.gflags & TACC_GEMM_F_BIAS;
    unsigned sab = d->gemm.dtype_ab, sc = d->gemm.dtype_c;
    uint64_t ext_a, ext_b, ext_c;

    if (!tacc_dt_float(sab) || !tacc_dt_float(sc) ||
        (d->gemm.gflags & ~TACC_GEMM_F_ALL) || d->gemm.rsvd ||
        d->gemm.rsvd2 || (!bias && d->gemm.bias)) {
        return TACC_ST_BAD_OPCODE;
    }
    if (!m || !n || !k || m > TACC_GEMM_MAX_DIM || n > TACC_GEMM_MAX_DIM ||
        k > TACC_GEMM_MAX_DIM || batch > TACC_GEMM_MAX_BATCH ||
        batch * m * n * k > TACC_GEMM_MAX_MNK ||
        d->gemm.lda < (ta ? m : k) || d->gemm.ldb < (tb ? k : n) ||
        d->gemm.ldc < n || d->gemm.lda > TACC_GEMM_MAX_LD ||
        d->gemm.ldb > TACC_GEMM_MAX_LD || d->gemm.ldc > TACC_GEMM_MAX_LD ||
        (batch > 1 && !d->gemm.stride_c)) {
        return TACC_ST_BAD_LENGTH;
    }
    if (!tacc_aligned(d->gemm.a, sab) || !tacc_aligned(d->gemm.b, sab) ||
        !tacc_aligned(d->gemm.c, sc) || !tacc_aligned(d->gemm.bias, sc)) {
        return TACC_ST_BAD_ALIGN;
    }
    if (batch > 1 && (d->gemm.stride_a > wsize || d->gemm.stride_b > wsize ||
                      d->gemm.stride_c > wsize)) {
        return TACC_ST_BAD_LENGTH;     /* batches cannot fit in the window */
    }
    ext_a = (batch - 1) * d->gemm.stride_a * tacc_dtype_size(sab) +
            tacc_rows_extent(ta ? k : m, ta ? m : k, d->gemm.lda, sab);
    ext_b = (batch - 1) * d->gemm.stride_b * tacc_dtype_size(sab) +
            tacc_rows_extent(tb ? n : k, tb ? k : n, d->gemm.ldb, sab);
    ext_c = (batch - 1) * d->gemm.stride_c * tacc_dtype_size(sc) +
            tacc_rows_extent(m, n, d->gemm.ldc, sc);
    if (ext_a > wsize || ext_b > wsize || ext_c > wsize ||
        n * tacc_dtype_size(sc) > wsize) {
        return TACC_ST_BAD_LENGTH;     /* cannot fit in device memory */
    }
    return TACC_ST_OK;
}

/* A GEMM's bytes and roofline time (also of a refused one: no bytes). */
static void tacc_gemm_time(TaccState *s, TaccCmd *c, TaccResult *res)
{
    res->bf16 = c->d.gemm.dtype_ab == TACC_DT_BF16;
    res->bytes = res->devmem_rd + res->devmem_wr;
    res->ideal_ps = tacc_roofline_ps(s, res->flops, res->bytes, res->bf16);
    res->pre_ps += res->ideal_ps;
}

/*
 * GEMM: validate, charge the function's staging budget, gather the operands
 * (widened to fp32) at dispatch so faults and walks are timed, compute
 * through the BLAS (a worker thread for big ones: host time is kept apart
 * from modelled time), scatter C at the modelled completion.  The gather is
 * host work like a copy's: tacc_gemm_run moves x-host-slice bytes of rows
 * per main-loop turn.
 */
static void tacc_exec_gemm(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    const struct tacc_desc *d = &c->d;
    uint64_t m = d->gemm.m, n = d->gemm.n, k = d->gemm.k, wbase, wsize;
    uint64_t batch = d->gemm.batch ? d->gemm.batch : 1;
    bool bias = d->gemm.gflags & TACC_GEMM_F_BIAS;
    bool shared_b = batch > 1 && !d->gemm.stride_b;
    uint64_t nb = shared_b ? 1 : batch, elems;
    TaccGemmJob *j;

    tacc_window(f, &wbase, &wsize);
    res->status = tacc_gemm_check(d, wsize);
    if (res->status) {
        tacc_gemm_time(s, c, res);
        return;
    }
    /* at most 2^30 + 2^24 per operand (tacc_gemm_check): no overflow */
    elems = batch * m * k + nb * k * n + batch * m * n + (bias ? n : 0);
    if (elems * 4 > s->gemm_host_max - MIN(s->gemm_host_max,
                                           s->gemm_host_bytes[f->fn])) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: GEMM operands (%"
                      PRIu64 " bytes) beyond the function's staging budget "
                      "(%" PRIu64 " of %" PRIu64 " in use)\n", f->fn, q,
                      elems * 4, s->gemm_host_bytes[f->fn], s->gemm_host_max);
        res->status = TACC_ST_BAD_LENGTH;
        tacc_gemm_time(s, c, res);
        return;
    }
    j = g_new0(TaccGemmJob, 1);
    j->s = s;
    j->fn = f->fn;
    j->m = m;
    j->n = n;
    j->k = k;
    j->batch = batch;
    j->trans_a = d->gemm.gflags & TACC_GEMM_F_TRANS_A;
    j->trans_b = d->gemm.gflags & TACC_GEMM_F_TRANS_B;
    j->shared_b = shared_b;
    j->lda = j->trans_a ? m : k;
    j->ldb = j->trans_b ? k : n;
    j->ldc = n;
    j->alpha = tacc_f32(d->gemm.alpha);
    j->beta = tacc_f32(d->gemm.beta);
    /* guest-sized host buffers: a refused allocation fails the command */
    j->A = tacc_try_floats(batch * m * k);
    j->B = tacc_try_floats(nb * k * n);
    j->C = g_try_malloc0(batch * m * n * 4);     /* beta 0: C starts 0 */
    if (bias) {
        j->bias = tacc_try_floats(n);
    }
    j->host_bytes = elems * 4;
    s->gemm_host_bytes[f->fn] += j->host_bytes;
    if (!j->A || !j->B || !j->C || (bias && !j->bias)) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: GEMM operands (%"
                      PRIu64 " elements) do not fit in host memory\n", f->fn, q,
                      elems);
        tacc_gemm_free(s, j);
        res->status = TACC_ST_BAD_LENGTH;
        tacc_gemm_time(s, c, res);
        return;
    }
    res->gemm = j;
    res->work = TACC_WORK_GEMM;
    res->work_phase = GEMM_GATHER_A;
}

/*
 * The rows of gather phase @ph: @mats matrices of @rows rows of @cols
 * elements of @dt, @ld apart, at @va + i * @stride bytes, packed into
 * @dst + i * @dst_stride floats (NULL: translate only).
 */
typedef struct TaccGemmRows {
    uint64_t mats, rows, cols, ld, va, stride, dst_stride;
    unsigned dt;
    float *dst;
} TaccGemmRows;

static void tacc_gemm_rows(TaccCmd *c, TaccGemmJob *j, int ph,
                           TaccGemmRows *g)
{
    const struct tacc_desc *d = &c->d;
    unsigned sab = d->gemm.dtype_ab, sc = d->gemm.dtype_c;

    memset(g, 0, sizeof(*g));
    switch (ph) {
    case GEMM_GATHER_A:
        *g = (TaccGemmRows){ j->batch, j->trans_a ? j->k : j->m, j->lda,
                             d->gemm.lda, d->gemm.a,
                             d->gemm.stride_a * tacc_dtype_size(sab),
                             j->m * j->k, sab, j->A };
        break;
    case GEMM_GATHER_B:
        *g = (TaccGemmRows){ j->shared_b ? 1 : j->batch,
                             j->trans_b ? j->n : j->k, j->ldb, d->gemm.ldb,
                             d->gemm.b, d->gemm.stride_b * tacc_dtype_size(sab),
                             j->k * j->n, sab, j->B };
        break;
    case GEMM_GATHER_C:
    case GEMM_PROBE_C:
        if (ph == GEMM_PROBE_C || j->beta != 0.0f) {
            *g = (TaccGemmRows){ j->batch, j->m, j->n, d->gemm.ldc, d->gemm.c,
                                 d->gemm.stride_c * tacc_dtype_size(sc),
                                 j->m * j->n, sc,
                                 ph == GEMM_GATHER_C ? j->C : NULL };
        }
        break;
    default:    /* GEMM_GATHER_BIAS */
        if (j->bias) {
            *g = (TaccGemmRows){ 1, 1, j->n, j->n, d->gemm.bias, 0, 0, sc,
                                 j->bias };
        }
        break;
    }
}

/* Compute (or start the worker) once the operands are gathered. */
static void tacc_gemm_start(TaccFunc *f, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    TaccGemmJob *j = res->gemm;
    uint64_t batch = j->batch, m = j->m, n = j->n, k = j->k;

    if (res->status) {
        tacc_gemm_job_free(s, j);
        res->gemm = NULL;
    } else {
        res->flops = 2 * batch * m * n * k + (j->bias ? batch * m * n : 0);
        res->devmem_wr = batch * m * n * tacc_dtype_size(c->d.gemm.dtype_c);
        if (batch * m * n * k >= TACC_GEMM_THREAD_MNK) {
            j->in_pool = true;
            trace_tacc_gemm_submit(j->fn, batch, m, n, k);
            thread_pool_submit_aio(tacc_gemm_work, j, tacc_gemm_done, j);
        } else {
            tacc_ops_gemm(j);
        }
    }
    tacc_gemm_time(s, c, res);
}

/*
 * Gather A, B, C (beta != 0), the bias, then translate every row of C, one
 * row at a time in the order of a single pass, up to @budget bytes of rows;
 * true when done (the GEMM is then started or failed).
 */
static bool tacc_gemm_run(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                          uint64_t budget)
{
    TaccGemmJob *j = res->gemm;
    TaccGemmRows g;

    while (res->work_phase != GEMM_DONE && !res->status) {
        uint64_t i, r, va;
        size_t es;

        tacc_gemm_rows(c, j, res->work_phase, &g);
        if (res->work_pos >= g.mats * g.rows) {
            res->work_phase++;
            res->work_pos = 0;
            continue;
        }
        if (!budget) {
            return false;
        }
        es = tacc_dtype_size(g.dt);
        i = res->work_pos / g.rows;
        r = res->work_pos % g.rows;
        va = g.va + i * g.stride + r * g.ld * es;
        if (g.dst) {
            res->status = tacc_rows_rd(f, q, c, va, 1, g.cols, g.ld, g.dt,
                                       g.dst + i * g.dst_stride + r * g.cols,
                                       res);
        } else {
            res->status = tacc_rows_probe(f, q, c, va, 1, g.cols, g.ld, g.dt,
                                          res);
        }
        budget -= MIN(budget, g.cols * es);
        res->work_pos++;
    }
    tacc_gemm_start(f, c, res);
    return true;
}

/* ---------------------------------------- hw 1.3 row operations ---- */

/* Are the hw 1.3 fields of an ELTWISE in use? (else the hw 1.2 path) */
static bool tacc_elt_v3(const struct tacc_desc *d)
{
    return d->eltwise.op >= TACC_ELT_GELU || d->eltwise.dtype_a ||
           d->eltwise.dtype_c || d->eltwise.eflags || d->eltwise.rsvd ||
           d->eltwise.cols;
}

/*
 * The row operations (ELTWISE with hw 1.3 fields, SOFTMAX, NORM, GATHER)
 * are checked and their host buffers allocated at dispatch; the reads, the
 * computation and the writes then run as host work (TACC_WORK_ROWS) in
 * phases, host_slice bytes per main-loop turn, like a big copy's:
 *   RD_X      the operand rows (GATHER: the index vector), packed fp32
 *   RD_W1/W2  NORM gamma, beta; ELTWISE b
 *   CHECK     GATHER: every index within the table
 *   COMPUTE   whole rows per slice (eltwise: elements)
 *   WR_Y      the result rows
 *   GATHER    GATHER: table row in, output row out, per row
 *   WR_S      NORM with TACC_NORM_F_STATS: the row statistics
 * The accesses are the ones of running it whole, in the same order (a row
 * is cut only at a 2 MiB VA boundary, a leaf boundary at either page size),
 * and nothing else runs on the model in between, so the TLB, the counters
 * and the modelled time are those of the unsliced command.
 */
enum {
    ROW_RD_X, ROW_RD_W1, ROW_RD_W2, ROW_CHECK, ROW_COMPUTE, ROW_WR_Y,
    ROW_GATHER, ROW_WR_S, ROW_DONE,     /* migrated as numbers: WR_S (hw 1.5) last */
};

typedef struct TaccRows {
    uint64_t va, rows, cols, ld;
    unsigned dt;
    float *buf;
} TaccRows;

static bool tacc_elt3_two(const struct tacc_desc *d)
{
    return d->eltwise.op == TACC_ELT_ADD || d->eltwise.op == TACC_ELT_MUL;
}

/* fp32 statistics a NORM with TACC_NORM_F_STATS writes (2 per row: LAYER) */
static uint64_t tacc_norm_nstats(const struct tacc_desc *d)
{
    return (d->norm.kind == TACC_NORM_LAYER ? 2ull : 1ull) * d->norm.rows;
}

/* Does the command have phase @ph? */
static bool tacc_rowop_has(const struct tacc_desc *d, int ph)
{
    switch (d->opcode) {
    case TACC_OP_SOFTMAX:
        return ph == ROW_RD_X || ph == ROW_COMPUTE || ph == ROW_WR_Y;
    case TACC_OP_NORM:
        return (ph <= ROW_RD_W2 || ph == ROW_COMPUTE || ph == ROW_WR_Y ||
                (ph == ROW_WR_S && (d->norm.nflags & TACC_NORM_F_STATS))) &&
               (ph != ROW_RD_W2 || d->norm.kind == TACC_NORM_LAYER);
    case TACC_OP_GATHER:
        return ph == ROW_RD_X || ph == ROW_CHECK || ph == ROW_GATHER;
    default:    /* ELTWISE */
        return ph == ROW_RD_X || ph == ROW_COMPUTE || ph == ROW_WR_Y ||
               (ph == ROW_RD_W1 && tacc_elt3_two(d));
    }
}

/* The rows a read/write phase moves; false for the other phases. */
static bool tacc_rowop_rows(const struct tacc_desc *d, TaccResult *res,
                            int ph, TaccRows *r)
{
    bool bcast = d->eltwise.eflags & TACC_ELT_F_ROW_BCAST;
    uint64_t n = d->eltwise.n, nb = bcast ? d->eltwise.cols : n;

    r->buf = ph == ROW_RD_X || ph == ROW_WR_Y ? res->work_a : res->work_b;
    switch (d->opcode) {
    case TACC_OP_SOFTMAX:
        *r = ph == ROW_RD_X ?
            (TaccRows){ d->softmax.x, d->softmax.rows, d->softmax.cols,
                        d->softmax.ldx, d->softmax.dtype_x, r->buf } :
            (TaccRows){ d->softmax.y, d->softmax.rows, d->softmax.cols,
                        d->softmax.ldy, d->softmax.dtype_y, r->buf };
        return ph == ROW_RD_X || ph == ROW_WR_Y;
    case TACC_OP_NORM:
        switch (ph) {
        case ROW_RD_X:
            *r = (TaccRows){ d->norm.x, d->norm.rows, d->norm.cols,
                             d->norm.ldx, d->norm.dtype_x, r->buf };
            return true;
        case ROW_RD_W1:
        case ROW_RD_W2:
            *r = (TaccRows){ ph == ROW_RD_W1 ? d->norm.gamma : d->norm.beta,
                             1, d->norm.cols, d->norm.cols, d->norm.dtype_w,
                             r->buf + (ph == ROW_RD_W2 ? d->norm.cols : 0) };
            return true;
        case ROW_WR_Y:
            *r = (TaccRows){ d->norm.y, d->norm.rows, d->norm.cols,
                             d->norm.ldy, d->norm.dtype_y, r->buf };
            return true;
        case ROW_WR_S:      /* after gamma and beta in work_b */
            *r = (TaccRows){ d->norm.stats, 1, tacc_norm_nstats(d),
                             tacc_norm_nstats(d), TACC_DT_FP32,
                             res->work_b + 2 * d->norm.cols };
            return true;
        }
        return false;
    case TACC_OP_GATHER:    /* the index vector: 4-byte words, as they are */
        *r = (TaccRows){ d->gather.idx, 1, d->gather.rows, d->gather.rows,
                         TACC_DT_FP32, r->buf };
        return ph == ROW_RD_X;
    default:    /* ELTWISE */
        switch (ph) {
        case ROW_RD_X:
            *r = (TaccRows){ d->eltwise.a, 1, n, n, d->eltwise.dtype_a,
                             r->buf };
            return true;
        case ROW_RD_W1:
            *r = (TaccRows){ d->eltwise.b, 1, nb, nb, d->eltwise.dtype_a,
                             r->buf };
            return true;
        case ROW_WR_Y:
            *r = (TaccRows){ d->eltwise.c, 1, n, n, d->eltwise.dtype_c,
                             r->buf };
            return true;
        }
        return false;
    }
}

/* res->work_buf as scratch of at least @len bytes. */
static uint8_t *tacc_rowop_scratch(TaccResult *res, uint64_t len)
{
    if (res->work_buf_len < len) {
        g_free(res->work_buf);
        res->work_buf = g_malloc(len);
        res->work_buf_len = len;
    }
    return res->work_buf;
}

/*
 * Move the rows of @r between device memory and packed fp32 r->buf (reads
 * widened, writes narrowed), from element *pos on, until they are done or
 * *budget bytes moved.  A row is cut only at a 2 MiB VA boundary.
 */
static uint16_t tacc_rows_step(TaccFunc *f, int q, TaccCmd *c,
                               const TaccRows *r, bool write, uint64_t *pos,
                               uint64_t *budget, TaccResult *res)
{
    size_t es = tacc_dtype_size(r->dt);
    uint64_t total = r->rows * r->cols, done;

    while (*pos < total && *budget) {
        uint64_t row = *pos / r->cols, j = *pos % r->cols;
        uint64_t va = r->va + (row * r->ld + j) * es;
        uint64_t k = r->cols - j;
        float *p = r->buf + *pos;
        uint16_t st;

        if (k * es > *budget) {
            uint64_t cut = ROUND_UP(va + *budget, 1ull << TACC_HUGE_SHIFT) - va;
            k = MIN(k, cut / es);
        }
        if (write) {
            uint8_t *raw = (uint8_t *)p;

            if (r->dt != TACC_DT_FP32) {
                raw = tacc_rowop_scratch(res, k * es);
                tacc_narrow(p, r->dt, raw, k);
            }
            st = tacc_va_rw(f, q, c, va, raw, k * es, true, KIND_DEVMEM, res,
                            &done);
        } else {
            /* bf16: read into the piece's upper half, widen forward */
            uint8_t *raw = (uint8_t *)p + k * (4 - es);

            st = tacc_va_rw(f, q, c, va, raw, k * es, false, KIND_DEVMEM, res,
                            &done);
            if (!st) {
                tacc_widen(raw, r->dt, p, k);
            }
        }
        *pos += k;
        *budget -= MIN(*budget, k * es);
        if (st) {
            return st;
        }
    }
    return TACC_ST_OK;
}

/* COMPUTE: whole rows (eltwise: elements) for @budget bytes of operand. */
static bool tacc_rowop_compute(TaccCmd *c, TaccResult *res, uint64_t *budget)
{
    const struct tacc_desc *d = &c->d;
    uint64_t rows, cols, r0 = res->work_pos, n;

    switch (d->opcode) {
    case TACC_OP_SOFTMAX:
        rows = d->softmax.rows;
        cols = d->softmax.cols;
        break;
    case TACC_OP_NORM:
        rows = d->norm.rows;
        cols = d->norm.cols;
        break;
    default:
        rows = d->eltwise.n;
        cols = 1;
        break;
    }
    n = MIN(rows - r0, MAX(*budget / (cols * 4), 1));
    *budget -= MIN(*budget, n * cols * 4);
    switch (d->opcode) {
    case TACC_OP_SOFTMAX:
        tacc_ops_softmax(res->work_a, r0, r0 + n, cols,
                         tacc_f32(d->softmax.scale),
                         d->softmax.sflags & TACC_SOFTMAX_F_CAUSAL,
                         d->softmax.pos, d->softmax.period);
        break;
    case TACC_OP_NORM: {
        bool layer = d->norm.kind == TACC_NORM_LAYER;
        float *st = d->norm.nflags & TACC_NORM_F_STATS ?
                    res->work_b + 2 * cols : NULL;

        tacc_ops_norm(res->work_a + r0 * cols, n, cols, d->norm.kind,
                      res->work_b, layer ? res->work_b + cols : NULL,
                      tacc_f32(d->norm.eps),
                      st && layer ? st + r0 : NULL,
                      st ? st + (layer ? rows : 0) + r0 : NULL);
        break;
    }
    default:
        tacc_ops_eltwise(d->eltwise.op, res->work_a, res->work_b,
                         d->eltwise.eflags & TACC_ELT_F_ROW_BCAST ?
                         d->eltwise.cols : 0, r0, r0 + n,
                         tacc_f32(d->eltwise.scalar));
        break;
    }
    res->work_pos += n;
    return res->work_pos == rows;
}

static uint64_t tacc_rowop_flops(const struct tacc_desc *d)
{
    switch (d->opcode) {
    case TACC_OP_SOFTMAX:
        return 5ull * d->softmax.rows * d->softmax.cols;
    case TACC_OP_NORM:
        return (d->norm.kind == TACC_NORM_LAYER ? 8ull : 4ull) *
               d->norm.rows * d->norm.cols;
    case TACC_OP_ELTWISE:
        return d->eltwise.n * tacc_elt_flops_per(d->eltwise.op);
    default:
        return 0;
    }
}

/* GATHER's CHECK (@gather false) or GATHER phase for @budget bytes. */
static bool tacc_gather_step(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                             bool gather, uint64_t *budget)
{
    const struct tacc_desc *d = &c->d;
    uint64_t rows = d->gather.rows, cols = d->gather.cols, done;
    size_t es = tacc_dtype_size(d->gather.dtype);
    const uint8_t *idx = (const uint8_t *)res->work_a;
    uint8_t *row = gather ? tacc_rowop_scratch(res, cols * es) : NULL;

    while (res->work_pos < rows && *budget && !res->status) {
        uint64_t r = res->work_pos++;
        int32_t i = (int32_t)ldl_le_p(idx + 4 * r);
        uint64_t tva = d->gather.table +
                       (uint64_t)(uint32_t)i * d->gather.ld_table * es;

        if (!gather) {
            if (i < 0 || (uint64_t)i >= d->gather.table_rows) {
                res->status = TACC_ST_BAD_INDEX;
            }
            *budget -= MIN(*budget, 4);
            continue;
        }
        res->status = tacc_va_rw(f, q, c, tva, row, cols * es, false,
                                 KIND_DEVMEM, res, &done);
        if (!res->status) {
            res->status = tacc_va_rw(f, q, c,
                                     d->gather.out + r * d->gather.ld_out * es,
                                     row, cols * es, true, KIND_DEVMEM, res,
                                     &done);
        }
        *budget -= MIN(*budget, 2 * cols * es);
    }
    return res->work_pos == rows;
}

/* The phases of a row operation, @budget bytes of them. */
static bool tacc_rowop_run(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                           uint64_t budget)
{
    const struct tacc_desc *d = &c->d;

    while (res->work_phase != ROW_DONE) {
        int ph = res->work_phase;
        bool finished;
        TaccRows r;

        if (!budget) {
            return false;
        }
        if (tacc_rowop_rows(d, res, ph, &r)) {
            res->status = tacc_rows_step(f, q, c, &r,
                                         ph == ROW_WR_Y || ph == ROW_WR_S,
                                         &res->work_pos, &budget, res);
            finished = res->work_pos == r.rows * r.cols;
        } else if (ph == ROW_COMPUTE) {
            finished = tacc_rowop_compute(c, res, &budget);
        } else {
            finished = tacc_gather_step(f, q, c, res, ph == ROW_GATHER,
                                        &budget);
        }
        if (res->status != TACC_ST_OK) {
            res->work_phase = ROW_DONE;
        } else if (finished) {
            res->work_pos = 0;
            do {
                res->work_phase++;
            } while (res->work_phase != ROW_DONE &&
                     !tacc_rowop_has(d, res->work_phase));
            if (res->work_phase == ROW_COMPUTE) {
                res->flops = tacc_rowop_flops(d);
            }
        }
    }
    return true;
}

static void tacc_rowop_start(TaccResult *res, float *a, float *b, bool bf16)
{
    res->work_a = a;
    res->work_b = b;
    res->work = TACC_WORK_ROWS;
    res->work_phase = ROW_RD_X;
    res->work_pos = 0;
    res->bf16 = bf16;
}

/* ELTWISE with dtypes, the ops 4..7 and row broadcast. */
static void tacc_exec_elt3(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    const struct tacc_desc *d = &c->d;
    unsigned op = d->eltwise.op, da = d->eltwise.dtype_a;
    unsigned dc = d->eltwise.dtype_c;
    bool two = op == TACC_ELT_ADD || op == TACC_ELT_MUL;
    bool bcast = d->eltwise.eflags & TACC_ELT_F_ROW_BCAST;
    uint64_t n = d->eltwise.n, cols = d->eltwise.cols, nb, wbase, wsize;
    float *a, *b;

    tacc_window(f, &wbase, &wsize);
    if (op >= TACC_ELT_MAX || !tacc_dt_float(da) || !tacc_dt_float(dc) ||
        (d->eltwise.eflags & ~TACC_ELT_F_ALL) || d->eltwise.rsvd ||
        (bcast && !two) || (!bcast && cols) || (!two && d->eltwise.b)) {
        res->status = TACC_ST_BAD_OPCODE;
        return;
    }
    nb = bcast ? cols : n;
    if (!n || n > TACC_ELT_MAX_N || n * 4 > wsize ||
        (bcast && (!cols || n % cols))) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_aligned(d->eltwise.a, da) || !tacc_aligned(d->eltwise.c, dc) ||
        (two && !tacc_aligned(d->eltwise.b, da))) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    a = tacc_try_floats(n);
    b = two ? tacc_try_floats(nb) : NULL;
    if (!a || (two && !b)) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: eltwise operands "
                      "do not fit in host memory\n", f->fn, q);
        g_free(a);
        g_free(b);
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    tacc_rowop_start(res, a, b, da == TACC_DT_BF16);
}

/* SOFTMAX and NORM: rows x cols, ldx/ldy, packed in the host. */
static bool tacc_rows_shape_ok(uint64_t rows, uint64_t cols, uint64_t ldx,
                               uint64_t ldy)
{
    return rows && cols && cols <= TACC_ROW_MAX_COLS &&
           rows * cols <= TACC_ROW_MAX_N && ldx >= cols && ldy >= cols &&
           ldx <= TACC_ROW_MAX_COLS && ldy <= TACC_ROW_MAX_COLS;
}

static void tacc_exec_softmax(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    const struct tacc_desc *d = &c->d;
    uint64_t rows = d->softmax.rows, cols = d->softmax.cols, wbase, wsize;
    unsigned dx = d->softmax.dtype_x, dy = d->softmax.dtype_y;
    float *x;

    tacc_window(f, &wbase, &wsize);
    if (!tacc_dt_float(dx) || !tacc_dt_float(dy) ||
        (d->softmax.sflags & ~TACC_SOFTMAX_F_ALL) || d->softmax.rsvd ||
        (!(d->softmax.sflags & TACC_SOFTMAX_F_CAUSAL) &&
         (d->softmax.pos || d->softmax.period))) {
        res->status = TACC_ST_BAD_OPCODE;
        return;
    }
    if (!tacc_rows_shape_ok(rows, cols, d->softmax.ldx, d->softmax.ldy) ||
        tacc_rows_extent(rows, cols, d->softmax.ldx, dx) > wsize ||
        tacc_rows_extent(rows, cols, d->softmax.ldy, dy) > wsize) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_aligned(d->softmax.x, dx) || !tacc_aligned(d->softmax.y, dy)) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    x = tacc_try_floats(rows * cols);
    if (!x) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    tacc_rowop_start(res, x, NULL, dx == TACC_DT_BF16);
}

static void tacc_exec_norm(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    const struct tacc_desc *d = &c->d;
    uint64_t rows = d->norm.rows, cols = d->norm.cols, wbase, wsize;
    unsigned dx = d->norm.dtype_x, dy = d->norm.dtype_y, dw = d->norm.dtype_w;
    bool layer = d->norm.kind == TACC_NORM_LAYER;
    bool stats = d->norm.nflags & TACC_NORM_F_STATS;
    float eps = tacc_f32(d->norm.eps);
    float *x, *gb;

    tacc_window(f, &wbase, &wsize);
    if (!tacc_dt_float(dx) || !tacc_dt_float(dy) || !tacc_dt_float(dw) ||
        d->norm.kind >= TACC_NORM_MAX || (!layer && d->norm.beta) ||
        !(eps >= 0.0f) || isinf(eps) ||
        (d->norm.nflags & ~TACC_NORM_F_ALL) || d->norm.rsvd ||
        (!stats && d->norm.stats)) {
        res->status = TACC_ST_BAD_OPCODE;
        return;
    }
    if (!tacc_rows_shape_ok(rows, cols, d->norm.ldx, d->norm.ldy) ||
        tacc_rows_extent(rows, cols, d->norm.ldx, dx) > wsize ||
        tacc_rows_extent(rows, cols, d->norm.ldy, dy) > wsize ||
        (stats && tacc_norm_nstats(d) * 4 > wsize)) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_aligned(d->norm.x, dx) || !tacc_aligned(d->norm.y, dy) ||
        !tacc_aligned(d->norm.gamma, dw) || !tacc_aligned(d->norm.beta, dw) ||
        !tacc_aligned(d->norm.stats, TACC_DT_FP32)) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    x = tacc_try_floats(rows * cols);
    /* gamma, beta, then the statistics */
    gb = tacc_try_floats(2 * cols + (stats ? tacc_norm_nstats(d) : 0));
    if (!x || !gb) {
        g_free(x);
        g_free(gb);
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    tacc_rowop_start(res, x, gb, dx == TACC_DT_BF16);
}

static void tacc_exec_gather(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    const struct tacc_desc *d = &c->d;
    uint64_t rows = d->gather.rows, cols = d->gather.cols, wbase, wsize;
    uint64_t trows = d->gather.table_rows;
    unsigned dt = d->gather.dtype;
    float *idx;

    tacc_window(f, &wbase, &wsize);
    if (!tacc_dt_float(dt) || d->gather.rsvd[0] || d->gather.rsvd[1] ||
        d->gather.rsvd[2]) {
        res->status = TACC_ST_BAD_OPCODE;
        return;
    }
    if (!tacc_rows_shape_ok(rows, cols, d->gather.ld_table, d->gather.ld_out) ||
        !trows || tacc_rows_extent(trows, cols, d->gather.ld_table, dt) > wsize ||
        tacc_rows_extent(rows, cols, d->gather.ld_out, dt) > wsize ||
        rows * 4 > wsize) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_aligned(d->gather.table, dt) || !tacc_aligned(d->gather.out, dt) ||
        (d->gather.idx & 3)) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    idx = tacc_try_floats(rows);        /* 4-byte words */
    if (!idx) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    tacc_rowop_start(res, idx, NULL, dt == TACC_DT_BF16);
}

/* Timing and bytes of the row operations (after their host work). */
static void tacc_rowop_finish(TaccFunc *f, TaccResult *res)
{
    res->bytes = res->devmem_rd + res->devmem_wr;
    res->ideal_ps = tacc_roofline_ps(f->pf, res->flops, res->bytes, false);
    res->pre_ps += res->ideal_ps;
}

enum { ELT_READ_A, ELT_READ_B, ELT_COMPUTE, ELT_WRITE_C, ELT_DONE };

static bool tacc_elt_two(TaccCmd *c)
{
    return c->d.eltwise.op == TACC_ELT_ADD || c->d.eltwise.op == TACC_ELT_MUL;
}

static void tacc_elt_compute(TaccCmd *c, float *a, const float *b,
                             uint64_t from, uint64_t to)
{
    float scalar = tacc_f32(c->d.eltwise.scalar);

    for (uint64_t i = from; i < to; i++) {
        switch (c->d.eltwise.op) {
        case TACC_ELT_ADD:
            a[i] = a[i] + b[i];
            break;
        case TACC_ELT_MUL:
            a[i] = a[i] * b[i];
            break;
        case TACC_ELT_RELU:
            a[i] = a[i] > 0.0f ? a[i] : 0.0f;
            break;
        default:
            a[i] = a[i] * scalar;
            break;
        }
    }
}

/* Read A, read B, compute, write C: each phase in @budget-byte slices. */
static bool tacc_elt_run(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                         uint64_t budget)
{
    uint64_t nbytes = c->d.eltwise.n * 4, done;

    while (res->work_phase != ELT_DONE) {
        uint64_t pos = res->work_pos, n = MIN(nbytes - pos, MAX(budget, 4));
        uint8_t *a = (uint8_t *)res->work_a, *b = (uint8_t *)res->work_b;

        if (!budget) {
            return false;
        }
        budget -= MIN(budget, n);
        switch (res->work_phase) {
        case ELT_READ_A:
            res->status = tacc_va_rw(f, q, c, c->d.eltwise.a + pos, a + pos, n,
                                     false, KIND_DEVMEM, res, &done);
            break;
        case ELT_READ_B:
            res->status = tacc_va_rw(f, q, c, c->d.eltwise.b + pos, b + pos, n,
                                     false, KIND_DEVMEM, res, &done);
            break;
        case ELT_COMPUTE:
            tacc_elt_compute(c, res->work_a, res->work_b, pos / 4,
                             (pos + n) / 4);
            break;
        default:
            res->status = tacc_va_rw(f, q, c, c->d.eltwise.c + pos, a + pos, n,
                                     true, KIND_DEVMEM, res, &done);
            break;
        }
        res->work_pos += n;
        if (res->status != TACC_ST_OK) {
            res->work_phase = ELT_DONE;
        } else if (res->work_pos == nbytes) {
            res->work_pos = 0;
            res->work_phase++;
            if (res->work_phase == ELT_READ_B && !tacc_elt_two(c)) {
                res->work_phase++;
            }
            if (res->work_phase == ELT_COMPUTE) {
                res->flops = c->d.eltwise.n;
            }
        }
    }
    return true;
}

static void tacc_exec_eltwise(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    uint64_t n = c->d.eltwise.n, wbase, wsize;
    uint32_t op = c->d.eltwise.op;
    bool two = tacc_elt_two(c);

    if (op >= TACC_ELT_MAX) {
        res->status = TACC_ST_BAD_OPCODE;
        return;
    }
    tacc_window(f, &wbase, &wsize);
    if (!n || n > TACC_ELT_MAX_N || n * 4 > wsize) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_f32_aligned(c->d.eltwise.a) || !tacc_f32_aligned(c->d.eltwise.c) ||
        (two && !tacc_f32_aligned(c->d.eltwise.b))) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    res->work_a = g_try_malloc(n * 4);
    res->work_b = two ? g_try_malloc(n * 4) : NULL;
    if (!res->work_a || (two && !res->work_b)) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: eltwise operands "
                      "do not fit in host memory\n", f->fn, q);
        tacc_exec_drop(res);
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    res->work = TACC_WORK_ELT;
    res->work_phase = ELT_READ_A;
}

static void tacc_elt_finish(TaccFunc *f, TaccResult *res)
{
    tacc_rowop_finish(f, res);
}

void tacc_exec_drop(TaccResult *res)
{
    g_free(res->work_buf);
    g_free(res->work_a);
    g_free(res->work_b);
    res->work_buf = NULL;
    res->work_buf_len = 0;
    res->work_a = res->work_b = NULL;
    res->work = TACC_WORK_NONE;
}

static void tacc_exec_log(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    if (res->status != TACC_ST_OK) {
        qemu_log_mask(LOG_GUEST_ERROR,
                      "tacc: fn%d q%d job %u cmd %u op %u: status %u\n",
                      f->fn, q, c->d.job, c->d.index, c->d.opcode, res->status);
    }
    trace_tacc_exec(f->fn, q, c->d.opcode, c->d.job, c->d.index, res->status,
                    res->bytes, res->work_start_ps / PS_PER_NS);
}

/*
 * Continue a command's host work by up to @budget bytes (UINT64_MAX: to the
 * end).  True when it is done: its TaccResult is then complete.
 */
bool tacc_exec_continue(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                        uint64_t budget)
{
    switch (res->work) {
    case TACC_WORK_COPY:
        if (!tacc_copy_run(f, q, c, res, budget)) {
            return false;
        }
        tacc_copy_finish(f, c, res);
        break;
    case TACC_WORK_ELT:
        if (!tacc_elt_run(f, q, c, res, budget)) {
            return false;
        }
        tacc_elt_finish(f, res);
        break;
    case TACC_WORK_ROWS:
        if (!tacc_rowop_run(f, q, c, res, budget)) {
            return false;
        }
        tacc_rowop_finish(f, res);
        break;
    case TACC_WORK_FILL:
        if (!tacc_fill_run(f, q, c, res, budget)) {
            return false;
        }
        break;
    case TACC_WORK_GEMM:
        if (!tacc_gemm_run(f, q, c, res, budget)) {
            return false;
        }
        break;
    default:
        return true;
    }
    tacc_exec_drop(res);
    tacc_exec_log(f, q, c, res);
    return true;
}

/* FENCE and TIMESTAMP: translate now, write at the modelled completion. */
static void tacc_exec_write8(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    uint64_t va = c->d.fence.addr, wbase, wsize;
    TaccXlate x;
    int ft;

    if (va & 7) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    ft = tacc_mmu_translate(f, c->d.ctx, va, &x, res);
    if (!ft && !x.writable) {
        ft = TACC_FAULT_PERMISSION;
    }
    tacc_window(f, &wbase, &wsize);
    if (!ft && x.devmem && (x.addr >= wsize || 8 > wsize - x.addr)) {
        ft = TACC_FAULT_DEVMEM_RANGE;
    }
    if (ft) {
        res->status = tacc_fault(f, q, c, va, ft, true, res);
        return;
    }
    res->post_write = true;
    res->post_write_devmem = x.devmem;
    res->post_addr = x.addr;    /* devmem: window offset, placed at completion */
    res->post_value = c->d.fence.value;     /* timestamp: set at completion */
    res->bytes = 8;
    if (x.devmem) {
        res->devmem_wr = 8;
    } else {
        TaccLinkCount lc;

        /* an aligned 8-byte write: one TLP (no device-side address) */
        res->link_kind = TACC_LINK_D2H;
        res->link_payload = 8;
        res->link_host_off = va % TACC_LINK_RD_BOUNDARY;
        res->link_dev_off = res->link_host_off;
        tacc_link_cost(s, res, 0, 8, &lc);
        res->d2h_bytes = 8;
        res->d2h_tlps = lc.tlps[1];
        res->h2d_link = lc.bytes[0];
        res->d2h_link = lc.bytes[1];
        res->dllp_bytes[0] = lc.dllp[0] * TACC_LINK_DLLP_BYTES;
        res->dllp_bytes[1] = lc.dllp[1] * TACC_LINK_DLLP_BYTES;
    }
    res->post_ps = tacc_scale_ps(s, s->write_latency_ns * PS_PER_NS);
}

void tacc_exec(TaccFunc *f, int q, TaccCmd *c, uint64_t start_ps,
               TaccResult *res)
{
    TaccState *s = f->pf;

    memset(res, 0, sizeof(*res));
    res->pre_ps = tacc_scale_ps(s, s->cmd_latency_ns * PS_PER_NS);
    /* a listed command: its fetch from list memory (tacc-list.c) */
    res->pre_ps += c->fetch_ps;
    res->tlb_hits = c->fetch_hits;
    res->tlb_misses = c->fetch_misses;
    res->walk_reads = c->fetch_walks;

    if (c->preset) {
        res->status = c->preset;        /* refused listed command, LIST end */
    } else if (c->d.opcode >= TACC_OP_MAX) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: bad opcode %u\n",
                      f->fn, q, c->d.opcode);
        res->status = TACC_ST_BAD_OPCODE;
    } else if (c->d.opcode != TACC_OP_NOP && c->d.opcode != TACC_OP_BARRIER &&
               c->d.opcode != TACC_OP_FILL && c->d.ctx >= TACC_NUM_CONTEXTS) {
        res->status = TACC_ST_BAD_CTX;
    } else {
        switch (c->d.opcode) {
        case TACC_OP_COPY_H2D:
        case TACC_OP_COPY_D2H:
        case TACC_OP_COPY_D2D:
            tacc_exec_copy(f, q, c, res);
            break;
        case TACC_OP_GEMM:
            tacc_exec_gemm(f, q, c, res);
            break;
        case TACC_OP_ELTWISE:
            if (tacc_elt_v3(&c->d)) {
                tacc_exec_elt3(f, q, c, res);
                if (!res->work) {
                    tacc_rowop_finish(f, res);      /* refused */
                }
            } else {
                tacc_exec_eltwise(f, q, c, res);
            }
            break;
        case TACC_OP_SOFTMAX:
        case TACC_OP_NORM:
        case TACC_OP_GATHER:
            if (c->d.opcode == TACC_OP_SOFTMAX) {
                tacc_exec_softmax(f, q, c, res);
            } else if (c->d.opcode == TACC_OP_NORM) {
                tacc_exec_norm(f, q, c, res);
            } else {
                tacc_exec_gather(f, q, c, res);
            }
            if (!res->work) {
                tacc_rowop_finish(f, res);          /* refused */
            }
            break;
        case TACC_OP_FENCE:
        case TACC_OP_TIMESTAMP:
            tacc_exec_write8(f, q, c, res);
            break;
        case TACC_OP_FILL:
            tacc_exec_fill(f, q, c, res);
            break;
        default:            /* NOP, BARRIER (its wait is in the scheduler),
                             * LIST (its commands run from tacc-list.c) */
            break;
        }
    }
    res->work_start_ps = start_ps;
    if (res->work) {
        tacc_exec_continue(f, q, c, res, f->pf->host_slice);
    } else {
        tacc_exec_log(f, q, c, res);
    }
}
