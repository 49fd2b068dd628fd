// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc - DRM accel driver for the tacc PCIe accelerator: PCI probe/remove,
 * drm_driver, ioctl table, file contexts, mmap and fdinfo.
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/iopoll.h>
#include <linux/module.h>
#include <linux/pm_runtime.h>
#include <linux/sched.h>

#include <drm/drm_accel.h>
#include <drm/drm_drv.h>
#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_ioctl.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_trace.h"
#include "tacc_virtio.h"

unsigned int tacc_job_timeout_ms = 2000;
module_param_named(job_timeout_ms, tacc_job_timeout_ms, uint, 0644);
MODULE_PARM_DESC(job_timeout_ms, "Job timeout before a queue reset, ms (read at probe)");

unsigned int tacc_close_wait_ms = 5000;
module_param_named(close_wait_ms, tacc_close_wait_ms, uint, 0644);
MODULE_PARM_DESC(close_wait_ms,
		 "Longest wait of a GEM_CLOSE or close() for the file's jobs, ms; jobs still waiting then are cancelled");

unsigned int tacc_autosuspend_ms = 1000;
module_param_named(autosuspend_ms, tacc_autosuspend_ms, uint, 0644);
MODULE_PARM_DESC(autosuspend_ms, "Runtime PM autosuspend delay, ms (read at probe)");

static bool tacc_test_warn;
module_param_named(test_warn, tacc_test_warn, bool, 0444);
MODULE_PARM_DESC(test_warn, "Test only: WARN once at probe, to show the harness catches it");

/* ------------------------------------------------------------ hardware ---- */

/*
 * TLB_INV with its completion (docs/hardware.md): write a fresh sequence
 * number to TLB_INV_SEQ, then TLB_INV, and wait until TLB_INV_DONE shows
 * the sequence; only then is no stale translation of @val used again.  The
 * wait sleeps (tlb_lock is a mutex): -ETIMEDOUT after TACC_TLB_INV_TIMEOUT_US.
 */
static int tacc_tlb_inv_hw(struct tacc_device *tdev, u32 val)
{
	u32 seq, done;
	int ret;

	if (!(tdev->caps & TACC_CAP_TLB_INV_DONE)) {
		tacc_wr(tdev, TACC_REG_TLB_INV, val);
		return 0;
	}
	mutex_lock(&tdev->tlb_lock);
	seq = ++tdev->tlb_seq;
	if (!seq)			/* 0 is the reset value of TLB_INV_DONE */
		seq = ++tdev->tlb_seq;
	tacc_wr(tdev, TACC_REG_TLB_INV_SEQ, seq);
	tacc_wr(tdev, TACC_REG_TLB_INV, val);
	ret = readl_poll_timeout(tdev->regs + TACC_REG_TLB_INV_DONE, done, done == seq,
				 TACC_TLB_INV_POLL_US, TACC_TLB_INV_TIMEOUT_US);
	mutex_unlock(&tdev->tlb_lock);
	if (ret) {
		atomic64_inc(&tdev->tlb_inv_timeouts);
		drm_err_ratelimited(&tdev->drm, "TLB invalidation 0x%x: no completion (done %u, want %u)\n",
				    val, done, seq);
	}
	return ret;
}

/*
 * Files and BOs outlive an unplugged device: never touch its BARs then.
 * Returns -ETIMEDOUT when the device did not complete the invalidation: the
 * caller must not free what the old entries mapped (tacc_tlb_recover()).
 */
int tacc_tlb_invalidate(struct tacc_device *tdev, u32 ctx)
{
	int idx, ret = 0;

	if (!drm_dev_enter(&tdev->drm, &idx))
		return 0;
	if (pm_runtime_get_if_active(tacc_to_dev(tdev)) > 0) {
		ret = tacc_tlb_inv_hw(tdev, ctx);
		pm_runtime_mark_last_busy(tacc_to_dev(tdev));
		pm_runtime_put_autosuspend(tacc_to_dev(tdev));
	}	/* else suspended: resume invalidates everything */
	drm_dev_exit(idx);
	return ret;
}

/*
 * A context root: written now if the function holds its roots (ptbr_live,
 * under ctx_lock: set by tacc_hw_init() after it programmed every root,
 * cleared by tacc_hw_stop() before power-down or reset), else by the next
 * tacc_hw_init().  No runtime-PM check: "not active" also covers
 * RPM_RESUMING after the resume's loop, which lost the write.  Returns the
 * invalidation's result: -ETIMEDOUT when the device may still translate
 * through the old root (tacc_ctx_release()).
 */
int tacc_hw_program_ctx(struct tacc_device *tdev, u32 id, u64 ptbr)
{
	int idx, ret;

	lockdep_assert_held(&tdev->ctx_lock);
	if (!tdev->ptbr_live || !drm_dev_enter(&tdev->drm, &idx))
		return 0;
	tacc_wr64(tdev, TACC_REG_CTX_PTBR(id), ptbr);
	ret = tacc_tlb_inv_hw(tdev, id);
	drm_dev_exit(idx);
	return ret;
}

/*
 * hw_up is read under each queue's lock (run_job, CQ processing): once
 * this returns, no such section still acts on the old value.  Either way
 * the VF migration epoch moves: the function stops before a reset and is
 * up after one, the device having ended every VF's stop and log.
 */
static void tacc_set_hw_up(struct tacc_device *tdev, bool up)
{
	unsigned long flags;
	u32 i;

	WRITE_ONCE(tdev->hw_up, up);
	atomic_inc(&tdev->vfmig_epoch);
	for (i = 0; i < tdev->num_queues; i++) {
		spin_lock_irqsave(&tdev->queues[i].lock, flags);
		spin_unlock_irqrestore(&tdev->queues[i].lock, flags);
	}
}

/**
 * tacc_hw_stop() - make the function quiet before its jobs are failed.
 * @tdev: the function.
 * @mmio: false when its registers do not answer (AER: frozen or failed
 *	  link, where the platform already stopped its DMA).
 *
 * No doorbell and no root write after this; with @mmio the CQs are reaped
 * (finished jobs keep their status), each queue is disabled, which aborts
 * what it runs, and a read-back flushes the posted writes: the device does
 * not touch the jobs' memory any more when this returns (ivpu does the
 * same: stop, flush, reset, then signal).
 */
void tacc_hw_stop(struct tacc_device *tdev, bool mmio)
{
	tacc_set_hw_up(tdev, false);
	mutex_lock(&tdev->ctx_lock);
	tdev->ptbr_live = false;
	mutex_unlock(&tdev->ctx_lock);
	if (mmio)
		tacc_queues_quiesce(tdev);
}

/*
 * Bring the function to a known state and (re)program everything the
 * device forgets in a reset or in D3hot: queues, context roots, trace
 * ring, VF partitions.  Called at probe and on resume.
 */
int tacc_hw_init(struct tacc_device *tdev)
{
	u32 i, status;
	int t;

	tacc_wr(tdev, TACC_REG_CTRL, TACC_CTRL_RESET);
	for (t = 0; t < 1000; t++) {
		if (!(tacc_rd(tdev, TACC_REG_CTRL) & TACC_CTRL_RESET))
			break;
		usleep_range(10, 20);
	}
	tacc_wr(tdev, TACC_REG_CTRL, TACC_CTRL_ENABLE);
	for (t = 0; t < 1000; t++) {
		status = tacc_rd(tdev, TACC_REG_STATUS);
		if (status & TACC_STATUS_READY)
			break;
		usleep_range(10, 20);
	}
	if (!(status & TACC_STATUS_READY)) {
		drm_err(&tdev->drm, "device not ready, status 0x%x\n", status);
		return -EIO;
	}

	tacc_wr(tdev, TACC_REG_IRQ_STATUS, ~0u);
	tacc_wr(tdev, TACC_REG_IRQ_MASK, TACC_IRQ_MMU_FAULT | TACC_IRQ_DMA_ERROR |
		TACC_IRQ_FATAL | TACC_IRQ_QUEUE_ERROR);
	tacc_wr(tdev, TACC_REG_FAULT_CLEAR, 1);

	mutex_lock(&tdev->ctx_lock);
	for (i = 0; i < tdev->num_contexts; i++) {
		struct tacc_ctx *ctx = tdev->ctxs[i];

		tacc_wr64(tdev, TACC_REG_CTX_PTBR(i),
			  ctx ? (ctx->vm.root.dma | TACC_PTBR_VALID) : 0);
	}
	tacc_tlb_inv_hw(tdev, TACC_TLB_INV_ALL);
	tdev->ptbr_live = true;	/* later opens write their root themselves */
	mutex_unlock(&tdev->ctx_lock);
	/* test knob (debugfs, 0): hold a resume right after the roots were loaded */
	if (READ_ONCE(tdev->resume_delay_ms) &&
	    tacc_to_dev(tdev)->power.runtime_status == RPM_RESUMING)
		msleep(READ_ONCE(tdev->resume_delay_ms));

	for (i = 0; i < tdev->num_queues; i++)
		tacc_queue_hw_setup(&tdev->queues[i]);

	tacc_trace_hw_setup(tdev);
	tacc_sample_hw_setup(tdev);
	tacc_tlpcap_hw_setup(tdev);
	if (!tdev->is_vf)
		tacc_sriov_restore(tdev);
	tacc_set_hw_up(tdev, true);
	return 0;
}

void tacc_hw_fini(struct tacc_device *tdev)
{
	tacc_hw_stop(tdev, true);
	tacc_wr(tdev, TACC_REG_TRACE_CTRL, 0);
	tacc_wr(tdev, TACC_REG_SAMPLE_PERIOD, 0);
	tacc_wr(tdev, TACC_REG_IRQ_MASK, 0);
	tacc_wr(tdev, TACC_REG_CTRL, 0);
	tacc_rd(tdev, TACC_REG_STATUS);	/* flush the posted writes */
}

/* ------------------------------------------------------------ contexts ---- */

struct tacc_ctx *tacc_ctx_get(struct tacc_ctx *ctx)
{
	kref_get(&ctx->ref);
	return ctx;
}

static void tacc_ctx_release(struct kref *ref)
{
	struct tacc_ctx *ctx = container_of(ref, struct tacc_ctx, ref);
	struct tacc_device *tdev = ctx->tdev;
	int inv = 0;

	if (!ctx->kernel) {
		mutex_lock(&tdev->ctx_lock);
		tdev->ctxs[ctx->id] = NULL;
		inv = tacc_hw_program_ctx(tdev, ctx->id, 0);
		/* its TLB entries may outlive it: no new context in the slot yet */
		if (inv)
			tdev->tlb_stale_ids |= BIT(ctx->id);
		mutex_unlock(&tdev->ctx_lock);
	}

	tacc_ctx_seq_fini(ctx);
	tacc_ctx_fences_fini(ctx);
	if (!ctx->kernel) {
		atomic_dec(&tdev->live.ctxs);
		if (inv) {	/* the tables go after a function reset */
			tacc_vm_defer_free(ctx);
			return;
		}
		tacc_vm_fini(tdev, &ctx->vm);
	}
	kfree(ctx);
}

void tacc_ctx_put(struct tacc_ctx *ctx)
{
	kref_put(&ctx->ref, tacc_ctx_release);
}

/**
 * tacc_ctx_open_files() - contexts of the function held by open files
 * @tdev: the function
 * @pid: count only those of this process (its thread-group id); 0 counts all
 *
 * A context outlives its file while jobs hold it; this counts only those whose
 * file is still open.  Caller holds &tacc_device.ctx_lock.
 */
unsigned int tacc_ctx_open_files(struct tacc_device *tdev, pid_t pid)
{
	unsigned int n = 0;
	u32 i;

	lockdep_assert_held(&tdev->ctx_lock);
	for (i = 0; i < tdev->num_contexts; i++) {
		struct tacc_ctx *ctx = tdev->ctxs[i];

		if (ctx && READ_ONCE(ctx->file) && (!pid || ctx->pid == pid))
			n++;
	}
	return n;
}

static bool tacc_ctx_over_limit(struct tacc_device *tdev, pid_t pid)
{
	unsigned int limit = READ_ONCE(tacc_max_ctx_per_process);

	if (!limit || capable(CAP_SYS_ADMIN))
		return false;
	return tacc_ctx_open_files(tdev, pid) >= limit;
}

static int tacc_open(struct drm_device *dev, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *ctx;
	int ret, id = -1;
	u32 i;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx)
		return -ENOMEM;
	kref_init(&ctx->ref);
	ctx->tdev = tdev;
	ctx->file = file;
	ctx->pid = task_tgid_nr(current);
	get_task_comm(ctx->comm, current);
	spin_lock_init(&ctx->seq_lock);

	/* the uid's files of the function (max_ctx_per_user): -EDQUOT */
	ctx->unlimited = capable(CAP_SYS_ADMIN);
	ctx->user = tacc_user_open(&tdev->quota, ctx->unlimited);
	if (IS_ERR(ctx->user)) {
		ret = PTR_ERR(ctx->user);
		goto err_free;
	}

	ret = tacc_vm_init(tdev, &ctx->vm);
	if (ret)
		goto err_user;

	mutex_lock(&tdev->ctx_lock);
	if (tdev->handoff) {	/* tacc/handoff: on its way to another driver */
		mutex_unlock(&tdev->ctx_lock);
		ret = -EBUSY;
		goto err_vm;
	}
	if (tacc_ctx_over_limit(tdev, ctx->pid)) {
		mutex_unlock(&tdev->ctx_lock);
		ret = -EMFILE;
		goto err_vm;
	}
	for (i = 0; i < tdev->num_contexts; i++) {
		if (!tdev->ctxs[i] && !(tdev->tlb_stale_ids & BIT(i))) {
			id = i;
			break;
		}
	}
	if (id < 0) {
		mutex_unlock(&tdev->ctx_lock);
		ret = -EBUSY;
		goto err_vm;
	}
	ctx->id = id;
	tdev->ctxs[id] = ctx;
	tacc_hw_program_ctx(tdev, id, ctx->vm.root.dma | TACC_PTBR_VALID);
	mutex_unlock(&tdev->ctx_lock);

	ret = tacc_ctx_entities_init(ctx);
	if (ret)
		goto err_slot;

	atomic_inc(&tdev->live.ctxs);
	file->driver_priv = ctx;
	return 0;

err_slot:
	mutex_lock(&tdev->ctx_lock);
	tdev->ctxs[id] = NULL;
	tacc_hw_program_ctx(tdev, id, 0);
	mutex_unlock(&tdev->ctx_lock);
err_vm:
	tacc_vm_fini(tdev, &ctx->vm);
err_user:
	tacc_user_close(ctx->user);
err_free:
	kfree(ctx);
	return ret;
}

static void tacc_postclose(struct drm_device *dev, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *ctx = file->driver_priv;

	tacc_trace_release(tdev, file);
	tacc_sample_release(tdev, file);
	tacc_tlpcap_release(tdev, file);
	tacc_ctx_entities_fini(ctx);
	ctx->file = NULL;
	file->driver_priv = NULL;
	tacc_user_close(ctx->user);	/* its BOs hold the user while they live */
	ctx->user = NULL;
	tacc_ctx_put(ctx);
}

/* --------------------------------------------------------------- params ---- */

static int tacc_get_param_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_get_param *args = data;
	int ret;

	if (args->index && args->param != DRM_TACC_PARAM_QUEUE_SIZE)
		return -EINVAL;

	switch (args->param) {
	case DRM_TACC_PARAM_API_VERSION:
		args->value = DRM_TACC_API_VERSION;
		break;
	case DRM_TACC_PARAM_HW_VERSION:
		args->value = tdev->hw_version;
		break;
	case DRM_TACC_PARAM_CAPS:
		args->value = tdev->caps;
		break;
	case DRM_TACC_PARAM_FUNC:
		args->value = tdev->func;
		break;
	case DRM_TACC_PARAM_FUNC_KIND:
		args->value = tdev->is_vf ? DRM_TACC_FUNC_KIND_VF : DRM_TACC_FUNC_KIND_PF;
		break;
	case DRM_TACC_PARAM_NUM_QUEUES:
		args->value = tdev->num_queues;
		break;
	case DRM_TACC_PARAM_NUM_CONTEXTS:
		args->value = tdev->num_contexts;
		break;
	case DRM_TACC_PARAM_NUM_ENGINES:
		args->value = tdev->num_engines;
		break;
	case DRM_TACC_PARAM_DEVMEM_SIZE:
		args->value = tdev->devmem_size;
		break;
	case DRM_TACC_PARAM_DEVMEM_FREE:
		mutex_lock(&tdev->devmem_lock);
		args->value = tdev->devmem_size - tdev->devmem_used;
		mutex_unlock(&tdev->devmem_lock);
		break;
	case DRM_TACC_PARAM_CLOCK_HZ:
		args->value = tdev->clock_hz;
		break;
	case DRM_TACC_PARAM_CONTEXT_ID:
		args->value = ctx->id;
		break;
	case DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET:
		args->value = DRM_TACC_MMAP_COUNTERS;
		break;
	case DRM_TACC_PARAM_COUNTERS_MMAP_SIZE:	/* what this caller may map */
		if (tdev->is_vf)
			args->value = PAGE_SIZE;
		else
			args->value = perfmon_capable() ? TACC_BAR_COUNTERS_SIZE : 0;
		break;
	case DRM_TACC_PARAM_TRACE_MMAP_OFFSET:
		args->value = DRM_TACC_MMAP_TRACE;
		break;
	case DRM_TACC_PARAM_MAX_CMDS:
		args->value = TACC_MAX_CMDS;
		break;
	case DRM_TACC_PARAM_MAX_INFLIGHT:
		args->value = TACC_MAX_INFLIGHT;
		break;
	case DRM_TACC_PARAM_VA_START:
		args->value = TACC_VA_START;
		break;
	case DRM_TACC_PARAM_VA_END:
		args->value = TACC_VA_END;
		break;
	case DRM_TACC_PARAM_CTX_FAULTS:
		args->value = atomic64_read(&ctx->faults);
		break;
	case DRM_TACC_PARAM_CTX_FAULT_ADDR:
		args->value = atomic64_read(&ctx->fault_addr);
		break;
	case DRM_TACC_PARAM_CTX_RESETS:
		args->value = atomic64_read(&ctx->resets);
		break;
	case DRM_TACC_PARAM_LAST_SEQNO:
		spin_lock(&ctx->seq_lock);
		args->value = ctx->last_seqno;
		spin_unlock(&ctx->seq_lock);
		break;
	case DRM_TACC_PARAM_DEVCLK:
		ret = pm_runtime_resume_and_get(tacc_to_dev(tdev));
		if (ret)
			return ret;
		args->value = tacc_rd64(tdev, TACC_REG_DEVCLK);
		pm_runtime_mark_last_busy(tacc_to_dev(tdev));
		pm_runtime_put_autosuspend(tacc_to_dev(tdev));
		break;
	case DRM_TACC_PARAM_QUEUE_SIZE:
		if (!tacc_queue_usable(tdev, args->index))
			return -EINVAL;
		args->value = TACC_SQ_ENTRIES;
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

/* ----------------------------------------------------------------- mmap ---- */

/*
 * The counter block: a VF's function page to its node's users; on the PF
 * CAP_PERFMON for both pages (the function page sums the work of every tenant
 * of the PF, the global page every function's link traffic: docs/uapi.md
 * "Threat model").  A VF has no global page.
 */
static int tacc_mmap_counters(struct tacc_device *tdev, struct vm_area_struct *vma)
{
	unsigned long size = vma->vm_end - vma->vm_start;

	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
	if (size > TACC_BAR_COUNTERS_SIZE)
		return -EINVAL;
	if (tdev->is_vf ? size > PAGE_SIZE : !perfmon_capable())
		return -EACCES;

	vm_flags_mod(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP, VM_MAYWRITE);
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	return io_remap_pfn_range(vma, vma->vm_start, tdev->cnt_phys >> PAGE_SHIFT,
				  size, vma->vm_page_prot);
}

/*
 * The counter BAR and the trace and sample rings belong to the device: once it is
 * unplugged (surprise removal) they are gone, so new mappings fail with
 * -ENODEV (drm_dev_unplug() zapped the existing ones).  BO mappings are
 * shmem pages and stay valid.
 */
static int tacc_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct drm_file *file = filp->private_data;
	struct tacc_device *tdev = to_tacc_dev(file->minor->dev);
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	int idx, ret;

	if (off != DRM_TACC_MMAP_COUNTERS && off != DRM_TACC_MMAP_TRACE &&
	    off != DRM_TACC_MMAP_SAMPLE && off != DRM_TACC_MMAP_TLPCAP)
		return drm_gem_mmap(filp, vma);
	if (!drm_dev_enter(&tdev->drm, &idx))
		return -ENODEV;
	if (off == DRM_TACC_MMAP_COUNTERS)
		ret = tacc_mmap_counters(tdev, vma);
	else if (off == DRM_TACC_MMAP_TRACE)
		ret = tacc_trace_mmap(tdev, file, vma);
	else if (off == DRM_TACC_MMAP_TLPCAP)
		ret = tacc_tlpcap_mmap(tdev, file, vma);
	else
		ret = tacc_sample_mmap(tdev, file, vma);
	drm_dev_exit(idx);
	return ret;
}

static long tacc_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct drm_file *file = filp->private_data;
	struct tacc_device *tdev = to_tacc_dev(file->minor->dev);
	struct tacc_ctx *ctx = file->driver_priv;
	u32 id = ctx ? ctx->id : ~0u;
	long ret;

	trace_tacc_ioctl_enter(tacc_devid(tdev), id, _IOC_NR(cmd));
	ret = drm_ioctl(filp, cmd, arg);
	trace_tacc_ioctl_exit(tacc_devid(tdev), id, _IOC_NR(cmd), ret);
	return ret;
}

static const struct file_operations tacc_fops = {
	.owner = THIS_MODULE,
	.open = accel_open,
	.release = drm_release,
	.unlocked_ioctl = tacc_ioctl,
	.compat_ioctl = drm_compat_ioctl,
	.poll = drm_poll,
	.read = drm_read,
	.llseek = noop_llseek,
	.mmap = tacc_mmap,
	.show_fdinfo = drm_show_fdinfo,
	.fop_flags = FOP_UNSIGNED_OFFSET,
};

/* --------------------------------------------------------------- driver ---- */

static const struct drm_ioctl_desc tacc_ioctls[] = {
	DRM_IOCTL_DEF_DRV(TACC_GET_PARAM, tacc_get_param_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_BO_CREATE, tacc_bo_create_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_BO_INFO, tacc_bo_info_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_VM_BIND, tacc_vm_bind_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_VM_UNBIND, tacc_vm_unbind_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SUBMIT, tacc_submit_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_WAIT, tacc_wait_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_OPEN, tacc_trace_open_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_ADVANCE, tacc_trace_advance_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TRACE_CLOSE, tacc_trace_close_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_OPEN, tacc_sample_open_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_ADVANCE, tacc_sample_advance_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_SAMPLE_CLOSE, tacc_sample_close_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_OPEN, tacc_tlpcap_open_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_ADVANCE, tacc_tlpcap_advance_ioctl, 0),
	DRM_IOCTL_DEF_DRV(TACC_TLPCAP_CLOSE, tacc_tlpcap_close_ioctl, 0),
};

static const struct drm_driver tacc_driver = {
	.driver_features = DRIVER_GEM | DRIVER_COMPUTE_ACCEL | DRIVER_SYNCOBJ,
	.open = tacc_open,
	.postclose = tacc_postclose,
	.gem_create_object = tacc_gem_create_object,
	.ioctls = tacc_ioctls,
	.num_ioctls = ARRAY_SIZE(tacc_ioctls),
	.fops = &tacc_fops,
	.show_fdinfo = tacc_show_fdinfo,
	.name = DRIVER_NAME,
	.desc = DRIVER_DESC,
	.date = "20261129",
	.major = 1,
	.minor = 0,
};

/* ------------------------------------------------------------------ PCI ---- */

static void tacc_read_info(struct tacc_device *tdev)
{
	tdev->hw_version = tacc_rd(tdev, TACC_REG_VERSION);
	tdev->caps = tacc_rd(tdev, TACC_REG_CAPS);
	tdev->func = tacc_rd(tdev, TACC_REG_FUNC);
	tdev->num_queues = min_t(u32, tacc_rd(tdev, TACC_REG_NUM_QUEUES), TACC_NUM_QUEUES);
	tdev->num_contexts = min_t(u32, tacc_rd(tdev, TACC_REG_NUM_CONTEXTS),
				   TACC_NUM_CONTEXTS);
	tdev->num_engines = tacc_rd(tdev, TACC_REG_NUM_ENGINES);
	tdev->devmem_size = tacc_rd64(tdev, TACC_REG_DEVMEM_SIZE);
	tdev->link_cap = tacc_rd(tdev, TACC_REG_LINK_CAP);
	tdev->link_status = tacc_rd(tdev, TACC_REG_LINK_STATUS);
	tdev->link_params = tacc_rd(tdev, TACC_REG_LINK_PARAMS);
	tdev->tlb_entries = tacc_rd(tdev, TACC_REG_TLB_ENTRIES);
	tdev->clock_hz = tacc_rd(tdev, TACC_REG_CLOCK_HZ);
	tdev->time_scale = tacc_rd(tdev, TACC_REG_TIME_SCALE);
	if (tdev->caps & TACC_CAP_ROOFLINE) {
		tdev->peak_fp32_gflops = tacc_rd(tdev, TACC_REG_PEAK_FP32_GFLOPS);
		tdev->peak_bf16_gflops = tacc_rd(tdev, TACC_REG_PEAK_BF16_GFLOPS);
		tdev->devmem_gbps = tacc_rd(tdev, TACC_REG_DEVMEM_GBPS);
	}
	tdev->is_vf = !!(tdev->caps & TACC_CAP_VF);
	tdev->queue_mask = tdev->num_queues ? GENMASK(tdev->num_queues - 1, 0) : 0;
	if (tdev->caps & TACC_CAP_VF_POLICY)	/* a VF's queues, as its PF set them */
		tdev->queue_mask &= tacc_rd(tdev, TACC_REG_QUEUE_MASK);
}

static int tacc_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct tacc_device *tdev;
	u16 cmd;
	u32 magic;
	int ret;

	tdev = devm_drm_dev_alloc(&pdev->dev, &tacc_driver, struct tacc_device, drm);
	if (IS_ERR(tdev))
		return PTR_ERR(tdev);
	tdev->pdev = pdev;
	pci_set_drvdata(pdev, tdev);
	tacc_quota_init(&tdev->quota);
	mutex_init(&tdev->ctx_lock);
	mutex_init(&tdev->devmem_lock);
	tacc_ring_init(&tdev->trace, &tdev->drm, &pdev->dev, &pdev->dev);
	tacc_ring_init(&tdev->sample, &tdev->drm, &pdev->dev, &pdev->dev);
	tacc_ring_init(&tdev->tlpcap, &tdev->drm, &pdev->dev, &pdev->dev);
	mutex_init(&tdev->bo_dma_lock);
	mutex_init(&tdev->sriov_lock);
	mutex_init(&tdev->vfmig_lock);
	INIT_LIST_HEAD(&tdev->bo_dma_list);
	tacc_vm_stale_init(tdev);
	spin_lock_init(&tdev->cnt_lock);
	mutex_init(&tdev->tlb_lock);
	tacc_reset_init(tdev);

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	if (pdev->is_virtfn) {
		/* QEMU gates VF BAR decoding on the VF's own command register */
		pci_read_config_word(pdev, PCI_COMMAND, &cmd);
		if (!(cmd & PCI_COMMAND_MEMORY))
			pci_write_config_word(pdev, PCI_COMMAND, cmd | PCI_COMMAND_MEMORY);
	}
	pci_set_master(pdev);

	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(52));
	if (ret)
		return ret;
	dma_set_max_seg_size(&pdev->dev, UINT_MAX);

	ret = pcim_iomap_regions(pdev, BIT(TACC_BAR_REGS) | BIT(TACC_BAR_COUNTERS), DRIVER_NAME);
	if (ret)
		return ret;
	tdev->regs = pcim_iomap_table(pdev)[TACC_BAR_REGS];
	tdev->cnt = pcim_iomap_table(pdev)[TACC_BAR_COUNTERS];
	tdev->cnt_phys = pci_resource_start(pdev, TACC_BAR_COUNTERS);

	magic = tacc_rd(tdev, TACC_REG_ID);
	if (magic != TACC_ID_MAGIC) {
		dev_err(&pdev->dev, "bad magic 0x%08x\n", magic);
		return -ENODEV;
	}
	tacc_read_info(tdev);
	if (!tdev->num_queues || !tdev->queue_mask || !tdev->num_contexts) {
		dev_err(&pdev->dev, "no queues or contexts\n");
		return -ENODEV;
	}

	/* memory the device may still reference lives until drm release */
	ret = tacc_devmem_init(tdev);
	if (ret)
		return ret;
	tacc_sriov_init(tdev);
	ret = tacc_queues_init(tdev);
	if (ret)
		return ret;
	ret = tacc_scrub_init(tdev);
	if (ret)
		return ret;
	ret = tacc_irq_init(tdev);
	if (ret)
		return ret;
	ret = tacc_hw_init(tdev);
	if (ret)
		return ret;
	tacc_aer_init(tdev);
	pci_save_state(pdev);	/* restored after AER and FLR resets */

	tacc_pm_init(tdev);

	ret = tacc_scrub_probe(tdev);
	if (ret)
		goto err_pm;
	ret = drm_dev_register(&tdev->drm, 0);
	if (ret)
		goto err_pm;
	tacc_debugfs_init(tdev->drm.accel);
	tacc_pmu_init(tdev);	/* not fatal: logs its own failure */

	drm_info(&tdev->drm, "tacc %s function %u: hw %u.%u, %u queues, %llu MiB device memory\n",
		 tdev->is_vf ? "VF" : "PF", tdev->func, tdev->hw_version >> 16,
		 tdev->hw_version & 0xffff, tdev->num_queues, tdev->devmem_size >> 20);
	WARN(tacc_test_warn, "tacc: test_warn=1: deliberate warning for the test harness\n");
	return 0;

err_pm:
	tacc_pm_fini(tdev);
	tacc_hw_fini(tdev);
	return ret;
}

/*
 * Free or unmap every DMA buffer while the device is still there: once
 * tacc_remove returns, a surprise-removed device loses its IOMMU DMA ops
 * and files left open would free IOVAs as physical addresses.  After
 * drm_dev_unplug() no ioctl maps anything new; the release paths (file
 * close, BO free, drm release) skip what is freed here.
 */
static void tacc_release_dma(struct tacc_device *tdev)
{
	u32 i;

	mutex_lock(&tdev->ctx_lock);
	for (i = 0; i < tdev->num_contexts; i++) {
		if (tdev->ctxs[i])
			tacc_vm_release_dma(tdev, &tdev->ctxs[i]->vm);
	}
	mutex_unlock(&tdev->ctx_lock);
	tacc_vm_stale_release(tdev);
	tacc_bo_release_dma(tdev);
	tacc_queues_release_dma(tdev);
	tacc_trace_release_dma(tdev);
	tacc_sample_release_dma(tdev);
	tacc_tlpcap_release_dma(tdev);
}

static void tacc_remove(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	tacc_pmu_fini(tdev);
	if (!tdev->is_vf)
		tacc_sriov_fini(tdev);
	/*
	 * FILLs of freed BOs still queued reach the device before it goes: the
	 * next driver (vfio-pci: FLR keeps device memory) must not find the
	 * last user's bytes.  Bounded: a surprise-removed device fails them.
	 */
	if (pci_device_is_present(pdev))
		tacc_scrub_drain(tdev, false, 30 * HZ, false);
	drm_dev_unplug(&tdev->drm);
	tacc_reset_fini(tdev);
	tacc_pm_fini(tdev);
	tacc_hw_fini(tdev);
	tacc_queues_fail(tdev, -ENODEV);
	tacc_release_dma(tdev);
}

static void tacc_shutdown(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (tdev && tdev->hw_up)
		tacc_hw_fini(tdev);
}

static const struct pci_device_id tacc_pci_ids[] = {
	{ PCI_DEVICE(TACC_PCI_VENDOR_ID, TACC_PCI_DEVICE_ID_PF) },
	{ PCI_DEVICE(TACC_PCI_VENDOR_ID, TACC_PCI_DEVICE_ID_VF) },
	{ }
};
MODULE_DEVICE_TABLE(pci, tacc_pci_ids);

struct pci_driver tacc_pci_driver = {
	.name = DRIVER_NAME,
	.id_table = tacc_pci_ids,
	.probe = tacc_probe,
	.remove = tacc_remove,
	.shutdown = tacc_shutdown,
	.sriov_configure = tacc_sriov_configure,
	.err_handler = &tacc_err_handlers,
	.dev_groups = tacc_dev_groups,
	.driver = {
		.pm = &tacc_pm_ops,
	},
};

static int __init tacc_init(void)
{
	int ret;

	tacc_sysfs_init();
	ret = tacc_pmu_module_init();
	if (ret)
		return ret;
	ret = tacc_genl_init();
	if (ret)
		goto err_pmu;
	ret = pci_register_driver(&tacc_pci_driver);
	if (ret)
		goto err_genl;
	ret = tacc_virtio_register();
	if (ret)
		goto err_pci;
	return 0;

err_pci:
	pci_unregister_driver(&tacc_pci_driver);
err_genl:
	tacc_genl_fini();
err_pmu:
	tacc_pmu_module_exit();
	return ret;
}

static void __exit tacc_exit(void)
{
	tacc_virtio_unregister();
	pci_unregister_driver(&tacc_pci_driver);
	rcu_barrier();	/* RCU-deferred fence puts (drm_sched) run our release */
	tacc_genl_fini();
	tacc_pmu_module_exit();
}

module_init(tacc_init);
module_exit(tacc_exit);

MODULE_AUTHOR("tacc project");
MODULE_DESCRIPTION(DRIVER_DESC);
MODULE_LICENSE("GPL");
MODULE_IMPORT_NS(DMA_BUF);
