// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc fences that outlive their device and their module's unbind.
 *
 * A fence escapes the driver: a sync_file exported from an out-syncobj, a
 * syncobj fd, another driver's dependency.  It may be released, polled or
 * asked for its names after the function was unbound (tacc_device freed)
 * and after rmmod was attempted.  So every fence with tacc ops
 *  - names its timeline from a tacc_fence_ctx, refcounted apart from the
 *    device (one per function, one reference per fence, one by the device);
 *  - holds a reference on the module, so the ops and their code stay
 *    loaded while it lives (rmmod fails with -EBUSY while, say, a sync_file
 *    is open, as it does while a file of the device is);
 *  - never dereferences the device.
 *
 * The syncobj of a job gets a tacc "out fence" that follows the scheduler's
 * finished fence (error included): the scheduler's fences name their
 * timeline through the drm_gpu_scheduler embedded in the device, so they
 * must not leave the driver.
 */
#include <linux/module.h>
#include <linux/slab.h>

#include "tacc_drv.h"

struct tacc_fence_ctx {
	struct kref ref;
	atomic_t live;			/* fences with tacc ops */
	u32 num_queues;
	char names[TACC_NUM_QUEUES][32];
};

struct tacc_out_fence {
	struct dma_fence base;		/* first: dma_fence_free() frees it */
	spinlock_t lock;
	struct tacc_fence_ctx *fctx;
	u32 queue;
	struct dma_fence_cb cb;
};

/**
 * tacc_fence_ctx_create() - the fence context of a function.
 * @tdev: the function (its PCI name names the timelines).
 *
 * Return: 0, or -ENOMEM.  tacc_fence_ctx_put(tdev->fctx) drops it.
 */
int tacc_fence_ctx_create(struct tacc_device *tdev)
{
	struct tacc_fence_ctx *fctx;
	u32 i;

	fctx = kzalloc(sizeof(*fctx), GFP_KERNEL);
	if (!fctx)
		return -ENOMEM;
	kref_init(&fctx->ref);
	fctx->num_queues = TACC_NUM_QUEUES;
	for (i = 0; i < TACC_NUM_QUEUES; i++)
		snprintf(fctx->names[i], sizeof(fctx->names[i]), "%s-q%u",
			 pci_name(tdev->pdev), i);
	tdev->fctx = fctx;
	return 0;
}

static void tacc_fence_ctx_release(struct kref *ref)
{
	kfree(container_of(ref, struct tacc_fence_ctx, ref));
}

void tacc_fence_ctx_put(struct tacc_fence_ctx *fctx)
{
	if (fctx)
		kref_put(&fctx->ref, tacc_fence_ctx_release);
}

int tacc_fence_ctx_live(struct tacc_fence_ctx *fctx)
{
	return fctx ? atomic_read(&fctx->live) : 0;
}

/*
 * A new fence with tacc ops: one fctx and one module reference; @counted
 * fences (all but the driver's own scrub jobs, whose last one the kernel
 * entity keeps) show in the live count.
 */
static void tacc_fence_ctx_attach(struct tacc_fence_ctx *fctx, bool counted)
{
	kref_get(&fctx->ref);
	if (!counted)
		return;
	__module_get(THIS_MODULE);	/* our caller runs module code: live */
	atomic_inc(&fctx->live);
}

/*
 * Last thing a release does.  The module's memory is freed only after an
 * RCU grace period once its count is zero (free_module()), and the few
 * instructions left after module_put() run with preemption possible but
 * no sleep: the same window every module_put() from module code has.
 */
static void tacc_fence_ctx_detach(struct tacc_fence_ctx *fctx, bool counted)
{
	if (counted)
		atomic_dec(&fctx->live);
	tacc_fence_ctx_put(fctx);
}

/*
 * Scrub fences (the driver's own kernel context) never leave the driver: the
 * kernel entity keeps its last one until the function is removed, so they
 * hold no module reference (else rmmod could never start); tacc_exit()'s
 * rcu_barrier() outlasts the RCU-deferred put of the last one.
 */

static const char *tacc_fence_driver_name(struct dma_fence *f)
{
	return DRIVER_NAME;
}

/* ------------------------------------------------------- hardware fence ---- */

static const char *tacc_hw_fence_timeline_name(struct dma_fence *f)
{
	struct tacc_fence *fence = to_tacc_fence(f);

	return fence->fctx->names[fence->queue];
}

static void tacc_hw_fence_release(struct dma_fence *f)
{
	struct tacc_fence *fence = to_tacc_fence(f);
	bool counted = !fence->kernel;

	tacc_fence_ctx_detach(fence->fctx, counted);
	dma_fence_free(f);
	if (counted)
		module_put(THIS_MODULE);
}

static const struct dma_fence_ops tacc_hw_fence_ops = {
	.get_driver_name = tacc_fence_driver_name,
	.get_timeline_name = tacc_hw_fence_timeline_name,
	.release = tacc_hw_fence_release,
};

/**
 * tacc_hw_fence_init() - initialise the hardware fence of a job in run_job.
 * @fence: the job's fence (allocated at submit).
 * @q: its queue; q->lock is the fence's lock and is held.
 */
void tacc_hw_fence_init(struct tacc_fence *fence, struct tacc_queue *q)
{
	lockdep_assert_held(&q->lock);
	fence->fctx = q->tdev->fctx;
	fence->queue = q->idx;
	dma_fence_init(&fence->base, &tacc_hw_fence_ops, &q->lock, q->fence_ctx,
		       ++q->fence_seqno);
	tacc_fence_ctx_attach(fence->fctx, !fence->kernel);
}

/* ------------------------------------------------------------ out fence ---- */

static const char *tacc_out_fence_timeline_name(struct dma_fence *f)
{
	struct tacc_out_fence *o = container_of(f, struct tacc_out_fence, base);

	return o->fctx->names[o->queue];
}

static void tacc_out_fence_release(struct dma_fence *f)
{
	struct tacc_out_fence *o = container_of(f, struct tacc_out_fence, base);

	tacc_fence_ctx_detach(o->fctx, true);
	dma_fence_free(f);
	module_put(THIS_MODULE);
}

static const struct dma_fence_ops tacc_out_fence_ops = {
	.get_driver_name = tacc_fence_driver_name,
	.get_timeline_name = tacc_out_fence_timeline_name,
	.release = tacc_out_fence_release,
};

static void tacc_out_fence_cb(struct dma_fence *finished, struct dma_fence_cb *cb)
{
	struct tacc_out_fence *o = container_of(cb, struct tacc_out_fence, cb);

	if (finished->error)
		dma_fence_set_error(&o->base, finished->error);
	dma_fence_signal(&o->base);
	dma_fence_put(&o->base);	/* the callback's reference */
}

/**
 * tacc_out_fence_alloc() - memory for a job's out fence, before the point of
 * no return of a submit.
 *
 * Return: the fence memory, or NULL.  kfree() it if never armed.
 */
struct dma_fence *tacc_out_fence_alloc(void)
{
	struct tacc_out_fence *o = kzalloc(sizeof(*o), GFP_KERNEL);

	return o ? &o->base : NULL;
}

/**
 * tacc_out_fence_arm() - make @f follow @finished.
 * @f: from tacc_out_fence_alloc().
 * @tdev: the function.
 * @queue: the job's queue.
 * @context: the fence context (per file and queue).
 * @seqno: the job's sequence number (monotonic per file).
 * @finished: the scheduler's finished fence of the job.
 *
 * @f signals, with @finished's error, when @finished does.  The caller owns
 * one reference to @f.
 */
void tacc_out_fence_arm(struct dma_fence *f, struct tacc_device *tdev, u32 queue,
			u64 context, u64 seqno, struct dma_fence *finished)
{
	struct tacc_out_fence *o = container_of(f, struct tacc_out_fence, base);

	spin_lock_init(&o->lock);
	o->fctx = tdev->fctx;
	o->queue = queue;
	dma_fence_init(&o->base, &tacc_out_fence_ops, &o->lock, context, seqno);
	tacc_fence_ctx_attach(o->fctx, true);
	dma_fence_get(&o->base);	/* for the callback */
	if (dma_fence_add_callback(finished, &o->cb, tacc_out_fence_cb))
		tacc_out_fence_cb(finished, &o->cb);	/* already signalled */
}

/* --------------------------------------------- failed jobs' statuses ---- */

/*
 * WAIT must never report success for a failed job (docs/uapi.md "WAIT").  A
 * job whose fence the file no longer holds is over; its status is exact when
 * every failure is remembered: a failed job's seqno is recorded here (before
 * its fence is forgotten), a seqno without a record succeeded.  At most
 * TACC_FAILED_RECORDS records per file: the oldest goes first, and every
 * seqno up to it (which may have failed) then reads -ENOENT ("unknown").
 */
#define TACC_FAILED_RECORDS	1024

void tacc_failures_init(struct tacc_failures *h)
{
	xa_init(&h->xa);
	mutex_init(&h->lock);
	h->floor = 0;
	h->count = 0;
}

void tacc_failures_fini(struct tacc_failures *h)
{
	xa_destroy(&h->xa);
	mutex_destroy(&h->lock);
}

/* Process context: record that job @seqno failed with @error (< 0). */
void tacc_failures_record(struct tacc_failures *h, u64 seqno, int error)
{
	unsigned long first = 0;

	if (!error)
		return;
	mutex_lock(&h->lock);
	if (xa_is_err(xa_store(&h->xa, seqno, xa_mk_value(-error), GFP_KERNEL))) {
		h->floor = max(h->floor, seqno);	/* no memory: unknown, not success */
	} else if (++h->count > TACC_FAILED_RECORDS &&
		   xa_find(&h->xa, &first, ULONG_MAX, XA_PRESENT)) {
		xa_erase(&h->xa, first);
		h->count--;
		h->floor = max_t(u64, h->floor, first);
	}
	mutex_unlock(&h->lock);
}

/*
 * The final status of a finished job the file no longer holds a fence of:
 * 0 with *status set, or -ENOENT when its record may have been dropped.
 */
int tacc_failures_status(struct tacc_failures *h, u64 seqno, int *status)
{
	void *e;
	int ret = 0;

	mutex_lock(&h->lock);
	e = xa_load(&h->xa, seqno);
	if (e)
		*status = -(int)xa_to_value(e);
	else if (seqno <= h->floor)
		ret = -ENOENT;
	else
		*status = 0;
	mutex_unlock(&h->lock);
	return ret;
}
