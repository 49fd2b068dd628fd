// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc device-memory scrubbing: memory changes owner only after the device
 * has overwritten it (TACC_OP_FILL, window offsets).
 *
 * A freed DEVICE BO keeps its drm_mm node (so the allocator cannot hand the
 * range out) while a FILL job of the kernel context runs; the job's fence
 * callback queues a work item that returns the range to the allocator and
 * wakes allocations waiting for memory.  A failed FILL is retried; after
 * TACC_SCRUB_TRIES failures the range stays reserved (quarantined) until
 * the device goes away.  SR-IOV scrubs VF windows synchronously
 * (tacc_scrub_range_sync): before a VF gets one and after it gave it back.
 * Every probe scrubs all of the function's memory (tacc_scrub_probe).
 */
#include <linux/dma-fence.h>
#include <linux/dma-resv.h>
#include <linux/pm_runtime.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>

#include "tacc_drv.h"

#define TACC_SCRUB_TRIES	3
#define TACC_SCRUB_RETRY_MS	200
#define TACC_FILL_CHUNK		SZ_1G	/* bytes per FILL descriptor */

struct tacc_scrub {
	struct list_head node;		/* tdev->scrub_list (devmem_lock) */
	struct tacc_device *tdev;
	struct tacc_bo *bo;		/* freed BO: owns @bo->devmem */
	struct dma_fence *fence;
	struct dma_fence_cb cb;
	struct delayed_work work;
	int tries;
	bool quarantined;
};

static bool tacc_scrub_capable(struct tacc_device *tdev)
{
	return (tdev->caps & TACC_CAP_FILL) && tdev->kctx;
}

/*
 * A FILL job of the kernel context over window offsets [start, start + size),
 * after the fences of @resv (if any).  Returns its finished fence.
 */
static struct dma_fence *tacc_scrub_submit(struct tacc_device *tdev, u64 start, u64 size,
					   struct dma_resv *resv)
{
	struct tacc_ctx *kctx = tdev->kctx;
	u32 i, n = DIV_ROUND_UP_ULL(size, TACC_FILL_CHUNK);
	struct dma_fence *fence;
	struct tacc_job *job;
	int ret;

	if (!n || n > TACC_MAX_CMDS || !IS_ALIGNED(start | size, 8))
		return ERR_PTR(-EINVAL);
	job = kzalloc(sizeof(*job), GFP_KERNEL);
	if (!job)
		return ERR_PTR(-ENOMEM);
	job->ctx = kctx;
	job->q = &tdev->queues[tdev->scrub_queue];
	job->num_cmds = n;
	INIT_LIST_HEAD(&job->node);
	job->descs = kcalloc(n, sizeof(*job->descs), GFP_KERNEL);
	job->hw_fence = kzalloc(sizeof(*job->hw_fence), GFP_KERNEL);
	if (!job->descs || !job->hw_fence) {
		ret = -ENOMEM;
		goto err_free;
	}
	for (i = 0; i < n; i++) {
		struct tacc_desc *d = &job->descs[i];
		u64 off = (u64)i * TACC_FILL_CHUNK;

		d->opcode = TACC_OP_FILL;
		d->index = i;
		d->fill.dst = start + off;
		d->fill.len = min_t(u64, size - off, TACC_FILL_CHUNK);
		d->fill.value = 0;
	}
	job->descs[n - 1].flags |= TACC_DESC_F_LAST | TACC_DESC_F_IRQ;

	ret = pm_runtime_resume_and_get(tacc_to_dev(tdev));
	if (ret)
		goto err_free;
	job->pm_ref = true;
	ret = drm_sched_job_init(&job->base, &kctx->entity[tdev->scrub_queue], n, kctx, 0);
	if (ret)
		goto err_pm;
	if (resv) {
		dma_resv_lock(resv, NULL);
		ret = drm_sched_job_add_resv_dependencies(&job->base, resv,
							  DMA_RESV_USAGE_BOOKKEEP);
		dma_resv_unlock(resv);
		if (ret)
			goto err_sched;
	}

	mutex_lock(&kctx->submit_lock);
	spin_lock(&kctx->seq_lock);
	job->seqno = ++kctx->last_seqno;
	spin_unlock(&kctx->seq_lock);
	drm_sched_job_arm(&job->base);
	fence = dma_fence_get(&job->base.s_fence->finished);
	tacc_ctx_get(kctx);
	atomic_inc(&kctx->inflight[tdev->scrub_queue]);	/* not in live.jobs */
	drm_sched_entity_push_job(&job->base);
	mutex_unlock(&kctx->submit_lock);
	atomic64_inc(&tdev->scrub_jobs);
	atomic64_add(size, &tdev->scrub_bytes);
	return fence;

err_sched:
	drm_sched_job_cleanup(&job->base);
err_pm:
	pm_runtime_mark_last_busy(tacc_to_dev(tdev));
	pm_runtime_put_autosuspend(tacc_to_dev(tdev));
err_free:
	kfree(job->descs);
	kfree(job->hw_fence);
	kfree(job);
	return ERR_PTR(ret);
}

/* Return the range to the allocator (devmem_lock held). */
static void tacc_scrub_release_locked(struct tacc_device *tdev, struct tacc_scrub *s)
{
	lockdep_assert_held(&tdev->devmem_lock);
	list_del(&s->node);
	tdev->devmem_used -= s->bo->devmem.size;
	drm_mm_remove_node(&s->bo->devmem);
	if (!s->quarantined)
		atomic_dec(&tdev->scrub_pending);
	atomic_inc(&tdev->scrub_gen);
}

static void tacc_scrub_free(struct tacc_scrub *s)
{
	dma_fence_put(s->fence);
	kfree(s->bo);
	kfree(s);
}

static void tacc_scrub_fence_cb(struct dma_fence *f, struct dma_fence_cb *cb)
{
	struct tacc_scrub *s = container_of(cb, struct tacc_scrub, cb);

	queue_delayed_work(s->tdev->scrub_q, &s->work, 0);
}

/* Start (or restart) the FILL of a queued scrub. */
static int tacc_scrub_start(struct tacc_scrub *s)
{
	struct tacc_device *tdev = s->tdev;
	struct dma_fence *f;

	f = tacc_scrub_submit(tdev, s->bo->devmem.start, s->bo->devmem.size, NULL);
	if (IS_ERR(f))
		return PTR_ERR(f);
	dma_fence_put(s->fence);
	s->fence = f;
	s->tries++;
	if (dma_fence_add_callback(f, &s->cb, tacc_scrub_fence_cb))
		queue_delayed_work(s->tdev->scrub_q, &s->work, 0);	/* already done */
	return 0;
}

static void tacc_scrub_work(struct work_struct *work)
{
	struct tacc_scrub *s = container_of(to_delayed_work(work), struct tacc_scrub, work);
	struct tacc_device *tdev = s->tdev;
	int error = s->fence ? s->fence->error : -EAGAIN;
	bool gone = drm_dev_is_unplugged(&tdev->drm) || READ_ONCE(tdev->scrub_dying);

	if (error && !gone) {
		if (s->tries < TACC_SCRUB_TRIES && !tacc_scrub_start(s))
			return;
		if (s->tries < TACC_SCRUB_TRIES) {
			s->tries++;
			queue_delayed_work(s->tdev->scrub_q, &s->work,
					   msecs_to_jiffies(TACC_SCRUB_RETRY_MS));
			return;
		}
		drm_err(&tdev->drm, "device memory 0x%llx+0x%llx not scrubbed (%d): quarantined\n",
			s->bo->devmem.start, s->bo->devmem.size, error);
		mutex_lock(&tdev->devmem_lock);
		s->quarantined = true;
		atomic_dec(&tdev->scrub_pending);
		atomic64_inc(&tdev->scrub_failed);
		mutex_unlock(&tdev->devmem_lock);
		wake_up_all(&tdev->scrub_wq);
		return;
	}
	/* scrubbed (or the device, and with it the memory, is gone) */
	mutex_lock(&tdev->devmem_lock);
	tacc_scrub_release_locked(tdev, s);
	mutex_unlock(&tdev->devmem_lock);
	wake_up_all(&tdev->scrub_wq);
	tacc_scrub_free(s);
}

/**
 * tacc_scrub_bo() - GEM free of a DEVICE BO: scrub, then release its range.
 * @tdev: the function.
 * @bo: the BO being freed; its GEM object is released here and the memory of
 *      @bo is freed once the range is back in the allocator.
 *
 * Asynchronous: never waits for the device.
 */
void tacc_scrub_bo(struct tacc_device *tdev, struct tacc_bo *bo)
{
	struct drm_gem_object *obj = &bo->shmem.base;
	struct tacc_scrub *s;
	struct dma_fence *f;
	u32 delay;
	int idx;

	if (!drm_mm_node_allocated(&bo->devmem)) {
		drm_gem_object_release(obj);
		kfree(bo);
		return;
	}
	s = kzalloc(sizeof(*s), GFP_KERNEL | __GFP_NOFAIL);
	s->tdev = tdev;
	s->bo = bo;
	INIT_DELAYED_WORK(&s->work, tacc_scrub_work);
	if (!drm_dev_enter(&tdev->drm, &idx)) {
		/* the device (and its memory) is gone: nobody can reach the range */
		drm_gem_object_release(obj);
		mutex_lock(&tdev->devmem_lock);
		list_add_tail(&s->node, &tdev->scrub_list);
		s->quarantined = true;
		tacc_scrub_release_locked(tdev, s);
		mutex_unlock(&tdev->devmem_lock);
		tacc_scrub_free(s);
		return;
	}
	mutex_lock(&tdev->devmem_lock);
	list_add_tail(&s->node, &tdev->scrub_list);
	if (tacc_scrub_capable(tdev))
		atomic_inc(&tdev->scrub_pending);
	else
		s->quarantined = true;	/* never reused unscrubbed */
	mutex_unlock(&tdev->devmem_lock);
	if (s->quarantined) {
		drm_warn_once(&tdev->drm, "no FILL: freed device memory is not reused\n");
		drm_dev_exit(idx);
		drm_gem_object_release(obj);
		return;
	}

	/* test knob (debugfs, 0): the FILL queued that much later (the retry path) */
	delay = READ_ONCE(tdev->scrub_delay_ms);
	f = delay ? ERR_PTR(-EAGAIN) :
		tacc_scrub_submit(tdev, bo->devmem.start, bo->devmem.size, obj->resv);
	drm_dev_exit(idx);
	drm_gem_object_release(obj);	/* the dependencies hold their fences */
	if (IS_ERR(f)) {
		s->tries = delay ? 0 : 1;
		queue_delayed_work(s->tdev->scrub_q, &s->work,
				   msecs_to_jiffies(delay ?: TACC_SCRUB_RETRY_MS));
		return;
	}
	s->fence = f;
	s->tries = 1;
	if (dma_fence_add_callback(f, &s->cb, tacc_scrub_fence_cb))
		queue_delayed_work(s->tdev->scrub_q, &s->work, 0);
}

/**
 * tacc_scrub_range_sync() - scrub window offsets [start, start + size), wait.
 * @tdev: the function (the PF for VF windows).
 * @start: window offset.
 * @size: bytes.
 *
 * Return: 0 once the device has overwritten the range, else a negative errno.
 */
int tacc_scrub_range_sync(struct tacc_device *tdev, u64 start, u64 size)
{
	struct dma_fence *f;
	int ret, try;

	if (!tacc_scrub_capable(tdev))
		return -EOPNOTSUPP;
	for (try = 0; try < TACC_SCRUB_TRIES; try++) {
		f = tacc_scrub_submit(tdev, start, size, NULL);
		if (IS_ERR(f))
			return PTR_ERR(f);
		dma_fence_wait(f, false);	/* bounded by the job timeout */
		ret = f->error;
		dma_fence_put(f);
		if (!ret)
			return 0;
	}
	return ret;
}

/**
 * tacc_scrub_probe() - overwrite all of the function's device memory at probe.
 * @tdev: the function, after tacc_hw_init() and before drm_dev_register().
 *
 * Whatever an earlier owner left in device memory is gone before this driver
 * hands any of it out: a driver unbound while files held filled BOs (their
 * free could not reach the device), a VFIO user or a guest that had the
 * function, a crashed kernel.  One FILL job per GiB of the function's window,
 * waited for.  The virtio-tacc window inside the PF's memory is left alone:
 * it is that function's (tacc_devmem_reserve_virtio()).
 *
 * Return: 0 (also for a device without FILL, which says so), or a negative
 * errno: the probe fails rather than hand out memory it could not clear.
 */
int tacc_scrub_probe(struct tacc_device *tdev)
{
	const struct drm_mm_node *v = &tdev->virtio_node;
	u64 end = v->start + v->size;
	int ret;

	if (!tacc_scrub_capable(tdev)) {
		drm_warn(&tdev->drm, "no FILL (hw %u.%u): device memory not scrubbed at probe\n",
			 tdev->hw_version >> 16, tdev->hw_version & 0xffff);
		return 0;
	}
	if (!tdev->devmem_size)
		return 0;
	if (drm_mm_node_allocated(v)) {	/* the virtio function's memory is not ours */
		ret = v->start ? tacc_scrub_range_sync(tdev, 0, v->start) : 0;
		if (!ret && end < tdev->devmem_size)
			ret = tacc_scrub_range_sync(tdev, end, tdev->devmem_size - end);
	} else {
		ret = tacc_scrub_range_sync(tdev, 0, tdev->devmem_size);
	}
	if (ret)
		drm_err(&tdev->drm, "device memory scrub at probe failed (%d)\n", ret);
	return ret;
}

static bool tacc_scrub_quarantined(struct tacc_device *tdev)
{
	struct tacc_scrub *s;
	bool any = false;

	mutex_lock(&tdev->devmem_lock);
	list_for_each_entry(s, &tdev->scrub_list, node)
		any |= s->quarantined;
	mutex_unlock(&tdev->devmem_lock);
	return any;
}

static bool tacc_scrub_drained(struct tacc_device *tdev, bool all_bos)
{
	return !atomic_read(&tdev->scrub_pending) &&
	       (!all_bos || !atomic_long_read(&tdev->live.devmem_bytes));
}

/**
 * tacc_scrub_drain() - wait until the function's freed device memory is scrubbed.
 * @tdev: the function.
 * @all_bos: also wait until no DEVICE BO is left (a job of a closed file may
 *           still hold one): for a handoff, which no file may open past.
 * @timeout: jiffies.
 * @intr: interruptible by a signal.
 *
 * Before the function changes driver (tacc/handoff, unbind): the FILLs of
 * freed BOs still queued must reach the device first, for FLR does not clear
 * device memory and the next driver (vfio-pci) does not scrub.
 *
 * Return: 0; -EIO if a range is quarantined (its FILL failed: never
 * scrubbed); -ETIMEDOUT; -ERESTARTSYS on a signal (@intr).
 */
int tacc_scrub_drain(struct tacc_device *tdev, bool all_bos, long timeout, bool intr)
{
	unsigned long deadline = jiffies + timeout;
	long ret;

	/* BOs freed without a wake-up of scrub_wq (no FILL): poll, 10 times a second */
	while (!tacc_scrub_drained(tdev, all_bos)) {
		if (time_after_eq(jiffies, deadline))
			return -ETIMEDOUT;
		if (intr) {
			ret = wait_event_interruptible_timeout(tdev->scrub_wq,
							       tacc_scrub_drained(tdev, all_bos),
							       HZ / 10);
			if (ret < 0)
				return ret;
		} else {
			wait_event_timeout(tdev->scrub_wq, tacc_scrub_drained(tdev, all_bos),
					   HZ / 10);
		}
	}
	return tacc_scrub_quarantined(tdev) ? -EIO : 0;
}

/**
 * tacc_scrub_wait_release() - wait for the next scrubbed range to come back.
 * @tdev: the function.
 * @gen: tdev->scrub_gen read before the failed allocation.
 * @timeout: jiffies.
 *
 * Return: 1 if a range came back (retry the allocation), 0 if nothing is
 * being scrubbed or on timeout, -ERESTARTSYS on a signal.
 */
int tacc_scrub_wait_release(struct tacc_device *tdev, u32 gen, long timeout)
{
	long ret;

	if (!atomic_read(&tdev->scrub_pending))
		return 0;
	ret = wait_event_interruptible_timeout(tdev->scrub_wq,
					       (u32)atomic_read(&tdev->scrub_gen) != gen ||
					       !atomic_read(&tdev->scrub_pending), timeout);
	if (ret < 0)
		return ret;
	return ret > 0 && (u32)atomic_read(&tdev->scrub_gen) != gen;
}

static void tacc_scrub_fini_action(struct drm_device *dev, void *data)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *kctx = tdev->kctx;
	struct tacc_scrub *s, *tmp;

	/* every FILL has finished or is killed here; works then release */
	if (kctx)
		drm_sched_entity_destroy(&kctx->entity[tdev->scrub_queue]);
	WRITE_ONCE(tdev->scrub_dying, true);
	flush_workqueue(tdev->scrub_q);
	mutex_lock(&tdev->devmem_lock);
	list_for_each_entry_safe(s, tmp, &tdev->scrub_list, node) {
		cancel_delayed_work(&s->work);
		if (s->fence)
			dma_fence_remove_callback(s->fence, &s->cb);
		tacc_scrub_release_locked(tdev, s);
		tacc_scrub_free(s);
	}
	mutex_unlock(&tdev->devmem_lock);
	destroy_workqueue(tdev->scrub_q);
	tdev->scrub_q = NULL;
	tdev->kctx = NULL;
	if (kctx)
		tacc_ctx_put(kctx);
}

/**
 * tacc_scrub_init() - the kernel context that runs FILL jobs.
 * @tdev: the function, after tacc_queues_init().
 *
 * Return: 0 or a negative errno (an old device without FILL is not an error).
 */
int tacc_scrub_init(struct tacc_device *tdev)
{
	struct drm_gpu_scheduler *sched;
	struct tacc_ctx *kctx;
	int ret;

	/* the lowest queue the function may enable (a VF's mask may lack queue 0) */
	tdev->scrub_queue = __ffs(tdev->queue_mask);
	sched = &tdev->queues[tdev->scrub_queue].sched;

	INIT_LIST_HEAD(&tdev->scrub_list);
	init_waitqueue_head(&tdev->scrub_wq);
	tdev->scrub_q = alloc_workqueue("tacc-scrub-%s", WQ_UNBOUND | WQ_MEM_RECLAIM, 0,
					pci_name(tdev->pdev));
	if (!tdev->scrub_q)
		return -ENOMEM;
	if (!(tdev->caps & TACC_CAP_FILL))
		return drmm_add_action_or_reset(&tdev->drm, tacc_scrub_fini_action, NULL);
	kctx = kzalloc(sizeof(*kctx), GFP_KERNEL);
	if (!kctx)
		return -ENOMEM;
	kref_init(&kctx->ref);
	kctx->tdev = tdev;
	kctx->kernel = true;
	kctx->id = TACC_NUM_CONTEXTS;	/* no hardware context: FILL has none */
	strscpy(kctx->comm, "tacc-scrub", sizeof(kctx->comm));
	spin_lock_init(&kctx->seq_lock);
	mutex_init(&kctx->submit_lock);
	xa_init(&kctx->jobs_xa);
	tacc_failures_init(&kctx->failed);
	ret = drm_sched_entity_init(&kctx->entity[tdev->scrub_queue], DRM_SCHED_PRIORITY_KERNEL,
				    &sched, 1, NULL);
	if (ret) {
		kfree(kctx);
		destroy_workqueue(tdev->scrub_q);
		tdev->scrub_q = NULL;
		return ret;
	}
	tdev->kctx = kctx;		/* not in live.ctxs: no user context */
	return drmm_add_action_or_reset(&tdev->drm, tacc_scrub_fini_action, NULL);
}
