// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio_job - jobs of the virtio-tacc frontend (docs/virtio.md §6.3,
 * §6.5, "Linux frontend").
 *
 * One SUBMIT ioctl is one job: its commands are checked and translated here
 * (GEM handle + offset -> device VA of the file's context), written with the
 * job header into one submit buffer and queued on the submit virtqueue.  The
 * device uses the buffer when the job completed; the submit queue's callback
 * reads the job's status from the response, signals the job's dma_fence and
 * frees the buffer.  A reset or removal fails every job in flight.
 */

#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include <drm/drm_drv.h>
#include <drm/drm_syncobj.h>

#include "include/tacc_hw.h"
#include "tacc_virtio.h"

#define TACC_V_GEMM_MAX_LD	BIT(20)

/* The layout of one submit buffer of one job. */
struct tacc_vsubmit_req {
	struct tacc_virtio_submit hdr;
	struct tacc_virtio_job job;
	struct tacc_desc cmds[];
};

struct tacc_vsubmit_resp {
	struct tacc_virtio_submit_resp resp;
	struct tacc_virtio_job_status job;
};

/* -------------------------------------------------------------- fences ---- */

static const char *tacc_vfence_name(struct dma_fence *f)
{
	return "tacc-virtio";
}

static void tacc_vjob_release(struct dma_fence *f)
{
	struct tacc_vjob *job = container_of(f, struct tacc_vjob, fence);

	kfree(job->buf);
	dma_fence_free(f);
}

static const struct dma_fence_ops tacc_vfence_ops = {
	.get_driver_name = tacc_vfence_name,
	.get_timeline_name = tacc_vfence_name,
	.release = tacc_vjob_release,
};

/* A job that never reached the queue (its fence not initialised). */
static void tacc_vjob_free_unqueued(struct tacc_vjob *job)
{
	kfree(job->buf);
	kfree(job);
}

static int tacc_vjob_errno(const struct tacc_vsubmit_resp *r, unsigned int len)
{
	if (len < sizeof(*r))
		return -EIO;
	if (le32_to_cpu(r->resp.status))	/* the batch was refused whole */
		return tacc_vstatus_errno(le32_to_cpu(r->resp.status));
	if (le32_to_cpu(r->resp.njobs) != 1)
		return -EIO;
	switch (le16_to_cpu(r->job.status)) {
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

/* Called with vd->submit_lock held; drops the queue's reference of @job. */
static void tacc_vjob_complete(struct tacc_vdev *vd, struct tacc_vjob *job, int error)
{
	struct tacc_vctx *ctx = job->ctx;

	lockdep_assert_held(&vd->submit_lock);
	list_del(&job->node);
	if (error)
		dma_fence_set_error(&job->fence, error);
	dma_fence_signal(&job->fence);
	kfree(job->buf);
	job->buf = NULL;
	if (atomic_dec_and_test(&ctx->inflight))
		wake_up_all(&vd->idle_wq);
	dma_fence_put(&job->fence);
}

void tacc_vsubmit_done(struct virtqueue *vq)
{
	struct tacc_vdev *vd = vq->vdev->priv;
	u64 t0 = ktime_get_ns();
	struct tacc_vjob *job;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&vd->submit_lock, flags);
	vd->st.irqs++;
	do {
		virtqueue_disable_cb(vq);
		while ((job = virtqueue_get_buf(vq, &len))) {
			vd->st.used++;
			tacc_vjob_complete(vd, job, tacc_vjob_errno(job->buf + job->out_len, len));
		}
	} while (!virtqueue_enable_cb(vq));
	vd->st.complete_ns += ktime_get_ns() - t0;
	spin_unlock_irqrestore(&vd->submit_lock, flags);
}

/* After the device was reset: it uses no buffer any more. */
void tacc_vjobs_fail(struct tacc_vdev *vd, int error)
{
	struct tacc_vjob *job;
	unsigned int len;

	spin_lock_irq(&vd->submit_lock);
	while ((job = virtqueue_get_buf(vd->submitq, &len)))
		tacc_vjob_complete(vd, job, tacc_vjob_errno(job->buf + job->out_len, len));
	while ((job = virtqueue_detach_unused_buf(vd->submitq)))
		tacc_vjob_complete(vd, job, error);
	WARN_ON(!list_empty(&vd->inflight));
	spin_unlock_irq(&vd->submit_lock);
}

/*
 * Waits until the context has no job in flight: before its context goes
 * (file release, outside any drm_dev_enter() section: a removal fails the
 * jobs).
 */
void tacc_vctx_wait_idle(struct tacc_vctx *ctx)
{
	struct tacc_vdev *vd = ctx->vd;

	wait_event(vd->idle_wq, !atomic_read(&ctx->inflight));
	/* the completion that woke us may still be in tacc_vjob_complete() */
	spin_lock_irq(&vd->submit_lock);
	spin_unlock_irq(&vd->submit_lock);
}

/*
 * Waits until the context has no job in flight, before a request the device
 * refuses under jobs (inside a drm_dev_enter() section): a removal that
 * started ends the wait with -ENODEV, so it does not wait for the jobs.
 */
int tacc_vctx_wait_quiet(struct tacc_vctx *ctx, bool intr)
{
	struct tacc_vdev *vd = ctx->vd;
	int ret = 0;

	if (intr)
		ret = wait_event_interruptible(vd->idle_wq, !atomic_read(&ctx->inflight) ||
					       READ_ONCE(vd->unplugging));
	else
		wait_event(vd->idle_wq, !atomic_read(&ctx->inflight) || READ_ONCE(vd->unplugging));
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
}

/* ------------------------------------------------------------ commands ---- */

static int tacc_vgemm_bytes(u32 rows, u32 cols, u32 ld, u64 *len)
{
	if (!rows || !cols || rows > TACC_GEMM_MAX_DIM || cols > TACC_GEMM_MAX_DIM ||
	    ld < cols || ld > TACC_V_GEMM_MAX_LD)
		return -EINVAL;
	*len = ((u64)(rows - 1) * ld + cols) * sizeof(u32);
	return 0;
}

/*
 * What each operand of @c must be: its bytes (0 = unused: all zero), the BO
 * type and the alignment.  The device VAs go to the first three u64 of the
 * descriptor's union, which every opcode uses in a, b, c order.
 */
static int tacc_vcmd_operands(const struct drm_tacc_cmd *c, u64 len[3], int type[3],
			      u32 *align)
{
	bool two = c->elt_op == DRM_TACC_ELT_ADD || c->elt_op == DRM_TACC_ELT_MUL;
	int ret = 0;

	*align = 4;
	switch (c->opcode) {
	case DRM_TACC_OP_NOP:
	case DRM_TACC_OP_BARRIER:
		return c->size || c->value ? -EINVAL : 0;
	case DRM_TACC_OP_COPY_H2D:
	case DRM_TACC_OP_COPY_D2H:
	case DRM_TACC_OP_COPY_D2D:
		if (!c->size || c->size >= TACC_COPY_MAX_LEN || c->value)
			return -EINVAL;
		len[0] = c->size;
		len[1] = c->size;
		type[0] = c->opcode == DRM_TACC_OP_COPY_H2D ? TACC_VT_HOST : TACC_VT_DEV;
		type[1] = c->opcode == DRM_TACC_OP_COPY_D2H ? TACC_VT_HOST : TACC_VT_DEV;
		*align = 1;
		return 0;
	case DRM_TACC_OP_GEMM:
		ret = tacc_vgemm_bytes(c->m, c->k, c->lda, &len[0]);
		ret = ret ?: tacc_vgemm_bytes(c->k, c->n, c->ldb, &len[1]);
		ret = ret ?: tacc_vgemm_bytes(c->m, c->n, c->ldc, &len[2]);
		if (ret || c->size || c->value || (u64)c->m * c->n * c->k > TACC_GEMM_MAX_MNK)
			return -EINVAL;
		type[0] = TACC_VT_DEV;
		type[1] = TACC_VT_DEV;
		type[2] = TACC_VT_DEV;
		return 0;
	case DRM_TACC_OP_ELTWISE:
		if (!c->size || c->size > TACC_ELT_MAX_N || c->elt_op >= TACC_ELT_MAX || c->value)
			return -EINVAL;
		len[0] = c->size * 4;
		len[1] = two ? c->size * 4 : 0;
		len[2] = c->size * 4;
		type[0] = TACC_VT_DEV;
		type[1] = TACC_VT_DEV;
		type[2] = TACC_VT_DEV;
		return 0;
	case DRM_TACC_OP_FENCE:
	case DRM_TACC_OP_TIMESTAMP:
		if (c->size || (c->opcode == DRM_TACC_OP_TIMESTAMP && c->value))
			return -EINVAL;
		len[0] = 8;
		type[0] = TACC_VT_ANY;
		*align = 8;
		return 0;
	default:
		return -EINVAL;
	}
}

static int tacc_vcmd_translate(struct drm_file *file, const struct drm_tacc_cmd *c,
			       struct tacc_desc *d)
{
	const struct drm_tacc_operand *op[3] = { &c->a, &c->b, &c->c };
	int type[3] = { TACC_VT_ANY, TACC_VT_ANY, TACC_VT_ANY };
	u64 len[3] = { 0, 0, 0 }, *va = &d->copy.src;
	u32 align;
	int i, ret;

	if (c->flags || c->rsvd)
		return -EINVAL;
	ret = tacc_vcmd_operands(c, len, type, &align);
	if (ret)
		return ret;
	memset(d, 0, sizeof(*d));
	for (i = 0; i < 3; i++) {
		if (!len[i]) {
			if (op[i]->handle || op[i]->pad || op[i]->offset)
				return -EINVAL;
			continue;
		}
		ret = tacc_vbo_va(file, op[i], len[i], align, type[i], &va[i]);
		if (ret)
			return ret;
	}
	d->opcode = c->opcode;	/* ctx, job, index, flags: the backend's (§6.3) */
	d->tag = c->tag;
	switch (c->opcode) {
	case DRM_TACC_OP_COPY_H2D:
	case DRM_TACC_OP_COPY_D2H:
	case DRM_TACC_OP_COPY_D2D:
		d->copy.len = c->size;
		break;
	case DRM_TACC_OP_GEMM:
		d->gemm.m = c->m;
		d->gemm.n = c->n;
		d->gemm.k = c->k;
		d->gemm.lda = c->lda;
		d->gemm.ldb = c->ldb;
		d->gemm.ldc = c->ldc;
		d->gemm.alpha = c->alpha;
		d->gemm.beta = c->beta;
		break;
	case DRM_TACC_OP_ELTWISE:
		d->eltwise.n = c->size;
		d->eltwise.op = c->elt_op;
		d->eltwise.scalar = c->scalar;
		break;
	case DRM_TACC_OP_FENCE:
		d->fence.value = c->value;
		break;
	}
	return 0;
}

/* -------------------------------------------------------------- submit ---- */

static int tacc_vsubmit_check(struct tacc_vdev *vd, const struct drm_tacc_submit *args)
{
	if (args->flags || args->cmd_size != sizeof(struct drm_tacc_cmd) || !args->num_cmds ||
	    args->num_cmds > min_t(u32, vd->max_job_cmds, TACC_V_MAX_CMDS) ||
	    args->queue >= vd->num_rings || args->num_in_syncobjs > DRM_TACC_MAX_IN_SYNCOBJS)
		return -EINVAL;
	return 0;
}

/* In-fences are waited for here, before the job is queued. */
static int tacc_vwait_in_syncobjs(struct drm_file *file, const struct drm_tacc_submit *args)
{
	u32 __user *uh = u64_to_user_ptr(args->in_syncobjs);
	struct dma_fence *f;
	long ret = 0;
	u32 i, h;

	for (i = 0; i < args->num_in_syncobjs && !ret; i++) {
		if (get_user(h, uh + i))
			return -EFAULT;
		ret = drm_syncobj_find_fence(file, h, 0, 0, &f);
		if (ret)
			return ret;
		ret = dma_fence_wait(f, true);
		dma_fence_put(f);
	}
	return ret;
}

/* The submit buffer of one job: request, then (64-byte aligned) response. */
static struct tacc_vjob *tacc_vjob_build(struct drm_file *file,
					 const struct drm_tacc_submit *args)
{
	const struct drm_tacc_cmd __user *ucmds = u64_to_user_ptr(args->cmds);
	struct tacc_vctx *ctx = file->driver_priv;
	struct tacc_vsubmit_req *req;
	struct drm_tacc_cmd cmd;
	struct tacc_vjob *job;
	int ret = -ENOMEM;
	u32 i;

	job = kzalloc(sizeof(*job), GFP_KERNEL);
	if (!job)
		return ERR_PTR(-ENOMEM);
	job->out_len = struct_size(req, cmds, args->num_cmds);
	job->in_len = sizeof(struct tacc_vsubmit_resp);
	job->buf = kzalloc(ALIGN(job->out_len, 64) + job->in_len, GFP_KERNEL);
	if (!job->buf)
		goto err_free;
	job->ctx = ctx;
	req = job->buf;
	for (i = 0; i < args->num_cmds; i++) {
		ret = -EFAULT;
		if (copy_from_user(&cmd, &ucmds[i], sizeof(cmd)))
			goto err_free;
		ret = tacc_vcmd_translate(file, &cmd, &req->cmds[i]);
		if (ret)
			goto err_free;
	}
	tacc_vhdr(&req->hdr.hdr, TACC_VIRTIO_SUBMIT, ctx->id);
	req->hdr.njobs = cpu_to_le32(1);
	req->job.ctx = cpu_to_le32(ctx->id);
	req->job.ring = cpu_to_le16(args->queue);
	req->job.ncmds = cpu_to_le16(args->num_cmds);
	req->job.tag = cpu_to_le64(cmd.tag);	/* of the last command, as on the PF */
	job->out_len = ALIGN(job->out_len, 64);	/* the response starts here */
	spin_lock_init(&job->lock);
	return job;

err_free:
	tacc_vjob_free_unqueued(job);
	return ERR_PTR(ret);
}

static int tacc_vjob_queue(struct tacc_vdev *vd, struct tacc_vjob *job)
{
	struct tacc_vsubmit_req *req = job->buf;
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	bool notify = false;
	int ret = -ENODEV;

	sg_init_one(&out, job->buf, struct_size(req, cmds, le16_to_cpu(req->job.ncmds)));
	sg_init_one(&in, job->buf + job->out_len, job->in_len);
	spin_lock_irq(&vd->submit_lock);
	if (!vd->gone) {
		ret = virtqueue_add_sgs(vd->submitq, sgs, 1, 1, job, GFP_ATOMIC);
		if (ret == -ENOSPC)
			ret = -EAGAIN;	/* the virtqueue is full */
	}
	if (!ret) {
		dma_fence_get(&job->fence);	/* the queue's, dropped on completion */
		list_add_tail(&job->node, &vd->inflight);
		atomic_inc(&job->ctx->inflight);
		notify = virtqueue_kick_prepare(vd->submitq);
		vd->st.jobs++;
		vd->st.batches++;
		vd->st.kicks += notify;
	}
	spin_unlock_irq(&vd->submit_lock);
	if (notify)
		virtqueue_notify(vd->submitq);
	return ret;
}

/* Under ctx->submit_lock: seqno order is queue order. */
static int tacc_vjob_push(struct drm_file *file, struct tacc_vjob *job, u32 ring,
			  u32 out_syncobj, u64 *seqno)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct tacc_vsubmit_req *req = job->buf;
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
	req->job.seqno = cpu_to_le64(seq);
	dma_fence_init(&job->fence, &tacc_vfence_ops, &job->lock, ctx->fence_ctx + ring, seq);
	ret = tacc_vjob_queue(ctx->vd, job);
	if (ret) {
		dma_fence_set_error(&job->fence, ret);
		dma_fence_signal(&job->fence);
		dma_fence_put(&job->fence);	/* frees job and buffer */
		goto out;
	}
	if (syncobj)
		drm_syncobj_replace_fence(syncobj, &job->fence);
	spin_lock(&ctx->seq_lock);
	dma_fence_put(ctx->slot[slot].fence);
	ctx->slot[slot].seqno = seq;
	ctx->slot[slot].fence = &job->fence;	/* the submitter's reference */
	ctx->last_seqno = seq;
	spin_unlock(&ctx->seq_lock);
	*seqno = seq;
out:
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
	ret = tacc_vwait_in_syncobjs(file, args);
	if (ret)
		return ret;
	t0 = ktime_get_ns();	/* after the in-fences: the submit path's own cost */
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
	if (!f) {	/* forgotten: a slot is reused only once its job completed */
		args->status = 0;
		return 0;
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

	spin_lock_irq(&vd->submit_lock);
	st = vd->st;
	spin_unlock_irq(&vd->submit_lock);
	seq_printf(m, "jobs %llu\nbatches %llu\nkicks %llu\nirqs %llu\nused %llu\n",
		   st.jobs, st.batches, st.kicks, st.irqs, st.used);
	seq_printf(m, "submit_ns %lld\ncomplete_ns %llu\n",
		   atomic64_read(&vd->submit_ns), st.complete_ns);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(virtio_stats);

void tacc_vdebugfs_init(struct tacc_vdev *vd)
{
	struct dentry *root = vd->drm.accel ? vd->drm.accel->debugfs_root : NULL;

	if (!IS_ERR_OR_NULL(root))
		debugfs_create_file("virtio_stats", 0444, root, vd, &virtio_stats_fops);
}
