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
#include "qemu/log.h"
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
        return TACC_CLASS_COMPUTE;
    default:
        return TACC_CLASS_LOCAL;       /* incl. bad opcodes: fail fast */
    }
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
 * on the DMA H2D engine, devmem_write_bytes.
 */
static void tacc_exec_fill(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    uint64_t dst = c->d.fill.dst, len = c->d.fill.len, wbase, wsize;
    uint64_t le = cpu_to_le64(c->d.fill.value);
    uint8_t *p;

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
    p = s->devmem + wbase + dst;
    if (!c->d.fill.value) {
        memset(p, 0, len);
    } else {
        for (uint64_t i = 0; i < len; i += 8) {
            memcpy(p + i, &le, 8);
        }
    }
    res->devmem_wr = len;
    res->bytes = len;
    res->pre_ps += tacc_compute_ps(s, 0, len);
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

/* Pure math, no device state: runs on the main loop or a worker thread. */
static void tacc_gemm_compute(TaccGemmJob *j)
{
    double *acc = j->acc;

    for (uint64_t i = 0; i < j->m && !qatomic_read(&j->cancel); i++) {
        memset(acc, 0, j->n * sizeof(double));
        for (uint64_t p = 0; p < j->k; p++) {
            double a = j->A[i * j->lda + p];
            const float *brow = &j->B[p * j->ldb];
            for (uint64_t x = 0; x < j->n; x++) {
                acc[x] += a * brow[x];
            }
        }
        for (uint64_t x = 0; x < j->n; x++) {
            float prev = j->beta != 0.0f ? j->C[i * j->ldc + x] : 0.0f;
            j->C[i * j->ldc + x] = (float)(j->alpha * acc[x]) + j->beta * prev;
        }
    }
}

static void *tacc_gemm_thread(void *opaque)
{
    TaccGemmJob *j = opaque;
    QEMUBH *bh = j->bh;     /* lives until every worker is joined */

    tacc_gemm_compute(j);
    qatomic_store_release(&j->done, true);  /* j may be freed from here on */
    qemu_bh_schedule(bh);
    return NULL;
}

static void tacc_gemm_free_bufs(TaccGemmJob *j)
{
    g_free(j->A);
    g_free(j->B);
    g_free(j->C);
    g_free(j->acc);
    g_free(j);
}

/*
 * Drop a GEMM (reset, abort, unplug).  A worker still computing is never
 * joined here (that would hold the BQL for as long as the GEMM takes): it is
 * told to stop at its next row and parked on s->orphans; tacc_gemm_reap()
 * joins it once it has finished (then joining is immediate).
 */
void tacc_gemm_job_free(TaccState *s, TaccGemmJob *j)
{
    if (!j) {
        return;
    }
    if (j->threaded && !qatomic_load_acquire(&j->done)) {
        qatomic_set(&j->cancel, true);
        j->next = s->orphans;
        s->orphans = j;
        return;
    }
    if (j->threaded) {
        qemu_thread_join(&j->thread);   /* finished: does not block */
    }
    tacc_gemm_free_bufs(j);
}

/* Join and free the parked workers that have finished (all, if @wait). */
void tacc_gemm_reap(TaccState *s, bool wait)
{
    TaccGemmJob **pp = &s->orphans;

    while (*pp) {
        TaccGemmJob *j = *pp;
        if (!wait && !qatomic_load_acquire(&j->done)) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        qemu_thread_join(&j->thread);   /* cancelled: at most one row left */
        tacc_gemm_free_bufs(j);
    }
}

/* Write C back (at the command's modelled completion). */
uint16_t tacc_gemm_finish(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccGemmJob *j = res->gemm;
    uint64_t done, wr0 = res->devmem_wr;
    uint32_t hits0 = res->tlb_hits, misses0 = res->tlb_misses;
    uint32_t walks0 = res->walk_reads;
    uint16_t st = TACC_ST_OK;

    if (j->threaded) {
        qemu_thread_join(&j->thread);       /* waits only if the host is slower */
        j->threaded = false;
    }
    res->devmem_wr = 0;
    for (uint64_t i = 0; i < j->m && st == TACC_ST_OK; i++) {
        st = tacc_va_rw(f, q, c, c->d.gemm.c + i * j->ldc * 4, &j->C[i * j->ldc],
                        j->n * 4, true, KIND_DEVMEM, res, &done);
    }
    /*
     * Already counted (and timed) at dispatch: the bytes, and the translation
     * of every row of C (tacc_va_probe).  The write-back reuses those
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

/*
 * GEMM: validate, translate and gather the operands at dispatch (so faults
 * and walks are timed), compute (a worker thread for big ones: host time is
 * kept apart from modelled time), scatter C at the modelled completion.
 */
static void tacc_exec_gemm(TaccFunc *f, int q, TaccCmd *c, TaccResult *res)
{
    TaccState *s = f->pf;
    uint64_t m = c->d.gemm.m, n = c->d.gemm.n, k = c->d.gemm.k;
    uint64_t lda = c->d.gemm.lda, ldb = c->d.gemm.ldb, ldc = c->d.gemm.ldc;
    uint64_t la, lb, lc, done, wbase, wsize;
    TaccGemmJob *j;

    if (!m || !n || !k || m > TACC_GEMM_MAX_DIM || n > TACC_GEMM_MAX_DIM ||
        k > TACC_GEMM_MAX_DIM || m * n * k > TACC_GEMM_MAX_MNK ||
        lda < k || ldb < n || ldc < n || lda > TACC_GEMM_MAX_DIM * 16 ||
        ldb > TACC_GEMM_MAX_DIM * 16 || ldc > TACC_GEMM_MAX_DIM * 16) {
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    if (!tacc_f32_aligned(c->d.gemm.a) || !tacc_f32_aligned(c->d.gemm.b) ||
        !tacc_f32_aligned(c->d.gemm.c)) {
        res->status = TACC_ST_BAD_ALIGN;
        return;
    }
    la = ((m - 1) * lda + k) * 4;
    lb = ((k - 1) * ldb + n) * 4;
    lc = ((m - 1) * ldc + n) * 4;
    tacc_window(f, &wbase, &wsize);
    if (la > wsize || lb > wsize || lc > wsize) {
        res->status = TACC_ST_BAD_LENGTH;     /* cannot fit in device memory */
        return;
    }
    j = g_new0(TaccGemmJob, 1);
    j->m = m;
    j->n = n;
    j->k = k;
    j->lda = lda;
    j->ldb = ldb;
    j->ldc = ldc;
    j->alpha = tacc_f32(c->d.gemm.alpha);
    j->beta = tacc_f32(c->d.gemm.beta);
    /* guest-sized host buffers: a refused allocation fails the command */
    j->A = g_try_malloc(la);
    j->B = g_try_malloc(lb);
    j->C = g_try_malloc0(lc);
    j->acc = g_try_new(double, n);
    if (!j->A || !j->B || !j->C || !j->acc) {
        qemu_log_mask(LOG_GUEST_ERROR, "tacc: fn%d q%d: GEMM operands (%" PRIu64
                      " bytes) do not fit in host memory\n", f->fn, q,
                      la + lb + lc);
        tacc_gemm_free_bufs(j);
        res->status = TACC_ST_BAD_LENGTH;
        return;
    }
    res->status = tacc_va_rw(f, q, c, c->d.gemm.a, j->A, la, false, KIND_DEVMEM,
                             res, &done);
    if (!res->status) {
        res->status = tacc_va_rw(f, q, c, c->d.gemm.b, j->B, lb, false,
                                 KIND_DEVMEM, res, &done);
    }
    if (!res->status && j->beta != 0.0f) {
        res->status = tacc_va_rw(f, q, c, c->d.gemm.c, j->C, lc, false,
                                 KIND_DEVMEM, res, &done);
    }
    /* translate (and permission-check) every row of C now */
    for (uint64_t i = 0; i < m && !res->status; i++) {
        res->status = tacc_va_probe(f, q, c, c->d.gemm.c + i * ldc * 4, n * 4,
                                    res);
    }
    if (res->status) {
        tacc_gemm_job_free(s, j);
    } else {
        res->flops = 2 * m * n * k;
        res->devmem_wr = m * n * 4;
        res->gemm = j;
        if (m * n * k >= TACC_GEMM_THREAD_MNK) {
            j->threaded = true;
            j->bh = s->host_bh;
            qemu_thread_create(&j->thread, "tacc-gemm", tacc_gemm_thread, j,
                               QEMU_THREAD_JOINABLE);
        } else {
            tacc_gemm_compute(j);
        }
    }
    res->bytes = res->devmem_rd + res->devmem_wr;
    res->pre_ps += tacc_compute_ps(s, res->flops,
                                   res->devmem_rd + res->devmem_wr);
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
    res->bytes = res->devmem_rd + res->devmem_wr;
    res->pre_ps += tacc_compute_ps(f->pf, res->flops,
                                   res->devmem_rd + res->devmem_wr);
}

void tacc_exec_drop(TaccResult *res)
{
    g_free(res->work_buf);
    g_free(res->work_a);
    g_free(res->work_b);
    res->work_buf = NULL;
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

    if (c->d.opcode >= TACC_OP_MAX) {
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
            tacc_exec_eltwise(f, q, c, res);
            break;
        case TACC_OP_FENCE:
        case TACC_OP_TIMESTAMP:
            tacc_exec_write8(f, q, c, res);
            break;
        case TACC_OP_FILL:
            tacc_exec_fill(f, q, c, res);
            break;
        default:            /* NOP, BARRIER (its wait is in the scheduler) */
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
