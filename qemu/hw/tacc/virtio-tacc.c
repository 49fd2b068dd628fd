/*
 * virtio-tacc: the paravirtual tacc function - backend (docs/virtio.md).
 *
 * A VirtIODevice that is function TACC_FN_VIRTIO of the linked tacc PF:
 *   control queue  contexts, BOs (guest pages by address, read in place),
 *                  VM_BIND into page tables the backend owns, trace ring
 *   submit queue   batches of whole jobs, checked whole, fed into the
 *                  function's hardware queues (the scheduler's FIFOs); a
 *                  buffer is used when all its jobs completed
 *   shared memory  fence slots (seqno per context and ring), counter block
 * The engines, MMU, TLB, trace records and counters are the device's own
 * (tacc-sched.c, tacc-exec.c ...), reached through TaccFuncOps.
 *
 * Fault injection (qom-set at run time on the backend, virtio-backend):
 *   x-fi-ctx-id=N   the next CTX_CREATE answers context N (self-clearing;
 *                   -1: off): a device the driver must not trust
 *   x-fi-ctrl-delay-ms=N  the next control request is carried out at once
 *                   but its answer is used N ms (virtual clock) later; the
 *                   queue is served in order, so later requests wait behind
 *                   it (self-clearing; 0: off): a late answer
 *   x-fi-ctrl-short=N  the next control answer is used with N bytes written
 *                   (0..15, fewer than struct tacc_virtio_resp; the request
 *                   is carried out; self-clearing; -1: off)
 *   x-fi-page-entries=N  the function's pool of page-list entries (config
 *                   page_entries; 1..TACC_VIRTIO_MAX_FN_ENTS): a smaller
 *                   device; x-page-entries-used (read only) is its use
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/bitmap.h"
#include "qemu/iov.h"
#include "qemu/log.h"
#include "qemu/error-report.h"
#include "migration/qemu-file-types.h"
#include "qemu/main-loop.h"
#include "qemu/module.h"
#include "qapi/error.h"
#include "qapi/visitor.h"
#include "hw/qdev-properties.h"
#include "hw/virtio/virtio.h"
#include "standard-headers/linux/virtio_config.h"
#include "standard-headers/linux/virtio_ring.h"
#include "system/dma.h"
#include "virtio-tacc.h"
#include "trace.h"

#define VT_PAGE                 4096ull
#define VT_HUGE                 (1ull << TACC_HUGE_SHIFT)
#define VT_MAX_CTRL_LEN         (sizeof(struct tacc_virtio_hdr) + \
                                 sizeof(struct tacc_virtio_bo_create) + \
                                 TACC_VIRTIO_MAX_BO_ENTS * \
                                 sizeof(struct tacc_virtio_mem_entry))
/*
 * Submit buffers are taken from the virtqueue only while fewer commands than
 * this wait for a FIFO (all rings together): a guest that queues the whole
 * virtqueue of maximal batches makes QEMU hold at most this much plus one
 * batch of copied commands (docs/virtio.md "Host memory"), not 256 of them.
 */
#define VT_PENDING_CMDS_MAX     (TACC_VIRTIO_NUM_RINGS * TACC_FIFO_DEPTH)
#define VT_MAX_SUBMIT_LEN       (sizeof(struct tacc_virtio_submit) + \
                                 TACC_VIRTIO_MAX_BATCH_JOBS * \
                                 (sizeof(struct tacc_virtio_job) + \
                                  TACC_VIRTIO_MAX_JOB_CMDS * TACC_DESC_SIZE))

struct VtBo {
    uint32_t handle;
    uint32_t ctx;
    bool devmem;
    uint64_t size;
    uint64_t dev_off;           /* devmem: offset in the function's window */
    uint32_t nents;
    struct tacc_virtio_mem_entry *ents;     /* host: pages, host byte order */
    uint32_t *ents_total;                   /* VirtIOTacc.ents_total */
    uint32_t binds;
};

struct VtBatch {
    VirtQueueElement *elem;
    uint32_t njobs, done, failed;
    uint32_t status;
    struct tacc_virtio_job_status *st;
};

struct VtJob {
    QSIMPLEQ_ENTRY(VtJob) next;
    VtBatch *batch;
    uint32_t idx;               /* in its batch */
    uint32_t ctx;
    uint16_t ring, ncmds;
    uint64_t seqno, tag;
    uint32_t devjob;
    uint64_t kick_ps;
    struct tacc_desc *cmds;
};

static VirtIOTacc *vt_of(TaccFunc *f)
{
    return container_of(f, VirtIOTacc, func);
}

static uint32_t G_GNUC_PRINTF(2, 3) vt_bad(uint32_t status, const char *fmt,
                                           ...)
{
    va_list ap;
    g_autofree char *msg = NULL;

    va_start(ap, fmt);
    msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    qemu_log_mask(LOG_GUEST_ERROR, "virtio-tacc: %s\n", msg);
    trace_virtio_tacc_refused(status, msg);
    return status;
}

/* ------------------------------------------------------ page tables ---- */

static bool vt_pt_read(TaccFunc *f, uint64_t addr, uint64_t *pte)
{
    VirtIOTacc *vt = vt_of(f);
    uint64_t id = addr >> TACC_PAGE_SHIFT;

    if (!id || id > TACC_VIRTIO_MAX_PT_PAGES || !vt->pt[id] || (addr & 7)) {
        return false;
    }
    *pte = cpu_to_le64(vt->pt[id][(addr & (VT_PAGE - 1)) / 8]);
    return true;
}

static uint32_t vt_pt_alloc(VirtIOTacc *vt)
{
    for (uint32_t id = 1; id <= TACC_VIRTIO_MAX_PT_PAGES; id++) {
        if (!vt->pt[id]) {
            vt->pt[id] = g_new0(uint64_t, TACC_PT_ENTRIES);
            vt->pt_used++;
            return id;
        }
    }
    return 0;
}

static void vt_pt_free_tree(VirtIOTacc *vt, uint32_t id, int level)
{
    uint64_t *t;

    if (!id || id > TACC_VIRTIO_MAX_PT_PAGES || !vt->pt[id]) {
        return;
    }
    t = vt->pt[id];
    if (level < 2) {
        for (int i = 0; i < TACC_PT_ENTRIES; i++) {
            /* a 2 MiB leaf (level 1) points at data, not at a table */
            if ((t[i] & TACC_PTE_VALID) && !(t[i] & TACC_PTE_HUGE)) {
                vt_pt_free_tree(vt, (t[i] & TACC_PTE_ADDR_MASK) >> 12,
                                level + 1);
            }
        }
    }
    g_free(t);
    vt->pt[id] = NULL;
    vt->pt_used--;
}

/*
 * The entry of va in ctx at @level (1: a 2 MiB slot, 2: a 4 KiB one), creating
 * tables on the way (if @make).  NULL if a table is missing (or cannot be
 * made), or if a 2 MiB leaf covers va above the level asked for.
 */
static uint64_t *vt_pt_entry(VirtIOTacc *vt, VtCtx *c, uint64_t va, int level,
                             bool make)
{
    uint32_t id = c->root;

    for (int l = 0; l < level; l++) {
        uint64_t *e = &vt->pt[id][(va >> (30 - 9 * l)) & 511];
        if (*e & TACC_PTE_HUGE) {
            return NULL;
        }
        if (!(*e & TACC_PTE_VALID)) {
            uint32_t n = make ? vt_pt_alloc(vt) : 0;
            if (!n) {
                return NULL;
            }
            *e = ((uint64_t)n << 12) | TACC_PTE_VALID;
        }
        id = (*e & TACC_PTE_ADDR_MASK) >> 12;
    }
    return &vt->pt[id][(va >> (30 - 9 * level)) & 511];
}

static uint64_t *vt_pt_slot(VirtIOTacc *vt, VtCtx *c, uint64_t va, bool make)
{
    return vt_pt_entry(vt, c, va, 2, make);
}

/* ------------------------------------------------------------ state ---- */

static VtCtx *vt_ctx(VirtIOTacc *vt, uint32_t ctx)
{
    return ctx < TACC_NUM_CONTEXTS && vt->ctx[ctx].used ? &vt->ctx[ctx] : NULL;
}

static void vt_fence_write(VirtIOTacc *vt, uint32_t ctx, int ring,
                           uint64_t seqno, uint16_t status, bool failed)
{
    uint8_t *p = vt->fences + (ctx * TACC_VIRTIO_NUM_RINGS + ring) *
                 TACC_VIRTIO_FENCE_SIZE;

    stl_le_p(p + 8, status);
    if (failed) {
        stl_le_p(p + 12, ldl_le_p(p + 12) + 1);
    }
    smp_wmb();                  /* status, failed before seqno (release) */
    stq_le_p(p, seqno);
}

static void vt_bo_free(VirtIOTacc *vt, VtBo *bo)
{
    g_hash_table_remove(vt->bos, GUINT_TO_POINTER(bo->handle));
}

static void vt_bo_destroy_cb(gpointer p)
{
    VtBo *bo = p;

    *bo->ents_total -= bo->nents;
    g_free(bo->ents);
    g_free(bo);
}

static void vt_ctx_free(VirtIOTacc *vt, uint32_t ctx)
{
    VtCtx *c = &vt->ctx[ctx];
    GHashTableIter it;
    gpointer v;

    vt->func.ptbr[ctx] = 0;
    tacc_tlb_invalidate(vt->pf, TACC_FN_VIRTIO, ctx);
    vt_pt_free_tree(vt, c->root, 0);
    if (c->binds) {
        g_array_free(c->binds, true);
    }
    g_hash_table_iter_init(&it, vt->bos);
    while (g_hash_table_iter_next(&it, NULL, &v)) {
        if (((VtBo *)v)->ctx == ctx) {
            g_hash_table_iter_remove(&it);
        }
    }
    memset(c, 0, sizeof(*c));
}

static bool vt_window_busy(TaccFunc *f)
{
    VirtIOTacc *vt = vt_of(f);
    GHashTableIter it;
    gpointer v;

    g_hash_table_iter_init(&it, vt->bos);
    while (g_hash_table_iter_next(&it, NULL, &v)) {
        if (((VtBo *)v)->devmem) {
            return true;
        }
    }
    return false;
}

/* (offset, size) pairs, by offset */
static gint vt_range_cmp(gconstpointer a, gconstpointer b)
{
    const uint64_t *x = a, *y = b;

    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/*
 * First fit in the window, at an offset aligned to @align: O(n log n) in the
 * device BOs; UINT64_MAX if it does not fit.
 */
static uint64_t vt_devmem_fit(VirtIOTacc *vt, uint64_t size, uint64_t align)
{
    g_autoptr(GArray) used = g_array_new(false, false, 2 * sizeof(uint64_t));
    uint64_t base, wsize, at = 0;
    GHashTableIter it;
    gpointer v;

    tacc_window(&vt->func, &base, &wsize);
    g_hash_table_iter_init(&it, vt->bos);
    while (g_hash_table_iter_next(&it, NULL, &v)) {
        VtBo *bo = v;
        uint64_t r[2] = { bo->dev_off, bo->size };

        if (bo->devmem) {
            g_array_append_val(used, r);
        }
    }
    g_array_sort(used, vt_range_cmp);
    /* offsets in the window: what a device PTE holds (TACC_PTE_DEVMEM) */
    for (guint i = 0; i < used->len; i++) {
        uint64_t *r = &g_array_index(used, uint64_t, 2 * i);

        if (r[0] >= at && r[0] - at >= size) {
            break;                      /* the gap before it fits */
        }
        at = MAX(at, ROUND_UP(r[0] + r[1], align));
    }
    return at <= wsize && size <= wsize - at ? at : UINT64_MAX;
}

/*
 * A device BO of 2 MiB or more starts 2 MiB-aligned (where the window has
 * such a gap), so its bindings can take 2 MiB leaves, as tacc.ko's PF driver
 * places them; smaller ones, and big ones that only fit unaligned, 4 KiB.
 */
static uint64_t vt_devmem_alloc(VirtIOTacc *vt, uint64_t size)
{
    uint64_t at = size >= VT_HUGE ? vt_devmem_fit(vt, size, VT_HUGE)
                                  : UINT64_MAX;

    return at != UINT64_MAX ? at : vt_devmem_fit(vt, size, VT_PAGE);
}

/* A context's bindings are sorted by VA: the first one above @va. */
static guint vt_bind_above(VtCtx *c, uint64_t va)
{
    guint lo = 0, hi = c->binds->len;

    while (lo < hi) {
        guint mid = lo + (hi - lo) / 2;

        if (g_array_index(c->binds, VtBind, mid).va <= va) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* The binding that holds @va, or NULL. */
static VtBind *vt_bind_at(VtCtx *c, uint64_t va)
{
    guint i = vt_bind_above(c, va);
    VtBind *b = i ? &g_array_index(c->binds, VtBind, i - 1) : NULL;

    return b && va - b->va < b->size ? b : NULL;
}

/* --------------------------------------------------------- control ---- */

static uint32_t vt_ctx_create(VirtIOTacc *vt, uint64_t *value)
{
    for (uint32_t i = 0; i < TACC_NUM_CONTEXTS; i++) {
        VtCtx *c = &vt->ctx[i];
        if (c->used) {
            continue;
        }
        c->root = vt_pt_alloc(vt);
        if (!c->root) {
            return vt_bad(TACC_VIRTIO_ERR_NOSPC, "no page-table page left");
        }
        c->used = true;
        c->binds = g_array_new(false, true, sizeof(VtBind));
        memset(vt->fences + i * TACC_VIRTIO_NUM_RINGS * TACC_VIRTIO_FENCE_SIZE,
               0, TACC_VIRTIO_NUM_RINGS * TACC_VIRTIO_FENCE_SIZE);
        vt->func.ptbr[i] = ((uint64_t)c->root << 12) | TACC_PTBR_VALID;
        tacc_tlb_invalidate(vt->pf, TACC_FN_VIRTIO, i);
        *value = i;
        if (vt->fi_ctx_id >= 0) {   /* a lying device, once */
            *value = vt->fi_ctx_id;
            vt->fi_ctx_id = -1;
        }
        return TACC_VIRTIO_OK;
    }
    return vt_bad(TACC_VIRTIO_ERR_NOSPC, "all %d contexts in use",
                  TACC_NUM_CONTEXTS);
}

static uint32_t vt_ctx_destroy(VirtIOTacc *vt, uint32_t ctx)
{
    VtCtx *c = vt_ctx(vt, ctx);

    if (!c) {
        return vt_bad(TACC_VIRTIO_ERR_NOENT, "CTX_DESTROY of no context %u",
                      ctx);
    }
    if (c->inflight) {
        return TACC_VIRTIO_ERR_BUSY;
    }
    vt_ctx_free(vt, ctx);
    return TACC_VIRTIO_OK;
}

static uint32_t vt_bo_create(VirtIOTacc *vt, uint32_t ctx, const uint8_t *b,
                             size_t len, uint64_t *value)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);
    struct tacc_virtio_bo_create r;
    uint64_t size, total = 0;
    uint32_t flags, n;
    VtBo *bo;

    if (!vt_ctx(vt, ctx)) {
        return vt_bad(TACC_VIRTIO_ERR_NOENT, "BO_CREATE in no context %u", ctx);
    }
    if (len < sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_CREATE truncated");
    }
    memcpy(&r, b, sizeof(r));
    size = le64_to_cpu(r.size);
    flags = le32_to_cpu(r.flags);
    n = le32_to_cpu(r.nr_ents);
    if (!size || size > TACC_VIRTIO_MAX_BO_SIZE || (size & (VT_PAGE - 1)) ||
        (flags & ~TACC_VIRTIO_BO_DEVMEM)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_CREATE size 0x%" PRIx64
                      " flags 0x%x", size, flags);
    }
    if (g_hash_table_size(vt->bos) >= TACC_VIRTIO_MAX_BOS) {
        return vt_bad(TACC_VIRTIO_ERR_NOSPC, "BO_CREATE: no handle left");
    }
    if (flags & TACC_VIRTIO_BO_DEVMEM) {
        uint64_t off;

        if (!virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_DEVMEM)) {
            return vt_bad(TACC_VIRTIO_ERR_UNSUPP, "devmem BO, F_DEVMEM off");
        }
        if (n || len != sizeof(r)) {
            return vt_bad(TACC_VIRTIO_ERR_INVAL, "devmem BO with pages");
        }
        off = vt_devmem_alloc(vt, size);
        if (off == UINT64_MAX) {
            return TACC_VIRTIO_ERR_NOSPC;
        }
        bo = g_new0(VtBo, 1);
        bo->devmem = true;
        bo->dev_off = off;
        {
            uint64_t base, wsize;
            tacc_window(&vt->func, &base, &wsize);
            memset(vt->pf->devmem + base + off, 0, size);   /* scrub */
        }
    } else {
        size_t want = sizeof(r) + (size_t)n * sizeof(*bo->ents);

        if (!n || n > TACC_VIRTIO_MAX_BO_ENTS || n > size / VT_PAGE ||
            len != want) {
            return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_CREATE %u entries in %zu "
                          "bytes", n, len);
        }
        if (vt->ents_total > vt->fi_page_entries ||
            n > vt->fi_page_entries - vt->ents_total) {
            return vt_bad(TACC_VIRTIO_ERR_NOSPC, "BO_CREATE: page lists full");
        }
        bo = g_new0(VtBo, 1);
        bo->ents = g_new(struct tacc_virtio_mem_entry, n);
        memcpy(bo->ents, b + sizeof(r), n * sizeof(*bo->ents));
        for (uint32_t i = 0; i < n; i++) {
            uint64_t a = le64_to_cpu(bo->ents[i].addr);
            uint32_t l = le32_to_cpu(bo->ents[i].length);
            if (!l || ((a | l) & (VT_PAGE - 1)) || a + l < a ||
                ((a + l - 1) & ~TACC_PTE_ADDR_MASK & ~(VT_PAGE - 1))) {
                g_free(bo->ents);
                g_free(bo);
                return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_CREATE entry %u: "
                              "0x%" PRIx64 "+0x%x", i, a, l);
            }
            bo->ents[i].addr = a;
            bo->ents[i].length = l;
            total += l;
        }
        if (total != size) {
            g_free(bo->ents);
            g_free(bo);
            return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_CREATE entries add up to "
                          "0x%" PRIx64 ", size 0x%" PRIx64, total, size);
        }
        bo->nents = n;
        vt->ents_total += n;
    }
    bo->ents_total = &vt->ents_total;
    bo->ctx = ctx;
    bo->size = size;
    do {
        bo->handle = ++vt->next_handle;
    } while (!bo->handle ||
             g_hash_table_contains(vt->bos, GUINT_TO_POINTER(bo->handle)));
    g_hash_table_insert(vt->bos, GUINT_TO_POINTER(bo->handle), bo);
    *value = bo->handle;
    return TACC_VIRTIO_OK;
}

/* The BO @handle, if it exists and belongs to ctx (else *st says why). */
static VtBo *vt_bo_get(VirtIOTacc *vt, uint32_t ctx, uint32_t handle,
                       uint32_t *st)
{
    VtBo *bo = g_hash_table_lookup(vt->bos, GUINT_TO_POINTER(handle));

    if (!vt_ctx(vt, ctx)) {
        *st = vt_bad(TACC_VIRTIO_ERR_NOENT, "no context %u", ctx);
        return NULL;
    }
    if (!bo) {
        *st = vt_bad(TACC_VIRTIO_ERR_NOENT, "no BO %u", handle);
        return NULL;
    }
    if (bo->ctx != ctx) {
        *st = vt_bad(TACC_VIRTIO_ERR_PERM, "context %u names BO %u of "
                     "context %u", ctx, handle, bo->ctx);
        return NULL;
    }
    return bo;
}

static uint32_t vt_bo_destroy(VirtIOTacc *vt, uint32_t ctx, const uint8_t *b,
                              size_t len)
{
    struct tacc_virtio_bo_destroy r;
    uint32_t st;
    VtBo *bo;

    if (len != sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "BO_DESTROY length %zu", len);
    }
    memcpy(&r, b, sizeof(r));
    bo = vt_bo_get(vt, ctx, le32_to_cpu(r.handle), &st);
    if (!bo) {
        return st;
    }
    if (bo->binds || vt->ctx[ctx].inflight) {
        return TACC_VIRTIO_ERR_BUSY;
    }
    vt_bo_free(vt, bo);
    return TACC_VIRTIO_OK;
}

/*
 * The PTE of BO page @off (host BOs: walking the entries on from *ei, which
 * starts at BO offset *base).
 */
static uint64_t vt_bo_pte(VtBo *bo, uint64_t off, uint32_t *ei, uint64_t *base)
{
    if (bo->devmem) {
        return ((bo->dev_off + off) & TACC_PTE_ADDR_MASK) | TACC_PTE_DEVMEM;
    }
    while (off >= *base + bo->ents[*ei].length) {
        *base += bo->ents[*ei].length;
        (*ei)++;
    }
    return (bo->ents[*ei].addr + (off - *base)) & TACC_PTE_ADDR_MASK;
}

/*
 * The 2 MiB leaf for BO bytes [@off, @off + 2 MiB), or 0 if they are not one
 * 2 MiB-aligned run: device memory, or host BO entries that follow each other
 * without a gap.  A Linux guest lists a buffer as the DMA API's segments
 * (64 KiB by default: one IOVA-contiguous buffer becomes 64 KiB pieces), so
 * runs are merged across entries, as tacc.ko's PF driver maps one contiguous
 * range.
 * The device MMU walks these leaves (TACC_CAP_MMU_2M); a 4 MiB copy then takes
 * 2 TLB misses per buffer instead of 1024.
 */
static uint64_t vt_bo_huge_pte(VtBo *bo, uint64_t off, uint32_t *ei,
                               uint64_t *base)
{
    uint64_t a, next, end;

    if (bo->devmem) {
        a = bo->dev_off + off;
        return a & (VT_HUGE - 1) ? 0 : a | TACC_PTE_DEVMEM;
    }
    a = vt_bo_pte(bo, off, ei, base);
    if (a & (VT_HUGE - 1)) {
        return 0;
    }
    /* the run from @off on: entry *ei's rest, then entries that continue it */
    next = bo->ents[*ei].addr + bo->ents[*ei].length;
    end = *base + bo->ents[*ei].length;
    for (uint32_t i = *ei + 1; end < off + VT_HUGE; i++) {
        if (i >= bo->nents || bo->ents[i].addr != next) {
            return 0;
        }
        next += bo->ents[i].length;
        end += bo->ents[i].length;
    }
    return a;
}

/*
 * Frees the table of @va's slot at @level (1: the 4 KiB-leaf table of its
 * 2 MiB, 0: the table of its 1 GiB) if no entry of it is valid any more, and
 * clears the entry that pointed at it: an unbound range leaves no table
 * behind (a later binding there can take a 2 MiB leaf, a walk reads no empty
 * level).
 */
static void vt_pt_prune(VirtIOTacc *vt, VtCtx *c, uint64_t va, int level)
{
    uint64_t *e = level ? vt_pt_entry(vt, c, va, level, false)
                        : &vt->pt[c->root][(va >> 30) & 511];
    uint32_t id;

    if (!e || !(*e & TACC_PTE_VALID) || (*e & TACC_PTE_HUGE)) {
        return;
    }
    id = (*e & TACC_PTE_ADDR_MASK) >> 12;
    for (int i = 0; i < TACC_PT_ENTRIES; i++) {
        if (vt->pt[id][i] & TACC_PTE_VALID) {
            return;
        }
    }
    *e = 0;
    vt_pt_free_tree(vt, id, level + 1);
}

static void vt_unmap(VirtIOTacc *vt, VtCtx *c, uint64_t va, uint64_t size)
{
    for (uint64_t o = 0; o < size; o += VT_PAGE) {
        uint64_t *e1 = vt_pt_entry(vt, c, va + o, 1, false);
        uint64_t *e;

        if (e1 && (*e1 & TACC_PTE_HUGE)) {     /* bound 2 MiB-aligned, whole */
            *e1 = 0;
            o += VT_HUGE - VT_PAGE;
        } else {
            e = vt_pt_slot(vt, c, va + o, false);
            if (e) {
                *e = 0;
            }
        }
        /* last page of a 2 MiB slot, or of the range: drop emptied tables */
        if (!((va + o + VT_PAGE) & (VT_HUGE - 1)) || o + VT_PAGE >= size) {
            vt_pt_prune(vt, c, va + o, 1);
            if (!((va + o + VT_PAGE) & ((1ull << 30) - 1)) ||
                o + VT_PAGE >= size) {
                vt_pt_prune(vt, c, va + o, 0);
            }
        }
    }
}

static uint32_t vt_vm_bind(VirtIOTacc *vt, uint32_t ctx, const uint8_t *b,
                           size_t len)
{
    struct tacc_virtio_vm_bind r;
    VtBind bd = { 0 };
    uint64_t ei_base = 0;
    uint32_t st, ei = 0, flags;
    guint at;
    VtCtx *c;
    VtBo *bo;

    if (len != sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "VM_BIND length %zu", len);
    }
    memcpy(&r, b, sizeof(r));
    bo = vt_bo_get(vt, ctx, le32_to_cpu(r.handle), &st);
    if (!bo) {
        return st;
    }
    c = &vt->ctx[ctx];
    bd.va = le64_to_cpu(r.va);
    bd.offset = le64_to_cpu(r.offset);
    bd.size = le64_to_cpu(r.size);
    flags = le32_to_cpu(r.flags);
    if (!bd.size || ((bd.va | bd.offset | bd.size) & (VT_PAGE - 1)) ||
        (flags & ~TACC_VIRTIO_BIND_READONLY) ||
        bd.va >= (1ull << TACC_VA_BITS) ||
        bd.size > (1ull << TACC_VA_BITS) - bd.va ||
        bd.offset > bo->size || bd.size > bo->size - bd.offset) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "VM_BIND va 0x%" PRIx64 " offset "
                      "0x%" PRIx64 " size 0x%" PRIx64 " flags 0x%x of a "
                      "0x%" PRIx64 "-byte BO", bd.va, bd.offset, bd.size,
                      flags, bo->size);
    }
    at = vt_bind_above(c, bd.va);
    if (vt_bind_at(c, bd.va) ||
        (at < c->binds->len &&
         g_array_index(c->binds, VtBind, at).va < bd.va + bd.size)) {
        return vt_bad(TACC_VIRTIO_ERR_BUSY, "VM_BIND over a bound range");
    }
    bd.bo = bo;
    bd.ro = flags & TACC_VIRTIO_BIND_READONLY;
    for (uint64_t o = 0; o < bd.size; o += VT_PAGE) {
        uint64_t perm = TACC_PTE_VALID | (bd.ro ? 0 : TACC_PTE_WRITE);
        uint64_t *e = NULL, huge = 0;

        if (!((bd.va + o) & (VT_HUGE - 1)) && bd.size - o >= VT_HUGE) {
            huge = vt_bo_huge_pte(bo, bd.offset + o, &ei, &ei_base);
        }
        if (huge) {
            e = vt_pt_entry(vt, c, bd.va + o, 1, true);
            if (e && !(*e & TACC_PTE_VALID)) {
                *e = huge | perm | TACC_PTE_HUGE;
                o += VT_HUGE - VT_PAGE;
                continue;
            }
            /* a table is there already (an earlier binding's): 4 KiB leaves */
        }
        e = vt_pt_slot(vt, c, bd.va + o, true);
        if (!e) {
            /* through the failing page: tables made for it go too */
            vt_unmap(vt, c, bd.va, o + VT_PAGE);
            return vt_bad(TACC_VIRTIO_ERR_NOSPC, "VM_BIND: page tables full");
        }
        *e = vt_bo_pte(bo, bd.offset + o, &ei, &ei_base) | perm;
    }
    bo->binds++;
    g_array_insert_val(c->binds, at, bd);
    tacc_tlb_invalidate(vt->pf, TACC_FN_VIRTIO, ctx);
    return TACC_VIRTIO_OK;
}

static uint32_t vt_vm_unbind(VirtIOTacc *vt, uint32_t ctx, const uint8_t *b,
                             size_t len)
{
    struct tacc_virtio_vm_unbind r;
    VtCtx *c = vt_ctx(vt, ctx);
    uint64_t va, size;

    if (!c) {
        return vt_bad(TACC_VIRTIO_ERR_NOENT, "VM_UNBIND in no context %u", ctx);
    }
    if (len != sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "VM_UNBIND length %zu", len);
    }
    memcpy(&r, b, sizeof(r));
    va = le64_to_cpu(r.va);
    size = le64_to_cpu(r.size);
    {
        VtBind *o = vt_bind_at(c, va);

        if (o && o->va == va && o->size == size) {
            if (c->inflight) {
                return TACC_VIRTIO_ERR_BUSY;
            }
            vt_unmap(vt, c, va, size);
            tacc_tlb_invalidate(vt->pf, TACC_FN_VIRTIO, ctx);
            o->bo->binds--;
            g_array_remove_index(c->binds, vt_bind_above(c, va) - 1);
            return TACC_VIRTIO_OK;
        }
    }
    return vt_bad(TACC_VIRTIO_ERR_NOENT, "VM_UNBIND of no binding 0x%" PRIx64
                  "+0x%" PRIx64, va, size);
}

static uint32_t vt_trace_setup(VirtIOTacc *vt, const uint8_t *b, size_t len)
{
    struct tacc_virtio_trace_setup r;
    TaccFunc *f = &vt->func;
    uint64_t base, wb;
    uint32_t n, v3;

    if (len != sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "TRACE_SETUP length %zu", len);
    }
    memcpy(&r, b, sizeof(r));
    base = le64_to_cpu(r.base);
    wb = le64_to_cpu(r.wb);
    n = le32_to_cpu(r.entries);
    v3 = virtio_vdev_has_feature(VIRTIO_DEVICE(vt), TACC_VIRTIO_F_TRACE_V3) ?
         TACC_VIRTIO_TRACE_V3 : 0;
    if (base && ((base & ((le32_to_cpu(r.enable) & v3) ? 127 : 63)) ||
                 n < 2 || n > (1u << 20) || !is_power_of_2(n) ||
                 (wb & 7) || (le32_to_cpu(r.enable) & ~(1u | v3)) ||
                 le32_to_cpu(r.enable) == TACC_VIRTIO_TRACE_V3)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "TRACE_SETUP base 0x%" PRIx64
                      " entries %u wb 0x%" PRIx64, base, n, wb);
    }
    f->trace_base = base;
    f->trace_size = base ? n : 0;
    f->trace_wb = wb;
    f->trace_ctrl = base ? le32_to_cpu(r.enable) : 0;
    f->trace_prod = f->trace_cons = 0;
    return TACC_VIRTIO_OK;
}

static uint32_t vt_trace_consume(VirtIOTacc *vt, const uint8_t *b, size_t len)
{
    struct tacc_virtio_trace_consume r;
    TaccFunc *f = &vt->func;
    uint32_t cons;

    if (len != sizeof(r)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "TRACE_CONSUME length %zu", len);
    }
    memcpy(&r, b, sizeof(r));
    cons = le32_to_cpu(r.cons);
    if ((uint32_t)(f->trace_prod - cons) > f->trace_size ||
        (uint32_t)(cons - f->trace_cons) > f->trace_size) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "TRACE_CONSUME %u (prod %u)",
                      cons, f->trace_prod);
    }
    f->trace_cons = cons;
    return TACC_VIRTIO_OK;
}

static uint32_t vt_ctrl(VirtIOTacc *vt, const uint8_t *req, size_t len,
                        uint64_t *value)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);
    struct tacc_virtio_hdr h;
    const uint8_t *b = req + sizeof(h);
    size_t blen;
    uint32_t ctx;

    if (len < sizeof(h)) {
        return vt_bad(TACC_VIRTIO_ERR_INVAL, "control request of %zu bytes",
                      len);
    }
    memcpy(&h, req, sizeof(h));
    blen = len - sizeof(h);
    ctx = le32_to_cpu(h.ctx);
    if (h.version != TACC_VIRTIO_MSG_VERSION || h.flags) {
        return vt_bad(TACC_VIRTIO_ERR_VERSION, "message version %u flags 0x%x",
                      h.version, h.flags);
    }
    trace_virtio_tacc_ctrl(le16_to_cpu(h.type), ctx, le64_to_cpu(h.tag));
    switch (le16_to_cpu(h.type)) {
    case TACC_VIRTIO_CTX_CREATE:
        return blen ? vt_bad(TACC_VIRTIO_ERR_INVAL, "CTX_CREATE with a body")
                    : vt_ctx_create(vt, value);
    case TACC_VIRTIO_CTX_DESTROY:
        return blen ? vt_bad(TACC_VIRTIO_ERR_INVAL, "CTX_DESTROY with a body")
                    : vt_ctx_destroy(vt, ctx);
    case TACC_VIRTIO_BO_CREATE:
        return vt_bo_create(vt, ctx, b, blen, value);
    case TACC_VIRTIO_BO_DESTROY:
        return vt_bo_destroy(vt, ctx, b, blen);
    case TACC_VIRTIO_VM_BIND:
        return vt_vm_bind(vt, ctx, b, blen);
    case TACC_VIRTIO_VM_UNBIND:
        return vt_vm_unbind(vt, ctx, b, blen);
    case TACC_VIRTIO_TRACE_SETUP:
    case TACC_VIRTIO_TRACE_CONSUME:
        if (!virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_TRACE)) {
            return vt_bad(TACC_VIRTIO_ERR_UNSUPP, "trace request, F_TRACE off");
        }
        return le16_to_cpu(h.type) == TACC_VIRTIO_TRACE_SETUP
               ? vt_trace_setup(vt, b, blen) : vt_trace_consume(vt, b, blen);
    }
    return vt_bad(TACC_VIRTIO_ERR_UNSUPP, "control type 0x%x",
                  le16_to_cpu(h.type));
}

/* Copy the driver-readable part of @elem (at most @max bytes); NULL if more. */
static uint8_t *vt_elem_read(VirtQueueElement *elem, size_t max, size_t *len)
{
    size_t n = iov_size(elem->out_sg, elem->out_num);
    uint8_t *buf;

    *len = n;
    if (n > max) {
        return NULL;
    }
    buf = g_malloc(n ? n : 1);
    iov_to_buf(elem->out_sg, elem->out_num, 0, buf, n);
    return buf;
}

/*
 * Carries out one control request and answers it; returns false when the
 * answer is held (x-fi-ctrl-delay-ms): @elem is then the device's until
 * vt_ctrl_release() uses it.
 */
static bool vt_handle_ctrl_one(VirtIOTacc *vt, VirtQueue *vq,
                               VirtQueueElement *elem)
{
    struct tacc_virtio_resp resp = { 0 };
    uint64_t value = 0;
    size_t len, in = iov_size(elem->in_sg, elem->in_num);
    g_autofree uint8_t *req = vt_elem_read(elem, VT_MAX_CTRL_LEN, &len);
    uint32_t st, used;

    st = req ? vt_ctrl(vt, req, len, &value)
             : vt_bad(TACC_VIRTIO_ERR_INVAL, "control request of %zu bytes",
                      len);
    resp.status = cpu_to_le32(st);
    resp.value = cpu_to_le64(value);
    if (in < sizeof(resp)) {
        vt_bad(TACC_VIRTIO_ERR_INVAL, "control buffer: %zu writable bytes", in);
        used = 0;
    } else if (vt->fi_ctrl_short >= 0) {    /* a short answer, once */
        used = iov_from_buf(elem->in_sg, elem->in_num, 0, &resp,
                            vt->fi_ctrl_short);
        vt->fi_ctrl_short = -1;
        trace_virtio_tacc_fi_ctrl_short(used);
    } else {
        used = iov_from_buf(elem->in_sg, elem->in_num, 0, &resp, sizeof(resp));
    }
    if (vt->fi_ctrl_delay_ms) {             /* a late answer, once */
        trace_virtio_tacc_fi_ctrl_delay(vt->fi_ctrl_delay_ms);
        vt->ctrl_held = elem;
        vt->ctrl_held_len = used;
        timer_mod(vt->ctrl_timer, qemu_clock_get_ms(QEMU_CLOCK_VIRTUAL) +
                  vt->fi_ctrl_delay_ms);
        vt->fi_ctrl_delay_ms = 0;
        return false;
    }
    virtqueue_push(vq, elem, used);
    return true;
}

/* A reset or unrealize: the held answer is dropped, never used. */
static void vt_ctrl_drop_held(VirtIOTacc *vt)
{
    timer_del(vt->ctrl_timer);
    if (vt->ctrl_held) {
        virtqueue_detach_element(vt->ctrl_vq, vt->ctrl_held, 0);
        g_free(vt->ctrl_held);
        vt->ctrl_held = NULL;
    }
}

/* --------------------------------------------------------- submit ---- */

static void vt_trace_event(VirtIOTacc *vt, uint8_t kind, uint32_t ctx,
                           uint8_t queue, uint32_t job, uint64_t tag,
                           uint16_t index, uint64_t t_fetch_ps,
                           uint64_t t_ps, uint32_t bytes, uint16_t status)
{
    struct tacc_trace_rec r = {
        .opcode = kind,
        .engine = TACC_ENGINE_LOCAL,
        .queue = queue,
        .ctx = cpu_to_le16(ctx),
        .job = cpu_to_le32(job),
        .tag = cpu_to_le64(tag),
        .t_fetch = cpu_to_le64(t_fetch_ps / PS_PER_NS),
        .t_start = cpu_to_le64(t_ps / PS_PER_NS),
        .t_end = cpu_to_le64(t_ps / PS_PER_NS),
        .bytes = cpu_to_le32(bytes),
        .index = cpu_to_le16(index),
        .status = cpu_to_le16(status),
    };

    if (virtio_vdev_has_feature(VIRTIO_DEVICE(vt), TACC_VIRTIO_F_TRACE)) {
        tacc_trace_put(&vt->func, &r);
    }
}

static void vt_batch_finish(VirtIOTacc *vt, VtBatch *bt)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);
    VirtQueueElement *elem = bt->elem;
    struct tacc_virtio_submit_resp resp = {
        .status = cpu_to_le32(bt->status),
        .njobs = cpu_to_le32(bt->status ? 0 : bt->njobs),
        .failed = cpu_to_le32(bt->failed),
    };
    size_t in = iov_size(elem->in_sg, elem->in_num), len = 0;

    if (in >= sizeof(resp)) {
        len = iov_from_buf(elem->in_sg, elem->in_num, 0, &resp, sizeof(resp));
        if (!bt->status && bt->st) {
            len += iov_from_buf(elem->in_sg, elem->in_num, len, bt->st,
                                MIN(in - len, bt->njobs * sizeof(*bt->st)));
        }
    } else {
        vt_bad(TACC_VIRTIO_ERR_INVAL, "submit buffer: %zu writable bytes", in);
    }
    trace_virtio_tacc_batch_done(bt->njobs, bt->failed, bt->status);
    virtqueue_push(vt->submit_vq, elem, len);
    virtio_notify(vdev, vt->submit_vq);
    g_free(elem);
    g_free(bt->st);
    g_free(bt);
}

/* FILL's dst is a VA here: the window offset of one writable devmem binding. */
static bool vt_fill_resolve(VirtIOTacc *vt, VtCtx *c, struct tacc_desc *d)
{
    uint64_t va = le64_to_cpu(d->fill.dst), len = le64_to_cpu(d->fill.len);
    VtBind *b = vt_bind_at(c, va);
    uint64_t in = b ? va - b->va : 0;

    if (!b || len > b->size - in || !b->bo->devmem || b->ro) {
        return false;
    }
    d->fill.dst = cpu_to_le64(b->bo->dev_off + b->offset + in);
    return true;
}

static void vt_job_free(VtJob *j)
{
    g_free(j->cmds);
    g_free(j);
}

/* Check one job at *off of the batch and make it; NULL (and *st) if bad. */
static VtJob *vt_job_parse(VirtIOTacc *vt, const uint8_t *buf, size_t len,
                           size_t *off, uint64_t last[][TACC_VIRTIO_NUM_RINGS],
                           uint32_t *st)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);
    struct tacc_virtio_job jh;
    VtJob *j;
    VtCtx *c;

    if (len - *off < sizeof(jh)) {
        *st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit: job header truncated");
        return NULL;
    }
    memcpy(&jh, buf + *off, sizeof(jh));
    *off += sizeof(jh);
    j = g_new0(VtJob, 1);
    j->ctx = le32_to_cpu(jh.ctx);
    j->ring = le16_to_cpu(jh.ring);
    j->ncmds = le16_to_cpu(jh.ncmds);
    j->seqno = le64_to_cpu(jh.seqno);
    j->tag = le64_to_cpu(jh.tag);
    c = vt_ctx(vt, j->ctx);
    if (!c) {
        *st = vt_bad(TACC_VIRTIO_ERR_NOENT, "submit: no context %u", j->ctx);
        goto bad;
    }
    if (j->ring >= TACC_VIRTIO_NUM_RINGS || !j->ncmds ||
        j->ncmds > TACC_VIRTIO_MAX_JOB_CMDS || jh.rsvd ||
        (len - *off) / TACC_DESC_SIZE < j->ncmds) {
        *st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit: job ring %u, %u commands "
                     "in %zu bytes", j->ring, j->ncmds, len - *off);
        goto bad;
    }
    if (j->seqno <= last[j->ctx][j->ring]) {
        *st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit: seqno %" PRIu64 " after %"
                     PRIu64, j->seqno, last[j->ctx][j->ring]);
        goto bad;
    }
    last[j->ctx][j->ring] = j->seqno;
    j->cmds = g_new(struct tacc_desc, j->ncmds);
    memcpy(j->cmds, buf + *off, (size_t)j->ncmds * TACC_DESC_SIZE);
    *off += (size_t)j->ncmds * TACC_DESC_SIZE;
    for (uint16_t i = 0; i < j->ncmds; i++) {
        struct tacc_desc *d = &j->cmds[i];
        if (d->opcode >= TACC_OP_MAX ||
            (tacc_desc_hw13(d) &&
             !virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_INFER)) ||
            (d->opcode == TACC_OP_FILL &&
             (!virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_FILL) ||
              !vt_fill_resolve(vt, c, d)))) {
            *st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit: command %u opcode %u "
                         "refused", i, d->opcode);
            goto bad;
        }
        d->ctx = cpu_to_le16(j->ctx);
        d->index = cpu_to_le16(i);
        d->flags = i == j->ncmds - 1 ? TACC_DESC_F_LAST : 0;
    }
    return j;
bad:
    vt_job_free(j);
    return NULL;
}

static void vt_feed(VirtIOTacc *vt, int ring, uint64_t t_ps)
{
    TaccFunc *f = &vt->func;
    VtJob *j;

    while ((j = QSIMPLEQ_FIRST(&vt->pending[ring])) &&
           TACC_FIFO_DEPTH - f->q[ring].f_count >= j->ncmds) {
        QSIMPLEQ_REMOVE_HEAD(&vt->pending[ring], next);
        vt->pending_cmds -= j->ncmds;
        for (uint16_t i = 0; i < j->ncmds; i++) {
            tacc_fifo_push(f, ring, &j->cmds[i], t_ps);
        }
        QSIMPLEQ_INSERT_TAIL(&vt->inflight[ring], j, next);
        vt_trace_event(vt, TACC_TRACE_EV_VIRTIO_DISPATCH, j->ctx, ring,
                       j->devjob, j->tag, j->ncmds, j->kick_ps, t_ps, 0, 0);
        trace_virtio_tacc_dispatch(j->ctx, ring, j->seqno, j->devjob);
    }
    if (vt->pending_cmds < VT_PENDING_CMDS_MAX && !vt->resetting &&
        !virtio_queue_empty(vt->submit_vq)) {
        qemu_bh_schedule(vt->submit_bh);        /* room: take more buffers */
    }
}

static void vt_submit_one(VirtIOTacc *vt, VirtQueueElement *elem, uint64_t now)
{
    uint64_t last[TACC_NUM_CONTEXTS][TACC_VIRTIO_NUM_RINGS];
    struct tacc_virtio_submit sh;
    VtBatch *bt = g_new0(VtBatch, 1);
    VtJob **jobs = NULL;
    size_t len, off = sizeof(sh);
    g_autofree uint8_t *buf = vt_elem_read(elem, VT_MAX_SUBMIT_LEN, &len);
    uint32_t st = TACC_VIRTIO_OK, n = 0;

    bt->elem = elem;
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        memcpy(last[c], vt->ctx[c].last_seqno, sizeof(last[c]));
    }
    if (!buf || len < sizeof(sh)) {
        st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit buffer of %zu bytes", len);
        goto refuse;
    }
    memcpy(&sh, buf, sizeof(sh));
    bt->njobs = le32_to_cpu(sh.njobs);
    if (sh.hdr.version != TACC_VIRTIO_MSG_VERSION || sh.hdr.flags) {
        st = vt_bad(TACC_VIRTIO_ERR_VERSION, "submit version %u",
                    sh.hdr.version);
        goto refuse;
    }
    if (le16_to_cpu(sh.hdr.type) != TACC_VIRTIO_SUBMIT || !bt->njobs ||
        bt->njobs > TACC_VIRTIO_MAX_BATCH_JOBS || sh.rsvd) {
        st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit type 0x%x, %u jobs",
                    le16_to_cpu(sh.hdr.type), bt->njobs);
        goto refuse;
    }
    jobs = g_new0(VtJob *, bt->njobs);
    for (n = 0; n < bt->njobs; n++) {
        jobs[n] = vt_job_parse(vt, buf, len, &off, last, &st);
        if (!jobs[n]) {
            goto refuse;
        }
    }
    if (off != len) {
        st = vt_bad(TACC_VIRTIO_ERR_INVAL, "submit: %zu trailing bytes",
                    len - off);
        goto refuse;
    }
    vt_trace_event(vt, TACC_TRACE_EV_VIRTIO_KICK, jobs[0]->ctx, 0xff,
                   bt->njobs, jobs[0]->tag, 0, now, now, len, 0);
    bt->st = g_new0(struct tacc_virtio_job_status, bt->njobs);
    for (n = 0; n < bt->njobs; n++) {
        VtJob *j = jobs[n];
        j->batch = bt;
        j->idx = n;
        j->kick_ps = now;
        j->devjob = vt->next_job++;
        for (uint16_t i = 0; i < j->ncmds; i++) {
            j->cmds[i].job = cpu_to_le32(j->devjob);
        }
        bt->st[n].seqno = cpu_to_le64(j->seqno);
        vt->ctx[j->ctx].inflight++;
        vt->ctx[j->ctx].last_seqno[j->ring] = j->seqno;
        vt->pending_cmds += j->ncmds;
        QSIMPLEQ_INSERT_TAIL(&vt->pending[j->ring], j, next);
    }
    trace_virtio_tacc_submit(bt->njobs, len);
    g_free(jobs);
    return;

refuse:
    vt_trace_event(vt, TACC_TRACE_EV_VIRTIO_KICK, 0, 0xff, 0, 0, 0, now, now,
                   MIN(len, UINT32_MAX), st);
    for (uint32_t i = 0; jobs && i < n; i++) {
        vt_job_free(jobs[i]);
    }
    g_free(jobs);
    bt->status = st;
    vt_batch_finish(vt, bt);
}

/* A job ended (hardware completion, or its queue was reset: ABORTED). */
static void vt_job_done(VirtIOTacc *vt, VtJob *j, uint16_t status,
                        uint16_t index)
{
    VtBatch *bt = j->batch;

    vt_fence_write(vt, j->ctx, j->ring, j->seqno, status,
                   status != TACC_ST_OK);
    trace_virtio_tacc_job_done(j->ctx, j->ring, j->seqno, status);
    bt->st[j->idx].status = cpu_to_le16(status);
    bt->st[j->idx].index = cpu_to_le16(index);
    bt->failed += status != TACC_ST_OK;
    vt->ctx[j->ctx].inflight--;
    vt_job_free(j);
    if (++bt->done == bt->njobs) {
        vt_batch_finish(vt, bt);
    }
}

/* -------------------------------------------------- TaccFuncOps ---- */

static AddressSpace *vt_dma_as(TaccFunc *f)
{
    return VIRTIO_DEVICE(vt_of(f))->dma_as;
}

static bool vt_active(TaccFunc *f)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt_of(f));

    return (vdev->status & VIRTIO_CONFIG_S_DRIVER_OK) && !vdev->broken &&
           !vt_of(f)->resetting;
}

static void vt_notify(TaccFunc *f, unsigned vector)
{
    /* error causes: the function has no error vector; jobs carry status */
}

static void vt_fetch(TaccFunc *f, int q, uint64_t t_ps)
{
    vt_feed(vt_of(f), q, t_ps);
}

static void vt_complete(TaccFunc *f, int q, const struct tacc_cqe *cqe)
{
    VirtIOTacc *vt = vt_of(f);
    VtJob *j = QSIMPLEQ_FIRST(&vt->inflight[q]);

    if (vt->resetting) {
        return;                 /* the reset drops the job with its buffer */
    }
    if (!j || j->devjob != le32_to_cpu(cqe->job)) {
        /* cannot happen: a queue completes its jobs in order */
        qemu_log_mask(LOG_GUEST_ERROR, "virtio-tacc: ring %d completion of "
                      "unknown job %u\n", q, le32_to_cpu(cqe->job));
        return;
    }
    QSIMPLEQ_REMOVE_HEAD(&vt->inflight[q], next);
    vt_job_done(vt, j, le16_to_cpu(cqe->status), 0);
}

static void vt_queue_reset(TaccFunc *f, int q)
{
    VirtIOTacc *vt = vt_of(f);
    VtJob *j;

    if (vt->resetting) {
        return;
    }
    while ((j = QSIMPLEQ_FIRST(&vt->inflight[q]))) {
        QSIMPLEQ_REMOVE_HEAD(&vt->inflight[q], next);
        vt_job_done(vt, j, TACC_ST_ABORTED, 0);
    }
}

/* Its DMA's requester ID: the virtio-pci proxy's BDF (what an IOMMU sees). */
static uint16_t vt_requester_id(TaccFunc *f)
{
    BusState *bus = qdev_get_parent_bus(DEVICE(vt_of(f)));
    Object *proxy = bus && bus->parent ? OBJECT(bus->parent) : NULL;

    if (!proxy || !object_dynamic_cast(proxy, TYPE_PCI_DEVICE)) {
        return 0;
    }
    return pci_requester_id(PCI_DEVICE(proxy));
}

static const TaccFuncOps vt_ops = {
    .dma_as = vt_dma_as,
    .active = vt_active,
    .notify = vt_notify,
    .fetch = vt_fetch,
    .complete = vt_complete,
    .pt_read = vt_pt_read,
    .queue_reset = vt_queue_reset,
    .requester_id = vt_requester_id,
};

/* --------------------------------------------------------- virtio ---- */

/*
 * The guest memory a request's element was read from crossed the PF's link
 * (the function's DMA shares it): its out buffers (the message and, with
 * them, the ring's descriptor reads) are control traffic of this function
 * (tacc_link_ctrl), so they wake a link in L0s/L1 and pay its exit latency,
 * as the PF's descriptor fetch does.  Returns when the request is in.
 */
static uint64_t vt_elem_link(VirtIOTacc *vt, VirtQueueElement *elem,
                             uint64_t now)
{
    TaccState *s = vt->pf;
    uint64_t t_up = now;

    for (unsigned i = 0; i < elem->out_num; i++) {
        t_up = MAX(t_up, tacc_link_ctrl(&vt->func, false, elem->out_addr[i],
                                        elem->out_sg[i].iov_len));
    }
    if (t_up > now && (!s->lpm_fetch_ps || t_up < s->lpm_fetch_ps)) {
        s->lpm_fetch_ps = t_up;         /* the scheduler's event then */
    }
    return t_up;
}

static void vt_handle_ctrl(VirtIODevice *vdev, VirtQueue *vq)
{
    VirtIOTacc *vt = VIRTIO_TACC(vdev);
    VirtQueueElement *elem;

    /* in order: nothing behind a held answer (x-fi-ctrl-delay-ms) */
    if (vt->detached || vt->ctrl_held ||
        !tacc_enter(vt->pf, &vt->func, "virtio control kick")) {
        return;
    }
    while ((elem = virtqueue_pop(vq, sizeof(VirtQueueElement)))) {
        vt_elem_link(vt, elem, tacc_now_ps(vt->pf));
        if (!vt_handle_ctrl_one(vt, vq, elem)) {
            break;
        }
        g_free(elem);
    }
    virtio_notify(vdev, vq);
    tacc_leave(vt->pf);
}

/* x-fi-ctrl-delay-ms elapsed: the held answer is used, then the rest. */
static void vt_ctrl_release(void *opaque)
{
    VirtIOTacc *vt = opaque;
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);

    if (!vt->ctrl_held) {
        return;
    }
    virtqueue_push(vt->ctrl_vq, vt->ctrl_held, vt->ctrl_held_len);
    g_free(vt->ctrl_held);
    vt->ctrl_held = NULL;
    virtio_notify(vdev, vt->ctrl_vq);
    vt_handle_ctrl(vdev, vt->ctrl_vq);
}

static void vt_handle_submit(VirtIODevice *vdev, VirtQueue *vq)
{
    VirtIOTacc *vt = VIRTIO_TACC(vdev);
    VirtQueueElement *elem;
    uint64_t now, t_up;

    if (vt->detached ||
        !tacc_enter(vt->pf, &vt->func, "virtio submit kick")) {
        return;
    }
    now = tacc_now_ps(vt->pf);
    t_up = now;
    trace_virtio_tacc_kick(now / PS_PER_NS);
    while (vt->pending_cmds < VT_PENDING_CMDS_MAX &&
           (elem = virtqueue_pop(vq, sizeof(VirtQueueElement)))) {
        /* its commands are ready once the request crossed the link */
        t_up = MAX(t_up, vt_elem_link(vt, elem, now));
        vt_submit_one(vt, elem, now);
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        vt_feed(vt, r, t_up);
    }
    tacc_sched_poll(vt->pf);
    tacc_leave(vt->pf);
}

static void vt_submit_bh(void *opaque)
{
    VirtIOTacc *vt = opaque;

    vt_handle_submit(VIRTIO_DEVICE(vt), vt->submit_vq);
}

static void vt_drop_jobs(VirtIOTacc *vt, VtJobList *list)
{
    VtJob *j;

    while ((j = QSIMPLEQ_FIRST(list))) {
        QSIMPLEQ_REMOVE_HEAD(list, next);
        if (j->batch && ++j->batch->done == j->batch->njobs) {
            /* the buffer is not used: its guest memory mappings go */
            virtqueue_detach_element(vt->submit_vq, j->batch->elem, 0);
            g_free(j->batch->elem);
            g_free(j->batch->st);
            g_free(j->batch);
        }
        vt_job_free(j);
    }
}

/* Everything back to the state after realize (the tacc device entered). */
static void vt_reset_locked(VirtIOTacc *vt)
{
    TaccFunc *f = &vt->func;

    trace_virtio_tacc_reset();
    vt->resetting = true;
    tacc_func_reset(f);
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        vt_drop_jobs(vt, &vt->inflight[r]);
        vt_drop_jobs(vt, &vt->pending[r]);
    }
    vt->pending_cmds = 0;
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        if (vt->ctx[c].used) {
            vt_ctx_free(vt, c);
        }
    }
    g_hash_table_remove_all(vt->bos);
    memset(vt->fences, 0, TACC_VIRTIO_SHM_FENCES_SIZE);
    f->ctrl = TACC_CTRL_ENABLE;
    for (int q = 0; q < TACC_NUM_QUEUES; q++) {
        f->q[q].ctrl = TACC_Q_CTRL_ENABLE;
    }
    vt->resetting = false;
}

static void vt_reset_bh(void *opaque)
{
    VirtIOTacc *vt = opaque;

    if (vt->detached) {
        return;                 /* nothing left: vt_detach emptied it */
    }
    if (!tacc_enter(vt->pf, &vt->func, "virtio reset")) {
        qemu_bh_schedule(vt->reset_bh);
        return;
    }
    vt_reset_locked(vt);
    tacc_sched_poll(vt->pf);
    tacc_leave(vt->pf);
}

static void vt_reset(VirtIODevice *vdev)
{
    VirtIOTacc *vt = VIRTIO_TACC(vdev);

    /* before the core resets the queues: a held answer is not used */
    vt_ctrl_drop_held(vt);
    /* inside a device run (its own DMA reset it): stop now, clean up soon */
    vt->resetting = true;
    vt_reset_bh(vt);
}

static uint64_t vt_get_features(VirtIODevice *vdev, uint64_t features,
                                Error **errp)
{
    return features | VIRTIO_TACC(vdev)->features;
}

static int vt_validate_features(VirtIODevice *vdev)
{
    if (VIRTIO_TACC(vdev)->detached) {
        return -ENODEV;         /* its PF is gone: no driver gets it again */
    }
    return virtio_vdev_has_feature(vdev, VIRTIO_F_VERSION_1) ? 0 : -EINVAL;
}

/*
 * QEMU validates features only for VERSION_1 drivers: a driver without it
 * gets a broken device (no buffer is used) until it resets it.
 */
static void vt_set_status(VirtIODevice *vdev, uint8_t val)
{
    if ((val & VIRTIO_CONFIG_S_DRIVER_OK) && VIRTIO_TACC(vdev)->detached) {
        virtio_error(vdev, "virtio-tacc: its tacc PF was removed");
        return;
    }
    if ((val & VIRTIO_CONFIG_S_FEATURES_OK) &&
        !virtio_vdev_has_feature(vdev, VIRTIO_F_VERSION_1)) {
        virtio_error(vdev, "virtio-tacc: the driver did not accept "
                     "VIRTIO_F_VERSION_1");
    }
}

static void vt_get_config(VirtIODevice *vdev, uint8_t *config)
{
    VirtIOTacc *vt = VIRTIO_TACC(vdev);
    uint64_t base, size;
    struct tacc_virtio_config c;

    if (vt->detached) {
        base = size = 0;
    } else {
        tacc_window(&vt->func, &base, &size);
    }
    c.version = cpu_to_le32(TACC_VIRTIO_VERSION_MAJOR << 16 |
                            TACC_VIRTIO_VERSION_MINOR);
    c.caps = cpu_to_le32(TACC_CAP_MMU_2M | TACC_CAP_TRACE |
                         TACC_CAP_TLB_INV_DONE |
                         (virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_FILL)
                          ? TACC_CAP_FILL : 0) |
                         (virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_INFER)
                          ? (TACC_CAP_HW13 | TACC_CAP_HW15) & ~TACC_CAP_TRACE_V3
                          : 0) |
                         (virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_TRACE_V3)
                          ? TACC_CAP_TRACE_V3 : 0));
    c.func = cpu_to_le32(TACC_FN_VIRTIO);
    c.num_contexts = cpu_to_le32(TACC_NUM_CONTEXTS);
    c.num_rings = cpu_to_le32(TACC_VIRTIO_NUM_RINGS);
    c.max_job_cmds = cpu_to_le32(TACC_VIRTIO_MAX_JOB_CMDS);
    c.devmem_size = cpu_to_le64(size);
    c.page_entries = cpu_to_le32(vt->fi_page_entries);
    c.rsvd = 0;
    memcpy(config, &c, sizeof(c));
}

/*
 * The PF is being removed (its unrealize): drop everything that refers to
 * it now, while it still works, and never touch it again.  The device is
 * broken (DEVICE_NEEDS_RESET) from now on; a reset does not revive it.
 */
static void vt_detach_pf(VirtIOTacc *vt, bool broken)
{
    TaccFunc *f = &vt->func;
    TaccState *s = vt->pf;

    vt_reset_locked(vt);
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        if (s->unit[i].busy && s->unit[i].fn == TACC_FN_VIRTIO) {
            s->unit[i].busy = false;
        }
    }
    timer_del(&f->sample_timer);
    qemu_bh_cancel(vt->reset_bh);
    qemu_bh_cancel(vt->submit_bh);
    memory_region_set_enabled(&vt->counters_mr, false);
    qdev_del_unplug_blocker(DEVICE(s), vt->unplug_blocker);
    s->virtio = NULL;
    s->virtio_window_busy = NULL;
    s->virtio_detach = NULL;
    vt->detached = true;
    if (broken) {
        virtio_error(VIRTIO_DEVICE(vt), "virtio-tacc: its tacc PF was removed");
    }
}

static void vt_detach(TaccFunc *f)
{
    vt_detach_pf(vt_of(f), true);
}

static void vt_realize(DeviceState *dev, Error **errp)
{
    ERRP_GUARD();
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VirtIOTacc *vt = VIRTIO_TACC(dev);
    TaccState *s = vt->pf;
    TaccFunc *f = &vt->func;

    if (!s) {
        error_setg(errp, "virtio-tacc: tacc=<id of a tacc PF> is required");
        return;
    }
    if (s->virtio) {
        error_setg(errp, "virtio-tacc: the tacc PF already has a virtio "
                   "function");
        return;
    }
    if ((vt->devmem_base | vt->devmem_size) & (VT_PAGE - 1) ||
        vt->devmem_base > s->devmem_size ||
        vt->devmem_size > s->devmem_size - vt->devmem_base) {
        error_setg(errp, "virtio-tacc: devmem-base/devmem-size must be 4 KiB "
                   "aligned and inside the PF's %" PRIu64 " bytes",
                   s->devmem_size);
        return;
    }
    memory_region_init_rom(&vt->fences_mr, OBJECT(vt), "virtio-tacc-fences",
                           TACC_VIRTIO_SHM_FENCES_SIZE, errp);
    if (*errp) {
        return;
    }
    vt->fences = memory_region_get_ram_ptr(&vt->fences_mr);
    memory_region_init_io(&vt->counters_mr, OBJECT(vt), &tacc_bar2_ops, f,
                          "virtio-tacc-counters",
                          TACC_VIRTIO_SHM_COUNTERS_SIZE);

    virtio_init(vdev, TACC_VIRTIO_ID, sizeof(struct tacc_virtio_config));
    vt->ctrl_vq = virtio_add_queue(vdev, TACC_VIRTIO_VQ_SIZE, vt_handle_ctrl);
    vt->ctrl_timer = timer_new_ms(QEMU_CLOCK_VIRTUAL, vt_ctrl_release, vt);
    vt->submit_vq = virtio_add_queue(vdev, TACC_VIRTIO_VQ_SIZE,
                                     vt_handle_submit);
    vt->bos = g_hash_table_new_full(NULL, NULL, NULL, vt_bo_destroy_cb);
    vt->pt = g_new0(uint64_t *, TACC_VIRTIO_MAX_PT_PAGES + 1);
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        QSIMPLEQ_INIT(&vt->pending[r]);
        QSIMPLEQ_INIT(&vt->inflight[r]);
    }
    vt->reset_bh = qemu_bh_new_guarded(vt_reset_bh, vt,
                                       &DEVICE(vt)->mem_reentrancy_guard);
    vt->submit_bh = qemu_bh_new_guarded(vt_submit_bh, vt,
                                        &DEVICE(vt)->mem_reentrancy_guard);

    f->pf = s;
    f->fn = TACC_FN_VIRTIO;
    f->ops = &vt_ops;
    timer_init_ns(&f->sample_timer, QEMU_CLOCK_VIRTUAL, tacc_sample_timer, f);
    s->virtio_mem_reset[0] = s->virtio_mem_base = vt->devmem_base;
    s->virtio_mem_reset[1] = s->virtio_mem_size = vt->devmem_size;
    s->virtio_window_busy = vt_window_busy;
    s->virtio_detach = vt_detach;
    s->virtio = f;
    error_setg(&vt->unplug_blocker, "tacc: the PF is linked by a "
               "virtio-tacc-pci (device_del that one first)");
    qdev_add_unplug_blocker(DEVICE(s), vt->unplug_blocker);
    vt_reset_locked(vt);
}

static void vt_mig_free(VirtIOTacc *vt);

static void vt_unrealize(DeviceState *dev)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VirtIOTacc *vt = VIRTIO_TACC(dev);

    if (!vt->detached) {
        vt_detach_pf(vt, false);
    }
    vt_ctrl_drop_held(vt);
    vt_mig_free(vt);
    timer_free(vt->ctrl_timer);
    error_free(vt->unplug_blocker);
    vt->unplug_blocker = NULL;
    qemu_bh_delete(vt->reset_bh);
    qemu_bh_delete(vt->submit_bh);
    g_hash_table_destroy(vt->bos);
    g_free(vt->pt);
    virtio_delete_queue(vt->ctrl_vq);
    virtio_delete_queue(vt->submit_vq);
    virtio_cleanup(vdev);
}

static const Property vt_properties[] = {
    DEFINE_PROP_LINK("tacc", VirtIOTacc, pf, TYPE_TACC, TaccState *),
    DEFINE_PROP_UINT64("devmem-base", VirtIOTacc, devmem_base, 0),
    DEFINE_PROP_UINT64("devmem-size", VirtIOTacc, devmem_size, 0),
    DEFINE_PROP_BIT64("devmem", VirtIOTacc, features, TACC_VIRTIO_F_DEVMEM,
                      true),
    DEFINE_PROP_BIT64("fill", VirtIOTacc, features, TACC_VIRTIO_F_FILL, true),
    DEFINE_PROP_BIT64("trace", VirtIOTacc, features, TACC_VIRTIO_F_TRACE,
                      true),
    DEFINE_PROP_BIT64("infer", VirtIOTacc, features, TACC_VIRTIO_F_INFER,
                      true),
    DEFINE_PROP_BIT64("trace-v3", VirtIOTacc, features,
                      TACC_VIRTIO_F_TRACE_V3, true),
};

/* ------------------------------------------------------ migration ---- */

/*
 * The backend's state (docs/hardware.md "Migration"): the function's registers
 * and queues (tacc_vmstate_func_regs), contexts with their bindings, BOs and
 * the page-table pages; and, in the subsection "virtio-tacc-backend/jobs"
 * (only while any is held), the submit buffers whose jobs are queued or in
 * flight with those jobs.  The fence slots are a RAM block
 * (memory_region_init_rom) and move with guest RAM.
 *
 * A held buffer is saved in the backend's own format, not with QEMU's
 * qemu_put_virtqueue_element(): the loader of that one asserts on a bad
 * element count and exits on an address it cannot map.  Here every field of
 * a loaded buffer is checked against the submit queue (its head within the
 * ring, one buffer per head, as many as the ring has in use) and against the
 * descriptor chain the guest left at that head (the addresses and lengths,
 * read and written parts, must be the chain's, in order) before it is mapped;
 * anything else fails the load with a message.  The ring is set up only at
 * the end of QEMU's virtio load, so the subsection is parsed into a VtMig
 * first and checked and adopted in vt_virtio_post_load().
 */

/* A held submit buffer of a stream being loaded. */
typedef struct VtMigElem {
    uint32_t head, out_num, in_num;
    uint64_t *addr;             /* out parts, then in parts */
    uint64_t *len;
} VtMigElem;

struct VtMig {
    uint32_t nbatches;
    VtMigElem *el;
    VtBatch **bt;               /* their elem is NULL until adopted */
    uint32_t *listed;           /* jobs of each batch in the lists below */
    VtJobList inflight[TACC_VIRTIO_NUM_RINGS];
    VtJobList pending[TACC_VIRTIO_NUM_RINGS];
};

static void vt_mig_free(VirtIOTacc *vt)
{
    VtMig *m = vt->mig;
    VtJob *j;

    if (!m) {
        return;
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        while ((j = QSIMPLEQ_FIRST(&m->inflight[r]))) {
            QSIMPLEQ_REMOVE_HEAD(&m->inflight[r], next);
            vt_job_free(j);
        }
        while ((j = QSIMPLEQ_FIRST(&m->pending[r]))) {
            QSIMPLEQ_REMOVE_HEAD(&m->pending[r], next);
            vt_job_free(j);
        }
    }
    for (uint32_t i = 0; i < m->nbatches; i++) {
        g_free(m->el[i].addr);
        g_free(m->el[i].len);
        if (m->bt[i]) {
            assert(!m->bt[i]->elem);
            g_free(m->bt[i]->st);
            g_free(m->bt[i]);
        }
    }
    g_free(m->el);
    g_free(m->bt);
    g_free(m->listed);
    g_free(m);
    vt->mig = NULL;
}

static bool vt_jobs_held(VirtIOTacc *vt)
{
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        if (!QSIMPLEQ_EMPTY(&vt->pending[r]) ||
            !QSIMPLEQ_EMPTY(&vt->inflight[r])) {
            return true;
        }
    }
    return false;
}

static int vt_pre_save(void *opaque)
{
    VirtIOTacc *vt = opaque;
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);

    if (vt->detached) {
        error_report("virtio-tacc: migration: its tacc PF was removed");
        return -EINVAL;
    }
    if (vt->ctrl_held) {
        error_report("virtio-tacc: migration: a control answer is held "
                     "(x-fi-ctrl-delay-ms): migrate when it is used");
        return -EBUSY;
    }
    if (vt->resetting) {
        error_report("virtio-tacc: migration: a reset is in progress: migrate "
                     "when it is done");
        return -EBUSY;
    }
    if (vt_jobs_held(vt) &&
        (virtio_vdev_has_feature(vdev, VIRTIO_F_RING_PACKED) ||
         virtio_vdev_has_feature(vdev, VIRTIO_F_IN_ORDER))) {
        error_report("virtio-tacc: migration: jobs queued or in flight on a "
                     "packed or in-order virtqueue: migrate when its submit "
                     "buffers are used");
        return -EBUSY;
    }
    return 0;
}

/* ---------------------------------------------- held buffers and jobs -- */

/* A job's record; a queued job (not yet in the FIFO) adds its commands. */
static void vt_job_put(QEMUFile *f, VtJob *j, uint32_t batch, bool cmds)
{
    qemu_put_be32(f, batch);
    qemu_put_be32(f, j->idx);
    qemu_put_be32(f, j->ctx);
    qemu_put_be16(f, j->ncmds);
    qemu_put_be64(f, j->seqno);
    qemu_put_be64(f, j->tag);
    qemu_put_be32(f, j->devjob);
    qemu_put_be64(f, j->kick_ps);
    if (cmds) {     /* as the FIFO holds them (little-endian) */
        qemu_put_buffer(f, (uint8_t *)j->cmds,
                        (size_t)j->ncmds * TACC_DESC_SIZE);
    }
}

/*
 * Held buffers: their number, then each one's head, parts (address and
 * length; read parts first) and batch (jobs, done, failed, each job's status
 * slot); then per ring its jobs in flight (commands in the FIFO), then its
 * queued jobs with their commands.
 */
static int vt_jobs_put(QEMUFile *f, void *pv, size_t size,
                       const VMStateField *field, JSONWriter *vmdesc)
{
    VirtIOTacc *vt = pv;
    g_autoptr(GHashTable) ord = g_hash_table_new(NULL, NULL);
    g_autoptr(GPtrArray) bts = g_ptr_array_new();
    VtJob *j;

    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        VtJobList *lists[2] = { &vt->inflight[r], &vt->pending[r] };

        for (int l = 0; l < 2; l++) {
            QSIMPLEQ_FOREACH(j, lists[l], next) {
                if (!g_hash_table_contains(ord, j->batch)) {
                    g_hash_table_insert(ord, j->batch,
                                        GUINT_TO_POINTER(bts->len));
                    g_ptr_array_add(bts, j->batch);
                }
            }
        }
    }
    qemu_put_be32(f, bts->len);
    for (guint i = 0; i < bts->len; i++) {
        VtBatch *bt = g_ptr_array_index(bts, i);
        VirtQueueElement *e = bt->elem;

        qemu_put_be32(f, e->index);
        qemu_put_be32(f, e->out_num);
        qemu_put_be32(f, e->in_num);
        for (unsigned k = 0; k < e->out_num; k++) {
            qemu_put_be64(f, e->out_addr[k]);
            qemu_put_be64(f, e->out_sg[k].iov_len);
        }
        for (unsigned k = 0; k < e->in_num; k++) {
            qemu_put_be64(f, e->in_addr[k]);
            qemu_put_be64(f, e->in_sg[k].iov_len);
        }
        qemu_put_be32(f, bt->njobs);
        qemu_put_be32(f, bt->done);
        qemu_put_be32(f, bt->failed);
        for (uint32_t k = 0; k < bt->njobs; k++) {
            qemu_put_be64(f, le64_to_cpu(bt->st[k].seqno));
            qemu_put_be16(f, le16_to_cpu(bt->st[k].status));
            qemu_put_be16(f, le16_to_cpu(bt->st[k].index));
        }
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        VtJobList *lists[2] = { &vt->inflight[r], &vt->pending[r] };

        for (int l = 0; l < 2; l++) {
            uint32_t n = 0;

            QSIMPLEQ_FOREACH(j, lists[l], next) {
                n++;
            }
            qemu_put_be32(f, n);
            QSIMPLEQ_FOREACH(j, lists[l], next) {
                vt_job_put(f, j, GPOINTER_TO_UINT(g_hash_table_lookup(
                               ord, j->batch)), l == 1);
            }
        }
    }
    return 0;
}

#define VT_MIG_BAD(...) do {                                        \
        error_report("virtio-tacc: migration: " __VA_ARGS__);       \
        goto bad;                                                   \
    } while (0)

/* Commands queued jobs may hold, all rings together (vt_handle_submit). */
#define VT_MIG_MAX_PENDING_CMDS (VT_PENDING_CMDS_MAX + \
                                 TACC_VIRTIO_MAX_BATCH_JOBS * \
                                 TACC_VIRTIO_MAX_JOB_CMDS)

/* One job's record into a new VtJob; NULL (with a message) if out of range. */
static VtJob *vt_job_get(QEMUFile *f, VtMig *m, int ring, bool cmds,
                         uint32_t *pending_cmds)
{
    VtJob *j = g_new0(VtJob, 1);
    uint32_t batch = qemu_get_be32(f);

    j->idx = qemu_get_be32(f);
    j->ctx = qemu_get_be32(f);
    j->ncmds = qemu_get_be16(f);
    j->seqno = qemu_get_be64(f);
    j->tag = qemu_get_be64(f);
    j->devjob = qemu_get_be32(f);
    j->kick_ps = qemu_get_be64(f);
    j->ring = ring;
    if (qemu_file_get_error(f)) {
        goto bad;
    }
    if (batch >= m->nbatches || j->idx >= m->bt[batch]->njobs ||
        j->ctx >= TACC_NUM_CONTEXTS || !j->ncmds ||
        j->ncmds > TACC_VIRTIO_MAX_JOB_CMDS ||
        (cmds && j->ncmds > VT_MIG_MAX_PENDING_CMDS - *pending_cmds)) {
        VT_MIG_BAD("ring %d: job of buffer %u, index %u, context %u, %u "
                   "commands", ring, batch, j->idx, j->ctx, j->ncmds);
    }
    j->batch = m->bt[batch];
    m->listed[batch]++;
    if (cmds) {
        *pending_cmds += j->ncmds;
        j->cmds = g_new(struct tacc_desc, j->ncmds);
        qemu_get_buffer(f, (uint8_t *)j->cmds,
                        (size_t)j->ncmds * TACC_DESC_SIZE);
        if (qemu_file_get_error(f)) {
            goto bad;
        }
    }
    return j;

bad:
    vt_job_free(j);
    return NULL;
}

static int vt_jobs_get(QEMUFile *f, void *pv, size_t size,
                       const VMStateField *field)
{
    VirtIOTacc *vt = pv;
    VtMig *m;
    uint32_t pending_cmds = 0, nbatches;

    vt_mig_free(vt);
    m = vt->mig = g_new0(VtMig, 1);
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        QSIMPLEQ_INIT(&m->inflight[r]);
        QSIMPLEQ_INIT(&m->pending[r]);
    }
    nbatches = qemu_get_be32(f);
    if (qemu_file_get_error(f)) {
        goto bad;
    }
    if (!nbatches || nbatches > TACC_VIRTIO_VQ_SIZE) {
        VT_MIG_BAD("%u held submit buffers", nbatches);
    }
    m->nbatches = nbatches;
    m->el = g_new0(VtMigElem, m->nbatches);
    m->bt = g_new0(VtBatch *, m->nbatches);
    m->listed = g_new0(uint32_t, m->nbatches);
    for (uint32_t i = 0; i < m->nbatches; i++) {
        VtMigElem *e = &m->el[i];
        VtBatch *bt;
        uint32_t parts;
        uint64_t out_bytes = 0;

        e->head = qemu_get_be32(f);
        e->out_num = qemu_get_be32(f);
        e->in_num = qemu_get_be32(f);
        if (qemu_file_get_error(f)) {
            goto bad;
        }
        if (!e->out_num || e->out_num > VIRTQUEUE_MAX_SIZE ||
            e->in_num > VIRTQUEUE_MAX_SIZE - e->out_num) {
            VT_MIG_BAD("submit buffer %u: %u read and %u written parts", i,
                       e->out_num, e->in_num);
        }
        parts = e->out_num + e->in_num;
        e->addr = g_new(uint64_t, parts);
        e->len = g_new(uint64_t, parts);
        for (uint32_t k = 0; k < parts; k++) {
            e->addr[k] = qemu_get_be64(f);
            e->len[k] = qemu_get_be64(f);
            if (qemu_file_get_error(f)) {
                goto bad;
            }
            if (!e->len[k] || e->len[k] > UINT32_MAX ||
                e->addr[k] + e->len[k] < e->addr[k]) {
                VT_MIG_BAD("submit buffer %u: part %u of 0x%" PRIx64
                           " bytes at 0x%" PRIx64, i, k, e->len[k],
                           e->addr[k]);
            }
            if (k < e->out_num) {
                out_bytes += e->len[k];
            }
        }
        if (out_bytes > VT_MAX_SUBMIT_LEN) {
            VT_MIG_BAD("submit buffer %u of %" PRIu64 " bytes", i, out_bytes);
        }
        bt = m->bt[i] = g_new0(VtBatch, 1);
        bt->njobs = qemu_get_be32(f);
        bt->done = qemu_get_be32(f);
        bt->failed = qemu_get_be32(f);
        if (qemu_file_get_error(f)) {
            goto bad;
        }
        if (!bt->njobs || bt->njobs > TACC_VIRTIO_MAX_BATCH_JOBS ||
            bt->done >= bt->njobs || bt->failed > bt->done) {
            VT_MIG_BAD("submit buffer %u: %u jobs, %u done, %u failed", i,
                       bt->njobs, bt->done, bt->failed);
        }
        bt->st = g_new0(struct tacc_virtio_job_status, bt->njobs);
        for (uint32_t k = 0; k < bt->njobs; k++) {
            bt->st[k].seqno = cpu_to_le64(qemu_get_be64(f));
            bt->st[k].status = cpu_to_le16(qemu_get_be16(f));
            bt->st[k].index = cpu_to_le16(qemu_get_be16(f));
        }
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        VtJobList *lists[2] = { &m->inflight[r], &m->pending[r] };

        for (int l = 0; l < 2; l++) {
            uint32_t n = qemu_get_be32(f);

            if (qemu_file_get_error(f)) {
                goto bad;
            }
            /* each job in flight has a command in the FIFO */
            if (n > (l ? VT_MIG_MAX_PENDING_CMDS : TACC_FIFO_DEPTH)) {
                VT_MIG_BAD("ring %d: %u jobs %s", r, n,
                           l ? "queued" : "in flight");
            }
            for (uint32_t k = 0; k < n; k++) {
                VtJob *j = vt_job_get(f, m, r, l == 1, &pending_cmds);

                if (!j) {
                    goto bad;
                }
                QSIMPLEQ_INSERT_TAIL(lists[l], j, next);
            }
        }
    }
    return 0;

bad:
    vt_mig_free(vt);
    return qemu_file_get_error(f) ? qemu_file_get_error(f) : -EINVAL;
}

static const VMStateInfo vt_vmstate_info_jobs = {
    .name = "virtio-tacc-jobs",
    .get = vt_jobs_get,
    .put = vt_jobs_put,
};

static bool vt_jobs_needed(void *opaque)
{
    return vt_jobs_held(opaque);
}

static const VMStateDescription vt_vmstate_jobs = {
    .name = "virtio-tacc-backend/jobs",
    .version_id = 1,
    .minimum_version_id = 1,
    .needed = vt_jobs_needed,
    .fields = (const VMStateField[]) {
        {
            .name = "jobs",
            .version_id = 1,
            .size = sizeof(VirtIOTacc),
            .info = &vt_vmstate_info_jobs,
            .flags = VMS_SINGLE,
            .offset = 0,
        },
        VMSTATE_END_OF_LIST()
    }
};

/* Descriptor @i of the table at @table (a split ring's layout, VERSION_1). */
static bool vt_desc_read(VirtIODevice *vdev, hwaddr table, unsigned i,
                         struct vring_desc *d)
{
    if (address_space_read(vdev->dma_as, table + (hwaddr)i * sizeof(*d),
                           MEMTXATTRS_UNSPECIFIED, d, sizeof(*d)) !=
        MEMTX_OK) {
        return false;
    }
    d->addr = le64_to_cpu(d->addr);
    d->len = le32_to_cpu(d->len);
    d->flags = le16_to_cpu(d->flags);
    d->next = le16_to_cpu(d->next);
    return true;
}

/*
 * The loaded buffer @e against the descriptor chain at its head, as
 * virtqueue_pop() reads it (one indirect table at the head at most): its
 * parts, read ones then written ones, must cover the chain's descriptors in
 * order, exactly (QEMU splits a descriptor that crosses memory regions into
 * several parts).  NULL, or why not.
 */
static const char *vt_chain_matches(VirtIODevice *vdev, const VtMigElem *e,
                                    unsigned num)
{
    hwaddr table = virtio_queue_get_desc_addr(vdev, TACC_VIRTIO_VQ_SUBMIT);
    unsigned max = num, i = e->head, seen = 0;
    uint32_t k = 0, parts = e->out_num + e->in_num;
    struct vring_desc d;

    if (!vt_desc_read(vdev, table, i, &d)) {
        return "its descriptor cannot be read";
    }
    if (d.flags & VRING_DESC_F_INDIRECT) {
        if (!d.len || d.len % sizeof(d)) {
            return "an indirect table of a bad size";
        }
        table = d.addr;
        max = d.len / sizeof(d);
        i = 0;
        if (!vt_desc_read(vdev, table, i, &d)) {
            return "its indirect table cannot be read";
        }
    }
    for (;;) {
        bool write = d.flags & VRING_DESC_F_WRITE;
        uint64_t off = 0;

        if (++seen > max) {
            return "a descriptor loop";
        }
        if (d.flags & VRING_DESC_F_INDIRECT) {
            return "a nested indirect table";
        }
        if (!d.len) {
            return "a descriptor of zero bytes";
        }
        while (off < d.len) {
            if (k == parts || (k >= e->out_num) != write ||
                e->addr[k] != d.addr + off || e->len[k] > d.len - off) {
                return "parts that are not its descriptors'";
            }
            off += e->len[k++];
        }
        if (!(d.flags & VRING_DESC_F_NEXT)) {
            break;
        }
        if (d.next >= max) {
            return "a next descriptor beyond the table";
        }
        i = d.next;
        if (!vt_desc_read(vdev, table, i, &d)) {
            return "a descriptor that cannot be read";
        }
    }
    return k == parts ? NULL : "more parts than its descriptors";
}

/* @e mapped into a new element (as virtqueue_pop()'s); NULL if it cannot be. */
static VirtQueueElement *vt_elem_map(VirtIODevice *vdev, const VtMigElem *e)
{
    size_t in_addr = QEMU_ALIGN_UP(sizeof(VirtQueueElement),
                                   __alignof__(hwaddr));
    size_t out_addr = in_addr + e->in_num * sizeof(hwaddr);
    size_t in_sg = QEMU_ALIGN_UP(out_addr + e->out_num * sizeof(hwaddr),
                                 __alignof__(struct iovec));
    size_t out_sg = in_sg + e->in_num * sizeof(struct iovec);
    VirtQueueElement *elem = g_malloc0(out_sg +
                                       e->out_num * sizeof(struct iovec));
    uint32_t k;

    elem->index = e->head;
    elem->ndescs = 1;
    elem->out_num = e->out_num;
    elem->in_num = e->in_num;
    elem->in_addr = (void *)elem + in_addr;
    elem->out_addr = (void *)elem + out_addr;
    elem->in_sg = (void *)elem + in_sg;
    elem->out_sg = (void *)elem + out_sg;
    for (k = 0; k < e->out_num + e->in_num; k++) {
        bool write = k >= e->out_num;
        struct iovec *sg = write ? &elem->in_sg[k - e->out_num]
                                 : &elem->out_sg[k];
        DMADirection dir = write ? DMA_DIRECTION_FROM_DEVICE
                                 : DMA_DIRECTION_TO_DEVICE;
        dma_addr_t len = e->len[k];

        if (!address_space_access_valid(vdev->dma_as, e->addr[k], len, write,
                                        MEMTXATTRS_UNSPECIFIED)) {
            break;
        }
        sg->iov_base = dma_memory_map(vdev->dma_as, e->addr[k], &len, dir,
                                      MEMTXATTRS_UNSPECIFIED);
        if (!sg->iov_base) {
            break;
        }
        if (len != e->len[k]) {
            dma_memory_unmap(vdev->dma_as, sg->iov_base, len, dir, 0);
            break;
        }
        sg->iov_len = len;
        if (write) {
            elem->in_addr[k - e->out_num] = e->addr[k];
        } else {
            elem->out_addr[k] = e->addr[k];
        }
    }
    if (k == e->out_num + e->in_num) {
        return elem;
    }
    while (k--) {           /* what was mapped goes, nothing was written */
        bool write = k >= e->out_num;
        struct iovec *sg = write ? &elem->in_sg[k - e->out_num]
                                 : &elem->out_sg[k];

        dma_memory_unmap(vdev->dma_as, sg->iov_base, sg->iov_len,
                         write ? DMA_DIRECTION_FROM_DEVICE
                               : DMA_DIRECTION_TO_DEVICE, 0);
    }
    g_free(elem);
    return NULL;
}

/* A ring's used index as the guest sees it (the used ring in guest memory). */
static bool vt_used_idx(VirtIODevice *vdev, int n, uint16_t *idx)
{
    hwaddr used = virtio_queue_get_used_addr(vdev, n);

    if (address_space_read(vdev->dma_as, used + 2, MEMTXATTRS_UNSPECIFIED,
                           idx, 2) != MEMTX_OK) {
        return false;
    }
    *idx = le16_to_cpu(*idx);
    return true;
}

/* Buffers the device holds on queue @n: popped and not yet used. */
static int vt_vq_inuse(VirtIODevice *vdev, int n)
{
    uint16_t used;

    if (!virtio_queue_get_desc_addr(vdev, n)) {
        return 0;
    }
    if (!vt_used_idx(vdev, n, &used)) {
        return -1;
    }
    return (uint16_t)(virtio_queue_get_last_avail_idx(vdev, n) - used);
}

/*
 * Queue @r's FIFO against the jobs in flight on ring @r, in order: first,
 * when the queue skips, the rest of a job that failed (its completion was
 * used), up to its last command; then each job in flight, the commands it
 * has left (all of them but for the first), the last one ending it.  A
 * completion then always finds its job at the head (vt_complete()).
 */
static const char *vt_fifo_matches(VirtIOTacc *vt, int r, VtJobList *list)
{
    TaccQueue *q = &vt->func.q[r];
    VtJob *j = list ? QSIMPLEQ_FIRST(list) : NULL;
    uint32_t i = 0;

#define VT_FIFO(i)  (&q->fifo[(q->f_head + (i)) % TACC_FIFO_DEPTH].d)
    if (q->cqe_pending) {
        return "a completion waiting for CQ space";
    }
    if (q->skipping) {
        uint32_t job = q->f_count ? le32_to_cpu(VT_FIFO(0)->job) : 0;

        for (;;) {
            if (i == q->f_count || le32_to_cpu(VT_FIFO(i)->job) != job ||
                (j && j->devjob == job)) {
                return "the rest of a failed job is not whole";
            }
            if (VT_FIFO(i++)->flags & TACC_DESC_F_LAST) {
                break;
            }
        }
    }
    for (bool first = true; i < q->f_count; first = false) {
        uint32_t n = 0;
        bool last = false;

        if (!j) {
            return "commands of no job in flight";
        }
        while (!last && i < q->f_count) {
            const struct tacc_desc *d = VT_FIFO(i++);

            if (le32_to_cpu(d->job) != j->devjob) {
                return "commands of another job";
            }
            n++;
            last = d->flags & TACC_DESC_F_LAST;
        }
        if (!last || n > j->ncmds || (!first && n != j->ncmds)) {
            return "a job's commands are not whole";
        }
        j = QSIMPLEQ_NEXT(j, next);
    }
    return j ? "a job in flight without its commands" : NULL;
#undef VT_FIFO
}

/* A queued job's commands are what vt_job_parse() and vt_submit_one() made. */
static bool vt_cmds_ok(VirtIOTacc *vt, const VtJob *j)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(vt);

    for (uint16_t i = 0; i < j->ncmds; i++) {
        const struct tacc_desc *d = &j->cmds[i];

        if (d->opcode >= TACC_OP_MAX ||
            (tacc_desc_hw13(d) &&
             !virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_INFER)) ||
            (d->opcode == TACC_OP_FILL &&
             !virtio_vdev_has_feature(vdev, TACC_VIRTIO_F_FILL)) ||
            le16_to_cpu(d->ctx) != j->ctx || le16_to_cpu(d->index) != i ||
            d->flags != (i == j->ncmds - 1 ? TACC_DESC_F_LAST : 0) ||
            le32_to_cpu(d->job) != j->devjob) {
            return false;
        }
    }
    return true;
}

/*
 * The jobs of the stream (none when it had no "jobs" subsection) against the
 * contexts, the batches, the function's FIFOs and the submit queue; their
 * buffers mapped.  Then the device takes them.  Returns 0 or -EINVAL.
 */
static int vt_virtio_post_load(VirtIODevice *vdev)
{
    VirtIOTacc *vt = VIRTIO_TACC(vdev);
    VtMig *m = vt->mig;
    uint32_t nbatches = m ? m->nbatches : 0, inflight[TACC_NUM_CONTEXTS] = {0};
    uint32_t pending_cmds = 0, k;
    unsigned num = virtio_queue_get_num(vdev, TACC_VIRTIO_VQ_SUBMIT);
    g_autofree unsigned long *heads = bitmap_new(VIRTQUEUE_MAX_SIZE);
    g_autofree VirtQueueElement **elems = g_new0(VirtQueueElement *,
                                                 nbatches + 1);
    int inuse;

    if (vt_vq_inuse(vdev, TACC_VIRTIO_VQ_CONTROL)) {
        VT_MIG_BAD("the control queue holds a request");
    }
    inuse = vt_vq_inuse(vdev, TACC_VIRTIO_VQ_SUBMIT);
    if (inuse != nbatches) {
        VT_MIG_BAD("the submit queue holds %d buffers, the stream %u", inuse,
                   nbatches);
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        const char *bad = vt_fifo_matches(vt, r, m ? &m->inflight[r] : NULL);

        if (bad) {
            VT_MIG_BAD("ring %d: %s (FIFO %u+%u)", r, bad,
                       vt->func.q[r].f_head, vt->func.q[r].f_count);
        }
    }
    if (!m) {
        return 0;
    }
    if (virtio_vdev_has_feature(vdev, VIRTIO_F_RING_PACKED) ||
        virtio_vdev_has_feature(vdev, VIRTIO_F_IN_ORDER) ||
        !virtio_vdev_has_feature(vdev, VIRTIO_F_VERSION_1) || vdev->broken) {
        VT_MIG_BAD("held submit buffers on a packed, in-order, legacy or "
                   "broken virtqueue");
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        VtJobList *lists[2] = { &m->inflight[r], &m->pending[r] };
        uint64_t last[TACC_NUM_CONTEXTS] = { 0 };

        for (int l = 0; l < 2; l++) {
            VtJob *j;

            QSIMPLEQ_FOREACH(j, lists[l], next) {
                VtBatch *bt = j->batch;
                VtCtx *c = vt_ctx(vt, j->ctx);

                if (!c || j->seqno <= last[j->ctx] ||
                    j->seqno > c->last_seqno[r] ||
                    le64_to_cpu(bt->st[j->idx].seqno) != j->seqno ||
                    bt->st[j->idx].status || bt->st[j->idx].index) {
                    VT_MIG_BAD("ring %d: job seqno %" PRIu64 " of context "
                               "%u", r, j->seqno, j->ctx);
                }
                if (l && !vt_cmds_ok(vt, j)) {
                    VT_MIG_BAD("ring %d: queued job seqno %" PRIu64 ": its "
                               "commands", r, j->seqno);
                }
                last[j->ctx] = j->seqno;
                inflight[j->ctx]++;
                pending_cmds += l ? j->ncmds : 0;
                /* one job per status slot: counted by index below */
                bt->st[j->idx].status = cpu_to_le16(0xffff);
            }
        }
    }
    for (k = 0; k < nbatches; k++) {
        VtBatch *bt = m->bt[k];
        uint32_t marked = 0;
        const char *bad;

        for (uint32_t i = 0; i < bt->njobs; i++) {
            if (bt->st[i].status == cpu_to_le16(0xffff)) {
                bt->st[i].status = 0;
                marked++;
            }
        }
        if (marked != m->listed[k] || bt->done + marked != bt->njobs) {
            VT_MIG_BAD("submit buffer %u: %u jobs, %u done, %u listed", k,
                       bt->njobs, bt->done, m->listed[k]);
        }
        if (m->el[k].head >= num || test_and_set_bit(m->el[k].head, heads)) {
            VT_MIG_BAD("submit buffer %u: head %u (ring of %u)", k,
                       m->el[k].head, num);
        }
        bad = vt_chain_matches(vdev, &m->el[k], num);
        if (bad) {
            VT_MIG_BAD("submit buffer %u at head %u: %s", k, m->el[k].head,
                       bad);
        }
    }
    for (k = 0; k < nbatches; k++) {
        elems[k] = vt_elem_map(vdev, &m->el[k]);
        if (!elems[k]) {
            VT_MIG_BAD("submit buffer %u at head %u: not in guest memory", k,
                       m->el[k].head);
        }
    }

    /* adopted */
    for (k = 0; k < nbatches; k++) {
        m->bt[k]->elem = elems[k];
        m->bt[k] = NULL;
    }
    for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
        QSIMPLEQ_CONCAT(&vt->inflight[r], &m->inflight[r]);
        QSIMPLEQ_CONCAT(&vt->pending[r], &m->pending[r]);
    }
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        vt->ctx[c].inflight = inflight[c];
    }
    vt->pending_cmds = pending_cmds;
    trace_virtio_tacc_mig_jobs(nbatches, pending_cmds);
    vt_mig_free(vt);
    return 0;

bad:
    for (k = 0; k < nbatches; k++) {
        if (elems[k]) {
            VirtQueueElement *e = elems[k];

            for (unsigned i = 0; i < e->out_num; i++) {
                dma_memory_unmap(vdev->dma_as, e->out_sg[i].iov_base,
                                 e->out_sg[i].iov_len,
                                 DMA_DIRECTION_TO_DEVICE, 0);
            }
            for (unsigned i = 0; i < e->in_num; i++) {
                dma_memory_unmap(vdev->dma_as, e->in_sg[i].iov_base,
                                 e->in_sg[i].iov_len,
                                 DMA_DIRECTION_FROM_DEVICE, 0);
            }
            g_free(e);
        }
    }
    vt_mig_free(vt);
    return -EINVAL;
}

static int vt_tables_put(QEMUFile *f, void *pv, size_t size,
                         const VMStateField *field, JSONWriter *vmdesc)
{
    VirtIOTacc *vt = pv;
    GHashTableIter it;
    gpointer v;

    qemu_put_be32(f, vt->pt_used);
    for (uint32_t id = 1; id <= TACC_VIRTIO_MAX_PT_PAGES; id++) {
        if (vt->pt[id]) {
            qemu_put_be32(f, id);
            for (int i = 0; i < TACC_PT_ENTRIES; i++) {
                qemu_put_be64(f, vt->pt[id][i]);
            }
        }
    }
    qemu_put_be32(f, g_hash_table_size(vt->bos));
    g_hash_table_iter_init(&it, vt->bos);
    while (g_hash_table_iter_next(&it, NULL, &v)) {
        VtBo *bo = v;

        qemu_put_be32(f, bo->handle);
        qemu_put_be32(f, bo->ctx);
        qemu_put_byte(f, bo->devmem);
        qemu_put_be64(f, bo->size);
        qemu_put_be64(f, bo->dev_off);
        qemu_put_be32(f, bo->nents);
        for (uint32_t i = 0; i < bo->nents; i++) {
            qemu_put_be64(f, bo->ents[i].addr);
            qemu_put_be32(f, bo->ents[i].length);
        }
    }
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        VtCtx *ctx = &vt->ctx[c];

        qemu_put_byte(f, ctx->used);
        if (!ctx->used) {
            continue;
        }
        qemu_put_be32(f, ctx->root);
        for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
            qemu_put_be64(f, ctx->last_seqno[r]);
        }
        qemu_put_be32(f, ctx->binds->len);
        for (guint i = 0; i < ctx->binds->len; i++) {
            VtBind *b = &g_array_index(ctx->binds, VtBind, i);

            qemu_put_be64(f, b->va);
            qemu_put_be64(f, b->size);
            qemu_put_be64(f, b->offset);
            qemu_put_be32(f, b->bo->handle);
            qemu_put_byte(f, b->ro);
        }
    }
    return 0;
}

/* A loaded host BO's page list: the checks of BO_CREATE. */
static bool vt_ents_ok(const VtBo *bo)
{
    uint64_t total = 0;

    for (uint32_t i = 0; i < bo->nents; i++) {
        uint64_t a = bo->ents[i].addr;
        uint32_t l = bo->ents[i].length;

        if (!l || ((a | l) & (VT_PAGE - 1)) || a + l < a ||
            ((a + l - 1) & ~TACC_PTE_ADDR_MASK & ~(VT_PAGE - 1))) {
            return false;
        }
        total += l;
    }
    return total == bo->size;
}

/*
 * Claim page @id at @level and, below level 2, the pages its valid entries
 * that are not 2 MiB leaves point at: each must exist and be claimed once.
 */
static bool vt_pt_claim(VirtIOTacc *vt, uint8_t *seen, uint32_t id, int level,
                        uint32_t *claimed)
{
    if (!id || id > TACC_VIRTIO_MAX_PT_PAGES || !vt->pt[id] || seen[id]) {
        return false;
    }
    seen[id] = 1;
    (*claimed)++;
    for (int i = 0; level < 2 && i < TACC_PT_ENTRIES; i++) {
        uint64_t e = vt->pt[id][i];

        if ((e & TACC_PTE_VALID) && !(e & TACC_PTE_HUGE) &&
            !vt_pt_claim(vt, seen, (e & TACC_PTE_ADDR_MASK) >> 12, level + 1,
                         claimed)) {
            return false;
        }
    }
    return true;
}

/* Page-table pages form one tree per context, and every page is in one. */
static bool vt_pt_trees_ok(VirtIOTacc *vt)
{
    g_autofree uint8_t *seen = g_new0(uint8_t, TACC_VIRTIO_MAX_PT_PAGES + 1);
    uint32_t claimed = 0;

    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        if (vt->ctx[c].used &&
            !vt_pt_claim(vt, seen, vt->ctx[c].root, 0, &claimed)) {
            return false;
        }
    }
    return claimed == vt->pt_used;
}

/*
 * Drop contexts, BOs and page-table pages as they are, without walking the
 * tables (a stream being loaded may not hold trees): by page id.
 */
static void vt_tables_drop(VirtIOTacc *vt)
{
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        if (vt->ctx[c].binds) {
            g_array_free(vt->ctx[c].binds, true);
        }
        memset(&vt->ctx[c], 0, sizeof(vt->ctx[c]));
        vt->func.ptbr[c] = 0;
    }
    g_hash_table_remove_all(vt->bos);
    for (uint32_t id = 1; id <= TACC_VIRTIO_MAX_PT_PAGES; id++) {
        g_free(vt->pt[id]);
        vt->pt[id] = NULL;
    }
    vt->pt_used = 0;
    tacc_tlb_invalidate(vt->pf, TACC_FN_VIRTIO, -1);
}

#define VT_LOAD_BAD(...) do {                                       \
        error_report("virtio-tacc: migration: " __VA_ARGS__);       \
        goto bad;                                                   \
    } while (0)

static int vt_tables_get(QEMUFile *f, void *pv, size_t size,
                         const VMStateField *field)
{
    VirtIOTacc *vt = pv;
    uint64_t wbase, wsize;
    uint32_t n, nbos;

    tacc_window(&vt->func, &wbase, &wsize);     /* the PF's was loaded */
    vt_tables_drop(vt);
    n = qemu_get_be32(f);
    if (n > TACC_VIRTIO_MAX_PT_PAGES) {
        VT_LOAD_BAD("%u page-table pages", n);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = qemu_get_be32(f);

        if (qemu_file_get_error(f)) {
            goto bad;
        }
        if (!id || id > TACC_VIRTIO_MAX_PT_PAGES || vt->pt[id]) {
            VT_LOAD_BAD("page-table page id %u", id);
        }
        vt->pt[id] = g_new(uint64_t, TACC_PT_ENTRIES);
        vt->pt_used++;
        for (int e = 0; e < TACC_PT_ENTRIES; e++) {
            vt->pt[id][e] = qemu_get_be64(f);
        }
    }
    nbos = qemu_get_be32(f);
    if (nbos > TACC_VIRTIO_MAX_BOS) {
        VT_LOAD_BAD("%u BOs", nbos);
    }
    for (uint32_t i = 0; i < nbos; i++) {
        g_autofree VtBo *bo = g_new0(VtBo, 1);
        uint8_t devmem;

        bo->handle = qemu_get_be32(f);
        bo->ctx = qemu_get_be32(f);
        devmem = qemu_get_byte(f);
        bo->devmem = devmem;
        bo->size = qemu_get_be64(f);
        bo->dev_off = qemu_get_be64(f);
        bo->nents = qemu_get_be32(f);
        if (qemu_file_get_error(f)) {
            goto bad;
        }
        if (!bo->handle || bo->ctx >= TACC_NUM_CONTEXTS || devmem > 1 ||
            !bo->size || bo->size > TACC_VIRTIO_MAX_BO_SIZE ||
            (bo->size & (VT_PAGE - 1)) ||
            g_hash_table_contains(vt->bos, GUINT_TO_POINTER(bo->handle)) ||
            (bo->devmem ? bo->nents || (bo->dev_off & (VT_PAGE - 1)) ||
                          bo->dev_off > wsize || bo->size > wsize - bo->dev_off
                        : !bo->nents || bo->nents > TACC_VIRTIO_MAX_BO_ENTS ||
                          bo->nents >
                          TACC_VIRTIO_MAX_FN_ENTS - vt->ents_total)) {
            VT_LOAD_BAD("BO %u (context %u, %s, size 0x%" PRIx64 ", offset 0x%"
                        PRIx64 ", %u entries)", bo->handle, bo->ctx,
                        bo->devmem ? "device" : "host", bo->size, bo->dev_off,
                        bo->nents);
        }
        if (!bo->devmem) {
            bo->ents = g_new(struct tacc_virtio_mem_entry, bo->nents);
            for (uint32_t e = 0; e < bo->nents; e++) {
                bo->ents[e].addr = qemu_get_be64(f);
                bo->ents[e].length = qemu_get_be32(f);
            }
            if (qemu_file_get_error(f) || !vt_ents_ok(bo)) {
                g_free(bo->ents);
                VT_LOAD_BAD("BO %u: its page list", bo->handle);
            }
        }
        vt->ents_total += bo->nents;
        bo->ents_total = &vt->ents_total;
        g_hash_table_insert(vt->bos, GUINT_TO_POINTER(bo->handle), bo);
        bo = NULL;                      /* the table holds it */
    }
    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        VtCtx *ctx = &vt->ctx[c];
        uint8_t used = qemu_get_byte(f);

        if (used > 1) {
            VT_LOAD_BAD("context %d", c);
        }
        if (!used) {
            continue;
        }
        ctx->used = true;
        ctx->root = qemu_get_be32(f);
        ctx->binds = g_array_new(false, true, sizeof(VtBind));
        for (int r = 0; r < TACC_VIRTIO_NUM_RINGS; r++) {
            ctx->last_seqno[r] = qemu_get_be64(f);
        }
        n = qemu_get_be32(f);
        for (uint32_t i = 0; i < n && !qemu_file_get_error(f); i++) {
            VtBind b = { 0 };
            uint32_t handle;
            uint8_t ro;

            b.va = qemu_get_be64(f);
            b.size = qemu_get_be64(f);
            b.offset = qemu_get_be64(f);
            handle = qemu_get_be32(f);
            ro = qemu_get_byte(f);
            b.bo = g_hash_table_lookup(vt->bos, GUINT_TO_POINTER(handle));
            b.ro = ro;
            /* VM_BIND's checks, and sorted by VA without overlap */
            if (!b.bo || b.bo->ctx != c || ro > 1 || !b.size ||
                ((b.va | b.offset | b.size) & (VT_PAGE - 1)) ||
                b.va >= (1ull << TACC_VA_BITS) ||
                b.size > (1ull << TACC_VA_BITS) - b.va ||
                b.offset > b.bo->size || b.size > b.bo->size - b.offset ||
                (ctx->binds->len &&
                 b.va < g_array_index(ctx->binds, VtBind,
                                      ctx->binds->len - 1).va +
                        g_array_index(ctx->binds, VtBind,
                                      ctx->binds->len - 1).size)) {
                VT_LOAD_BAD("context %d binding %u (BO %u, va 0x%" PRIx64
                            " size 0x%" PRIx64 ")", c, i, handle, b.va,
                            b.size);
            }
            b.bo->binds++;
            g_array_append_val(ctx->binds, b);
        }
    }
    if (qemu_file_get_error(f)) {
        goto bad;
    }
    if (!vt_pt_trees_ok(vt)) {
        VT_LOAD_BAD("page tables: not one tree per context");
    }
    return 0;

bad:
    vt_tables_drop(vt);
    return qemu_file_get_error(f) ? qemu_file_get_error(f) : -EINVAL;
}

static const VMStateInfo vt_vmstate_info_tables = {
    .name = "virtio-tacc-tables",
    .get = vt_tables_get,
    .put = vt_tables_put,
};

static int vt_post_load(void *opaque, int version_id)
{
    VirtIOTacc *vt = opaque;

    for (int c = 0; c < TACC_NUM_CONTEXTS; c++) {
        uint64_t want = vt->ctx[c].used
            ? ((uint64_t)vt->ctx[c].root << 12) | TACC_PTBR_VALID : 0;

        if (vt->func.ptbr[c] != want) {
            error_report("virtio-tacc: migration: context %d: PTBR 0x%" PRIx64
                         " is not its root's", c, vt->func.ptbr[c]);
            return -EINVAL;
        }
    }
    if (vt->fi_ctx_id < -1 || vt->fi_ctx_id > UINT32_MAX) {
        error_report("virtio-tacc: migration: x-fi-ctx-id %" PRId64,
                     vt->fi_ctx_id);
        return -EINVAL;
    }
    vt->pending_cmds = 0;
    vt->resetting = false;
    return tacc_vmstate_func_loaded(&vt->func) ? 0 : -EINVAL;
}

static const VMStateDescription vt_vmstate_backend = {
    .name = "virtio-tacc-backend",
    .version_id = 1,
    .minimum_version_id = 1,
    .pre_save = vt_pre_save,
    .post_load = vt_post_load,
    .fields = (const VMStateField[]) {
        {
            .name = "tables",
            .version_id = 1,
            .size = sizeof(VirtIOTacc),
            .info = &vt_vmstate_info_tables,
            .flags = VMS_SINGLE,
            .offset = 0,
        },
        VMSTATE_STRUCT(func, VirtIOTacc, 1, tacc_vmstate_func_regs, TaccFunc),
        VMSTATE_UINT32(next_handle, VirtIOTacc),
        VMSTATE_UINT32(next_job, VirtIOTacc),
        VMSTATE_INT64(fi_ctx_id, VirtIOTacc),
        VMSTATE_END_OF_LIST()
    },
    .subsections = (const VMStateDescription * const []) {
        &vt_vmstate_jobs,
        NULL
    }
};

static const VMStateDescription vt_vmstate = {
    .name = "virtio-tacc",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_VIRTIO_DEVICE,
        VMSTATE_END_OF_LIST()
    }
};

/* x-fi-ctx-id=N: the next CTX_CREATE answers context N (-1: off) */
static void vt_get_fi_ctx_id(Object *obj, Visitor *v, const char *name,
                             void *opaque, Error **errp)
{
    visit_type_int64(v, name, &VIRTIO_TACC(obj)->fi_ctx_id, errp);
}

static void vt_set_fi_ctx_id(Object *obj, Visitor *v, const char *name,
                             void *opaque, Error **errp)
{
    int64_t val;

    if (!visit_type_int64(v, name, &val, errp)) {
        return;
    }
    if (val < -1 || val > UINT32_MAX) {
        error_setg(errp, "x-fi-ctx-id: -1 or 0..%u", UINT32_MAX);
        return;
    }
    VIRTIO_TACC(obj)->fi_ctx_id = val;
}

/* x-fi-ctrl-delay-ms=N: the next control answer is used N ms late */
static void vt_get_fi_ctrl_delay(Object *obj, Visitor *v, const char *name,
                                 void *opaque, Error **errp)
{
    visit_type_uint32(v, name, &VIRTIO_TACC(obj)->fi_ctrl_delay_ms, errp);
}

static void vt_set_fi_ctrl_delay(Object *obj, Visitor *v, const char *name,
                                 void *opaque, Error **errp)
{
    uint32_t val;

    if (!visit_type_uint32(v, name, &val, errp)) {
        return;
    }
    if (val > 600000) {
        error_setg(errp, "x-fi-ctrl-delay-ms: 0..600000");
        return;
    }
    VIRTIO_TACC(obj)->fi_ctrl_delay_ms = val;
}

/* x-fi-ctrl-short=N: the next control answer has N bytes (-1: off) */
static void vt_get_fi_ctrl_short(Object *obj, Visitor *v, const char *name,
                                 void *opaque, Error **errp)
{
    visit_type_int64(v, name, &VIRTIO_TACC(obj)->fi_ctrl_short, errp);
}

static void vt_set_fi_ctrl_short(Object *obj, Visitor *v, const char *name,
                                 void *opaque, Error **errp)
{
    int64_t val;

    if (!visit_type_int64(v, name, &val, errp)) {
        return;
    }
    if (val < -1 || val >= (int64_t)sizeof(struct tacc_virtio_resp)) {
        error_setg(errp, "x-fi-ctrl-short: -1 or 0..%zu",
                   sizeof(struct tacc_virtio_resp) - 1);
        return;
    }
    VIRTIO_TACC(obj)->fi_ctrl_short = val;
}

/*
 * x-fi-page-entries=N: the pool of page-list entries (config page_entries);
 * BOs that hold more keep them, new ones are refused until below.
 */
static void vt_get_fi_page_entries(Object *obj, Visitor *v, const char *name,
                                   void *opaque, Error **errp)
{
    visit_type_uint32(v, name, &VIRTIO_TACC(obj)->fi_page_entries, errp);
}

static void vt_set_fi_page_entries(Object *obj, Visitor *v, const char *name,
                                   void *opaque, Error **errp)
{
    VirtIOTacc *vt = VIRTIO_TACC(obj);
    uint32_t val;

    if (!visit_type_uint32(v, name, &val, errp)) {
        return;
    }
    if (!val || val > TACC_VIRTIO_MAX_FN_ENTS) {
        error_setg(errp, "x-fi-page-entries: 1..%u", TACC_VIRTIO_MAX_FN_ENTS);
        return;
    }
    vt->fi_page_entries = val;
    if (DEVICE(obj)->realized) {
        virtio_notify_config(VIRTIO_DEVICE(obj));
    }
}

/* x-page-entries-used (read only): page-list entries all BOs hold */
static void vt_get_page_entries_used(Object *obj, Visitor *v, const char *name,
                                     void *opaque, Error **errp)
{
    visit_type_uint32(v, name, &VIRTIO_TACC(obj)->ents_total, errp);
}

static void vt_instance_init(Object *obj)
{
    VirtIOTacc *vt = VIRTIO_TACC(obj);

    vt->fi_ctx_id = -1;
    vt->fi_ctrl_short = -1;
    vt->fi_page_entries = TACC_VIRTIO_MAX_FN_ENTS;
}

static void vt_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    VirtioDeviceClass *vdc = VIRTIO_DEVICE_CLASS(klass);

    device_class_set_props(dc, vt_properties);
    object_class_property_add(klass, "x-fi-ctx-id", "int64", vt_get_fi_ctx_id,
                              vt_set_fi_ctx_id, NULL, NULL);
    object_class_property_add(klass, "x-fi-ctrl-delay-ms", "uint32",
                              vt_get_fi_ctrl_delay, vt_set_fi_ctrl_delay,
                              NULL, NULL);
    object_class_property_add(klass, "x-fi-ctrl-short", "int64",
                              vt_get_fi_ctrl_short, vt_set_fi_ctrl_short,
                              NULL, NULL);
    object_class_property_add(klass, "x-fi-page-entries", "uint32",
                              vt_get_fi_page_entries, vt_set_fi_page_entries,
                              NULL, NULL);
    object_class_property_add(klass, "x-page-entries-used", "uint32",
                              vt_get_page_entries_used, NULL, NULL, NULL);
    dc->vmsd = &vt_vmstate;
    vdc->vmsd = &vt_vmstate_backend;
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
    vdc->realize = vt_realize;
    vdc->unrealize = vt_unrealize;
    vdc->get_features = vt_get_features;
    vdc->validate_features = vt_validate_features;
    vdc->set_status = vt_set_status;
    vdc->get_config = vt_get_config;
    vdc->reset = vt_reset;
    vdc->post_load = vt_virtio_post_load;
}

static const TypeInfo vt_info = {
    .name = TYPE_VIRTIO_TACC,
    .parent = TYPE_VIRTIO_DEVICE,
    .instance_size = sizeof(VirtIOTacc),
    .instance_init = vt_instance_init,
    .class_init = vt_class_init,
};

static void vt_register_types(void)
{
    type_register_static(&vt_info);
}

type_init(vt_register_types)
