// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio_userptr - USERPTR BOs of the virtio-tacc frontend: existing
 * user memory, pinned (FOLL_LONGTERM) and DMA mapped for the device like a
 * host BO's shmem pages, then described to the backend in BO_CREATE.
 *
 * The pins are charged to the caller's mm->pinned_vm against RLIMIT_MEMLOCK
 * unless CAP_IPC_LOCK (-ENOMEM), before pinning, as the PCI driver and
 * ib_umem_get() do; the BO keeps the mm (mmgrab) to uncharge it when freed.
 */

#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>

#include <drm/drm_gem.h>

#include "tacc_virtio.h"

static int tacc_vuserptr_charge(struct tacc_vbo *bo)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	struct mm_struct *mm = current->mm;

	if (!mm)
		return -EFAULT;
	if (atomic64_add_return(bo->npages, &mm->pinned_vm) > limit && !capable(CAP_IPC_LOCK)) {
		atomic64_sub(bo->npages, &mm->pinned_vm);
		return -ENOMEM;
	}
	mmgrab(mm);
	bo->pin_mm = mm;
	return 0;
}

static void tacc_vuserptr_uncharge(struct tacc_vbo *bo)
{
	if (!bo->pin_mm)
		return;
	atomic64_sub(bo->npages, &bo->pin_mm->pinned_vm);
	mmdrop(bo->pin_mm);
	bo->pin_mm = NULL;
}

/* Pins [@uaddr, @uaddr + BO size) and maps it for the device into bo->sgt. */
int tacc_vuserptr_pin(struct tacc_vbo *bo, u64 uaddr)
{
	struct tacc_vdev *vd = to_tacc_vdev(bo->shmem.base.dev);
	unsigned int gup = FOLL_LONGTERM;
	struct sg_table *sgt;
	long pinned;
	int ret;

	bo->npages = bo->shmem.base.size >> PAGE_SHIFT;
	if (!access_ok(u64_to_user_ptr(uaddr), bo->shmem.base.size))
		return -EFAULT;
	if (!(bo->flags & DRM_TACC_BO_F_READONLY))
		gup |= FOLL_WRITE;
	ret = tacc_vuserptr_charge(bo);
	if (ret)
		return ret;
	bo->pages = kvmalloc_array(bo->npages, sizeof(*bo->pages), GFP_KERNEL);
	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	ret = -ENOMEM;
	if (!bo->pages || !sgt)
		goto err_free;

	pinned = pin_user_pages_fast(uaddr, bo->npages, gup, bo->pages);
	ret = pinned < 0 ? pinned : -EFAULT;
	if (pinned != bo->npages)
		goto err_unpin;
	ret = sg_alloc_table_from_pages(sgt, bo->pages, bo->npages, 0, bo->shmem.base.size,
					GFP_KERNEL);
	if (ret)
		goto err_unpin;
	if (vd->dma_dev) {
		/* user pages may overlap another BO's: see tacc_gem.c's USERPTR map */
		ret = dma_map_sgtable(vd->dma_dev, sgt, tacc_vbo_dma_dir(bo),
				      DMA_ATTR_SKIP_CPU_SYNC);
		if (ret)
			goto err_table;
		dma_sync_sgtable_for_device(vd->dma_dev, sgt, tacc_vbo_dma_dir(bo));
	}
	bo->sgt = sgt;
	tacc_vbo_dma_map_done(bo);
	return 0;

err_table:
	sg_free_table(sgt);
err_unpin:
	if (pinned > 0)
		unpin_user_pages(bo->pages, pinned);
err_free:
	kfree(sgt);
	kvfree(bo->pages);
	bo->pages = NULL;
	tacc_vuserptr_uncharge(bo);
	return ret;
}

/* After the backend let go of the pages (BO_DESTROY) or the device was reset. */
void tacc_vuserptr_unpin(struct tacc_vbo *bo)
{
	if (!bo->sgt)
		return;
	tacc_vbo_dma_unmap(bo);
	sg_free_table(bo->sgt);
	kfree(bo->sgt);
	bo->sgt = NULL;
	unpin_user_pages_dirty_lock(bo->pages, bo->npages,
				    !(bo->flags & DRM_TACC_BO_F_READONLY));
	kvfree(bo->pages);
	bo->pages = NULL;
	tacc_vuserptr_uncharge(bo);
}

/*
 * tacc_vbo_leak(): the device may still hold the pages.  Their pins stay
 * (never released: counted in leaked_pages, no longer in the process's
 * pinned_vm, whose mm is let go); the array goes.
 */
void tacc_vuserptr_leak(struct tacc_vbo *bo)
{
	kvfree(bo->pages);
	bo->pages = NULL;
	tacc_vuserptr_uncharge(bo);
}
