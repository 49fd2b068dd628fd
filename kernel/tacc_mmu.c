// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc device MMU: one address space per file (hardware context), three
 * levels of 512-entry tables (tacc_hw.h), 2 MiB pages where VA and target
 * are aligned, 4 KiB otherwise.
 *
 * A table is a page charged to the memory cgroup of the task whose open or
 * VM_BIND needed it (GFP_KERNEL_ACCOUNT), streaming-mapped for the device to
 * read (DMA_TO_DEVICE): each entry written is synced for the device before
 * the TLB invalidation that publishes it.  The device never writes them.
 */
#include <linux/dma-mapping.h>
#include <linux/seq_file.h>
#include <linux/slab.h>

#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

#define TACC_SZ_1G	BIT_ULL(30)

/* Publish entry @idx of @pt to the device (a no-op on a coherent platform). */
static void tacc_pt_set(struct tacc_device *tdev, struct tacc_pt *pt, u32 idx, u64 val)
{
	WRITE_ONCE(pt->cpu[idx], val);
	dma_sync_single_range_for_device(tacc_to_dev(tdev), pt->dma, idx * sizeof(u64),
					 sizeof(u64), DMA_TO_DEVICE);
}

static void tacc_pt_free_page(struct tacc_device *tdev, struct tacc_pt *pt)
{
	dma_unmap_page(tacc_to_dev(tdev), pt->dma, PAGE_SIZE, DMA_TO_DEVICE);
	free_page((unsigned long)pt->cpu);
	pt->cpu = NULL;
	atomic_dec(&tdev->live.pt_pages);
}

static int tacc_pt_alloc(struct tacc_device *tdev, struct tacc_pt *pt, bool with_children)
{
	struct device *dev = tacc_to_dev(tdev);
	struct page *page;

	page = alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!page)
		return -ENOMEM;
	pt->dma = dma_map_page(dev, page, 0, PAGE_SIZE, DMA_TO_DEVICE);
	if (dma_mapping_error(dev, pt->dma)) {
		__free_page(page);
		return -ENOMEM;
	}
	pt->cpu = page_address(page);
	atomic_inc(&tdev->live.pt_pages);
	if (with_children) {
		pt->child = kcalloc(TACC_PT_ENTRIES, sizeof(*pt->child), GFP_KERNEL_ACCOUNT);
		if (!pt->child) {
			tacc_pt_free_page(tdev, pt);
			return -ENOMEM;
		}
	}
	return 0;
}

static void tacc_pt_free(struct tacc_device *tdev, struct tacc_pt *pt)
{
	kfree(pt->child);
	pt->child = NULL;
	if (pt->cpu)
		tacc_pt_free_page(tdev, pt);
}

int tacc_vm_init(struct tacc_device *tdev, struct tacc_vm *vm)
{
	int ret;

	mutex_init(&vm->lock);
	ret = tacc_pt_alloc(tdev, &vm->root, true);
	if (ret)
		return ret;
	vm->nr_tables = 1;
	drm_mm_init(&vm->va_mm, TACC_VA_START, TACC_VA_END - TACC_VA_START);
	return 0;
}

/*
 * Free every table's DMA memory; the root keeps its (now empty) child
 * array so that unbinding later finds nothing to clear.  With @keep the
 * pages stay allocated and mapped for good (the device may translate
 * through them: counted in debugfs "tlb" and the pt_pages live count), and
 * only the driver's bookkeeping goes.
 */
static void tacc_vm_free_tables(struct tacc_device *tdev, struct tacc_vm *vm, bool keep)
{
	struct tacc_pt *l1, *l2;
	u32 i, j;

	if (!vm->root.cpu)
		return;
	for (i = 0; i < TACC_PT_ENTRIES; i++) {
		l1 = vm->root.child[i];
		if (!l1)
			continue;
		for (j = 0; j < TACC_PT_ENTRIES; j++) {
			l2 = l1->child[j];
			if (l2 && !keep)
				tacc_pt_free(tdev, l2);
			kfree(l2);
		}
		if (keep)
			kfree(l1->child);
		else
			tacc_pt_free(tdev, l1);
		kfree(l1);
		vm->root.child[i] = NULL;
	}
	if (keep) {
		atomic_add(vm->nr_tables, &tdev->pt_leaked);
		vm->root.cpu = NULL;
	} else {
		tacc_pt_free_page(tdev, &vm->root);
	}
	vm->nr_tables = 0;
}

void tacc_vm_fini(struct tacc_device *tdev, struct tacc_vm *vm)
{
	tacc_vm_free_tables(tdev, vm, false);	/* nothing left after tacc_remove */
	kfree(vm->root.child);
	vm->root.child = NULL;
	drm_mm_takedown(&vm->va_mm);
	mutex_destroy(&vm->lock);
}

static void tacc_vm_stale_free(struct tacc_device *tdev, struct list_head *list, bool keep)
{
	struct tacc_ctx *ctx, *tmp;

	list_for_each_entry_safe(ctx, tmp, list, stale_node) {
		list_del(&ctx->stale_node);
		if (keep)
			tacc_vm_free_tables(tdev, &ctx->vm, true);
		tacc_vm_fini(tdev, &ctx->vm);
		kfree(ctx);
	}
}

/*
 * The contexts released while the device may still translate through their
 * roots (tacc_ctx_release(): the root-clear invalidation timed out).  Each
 * was put on tlb_stale before this reset began, so the reset (CTRL_RESET
 * empties the TLB) covers them: then their tables go and their slots serve
 * again.  If the function is not reset, tables and slots are kept for good.
 */
static void tacc_vm_stale_work(struct work_struct *work)
{
	struct tacc_device *tdev = container_of(work, struct tacc_device, tlb_work);
	struct tacc_ctx *ctx;
	unsigned long ids = 0;
	LIST_HEAD(list);
	int idx, ret;

	if (!drm_dev_enter(&tdev->drm, &idx))
		return;		/* tacc_remove stops the device, then frees them */
	mutex_lock(&tdev->tlb_stale_lock);
	list_splice_init(&tdev->tlb_stale, &list);
	mutex_unlock(&tdev->tlb_stale_lock);
	if (list_empty(&list)) {
		drm_dev_exit(idx);
		return;
	}
	list_for_each_entry(ctx, &list, stale_node)
		ids |= BIT(ctx->id);
	ret = tacc_tlb_recover(tdev);
	if (ret)
		drm_err(&tdev->drm, "contexts 0x%lx: function not reset after a TLB invalidation timeout: tables and slots kept\n",
			ids);
	tacc_vm_stale_free(tdev, &list, ret != 0);
	if (!ret) {
		mutex_lock(&tdev->ctx_lock);
		tdev->tlb_stale_ids &= ~ids;
		mutex_unlock(&tdev->ctx_lock);
	}
	drm_dev_exit(idx);
}

void tacc_vm_stale_init(struct tacc_device *tdev)
{
	mutex_init(&tdev->tlb_stale_lock);
	INIT_LIST_HEAD(&tdev->tlb_stale);
	INIT_WORK(&tdev->tlb_work, tacc_vm_stale_work);
}

/*
 * A released context whose root-clear invalidation timed out: its tables
 * (and its slot, tlb_stale_ids) wait for the function reset of
 * tacc_vm_stale_work(), not run here: the last reference may be dropped by
 * a scheduler's free_job, which that reset's drm_sched_wqueue_stop() waits
 * for.  Takes @ctx over.
 */
void tacc_vm_defer_free(struct tacc_ctx *ctx)
{
	struct tacc_device *tdev = ctx->tdev;
	bool dead;

	mutex_lock(&tdev->tlb_stale_lock);
	dead = tdev->tlb_stale_dead;
	if (!dead)
		list_add_tail(&ctx->stale_node, &tdev->tlb_stale);
	mutex_unlock(&tdev->tlb_stale_lock);
	if (dead) {	/* tacc_remove stopped the device and released its DMA */
		tacc_vm_fini(tdev, &ctx->vm);
		kfree(ctx);
		return;
	}
	schedule_work(&tdev->tlb_work);
}

/* tacc_remove, the device stopped (tacc_hw_fini()): nothing translates now. */
void tacc_vm_stale_release(struct tacc_device *tdev)
{
	LIST_HEAD(list);

	cancel_work_sync(&tdev->tlb_work);
	mutex_lock(&tdev->tlb_stale_lock);
	tdev->tlb_stale_dead = true;
	list_splice_init(&tdev->tlb_stale, &list);
	mutex_unlock(&tdev->tlb_stale_lock);
	tacc_vm_stale_free(tdev, &list, false);
}

/*
 * Surprise removal: the tables must go while the device (and its IOMMU
 * domain) still exists.  Bindings stay in va_mm until their BOs close;
 * binding anew is refused by drm_dev_enter() in tacc_vm_bind().
 */
void tacc_vm_release_dma(struct tacc_device *tdev, struct tacc_vm *vm)
{
	mutex_lock(&vm->lock);
	tacc_vm_free_tables(tdev, vm, false);
	mutex_unlock(&vm->lock);
}

static struct tacc_pt *tacc_pt_child(struct tacc_device *tdev, struct tacc_vm *vm,
				     struct tacc_pt *parent, u32 idx, bool leaf_level)
{
	struct tacc_pt *pt = parent->child[idx];

	if (pt)
		return pt;
	pt = kzalloc(sizeof(*pt), GFP_KERNEL_ACCOUNT);
	if (!pt)
		return NULL;
	if (tacc_pt_alloc(tdev, pt, !leaf_level)) {
		kfree(pt);
		return NULL;
	}
	parent->child[idx] = pt;
	tacc_pt_set(tdev, parent, idx, (pt->dma & TACC_PTE_ADDR_MASK) | TACC_PTE_VALID);
	vm->nr_tables++;
	return pt;
}

static void tacc_unmap_range(struct tacc_device *tdev, struct tacc_vm *vm, u64 va, u64 len)
{
	u64 end = va + len;

	while (va < end) {
		u32 i0 = (va >> 30) & 511, i1 = (va >> 21) & 511, i2 = (va >> 12) & 511;
		struct tacc_pt *l1 = vm->root.child[i0], *l2;

		if (!l1) {
			va = ALIGN(va + 1, TACC_SZ_1G);
			continue;
		}
		if (l1->cpu[i1] & TACC_PTE_HUGE) {
			tacc_pt_set(tdev, l1, i1, 0);
			va = ALIGN(va + 1, TACC_SZ_2M);
			continue;
		}
		l2 = l1->child[i1];
		if (!l2) {
			va = ALIGN(va + 1, TACC_SZ_2M);
			continue;
		}
		tacc_pt_set(tdev, l2, i2, 0);
		va += PAGE_SIZE;
	}
}

static int tacc_map_range(struct tacc_device *tdev, struct tacc_vm *vm, u64 va, u64 addr,
			  u64 len, u64 flags, u64 *pgsz)
{
	while (len) {
		u32 i0 = (va >> 30) & 511, i1 = (va >> 21) & 511, i2 = (va >> 12) & 511;
		struct tacc_pt *l1, *l2;

		l1 = tacc_pt_child(tdev, vm, &vm->root, i0, false);
		if (!l1)
			return -ENOMEM;
		if (IS_ALIGNED(va, TACC_SZ_2M) && IS_ALIGNED(addr, TACC_SZ_2M) &&
		    len >= TACC_SZ_2M && !l1->child[i1]) {
			tacc_pt_set(tdev, l1, i1, (addr & TACC_PTE_ADDR_MASK) | flags |
				    TACC_PTE_VALID | TACC_PTE_HUGE);
			*pgsz = TACC_SZ_2M;
			va += TACC_SZ_2M;
			addr += TACC_SZ_2M;
			len -= TACC_SZ_2M;
			continue;
		}
		l2 = tacc_pt_child(tdev, vm, l1, i1, true);
		if (!l2)
			return -ENOMEM;
		tacc_pt_set(tdev, l2, i2, (addr & TACC_PTE_ADDR_MASK) | flags | TACC_PTE_VALID);
		if (!*pgsz)
			*pgsz = PAGE_SIZE;
		va += PAGE_SIZE;
		addr += PAGE_SIZE;
		len -= PAGE_SIZE;
	}
	return 0;
}

static int tacc_map_bo(struct tacc_device *tdev, struct tacc_vm *vm, struct tacc_bo *bo,
		       struct sg_table *sgt, u64 va, u64 bo_offset, u64 size, u64 flags,
		       u64 *pgsz)
{
	struct scatterlist *sg;
	u64 skip = bo_offset, left = size, cur = va;
	unsigned int i;
	int ret;

	if (bo->type == DRM_TACC_BO_DEVICE)
		return tacc_map_range(tdev, vm, va, bo->devmem.start + bo_offset, size,
				      flags | TACC_PTE_DEVMEM, pgsz);

	for_each_sgtable_dma_sg(sgt, sg, i) {
		u64 a = sg_dma_address(sg), l = sg_dma_len(sg);

		if (skip >= l) {
			skip -= l;
			continue;
		}
		a += skip;
		l -= skip;
		skip = 0;
		l = min(l, left);
		if (!IS_ALIGNED(a, PAGE_SIZE) || !IS_ALIGNED(l, PAGE_SIZE))
			return -EINVAL;
		ret = tacc_map_range(tdev, vm, cur, a, l, flags, pgsz);
		if (ret)
			return ret;
		cur += l;
		left -= l;
		if (!left)
			break;
	}
	return left ? -EINVAL : 0;
}

static bool tacc_pt_empty(const struct tacc_pt *pt)
{
	return !memchr_inv(pt->cpu, 0, PAGE_SIZE);
}

static void tacc_pt_unhook(struct tacc_device *tdev, struct tacc_vm *vm,
			   struct tacc_pt *parent, u32 idx, struct list_head *dead)
{
	struct tacc_pt *pt = parent->child[idx];

	tacc_pt_set(tdev, parent, idx, 0);
	parent->child[idx] = NULL;
	list_add_tail(&pt->dead, dead);
	vm->nr_tables--;
}

/*
 * After an unmap of [va, va + len): unhook the level-2 and level-1 tables
 * that no longer hold a valid entry and queue them on @dead.  The device may
 * still cache the directory entries that pointed to them, so they are freed
 * by tacc_vm_free_dead() only after the TLB invalidation.
 */
static void tacc_vm_prune(struct tacc_device *tdev, struct tacc_vm *vm, u64 va, u64 len,
			  struct list_head *dead)
{
	u64 last = va + len - 1;
	u32 i0, i1;

	lockdep_assert_held(&vm->lock);
	if (!len || !vm->root.cpu)
		return;
	for (i0 = va >> 30; i0 <= last >> 30; i0++) {
		struct tacc_pt *l1 = vm->root.child[i0 & 511];
		u32 lo = i0 == va >> 30 ? (va >> 21) & 511 : 0;
		u32 hi = i0 == last >> 30 ? (last >> 21) & 511 : 511;

		if (!l1)
			continue;
		for (i1 = lo; i1 <= hi; i1++) {
			if (l1->child[i1] && tacc_pt_empty(l1->child[i1]))
				tacc_pt_unhook(tdev, vm, l1, i1, dead);
		}
		if (tacc_pt_empty(l1))
			tacc_pt_unhook(tdev, vm, &vm->root, i0 & 511, dead);
	}
}

static void tacc_vm_free_dead(struct tacc_device *tdev, struct list_head *dead)
{
	struct tacc_pt *pt, *tmp;

	list_for_each_entry_safe(pt, tmp, dead, dead) {
		list_del(&pt->dead);
		tacc_pt_free(tdev, pt);
		kfree(pt);
	}
}

/*
 * Invalidate @ctx's TLB entries after its PTEs were cleared, then free the
 * tables pruned on @dead.  When the device does not complete the
 * invalidation it may still translate through the old entries: the function
 * is reset first (tacc_tlb_recover(), which empties its TLB), and if that
 * fails too the tables and @bo (its pages) are kept for good (counted in
 * debugfs "tlb").  Returns the invalidation's result.
 */
static int tacc_vm_flush(struct tacc_device *tdev, struct tacc_ctx *ctx,
			 struct list_head *dead, struct tacc_bo *bo)
{
	struct tacc_pt *pt, *tmp;
	int ret;

	wmb();	/* cleared PTEs visible before the TLB invalidation */
	ret = tacc_tlb_invalidate(tdev, ctx->id);
	if (!ret || !tacc_tlb_recover(tdev)) {
		tacc_vm_free_dead(tdev, dead);
		return ret;
	}
	list_for_each_entry_safe(pt, tmp, dead, dead) {
		list_del_init(&pt->dead);
		atomic_inc(&tdev->pt_leaked);
	}
	if (bo) {
		drm_gem_object_get(&bo->shmem.base);
		if (bo->uctx)
			tacc_ctx_get(bo->uctx);	/* the BO's free path accounts to it */
		atomic_inc(&tdev->bo_leaked);
	}
	drm_err(&tdev->drm, "context %u: function not reset after a TLB invalidation timeout: tables and BO kept\n",
		ctx->id);
	return ret;
}

static int __tacc_vm_bind(struct tacc_ctx *ctx, struct tacc_bo *bo, u64 va, u64 bo_offset,
			  u64 size, u32 flags, u64 *out_va, u64 *out_pgsz)
{
	struct tacc_device *tdev = ctx->tdev;
	struct tacc_vm *vm = &ctx->vm;
	u64 objsize = bo->shmem.base.size;
	struct sg_table *sgt = NULL;
	struct tacc_mapping *map;
	u64 pte_flags = 0, pgsz = 0;
	LIST_HEAD(dead);
	int ret;

	if (flags & ~DRM_TACC_BIND_F_ALL)
		return -EINVAL;
	if (!IS_ALIGNED(bo_offset, PAGE_SIZE) || !IS_ALIGNED(size, PAGE_SIZE) ||
	    bo_offset >= objsize)
		return -EINVAL;
	if (!size)
		size = objsize - bo_offset;
	if (size > objsize - bo_offset)
		return -EINVAL;
	if (flags & DRM_TACC_BIND_F_FIXED) {
		if (!IS_ALIGNED(va, PAGE_SIZE) || va < TACC_VA_START || va >= TACC_VA_END ||
		    size > TACC_VA_END - va)
			return -EINVAL;
	} else if (va) {
		return -EINVAL;
	}
	if (!(flags & DRM_TACC_BIND_F_READONLY) && !(bo->flags & DRM_TACC_BO_F_READONLY))
		pte_flags |= TACC_PTE_WRITE;

	if (bo->type != DRM_TACC_BO_DEVICE) {
		ret = tacc_bo_get_sgt(bo, &sgt);
		if (ret)
			return ret;
	}

	map = kzalloc(sizeof(*map), GFP_KERNEL);
	if (!map)
		return -ENOMEM;
	map->bo = bo;
	map->ctx = ctx;
	map->bo_offset = bo_offset;
	map->size = size;
	map->readonly = !(pte_flags & TACC_PTE_WRITE);

	mutex_lock(&vm->lock);
	if (bo->map) {
		ret = -EBUSY;
		goto err_unlock;
	}
	if (flags & DRM_TACC_BIND_F_FIXED) {
		map->node.start = va;
		map->node.size = size;
		ret = drm_mm_reserve_node(&vm->va_mm, &map->node);
		if (ret) {
			ret = -EBUSY;
			goto err_unlock;
		}
	} else {
		ret = drm_mm_insert_node_in_range(&vm->va_mm, &map->node, size,
						  size >= TACC_SZ_2M ? TACC_SZ_2M : PAGE_SIZE,
						  0, TACC_VA_START, TACC_VA_END,
						  DRM_MM_INSERT_BEST);
		if (ret)
			goto err_unlock;
	}
	ret = tacc_map_bo(tdev, vm, bo, sgt, map->node.start, bo_offset, size, pte_flags,
			  &pgsz);
	if (ret)
		goto err_unmap;
	map->page_size = pgsz;
	bo->map = map;
	atomic_inc(&tdev->live.mappings);
	mutex_unlock(&vm->lock);

	wmb();	/* PTEs visible before the device is told */
	/*
	 * A timeout here frees nothing: the new VA had no valid entry the
	 * device could cache (an unbind's failed invalidation reset the
	 * function), so the binding stands.
	 */
	tacc_tlb_invalidate(tdev, ctx->id);
	trace_tacc_vm_bind(tacc_devid(tdev), ctx->id, bo, map->node.start, size, pgsz);
	*out_va = map->node.start;
	*out_pgsz = pgsz;
	return 0;

err_unmap:
	tacc_unmap_range(tdev, vm, map->node.start, size);
	tacc_vm_prune(tdev, vm, map->node.start, size, &dead);
	drm_mm_remove_node(&map->node);
	mutex_unlock(&vm->lock);
	/* a job of the context may have walked the partial mapping */
	tacc_vm_flush(tdev, ctx, &dead, bo);
	kfree(map);
	return ret;
err_unlock:
	mutex_unlock(&vm->lock);
	kfree(map);
	return ret;
}

/* No new tables or DMA mappings once tacc_remove may have released them. */
int tacc_vm_bind(struct tacc_ctx *ctx, struct tacc_bo *bo, u64 va, u64 bo_offset,
		 u64 size, u32 flags, u64 *out_va, u64 *out_pgsz)
{
	int ret, idx;

	if (!drm_dev_enter(&ctx->tdev->drm, &idx))
		return -ENODEV;
	ret = __tacc_vm_bind(ctx, bo, va, bo_offset, size, flags, out_va, out_pgsz);
	drm_dev_exit(idx);
	return ret;
}

void tacc_vm_unbind(struct tacc_ctx *ctx, struct tacc_bo *bo)
{
	struct tacc_device *tdev = ctx->tdev;
	struct tacc_mapping *map;
	LIST_HEAD(dead);
	int idx;

	/* tables are DMA memory: after tacc_remove, tacc_vm_release_dma() has them */
	bool live = drm_dev_enter(&tdev->drm, &idx);

	mutex_lock(&ctx->vm.lock);
	map = bo->map;
	if (!map || map->ctx != ctx) {
		mutex_unlock(&ctx->vm.lock);
		if (live)
			drm_dev_exit(idx);
		return;
	}
	tacc_unmap_range(tdev, &ctx->vm, map->node.start, map->size);
	if (live)
		tacc_vm_prune(tdev, &ctx->vm, map->node.start, map->size, &dead);
	drm_mm_remove_node(&map->node);
	bo->map = NULL;
	atomic_dec(&tdev->live.mappings);
	mutex_unlock(&ctx->vm.lock);

	tacc_vm_flush(tdev, ctx, &dead, bo);
	if (live)
		drm_dev_exit(idx);
	trace_tacc_vm_unbind(tacc_devid(tdev), ctx->id, bo, map->node.start, map->size,
			     map->page_size);
	kfree(map);
}

int tacc_vm_bind_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_vm_bind *args = data;
	struct drm_gem_object *obj;
	u64 va, pgsz;
	int ret;

	if (args->flags & ~DRM_TACC_BIND_F_ALL)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	ret = tacc_vm_bind(ctx, to_tacc_bo(obj), args->va, args->bo_offset, args->size,
			   args->flags, &va, &pgsz);
	if (!ret) {
		args->va = va;
		args->page_size = pgsz;
	}
	drm_gem_object_put(obj);
	return ret;
}

int tacc_vm_unbind_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_ctx *ctx = file->driver_priv;
	struct drm_tacc_vm_unbind *args = data;
	struct drm_gem_object *obj;
	struct tacc_bo *bo;
	bool bound;
	int ret = -EINVAL;

	if (args->flags & ~DRM_TACC_VM_UNBIND_F_ALL)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_bo(obj);
	mutex_lock(&ctx->vm.lock);
	bound = bo->map && bo->map->ctx == ctx;
	mutex_unlock(&ctx->vm.lock);
	if (bound) {
		/* the context's jobs submitted before keep their VAs (uAPI doc) */
		ret = tacc_ctx_wait_jobs(ctx, args->flags & DRM_TACC_VM_UNBIND_NOWAIT, true);
		if (!ret)
			tacc_vm_unbind(ctx, bo);
	}
	drm_gem_object_put(obj);
	return ret;
}

void tacc_vm_dump(struct seq_file *m, struct tacc_vm *vm)
{
	struct drm_mm_node *node;
	u32 i, j, huge = 0, small = 0;

	mutex_lock(&vm->lock);
	seq_printf(m, "  root iova 0x%llx, %u tables\n", (u64)vm->root.dma, vm->nr_tables);
	drm_mm_for_each_node(node, &vm->va_mm) {
		struct tacc_mapping *map = container_of(node, struct tacc_mapping, node);

		seq_printf(m, "  va 0x%010llx-0x%010llx bo %p type %u off 0x%llx pgsz %llu %s\n",
			   node->start, node->start + node->size, map->bo, map->bo->type,
			   map->bo_offset, map->page_size, map->readonly ? "ro" : "rw");
	}
	for (i = 0; i < TACC_PT_ENTRIES; i++) {
		struct tacc_pt *l1 = vm->root.child[i];

		if (!l1)
			continue;
		for (j = 0; j < TACC_PT_ENTRIES; j++) {
			struct tacc_pt *l2 = l1->child[j];
			u32 k;

			if (l1->cpu[j] & TACC_PTE_HUGE)
				huge++;
			if (!l2)
				continue;
			for (k = 0; k < TACC_PT_ENTRIES; k++)
				small += !!(l2->cpu[k] & TACC_PTE_VALID);
		}
	}
	seq_printf(m, "  valid leaves: %u x 2M, %u x 4K\n", huge, small);
	mutex_unlock(&vm->lock);
}
