// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio_late - control answers of the virtio-tacc frontend that come
 * after it gave up waiting (docs/virtio.md "Errors").
 *
 * A request that timed out may still be carried out; its buffers stay the
 * device's until it uses them.  Two kinds leave something only the answer
 * can settle, each followed by a struct tacc_vlate:
 *
 * - CTX_CREATE: a backend context nobody holds.  Its opener's uid keeps the
 *   context charge meanwhile (a user whose answers come late holds no more
 *   than its share of the function's contexts); the answer's context is
 *   destroyed (CTX_DESTROY, itself followed if late) and the charge given
 *   back.
 * - VM_BIND: a binding the file was told failed.  Its VA range stays taken
 *   (the record's node in the file's drm_mm); the answer says whether to
 *   release it (the bind failed) or to unbind first (VM_UNBIND, itself
 *   followed if late).
 *
 * The answers are read by whoever holds the control queue next: the next
 * request, or the work item the queue's interrupt queues while answers are
 * owed (no request of anyone's needs to come).  The work item settles them.
 * What cannot be settled is counted in debugfs virtio_stats: ctx_lost (a
 * context whose id is unknown or unsafe to destroy, or whose CTX_DESTROY
 * failed: still charged to its opener's uid, until the removal's reset) and
 * va_lost (a range whose VM_UNBIND failed: taken until the file closes,
 * whose CTX_DESTROY takes the binding).
 *
 * Locks: late_settle, then files_lock (CTX_DESTROY) or a file's vm_lock, then
 * ctrl_lock.  late_settle also keeps a file's records while it closes
 * (tacc_vlate_ctx_fini()).
 */

#include <linux/slab.h>
#include <linux/workqueue.h>

#include <drm/drm_print.h>

#include "tacc_virtio.h"

struct tacc_vlate *tacc_vlate_alloc(u16 type)
{
	struct tacc_vlate *late = kzalloc(sizeof(*late), GFP_KERNEL);

	if (late) {
		late->type = type;
		INIT_LIST_HEAD(&late->ctx_node);
	}
	return late;
}

/* @late's request was answered (@ret, @value): to be settled by the work item. */
void tacc_vlate_queue(struct tacc_vdev *vd, struct tacc_vlate *late, int ret, u64 value)
{
	late->ret = ret;
	late->value = value;
	spin_lock(&vd->late_lock);
	list_add_tail(&late->node, &vd->late_ready);
	spin_unlock(&vd->late_lock);
	tacc_vlate_kick(vd);
}

void tacc_vlate_kick(struct tacc_vdev *vd)
{
	queue_work(system_long_wq, &vd->late_work);
}

static void tacc_vlate_settled(struct tacc_vdev *vd, struct tacc_vlate *late)
{
	if (late->user)
		tacc_user_close(late->user);
	atomic64_inc(&vd->late_settled);
	kfree(late);
}

/* ------------------------------------------------------------ contexts ---- */

/* A backend context that cannot be given back: charged to its opener until removal. */
static void tacc_vlate_ctx_lost(struct tacc_vdev *vd, struct tacc_vlate *late, const char *why)
{
	drm_warn(&vd->drm, "a late CTX_CREATE's context: %s (%d): lost\n", why, late->ret);
	atomic64_inc(&vd->ctx_lost);
	list_add_tail(&late->node, &vd->late_lost);
}

static void tacc_vlate_settle_ctx(struct tacc_vdev *vd, struct tacc_vlate *late)
{
	struct tacc_virtio_hdr req;
	const char *lost = NULL;
	int ret;

	if (late->type == TACC_VIRTIO_CTX_CREATE) {
		if (late->ret == -EPROTO) {
			lost = "no id in a short answer";
			goto out;
		}
		if (late->ret || READ_ONCE(vd->gone))
			goto out;	/* not created, or reset */
		mutex_lock(&vd->files_lock);
		if (late->value >= vd->num_contexts || test_bit(late->value, vd->ctx_ids)) {
			/* a lying device: destroying it could end another file's context */
			mutex_unlock(&vd->files_lock);
			lost = "id out of range or held";
			goto out;
		}
		late->type = TACC_VIRTIO_CTX_DESTROY;
		late->id = late->value;
		tacc_vhdr(&req, TACC_VIRTIO_CTX_DESTROY, late->id);
		ret = tacc_vctrl_late(vd, &req, sizeof(req), NULL, 0, NULL, late);
		mutex_unlock(&vd->files_lock);
		if (ret == -ETIMEDOUT)
			return;		/* settled by its own answer */
		late->ret = ret;
	}
	/* CTX_DESTROY answered; -ENODEV: a removal, whose reset destroyed it */
	if (late->ret && late->ret != -ENODEV)
		lost = "CTX_DESTROY failed";
out:
	if (lost)
		tacc_vlate_ctx_lost(vd, late, lost);
	else
		tacc_vlate_settled(vd, late);
}

/* -------------------------------------------------------------- ranges ---- */

/* The range goes back to the file (ctx->vm_lock). */
static void tacc_vlate_release_va(struct tacc_vlate *late)
{
	lockdep_assert_held(&late->ctx->vm_lock);
	drm_mm_remove_node(&late->va);
	list_del_init(&late->ctx_node);
}

/* VM_UNBIND of the record's range (@follow: followed by the record if late). */
static int tacc_vlate_unbind(struct tacc_vctx *ctx, struct tacc_vlate *late, bool follow)
{
	struct {
		struct tacc_virtio_hdr hdr;
		struct tacc_virtio_vm_unbind b;
	} req;

	tacc_vhdr(&req.hdr, TACC_VIRTIO_VM_UNBIND, ctx->id);
	req.b = (struct tacc_virtio_vm_unbind) {
		.va = cpu_to_le64(late->va.start),
		.size = cpu_to_le64(late->va.size),
	};
	return tacc_vctrl_idle(ctx, &req, sizeof(req), follow ? late : NULL);
}

static void tacc_vlate_settle_va(struct tacc_vdev *vd, struct tacc_vlate *late)
{
	struct tacc_vctx *ctx = late->ctx;
	int ret;

	if (!ctx) {		/* the file closed: its CTX_DESTROY took the binding */
		tacc_vlate_settled(vd, late);
		return;
	}
	mutex_lock(&ctx->vm_lock);
	/* the bind failed, or a removal's reset undid it: nothing bound */
	if (READ_ONCE(vd->gone) ||
	    (late->type == TACC_VIRTIO_VM_BIND && late->ret && late->ret != -EPROTO)) {
		tacc_vlate_release_va(late);
		goto settled;
	}
	if (late->type == TACC_VIRTIO_VM_BIND) {
		/* bound (or a short answer: maybe): undone, as the file was told */
		late->type = TACC_VIRTIO_VM_UNBIND;
		ret = tacc_vlate_unbind(ctx, late, true);
		if (ret == -ETIMEDOUT && late->inflight) {
			mutex_unlock(&ctx->vm_lock);
			return;		/* settled by its own answer */
		}
		late->ret = ret;
	}
	/* VM_UNBIND answered: unbound, or there was no binding; -ENODEV: reset */
	if (late->ret && late->ret != -ENOENT && late->ret != -ENODEV) {
		drm_warn(&vd->drm, "context %u: a late binding at 0x%llx not undone (%d): range kept\n",
			 ctx->id, late->va.start, late->ret);
		atomic64_inc(&vd->va_lost);
		late->ctx = NULL;	/* now the file's: tacc_vlate_ctx_fini() frees it */
		mutex_unlock(&ctx->vm_lock);
		return;
	}
	tacc_vlate_release_va(late);
settled:
	mutex_unlock(&ctx->vm_lock);
	tacc_vlate_settled(vd, late);
}

/* ---------------------------------------------------------------- work ---- */

static void tacc_vlate_settle_all(struct tacc_vdev *vd)
{
	struct tacc_vlate *late;

	lockdep_assert_held(&vd->late_settle);
	for (;;) {
		spin_lock(&vd->late_lock);
		late = list_first_entry_or_null(&vd->late_ready, struct tacc_vlate, node);
		if (late)
			list_del_init(&late->node);
		spin_unlock(&vd->late_lock);
		if (!late)
			break;
		late->inflight = false;
		if (late->type == TACC_VIRTIO_CTX_CREATE || late->type == TACC_VIRTIO_CTX_DESTROY)
			tacc_vlate_settle_ctx(vd, late);
		else
			tacc_vlate_settle_va(vd, late);
	}
}

static void tacc_vlate_work(struct work_struct *work)
{
	struct tacc_vdev *vd = container_of(work, struct tacc_vdev, late_work);

	tacc_vctrl_read_late(vd);
	mutex_lock(&vd->late_settle);
	tacc_vlate_settle_all(vd);
	mutex_unlock(&vd->late_settle);
}

void tacc_vlate_init(struct tacc_vdev *vd)
{
	spin_lock_init(&vd->late_lock);
	INIT_LIST_HEAD(&vd->late_used);
	INIT_LIST_HEAD(&vd->late_ready);
	mutex_init(&vd->late_settle);
	INIT_LIST_HEAD(&vd->late_lost);
	INIT_WORK(&vd->late_work, tacc_vlate_work);
}

/*
 * A file's context goes (before its CTX_DESTROY): the ranges its late
 * requests hold go back to its drm_mm.  A record still owed an answer stays
 * the request's and is freed when settled (its file gone: nothing to do);
 * one whose range was kept (va_lost) is the file's and goes now.
 */
void tacc_vlate_ctx_fini(struct tacc_vctx *ctx)
{
	struct tacc_vlate *late, *tmp;

	if (list_empty(&ctx->late))	/* added only by the file's own ioctls */
		return;
	mutex_lock(&ctx->vd->late_settle);
	mutex_lock(&ctx->vm_lock);
	list_for_each_entry_safe(late, tmp, &ctx->late, ctx_node) {
		drm_mm_remove_node(&late->va);
		list_del_init(&late->ctx_node);
		if (late->ctx)
			late->ctx = NULL;	/* settled later, as a closed file's */
		else
			kfree(late);		/* kept range (va_lost) */
	}
	mutex_unlock(&ctx->vm_lock);
	mutex_unlock(&ctx->vd->late_settle);
}

/*
 * The BO of @handle goes (tacc_vgem_free()) while a binding of it is in
 * doubt: undone now (VM_UNBIND of the record's range, served after the late
 * VM_BIND), since the backend refuses BO_DESTROY of a bound BO and the BO's
 * pages would stay pinned for it.  The record's answer then settles nothing.
 */
void tacc_vlate_bo_free(struct tacc_vctx *ctx, u32 handle)
{
	struct tacc_vdev *vd = ctx->vd;
	struct tacc_vlate *late, *found = NULL;
	int ret;

	if (list_empty(&ctx->late))
		return;
	mutex_lock(&vd->late_settle);
	mutex_lock(&ctx->vm_lock);
	list_for_each_entry(late, &ctx->late, ctx_node) {
		if (late->ctx && late->handle == handle) {
			found = late;
			break;
		}
	}
	if (found) {
		ret = tacc_vlate_unbind(ctx, found, false);
		if (!ret || ret == -ENOENT) {
			tacc_vlate_release_va(found);
			found->ctx = NULL;	/* its answer: nothing left to do */
		}
	}
	mutex_unlock(&ctx->vm_lock);
	mutex_unlock(&vd->late_settle);
}

/*
 * Removal, after the device reset and the control queue's drain (every
 * request's buffers read): the reset destroyed every context and binding,
 * so what is owed is settled as such and lost contexts are given back.
 */
void tacc_vlate_remove(struct tacc_vdev *vd)
{
	struct tacc_vlate *late, *tmp;

	cancel_work_sync(&vd->late_work);
	mutex_lock(&vd->late_settle);
	tacc_vlate_settle_all(vd);
	list_for_each_entry_safe(late, tmp, &vd->late_lost, node) {
		list_del(&late->node);
		tacc_user_close(late->user);
		kfree(late);
	}
	mutex_unlock(&vd->late_settle);
}
