// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc buffer objects: host memory (shmem), device memory (drm_mm over the
 * function's window) and userptr (pin_user_pages).  Host memory reaches
 * the device only through dma_map_sgtable(), so the IOMMU mode is honoured.
 */
#include <linux/dma-mapping.h>
#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_managed.h>
#include <drm/drm_print.h>
#include <drm/drm_vma_manager.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

unsigned int tacc_max_bo_mib = 512;
module_param_named(max_bo_mib, tacc_max_bo_mib, uint, 0644);
MODULE_PARM_DESC(max_bo_mib, "Largest buffer object, MiB (every node, virtio-tacc too)");

static unsigned int tacc_max_userptr_mib = 1024;
module_param_named(max_userptr_mib, tacc_max_userptr_mib, uint, 0644);
MODULE_PARM_DESC(max_userptr_mib, "Pinned userptr memory per file, MiB");

static u32 tacc_bo_devid(struct tacc_bo *bo)
{
	return tacc_devid(to_tacc_dev(bo->shmem.base.dev));
}

static void tacc_trace_sgt(struct tacc_bo *bo, struct sg_table *sgt, bool map, u32 dir)
{
	u64 iova = 0, len = 0;
	struct scatterlist *sg;
	unsigned int i;

	if (!trace_tacc_dma_map_enabled() && !trace_tacc_dma_unmap_enabled())
		return;
	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (!i)
			iova = sg_dma_address(sg);
		len += sg_dma_len(sg);
	}
	if (map)
		trace_tacc_dma_map(tacc_bo_devid(bo), bo, iova, len, sgt->nents, dir);
	else
		trace_tacc_dma_unmap(tacc_bo_devid(bo), bo, iova, len, sgt->nents, dir);
}

static struct dma_buf *tacc_gem_no_export(struct drm_gem_object *obj, int flags)
{
	return ERR_PTR(-EOPNOTSUPP);
}

/*
 * A BO belongs to the file that created it: its context accounts for it
 * (bo->uctx, freed with that file) and only that context's VM binds it.  A
 * GEM_OPEN of its flink name from another file is refused.
 */
static int tacc_gem_open(struct drm_gem_object *obj, struct drm_file *file)
{
	return to_tacc_bo(obj)->uctx == file->driver_priv ? 0 : -EPERM;
}

/*
 * The last handle of the file goes: its binding goes too, once the jobs the
 * context submitted before have finished (their VAs cannot change under
 * them, as for VM_UNBIND).  The wait is bounded (close_wait_ms): a job
 * waiting on an in-syncobj nobody signals must not hold close() forever.
 * A job still queued then finds the VA unbound (an MMU fault of its own
 * context), or is cancelled when the file is released.
 */
static void tacc_gem_close(struct drm_gem_object *obj, struct drm_file *file)
{
	struct tacc_ctx *ctx = file->driver_priv;
	struct tacc_bo *bo = to_tacc_bo(obj);
	bool bound;

	if (!ctx)
		return;
	mutex_lock(&ctx->vm.lock);
	bound = bo->map && bo->map->ctx == ctx;
	mutex_unlock(&ctx->vm.lock);
	if (bound)
		tacc_ctx_close_wait(ctx);
	tacc_vm_unbind(ctx, bo);
}

static enum dma_data_direction tacc_bo_userptr_dir(struct tacc_bo *bo)
{
	return (bo->flags & DRM_TACC_BO_F_READONLY) ? DMA_TO_DEVICE : DMA_BIDIRECTIONAL;
}

/* Called with tdev->bo_dma_lock held. */
static void tacc_bo_unmap_userptr(struct tacc_device *tdev, struct tacc_bo *bo)
{
	enum dma_data_direction dir = tacc_bo_userptr_dir(bo);

	tacc_trace_sgt(bo, bo->sgt, false, dir);
	dma_unmap_sgtable(tacc_to_dev(tdev), bo->sgt, dir, 0);
	sg_free_table(bo->sgt);
	kfree(bo->sgt);
	bo->sgt = NULL;
}

/* Called with tdev->bo_dma_lock held: drop the helper's DMA mapping. */
static void tacc_bo_unmap_host(struct tacc_device *tdev, struct tacc_bo *bo)
{
	struct drm_gem_shmem_object *shmem = &bo->shmem;

	tacc_trace_sgt(bo, bo->sgt, false, DMA_BIDIRECTIONAL);
	dma_resv_lock(shmem->base.resv, NULL);
	if (shmem->sgt) {
		dma_unmap_sgtable(tacc_to_dev(tdev), shmem->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(shmem->sgt);
		kfree(shmem->sgt);
		shmem->sgt = NULL;
		if (shmem->pages)
			drm_gem_shmem_put_pages(shmem);	/* the sgt's reference */
	}
	dma_resv_unlock(shmem->base.resv);
	bo->sgt = NULL;
}

/*
 * Surprise removal: unmap every BO while the device (and its IOMMU
 * domain) still exists; tacc_gem_free then finds bo->sgt NULL.  No new
 * mapping is made: creation and binding run under drm_dev_enter().
 */
void tacc_bo_release_dma(struct tacc_device *tdev)
{
	struct tacc_bo *bo, *tmp;

	mutex_lock(&tdev->bo_dma_lock);
	tdev->dma_released = true;
	list_for_each_entry_safe(bo, tmp, &tdev->bo_dma_list, dma_node) {
		list_del(&bo->dma_node);
		if (bo->type == DRM_TACC_BO_USERPTR)
			tacc_bo_unmap_userptr(tdev, bo);
		else
			tacc_bo_unmap_host(tdev, bo);
	}
	mutex_unlock(&tdev->bo_dma_lock);
}

/*
 * USERPTR pins are charged before pinning, atomically (no check-then-add
 * race between two threads of a file), to the file's max_userptr_mib budget
 * (-ENOSPC) and, as ib_umem_get() does, to the caller's mm->pinned_vm
 * against RLIMIT_MEMLOCK unless CAP_IPC_LOCK (-ENOMEM).  The BO keeps the
 * mm (mmgrab) to uncharge it when freed, whoever drops the last reference.
 */
static int tacc_userptr_charge(struct tacc_ctx *ctx, struct tacc_bo *bo, unsigned long npages)
{
	unsigned long limit = (unsigned long)tacc_max_userptr_mib << (20 - PAGE_SHIFT);
	unsigned long lock_limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	struct mm_struct *mm = current->mm;

	if (!mm)
		return -EFAULT;
	if (atomic_long_add_return(npages, &ctx->userptr_pages) > limit) {
		atomic_long_sub(npages, &ctx->userptr_pages);
		return -ENOSPC;
	}
	if (atomic64_add_return(npages, &mm->pinned_vm) > lock_limit &&
	    !capable(CAP_IPC_LOCK)) {
		atomic64_sub(npages, &mm->pinned_vm);
		atomic_long_sub(npages, &ctx->userptr_pages);
		return -ENOMEM;
	}
	mmgrab(mm);
	bo->pin_mm = mm;
	return 0;
}

static void tacc_userptr_uncharge(struct tacc_ctx *ctx, struct tacc_bo *bo,
				  unsigned long npages)
{
	if (!bo->pin_mm)
		return;
	atomic64_sub(npages, &bo->pin_mm->pinned_vm);
	mmdrop(bo->pin_mm);
	bo->pin_mm = NULL;
	if (ctx)
		atomic_long_sub(npages, &ctx->userptr_pages);
}

static void tacc_gem_free(struct drm_gem_object *obj)
{
	struct tacc_bo *bo = to_tacc_bo(obj);
	struct tacc_device *tdev = to_tacc_dev(obj->dev);

	WARN_ON(bo->map);
	trace_tacc_bo_destroy(tacc_bo_devid(bo), bo, bo->type, obj->size);
	atomic_dec(&tdev->live.bos);
	if (bo->uctx)
		atomic_dec(&bo->uctx->nr_bos);
	if (bo->user) {
		tacc_user_uncharge_bo(bo->user, bo->type == DRM_TACC_BO_DEVICE ? obj->size : 0);
		tacc_user_put(bo->user);
		bo->user = NULL;
	}

	switch (bo->type) {
	case DRM_TACC_BO_HOST:
		/* the helper unmaps shmem->sgt: NULL if tacc_remove did already */
		mutex_lock(&tdev->bo_dma_lock);
		if (bo->sgt) {
			tacc_trace_sgt(bo, bo->sgt, false, DMA_BIDIRECTIONAL);
			list_del(&bo->dma_node);
		}
		mutex_unlock(&tdev->bo_dma_lock);
		drm_gem_shmem_free(&bo->shmem);
		return;
	case DRM_TACC_BO_DEVICE:
		atomic_long_sub(obj->size, &tdev->live.devmem_bytes);
		tacc_scrub_bo(tdev, bo);	/* releases obj; the range and bo once scrubbed */
		return;
	case DRM_TACC_BO_USERPTR:
		mutex_lock(&tdev->bo_dma_lock);
		if (bo->sgt) {
			list_del(&bo->dma_node);
			tacc_bo_unmap_userptr(tdev, bo);
		}
		mutex_unlock(&tdev->bo_dma_lock);
		if (bo->pages) {
			unpin_user_pages_dirty_lock(bo->pages, bo->npages,
						    !(bo->flags & DRM_TACC_BO_F_READONLY));
			kvfree(bo->pages);
			atomic_long_sub(bo->npages, &tdev->live.userptr_pages);
			tacc_userptr_uncharge(bo->uctx, bo, bo->npages);
		}
		break;
	}
	drm_gem_object_release(obj);
	kfree(bo);
}

static const struct drm_gem_object_funcs tacc_shmem_funcs = {
	.status = tacc_gem_status,
	.free = tacc_gem_free,
	.open = tacc_gem_open,
	.close = tacc_gem_close,
	.export = tacc_gem_no_export,
	.print_info = drm_gem_shmem_object_print_info,
	.pin = drm_gem_shmem_object_pin,
	.unpin = drm_gem_shmem_object_unpin,
	.get_sg_table = drm_gem_shmem_object_get_sg_table,
	.vmap = drm_gem_shmem_object_vmap,
	.vunmap = drm_gem_shmem_object_vunmap,
	.mmap = drm_gem_shmem_object_mmap,
	.vm_ops = &drm_gem_shmem_vm_ops,
};

static const struct drm_gem_object_funcs tacc_private_funcs = {
	.status = tacc_gem_status,
	.free = tacc_gem_free,
	.open = tacc_gem_open,
	.close = tacc_gem_close,
	.export = tacc_gem_no_export,
};

struct drm_gem_object *tacc_gem_create_object(struct drm_device *dev, size_t size)
{
	struct tacc_bo *bo;

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return ERR_PTR(-ENOMEM);
	bo->type = DRM_TACC_BO_HOST;
	bo->shmem.base.funcs = &tacc_shmem_funcs;
	return &bo->shmem.base;
}

/* DMA mapping of a host BO; created on first use, kept until free. */
int tacc_bo_get_sgt(struct tacc_bo *bo, struct sg_table **sgtp)
{
	struct tacc_device *tdev = to_tacc_dev(bo->shmem.base.dev);
	struct sg_table *sgt;

	if (bo->type == DRM_TACC_BO_USERPTR) {
		*sgtp = bo->sgt;
		return 0;
	}
	if (bo->type != DRM_TACC_BO_HOST)
		return -EINVAL;
	sgt = drm_gem_shmem_get_pages_sgt(&bo->shmem);
	if (IS_ERR(sgt))
		return PTR_ERR(sgt);
	mutex_lock(&tdev->bo_dma_lock);
	if (!bo->sgt) {
		bo->sgt = sgt;
		list_add_tail(&bo->dma_node, &tdev->bo_dma_list);
		tacc_trace_sgt(bo, sgt, true, DMA_BIDIRECTIONAL);
	}
	mutex_unlock(&tdev->bo_dma_lock);
	*sgtp = sgt;
	return 0;
}

static struct tacc_bo *tacc_bo_alloc_private(struct tacc_device *tdev, u64 size)
{
	struct tacc_bo *bo;

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return ERR_PTR(-ENOMEM);
	bo->shmem.base.funcs = &tacc_private_funcs;
	drm_gem_private_object_init(&tdev->drm, &bo->shmem.base, size);
	return bo;
}

/*
 * Freed ranges come back only once scrubbed (tacc_scrub.c): when memory is
 * short, wait (interruptibly, up to 5 s) for ranges being scrubbed.
 */
static int tacc_devmem_insert(struct tacc_device *tdev, struct drm_mm_node *node, u64 size,
			      u64 align)
{
	u32 gen;
	int ret;

	for (;;) {
		gen = atomic_read(&tdev->scrub_gen);
		mutex_lock(&tdev->devmem_lock);
		ret = drm_mm_insert_node_generic(&tdev->devmem_mm, node, size, align, 0,
						 DRM_MM_INSERT_BEST);
		if (ret == -ENOSPC && align > PAGE_SIZE)
			ret = drm_mm_insert_node_generic(&tdev->devmem_mm, node, size,
							 PAGE_SIZE, 0, DRM_MM_INSERT_BEST);
		if (!ret)
			tdev->devmem_used += size;
		mutex_unlock(&tdev->devmem_lock);
		if (ret != -ENOSPC)
			return ret;
		ret = tacc_scrub_wait_release(tdev, gen, 5 * HZ);
		if (ret < 0)
			return ret;
		if (!ret)
			return -ENOSPC;
	}
}

/*
 * The device memory the function's own BOs may take: the PF's less the
 * virtio-tacc window and the VF windows carved from it.
 */
static u64 tacc_devmem_own(struct tacc_device *tdev)
{
	u64 own = tdev->devmem_size;
	u32 i;

	mutex_lock(&tdev->devmem_lock);
	if (drm_mm_node_allocated(&tdev->virtio_node))
		own -= tdev->virtio_node.size;
	for (i = 0; i < TACC_MAX_VFS; i++) {
		if (drm_mm_node_allocated(&tdev->vf_nodes[i]))
			own -= tdev->vf_nodes[i].size;
	}
	mutex_unlock(&tdev->devmem_lock);
	return own;
}

static struct tacc_bo *tacc_bo_create_devmem(struct tacc_device *tdev, u64 size)
{
	struct tacc_bo *bo;
	u64 align = size >= TACC_SZ_2M ? TACC_SZ_2M : PAGE_SIZE;
	int ret;

	if (size > tdev->devmem_size)
		return ERR_PTR(-ENOSPC);
	bo = tacc_bo_alloc_private(tdev, size);
	if (IS_ERR(bo))
		return bo;
	bo->type = DRM_TACC_BO_DEVICE;

	ret = tacc_devmem_insert(tdev, &bo->devmem, size, align);
	if (ret) {
		drm_gem_object_release(&bo->shmem.base);
		kfree(bo);
		return ERR_PTR(ret);
	}
	atomic_long_add(size, &tdev->live.devmem_bytes);
	return bo;
}

static struct tacc_bo *tacc_bo_create_userptr(struct tacc_device *tdev, struct tacc_ctx *ctx,
					      u64 uaddr, u64 size, u32 flags)
{
	bool ro = flags & DRM_TACC_BO_F_READONLY;
	enum dma_data_direction dir = ro ? DMA_TO_DEVICE : DMA_BIDIRECTIONAL;
	unsigned long npages = size >> PAGE_SHIFT;
	struct sg_table *sgt;
	struct tacc_bo *bo;
	long pinned;
	int ret;

	if (!uaddr || !PAGE_ALIGNED(uaddr) || !PAGE_ALIGNED(size))
		return ERR_PTR(-EINVAL);
	if (!access_ok(u64_to_user_ptr(uaddr), size))
		return ERR_PTR(-EFAULT);

	bo = tacc_bo_alloc_private(tdev, size);
	if (IS_ERR(bo))
		return bo;
	bo->type = DRM_TACC_BO_USERPTR;
	bo->flags = flags;
	ret = tacc_userptr_charge(ctx, bo, npages);
	if (ret)
		goto err_obj;

	bo->pages = kvmalloc_array(npages, sizeof(*bo->pages), GFP_KERNEL);
	if (!bo->pages) {
		ret = -ENOMEM;
		goto err_charge;
	}
	pinned = pin_user_pages_fast(uaddr, npages, FOLL_LONGTERM | (ro ? 0 : FOLL_WRITE),
				     bo->pages);
	if (pinned < 0) {
		ret = pinned;
		goto err_pages;
	}
	if (pinned != npages) {
		unpin_user_pages(bo->pages, pinned);
		ret = -EFAULT;
		goto err_pages;
	}

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt) {
		ret = -ENOMEM;
		goto err_unpin;
	}
	ret = sg_alloc_table_from_pages(sgt, bo->pages, npages, 0, size, GFP_KERNEL);
	if (ret)
		goto err_sgt;
	/*
	 * Two USERPTR BOs may share user pages (a buffer registered twice, sub-page
	 * buffers in one page): overlapping streaming mappings, which DMA-API debug's
	 * cacheline tracking reports unless the map skips the CPU sync (kernel/dma/
	 * debug.c add_dma_entry; seen on the debug kernel). Sync explicitly instead:
	 * the same cache maintenance the plain map does.
	 */
	ret = dma_map_sgtable(tacc_to_dev(tdev), sgt, dir, DMA_ATTR_SKIP_CPU_SYNC);
	if (ret)
		goto err_table;
	dma_sync_sgtable_for_device(tacc_to_dev(tdev), sgt, dir);

	bo->npages = npages;
	mutex_lock(&tdev->bo_dma_lock);
	bo->sgt = sgt;
	list_add_tail(&bo->dma_node, &tdev->bo_dma_list);
	mutex_unlock(&tdev->bo_dma_lock);
	bo->uctx = ctx;
	atomic_long_add(npages, &tdev->live.userptr_pages);
	tacc_trace_sgt(bo, sgt, true, dir);
	return bo;

err_table:
	sg_free_table(sgt);
err_sgt:
	kfree(sgt);
err_unpin:
	unpin_user_pages(bo->pages, npages);
err_pages:
	kvfree(bo->pages);
	bo->pages = NULL;
err_charge:
	tacc_userptr_uncharge(ctx, bo, npages);
err_obj:
	drm_gem_object_release(&bo->shmem.base);
	kfree(bo);
	return ERR_PTR(ret);
}

static int __tacc_bo_create(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_bo_create *args = data;
	struct drm_gem_shmem_object *shmem;
	struct tacc_bo *bo;
	u64 size = args->size;
	u64 va = 0, pgsz, own;
	u32 handle;
	int ret;

	if (args->type >= DRM_TACC_BO_TYPE_COUNT || (args->flags & ~DRM_TACC_BO_F_ALL) ||
	    args->pad || args->handle || args->va)
		return -EINVAL;
	if (!size || size > ((u64)tacc_max_bo_mib << 20))
		return -EINVAL;
	if (args->type != DRM_TACC_BO_USERPTR && args->userptr)
		return -EINVAL;
	size = PAGE_ALIGN(size);

	/* beyond the function's own memory: no user's share could hold it */
	own = args->type == DRM_TACC_BO_DEVICE ? tacc_devmem_own(tdev) : 0;
	if (args->type == DRM_TACC_BO_DEVICE && size > own)
		return -ENOSPC;
	if (atomic_inc_return(&ctx->nr_bos) > TACC_MAX_BOS) {
		atomic_dec(&ctx->nr_bos);
		return -EMFILE;
	}
	/* the user's BOs and device memory (tacc_quota.c): -EDQUOT */
	ret = tacc_user_charge_bo(ctx->user, ctx->unlimited,
				  args->type == DRM_TACC_BO_DEVICE ? size : 0, own);
	if (ret)
		goto err_count;

	switch (args->type) {
	case DRM_TACC_BO_HOST:
		shmem = drm_gem_shmem_create(dev, size);
		if (IS_ERR(shmem)) {
			ret = PTR_ERR(shmem);
			goto err_charge;
		}
		bo = to_tacc_bo(&shmem->base);
		break;
	case DRM_TACC_BO_DEVICE:
		bo = tacc_bo_create_devmem(tdev, size);
		if (IS_ERR(bo)) {
			ret = PTR_ERR(bo);
			goto err_charge;
		}
		break;
	default:
		if (size != args->size) {
			ret = -EINVAL;
			goto err_charge;
		}
		bo = tacc_bo_create_userptr(tdev, ctx, args->userptr, size, args->flags);
		if (IS_ERR(bo)) {
			ret = PTR_ERR(bo);
			goto err_charge;
		}
		break;
	}
	bo->flags = args->flags;
	bo->uctx = ctx;
	bo->user = tacc_user_get(ctx->user);	/* the charge is the BO's now */
	atomic_inc(&tdev->live.bos);
	trace_tacc_bo_create(tacc_bo_devid(bo), ctx->id, bo, bo->type, size, bo->flags);

	if (!(args->flags & DRM_TACC_BO_F_NO_BIND)) {
		ret = tacc_vm_bind(ctx, bo, 0, 0, size,
				   (args->flags & DRM_TACC_BO_F_READONLY) ?
				   DRM_TACC_BIND_F_READONLY : 0, &va, &pgsz);
		if (ret)
			goto err_put;
	}

	ret = drm_gem_handle_create(file, &bo->shmem.base, &handle);
	if (ret)
		goto err_unbind;
	drm_gem_object_put(&bo->shmem.base);
	args->handle = handle;
	args->va = va;
	return 0;

err_unbind:
	tacc_vm_unbind(ctx, bo);
err_put:
	/* the free path drops nr_bos and the charge */
	drm_gem_object_put(&bo->shmem.base);
	return ret;
err_charge:
	tacc_user_uncharge_bo(ctx->user, args->type == DRM_TACC_BO_DEVICE ? size : 0);
err_count:
	atomic_dec(&ctx->nr_bos);
	return ret;
}

/* DMA mappings are made only while tacc_remove cannot release them. */
int tacc_bo_create_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	int ret, idx;

	if (!drm_dev_enter(dev, &idx))
		return -ENODEV;
	ret = __tacc_bo_create(dev, data, file);
	drm_dev_exit(idx);
	return ret;
}

int tacc_bo_info_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_bo_info *args = data;
	struct drm_gem_object *obj;
	struct tacc_bo *bo;
	int ret = 0;

	if (args->pad)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_bo(obj);

	args->mmap_offset = 0;
	if (bo->type == DRM_TACC_BO_HOST) {
		ret = drm_gem_create_mmap_offset(obj);
		if (ret)
			goto out;
		args->mmap_offset = drm_vma_node_offset_addr(&obj->vma_node);
	}
	mutex_lock(&ctx->vm.lock);
	if (bo->map && bo->map->ctx == ctx) {
		args->va = bo->map->node.start;
		args->bound_size = bo->map->size;
	} else {
		args->va = 0;
		args->bound_size = 0;
	}
	mutex_unlock(&ctx->vm.lock);
	args->size = obj->size;
	args->type = bo->type;
	args->flags = bo->flags;
out:
	drm_gem_object_put(obj);
	return ret;
}

static void tacc_devmem_fini_action(struct drm_device *dev, void *data)
{
	struct tacc_device *tdev = to_tacc_dev(dev);

	if (drm_mm_node_allocated(&tdev->virtio_node))
		drm_mm_remove_node(&tdev->virtio_node);
	drm_mm_takedown(&tdev->devmem_mm);
	tacc_quota_fini(&tdev->quota);	/* every file and BO is gone */
}

/*
 * The virtio-tacc function's window (TACC_CAP_VIRTIO_FN) is carved from the
 * PF's memory by the device, not by this driver: it is reserved here for
 * the life of the binding, so no PF BO, VF window or PF scrub ever reaches
 * it.  A window reaching beyond the PF's memory is clipped to it (the device
 * refuses such a window; docs/hardware.md).
 */
static void tacc_devmem_reserve_virtio(struct tacc_device *tdev)
{
	struct drm_mm_node *n = &tdev->virtio_node;
	u64 base, size;

	if (tdev->is_vf || !(tdev->caps & TACC_CAP_VIRTIO_FN))
		return;
	base = tacc_rd64(tdev, TACC_REG_VIRTIO_DEVMEM_BASE);
	size = tacc_rd64(tdev, TACC_REG_VIRTIO_DEVMEM_SIZE);
	if (base >= tdev->devmem_size || !size)
		return;
	n->start = ALIGN_DOWN(base, PAGE_SIZE);
	n->size = min(ALIGN(base + size, PAGE_SIZE), tdev->devmem_size) - n->start;
	if (WARN_ON(drm_mm_reserve_node(&tdev->devmem_mm, n)))
		return;		/* an empty allocator */
	tdev->devmem_used += n->size;
	drm_info(&tdev->drm, "virtio-tacc window 0x%llx+0x%llx reserved\n", n->start, n->size);
}

/**
 * tacc_devmem_virtio_overlaps() - does [start, start + size) meet the virtio window?
 * @tdev: the PF.
 * @start: device-memory address.
 * @size: bytes.
 *
 * Return: true if any byte of the range belongs to the virtio-tacc function.
 */
bool tacc_devmem_virtio_overlaps(struct tacc_device *tdev, u64 start, u64 size)
{
	const struct drm_mm_node *n = &tdev->virtio_node;

	return drm_mm_node_allocated(n) && start < n->start + n->size && n->start < start + size;
}

int tacc_devmem_init(struct tacc_device *tdev)
{
	drm_mm_init(&tdev->devmem_mm, 0, tdev->devmem_size);
	tacc_devmem_reserve_virtio(tdev);
	return drmm_add_action_or_reset(&tdev->drm, tacc_devmem_fini_action, NULL);
}
