// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio_job - jobs of the virtio-tacc frontend (docs/virtio.md §6.3,
 * §6.5, §11, "Linux frontend").
 *
 * One SUBMIT ioctl is one job: its commands are checked and translated here
 * (GEM handle + offset -> device VA of the file's context) into the job's
 * part of a submit buffer, and the job is staged.  Staged jobs are queued in
 * batches (§11: "SHOULD batch jobs, one kick per batch"): one submit buffer
 * carries up to TACC_V_BATCH_JOBS ready jobs of one ring.  A ring with fewer
 * than virtio_ring_batches (module parameter, TACC_V_RING_BATCHES; 0: no
 * limit, one buffer per job) buffers in flight takes its ready jobs at once (an
 * idle ring adds no latency); a busier ring's jobs wait for its next used
 * buffer, whose callback queues them all in one buffer with one kick.  So
 * the device notifies once per batch (event index) and a stream of jobs
 * costs one kick and one interrupt per batch, not per job.
 *
 * A job with in-fences is staged at once too (the ioctl does not wait): it
 * becomes ready when they signalled (a fence callback kicks the flush
 * work); jobs of its (context, ring) behind it wait for it, so seqnos reach
 * the device in order (§6.3).  The used buffer's job statuses signal the
 * jobs' dma_fences.  A reset or removal fails every job staged or in flight.
 */

#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/module.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include <drm/drm_drv.h>
#include <drm/drm_syncobj.h>

#include "include/tacc_hw.h"
#include "tacc_cmd.h"
#include "tacc_trace.h"
#include "tacc_virtio.h"

static unsigned int tacc_v_ring_batches = TACC_V_RING_BATCHES;
module_param_named(virtio_ring_batches, tacc_v_ring_batches, uint, 0644);
MODULE_PARM_DESC(virtio_ring_batches,
		 "virtio-tacc: submit buffers in flight per ring before new jobs are held for one batch (0: never held, one buffer per job)");

/* One job's part of a submit buffer. */
struct tacc_vjob_req {
	struct tacc_virtio_job job;
	struct tacc_desc cmds[];
};

/* -------------------------------------------------------------- fences ---- */

static const char *tacc_vfence_name(struct dma_fence *f)
{
	return "tacc-virtio";
}

static void tacc_vjob_put_deps(struct tacc_vjob *job)
{
	while (job->ndeps)
		dma_fence_put(job->deps[--job->ndeps]);
}

/*
 * A job's fence may outlive the file, the device and an rmmod attempt (a
 * sync_file exported from an out-syncobj): it holds a module reference from
 * dma_fence_init() on, dropped last here (as tacc_fence.c's fences do).
 */
static void tacc_vjob_release(struct dma_fence *f)
{
	struct tacc_vjob *job = container_of(f, struct tacc_vjob, fence);

	tacc_vjob_put_deps(job);
	kfree(job->buf);
	dma_fence_free(f);
	module_put(THIS_MODULE);
}

static const struct dma_fence_ops tacc_vfence_ops = {
	.get_driver_name = tacc_vfence_name,
	.get_timeline_name = tacc_vfence_name,
	.release = tacc_vjob_release,
};

/* A job that never reached the queue (its fence not initialised). */
static void tacc_vjob_free_unqueued(struct tacc_vjob *job)
{
	tacc_vjob_put_deps(job);
	kfree(job->buf);
	kfree(job);
}

static int tacc_vjob_status_errno(u16 status)
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

/*
 * The errno of job @i of a used batch that wrote @len response bytes;
 * *@ran: the job ran on the device (its status is the device's, counted in
 * its fence slot's failed total when it is not OK).
 */
static int tacc_vbatch_errno(const struct tacc_vbatch *b, unsigned int len, u32 i, bool *ran,
			     u16 *status)
{
	const struct tacc_virtio_submit_resp *r = b->resp;
	const struct tacc_virtio_job_status *st = b->resp + sizeof(*r);

	*ran = false;
	*status = TACC_ST_OK;
	if (len < sizeof(*r))
		return -EIO;
	if (le32_to_cpu(r->status))	/* the batch was refused whole */
		return tacc_vstatus_errno(le32_to_cpu(r->status));
	if (le32_to_cpu(r->njobs) != b->njobs || len < sizeof(*r) + (i + 1) * sizeof(*st))
		return -EIO;
	*ran = true;
	*status = le16_to_cpu(st[i].status);
	return tacc_vjob_status_errno(*status);
}

static u64 tacc_vjob_tag(const struct tacc_vjob *job)
{
	return le64_to_cpu(((const struct tacc_virtio_job *)job->buf)->tag);
}

/*
 * Called with vd->submit_lock held; drops the queue's reference of @job.
 * @status: the device's (enum tacc_status), TACC_ST_OK if it did not run.
 */
static void tacc_vjob_complete(struct tacc_vdev *vd, struct tacc_vjob *job, int error,
			       u16 status)
{
	struct tacc_vctx *ctx = job->ctx;

	lockdep_assert_held(&vd->submit_lock);
	if (job->queued_ns) {	/* fdinfo: the ring's time with this client's jobs queued */
		u64 now = ktime_get_ns();
		u64 from = max(job->queued_ns, ctx->busy_end[job->ring]);

		if (now > from)
			ctx->busy_ns[job->ring] += now - from;
		ctx->busy_end[job->ring] = now;
	}
	ctx->jobs[job->ring]++;
	/* hw_job 0, no device times: the backend's DISPATCH trace record has them */
	trace_tacc_job_done(vd->devid, ctx->id, job->ring, job->fence.seqno, tacc_vjob_tag(job),
			    0, status, error, 0, 0);
	list_del(&job->node);
	if (error)
		dma_fence_set_error(&job->fence, error);
	dma_fence_signal(&job->fence);
	kfree(job->buf);
	job->buf = NULL;
	if (atomic_dec_and_test(&ctx->inflight)) {
		wake_up_all(&vd->idle_wq);
		/* a closed file's context waits for this (vd->stuck): destroyed now */
		if (READ_ONCE(ctx->stuck))
			queue_work(system_long_wq, &vd->reap_work);
	}
	dma_fence_put(&job->fence);
}

static void tacc_vbatch_free(struct tacc_vbatch *b)
{
	kfree(b);
}

/* A batch came back (used, or dropped by a reset: then @error for all). */
static void tacc_vbatch_done(struct tacc_vdev *vd, struct tacc_vbatch *b, unsigned int len,
			     int error)
{
	struct tacc_vjob *job, *tmp;
	u32 i = 0;

	lockdep_assert_held(&vd->submit_lock);
	list_del(&b->node);
	vd->ring_batches[b->ring]--;
	list_for_each_entry_safe(job, tmp, &b->jobs, node) {
		u16 status = TACC_ST_OK;
		bool ran = false;
		int err = error ?: tacc_vbatch_errno(b, len, i++, &ran, &status);

		if (ran && err)	/* as the device counts it in the fence slot */
			WRITE_ONCE(job->ctx->dev_failed[job->ring],
				   job->ctx->dev_failed[job->ring] + 1);
		tacc_vjob_complete(vd, job, err, status);
	}
	tacc_vbatch_free(b);
}

/* ------------------------------------------------------------ batching ---- */

static void tacc_vdep_signalled(struct dma_fence *f, struct dma_fence_cb *cb)
{
	struct tacc_vjob *job = container_of(cb, struct tacc_vjob, dep_cb);

	WRITE_ONCE(job->dep_armed, 0);
	mod_delayed_work(system_wq, &job->ctx->vd->flush_work, 0);
	dma_fence_put(&job->fence);	/* the callback's reference */
}

/*
 * Whether every in-fence of @job signalled; if not, a callback on the first
 * one that did not (once) queues the flush work when it does.
 */
static bool tacc_vjob_ready(struct tacc_vjob *job)
{
	u32 i;

	if (READ_ONCE(job->dep_armed))
		return false;
	for (i = 0; i < job->ndeps; i++) {
		if (dma_fence_is_signaled(job->deps[i]))
			continue;
		dma_fence_get(&job->fence);
		WRITE_ONCE(job->dep_armed, i + 1);
		if (!dma_fence_add_callback(job->deps[i], &job->dep_cb, tacc_vdep_signalled))
			return false;
		WRITE_ONCE(job->dep_armed, 0);	/* signalled meanwhile */
		dma_fence_put(&job->fence);
	}
	return true;
}

/* Up to TACC_V_BATCH_JOBS ready staged jobs of @ring, in order per (ctx, ring). */
static u32 tacc_vcollect(struct tacc_vdev *vd, u16 ring, struct tacc_vjob **jobs)
{
	DECLARE_BITMAP(blocked, TACC_NUM_CONTEXTS) = { 0 };
	struct tacc_vjob *job;
	u32 n = 0;

	list_for_each_entry(job, &vd->staged, node) {
		if (job->ring != ring || test_bit(job->ctx->id, blocked))
			continue;
		if (!tacc_vjob_ready(job)) {
			__set_bit(job->ctx->id, blocked);	/* its successors wait */
			continue;
		}
		jobs[n++] = job;
		if (n == TACC_V_BATCH_JOBS)
			break;
	}
	return n;
}

static struct tacc_vbatch *tacc_vbatch_build(struct tacc_vjob **jobs, u32 n, u16 ring)
{
	size_t resp_len = sizeof(struct tacc_virtio_submit_resp) +
			  n * sizeof(struct tacc_virtio_job_status);
	struct tacc_vbatch *b;
	u32 i;

	/* one allocation: the batch, its scatterlist, then the response */
	b = kzalloc(struct_size(b, sg, n + 2) + resp_len, GFP_ATOMIC);
	if (!b)
		return NULL;
	b->resp = (void *)&b->sg[n + 2];
	b->resp_len = resp_len;
	INIT_LIST_HEAD(&b->jobs);
	b->njobs = n;
	b->ring = ring;
	tacc_vhdr(&b->hdr.hdr, TACC_VIRTIO_SUBMIT, jobs[0]->ctx->id);
	b->hdr.hdr.tag = ((struct tacc_vjob_req *)jobs[0]->buf)->job.tag;
	b->hdr.njobs = cpu_to_le32(n);
	/* one list per entry: virtqueue_add_sgs() walks each to its end mark */
	sg_init_one(&b->sg[0], &b->hdr, sizeof(b->hdr));
	for (i = 0; i < n; i++)
		sg_init_one(&b->sg[i + 1], jobs[i]->buf, jobs[i]->len);
	sg_init_one(&b->sg[n + 1], b->resp, b->resp_len);
	return b;
}

/* Queues what is ready; true if the device must be notified (after unlock). */
static bool tacc_vflush_locked(struct tacc_vdev *vd)
{
	struct tacc_vjob *jobs[TACC_V_BATCH_JOBS];
	struct scatterlist *sgs[TACC_V_BATCH_JOBS + 2];
	struct tacc_vbatch *b;
	bool added = false;
	u32 i, n, limit;
	u16 r;

	lockdep_assert_held(&vd->submit_lock);
	if (vd->gone)
		return false;
	limit = READ_ONCE(tacc_v_ring_batches) ?: U32_MAX;
	for (r = 0; r < vd->num_rings; r++) {
		while (vd->ring_batches[r] < limit) {
			n = tacc_vcollect(vd, r, jobs);
			if (!n)
				break;
			b = tacc_vbatch_build(jobs, n, r);
			if (!b)
				goto retry;
			for (i = 0; i < n + 2; i++)
				sgs[i] = &b->sg[i];
			if (virtqueue_add_sgs(vd->submitq, sgs, n + 1, 1, b, GFP_ATOMIC)) {
				tacc_vbatch_free(b);
				goto retry;
			}
			vd->st.batches++;
			for (i = 0; i < n; i++) {
				tacc_vjob_put_deps(jobs[i]);
				WRITE_ONCE(jobs[i]->early, i + 1 < n);
				WRITE_ONCE(jobs[i]->queued, true);
				jobs[i]->queued_ns = ktime_get_ns();
				list_move_tail(&jobs[i]->node, &b->jobs);
				/* hw_job 0 (the backend numbers jobs), tail: the buffer's number */
				trace_tacc_job_start(vd->devid, jobs[i]->ctx->id, r,
						     jobs[i]->fence.seqno,
						     tacc_vjob_tag(jobs[i]), 0,
						     lower_32_bits(vd->st.batches));
			}
			list_add_tail(&b->node, &vd->inflight);
			vd->ring_batches[r]++;
			added = true;
		}
	}
	goto out;
retry:	/* no memory or descriptors: a used buffer, or the work, tries again */
	if (list_empty(&vd->inflight))
		mod_delayed_work(system_wq, &vd->flush_work, 1);
out:
	if (!added || !virtqueue_kick_prepare(vd->submitq))
		return false;
	vd->st.kicks++;
	return true;
}

static void tacc_vflush(struct tacc_vdev *vd)
{
	bool notify;

	spin_lock_irq(&vd->submit_lock);
	notify = tacc_vflush_locked(vd);
	spin_unlock_irq(&vd->submit_lock);
	if (notify)
		virtqueue_notify(vd->submitq);
}

static void tacc_vflush_work(struct work_struct *w)
{
	tacc_vflush(container_of(w, struct tacc_vdev, flush_work.work));
}

void tacc_vjobs_init(struct tacc_vdev *vd)
{
	spin_lock_init(&vd->submit_lock);
	INIT_LIST_HEAD(&vd->staged);
	INIT_LIST_HEAD(&vd->inflight);
	INIT_DELAYED_WORK(&vd->flush_work, tacc_vflush_work);
}

void tacc_vsubmit_done(struct virtqueue *vq)
{
	struct tacc_vdev *vd = vq->vdev->priv;
	u64 t0 = ktime_get_ns();
	struct tacc_vbatch *b;
	unsigned long flags;
	unsigned int len;
	bool notify;

	spin_lock_irqsave(&vd->submit_lock, flags);
	vd->st.irqs++;
	do {
		virtqueue_disable_cb(vq);
		while ((b = virtqueue_get_buf(vq, &len))) {
			vd->st.used++;
			tacc_vbatch_done(vd, b, len, 0);
		}
	} while (!virtqueue_enable_cb(vq));
	notify = tacc_vflush_locked(vd);	/* the held jobs: one buffer per ring */
	vd->st.complete_ns += ktime_get_ns() - t0;
	spin_unlock_irqrestore(&vd->submit_lock, flags);
	if (notify)
		virtqueue_notify(vq);
}

/* A staged job's in-fence callback, gone (false: it ran and dropped its reference). */
static void tacc_vjob_disarm(struct tacc_vjob *job)
{
	u32 armed = READ_ONCE(job->dep_armed);

	if (armed && dma_fence_remove_callback(job->deps[armed - 1], &job->dep_cb)) {
		WRITE_ONCE(job->dep_armed, 0);
		dma_fence_put(&job->fence);
	}
}

/* After the device was reset: it uses no buffer any more. */
void tacc_vjobs_fail(struct tacc_vdev *vd, int error)
{
	struct tacc_vbatch *b;
	struct tacc_vjob *job;
	unsigned int len;

	spin_lock_irq(&vd->submit_lock);
	while ((b = virtqueue_get_buf(vd->submitq, &len)))
		tacc_vbatch_done(vd, b, len, 0);
	while ((b = virtqueue_detach_unused_buf(vd->submitq)))
		tacc_vbatch_done(vd, b, 0, error);
	WARN_ON(!list_empty(&vd->inflight));
	while ((job = list_first_entry_or_null(&vd->staged, struct tacc_vjob, node))) {
		tacc_vjob_disarm(job);
		tacc_vjob_complete(vd, job, error, TACC_ST_OK);
	}
	spin_unlock_irq(&vd->submit_lock);
	/* no callback is left to queue the work again */
	cancel_delayed_work_sync(&vd->flush_work);
}

/* Fails the context's staged jobs (waiting for in-fences, or for room). */
static void tacc_vctx_cancel_staged(struct tacc_vctx *ctx)
{
	struct tacc_vdev *vd = ctx->vd;
	struct tacc_vjob *job, *tmp;
	u32 n = 0;

	spin_lock_irq(&vd->submit_lock);
	list_for_each_entry_safe(job, tmp, &vd->staged, node) {
		if (job->ctx != ctx)
			continue;
		tacc_vjob_disarm(job);
		tacc_vjob_complete(vd, job, -ECANCELED, TACC_ST_OK);
		n++;
	}
	spin_unlock_irq(&vd->submit_lock);
	if (n)
		drm_warn(&vd->drm, "context %u: %u jobs unqueued after %u ms in close: cancelled\n",
			 ctx->id, n, tacc_close_wait_ms);
}

static bool tacc_vctx_quiet(struct tacc_vctx *ctx, bool unplug)
{
	return !atomic_read(&ctx->inflight) || (unplug && READ_ONCE(ctx->vd->unplugging));
}

/*
 * The close paths' uninterruptible wait for the context's jobs (@unplug: or
 * a removal), bounded: after close_wait_ms the jobs not yet in the device
 * are cancelled (a job may wait on an in-syncobj nobody signals); after as
 * long again the device's own are given up on (a device that never completes
 * them must not hold close() forever).  The context is then stuck: later
 * waits only check, until its jobs are done.  Returns true if it is quiet.
 */
static bool tacc_vctx_wait_bounded(struct tacc_vctx *ctx, bool unplug)
{
	unsigned long t = msecs_to_jiffies(READ_ONCE(tacc_close_wait_ms));
	struct tacc_vdev *vd = ctx->vd;

	if (tacc_vctx_quiet(ctx, unplug)) {
		WRITE_ONCE(ctx->stuck, false);
		return true;
	}
	if (READ_ONCE(ctx->stuck))
		return false;
	if (wait_event_timeout(vd->idle_wq, tacc_vctx_quiet(ctx, unplug), t))
		return true;
	tacc_vctx_cancel_staged(ctx);
	if (wait_event_timeout(vd->idle_wq, tacc_vctx_quiet(ctx, unplug), t))
		return true;
	WRITE_ONCE(ctx->stuck, true);
	drm_warn(&vd->drm, "context %u: %d jobs held by the device after %u ms in close: not waited for\n",
		 ctx->id, atomic_read(&ctx->inflight), 2 * tacc_close_wait_ms);
	return false;
}

/* After the context was seen idle: the completion that woke us may still be running. */
static void tacc_vctx_sync_complete(struct tacc_vctx *ctx)
{
	spin_lock_irq(&ctx->vd->submit_lock);
	spin_unlock_irq(&ctx->vd->submit_lock);
}

/*
 * Waits until the context has no job in flight: before its context goes
 * (file release, outside any drm_dev_enter() section: a removal fails the
 * jobs).  Bounded (tacc_vctx_wait_bounded()): false if the device still
 * holds jobs of the context.
 */
bool tacc_vctx_wait_idle(struct tacc_vctx *ctx)
{
	if (!tacc_vctx_wait_bounded(ctx, false))
		return false;
	tacc_vctx_sync_complete(ctx);
	return true;
}

/* A stuck context (tacc_vctx_wait_idle() false) whose jobs have all ended since. */
bool tacc_vctx_ended(struct tacc_vctx *ctx)
{
	if (atomic_read(&ctx->inflight))
		return false;
	tacc_vctx_sync_complete(ctx);
	return true;
}

/*
 * Waits until the context has no job in flight, before a request the device
 * refuses under jobs (inside a drm_dev_enter() section): a removal that
 * started ends the wait with -ENODEV, so it does not wait for the jobs.
 * Uninterruptible (GEM_CLOSE, close()): bounded, -ETIMEDOUT if the device
 * still holds jobs of the context (tacc_vctx_wait_bounded()).
 */
int tacc_vctx_wait_quiet(struct tacc_vctx *ctx, bool intr)
{
	struct tacc_vdev *vd = ctx->vd;
	int ret = 0;

	if (intr)
		ret = wait_event_interruptible(vd->idle_wq, !atomic_read(&ctx->inflight) ||
					       READ_ONCE(vd->unplugging));
	else if (!tacc_vctx_wait_bounded(ctx, true))
		ret = -ETIMEDOUT;
	if (ret)
		return ret;
	return atomic_read(&ctx->inflight) ? -ENODEV : 0;
}

void tacc_vctx_seq_fini(struct tacc_vctx *ctx)
{
	u32 i;

	for (i = 0; i < TACC_V_SEQ_SLOTS; i++) {
		dma_fence_put(ctx->slot[i].fence);
		ctx->slot[i].fence = NULL;
	}
	tacc_failures_fini(&ctx->failed);
}

/* ------------------------------------------------------------ commands ---- */

/*
 * One command: checked by the validator every function kind shares
 * (tacc_cmd.c, as on a PF or VF), its operands resolved in this file's
 * bindings.  ctx, job, index and flags are the backend's (docs/virtio.md 6.3).
 */
static int tacc_vcmd_translate(struct drm_file *file, const struct drm_tacc_cmd2 *c, u32 caps,
			       struct tacc_desc *d)
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
		/* enum tacc_cmd_kind and tacc_vbo_va()'s types share their order */
		ret = tacc_vbo_va(file, &c->op[i], spec.op[i].len, spec.op[i].align,
				  spec.op[i].kind, &va[i]);
		if (ret)
			return ret;
	}
	tacc_cmd_desc(c, &spec, va, d);
	return 0;
}

/* -------------------------------------------------------------- submit ---- */

static int tacc_vsubmit_check(struct tacc_vdev *vd, const struct drm_tacc_submit *args)
{
	if (args->flags || (args->cmd_size != sizeof(struct drm_tacc_cmd) &&
			    args->cmd_size != sizeof(struct drm_tacc_cmd2)) || !args->num_cmds ||
	    args->num_cmds > min_t(u32, vd->max_job_cmds, TACC_V_MAX_CMDS) ||
	    args->queue >= vd->num_rings || args->num_in_syncobjs > DRM_TACC_MAX_IN_SYNCOBJS)
		return -EINVAL;
	return 0;
}

/* The in-fences: the job is queued once they signalled (the ioctl does not wait). */
static int tacc_vjob_deps(struct drm_file *file, const struct drm_tacc_submit *args,
			  struct tacc_vjob *job)
{
	u32 __user *uh = u64_to_user_ptr(args->in_syncobjs);
	struct dma_fence *f;
	u32 i, h;
	int ret;

	for (i = 0; i < args->num_in_syncobjs; i++) {
		if (get_user(h, uh + i))
			return -EFAULT;
		ret = drm_syncobj_find_fence(file, h, 0, 0, &f);
		if (ret)
			return ret;
		if (dma_fence_is_signaled(f))
			dma_fence_put(f);
		else
			job->deps[job->ndeps++] = f;
	}
	return 0;
}

/* The job's part of a submit buffer: job header and translated commands. */
static struct tacc_vjob *tacc_vjob_build(struct drm_file *file,
					 const struct drm_tacc_submit *args)
{
	const u8 __user *ucmds = u64_to_user_ptr(args->cmds);
	struct tacc_vctx *ctx = file->driver_priv;
	struct tacc_vjob_req *req;
	struct drm_tacc_cmd2 cmd;
	struct drm_tacc_cmd v1;
	struct tacc_vjob *job;
	int ret = -ENOMEM;
	u32 i;

	job = kzalloc(sizeof(*job), GFP_KERNEL);
	if (!job)
		return ERR_PTR(-ENOMEM);
	job->len = struct_size(req, cmds, args->num_cmds);
	job->buf = kzalloc(job->len, GFP_KERNEL);
	if (!job->buf)
		goto err_free;
	job->ctx = ctx;
	job->ring = args->queue;
	req = job->buf;
	for (i = 0; i < args->num_cmds; i++) {
		ret = -EFAULT;
		if (args->cmd_size == sizeof(cmd)) {
			if (copy_from_user(&cmd, ucmds + (size_t)i * sizeof(cmd), sizeof(cmd)))
				goto err_free;
		} else {
			if (copy_from_user(&v1, ucmds + (size_t)i * sizeof(v1), sizeof(v1)))
				goto err_free;
			ret = tacc_cmd_from_v1(&v1, &cmd);
			if (ret)
				goto err_free;
		}
		ret = tacc_vcmd_translate(file, &cmd, ctx->vd->caps, &req->cmds[i]);
		if (ret)
			goto err_free;
		job->mix |= BIT(cmd.opcode);	/* translated: a known opcode, < 32 */
		if (cmd.opcode >= DRM_TACC_OP_COPY_H2D && cmd.opcode <= DRM_TACC_OP_COPY_D2D)
			job->bytes += req->cmds[i].copy.len;
	}
	req->job.ctx = cpu_to_le32(ctx->id);
	req->job.ring = cpu_to_le16(args->queue);
	req->job.ncmds = cpu_to_le16(args->num_cmds);
	req->job.tag = cpu_to_le64(cmd.tag);	/* of the last command, as on the PF */
	ret = tacc_vjob_deps(file, args, job);
	if (ret)
		goto err_free;
	spin_lock_init(&job->lock);
	return job;

err_free:
	tacc_vjob_free_unqueued(job);
	return ERR_PTR(ret);
}

/* Stages @job (the queue's reference) and queues what is ready. */
static int tacc_vjob_stage(struct tacc_vdev *vd, struct tacc_vjob *job)
{
	bool notify = false;
	int ret = -ENODEV;

	spin_lock_irq(&vd->submit_lock);
	if (!vd->gone) {
		dma_fence_get(&job->fence);	/* the queue's, dropped on completion */
		list_add_tail(&job->node, &vd->staged);
		atomic_inc(&job->ctx->inflight);
		vd->st.jobs++;
		notify = tacc_vflush_locked(vd);
		ret = 0;
	}
	spin_unlock_irq(&vd->submit_lock);
	if (notify)
		virtqueue_notify(vd->submitq);
	return ret;
}

/* Under ctx->submit_lock: seqno order is staging order. */
static int tacc_vjob_push(struct drm_file *file, struct tacc_vjob *job, u32 ring,
			  u32 out_syncobj, u64 *seqno)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct tacc_vjob_req *req = job->buf;
	struct drm_syncobj *syncobj = NULL;
	u64 seq = ctx->last_seqno + 1;
	u32 slot = seq % TACC_V_SEQ_SLOTS;
	int ret;

	lockdep_assert_held(&ctx->submit_lock);
	if (atomic_read(&ctx->inflight) >= TACC_V_MAX_INFLIGHT ||
	    (ctx->slot[slot].fence && !dma_fence_is_signaled(ctx->slot[slot].fence))) {
		tacc_vjob_free_unqueued(job);
		return -EAGAIN;
	}
	if (out_syncobj) {
		syncobj = drm_syncobj_find(file, out_syncobj);
		if (!syncobj) {
			tacc_vjob_free_unqueued(job);
			return -ENOENT;
		}
	}
	/* the slot's job is over: WAIT finds its failure, if any, in the records */
	if (ctx->slot[slot].fence)
		tacc_failures_record(&ctx->failed, ctx->slot[slot].seqno,
				     ctx->slot[slot].fence->error);
	req->job.seqno = cpu_to_le64(seq);
	dma_fence_init(&job->fence, &tacc_vfence_ops, &job->lock, ctx->fence_ctx + ring, seq);
	__module_get(THIS_MODULE);	/* put by tacc_vjob_release() */
	/* before the job can complete: a WAIT on the seqno finds its fence */
	if (syncobj)
		drm_syncobj_replace_fence(syncobj, &job->fence);
	spin_lock(&ctx->seq_lock);
	dma_fence_put(ctx->slot[slot].fence);
	ctx->slot[slot].seqno = seq;
	ctx->slot[slot].fence = dma_fence_get(&job->fence);
	ctx->last_seqno = seq;
	spin_unlock(&ctx->seq_lock);
	/* before it can start: tracers see submit, start, done in that order */
	trace_tacc_submit(ctx->vd->devid, ctx->id, ring, seq, le64_to_cpu(req->job.tag),
			  le16_to_cpu(req->job.ncmds), job->bytes, job->mix);
	ret = tacc_vjob_stage(ctx->vd, job);
	if (ret) {
		dma_fence_set_error(&job->fence, ret);
		dma_fence_signal(&job->fence);
	}
	dma_fence_put(&job->fence);	/* the submitter's: the slot keeps one */
	*seqno = seq;
	if (syncobj)
		drm_syncobj_put(syncobj);
	return ret;
}

int tacc_vsubmit_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_submit *args = data;
	struct tacc_vjob *job;
	u64 t0;
	int ret, idx;

	ret = tacc_vsubmit_check(to_tacc_vdev(dev), args);
	if (ret)
		return ret;
	t0 = ktime_get_ns();
	job = tacc_vjob_build(file, args);
	if (IS_ERR(job))
		return PTR_ERR(job);
	if (!drm_dev_enter(dev, &idx)) {
		tacc_vjob_free_unqueued(job);
		return -ENODEV;
	}
	mutex_lock(&ctx->submit_lock);
	ret = tacc_vjob_push(file, job, args->queue, args->out_syncobj, &args->seqno);
	mutex_unlock(&ctx->submit_lock);
	drm_dev_exit(idx);
	atomic64_add(ktime_get_ns() - t0, &to_tacc_vdev(dev)->submit_ns);
	return ret;
}

/*
 * §5: the job's fence slot passed its seqno and the slot counts no failure
 * the used buffers have not reported: the job completed OK, although its
 * batch (and its dma_fence) is still out.  The known count is read first:
 * a used job completed before the slot's seqno was read, and the device
 * completes a timeline in order.
 */
static bool tacc_vjob_slot_done(struct tacc_vctx *ctx, struct tacc_vjob *job)
{
	struct tacc_vdev *vd = ctx->vd;
	struct tacc_virtio_fence *fp;
	u32 known, failed;
	bool done;
	u64 seq;
	int idx;

	if (!vd->fences || !drm_dev_enter(&vd->drm, &idx))
		return false;
	fp = &vd->fences[ctx->id * TACC_VIRTIO_NUM_RINGS + job->ring];
	known = READ_ONCE(ctx->dev_failed[job->ring]);
	/* acquire: pairs with the device's write barrier before seqno (release) */
	seq = le64_to_cpu(smp_load_acquire(&fp->seqno));
	failed = le32_to_cpu(READ_ONCE(fp->failed));
	done = seq >= job->fence.seqno && failed == known;
	drm_dev_exit(idx);
	return done;
}

/*
 * A job that is not its batch's last: poll its fence slot (one interrupt per
 * batch comes only when the batch's last job completed); a staged job is
 * polled until it is queued, then so if it is not its batch's last.  1:
 * completed OK, 0: wait for the fence (signalled, its batch's last job, or
 * the deadline passed), <0: a signal.
 */
static int tacc_vwait_poll(struct tacc_vctx *ctx, struct dma_fence *f, s64 timeout_ns)
{
	struct tacc_vjob *job = container_of(f, struct tacc_vjob, fence);
	ktime_t end = ktime_add_ns(ktime_get(), timeout_ns < 0 ? S64_MAX / 2 : timeout_ns);

	if (f->ops != &tacc_vfence_ops)
		return 0;
	for (;;) {
		if (dma_fence_is_signaled(f))
			return 0;
		if (READ_ONCE(job->queued)) {
			if (!READ_ONCE(job->early))
				return 0;
			if (tacc_vjob_slot_done(ctx, job)) {
				atomic64_inc(&ctx->vd->slot_waits);
				return 1;
			}
		}
		if (ktime_after(ktime_get(), end))
			return 0;
		if (signal_pending(current))
			return -ERESTARTSYS;
		usleep_range(TACC_V_POLL_US, 2 * TACC_V_POLL_US);
	}
}

int tacc_vwait_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_wait *args = data;
	struct dma_fence *f = NULL;
	long timeout, ret;
	u32 slot;

	if (args->flags)
		return -EINVAL;
	slot = args->seqno % TACC_V_SEQ_SLOTS;
	spin_lock(&ctx->seq_lock);
	if (!args->seqno || args->seqno > ctx->last_seqno) {
		spin_unlock(&ctx->seq_lock);
		return -EINVAL;
	}
	if (ctx->slot[slot].seqno == args->seqno)
		f = dma_fence_get(ctx->slot[slot].fence);
	spin_unlock(&ctx->seq_lock);
	if (!f)		/* a slot is reused only once its job completed */
		return tacc_failures_status(&ctx->failed, args->seqno, &args->status);

	ret = tacc_vwait_poll(ctx, f, args->timeout_ns);
	if (ret) {
		args->status = 0;
		dma_fence_put(f);
		return ret < 0 ? ret : 0;
	}
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

/* ------------------------------------------------------------- debugfs ---- */

/* virtio_stats: `name value` lines, counters since probe (tools/bench/vm_virt.py). */
static int virtio_stats_show(struct seq_file *m, void *unused)
{
	struct tacc_vdev *vd = m->private;
	struct tacc_vstats st;
	int idx;

	spin_lock_irq(&vd->submit_lock);
	st = vd->st;
	spin_unlock_irq(&vd->submit_lock);
	seq_printf(m, "jobs %llu\nbatches %llu\nkicks %llu\nirqs %llu\nused %llu\n",
		   st.jobs, st.batches, st.kicks, st.irqs, st.used);
	seq_printf(m, "submit_ns %lld\ncomplete_ns %llu\n",
		   atomic64_read(&vd->submit_ns), st.complete_ns);
	seq_printf(m, "slot_waits %lld\nfence_page %d\n", atomic64_read(&vd->slot_waits),
		   !!vd->fences);
	seq_printf(m, "ctrl_timeouts %lld\nctrl_late %lld\nctrl_short %lld\n",
		   atomic64_read(&vd->ctrl_timeouts), atomic64_read(&vd->ctrl_late),
		   atomic64_read(&vd->ctrl_short));
	seq_printf(m, "leaked_bos %lld\nleaked_pages %lld\nctx_stuck %lld\nctx_reaped %lld\n",
		   atomic64_read(&vd->leaked_bos), atomic64_read(&vd->leaked_pages),
		   atomic64_read(&vd->ctx_stuck), atomic64_read(&vd->ctx_reaped));
	seq_printf(m, "late_pending %d\nlate_settled %lld\nctx_lost %lld\nva_lost %lld\n",
		   atomic_read(&vd->late_pending), atomic64_read(&vd->late_settled),
		   atomic64_read(&vd->ctx_lost), atomic64_read(&vd->va_lost));
	if (drm_dev_enter(&vd->drm, &idx)) {	/* the configuration space, live */
		seq_printf(m, "page_entries %u\n", tacc_vpage_entries(vd));
		drm_dev_exit(idx);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(virtio_stats);

/* The node's per-user counts (tacc_quota.c), as a PCI function's tacc/users. */
static int virtio_users_show(struct seq_file *m, void *data)
{
	struct tacc_vdev *vd = m->private;
	char *buf = (char *)__get_free_page(GFP_KERNEL);

	if (!buf)
		return -ENOMEM;
	tacc_quota_emit(&vd->quota, buf);
	seq_puts(m, buf);
	free_page((unsigned long)buf);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(virtio_users);

void tacc_vdebugfs_init(struct tacc_vdev *vd)
{
	struct dentry *root = vd->drm.accel ? vd->drm.accel->debugfs_root : NULL;

	if (IS_ERR_OR_NULL(root))
		return;
	debugfs_create_file("virtio_stats", 0444, root, vd, &virtio_stats_fops);
	debugfs_create_file("users", 0400, root, vd, &virtio_users_fops);
}
