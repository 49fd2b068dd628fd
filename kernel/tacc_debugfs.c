// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc debugfs, under /sys/kernel/debug/accel/<minor>/:
 *   queues, contexts, pagetables, fences, objects
 * and test knobs (root only, 0 = off) that widen race windows for tests:
 *   fault_ctx_delay_ms, free_job_delay_ms, scrub_delay_ms
 */
#include <linux/debugfs.h>
#include <linux/pm_runtime.h>
#include <linux/seq_file.h>

#include <drm/drm_file.h>

#include "tacc_drv.h"

static int queues_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	unsigned long flags;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];
		u32 sq_head = 0, cq_tail = 0, status = 0, depth = 0, n = 0;
		struct tacc_job *job;
		bool up = tdev->hw_up;

		if (up) {
			sq_head = tacc_qrd(q, TACC_Q_SQ_HEAD);
			cq_tail = tacc_qrd(q, TACC_Q_CQ_TAIL);
			status = tacc_qrd(q, TACC_Q_STATUS);
			depth = tacc_qrd(q, TACC_Q_DEPTH);
		}
		spin_lock_irqsave(&q->lock, flags);
		list_for_each_entry(job, &q->inflight, node)
			n++;
		seq_printf(m, "queue %u: sq_iova 0x%llx cq_iova 0x%llx sq_tail %u cq_head %u hw[%s sq_head %u cq_tail %u status 0x%x depth %u] inflight %u next_hw_job %u done %llu failed %llu resets %llu bad_cqes %llu irqs %llu credits %d\n",
			   i, (u64)q->sq_dma, (u64)q->cq_dma, q->sq_tail, q->cq_head,
			   up ? "up" : "off", sq_head, cq_tail, status, depth, n, q->next_hw_job,
			   q->jobs_done, q->jobs_failed, q->resets, q->bad_cqes, q->irqs,
			   atomic_read(&q->sched.credit_count));
		spin_unlock_irqrestore(&q->lock, flags);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(queues);

static int contexts_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	u32 i, q;

	mutex_lock(&tdev->ctx_lock);
	for (i = 0; i < tdev->num_contexts; i++) {
		struct tacc_ctx *ctx = tdev->ctxs[i];

		if (!ctx)
			continue;
		seq_printf(m,
			   "ctx %u: pid %d comm %s bos %d userptr_pages %ld last_seqno %llu faults %llu last_fault 0x%llx resets %llu%s\n",
			   i, ctx->pid, ctx->comm, atomic_read(&ctx->nr_bos),
			   atomic_long_read(&ctx->userptr_pages), ctx->last_seqno,
			   (u64)atomic64_read(&ctx->faults), (u64)atomic64_read(&ctx->fault_addr),
			   (u64)atomic64_read(&ctx->resets), ctx->file ? "" : " (closed)");
		for (q = 0; q < tdev->num_queues; q++)
			seq_printf(m, "  queue %u: inflight %d jobs %llu busy_ns %llu\n", q,
				   atomic_read(&ctx->inflight[q]),
				   (u64)atomic64_read(&ctx->jobs[q]),
				   (u64)atomic64_read(&ctx->busy_ns[q]));
	}
	mutex_unlock(&tdev->ctx_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(contexts);

static int pagetables_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	u32 i;

	mutex_lock(&tdev->ctx_lock);
	for (i = 0; i < tdev->num_contexts; i++) {
		struct tacc_ctx *ctx = tdev->ctxs[i];

		if (!ctx)
			continue;
		seq_printf(m, "ctx %u:\n", i);
		tacc_vm_dump(m, &ctx->vm);
	}
	mutex_unlock(&tdev->ctx_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(pagetables);

static int fences_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	unsigned long flags;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];
		struct tacc_job *job;

		spin_lock_irqsave(&q->lock, flags);
		seq_printf(m, "queue %u: context %llu last seqno %llu\n", i, q->fence_ctx,
			   q->fence_seqno);
		list_for_each_entry(job, &q->inflight, node)
			seq_printf(m, "  hw fence %llu: ctx %u seqno %llu hw_job %u tag 0x%llx cmds %u signaled %d\n",
				   job->hw_fence->base.seqno, job->ctx->id, job->seqno, job->hw_job,
				   job->tag, job->num_cmds,
				   dma_fence_is_signaled_locked(&job->hw_fence->base));
		spin_unlock_irqrestore(&q->lock, flags);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(fences);

static int objects_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	struct tacc_live *l = &tdev->live;

	seq_printf(m, "contexts %d\nbos %d\nmappings %d\njobs %d\nfences %d\npt_pages %d\nuserptr_pages %ld\ndevmem_bytes %ld\n",
		   atomic_read(&l->ctxs), atomic_read(&l->bos), atomic_read(&l->mappings),
		   atomic_read(&l->jobs), tacc_fence_ctx_live(tdev->fctx),
		   atomic_read(&l->pt_pages),
		   atomic_long_read(&l->userptr_pages), atomic_long_read(&l->devmem_bytes));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(objects);

/* Test knobs: delays at named points, for tests/vm/test_isolation_*.py. */
static void tacc_debugfs_knobs(struct tacc_device *tdev, struct dentry *root)
{
	debugfs_create_u32("fault_ctx_delay_ms", 0600, root, &tdev->fault_ctx_delay_ms);
	debugfs_create_u32("free_job_delay_ms", 0600, root, &tdev->free_job_delay_ms);
	debugfs_create_u32("scrub_delay_ms", 0600, root, &tdev->scrub_delay_ms);
	debugfs_create_u32("recover_delay_ms", 0600, root, &tdev->recover_delay_ms);
	debugfs_create_u32("resume_delay_ms", 0600, root, &tdev->resume_delay_ms);
}

/* Device-memory scrubbing (tacc_scrub.c). */
static int scrub_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;

	seq_printf(m, "fill_jobs %lld\nfill_bytes %lld\nfailed %lld\npending %d\nreleased %d\n",
		   (s64)atomic64_read(&tdev->scrub_jobs), (s64)atomic64_read(&tdev->scrub_bytes),
		   (s64)atomic64_read(&tdev->scrub_failed), atomic_read(&tdev->scrub_pending),
		   atomic_read(&tdev->scrub_gen));
	seq_printf(m, "jobs_unfreed %d\ntlb_inv_seq %u\n",
		   tdev->kctx ? atomic_read(&tdev->kctx->inflight[0]) : 0,
		   READ_ONCE(tdev->tlb_seq));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(scrub);

/* TLB invalidations the device did not complete, and what they cost. */
static int tlb_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;

	seq_printf(m, "inv_timeouts %lld\nresets %lld\nleaked_tables %d\nleaked_bos %d\n",
		   (s64)atomic64_read(&tdev->tlb_inv_timeouts),
		   (s64)atomic64_read(&tdev->tlb_recoveries),
		   atomic_read(&tdev->pt_leaked), atomic_read(&tdev->bo_leaked));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(tlb);

/* The per-VF policy as the device holds it (PF registers, read live). */
static int vf_policy_show(struct seq_file *m, void *unused)
{
	struct tacc_device *tdev = m->private;
	struct device *dev = tacc_to_dev(tdev);
	int i, ret;

	ret = pm_runtime_resume_and_get(dev);
	if (ret)
		return ret;
	seq_puts(m, "# vf devmem_base devmem_size queue_mask weight\n");
	for (i = 0; i < TACC_MAX_VFS; i++)
		seq_printf(m, "%d 0x%llx 0x%llx 0x%x %u\n", i + 1,
			   tacc_rd64(tdev, TACC_REG_VF_DEVMEM_BASE(i)),
			   tacc_rd64(tdev, TACC_REG_VF_DEVMEM_SIZE(i)),
			   tacc_rd(tdev, TACC_REG_VF_QUEUE_MASK(i)),
			   tacc_rd(tdev, TACC_REG_ARB_WEIGHT(i + 1)));
	pm_runtime_mark_last_busy(dev);
	pm_runtime_put_autosuspend(dev);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vf_policy);

void tacc_debugfs_init(struct drm_minor *minor)
{
	struct tacc_device *tdev = to_tacc_dev(minor->dev);
	struct dentry *root = minor->debugfs_root;

	if (IS_ERR_OR_NULL(root))
		return;
	debugfs_create_file("queues", 0444, root, tdev, &queues_fops);
	debugfs_create_file("contexts", 0444, root, tdev, &contexts_fops);
	debugfs_create_file("pagetables", 0444, root, tdev, &pagetables_fops);
	debugfs_create_file("fences", 0444, root, tdev, &fences_fops);
	debugfs_create_file("objects", 0444, root, tdev, &objects_fops);
	tacc_debugfs_knobs(tdev, root);
	debugfs_create_file("scrub", 0444, root, tdev, &scrub_fops);
	debugfs_create_file("tlb", 0444, root, tdev, &tlb_fops);
	if (!tdev->is_vf && (tdev->caps & TACC_CAP_SRIOV) && (tdev->caps & TACC_CAP_VF_POLICY))
		debugfs_create_file("vf_policy", 0444, root, tdev, &vf_policy_fops);
}
