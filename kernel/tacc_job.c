// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc job submission: commands referencing BO handles and offsets are
 * validated and translated into device descriptors; one drm_sched per
 * hardware queue; completion entries signal hardware fences; a timed-out
 * job resets its queue, gets -ETIMEDOUT, and the others are replayed.
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/overflow.h>
#include <linux/pm_runtime.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>
#include <drm/drm_syncobj.h>

#include "tacc_cmd.h"
#include "tacc_drv.h"
#include "tacc_trace.h"

/* BO kinds tacc_resolve() accepts: the order of enum tacc_cmd_kind */
enum { TACC_T_ANY = TACC_CMD_ANY, TACC_T_HOST = TACC_CMD_HOST, TACC_T_DEV = TACC_CMD_DEV };

static int tacc_status_errno(u32 status)
{
	switch (status) {
	case TACC_ST_OK:
		return 0;
	case TACC_ST_MMU_FAULT:
		return -EFAULT;
	case TACC_ST_DMA_ERROR:
		return -EIO;
	case TACC_ST_ABORTED:
		return -ECANCELED;
	default:
		return -EINVAL;
	}
}

/* ------------------------------------------------------------- queues ---- */

static void tacc_queue_write_job(struct tacc_queue *q, struct tacc_job *job)
{
	u32 i;

	for (i = 0; i < job->num_cmds; i++) {
		struct tacc_desc *d = &q->sq[q->sq_tail];

		memcpy(d, &job->descs[i], sizeof(*d));
		d->job = job->hw_job;
		q->sq_tail = (q->sq_tail + 1) % TACC_SQ_ENTRIES;
	}
}

static void tacc_queue_ring(struct tacc_queue *q)
{
	wmb();	/* descriptors before the doorbell */
	tacc_qwr(q, TACC_Q_SQ_TAIL, q->sq_tail);
}

/* Called with q->lock held: completion of one job. */
static void tacc_job_complete(struct tacc_queue *q, struct tacc_job *job, u32 status,
			      int error, u64 start, u64 end)
{
	struct tacc_device *tdev = q->tdev;
	struct tacc_ctx *ctx = job->ctx;

	list_del_init(&job->node);
	job->status = error;
	job->dev_start = start;
	job->dev_end = end;
	if (end > start) {
		u64 ns = tdev->clock_hz ? mul_u64_u32_div(end - start, NSEC_PER_SEC,
							  tdev->clock_hz) : end - start;
		atomic64_add(ns, &ctx->busy_ns[q->idx]);
	}
	atomic64_inc(&ctx->jobs[q->idx]);
	if (error) {
		dma_fence_set_error(&job->hw_fence->base, error);
		q->jobs_failed++;
	}
	q->jobs_done++;
	if (!ctx->kernel)	/* scrubs: not user jobs (debugfs "scrub") */
		trace_tacc_job_done(tacc_devid(tdev), ctx->id, q->idx, job->seqno, job->tag,
				    job->hw_job, status, error, start, end);
	dma_fence_signal_locked(&job->hw_fence->base);
}

static void tacc_queue_process_cq_locked(struct tacc_queue *q)
{
	u32 tail = tacc_qrd(q, TACC_Q_CQ_TAIL);
	bool any = false;

	if (tail >= TACC_CQ_ENTRIES) {
		q->bad_cqes++;
		return;
	}
	while (q->cq_head != tail) {
		struct tacc_cqe cqe;
		struct tacc_job *job, *tmp, *found = NULL;

		dma_rmb();
		memcpy(&cqe, &q->cq[q->cq_head], sizeof(cqe));
		q->cq_head = (q->cq_head + 1) % TACC_CQ_ENTRIES;
		any = true;

		list_for_each_entry(job, &q->inflight, node) {
			if (job->hw_job == cqe.job) {
				found = job;
				break;
			}
		}
		if (!found) {
			/*
			 * A corrupted completion (status 0xffff, job inverted
			 * by fault injection, or garbage): the queue completes
			 * in order, so it belongs to the oldest job in flight.
			 * Fail that job now rather than letting it time out.
			 */
			q->bad_cqes++;
			if (cqe.status != TACC_ST_CORRUPT || list_empty(&q->inflight))
				continue;
			found = list_first_entry(&q->inflight, struct tacc_job, node);
			tacc_job_complete(q, found, cqe.status, -EIO, 0, 0);
			continue;
		}
		/* in order per queue: earlier jobs lost their completion */
		list_for_each_entry_safe(job, tmp, &q->inflight, node) {
			if (job == found)
				break;
			q->bad_cqes++;
			tacc_job_complete(q, job, TACC_ST_ABORTED, -EIO, 0, 0);
		}
		tacc_job_complete(q, found, cqe.status, tacc_status_errno(cqe.status),
				  cqe.start, cqe.end);
	}
	if (any)
		tacc_qwr(q, TACC_Q_CQ_HEAD, q->cq_head);
}

void tacc_queue_process_cq(struct tacc_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	q->irqs++;
	if (READ_ONCE(q->tdev->hw_up))
		tacc_queue_process_cq_locked(q);
	spin_unlock_irqrestore(&q->lock, flags);
}

static void tacc_queue_hw_reset_locked(struct tacc_queue *q)
{
	int t;

	if (!tacc_queue_usable(q->tdev, q->idx))
		return;		/* outside the function's QUEUE_MASK: never enabled */
	tacc_qwr(q, TACC_Q_CTRL, TACC_Q_CTRL_RESET);
	for (t = 0; t < 1000; t++) {
		if (!(tacc_qrd(q, TACC_Q_CTRL) & TACC_Q_CTRL_RESET))
			break;
		udelay(1);
	}
	tacc_wr64(q->tdev, TACC_QUEUE_BASE(q->idx) + TACC_Q_SQ_BASE, q->sq_dma);
	tacc_qwr(q, TACC_Q_SQ_SIZE, TACC_SQ_ENTRIES);
	tacc_wr64(q->tdev, TACC_QUEUE_BASE(q->idx) + TACC_Q_CQ_BASE, q->cq_dma);
	tacc_qwr(q, TACC_Q_CQ_SIZE, TACC_CQ_ENTRIES);
	q->sq_tail = 0;
	q->cq_head = 0;
	tacc_qwr(q, TACC_Q_CQ_HEAD, 0);
	tacc_qwr(q, TACC_Q_CTRL, TACC_Q_CTRL_ENABLE | TACC_Q_CTRL_IRQ);
}

/* Probe and resume: no job is in flight. */
void tacc_queue_hw_setup(struct tacc_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	WARN_ON(!list_empty(&q->inflight));
	tacc_queue_hw_reset_locked(q);
	spin_unlock_irqrestore(&q->lock, flags);
}

/* ---------------------------------------------------------- scheduler ---- */

static struct dma_fence *tacc_run_job(struct drm_sched_job *sched_job)
{
	struct tacc_job *job = to_tacc_job(sched_job);
	struct tacc_queue *q = job->q;
	struct tacc_device *tdev = q->tdev;
	unsigned long flags;

	if (unlikely(sched_job->s_fence->finished.error))
		return NULL;

	spin_lock_irqsave(&q->lock, flags);
	if (unlikely(!tdev->hw_up || !q->sq)) {
		spin_unlock_irqrestore(&q->lock, flags);
		return ERR_PTR(-ENODEV);	/* unplugged: never ran */
	}
	job->hw_job = q->next_hw_job++;
	job->hw_fence->kernel = job->ctx->kernel;
	tacc_hw_fence_init(job->hw_fence, q);
	job->hw_fence_init = true;
	tacc_queue_write_job(q, job);
	list_add_tail(&job->node, &q->inflight);
	tacc_queue_ring(q);
	/*
	 * job_start carries every fact of the doorbell (the new SQ tail too), so a
	 * capture attaches one of the two; the doorbell stays for perf and ftrace.
	 */
	if (!job->ctx->kernel) {
		trace_tacc_job_start(tacc_devid(tdev), job->ctx->id, q->idx, job->seqno,
				     job->tag, job->hw_job, q->sq_tail);
		trace_tacc_doorbell(tacc_devid(tdev), job->ctx->id, q->idx, job->seqno,
				    job->tag, job->hw_job, q->sq_tail);
	}
	spin_unlock_irqrestore(&q->lock, flags);

	return dma_fence_get(&job->hw_fence->base);
}

static enum drm_gpu_sched_stat tacc_timedout_job(struct drm_sched_job *sched_job)
{
	struct tacc_job *bad = to_tacc_job(sched_job), *job;
	struct tacc_queue *q = bad->q;
	struct tacc_device *tdev = q->tdev;
	struct drm_sched_job *s_job;
	struct tacc_ctx *bad_ctx = NULL;
	u64 bad_seqno = 0, bad_tag = 0;
	unsigned long flags;

	mutex_lock(&tdev->reset_lock);
	if (tdev->in_reset) {
		/* a function reset fails every job: put it back for it */
		spin_lock(&q->sched.job_list_lock);
		list_add(&sched_job->list, &q->sched.pending_list);
		spin_unlock(&q->sched.job_list_lock);
		mutex_unlock(&tdev->reset_lock);
		return DRM_GPU_SCHED_STAT_NOMINAL;
	}
	drm_sched_stop(&q->sched, sched_job);
	if (bad->hw_fence_init)	/* the device's state before the queue is reset */
		tacc_coredump(tdev, "job timeout", q, bad);

	spin_lock_irqsave(&q->lock, flags);
	if (tdev->hw_up)
		tacc_queue_process_cq_locked(q);
	if (bad->hw_fence_init && !list_empty(&bad->node)) {
		/*
		 * drm_sched_start() below sees the failed fence and queues free_job:
		 * the job may be gone before the events are sent, so keep its facts.
		 */
		bad_ctx = tacc_ctx_get(bad->ctx);
		bad_seqno = bad->seqno;
		bad_tag = bad->tag;
		trace_tacc_reset(tacc_devid(tdev), bad->ctx->id, q->idx, bad->seqno,
				 bad->tag, -ETIMEDOUT);
		/* the queue is reset (the device drops the job) before its fence fails */
		if (tdev->hw_up)
			tacc_queue_hw_reset_locked(q);
		tacc_job_complete(q, bad, TACC_ST_ABORTED, -ETIMEDOUT, 0, 0);
		q->resets++;
		atomic64_inc(&bad->ctx->resets);
		if (tdev->hw_up) {
			/* replay the innocent jobs, in order */
			list_for_each_entry(job, &q->inflight, node)
				tacc_queue_write_job(q, job);
			if (!list_empty(&q->inflight))
				tacc_queue_ring(q);
		} else {
			struct tacc_job *tmp;

			list_for_each_entry_safe(job, tmp, &q->inflight, node)
				tacc_job_complete(q, job, TACC_ST_ABORTED, -ENODEV, 0, 0);
		}
	}
	spin_unlock_irqrestore(&q->lock, flags);

	/* re-attach the hardware fences drm_sched_stop() detached */
	list_for_each_entry(s_job, &q->sched.pending_list, list) {
		job = to_tacc_job(s_job);
		if (!s_job->s_fence->parent && job->hw_fence_init)
			s_job->s_fence->parent = dma_fence_get(&job->hw_fence->base);
	}
	drm_sched_start(&q->sched);
	mutex_unlock(&tdev->reset_lock);

	if (bad_ctx) {
		drm_warn(&tdev->drm, "queue %u: job %llu of context %u (pid %d) timed out, queue reset\n",
			 q->idx, bad_seqno, bad_ctx->id, bad_ctx->pid);
		tacc_genl_event(tdev, TACC_EVENT_HANG, bad_ctx, q->idx, 0, 0, bad_tag,
				bad_seqno, GFP_KERNEL);
		tacc_genl_event(tdev, TACC_EVENT_RESET, bad_ctx, q->idx, 0, 0, bad_tag,
				bad_seqno, GFP_KERNEL);
		tacc_ctx_put(bad_ctx);
	}
	return tdev->hw_up ? DRM_GPU_SCHED_STAT_NOMINAL : DRM_GPU_SCHED_STAT_ENODEV;
}

static void tacc_job_put_resources(struct tacc_job *job)
{
	u32 i;

	for (i = 0; i < job->num_bos; i++)
		drm_gem_object_put(job->bos[i]);
	kfree(job->bos);
	kfree(job->descs);
	if (job->hw_fence) {
		if (job->hw_fence_init)
			dma_fence_put(&job->hw_fence->base);
		else
			kfree(job->hw_fence);
	}
}

static void tacc_free_job(struct drm_sched_job *sched_job)
{
	struct tacc_job *job = to_tacc_job(sched_job);
	struct tacc_ctx *ctx = job->ctx;
	struct tacc_device *tdev = ctx->tdev;
	struct dma_fence *f;
	int status = sched_job->s_fence ? sched_job->s_fence->finished.error : 0;

	/*
	 * A failure is recorded first, then the fence leaves the table: a WAIT
	 * that finds no fence finds the record (tacc_wait_ioctl() looks in this
	 * order), whatever order the queues free their jobs in.
	 */
	tacc_failures_record(&ctx->failed, job->seqno, status);
	if (unlikely(READ_ONCE(tdev->free_job_delay_ms)))
		msleep(READ_ONCE(tdev->free_job_delay_ms));
	f = xa_erase(&ctx->jobs_xa, job->seqno);
	dma_fence_put(f);

	drm_sched_job_cleanup(sched_job);
	tacc_job_put_resources(job);
	atomic_dec(&ctx->inflight[job->q->idx]);
	if (!ctx->kernel)		/* scrub jobs: debugfs "scrub" */
		atomic_dec(&tdev->live.jobs);
	if (job->pm_ref) {
		pm_runtime_mark_last_busy(tacc_to_dev(tdev));
		pm_runtime_put_autosuspend(tacc_to_dev(tdev));
	}
	tacc_ctx_put(ctx);
	kfree(job);
}

static const struct drm_sched_backend_ops tacc_sched_ops = {
	.run_job = tacc_run_job,
	.timedout_job = tacc_timedout_job,
	.free_job = tacc_free_job,
};

static void tacc_queues_fini_action(struct drm_device *dev, void *data)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	u32 i;

	for (i = 0; i < TACC_NUM_QUEUES; i++) {
		struct tacc_queue *q = &tdev->queues[i];

		if (q->sched.ops)
			drm_sched_fini(&q->sched);
		if (q->sq)
			dma_free_coherent(tacc_to_dev(tdev), TACC_SQ_ENTRIES * TACC_DESC_SIZE,
					  q->sq, q->sq_dma);
		if (q->cq)
			dma_free_coherent(tacc_to_dev(tdev), TACC_CQ_ENTRIES * TACC_CQE_SIZE,
					  q->cq, q->cq_dma);
		q->sq = NULL;
		q->cq = NULL;
	}
	if (tdev->reset_wq)
		destroy_workqueue(tdev->reset_wq);
	tdev->reset_wq = NULL;
	tacc_fence_ctx_put(tdev->fctx);	/* fences keep their own references */
	tdev->fctx = NULL;
}

int tacc_queues_init(struct tacc_device *tdev)
{
	struct device *dev = tacc_to_dev(tdev);
	u32 i;
	int ret;

	ret = tacc_fence_ctx_create(tdev);
	if (ret)
		return ret;
	ret = drmm_add_action_or_reset(&tdev->drm, tacc_queues_fini_action, NULL);
	if (ret)
		return ret;
	tdev->reset_wq = alloc_ordered_workqueue("tacc-reset-%s", 0, pci_name(tdev->pdev));
	if (!tdev->reset_wq)
		return -ENOMEM;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];
		struct drm_sched_init_args args = {
			.ops = &tacc_sched_ops,
			.num_rqs = DRM_SCHED_PRIORITY_COUNT,
			.credit_limit = TACC_SQ_ENTRIES - 1,
			.hang_limit = 0,
			.timeout = msecs_to_jiffies(tacc_job_timeout_ms ?: 2000),
			.timeout_wq = tdev->reset_wq,
			.name = q->name,
			.dev = dev,
		};

		q->tdev = tdev;
		q->idx = i;
		snprintf(q->name, sizeof(q->name), "tacc-q%u", i);
		spin_lock_init(&q->lock);
		INIT_LIST_HEAD(&q->inflight);
		q->fence_ctx = dma_fence_context_alloc(1);
		q->next_hw_job = 1;

		q->sq = dma_alloc_coherent(dev, TACC_SQ_ENTRIES * TACC_DESC_SIZE, &q->sq_dma,
					   GFP_KERNEL);
		if (!q->sq)
			return -ENOMEM;
		q->cq = dma_alloc_coherent(dev, TACC_CQ_ENTRIES * TACC_CQE_SIZE, &q->cq_dma,
					   GFP_KERNEL);
		if (!q->cq)
			return -ENOMEM;
		ret = drm_sched_init(&q->sched, &args);
		if (ret) {
			q->sched.ops = NULL;
			return ret;
		}
	}
	return 0;
}

/*
 * Unbind, surprise removal, function reset or AER: the device lost (or
 * will lose) everything it fetched; fail those jobs with @error.
 */
void tacc_queues_fail(struct tacc_device *tdev, int error)
{
	unsigned long flags;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];
		struct tacc_job *job, *tmp;

		spin_lock_irqsave(&q->lock, flags);
		list_for_each_entry_safe(job, tmp, &q->inflight, node)
			tacc_job_complete(q, job, TACC_ST_ABORTED, error, 0, 0);
		spin_unlock_irqrestore(&q->lock, flags);
	}
}

/*
 * tacc_hw_stop(): reap what completed, then disable every queue (the device
 * aborts the commands it runs and forgets the rest) and read back, so that
 * nothing of the jobs still listed in flight runs once this returns.  They
 * are failed by the caller afterwards (tacc_queues_fail()).
 */
void tacc_queues_quiesce(struct tacc_device *tdev)
{
	unsigned long flags;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];

		spin_lock_irqsave(&q->lock, flags);
		if (q->sq) {
			tacc_queue_process_cq_locked(q);
			tacc_qwr(q, TACC_Q_CTRL, 0);
			tacc_qrd(q, TACC_Q_CTRL);	/* flush: the abort is done */
		}
		spin_unlock_irqrestore(&q->lock, flags);
	}
}

/**
 * tacc_queues_wait_idle() - wait for the jobs the device holds to complete.
 * @tdev: the function, its schedulers stopped (no new job reaches it).
 * @ms: at most this long.
 *
 * Return: true once no queue has a job in flight, false after @ms.
 */
bool tacc_queues_wait_idle(struct tacc_device *tdev, unsigned int ms)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(ms);
	unsigned long flags;
	bool idle;
	u32 i;

	for (;;) {
		idle = true;
		for (i = 0; i < tdev->num_queues && idle; i++) {
			struct tacc_queue *q = &tdev->queues[i];

			spin_lock_irqsave(&q->lock, flags);
			idle = list_empty(&q->inflight);
			spin_unlock_irqrestore(&q->lock, flags);
		}
		if (idle || time_after(jiffies, deadline))
			return idle;
		usleep_range(10000, 20000);
	}
}

/*
 * Surprise removal, after tacc_hw_fini() and tacc_queues_fail(): free the
 * rings while the device (and its IOMMU domain) still exists.  run_job
 * and the CQ paths see hw_up false or sq NULL under q->lock.
 */
void tacc_queues_release_dma(struct tacc_device *tdev)
{
	struct device *dev = tacc_to_dev(tdev);
	unsigned long flags;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];
		struct tacc_desc *sq;
		struct tacc_cqe *cq;

		spin_lock_irqsave(&q->lock, flags);
		sq = q->sq;
		cq = q->cq;
		q->sq = NULL;
		q->cq = NULL;
		spin_unlock_irqrestore(&q->lock, flags);
		if (sq)
			dma_free_coherent(dev, TACC_SQ_ENTRIES * TACC_DESC_SIZE, sq, q->sq_dma);
		if (cq)
			dma_free_coherent(dev, TACC_CQ_ENTRIES * TACC_CQE_SIZE, cq, q->cq_dma);
	}
}

/* ----------------------------------------------------------- contexts ---- */

int tacc_ctx_entities_init(struct tacc_ctx *ctx)
{
	struct tacc_device *tdev = ctx->tdev;
	u32 i;
	int ret;

	mutex_init(&ctx->submit_lock);
	xa_init(&ctx->jobs_xa);
	tacc_failures_init(&ctx->failed);
	ctx->out_fence_ctx = dma_fence_context_alloc(TACC_NUM_QUEUES);
	for (i = 0; i < tdev->num_queues; i++) {
		struct drm_gpu_scheduler *sched = &tdev->queues[i].sched;

		ret = drm_sched_entity_init(&ctx->entity[i], DRM_SCHED_PRIORITY_NORMAL,
					    &sched, 1, NULL);
		if (ret)
			goto err;
	}
	return 0;
err:
	while (i--)
		drm_sched_entity_destroy(&ctx->entity[i]);
	return ret;
}

/*
 * The file is released: its queued jobs run, unless one still waits after
 * close_wait_ms (drm_sched_entity_destroy() would wait for it forever, as
 * long as its in-fences are unsignalled): then the jobs not yet given to the
 * device are cancelled (their fences signal -ESRCH) and never run.
 */
void tacc_ctx_entities_fini(struct tacc_ctx *ctx)
{
	bool idle = tacc_ctx_close_wait(ctx);
	u32 i;

	for (i = 0; i < ctx->tdev->num_queues; i++) {
		if (idle)
			drm_sched_entity_destroy(&ctx->entity[i]);
		else
			drm_sched_entity_fini(&ctx->entity[i]);
	}
}

void tacc_ctx_seq_fini(struct tacc_ctx *ctx)
{
	struct dma_fence *f;
	unsigned long idx;

	xa_for_each(&ctx->jobs_xa, idx, f)
		dma_fence_put(f);
	xa_destroy(&ctx->jobs_xa);
	tacc_failures_fini(&ctx->failed);
}

/* ------------------------------------------------------------- submit ---- */

static int tacc_resolve(struct tacc_ctx *ctx, struct drm_file *file, struct tacc_job *job,
			const struct drm_tacc_operand *op, u64 len, u32 align, int want,
			u64 *va)
{
	struct drm_gem_object *obj;
	struct tacc_mapping *map;
	struct tacc_bo *bo;
	int ret = 0;

	if (op->pad || !op->handle || !len)
		return -EINVAL;
	if (!IS_ALIGNED(op->offset, align))
		return -EINVAL;
	obj = drm_gem_object_lookup(file, op->handle);
	if (!obj)
		return -ENOENT;
	job->bos[job->num_bos++] = obj;
	bo = to_tacc_bo(obj);
	if ((want == TACC_T_DEV && bo->type != DRM_TACC_BO_DEVICE) ||
	    (want == TACC_T_HOST && bo->type == DRM_TACC_BO_DEVICE))
		return -EINVAL;

	mutex_lock(&ctx->vm.lock);
	map = bo->map;
	if (!map || map->ctx != ctx || op->offset < map->bo_offset || len > map->size ||
	    op->offset - map->bo_offset > map->size - len)
		ret = -EINVAL;
	else
		*va = map->node.start + (op->offset - map->bo_offset);
	mutex_unlock(&ctx->vm.lock);
	return ret;
}

/*
 * What the tacc_submit tracepoint reports of a job: the bytes its
 * copies move and its command mix, so a tracer needs no probe reading the
 * commands from user memory.  @d was built by tacc_translate().
 */
static void tacc_job_account(struct tacc_job *job, const struct tacc_desc *d)
{
	if (d->opcode == TACC_OP_COPY_H2D || d->opcode == TACC_OP_COPY_D2H ||
	    d->opcode == TACC_OP_COPY_D2D)
		job->bytes += d->copy.len;
	if (d->opcode < 32)
		job->mix |= BIT(d->opcode);
}

/*
 * One command: checked by the validator every function kind shares
 * (tacc_cmd.c), its operands resolved in this file's VM, the descriptor
 * built with their device VAs.
 */
static int tacc_translate(struct tacc_ctx *ctx, struct drm_file *file, struct tacc_job *job,
			  const struct drm_tacc_cmd2 *c, u32 caps, u32 index, struct tacc_desc *d)
{
	u64 va[DRM_TACC_CMD2_OPERANDS] = {};
	struct tacc_cmd_spec spec;
	int i, ret;

	ret = tacc_cmd_check(c, caps, &spec);
	if (ret)
		return ret;
	for (i = 0; i < DRM_TACC_CMD2_OPERANDS; i++) {
		if (!spec.op[i].len)
			continue;
		ret = tacc_resolve(ctx, file, job, &c->op[i], spec.op[i].len, spec.op[i].align,
				   spec.op[i].kind, &va[i]);
		if (ret)
			return ret;
	}
	tacc_cmd_desc(c, &spec, va, d);
	d->ctx = ctx->id;
	d->index = index;
	return 0;
}

/* ------------------------------------------------ job fences in dma_resv ---- */

/* The BOs of a job, once each, locked, with a fence slot reserved. */
struct tacc_resv_set {
	struct drm_gem_object **objs;
	bool *write;
	int n;
	struct ww_acquire_ctx ticket;
};

/* Does a command of @job write into @bo's binding?  (ctx->vm.lock held) */
static bool tacc_job_writes_bo(struct tacc_job *job, struct tacc_bo *bo)
{
	struct tacc_mapping *map = bo->map;
	u32 i;

	lockdep_assert_held(&job->ctx->vm.lock);
	if (!map || map->ctx != job->ctx)
		return false;
	for (i = 0; i < job->num_cmds; i++) {
		const struct tacc_desc *d = &job->descs[i];
		u64 va, va2 = 0;	/* a second output: NORM's statistics */

		switch (d->opcode) {
		case TACC_OP_COPY_H2D:
		case TACC_OP_COPY_D2H:
		case TACC_OP_COPY_D2D:
			va = d->copy.dst;
			break;
		case TACC_OP_GEMM:
			va = d->gemm.c;
			break;
		case TACC_OP_ELTWISE:
			va = d->eltwise.c;
			break;
		case TACC_OP_SOFTMAX:
			va = d->softmax.y;
			break;
		case TACC_OP_NORM:
			va = d->norm.y;
			va2 = d->norm.stats;
			break;
		case TACC_OP_GATHER:
			va = d->gather.out;
			break;
		case TACC_OP_FENCE:
		case TACC_OP_TIMESTAMP:
			va = d->fence.addr;
			break;
		default:
			continue;
		}
		if (va >= map->node.start && va - map->node.start < map->size)
			return true;
		if (va2 && va2 >= map->node.start && va2 - map->node.start < map->size)
			return true;
	}
	return false;
}

static void tacc_resv_set_free(struct tacc_resv_set *rs)
{
	kfree(rs->objs);
	kfree(rs->write);
	rs->objs = NULL;
	rs->write = NULL;
	rs->n = 0;
}

static int tacc_job_resv_lock(struct tacc_job *job, struct tacc_resv_set *rs)
{
	struct tacc_ctx *ctx = job->ctx;
	int i, j, ret;

	memset(rs, 0, sizeof(*rs));
	if (!job->num_bos)
		return 0;
	rs->objs = kcalloc(job->num_bos, sizeof(*rs->objs), GFP_KERNEL);
	rs->write = kcalloc(job->num_bos, sizeof(*rs->write), GFP_KERNEL);
	if (!rs->objs || !rs->write) {
		tacc_resv_set_free(rs);
		return -ENOMEM;
	}
	for (i = 0; i < job->num_bos; i++) {
		for (j = 0; j < rs->n && rs->objs[j] != job->bos[i]; j++)
			;
		if (j == rs->n)
			rs->objs[rs->n++] = job->bos[i];
	}
	mutex_lock(&ctx->vm.lock);
	for (j = 0; j < rs->n; j++)
		rs->write[j] = tacc_job_writes_bo(job, to_tacc_bo(rs->objs[j]));
	mutex_unlock(&ctx->vm.lock);

	ret = drm_gem_lock_reservations(rs->objs, rs->n, &rs->ticket);
	if (ret) {
		tacc_resv_set_free(rs);
		return ret;
	}
	for (j = 0; j < rs->n; j++) {
		ret = dma_resv_reserve_fences(rs->objs[j]->resv, 1);
		if (ret) {
			drm_gem_unlock_reservations(rs->objs, rs->n, &rs->ticket);
			tacc_resv_set_free(rs);
			return ret;
		}
	}
	return 0;
}

/* Publish the job's fence: WRITE where it writes, BOOKKEEP where it reads. */
static void tacc_job_resv_unlock(struct tacc_resv_set *rs, struct dma_fence *fence)
{
	int j;

	if (!rs->n)
		return;
	for (j = 0; fence && j < rs->n; j++)
		dma_resv_add_fence(rs->objs[j]->resv, fence,
				   rs->write[j] ? DMA_RESV_USAGE_WRITE : DMA_RESV_USAGE_BOOKKEEP);
	drm_gem_unlock_reservations(rs->objs, rs->n, &rs->ticket);
	tacc_resv_set_free(rs);
}

/**
 * tacc_ctx_wait_jobs() - wait for every job the context submitted so far.
 * @ctx: the context.
 * @nowait: do not wait: -EBUSY if one is unfinished.
 * @intr: interruptible wait.
 *
 * The last job of each queue stands for all earlier ones (a queue's jobs
 * finish in order): the VM-wide fence VM_UNBIND and GEM_CLOSE wait for.
 *
 * Return: 0, -EBUSY (@nowait) or -ERESTARTSYS (@intr, a signal).
 */
int tacc_ctx_wait_jobs(struct tacc_ctx *ctx, bool nowait, bool intr)
{
	struct dma_fence *f[TACC_NUM_QUEUES];
	long ret = 0;
	u32 i;

	mutex_lock(&ctx->submit_lock);
	for (i = 0; i < TACC_NUM_QUEUES; i++)
		f[i] = dma_fence_get(ctx->last_fence[i]);
	mutex_unlock(&ctx->submit_lock);
	for (i = 0; i < TACC_NUM_QUEUES && !ret; i++) {
		if (!f[i])
			continue;
		if (nowait)
			ret = dma_fence_is_signaled(f[i]) ? 0 : -EBUSY;
		else
			ret = dma_fence_wait(f[i], intr);
	}
	for (i = 0; i < TACC_NUM_QUEUES; i++)
		dma_fence_put(f[i]);
	return ret;
}

/**
 * tacc_ctx_close_wait() - wait in a close path for the context's jobs.
 * @ctx: the context.
 *
 * Uninterruptible but bounded by close_wait_ms: a job may wait on an
 * in-syncobj nobody signals.  Once a wait timed out, later ones (every
 * other bound BO of a closing file) only check, until the jobs are done.
 *
 * Return: true if every job submitted so far has finished.
 */
bool tacc_ctx_close_wait(struct tacc_ctx *ctx)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(READ_ONCE(tacc_close_wait_ms));
	struct dma_fence *f[TACC_NUM_QUEUES];
	bool idle = true;
	long left;
	u32 i;

	mutex_lock(&ctx->submit_lock);
	for (i = 0; i < TACC_NUM_QUEUES; i++)
		f[i] = dma_fence_get(ctx->last_fence[i]);
	mutex_unlock(&ctx->submit_lock);
	if (READ_ONCE(ctx->close_stuck))
		deadline = jiffies;
	for (i = 0; i < TACC_NUM_QUEUES && idle; i++) {
		if (!f[i] || dma_fence_is_signaled(f[i]))
			continue;
		left = (long)(deadline - jiffies);
		idle = left > 0 && dma_fence_wait_timeout(f[i], false, left) > 0;
	}
	for (i = 0; i < TACC_NUM_QUEUES; i++)
		dma_fence_put(f[i]);
	if (!idle && !READ_ONCE(ctx->close_stuck)) {
		WRITE_ONCE(ctx->close_stuck, true);
		drm_warn(&ctx->tdev->drm,
			 "context %u (%s[%d]): jobs unfinished after %u ms in close: not waited for\n",
			 ctx->id, ctx->comm, ctx->pid, tacc_close_wait_ms);
	}
	if (idle)
		WRITE_ONCE(ctx->close_stuck, false);
	return idle;
}

void tacc_ctx_fences_fini(struct tacc_ctx *ctx)
{
	u32 i;

	for (i = 0; i < TACC_NUM_QUEUES; i++) {
		dma_fence_put(ctx->last_fence[i]);
		ctx->last_fence[i] = NULL;
	}
}

/* The user's commands, either form, as struct drm_tacc_cmd2. */
static int tacc_cmds_copy_in(const struct drm_tacc_submit *args, struct drm_tacc_cmd2 *cmds)
{
	const struct drm_tacc_cmd __user *v1 = u64_to_user_ptr(args->cmds);
	struct drm_tacc_cmd c;
	u32 i;
	int ret;

	if (args->cmd_size == sizeof(*cmds))
		return copy_from_user(cmds, u64_to_user_ptr(args->cmds),
				      args->num_cmds * sizeof(*cmds)) ? -EFAULT : 0;
	for (i = 0; i < args->num_cmds; i++) {
		if (copy_from_user(&c, &v1[i], sizeof(c)))
			return -EFAULT;
		ret = tacc_cmd_from_v1(&c, &cmds[i]);
		if (ret)
			return ret;
	}
	return 0;
}

int tacc_submit_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_submit *args = data;
	struct drm_syncobj *out_sync = NULL;
	struct dma_fence *out_fence = NULL;
	struct tacc_resv_set rs;
	struct drm_tacc_cmd2 *cmds;
	struct dma_fence *finished;
	struct tacc_job *job;
	u32 in[DRM_TACC_MAX_IN_SYNCOBJS];
	u32 i;
	int ret;

	if (args->flags || (args->cmd_size != sizeof(struct drm_tacc_cmd) &&
			    args->cmd_size != sizeof(struct drm_tacc_cmd2)) ||
	    !args->num_cmds || args->num_cmds > TACC_MAX_CMDS ||
	    !tacc_queue_usable(tdev, args->queue) ||
	    args->num_in_syncobjs > DRM_TACC_MAX_IN_SYNCOBJS)
		return -EINVAL;
	if (args->num_in_syncobjs &&
	    copy_from_user(in, u64_to_user_ptr(args->in_syncobjs),
			   args->num_in_syncobjs * sizeof(u32)))
		return -EFAULT;

	if (atomic_inc_return(&ctx->inflight[args->queue]) > TACC_MAX_INFLIGHT) {
		atomic_dec(&ctx->inflight[args->queue]);
		return -EAGAIN;
	}

	cmds = kvmalloc_array(args->num_cmds, sizeof(*cmds), GFP_KERNEL);
	if (!cmds) {
		ret = -ENOMEM;
		goto err_inflight;
	}
	ret = tacc_cmds_copy_in(args, cmds);
	if (ret)
		goto err_cmds;

	job = kzalloc(sizeof(*job), GFP_KERNEL);
	if (!job) {
		ret = -ENOMEM;
		goto err_cmds;
	}
	job->ctx = ctx;
	job->q = &tdev->queues[args->queue];
	job->num_cmds = args->num_cmds;
	INIT_LIST_HEAD(&job->node);
	job->descs = kcalloc(args->num_cmds, sizeof(*job->descs), GFP_KERNEL);
	job->bos = kcalloc(args->num_cmds * DRM_TACC_CMD2_OPERANDS, sizeof(*job->bos),
			   GFP_KERNEL);
	job->hw_fence = kzalloc(sizeof(*job->hw_fence), GFP_KERNEL);
	if (!job->descs || !job->bos || !job->hw_fence) {
		ret = -ENOMEM;
		goto err_job;
	}

	for (i = 0; i < args->num_cmds; i++) {
		ret = tacc_translate(ctx, file, job, &cmds[i], tdev->caps, i, &job->descs[i]);
		if (ret)
			goto err_job;
		tacc_job_account(job, &job->descs[i]);
	}
	job->descs[args->num_cmds - 1].flags |= TACC_DESC_F_LAST | TACC_DESC_F_IRQ;
	job->tag = cmds[args->num_cmds - 1].tag;

	if (args->out_syncobj) {
		out_sync = drm_syncobj_find(file, args->out_syncobj);
		if (!out_sync) {
			ret = -ENOENT;
			goto err_job;
		}
	}
	/* the job's fence in its BOs' dma_resv and the out-syncobj: tacc_fence.c */
	out_fence = tacc_out_fence_alloc();
	if (!out_fence) {
		ret = -ENOMEM;
		goto err_sync;
	}

	ret = pm_runtime_resume_and_get(tacc_to_dev(tdev));
	if (ret)
		goto err_sync;
	job->pm_ref = true;

	ret = drm_sched_job_init(&job->base, &ctx->entity[args->queue], args->num_cmds, ctx,
				 file->client_id);
	if (ret)
		goto err_pm;
	for (i = 0; i < args->num_in_syncobjs; i++) {
		ret = drm_sched_job_add_syncobj_dependency(&job->base, file, in[i], 0);
		if (ret)
			goto err_sched;
	}

	ret = tacc_job_resv_lock(job, &rs);
	if (ret)
		goto err_sched;
	mutex_lock(&ctx->submit_lock);
	spin_lock(&ctx->seq_lock);
	job->seqno = ctx->last_seqno + 1;
	spin_unlock(&ctx->seq_lock);
	ret = xa_reserve(&ctx->jobs_xa, job->seqno, GFP_KERNEL);
	if (ret) {
		mutex_unlock(&ctx->submit_lock);
		tacc_job_resv_unlock(&rs, NULL);
		goto err_sched;
	}
	/* nothing can fail from here on */
	drm_sched_job_arm(&job->base);
	finished = dma_fence_get(&job->base.s_fence->finished);
	xa_store(&ctx->jobs_xa, job->seqno, finished, GFP_KERNEL);
	spin_lock(&ctx->seq_lock);
	ctx->last_seqno = job->seqno;
	spin_unlock(&ctx->seq_lock);
	/* the scheduler's fences must not leave the driver: tacc_fence.c */
	tacc_out_fence_arm(out_fence, tdev, args->queue,
			   ctx->out_fence_ctx + args->queue, job->seqno, finished);
	if (out_sync)
		drm_syncobj_replace_fence(out_sync, out_fence);
	tacc_job_resv_unlock(&rs, out_fence);
	dma_fence_put(out_fence);
	dma_fence_put(ctx->last_fence[args->queue]);
	ctx->last_fence[args->queue] = dma_fence_get(finished);
	tacc_ctx_get(ctx);
	atomic_inc(&tdev->live.jobs);
	trace_tacc_submit(tacc_devid(tdev), ctx->id, args->queue, job->seqno, job->tag,
			  job->num_cmds, job->bytes, job->mix);
	args->seqno = job->seqno;
	drm_sched_entity_push_job(&job->base);
	mutex_unlock(&ctx->submit_lock);

	if (out_sync)
		drm_syncobj_put(out_sync);
	kvfree(cmds);
	return 0;

err_sched:
	drm_sched_job_cleanup(&job->base);
err_pm:
	pm_runtime_mark_last_busy(tacc_to_dev(tdev));
	pm_runtime_put_autosuspend(tacc_to_dev(tdev));
err_sync:
	kfree(out_fence);	/* never armed */
	if (out_sync)
		drm_syncobj_put(out_sync);
err_job:
	tacc_job_put_resources(job);
	kfree(job);
err_cmds:
	kvfree(cmds);
err_inflight:
	atomic_dec(&ctx->inflight[args->queue]);
	return ret;
}

int tacc_wait_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_wait *args = data;
	struct dma_fence *f;
	long timeout, ret;

	if (args->flags)
		return -EINVAL;
	spin_lock(&ctx->seq_lock);
	if (!args->seqno || args->seqno > ctx->last_seqno) {
		spin_unlock(&ctx->seq_lock);
		return -EINVAL;
	}
	spin_unlock(&ctx->seq_lock);

	xa_lock(&ctx->jobs_xa);
	f = xa_load(&ctx->jobs_xa, args->seqno);
	if (f)
		dma_fence_get(f);
	xa_unlock(&ctx->jobs_xa);

	if (!f)
		return tacc_failures_status(&ctx->failed, args->seqno, &args->status);

	if (args->timeout_ns < 0)
		timeout = MAX_SCHEDULE_TIMEOUT;
	else
		timeout = nsecs_to_jiffies64(args->timeout_ns) ?: (args->timeout_ns ? 1 : 0);
	ret = dma_fence_wait_timeout(f, true, timeout);
	if (ret > 0 || (ret == 0 && dma_fence_is_signaled(f))) {
		args->status = f->error;
		ret = 0;
	} else if (ret == 0) {
		ret = -ETIME;
	}
	dma_fence_put(f);
	return ret;
}
