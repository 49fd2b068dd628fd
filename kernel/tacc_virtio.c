// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio - the guest frontend of virtio-tacc (docs/virtio.md, "Linux
 * frontend"): a virtio_driver beside tacc.ko's PCI driver that exposes the
 * same DRM accel uAPI (tacc_accel.h) on its own /dev/accel node, in the way
 * of drivers/gpu/drm/virtio and AMD XDNA's vxdna.  This file: probe and
 * remove, feature negotiation, the control queue, parameters, file contexts
 * and the drm_driver.  BOs: tacc_virtio_gem.c; jobs: tacc_virtio_job.c; late
 * control answers: tacc_virtio_late.c.
 */

#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include <drm/drm_accel.h>
#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_managed.h>

#include "include/tacc_hw.h"
#include "tacc_trace.h"
#include "tacc_virtio.h"

#define TACC_V_BUSY_RETRIES	100

static unsigned int tacc_vctrl_timeout_ms = 5000;
module_param_named(virtio_ctrl_timeout_ms, tacc_vctrl_timeout_ms, uint, 0644);
MODULE_PARM_DESC(virtio_ctrl_timeout_ms,
		 "virtio-tacc: how long a control request waits for its answer, ms (default 5000)");

int tacc_vstatus_errno(u32 status)
{
	switch (status) {
	case TACC_VIRTIO_OK:
		return 0;
	case TACC_VIRTIO_ERR_INVAL:
		return -EINVAL;
	case TACC_VIRTIO_ERR_NOSPC:
		return -ENOSPC;
	case TACC_VIRTIO_ERR_NOENT:
		return -ENOENT;
	case TACC_VIRTIO_ERR_PERM:
		return -EACCES;
	case TACC_VIRTIO_ERR_BUSY:
		return -EBUSY;
	case TACC_VIRTIO_ERR_UNSUPP:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

void tacc_vhdr(struct tacc_virtio_hdr *hdr, u16 type, u32 ctx)
{
	memset(hdr, 0, sizeof(*hdr));
	hdr->type = cpu_to_le16(type);
	hdr->version = TACC_VIRTIO_MSG_VERSION;
	hdr->ctx = cpu_to_le32(ctx);
}

/*
 * Describes @len bytes at @buf (kmalloc or vmalloc memory) in at most @nsg
 * entries of @sg, one per page for vmalloc memory.  Returns the entries used.
 */
int tacc_vbuf_sgs(struct scatterlist *sg, unsigned int nsg, const void *buf, size_t len)
{
	unsigned int n = 0;
	size_t off, chunk;

	if (!is_vmalloc_addr(buf)) {
		sg_init_one(sg, buf, len);
		return 1;
	}
	sg_init_table(sg, nsg);
	for (off = 0; off < len; off += chunk, n++) {
		chunk = min_t(size_t, len - off, PAGE_SIZE - offset_in_page(buf + off));
		if (n == nsg)
			return -E2BIG;
		sg_set_page(&sg[n], vmalloc_to_page(buf + off), chunk, offset_in_page(buf + off));
	}
	sg_mark_end(&sg[n - 1]);
	return n;
}

/*
 * One control request's buffers, the token of its descriptors: the device
 * owns all of them from virtqueue_add_sgs() until it uses the request.
 */
struct tacc_vreq {
	struct tacc_virtio_resp resp;	/* first: the device writes it */
	void *buf;			/* the request (kvmalloc) */
	struct scatterlist *out_sg;
	struct tacc_vlate *late;	/* settles a late answer (tacc_virtio_late.c) */
	struct list_head node;		/* vd->late_used (ctrl_lock) */
	unsigned int used;		/* the late answer's length */
};

static void tacc_vreq_free(struct tacc_vreq *r)
{
	kvfree(r->buf);
	kfree(r->out_sg);
	kfree(r);
}

/*
 * A used buffer that is not the pending request's: the late answer of a
 * request that timed out (its buffers, left to the device, are the token),
 * never taken for another request's answer.  Kept on vd->late_used for
 * tacc_vctrl_read_late() (ctrl_lock; may run in a wait condition).
 */
static void tacc_vreq_late(struct tacc_vdev *vd, struct tacc_vreq *r, unsigned int len)
{
	lockdep_assert_held(&vd->ctrl_lock);
	r->used = len;
	atomic64_inc(&vd->ctrl_late);
	atomic_dec(&vd->late_pending);
	list_add_tail(&r->node, &vd->late_used);
}

/*
 * The control queue is used synchronously by the device; wait for it anyway.
 * Late answers of other requests that come first are set aside.
 */
static struct tacc_vreq *tacc_vctrl_get(struct tacc_vdev *vd, struct tacc_vreq *token,
					unsigned int *len)
{
	struct tacc_vreq *got;

	while ((got = virtqueue_get_buf(vd->ctrlq, len)) && got != token)
		tacc_vreq_late(vd, got, *len);
	return got;
}

/*
 * The late answers set aside, and those the device used since while no
 * request was pending: their buffers freed, what they settle queued for
 * tacc_virtio_late.c (the work item).
 */
void tacc_vctrl_read_late(struct tacc_vdev *vd)
{
	struct tacc_vreq *r, *tmp;
	unsigned int len;
	LIST_HEAD(got);
	int ret;

	mutex_lock(&vd->ctrl_lock);
	/* no request is pending while ctrl_lock is ours: every used buffer is late */
	while (!READ_ONCE(vd->gone) && (r = virtqueue_get_buf(vd->ctrlq, &len)))
		tacc_vreq_late(vd, r, len);
	list_splice_init(&vd->late_used, &got);
	mutex_unlock(&vd->ctrl_lock);
	list_for_each_entry_safe(r, tmp, &got, node) {
		dev_warn(&vd->vdev->dev, "late control answer%s\n", r->late ? ": settled" : "");
		if (r->late) {
			ret = r->used >= sizeof(r->resp) ?
			      tacc_vstatus_errno(le32_to_cpu(r->resp.status)) : -EPROTO;
			tacc_vlate_queue(vd, r->late, ret, le64_to_cpu(r->resp.value));
		}
		tacc_vreq_free(r);
	}
}

static void tacc_vctrl_done(struct virtqueue *vq)
{
	struct tacc_vdev *vd = vq->vdev->priv;

	wake_up(&vd->ctrl_wq);
	if (atomic_read(&vd->late_pending))	/* maybe one of the answers owed */
		tacc_vlate_kick(vd);
}

static int tacc_vctrl_xfer(struct tacc_vdev *vd, struct scatterlist **sgs, unsigned int out,
			   struct tacc_vreq *token)
{
	struct tacc_vreq *got = NULL;
	unsigned int len = 0;
	long left;
	int ret;

	ret = virtqueue_add_sgs(vd->ctrlq, sgs, out, 1, token, GFP_KERNEL);
	if (ret)
		return ret;
	virtqueue_kick(vd->ctrlq);
	left = wait_event_timeout(vd->ctrl_wq,
				  (got = tacc_vctrl_get(vd, token, &len)) || READ_ONCE(vd->gone),
				  msecs_to_jiffies(READ_ONCE(tacc_vctrl_timeout_ms)) ?: 1);
	if (got == token) {
		if (len >= sizeof(struct tacc_virtio_resp))
			return 0;
		/* the buffer was zeroed: it would read as OK; done or not, unknown */
		dev_err(&vd->vdev->dev, "control answer of %u bytes\n", len);
		atomic64_inc(&vd->ctrl_short);
		return -EPROTO;
	}
	if (left) {
		/* removed: the buffers are the reset's, then the drain's to free */
		token->late = NULL;	/* nothing to settle: the reset undid it */
		return -ENODEV;
	}
	/* the device still owns the buffers: the caller must not free them */
	dev_err(&vd->vdev->dev, "control request timed out\n");
	atomic64_inc(&vd->ctrl_timeouts);
	if (token->late)
		token->late->inflight = true;
	atomic_inc(&vd->late_pending);
	/* the answer may have come since the wait ended, before late_pending counted it */
	tacc_vlate_kick(vd);
	return -ETIMEDOUT;
}

/*
 * One control request: @req (@req_len bytes, starting with the header) and
 * optionally @body (e.g. a BO's page list), copied into one buffer the
 * request owns.  Returns 0 and the response value, or the errno of the
 * response status; -ETIMEDOUT if the device did not answer in
 * virtio_ctrl_timeout_ms (its buffers stay the device's until it uses them:
 * tacc_vctrl_read_late() frees them then), -EPROTO if its answer was short.
 * After either the request may or may not have been carried out
 * (tacc_vctrl_unsure()): what it handed the device stays the device's.
 * With @late, -ETIMEDOUT hands @late to the request: its answer, when it
 * comes, is settled by tacc_virtio_late.c; otherwise @late stays the
 * caller's.
 */
int tacc_vctrl_late(struct tacc_vdev *vd, void *req, size_t req_len, const void *body,
		    size_t body_len, u64 *value, struct tacc_vlate *late)
{
	size_t len = req_len + body_len;
	struct scatterlist resp_sg, *sgs[2];
	struct tacc_vreq *r;
	unsigned int nsg;
	int ret = -ENOMEM;
	bool sent;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	r->buf = kvmalloc(len, GFP_KERNEL);
	nsg = is_vmalloc_addr(r->buf) ? DIV_ROUND_UP(len, PAGE_SIZE) + 1 : 1;
	r->out_sg = kmalloc_array(nsg, sizeof(*r->out_sg), GFP_KERNEL);
	if (!r->buf || !r->out_sg)
		goto out_free;
	memcpy(r->buf, req, req_len);
	if (body_len)
		memcpy(r->buf + req_len, body, body_len);
	ret = tacc_vbuf_sgs(r->out_sg, nsg, r->buf, len);
	if (ret < 0)
		goto out_free;
	sg_init_one(&resp_sg, &r->resp, sizeof(r->resp));
	sgs[0] = r->out_sg;
	sgs[1] = &resp_sg;
	r->late = late;

	mutex_lock(&vd->ctrl_lock);
	sent = !READ_ONCE(vd->gone);
	ret = sent ? tacc_vctrl_xfer(vd, sgs, 1, r) : -ENODEV;
	if (!list_empty(&vd->late_used))
		tacc_vlate_kick(vd);	/* other requests' late answers came first */
	mutex_unlock(&vd->ctrl_lock);
	if (ret == -ETIMEDOUT || (sent && ret == -ENODEV))
		return ret;	/* the device's until used (or the removal's reset) */
	if (!ret) {
		ret = tacc_vstatus_errno(le32_to_cpu(r->resp.status));
		if (!ret && value)
			*value = le64_to_cpu(r->resp.value);
	}
out_free:
	tacc_vreq_free(r);
	return ret;
}

int tacc_vctrl(struct tacc_vdev *vd, void *req, size_t req_len, const void *body,
	       size_t body_len, u64 *value)
{
	return tacc_vctrl_late(vd, req, req_len, body, body_len, value, NULL);
}

/*
 * The backend's pool of page-list entries for all BOs of the function
 * (config page_entries, since protocol 1.1; read at each use: a smaller
 * device in the tests changes it at run time).
 */
u32 tacc_vpage_entries(struct tacc_vdev *vd)
{
	u32 n = 0;

	if (vd->version >= (TACC_VIRTIO_VERSION_MAJOR << 16 | 1))
		virtio_cread_le(vd->vdev, struct tacc_virtio_config, page_entries, &n);
	return n && n <= TACC_VIRTIO_MAX_FN_ENTS ? n : TACC_VIRTIO_MAX_FN_ENTS;
}

/*
 * A request that the device refuses while the context has jobs in flight
 * (@late: as tacc_vctrl_late(); -ETIMEDOUT without late->inflight is the
 * context's jobs that did not end, and the request was not sent).
 */
int tacc_vctrl_idle(struct tacc_vctx *ctx, void *req, size_t len, struct tacc_vlate *late)
{
	int ret, i;

	for (i = 0; i < TACC_V_BUSY_RETRIES; i++) {
		ret = tacc_vctx_wait_quiet(ctx, false);
		if (ret)
			return ret;
		ret = tacc_vctrl_late(ctx->vd, req, len, NULL, 0, NULL, late);
		if (ret != -EBUSY)
			return ret;
	}
	return ret;
}

/* --------------------------------------------------------------- params ---- */

static int tacc_vget_param_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_get_param *args = data;

	if (args->index && args->param != DRM_TACC_PARAM_QUEUE_SIZE)
		return -EINVAL;

	switch (args->param) {
	case DRM_TACC_PARAM_API_VERSION:
		args->value = DRM_TACC_API_VERSION;
		break;
	case DRM_TACC_PARAM_HW_VERSION:
		args->value = vd->version;	/* the protocol's */
		break;
	case DRM_TACC_PARAM_CAPS:
		args->value = vd->caps;
		break;
	case DRM_TACC_PARAM_FUNC:
		args->value = vd->func;
		break;
	case DRM_TACC_PARAM_FUNC_KIND:
		args->value = DRM_TACC_FUNC_KIND_VIRTIO;
		break;
	case DRM_TACC_PARAM_NUM_QUEUES:
		args->value = vd->num_rings;
		break;
	case DRM_TACC_PARAM_NUM_CONTEXTS:
		args->value = vd->num_contexts;
		break;
	case DRM_TACC_PARAM_DEVMEM_SIZE:
		args->value = vd->has_devmem ? vd->devmem_size : 0;
		break;
	case DRM_TACC_PARAM_CONTEXT_ID:
		args->value = ctx->id;
		break;
	case DRM_TACC_PARAM_MAX_CMDS:
		args->value = min_t(u32, vd->max_job_cmds, TACC_V_MAX_CMDS);
		break;
	case DRM_TACC_PARAM_MAX_INFLIGHT:
		args->value = TACC_V_MAX_INFLIGHT;
		break;
	case DRM_TACC_PARAM_VA_START:
		args->value = TACC_V_VA_START;
		break;
	case DRM_TACC_PARAM_VA_END:
		args->value = TACC_V_VA_END;
		break;
	case DRM_TACC_PARAM_LAST_SEQNO:
		spin_lock(&ctx->seq_lock);
		args->value = ctx->last_seqno;
		spin_unlock(&ctx->seq_lock);
		break;
	case DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET:
		if (!vd->cnt_len)
			return -EOPNOTSUPP;
		args->value = DRM_TACC_MMAP_COUNTERS;
		break;
	case DRM_TACC_PARAM_COUNTERS_MMAP_SIZE:
		if (!vd->cnt_len)
			return -EOPNOTSUPP;
		args->value = PAGE_SIZE;	/* the function's page, as on a VF */
		break;
	case DRM_TACC_PARAM_NUM_ENGINES:
		args->value = TACC_NUM_ENGINES;	/* the tacc device's engines */
		break;
	case DRM_TACC_PARAM_CLOCK_HZ:
		args->value = TACC_CLOCK_HZ;	/* the device ticks of trace records */
		break;
	case DRM_TACC_PARAM_TRACE_MMAP_OFFSET:	/* F_TRACE negotiated */
		args->value = DRM_TACC_MMAP_TRACE;
		return vd->has_trace ? 0 : -EOPNOTSUPP;
	case DRM_TACC_PARAM_QUEUE_SIZE:
		if (args->index >= vd->num_rings)
			return -EINVAL;
		args->value = TACC_VIRTIO_VQ_SIZE;
		break;
	default:
		/* known to the uAPI, not provided by this function kind */
		return args->param < DRM_TACC_PARAM_COUNT ? -EOPNOTSUPP : -EINVAL;
	}
	return 0;
}

/* ---------------------------------------------------------------- trace ---- */

/*
 * The function's trace ring (docs/virtio.md section 13, "Trace"): the uAPI
 * and ring of the PCI functions (tacc_ring.c); the device learns about the
 * ring by TRACE_SETUP and about the consumer index by TRACE_CONSUME instead
 * of registers.  The ring records every command of every user of the node:
 * TRACE_OPEN needs CAP_PERFMON, as on the PCI functions.
 */
static int tacc_vtrace_msg(struct tacc_vdev *vd, u16 type, const void *body, size_t len)
{
	struct {
		struct tacc_virtio_hdr hdr;
		union {
			struct tacc_virtio_trace_setup setup;
			struct tacc_virtio_trace_consume consume;
		};
	} req = {};

	tacc_vhdr(&req.hdr, type, 0);
	memcpy(&req.setup, body, len);
	return tacc_vctrl(vd, &req, sizeof(req.hdr) + len, NULL, 0, NULL);
}

static int tacc_vtrace_program(struct tacc_vdev *vd, u64 base, u64 wb, u32 entries)
{
	bool v3 = base && vd->trace.rec_size == TACC_TRACE_REC3_SIZE;
	struct tacc_virtio_trace_setup r = {
		.base = cpu_to_le64(base),
		.wb = cpu_to_le64(wb),
		.entries = cpu_to_le32(entries),
		.enable = cpu_to_le32((base ? 1 : 0) | (v3 ? TACC_VIRTIO_TRACE_V3 : 0)),
	};

	return tacc_vtrace_msg(vd, TACC_VIRTIO_TRACE_SETUP, &r, sizeof(r));
}

/*
 * The backend's drop count is cumulative since its reset and not readable:
 * the header starts at 0 and its first write-back reports all of it.
 */
static int tacc_vtrace_setup(struct tacc_ring *tr)
{
	struct tacc_vdev *vd = container_of(tr, struct tacc_vdev, trace);

	tacc_trace_hdr_reset(tr, 0);
	return tacc_vtrace_program(vd, tr->dma + PAGE_SIZE, tr->dma + TACC_TRACE_WB_OFFSET,
				   tr->entries);
}

/*
 * Stop the device writing, then retire the ring.  If the device did not
 * confirm (timeout) it may still write: the memory is leaked, not freed.
 * After removal the reset stopped it and tacc_virtio_remove() frees it.
 */
static void tacc_vtrace_stop(struct tacc_ring *tr)
{
	struct tacc_vdev *vd = container_of(tr, struct tacc_vdev, trace);
	int idx, ret;

	if (drm_dev_enter(&vd->drm, &idx)) {
		ret = tacc_vtrace_program(vd, 0, 0, 0);
		if (ret && tr->cpu) {
			drm_warn(&vd->drm, "trace ring not stopped (%d): leaked\n", ret);
			tr->cpu = NULL;
		}
		drm_dev_exit(idx);
	}
	tacc_ring_retire_locked(tr, DRM_TACC_MMAP_TRACE);
}

static int tacc_vtrace_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);

	if (!vd->has_trace)
		return -EOPNOTSUPP;
	return tacc_trace_open(&vd->trace, file, data,
			       virtio_has_feature(vd->vdev, TACC_VIRTIO_F_TRACE_V3),
			       tacc_vtrace_setup, tacc_vtrace_stop);
}

static int tacc_vtrace_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);
	struct tacc_virtio_trace_consume r = {};
	int idx, ret;

	if (!vd->has_trace)
		return -EOPNOTSUPP;
	ret = tacc_trace_advance_begin(&vd->trace, file, data, &idx);
	if (ret)
		return ret;
	r.cons = cpu_to_le32(vd->trace.cons);
	ret = tacc_vtrace_msg(vd, TACC_VIRTIO_TRACE_CONSUME, &r, sizeof(r));
	tacc_ring_advance_end(&vd->trace, idx);
	return ret;
}

static int tacc_vtrace_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);

	if (!vd->has_trace)
		return -EOPNOTSUPP;
	return tacc_trace_close(&vd->trace, file, data, tacc_vtrace_stop);
}

static vm_fault_t tacc_vtrace_vm_fault(struct vm_fault *vmf)
{
	struct drm_file *file = vmf->vma->vm_file->private_data;

	return tacc_ring_fault(vmf, &to_tacc_vdev(file->minor->dev)->trace, DRM_TACC_MMAP_TRACE);
}

static const struct vm_operations_struct tacc_vtrace_vm_ops = {
	.fault = tacc_vtrace_vm_fault,
};

/* ----------------------------------------------------------------- mmap ---- */

/*
 * The function's counter page (shared memory region 1, live: each read is an
 * exit, as on BAR2) at DRM_TACC_MMAP_COUNTERS, read-only; BOs at their GEM
 * offsets.  drm_dev_unplug() zaps the counter mappings (a later access
 * faults: SIGBUS).
 */
static int tacc_vmmap_counters(struct tacc_vdev *vd, struct vm_area_struct *vma)
{
	unsigned long size = vma->vm_end - vma->vm_start;

	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
	if (!vd->cnt_len || size > PAGE_SIZE)
		return -EINVAL;
	vm_flags_mod(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP, VM_MAYWRITE);
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	return io_remap_pfn_range(vma, vma->vm_start, vd->cnt_phys >> PAGE_SHIFT, size,
				  vma->vm_page_prot);
}

static int tacc_vmmap(struct file *filp, struct vm_area_struct *vma)
{
	struct drm_file *file = filp->private_data;
	struct tacc_vdev *vd = to_tacc_vdev(file->minor->dev);
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	int idx, ret;

	if (off != DRM_TACC_MMAP_COUNTERS && off != DRM_TACC_MMAP_TRACE)
		return drm_gem_mmap(filp, vma);
	if (!drm_dev_enter(&vd->drm, &idx))
		return -ENODEV;
	if (off == DRM_TACC_MMAP_TRACE)
		ret = tacc_ring_mmap(&vd->trace, file, vma, &tacc_vtrace_vm_ops);
	else
		ret = tacc_vmmap_counters(vd, vma);
	drm_dev_exit(idx);
	return ret;
}

/* ---------------------------------------------------------------- files ---- */

/* Open files of @pid on the node (max_ctx_per_process, as on the PF). */
static unsigned int tacc_vfiles_of(struct tacc_vdev *vd, pid_t pid)
{
	struct tacc_vctx *c;
	unsigned int n = 0;

	lockdep_assert_held(&vd->files_lock);
	list_for_each_entry(c, &vd->files, node)
		n += c->pid == pid;
	return n;
}

/*
 * A backend context for the file of a user within its share (tacc_user_open()),
 * within its process's limit: -EMFILE past max_ctx_per_process files of the
 * process (CAP_SYS_ADMIN exempt), as on the PF; -EBUSY when the backend has
 * none left.  files_lock spans the count and the CTX_CREATE, so two opens of
 * one process cannot both pass the check.
 */
static int tacc_vopen_ctx(struct tacc_vdev *vd, struct tacc_vctx *ctx)
{
	unsigned int limit = ctx->unlimited ? 0 : READ_ONCE(tacc_max_ctx_per_process);
	struct tacc_virtio_hdr req;
	struct tacc_vlate *late;
	u64 id;
	int ret;

	/* an answer that comes late or short: the context is settled later */
	late = tacc_vlate_alloc(TACC_VIRTIO_CTX_CREATE);
	if (!late)
		return -ENOMEM;
	late->user = ctx->user;
	tacc_vhdr(&req, TACC_VIRTIO_CTX_CREATE, 0);
	mutex_lock(&vd->files_lock);
	if (limit && tacc_vfiles_of(vd, ctx->pid) >= limit) {
		ret = -EMFILE;
		goto out;
	}
	ret = tacc_vctrl_late(vd, &req, sizeof(req), NULL, 0, &id, late);
	if (tacc_vctrl_unsure(ret)) {
		/* the backend may have made one: the opener's charge holds it till then */
		ctx->user = NULL;
		if (ret == -EPROTO)
			tacc_vlate_queue(vd, late, ret, 0);
		late = NULL;	/* the request's (-ETIMEDOUT) or queued */
		goto out;
	}
	if (ret == -ENOSPC)
		ret = -EBUSY;	/* all contexts in use, as on the PF */
	if (ret)
		goto out;
	/* the device's answer indexes fence slots and bitmaps: checked */
	if (id >= vd->num_contexts || test_and_set_bit(id, vd->ctx_ids)) {
		drm_warn(&vd->drm, "device gave context %llu (out of range or in use): refused\n",
			 id);
		ret = -EIO;
		goto out;
	}
	ctx->id = id;
	list_add_tail(&ctx->node, &vd->files);
out:
	mutex_unlock(&vd->files_lock);
	kfree(late);
	return ret;
}

static void tacc_vctx_reap(struct tacc_vdev *vd);

static int tacc_vopen(struct drm_device *dev, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);
	struct tacc_vctx *ctx;
	int ret, idx;

	tacc_vctx_reap(vd);	/* contexts the device held at their close */
	if (!drm_dev_enter(dev, &idx))
		return -ENODEV;
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx) {
		ret = -ENOMEM;
		goto err_exit;
	}
	ctx->vd = vd;
	INIT_LIST_HEAD(&ctx->late);
	ctx->pid = task_tgid_nr(current);
	ctx->unlimited = capable(CAP_SYS_ADMIN);
	ctx->user = tacc_user_open(&vd->quota, ctx->unlimited);
	if (IS_ERR(ctx->user)) {
		ret = PTR_ERR(ctx->user);
		goto err_free;
	}
	ret = tacc_vopen_ctx(vd, ctx);
	if (ret)
		goto err_user;

	mutex_init(&ctx->vm_lock);
	mutex_init(&ctx->submit_lock);
	spin_lock_init(&ctx->seq_lock);
	tacc_failures_init(&ctx->failed);
	drm_mm_init(&ctx->va_mm, TACC_V_VA_START, TACC_V_VA_END - TACC_V_VA_START);
	ctx->fence_ctx = dma_fence_context_alloc(TACC_VIRTIO_NUM_RINGS);
	file->driver_priv = ctx;
	drm_dev_exit(idx);
	return 0;

err_user:
	if (ctx->user)		/* else a late CTX_CREATE's record holds it */
		tacc_user_close(ctx->user);
err_free:
	kfree(ctx);
err_exit:
	drm_dev_exit(idx);
	return ret;
}

/*
 * A context without jobs goes: CTX_DESTROY (unless a removal began: its
 * reset destroyed it), then its memory, its id and its user's charge.
 */
static void tacc_vctx_destroy(struct tacc_vdev *vd, struct tacc_vctx *ctx)
{
	struct tacc_virtio_hdr *req;
	int idx, ret = -ENOMEM;

	tacc_vlate_ctx_fini(ctx);	/* ranges its late VM_BINDs hold */
	/*
	 * files_lock from CTX_DESTROY until ctx_ids shows the id free: an open's
	 * CTX_CREATE in between would get the id back from the backend, find it
	 * still in use, refuse it (-EIO) and leave that backend context to nobody.
	 */
	mutex_lock(&vd->files_lock);
	if (drm_dev_enter(&vd->drm, &idx)) {
		req = kzalloc(sizeof(*req), GFP_KERNEL);
		if (req) {
			tacc_vhdr(req, TACC_VIRTIO_CTX_DESTROY, ctx->id);
			ret = tacc_vctrl_idle(ctx, req, sizeof(*req), NULL);
			kfree(req);
		}
		if (ret)
			drm_warn(&vd->drm, "context %u not destroyed: %d\n", ctx->id, ret);
		drm_dev_exit(idx);
	}
	tacc_vctx_seq_fini(ctx);
	drm_mm_takedown(&ctx->va_mm);
	list_del(&ctx->node);
	clear_bit(ctx->id, vd->ctx_ids);
	mutex_unlock(&vd->files_lock);
	tacc_user_close(ctx->user);	/* its BOs, all freed by now, held it too */
	kfree(ctx);
}

/*
 * Destroys the contexts of closed files whose jobs the device held at the
 * close and have ended since: from the work item their last job's
 * completion queues, and on open, close and removal (whose reset ended
 * them all).
 */
static void tacc_vctx_reap(struct tacc_vdev *vd)
{
	struct tacc_vctx *ctx, *tmp;
	LIST_HEAD(ended);

	mutex_lock(&vd->files_lock);
	list_for_each_entry_safe(ctx, tmp, &vd->stuck, node)
		if (tacc_vctx_ended(ctx))
			list_move_tail(&ctx->node, &ended);
	mutex_unlock(&vd->files_lock);
	list_for_each_entry_safe(ctx, tmp, &ended, node) {
		tacc_vctx_destroy(vd, ctx);
		atomic64_inc(&vd->ctx_reaped);
	}
}

static void tacc_vctx_reap_work(struct work_struct *work)
{
	tacc_vctx_reap(container_of(work, struct tacc_vdev, reap_work));
}

/*
 * Runs after drm_gem_release(): the file's BOs are gone from the backend, or
 * leaked where the device still held jobs of the context after the close
 * paths' bound (tacc_vctx_wait_idle()).  Such a context is not destroyed
 * under its jobs: it waits on vd->stuck, its id and its user's charge held,
 * until tacc_vctx_reap() finds them ended.
 */
static void tacc_vpostclose(struct drm_device *dev, struct drm_file *file)
{
	struct tacc_vdev *vd = to_tacc_vdev(dev);
	struct tacc_vctx *ctx = file->driver_priv;

	tacc_ring_close(&vd->trace, file, tacc_vtrace_stop);
	if (tacc_vctx_wait_idle(ctx)) {
		tacc_vctx_destroy(vd, ctx);
	} else {
		mutex_lock(&vd->files_lock);
		list_move_tail(&ctx->node, &vd->stuck);
		mutex_unlock(&vd->files_lock);
		atomic64_inc(&vd->ctx_stuck);
	}
	file->driver_priv = NULL;
	tacc_vctx_reap(vd);
}

/* --------------------------------------------------------------- driver ---- */

/* Rings and captures of the PCI function that a virtio node does not provide. */
static int tacc_vunsupported_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	return -EOPNOTSUPP;
}

static const struct drm_ioctl_desc tacc_vioctls[] = {
	DRM_IOCTL_DEF_DRV(TACC_GET_PARAM, tacc_vget_param_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_BO_CREATE, tacc_vbo_create_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_BO_INFO, tacc_vbo_info_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_VM_BIND, tacc_vvm_bind_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_VM_UNBIND, tacc_vvm_unbind_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SUBMIT, tacc_vsubmit_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_WAIT, tacc_vwait_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_OPEN, tacc_vtrace_open_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_ADVANCE, tacc_vtrace_advance_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_CLOSE, tacc_vtrace_close_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_OPEN, tacc_vunsupported_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_ADVANCE, tacc_vunsupported_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_CLOSE, tacc_vunsupported_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_OPEN, tacc_vunsupported_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_ADVANCE, tacc_vunsupported_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_CLOSE, tacc_vunsupported_ioctl, 0),
};

/* The PCI functions' ioctl tracepoints (docs/tracepoints.md), with this node's dev. */
static long tacc_vioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct drm_file *file = filp->private_data;
	struct tacc_vdev *vd = to_tacc_vdev(file->minor->dev);
	struct tacc_vctx *ctx = file->driver_priv;
	u32 id = ctx ? ctx->id : ~0u;
	long ret;

	trace_tacc_ioctl_enter(vd->devid, id, _IOC_NR(cmd));
	ret = drm_ioctl(filp, cmd, arg);
	trace_tacc_ioctl_exit(vd->devid, id, _IOC_NR(cmd), ret);
	return ret;
}

static const struct file_operations tacc_vfops = {
	.owner = THIS_MODULE,
	.open = accel_open,
	.release = drm_release,
	.unlocked_ioctl = tacc_vioctl,
	.compat_ioctl = drm_compat_ioctl,
	.poll = drm_poll,
	.read = drm_read,
	.llseek = noop_llseek,
	.mmap = tacc_vmmap,
	.show_fdinfo = drm_show_fdinfo,
	.fop_flags = FOP_UNSIGNED_OFFSET,
};

static const struct drm_driver tacc_vdriver = {
	.driver_features = DRIVER_GEM | DRIVER_COMPUTE_ACCEL | DRIVER_SYNCOBJ,
	.open = tacc_vopen,
	.postclose = tacc_vpostclose,
	.gem_create_object = tacc_vgem_create_object,
	.ioctls = tacc_vioctls,
	.num_ioctls = ARRAY_SIZE(tacc_vioctls),
	.fops = &tacc_vfops,
	.show_fdinfo = tacc_vshow_fdinfo,
	.name = "tacc",
	.desc = "tacc paravirtual function (virtio-tacc)",
	.date = "20261201",
	.major = 1,
	.minor = 0,
};

/* --------------------------------------------------------------- virtio ---- */

/* The virtio PCI function's id, domain << 16 | bus << 8 | devfn (as tacc_devid()). */
static u32 tacc_vdevid(struct virtio_device *vdev)
{
	struct device *parent = vdev->dev.parent;
	struct pci_dev *pdev;

	if (!parent || !dev_is_pci(parent))
		return 0;
	pdev = to_pci_dev(parent);
	return pci_dev_id(pdev) | (pci_domain_nr(pdev->bus) << 16);
}

static int tacc_vread_config(struct tacc_vdev *vd)
{
	struct virtio_device *vdev = vd->vdev;
	struct virtio_shm_region shm;

	virtio_cread_le(vdev, struct tacc_virtio_config, version, &vd->version);
	virtio_cread_le(vdev, struct tacc_virtio_config, caps, &vd->caps);
	virtio_cread_le(vdev, struct tacc_virtio_config, func, &vd->func);
	virtio_cread_le(vdev, struct tacc_virtio_config, num_contexts, &vd->num_contexts);
	virtio_cread_le(vdev, struct tacc_virtio_config, num_rings, &vd->num_rings);
	virtio_cread_le(vdev, struct tacc_virtio_config, max_job_cmds, &vd->max_job_cmds);
	virtio_cread_le(vdev, struct tacc_virtio_config, devmem_size, &vd->devmem_size);
	if (vd->version >> 16 != TACC_VIRTIO_VERSION_MAJOR) {
		dev_err(&vdev->dev, "protocol %u.%u, this driver speaks %u.x\n",
			vd->version >> 16, vd->version & 0xffff, TACC_VIRTIO_VERSION_MAJOR);
		return -ENODEV;
	}
	vd->num_rings = min_t(u32, vd->num_rings, TACC_VIRTIO_NUM_RINGS);
	vd->num_contexts = min_t(u32, vd->num_contexts, TACC_NUM_CONTEXTS);
	vd->max_job_cmds = min_t(u32, vd->max_job_cmds, TACC_VIRTIO_MAX_JOB_CMDS);
	if (!vd->num_rings || !vd->num_contexts || !vd->max_job_cmds)
		return -ENODEV;
	/* §3.1: only what was negotiated counts, whatever the device could do */
	vd->has_devmem = virtio_has_feature(vdev, TACC_VIRTIO_F_DEVMEM);
	vd->has_trace = virtio_has_feature(vdev, TACC_VIRTIO_F_TRACE);
	/* §5: completions are readable here before the batch's used buffer comes */
	if (virtio_get_shm_region(vdev, &shm, TACC_VIRTIO_SHM_FENCES) &&
	    shm.len >= TACC_NUM_CONTEXTS * TACC_VIRTIO_NUM_RINGS * TACC_VIRTIO_FENCE_SIZE) {
		vd->fences = devm_memremap(&vdev->dev, shm.addr, shm.len, MEMREMAP_WB);
		if (IS_ERR(vd->fences))
			vd->fences = NULL;
	}
	if (virtio_get_shm_region(vdev, &shm, TACC_VIRTIO_SHM_COUNTERS) &&
	    PAGE_ALIGNED(shm.addr) && shm.len >= PAGE_SIZE) {
		vd->cnt_phys = shm.addr;
		vd->cnt_len = shm.len;
	}
	return 0;
}

static int tacc_vfind_vqs(struct tacc_vdev *vd)
{
	struct virtqueue_info info[TACC_VIRTIO_NUM_VQS] = {
		[TACC_VIRTIO_VQ_CONTROL] = { "control", tacc_vctrl_done },
		[TACC_VIRTIO_VQ_SUBMIT] = { "submit", tacc_vsubmit_done },
	};
	struct virtqueue *vqs[TACC_VIRTIO_NUM_VQS];
	int ret;

	ret = virtio_find_vqs(vd->vdev, TACC_VIRTIO_NUM_VQS, vqs, info, NULL);
	if (ret)
		return ret;
	vd->ctrlq = vqs[TACC_VIRTIO_VQ_CONTROL];
	vd->submitq = vqs[TACC_VIRTIO_VQ_SUBMIT];
	/* the vIOMMU's device with ACCESS_PLATFORM, else guest-physical addresses */
	vd->dma_dev = virtqueue_dma_dev(vd->submitq);
	tacc_ring_init(&vd->trace, &vd->drm, vd->dma_dev, NULL);
	return 0;
}

/* drm release: every file and BO of the node is gone */
static void tacc_vquota_fini(struct drm_device *dev, void *data)
{
	tacc_quota_fini(&to_tacc_vdev(dev)->quota);
}

static int tacc_virtio_probe(struct virtio_device *vdev)
{
	struct tacc_vdev *vd;
	int ret;

	vd = devm_drm_dev_alloc(&vdev->dev, &tacc_vdriver, struct tacc_vdev, drm);
	if (IS_ERR(vd))
		return PTR_ERR(vd);
	vd->vdev = vdev;
	vd->devid = tacc_vdevid(vdev);
	vdev->priv = vd;
	tacc_quota_init(&vd->quota);
	ret = drmm_add_action_or_reset(&vd->drm, tacc_vquota_fini, NULL);
	if (ret)
		return ret;
	mutex_init(&vd->files_lock);
	INIT_LIST_HEAD(&vd->files);
	INIT_LIST_HEAD(&vd->stuck);
	INIT_WORK(&vd->reap_work, tacc_vctx_reap_work);
	mutex_init(&vd->ctrl_lock);
	init_waitqueue_head(&vd->ctrl_wq);
	tacc_vlate_init(vd);
	tacc_vjobs_init(vd);
	init_waitqueue_head(&vd->idle_wq);
	mutex_init(&vd->dma_lock);
	INIT_LIST_HEAD(&vd->dma_bos);

	ret = tacc_vread_config(vd);
	if (ret)
		return ret;
	ret = tacc_vfind_vqs(vd);
	if (ret)
		return ret;
	virtio_device_ready(vdev);

	ret = drm_dev_register(&vd->drm, 0);
	if (ret)
		goto err_reset;
	tacc_vdebugfs_init(vd);
	drm_info(&vd->drm, "virtio-tacc function %u: protocol %u.%u, %u rings, %llu MiB device memory%s\n",
		 vd->func, vd->version >> 16, vd->version & 0xffff, vd->num_rings,
		 vd->has_devmem ? vd->devmem_size >> 20 : 0,
		 vd->dma_dev ? ", behind the platform IOMMU" : "");
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	return ret;
}

/*
 * Unplug, then reset: the device drops every buffer it holds, so the jobs
 * in flight fail (-ENODEV) and no request waits for an answer that cannot
 * come.  Files left open get -ENODEV from then on; their BOs' DMA mappings
 * go now (the DMA device may go with us), their pages when they are freed.
 */
/*
 * After the reset: the buffers of control requests that timed out are the
 * driver's again (ctrl_lock: no request is between add and its answer); what
 * their answers would settle is settled as reset (-ENODEV).
 */
static void tacc_vctrl_drain(struct tacc_vdev *vd)
{
	struct tacc_vreq *r, *tmp;
	unsigned int len;
	LIST_HEAD(got);

	mutex_lock(&vd->ctrl_lock);
	while ((r = virtqueue_get_buf(vd->ctrlq, &len)) ||
	       (r = virtqueue_detach_unused_buf(vd->ctrlq)))
		list_add_tail(&r->node, &got);
	list_splice_init(&vd->late_used, &got);
	atomic_set(&vd->late_pending, 0);
	mutex_unlock(&vd->ctrl_lock);
	list_for_each_entry_safe(r, tmp, &got, node) {
		if (r->late)
			tacc_vlate_queue(vd, r->late, -ENODEV, 0);
		tacc_vreq_free(r);
	}
}

static void tacc_virtio_remove(struct virtio_device *vdev)
{
	struct tacc_vdev *vd = vdev->priv;

	WRITE_ONCE(vd->unplugging, true);
	wake_up_all(&vd->idle_wq);	/* requests waiting for jobs give up */
	drm_dev_unplug(&vd->drm);
	spin_lock_irq(&vd->submit_lock);
	WRITE_ONCE(vd->gone, true);
	spin_unlock_irq(&vd->submit_lock);
	wake_up_all(&vd->ctrl_wq);
	virtio_reset_device(vdev);
	tacc_vjobs_fail(vd, -ENODEV);
	cancel_work_sync(&vd->reap_work);
	tacc_vctx_reap(vd);	/* no job is left: the stuck contexts go */
	tacc_vctrl_drain(vd);
	tacc_vlate_remove(vd);	/* the reset destroyed what late answers would settle */
	vdev->config->del_vqs(vdev);
	/* the device holds no page any more: unmap them while the DMA device exists */
	tacc_vbos_release_dma(vd);
	tacc_ring_release_dma(&vd->trace);
	WRITE_ONCE(vd->reset_done, true);
	wake_up_all(&vd->idle_wq);
}

static const struct virtio_device_id tacc_virtio_ids[] = {
	{ TACC_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ }
};
MODULE_DEVICE_TABLE(virtio, tacc_virtio_ids);

/* The device features this driver knows and uses (docs/virtio.md §3). */
static const unsigned int tacc_virtio_features[] = {
	TACC_VIRTIO_F_DEVMEM,
	TACC_VIRTIO_F_TRACE,
	TACC_VIRTIO_F_INFER,
	TACC_VIRTIO_F_TRACE_V3,
};

static struct virtio_driver tacc_virtio_driver = {
	.driver.name = "tacc-virtio",
	.id_table = tacc_virtio_ids,
	.feature_table = tacc_virtio_features,
	.feature_table_size = ARRAY_SIZE(tacc_virtio_features),
	.probe = tacc_virtio_probe,
	.remove = tacc_virtio_remove,
};

int tacc_virtio_register(void)
{
	return register_virtio_driver(&tacc_virtio_driver);
}

void tacc_virtio_unregister(void)
{
	unregister_virtio_driver(&tacc_virtio_driver);
}
