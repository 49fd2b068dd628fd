/*
 * tacc: migration state of the PF ("tacc") and its VFs ("tacc-vf").
 *
 * docs/hardware.md "Migration" is the contract.  What is saved: each
 * function's config space, MSI-X table and AER log, its registers, queues
 * (rings, heads and tails, the fetched descriptors waiting in the FIFO, a
 * completion waiting for CQ space, the command list being executed),
 * contexts' page-table roots, fault registers, counters, trace and sample
 * rings; the PF also saves the engines and queue-local units with the
 * commands on them (a GEMM's computed C included), the link model (its
 * directions' occupancy, posted credits, ASPM state and counters), the TLP
 * capture, arbitration state, fault injection, the ground truth.  Device
 * memory is a RAM block of its own (tacc-pci.c) and moves with guest RAM.
 * Timers are saved as deadlines in device time; device time goes on from
 * its saved value on the destination (TaccState.dev_clock_off).  The TLB is
 * dropped on load (it refills from the page tables).
 *
 * Host work is finished before the state is saved: the VM stop quiesces the
 * device (tacc_quiesce); pre_save refuses, with a message, if any is left.
 * post_load checks every loaded index, size and state against the device's
 * limits: a damaged or hostile stream fails the load with a message.
 *
 * The PF's section loads before its VFs' (priority): loading the PF's SR-IOV
 * control enables the VFs, which resets them.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "qemu/error-report.h"
#include "hw/pci/msix.h"
#include "hw/pci/pcie_aer.h"
#include "io/channel-buffer.h"
#include "migration/qemu-file.h"
#include "migration/qemu-file-types.h"
#include "migration/vmstate.h"
#include "tacc.h"
#include "trace.h"

#define TACC_VMSTATE_VERSION    1

/* ------------------------------------------------ GEMM result of a unit -- */

/*
 * A GEMM on a unit holds its result C (packed fp32, batch x m x n) in host
 * memory until its modelled completion writes it back.  Saved: present (0 or
 * 1), m, n, batch, the host bytes charged to the function, then C.  The
 * thread pool had finished it before (pre_save refuses otherwise).
 */
static int tacc_gemm_put(QEMUFile *f, void *pv, size_t size,
                         const VMStateField *field, JSONWriter *vmdesc)
{
    TaccGemmJob *j = *(TaccGemmJob **)pv;
    uint64_t elems;

    if (!j) {
        qemu_put_byte(f, 0);
        return 0;
    }
    assert(!j->in_pool);
    elems = j->batch * j->m * j->n;
    qemu_put_byte(f, 1);
    qemu_put_be64(f, j->m);
    qemu_put_be64(f, j->n);
    qemu_put_be64(f, j->batch);
    qemu_put_be64(f, j->host_bytes);
    for (uint64_t i = 0; i < elems; i++) {
        uint32_t w;

        memcpy(&w, &j->C[i], 4);
        qemu_put_be32(f, w);
    }
    return 0;
}

static int tacc_gemm_get(QEMUFile *f, void *pv, size_t size,
                         const VMStateField *field)
{
    TaccGemmJob **pj = pv, *j;
    uint64_t m, n, batch, host_bytes, elems;
    uint8_t present = qemu_get_byte(f);

    *pj = NULL;
    if (!present) {
        return 0;
    }
    m = qemu_get_be64(f);
    n = qemu_get_be64(f);
    batch = qemu_get_be64(f);
    host_bytes = qemu_get_be64(f);
    if (qemu_file_get_error(f)) {
        return qemu_file_get_error(f);
    }
    if (present != 1 || !m || m > TACC_GEMM_MAX_DIM || !n ||
        n > TACC_GEMM_MAX_DIM || !batch || batch > TACC_GEMM_MAX_BATCH ||
        batch * m * n > TACC_GEMM_MAX_MNK || host_bytes < batch * m * n * 4) {
        error_report("tacc: migration: bad GEMM result on a unit "
                     "(present %u, m %" PRIu64 ", n %" PRIu64 ", batch %"
                     PRIu64 ", host bytes %" PRIu64 ")", present, m, n, batch,
                     host_bytes);
        return -EINVAL;
    }
    elems = batch * m * n;
    j = g_new0(TaccGemmJob, 1);
    j->C = g_try_malloc(elems * 4);
    if (!j->C) {
        error_report("tacc: migration: no host memory for a GEMM result of "
                     "%" PRIu64 " bytes", elems * 4);
        g_free(j);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < elems; i++) {
        uint32_t w = qemu_get_be32(f);

        memcpy(&j->C[i], &w, 4);
        if (!(i & 0xffff) && qemu_file_get_error(f)) {
            break;      /* a truncated stream: stop reading zeros */
        }
    }
    if (qemu_file_get_error(f)) {
        g_free(j->C);
        g_free(j);
        return qemu_file_get_error(f);
    }
    j->m = m;
    j->n = n;
    j->batch = batch;
    j->host_bytes = host_bytes;
    *pj = j;
    return 0;
}

static const VMStateInfo tacc_vmstate_info_gemm = {
    .name = "tacc-gemm-result",
    .get = tacc_gemm_get,
    .put = tacc_gemm_put,
};

/* ------------------------------------------------------- descriptions -- */

static const VMStateDescription tacc_vmstate_cmd = {
    .name = "tacc/cmd",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        /* the descriptor as the guest wrote it (little-endian) */
        VMSTATE_BUFFER_UNSAFE(d, TaccCmd, 0, sizeof(struct tacc_desc)),
        VMSTATE_UINT64(t_fetch_ps, TaccCmd),
        VMSTATE_UINT64(seq, TaccCmd),
        VMSTATE_BOOL(listed, TaccCmd),
        VMSTATE_UINT16(preset, TaccCmd),
        VMSTATE_UINT32(list_id, TaccCmd),
        VMSTATE_UINT16(list_index, TaccCmd),
        VMSTATE_UINT64(fetch_ps, TaccCmd),
        VMSTATE_UINT32(fetch_hits, TaccCmd),
        VMSTATE_UINT32(fetch_misses, TaccCmd),
        VMSTATE_UINT32(fetch_walks, TaccCmd),
        VMSTATE_UINT64(fetch_devmem, TaccCmd),
        VMSTATE_UINT64(list_start_ps, TaccCmd),
        VMSTATE_END_OF_LIST()
    }
};

static const VMStateDescription tacc_vmstate_queue = {
    .name = "tacc/queue",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT64(sq_base, TaccQueue),
        VMSTATE_UINT64(cq_base, TaccQueue),
        VMSTATE_UINT32(sq_size, TaccQueue),
        VMSTATE_UINT32(cq_size, TaccQueue),
        VMSTATE_UINT32(sq_tail, TaccQueue),
        VMSTATE_UINT32(sq_head, TaccQueue),
        VMSTATE_UINT32(cq_head, TaccQueue),
        VMSTATE_UINT32(cq_tail, TaccQueue),
        VMSTATE_UINT32(ctrl, TaccQueue),
        VMSTATE_UINT32(status, TaccQueue),
        VMSTATE_STRUCT_ARRAY(fifo, TaccQueue, TACC_FIFO_DEPTH, 1,
                             tacc_vmstate_cmd, TaccCmd),
        VMSTATE_UINT32(f_head, TaccQueue),
        VMSTATE_UINT32(f_count, TaccQueue),
        VMSTATE_BOOL(running, TaccQueue),
        VMSTATE_BOOL(skipping, TaccQueue),
        VMSTATE_BOOL(job_open, TaccQueue),
        VMSTATE_UINT64(job_start_ps, TaccQueue),
        VMSTATE_UINT64(ready_ps, TaccQueue),
        VMSTATE_BOOL(cqe_pending, TaccQueue),
        VMSTATE_BUFFER_UNSAFE(pending_cqe, TaccQueue, 0,
                              sizeof(struct tacc_cqe)),
        VMSTATE_BOOL(pending_irq, TaccQueue),
        VMSTATE_BOOL(list_on, TaccQueue),
        VMSTATE_BOOL(list_cur_ok, TaccQueue),
        VMSTATE_BOOL(list_end, TaccQueue),
        VMSTATE_UINT32(list_pos, TaccQueue),
        VMSTATE_UINT32(list_patch, TaccQueue),
        VMSTATE_UINT16(list_status, TaccQueue),
        VMSTATE_UINT64(list_start_ps, TaccQueue),
        VMSTATE_STRUCT(list_cur, TaccQueue, 1, tacc_vmstate_cmd, TaccCmd),
        VMSTATE_END_OF_LIST()
    }
};

/* A unit's result: what its command did, timed at dispatch. */
static const VMStateDescription tacc_vmstate_result = {
    .name = "tacc/result",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT16(status, TaccResult),
        VMSTATE_UINT64(bytes, TaccResult),
        VMSTATE_UINT64(h2d_bytes, TaccResult),
        VMSTATE_UINT64(d2h_bytes, TaccResult),
        VMSTATE_UINT64(h2d_tlps, TaccResult),
        VMSTATE_UINT64(d2h_tlps, TaccResult),
        VMSTATE_UINT64(h2d_link, TaccResult),
        VMSTATE_UINT64(d2h_link, TaccResult),
        VMSTATE_UINT64(req_tlps, TaccResult),
        VMSTATE_UINT64_ARRAY(dllp_bytes, TaccResult, 2),
        VMSTATE_UINT64(devmem_rd, TaccResult),
        VMSTATE_UINT64(devmem_wr, TaccResult),
        VMSTATE_UINT64(flops, TaccResult),
        VMSTATE_BOOL(bf16, TaccResult),
        VMSTATE_UINT64(ideal_ps, TaccResult),
        VMSTATE_UINT32(tlb_hits, TaccResult),
        VMSTATE_UINT32(tlb_misses, TaccResult),
        VMSTATE_UINT32(walk_reads, TaccResult),
        VMSTATE_BOOL(fault, TaccResult),
        VMSTATE_UINT64(pre_ps, TaccResult),
        VMSTATE_INT32(link_kind, TaccResult),
        VMSTATE_UINT64(link_payload, TaccResult),
        VMSTATE_UINT32(link_host_off, TaccResult),
        VMSTATE_UINT32(link_dev_off, TaccResult),
        VMSTATE_BOOL(land, TaccResult),
        VMSTATE_UINT64(land_pos, TaccResult),
        VMSTATE_UINT64(land_len, TaccResult),
        VMSTATE_UINT64(post_ps, TaccResult),
        VMSTATE_BOOL(post_write, TaccResult),
        VMSTATE_BOOL(post_write_devmem, TaccResult),
        VMSTATE_UINT64(post_addr, TaccResult),
        VMSTATE_UINT64(post_value, TaccResult),
        {
            .name = "gemm",
            .version_id = 0,
            .size = sizeof(TaccGemmJob *),
            .info = &tacc_vmstate_info_gemm,
            .flags = VMS_SINGLE,
            .offset = offsetof(TaccResult, gemm),
        },
        VMSTATE_INT32(work, TaccResult),
        VMSTATE_INT32(work_phase, TaccResult),
        VMSTATE_UINT64(work_pos, TaccResult),
        VMSTATE_UINT64(work_start_ps, TaccResult),
        VMSTATE_END_OF_LIST()
    }
};

static const VMStateDescription tacc_vmstate_unit = {
    .name = "tacc/unit",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_BOOL(busy, TaccUnit),
        VMSTATE_INT32(fn, TaccUnit),
        VMSTATE_INT32(q, TaccUnit),
        VMSTATE_INT32(engine, TaccUnit),
        VMSTATE_STRUCT(cmd, TaccUnit, 1, tacc_vmstate_cmd, TaccCmd),
        VMSTATE_STRUCT(res, TaccUnit, 1, tacc_vmstate_result, TaccResult),
        VMSTATE_UINT64(start_ps, TaccUnit),
        VMSTATE_UINT64(next_ps, TaccUnit),
        VMSTATE_INT32(phase, TaccUnit),
        VMSTATE_UINT64(link_left, TaccUnit),
        VMSTATE_UINT64(stall_ps, TaccUnit),
        VMSTATE_END_OF_LIST()
    }
};

static const VMStateDescription tacc_vmstate_linkpm = {
    .name = "tacc/linkpm",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT64(l0s_entries, TaccLinkPm),
        VMSTATE_UINT64(l0s_exits, TaccLinkPm),
        VMSTATE_UINT64(l0s_ps, TaccLinkPm),
        VMSTATE_UINT64(l1_entries, TaccLinkPm),
        VMSTATE_UINT64(l1_exits, TaccLinkPm),
        VMSTATE_UINT64(l1_ps, TaccLinkPm),
        VMSTATE_UINT64(exit_ps, TaccLinkPm),
        VMSTATE_UINT64(l11_entries, TaccLinkPm),
        VMSTATE_UINT64(l11_exits, TaccLinkPm),
        VMSTATE_UINT64(l11_ps, TaccLinkPm),
        VMSTATE_UINT64(l12_entries, TaccLinkPm),
        VMSTATE_UINT64(l12_exits, TaccLinkPm),
        VMSTATE_UINT64(l12_ps, TaccLinkPm),
        VMSTATE_INT32(state, TaccLinkPm),
        VMSTATE_INT32(sub, TaccLinkPm),
        VMSTATE_END_OF_LIST()
    }
};

static const VMStateDescription tacc_vmstate_pool = {
    .name = "tacc/posted-pool",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT64(tat_ps, TaccPostedPool),
        VMSTATE_UINT64(tat_rem, TaccPostedPool),
        VMSTATE_END_OF_LIST()
    }
};

static const VMStateDescription tacc_vmstate_gt = {
    .name = "tacc/ground-truth",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT64(h2d_bytes, TaccGroundTruth),
        VMSTATE_UINT64(d2h_bytes, TaccGroundTruth),
        VMSTATE_UINT64(h2d_link_bytes, TaccGroundTruth),
        VMSTATE_UINT64(d2h_link_bytes, TaccGroundTruth),
        VMSTATE_UINT64_ARRAY(busy_ps, TaccGroundTruth, TACC_NUM_ENGINES),
        VMSTATE_UINT64(trace_records, TaccGroundTruth),
        VMSTATE_UINT64(trace_dropped, TaccGroundTruth),
        VMSTATE_UINT64(cmds, TaccGroundTruth),
        VMSTATE_UINT64(jobs, TaccGroundTruth),
        VMSTATE_UINT64(faults, TaccGroundTruth),
        VMSTATE_UINT64(dma_errors, TaccGroundTruth),
        VMSTATE_UINT64(irqs, TaccGroundTruth),
        VMSTATE_UINT64(flops, TaccGroundTruth),
        VMSTATE_END_OF_LIST()
    }
};

/* ------------------------------------------------------- the function -- */

static bool tacc_ring_size_ok(uint32_t size)
{
    return size >= 2 && size <= 4096 && is_power_of_2(size);
}

/*
 * A loaded queue: sizes, indices and its state machine within limits.  A
 * queue a backend feeds (@fed: virtio-tacc) has no ring and no CQ: its
 * completions go to the backend at once (the backend checks its FIFO
 * against its jobs, virtio-tacc.c).
 */
static const char *tacc_queue_bad(const TaccQueue *q, bool fed)
{
    bool busy = q->f_count || q->running || q->cqe_pending || q->list_on;

    if (fed) {
        if (q->sq_size || q->cq_size || q->sq_head || q->sq_tail ||
            q->cq_head || q->cq_tail || q->cqe_pending ||
            q->f_head >= TACC_FIFO_DEPTH || q->f_count > TACC_FIFO_DEPTH ||
            (q->ctrl & ~(TACC_Q_CTRL_ENABLE | TACC_Q_CTRL_IRQ))) {
            return "a virtio-tacc queue with a ring, a CQ or a bad FIFO";
        }
        return (q->running || q->list_on) && !q->f_count
               ? "a running queue with an empty FIFO" : NULL;
    }

    if ((q->sq_size && !tacc_ring_size_ok(q->sq_size)) ||
        (q->cq_size && !tacc_ring_size_ok(q->cq_size))) {
        return "ring size";
    }
    if ((q->sq_size ? q->sq_head >= q->sq_size || q->sq_tail >= q->sq_size
                    : q->sq_head || q->sq_tail)) {
        return "SQ head/tail beyond the ring";
    }
    if ((q->cq_size ? q->cq_head >= q->cq_size || q->cq_tail >= q->cq_size
                    : q->cq_head || q->cq_tail)) {
        return "CQ head/tail beyond the ring";
    }
    if (q->f_head >= TACC_FIFO_DEPTH || q->f_count > TACC_FIFO_DEPTH) {
        return "FIFO index";
    }
    if (q->ctrl & ~(TACC_Q_CTRL_ENABLE | TACC_Q_CTRL_IRQ)) {
        return "queue control";
    }
    if ((busy || (q->ctrl & TACC_Q_CTRL_ENABLE)) &&
        (!q->sq_size || !q->cq_size || (q->sq_base & 0xfff) ||
         (q->cq_base & 0xfff))) {
        return "a queue with work but no valid ring";
    }
    if ((q->running || q->list_on) && !q->f_count) {
        return "a running queue with an empty FIFO";
    }
    return NULL;
}

static int tacc_func_pre_save(void *opaque)
{
    TaccFunc *f = opaque;

    f->mig_sample_dev = timer_pending(&f->sample_timer)
        ? timer_expire_time_ns(&f->sample_timer) + f->pf->dev_clock_off : -1;
    return 0;
}

static int tacc_func_post_load(void *opaque, int version_id)
{
    TaccFunc *f = opaque;

    for (int qi = 0; qi < TACC_NUM_QUEUES; qi++) {
        const char *bad = tacc_queue_bad(&f->q[qi], f->ops);

        if (bad) {
            error_report("tacc: migration: fn%d queue %d: %s (sq %u/%u/%u, "
                         "cq %u/%u/%u, fifo %u+%u)", f->fn, qi, bad,
                         f->q[qi].sq_size, f->q[qi].sq_head, f->q[qi].sq_tail,
                         f->q[qi].cq_size, f->q[qi].cq_head, f->q[qi].cq_tail,
                         f->q[qi].f_head, f->q[qi].f_count);
            return -EINVAL;
        }
    }
    for (int c = 0; c < TACC_NUM_CLASSES; c++) {
        if (f->rr_queue[c] >= TACC_NUM_QUEUES) {
            error_report("tacc: migration: fn%d: round-robin queue %u",
                         f->fn, f->rr_queue[c]);
            return -EINVAL;
        }
    }
    if (f->mig_sample_dev < -1) {
        error_report("tacc: migration: fn%d: sample deadline", f->fn);
        return -EINVAL;
    }
    return 0;
}

/* What every function kind has (the PF, a VF, virtio-tacc): no PCI state */
const VMStateDescription tacc_vmstate_func_regs = {
    .name = "tacc/func-regs",
    .version_id = 1,
    .minimum_version_id = 1,
    .pre_save = tacc_func_pre_save,
    .post_load = tacc_func_post_load,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT32(ctrl, TaccFunc),
        VMSTATE_UINT32(status_fatal, TaccFunc),
        VMSTATE_UINT32(irq_status, TaccFunc),
        VMSTATE_UINT32(irq_mask, TaccFunc),
        VMSTATE_UINT32(scratch, TaccFunc),
        VMSTATE_UINT64_ARRAY(ptbr, TaccFunc, TACC_NUM_CONTEXTS),
        VMSTATE_UINT64(fault_addr, TaccFunc),
        VMSTATE_UINT64(fault_tag, TaccFunc),
        VMSTATE_UINT32(fault_info, TaccFunc),
        VMSTATE_UINT32_ARRAY(clk_latch, TaccFunc, 2),
        VMSTATE_UINT32(tlb_inv_seq, TaccFunc),
        VMSTATE_UINT32(tlb_inv_done, TaccFunc),
        VMSTATE_UINT64(trace_base, TaccFunc),
        VMSTATE_UINT64(trace_wb, TaccFunc),
        VMSTATE_UINT32(trace_size, TaccFunc),
        VMSTATE_UINT32(trace_ctrl, TaccFunc),
        VMSTATE_UINT32(trace_prod, TaccFunc),
        VMSTATE_UINT32(trace_cons, TaccFunc),
        VMSTATE_UINT32(trace_dropped, TaccFunc),
        VMSTATE_UINT32(trace_seq, TaccFunc),
        VMSTATE_UINT64(sample_base, TaccFunc),
        VMSTATE_UINT64(sample_wb, TaccFunc),
        VMSTATE_UINT64(sample_seq, TaccFunc),
        VMSTATE_UINT32(sample_size, TaccFunc),
        VMSTATE_UINT32(sample_period, TaccFunc),
        VMSTATE_UINT32(sample_prod, TaccFunc),
        VMSTATE_UINT32(sample_cons, TaccFunc),
        VMSTATE_UINT32(sample_dropped, TaccFunc),
        VMSTATE_INT64(mig_sample_dev, TaccFunc),
        VMSTATE_STRUCT_ARRAY(q, TaccFunc, TACC_NUM_QUEUES, 1,
                             tacc_vmstate_queue, TaccQueue),
        VMSTATE_UINT64_ARRAY(cnt, TaccFunc, TACC_SAMPLE_SLOTS),
        VMSTATE_UINT64_ARRAY(busy_ps, TaccFunc, TACC_NUM_ENGINES),
        VMSTATE_UINT64(stall_ps, TaccFunc),
        VMSTATE_UINT8_ARRAY(rr_queue, TaccFunc, TACC_NUM_CLASSES),
        VMSTATE_END_OF_LIST()
    }
};

/* A PCI function (PF, VF): config space, MSI-X and AER log, then the rest */
static const VMStateDescription tacc_vmstate_func = {
    .name = "tacc/func",
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (const VMStateField[]) {
        VMSTATE_PCI_DEVICE(parent_obj, TaccFunc),
        VMSTATE_MSIX(parent_obj, TaccFunc),
        VMSTATE_STRUCT(parent_obj.exp.aer_log, TaccFunc, 0,
                       vmstate_pcie_aer_log, PCIEAERLog),
        {
            .name = "regs",
            .version_id = 1,
            .vmsd = &tacc_vmstate_func_regs,
            .size = sizeof(TaccFunc),
            .flags = VMS_STRUCT,
            .offset = 0,
        },
        VMSTATE_END_OF_LIST()
    }
};

/* The sample timer again, at its deadline in device time. */
static void tacc_func_rearm(TaccFunc *f)
{
    if (f->mig_sample_dev >= 0) {
        timer_mod(&f->sample_timer, f->mig_sample_dev - f->pf->dev_clock_off);
    } else {
        timer_del(&f->sample_timer);
    }
}

/* The units of function @f and its queues agree. */
static bool tacc_units_match(TaccFunc *f)
{
    TaccState *s = f->pf;
    int running[TACC_NUM_QUEUES] = { 0 };

    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccUnit *u = &s->unit[i];

        if (u->busy && u->fn == f->fn) {
            running[u->q]++;
        }
    }
    for (int qi = 0; qi < TACC_NUM_QUEUES; qi++) {
        if (running[qi] != (f->q[qi].running ? 1 : 0)) {
            error_report("tacc: migration: fn%d queue %d: %d commands on "
                         "units, queue %s", f->fn, qi, running[qi],
                         f->q[qi].running ? "running" : "not running");
            return false;
        }
    }
    return true;
}

/*
 * A function other than the PF was loaded (after the PF's section): its
 * queues agree with the PF's units, its sample timer runs again.
 */
bool tacc_vmstate_func_loaded(TaccFunc *f)
{
    if (!tacc_units_match(f)) {
        return false;
    }
    tacc_func_rearm(f);
    return true;
}

/* -------------------------------------------------------------- the PF -- */

static int tacc_pf_pre_save(void *opaque)
{
    TaccState *s = opaque;

    /* the VM stop quiesced the device; anything left cannot be saved */
    if (s->host_unit || s->orphans || s->reset_pending || s->in_run ||
        s->depth) {
        error_report("tacc: migration: host work in progress (%s): the "
                     "device is not quiesced", s->host_unit ? "a command's" :
                     s->orphans ? "an aborted GEMM's" :
                     s->reset_pending ? "a deferred reset" : "an access");
        return -EBUSY;
    }
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccUnit *u = &s->unit[i];

        if (u->busy &&
            (u->res.work || (u->res.gemm && u->res.gemm->in_pool))) {
            error_report("tacc: migration: unit %d has host work in progress",
                         i);
            return -EBUSY;
        }
    }
    if (tacc_vfmig_busy(s)) {
        error_report("tacc: migration: a VF is stopped or dirty-logged for "
                     "a VF migration (docs/hardware.md section 16)");
        return -EBUSY;
    }
    s->mig_dev_ns = tacc_dev_ns(s);
    s->mig_timer_dev = timer_pending(&s->timer)
        ? timer_expire_time_ns(&s->timer) + s->dev_clock_off : -1;
    trace_tacc_vmstate_save(s->mig_dev_ns, s->mig_timer_dev);
    return 0;
}

/* A loaded unit: its function, queue, engine and progress within limits. */
static const char *tacc_unit_bad(TaccState *s, int i, TaccUnit *u)
{
    const TaccResult *r = &u->res;
    const struct tacc_desc *d = &u->cmd.d;

    if (!u->busy) {
        return r->gemm ? "an idle unit with a GEMM result" : NULL;
    }
    /* the virtio-tacc function's units: its section checks them (later) */
    if (u->fn < 0 ||
        (u->fn > s->total_vfs && (u->fn != TACC_FN_VIRTIO || !s->virtio)) ||
        u->q < 0 || u->q >= TACC_NUM_QUEUES) {
        return "function or queue";
    }
    if (i < TACC_NUM_ENGINES ? u->engine != i
        : i != TACC_UNIT_LOCAL(u->fn, u->q) || u->engine != TACC_ENGINE_LOCAL) {
        return "engine";
    }
    if (u->phase < TACC_PHASE_PRE || u->phase > TACC_PHASE_POST) {
        return "phase";
    }
    if (r->link_kind < TACC_LINK_NONE || r->link_kind > TACC_LINK_D2H ||
        (r->link_kind == TACC_LINK_NONE ? u->link_left != 0
                                        : u->link_left > r->link_payload) ||
        r->link_host_off >= TACC_LINK_RD_BOUNDARY ||
        r->link_dev_off >= TACC_LINK_RD_BOUNDARY) {
        return "link transfer";
    }
    if (r->land && ((d->opcode != TACC_OP_COPY_H2D &&
                     d->opcode != TACC_OP_COPY_D2H) ||
                    r->land_pos > r->link_payload ||
                    r->land_len > r->link_payload - r->land_pos)) {
        return "copy landing";
    }
    if (r->work != TACC_WORK_NONE) {
        return "host work";
    }
    if (r->gemm) {
        uint64_t batch = d->gemm.batch ? d->gemm.batch : 1;

        if (d->opcode != TACC_OP_GEMM || r->gemm->m != d->gemm.m ||
            r->gemm->n != d->gemm.n || r->gemm->batch != batch ||
            (d->gemm.dtype_c != TACC_DT_FP32 &&
             d->gemm.dtype_c != TACC_DT_BF16) ||
            r->gemm->host_bytes > s->gemm_host_max) {
            return "GEMM result does not match its descriptor";
        }
    }
    return NULL;
}

static int tacc_pf_post_load(void *opaque, int version_id)
{
    TaccState *s = opaque;
    const char *bad = NULL;
    int64_t now;

    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        bad = tacc_unit_bad(s, i, &s->unit[i]);
        if (bad) {
            error_report("tacc: migration: unit %d: %s (fn %d, queue %d, "
                         "engine %d, phase %d)", i, bad, s->unit[i].fn,
                         s->unit[i].q, s->unit[i].engine, s->unit[i].phase);
            return -EINVAL;
        }
    }
    for (int c = 0; c < TACC_NUM_CLASSES; c++) {
        if (s->rr_fn[c] >= TACC_NUM_FUNCS) {
            bad = "round-robin function";
        }
    }
    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        if (s->arb_weight[fn] > TACC_ARB_WEIGHT_MAX) {
            bad = "arbitration weight";
        }
    }
    for (int v = 0; v < TACC_MAX_VFS; v++) {
        if (!s->vf_queue_mask[v] ||
            (s->vf_queue_mask[v] & ~TACC_QUEUE_MASK_ALL)) {
            bad = "VF queue mask";
        }
    }
    if (s->fi_hang_engine < -1 || s->fi_hang_engine >= TACC_NUM_ENGINES) {
        bad = "hung engine";
    } else if (s->lnk_gen < 3 || s->lnk_gen > s->link_gen ||
               !is_power_of_2(s->lnk_width) || s->lnk_width > s->link_width) {
        bad = "link speed or width";
    } else if (!is_power_of_2(s->mps) || s->mps < 128 || s->mps > s->mps_cap ||
               !is_power_of_2(s->mrrs) || s->mrrs < 128 ||
               s->mrrs > s->mrrs_cap) {
        bad = "MPS or MRRS";
    } else if (s->time_scale < 1 || s->time_scale > 10000000) {
        bad = "time scale";
    } else if (s->lpm.state < TACC_LINKPM_L0 || s->lpm.state > TACC_LINKPM_L1 ||
               s->lpm.sub < TACC_LINKPM_L1_0 || s->lpm.sub > TACC_LINKPM_L1_2) {
        bad = "link power state";
    } else if (s->tc_nbuf >= ARRAY_SIZE(s->tc_buf) ||
               (s->tc_nbuf && (s->tc_size < 2 ||
                               s->tc_size > TACC_TLPCAP_MAX_ENTRIES ||
                               !is_power_of_2(s->tc_size)))) {
        bad = "TLP capture buffer";
    } else if (s->mig_dev_ns < 0 || s->mig_timer_dev < -1) {
        bad = "device time";
    }
    if (bad) {
        error_report("tacc: migration: %s out of range", bad);
        return -EINVAL;
    }
    if (!tacc_units_match(&s->func)) {
        return -EINVAL;
    }

    /* host state the stream does not carry */
    memset(s->gemm_host_bytes, 0, sizeof(s->gemm_host_bytes));
    for (int i = 0; i < TACC_NUM_UNITS; i++) {
        TaccGemmJob *j = s->unit[i].res.gemm;

        if (s->unit[i].busy && j) {
            j->fn = s->unit[i].fn;
            j->s = s;
            s->gemm_host_bytes[j->fn] += j->host_bytes;
        }
    }
    s->host_unit = NULL;
    s->in_run = false;
    tacc_tlb_invalidate(s, -1, -1);     /* refilled from the page tables */

    /* device time goes on from the saved value */
    now = qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL);
    s->dev_clock_off = s->mig_dev_ns - now;
    if (s->mig_timer_dev >= 0) {
        timer_mod(&s->timer, s->mig_timer_dev - s->dev_clock_off);
    } else {
        timer_del(&s->timer);
    }
    tacc_func_rearm(&s->func);
    s->mig_reclock = true;
    trace_tacc_vmstate_load(s->mig_dev_ns, s->dev_clock_off);
    return 0;
}

static void tacc_timer_shift(QEMUTimer *t, int64_t delta)
{
    if (timer_pending(t)) {
        timer_mod(t, timer_expire_time_ns(t) - delta);
    }
}

/*
 * The VM that loaded this device starts running.  The PF's section loads before
 * QEMU's own "timer" section (its priority is higher), so post_load read the
 * destination's virtual clock before the source's value was restored: under TCG
 * or KVM that put the source's whole virtual time into the offset, and device
 * time jumped forward by it.  Now the clock reads what it will run on: the
 * offset is set again, and the timers armed from it move by the difference.
 * Under qtest (its clock is not migrated) the difference is 0.
 */
void tacc_vmstate_reclock(TaccState *s)
{
    int64_t off = s->mig_dev_ns - qemu_clock_get_ns(QEMU_CLOCK_VIRTUAL);
    int64_t delta = off - s->dev_clock_off;

    s->mig_reclock = false;
    if (!delta) {
        return;
    }
    s->dev_clock_off = off;
    tacc_timer_shift(&s->timer, delta);
    for (int fn = 0; fn < TACC_NUM_FUNCS; fn++) {
        TaccFunc *f = tacc_func(s, fn);

        if (f) {
            tacc_timer_shift(&f->sample_timer, delta);
        }
    }
    trace_tacc_vmstate_load(s->mig_dev_ns, s->dev_clock_off);
}

/*
 * VM_PAUSED_NS (hw 1.7): the host time stopped so far, and the host clock at
 * which the stop that this migration is part of began; the destination adds
 * the rest of that stop when it runs.  A subsection: streams without it load
 * as a device that never stood still.
 */
static bool tacc_paused_needed(void *opaque)
{
    TaccState *s = opaque;

    return s->vm_paused_ns || s->vm_stop_host_ns;
}

static const VMStateDescription tacc_vmstate_paused = {
    .name = "tacc/vm-paused",
    .version_id = 1,
    .minimum_version_id = 1,
    .needed = tacc_paused_needed,
    .fields = (const VMStateField[]) {
        VMSTATE_UINT64(vm_paused_ns, TaccState),
        VMSTATE_INT64(vm_stop_host_ns, TaccState),
        VMSTATE_END_OF_LIST()
    }
};

const VMStateDescription tacc_vmstate_pf = {
    .name = "tacc",
    .version_id = TACC_VMSTATE_VERSION,
    .minimum_version_id = TACC_VMSTATE_VERSION,
    .priority = MIG_PRI_IOMMU,  /* before the VFs (and after the vIOMMU) */
    .pre_save = tacc_pf_pre_save,
    .post_load = tacc_pf_post_load,
    .fields = (const VMStateField[]) {
        /* first: its config space enables the VFs, which resets them */
        VMSTATE_STRUCT(func, TaccState, 1, tacc_vmstate_func, TaccFunc),
        /* properties that shape the state: must match */
        VMSTATE_UINT64_EQUAL(devmem_size, TaccState,
                             "devmem-size differs from the source's"),
        VMSTATE_UINT8_EQUAL(total_vfs, TaccState,
                            "sriov-max-vfs differs from the source's"),
        VMSTATE_UINT8_EQUAL(link_gen, TaccState,
                            "link-gen differs from the source's"),
        VMSTATE_UINT8_EQUAL(link_width, TaccState,
                            "link-width differs from the source's"),
        VMSTATE_UINT32_EQUAL(mps_cap, TaccState,
                             "mps differs from the source's"),
        VMSTATE_UINT32_EQUAL(mrrs_cap, TaccState,
                             "mrrs differs from the source's"),
        VMSTATE_INT64(mig_dev_ns, TaccState),
        VMSTATE_INT64(mig_timer_dev, TaccState),
        VMSTATE_UINT8(lnk_gen, TaccState),
        VMSTATE_UINT8(lnk_width, TaccState),
        VMSTATE_UINT32(mps, TaccState),
        VMSTATE_UINT32(mrrs, TaccState),
        VMSTATE_UINT32(time_scale, TaccState),
        VMSTATE_INT32(fi_hang_engine, TaccState),
        VMSTATE_BOOL(fi_fail_next_dma, TaccState),
        VMSTATE_BOOL(fi_corrupt_next_cqe, TaccState),
        VMSTATE_BOOL(fi_fatal, TaccState),
        VMSTATE_UINT64_ARRAY(vf_mem_base, TaccState, TACC_MAX_VFS),
        VMSTATE_UINT64_ARRAY(vf_mem_size, TaccState, TACC_MAX_VFS),
        VMSTATE_UINT64(virtio_mem_base, TaccState),
        VMSTATE_UINT64(virtio_mem_size, TaccState),
        VMSTATE_UINT32_ARRAY(arb_weight, TaccState, TACC_NUM_FUNCS),
        VMSTATE_UINT32_ARRAY(vf_queue_mask, TaccState, TACC_MAX_VFS),
        VMSTATE_STRUCT_ARRAY(unit, TaccState, TACC_NUM_UNITS, 1,
                             tacc_vmstate_unit, TaccUnit),
        VMSTATE_UINT64(ev_ps, TaccState),
        VMSTATE_UINT64_ARRAY(link_free_ps, TaccState, 2),
        VMSTATE_UINT64_ARRAY(link_busy_ps, TaccState, 2),
        VMSTATE_STRUCT(ph_pool, TaccState, 1, tacc_vmstate_pool,
                       TaccPostedPool),
        VMSTATE_STRUCT(pd_pool, TaccState, 1, tacc_vmstate_pool,
                       TaccPostedPool),
        VMSTATE_STRUCT(lpm, TaccState, 1, tacc_vmstate_linkpm, TaccLinkPm),
        VMSTATE_UINT64(lpm_last_ps, TaccState),
        VMSTATE_UINT64(lpm_wake_ps, TaccState),
        VMSTATE_UINT64(lpm_fetch_ps, TaccState),
        VMSTATE_UINT64_ARRAY(gcnt, TaccState, TACC_SAMPLE_SLOTS),
        VMSTATE_UINT64(cnt_gen, TaccState),
        VMSTATE_UINT8_ARRAY(rr_fn, TaccState, TACC_NUM_CLASSES),
        VMSTATE_UINT64_2DARRAY(deficit, TaccState, TACC_NUM_CLASSES,
                               TACC_NUM_FUNCS),
        VMSTATE_STRUCT(gt, TaccState, 1, tacc_vmstate_gt, TaccGroundTruth),
        VMSTATE_UINT64(tc_base, TaccState),
        VMSTATE_UINT64(tc_wb, TaccState),
        VMSTATE_UINT64(tc_addr_lo, TaccState),
        VMSTATE_UINT64(tc_addr_hi, TaccState),
        VMSTATE_UINT32(tc_size, TaccState),
        VMSTATE_UINT32(tc_ctrl, TaccState),
        VMSTATE_UINT32(tc_prod, TaccState),
        VMSTATE_UINT32(tc_cons, TaccState),
        VMSTATE_UINT32(tc_dropped, TaccState),
        VMSTATE_UINT32(tc_seq, TaccState),
        VMSTATE_UINT32(tc_funcs, TaccState),
        VMSTATE_UINT32(tc_kinds, TaccState),
        VMSTATE_UINT32(tc_nbuf, TaccState),
        VMSTATE_UINT16_ARRAY(tc_tag, TaccState, TACC_NUM_FUNCS),
        /* TLP records not yet written to the ring, in the guest's format */
        VMSTATE_BUFFER_UNSAFE(tc_buf, TaccState, 0,
                              sizeof(((TaccState *)0)->tc_buf)),
        VMSTATE_UINT64(config_dma_refused, TaccState),
        VMSTATE_UINT64(reentrant_refused, TaccState),
        VMSTATE_UINT64(fetch_seq, TaccState),
        VMSTATE_END_OF_LIST()
    },
    .subsections = (const VMStateDescription * const []) {
        &tacc_vmstate_paused,
        NULL
    }
};

/* -------------------------------------------------------------- a VF -- */

static int tacc_vf_post_load(void *opaque, int version_id)
{
    TaccFunc *f = opaque;

    /* the PF's section came first: its units and device time are loaded */
    return tacc_vmstate_func_loaded(f) ? 0 : -EINVAL;
}

const VMStateDescription tacc_vmstate_vf = {
    .name = "tacc-vf",
    .version_id = TACC_VMSTATE_VERSION,
    .minimum_version_id = TACC_VMSTATE_VERSION,
    .post_load = tacc_vf_post_load,
    .fields = (const VMStateField[]) {
        {
            .name = "func",
            .version_id = 1,
            .vmsd = &tacc_vmstate_func,
            .size = sizeof(TaccFunc),
            .flags = VMS_STRUCT,
            .offset = 0,
        },
        VMSTATE_END_OF_LIST()
    }
};

/* ------------------------------------ one VF's state, for VF migration -- */

/*
 * The stream ends with this byte: the loader looks one byte past each
 * structure for a subsection, which must not be the end of the buffer.
 */
#define TACC_REGS_END   0xfe

/*
 * The registers and queues of function @f in the section-15 encoding
 * ("tacc/func-regs": no PCI state) into a new buffer (tacc-vfmig.c puts
 * it in a VF state blob).  Returns its length; *@out is g_free'd by the
 * caller.
 */
size_t tacc_vmstate_func_save_buf(TaccFunc *f, uint8_t **out)
{
    g_autoptr(QIOChannelBuffer) bioc = qio_channel_buffer_new(4096);
    QEMUFile *qf = qemu_file_new_output(QIO_CHANNEL(bioc));
    size_t len;

    vmstate_save_state(qf, &tacc_vmstate_func_regs, f, NULL);
    qemu_put_byte(qf, TACC_REGS_END);
    qemu_fflush(qf);
    len = bioc->usage;
    *out = g_memdup2(bioc->data, len);
    qemu_fclose(qf);
    return len;
}

static int tacc_vmstate_func_load_into(TaccFunc *f, const uint8_t *buf,
                                       size_t len)
{
    g_autoptr(QIOChannelBuffer) bioc = qio_channel_buffer_new(len);
    QEMUFile *qf;
    int ret;

    if (!len) {
        return -EINVAL;
    }
    memcpy(bioc->data, buf, len);
    bioc->usage = len;
    qf = qemu_file_new_input(QIO_CHANNEL(bioc));
    ret = vmstate_load_state(qf, &tacc_vmstate_func_regs, f, 1);
    if (!ret && qemu_get_byte(qf) != TACC_REGS_END) {
        ret = -EINVAL;
    }
    if (!ret) {
        ret = qemu_file_get_error(qf);
    }
    qemu_fclose(qf);
    return ret;
}

/*
 * Load the output of tacc_vmstate_func_save_buf into function @f, which has
 * nothing on the units (a stopped VF).  The stream is checked first on a
 * scratch copy of @f with the same post_load checks as a migration (the
 * queues' limits, the units agreeing: none of its queues may be running);
 * @f changes only when it passes.  Returns 0 or a negative errno.
 */
int tacc_vmstate_func_load_buf(TaccFunc *f, const uint8_t *buf, size_t len)
{
    g_autofree TaccFunc *tmp = g_memdup2(f, sizeof(*f));
    int ret = tacc_vmstate_func_load_into(tmp, buf, len);

    if (!ret && !tacc_units_match(tmp)) {
        ret = -EINVAL;
    }
    if (ret) {
        return ret;
    }
    /* the same bytes pass the same checks */
    return tacc_vmstate_func_load_into(f, buf, len);
}
