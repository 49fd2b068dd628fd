// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_virtio_gem - buffer objects and device address space of the
 * virtio-tacc frontend (docs/virtio.md §6.2, "Linux frontend").
 *
 * A HOST BO is shmem: its pages are pinned and DMA mapped for the device
 * (IOVAs through the vIOMMU with ACCESS_PLATFORM) and handed to the backend
 * as a page list in BO_CREATE; the device reads and writes them in place and
 * the CPU maps them through the DRM fd.  A DEVICE BO lives in the function's
 * device-memory window (F_DEVMEM).  The backend owns the page tables: this
 * side only picks VAs (a drm_mm per file) and sends VM_BIND / VM_UNBIND.
 */

#include <linux/dma-mapping.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include <drm/drm_drv.h>
#include <drm/drm_gem.h>
#include <drm/drm_prime.h>
#include <drm/drm_vma_manager.h>

#include "tacc_virtio.h"

#define TACC_V_ENT_MAX_LEN	SZ_1G	/* one page-list entry, at most */

static struct dma_buf *tacc_vbo_no_export(struct drm_gem_object *obj, int flags)
{
	return ERR_PTR(-EOPNOTSUPP);	/* a BO stays with its context */
}

/* ------------------------------------------------------------ messages ---- */

static int tacc_vbo_msg_late(struct tacc_vctx *ctx, u16 type, const void *body, size_t len,
			     u64 *value, struct tacc_vlate *late)
{
	struct tacc_virtio_hdr *req;
	int ret;

	req = kzalloc(sizeof(*req) + len, GFP_KERNEL);
	if (!req)
		return -ENOMEM;
	tacc_vhdr(req, type, ctx->id);
	memcpy(req + 1, body, len);
	ret = tacc_vctrl_late(ctx->vd, req, sizeof(*req) + len, NULL, 0, value, late);
	kfree(req);
	return ret;
}

static int tacc_vbo_msg(struct tacc_vctx *ctx, u16 type, const void *body, size_t len,
			u64 *value)
{
	return tacc_vbo_msg_late(ctx, type, body, len, value, NULL);
}

/* VM_UNBIND and BO_DESTROY are refused while the context has jobs in flight. */
static int tacc_vbo_msg_idle(struct tacc_vctx *ctx, u16 type, const void *body, size_t len)
{
	int ret, tries = 100;

	do {
		ret = tacc_vctx_wait_quiet(ctx, false);
		ret = ret ?: tacc_vbo_msg(ctx, type, body, len, NULL);
	} while (ret == -EBUSY && --tries);
	return ret;
}

static int tacc_vbo_send_unbind(struct tacc_vbo *bo)
{
	struct tacc_virtio_vm_unbind b = {
		.va = cpu_to_le64(bo->va.start),
		.size = cpu_to_le64(bo->va.size),
	};

	return tacc_vbo_msg_idle(bo->ctx, TACC_VIRTIO_VM_UNBIND, &b, sizeof(b));
}

/* ------------------------------------------------------------ bindings ---- */

static int tacc_vbo_bind(struct tacc_vbo *bo, u64 va, u64 offset, u64 size, bool fixed,
			 bool readonly)
{
	struct tacc_vctx *ctx = bo->ctx;
	struct tacc_virtio_vm_bind b;
	struct tacc_vlate *late;
	int ret;

	lockdep_assert_held(&ctx->vm_lock);
	if (drm_mm_node_allocated(&bo->va))
		return -EBUSY;	/* one binding per BO, as on the PF */
	/* an answer that comes late or short: the range is settled later */
	late = tacc_vlate_alloc(TACC_VIRTIO_VM_BIND);
	if (!late)
		return -ENOMEM;
	late->ctx = ctx;	/* before the request: its answer may be read at once */
	late->handle = bo->handle;
	bo->va.size = size;
	if (fixed) {
		bo->va.start = va;
		ret = drm_mm_reserve_node(&ctx->va_mm, &bo->va);
		if (ret == -ENOSPC)
			ret = -EBUSY;
	} else {
		ret = drm_mm_insert_node_generic(&ctx->va_mm, &bo->va, size,
						 size >= TACC_V_SZ_2M ? TACC_V_SZ_2M : PAGE_SIZE,
						 0, DRM_MM_INSERT_BEST);
	}
	if (ret)
		goto out_free;

	b = (struct tacc_virtio_vm_bind) {
		.handle = cpu_to_le32(bo->handle),
		.flags = cpu_to_le32(readonly ? TACC_VIRTIO_BIND_READONLY : 0),
		.va = cpu_to_le64(bo->va.start),
		.offset = cpu_to_le64(offset),
		.size = cpu_to_le64(size),
	};
	ret = tacc_vbo_msg_late(ctx, TACC_VIRTIO_VM_BIND, &b, sizeof(b), NULL, late);
	if (tacc_vctrl_unsure(ret)) {
		/*
		 * The device may have bound it: the BO is not bound (as the file
		 * is told), its range the record's until the answer says whether
		 * to unbind (tacc_virtio_late.c; vm_lock held till it is linked).
		 */
		late->va.start = bo->va.start;
		late->va.size = bo->va.size;
		drm_mm_remove_node(&bo->va);
		WARN_ON(drm_mm_reserve_node(&ctx->va_mm, &late->va));	/* just freed */
		list_add_tail(&late->ctx_node, &ctx->late);
		if (ret == -EPROTO)
			tacc_vlate_queue(ctx->vd, late, ret, 0);
		return ret;
	}
	if (ret) {
		drm_mm_remove_node(&bo->va);
		goto out_free;
	}
	bo->bind_offset = offset;
	bo->readonly = readonly;
out_free:
	kfree(late);
	return ret;
}

/* ---------------------------------------------------------------- pages ---- */

/* bo->sgt was just DMA mapped (or needs no mapping): track it for removal. */
void tacc_vbo_dma_map_done(struct tacc_vbo *bo)
{
	struct tacc_vdev *vd = to_tacc_vdev(bo->shmem.base.dev);

	mutex_lock(&vd->dma_lock);
	list_add_tail(&bo->dma_node, &vd->dma_bos);
	mutex_unlock(&vd->dma_lock);
}

/*
 * A READONLY BO is mapped for device reads only, as on the PF (tacc_gem.c):
 * a pinned read-only user page must not become device-writable through the
 * IOMMU, whatever the device's own MMU says.
 */
enum dma_data_direction tacc_vbo_dma_dir(const struct tacc_vbo *bo)
{
	return (bo->flags & DRM_TACC_BO_F_READONLY) ? DMA_TO_DEVICE : DMA_BIDIRECTIONAL;
}

void tacc_vbo_dma_unmap(struct tacc_vbo *bo)
{
	struct tacc_vdev *vd = to_tacc_vdev(bo->shmem.base.dev);

	mutex_lock(&vd->dma_lock);
	if (!list_empty(&bo->dma_node)) {	/* else tacc_vbos_release_dma() did */
		list_del_init(&bo->dma_node);
		if (vd->dma_dev)
			dma_unmap_sgtable(vd->dma_dev, bo->sgt, tacc_vbo_dma_dir(bo), 0);
	}
	mutex_unlock(&vd->dma_lock);
}

/* Removal, after the device reset: unmap what files still open hold. */
void tacc_vbos_release_dma(struct tacc_vdev *vd)
{
	struct tacc_vbo *bo, *next;

	mutex_lock(&vd->dma_lock);
	list_for_each_entry_safe(bo, next, &vd->dma_bos, dma_node) {
		list_del_init(&bo->dma_node);
		if (vd->dma_dev)
			dma_unmap_sgtable(vd->dma_dev, bo->sgt, tacc_vbo_dma_dir(bo), 0);
	}
	mutex_unlock(&vd->dma_lock);
}

static void tacc_vbo_unpin(struct tacc_vbo *bo)
{
	if (bo->type == DRM_TACC_BO_USERPTR) {
		tacc_vuserptr_unpin(bo);
		return;
	}
	if (!bo->sgt)
		return;
	tacc_vbo_dma_unmap(bo);
	sg_free_table(bo->sgt);
	kfree(bo->sgt);
	bo->sgt = NULL;
	drm_gem_shmem_unpin(&bo->shmem);
}

/*
 * The device may still hold the BO's pages (a request naming them was not
 * answered, or answered short, or BO_DESTROY failed): they are never freed
 * or reused.  Each page keeps a reference (a HOST BO's) or its pin (a
 * USERPTR's) and its DMA mapping; the BO itself goes.  Counted in debugfs
 * virtio_stats (leaked_bos, leaked_pages).
 */
static void tacc_vbo_leak(struct tacc_vbo *bo)
{
	struct tacc_vdev *vd = to_tacc_vdev(bo->shmem.base.dev);
	unsigned long i, n = 0;

	if (bo->sgt) {
		mutex_lock(&vd->dma_lock);
		list_del_init(&bo->dma_node);	/* mapped for good */
		mutex_unlock(&vd->dma_lock);
		sg_free_table(bo->sgt);
		kfree(bo->sgt);
		bo->sgt = NULL;
		if (bo->type == DRM_TACC_BO_HOST) {
			n = bo->shmem.base.size >> PAGE_SHIFT;
			for (i = 0; i < n; i++)
				get_page(bo->shmem.pages[i]);
			drm_gem_shmem_unpin(&bo->shmem);
		} else {
			n = bo->npages;
			tacc_vuserptr_leak(bo);
		}
	}
	atomic64_inc(&vd->leaked_bos);
	atomic64_add(n, &vd->leaked_pages);
	drm_warn(&vd->drm, "BO %u: the device may still hold its %lu pages: leaked\n",
		 bo->handle, n);
}

static int tacc_vbo_pin(struct tacc_vbo *bo)
{
	struct tacc_vdev *vd = to_tacc_vdev(bo->shmem.base.dev);
	struct drm_gem_object *obj = &bo->shmem.base;
	struct sg_table *sgt;
	int ret;

	ret = drm_gem_shmem_pin(&bo->shmem);
	if (ret)
		return ret;
	sgt = drm_prime_pages_to_sg(obj->dev, bo->shmem.pages, obj->size >> PAGE_SHIFT);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto err_unpin;
	}
	if (vd->dma_dev) {
		ret = dma_map_sgtable(vd->dma_dev, sgt, tacc_vbo_dma_dir(bo), 0);
		if (ret)
			goto err_free;
	}
	bo->sgt = sgt;
	tacc_vbo_dma_map_done(bo);
	return 0;

err_free:
	sg_free_table(sgt);
	kfree(sgt);
err_unpin:
	drm_gem_shmem_unpin(&bo->shmem);
	return ret;
}

/* Fills @ents (when not NULL) with the BO's ranges; returns how many. */
static u32 tacc_vbo_ents(struct tacc_vbo *bo, struct tacc_virtio_mem_entry *ents)
{
	bool dma = to_tacc_vdev(bo->shmem.base.dev)->dma_dev;
	struct scatterlist *sg;
	u64 addr, len, chunk;
	u32 n = 0;
	int i;

	for_each_sgtable_sg(bo->sgt, sg, i) {
		if (dma && !sg_dma_len(sg))
			break;
		addr = dma ? sg_dma_address(sg) : sg_phys(sg);
		len = dma ? sg_dma_len(sg) : sg->length;
		for (; len; len -= chunk, addr += chunk, n++) {
			chunk = min_t(u64, len, TACC_V_ENT_MAX_LEN);
			if (!ents)
				continue;
			ents[n].addr = cpu_to_le64(addr);
			ents[n].length = cpu_to_le32(chunk);
			ents[n].padding = 0;
		}
	}
	return n;
}

struct tacc_vbo_create_req {
	struct tacc_virtio_hdr hdr;
	struct tacc_virtio_bo_create c;
};

/* BO_CREATE; a host BO's page list follows the body. */
static int tacc_vbo_send_create(struct tacc_vbo *bo, u64 *handle)
{
	struct tacc_virtio_mem_entry *ents = NULL;
	struct tacc_vbo_create_req *req;
	u32 n = 0;
	int ret;

	if (bo->type != DRM_TACC_BO_DEVICE) {
		n = tacc_vbo_ents(bo, NULL);
		if (!n || n > TACC_VIRTIO_MAX_BO_ENTS)
			return -E2BIG;
		/* the backend's page lists are the function's: the user's share (-EDQUOT) */
		ret = tacc_user_charge(bo->user, TACC_Q_ENTS, n, bo->ctx->unlimited ? 0 :
				       tacc_user_share(tacc_vpage_entries(bo->ctx->vd)));
		if (ret)
			return ret;
		bo->nents = n;	/* uncharged when the BO is freed */
		ents = kvcalloc(n, sizeof(*ents), GFP_KERNEL);
		if (!ents)
			return -ENOMEM;
		tacc_vbo_ents(bo, ents);
	}
	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req) {
		ret = -ENOMEM;
		goto out;
	}
	tacc_vhdr(&req->hdr, TACC_VIRTIO_BO_CREATE, bo->ctx->id);
	req->c.size = cpu_to_le64(bo->shmem.base.size);
	req->c.flags = cpu_to_le32(bo->type == DRM_TACC_BO_DEVICE ? TACC_VIRTIO_BO_DEVMEM : 0);
	req->c.nr_ents = cpu_to_le32(n);
	ret = tacc_vctrl(bo->ctx->vd, req, sizeof(*req), ents, n * sizeof(*ents), handle);
	kfree(req);
out:
	kvfree(ents);
	return ret;
}

/* ----------------------------------------------------------- lifetime ---- */

static void tacc_vgem_free(struct drm_gem_object *obj)
{
	struct tacc_vbo *bo = to_tacc_vbo(obj);
	struct tacc_vdev *vd = to_tacc_vdev(obj->dev);
	struct tacc_virtio_bo_destroy d = { .handle = cpu_to_le32(bo->handle) };
	bool bound = drm_mm_node_allocated(&bo->va);
	int idx, ret = 0;

	if (bo->unsure) {
		ret = -EPROTO;	/* BO_CREATE's outcome unknown: no handle to destroy */
	} else if (bo->handle && drm_dev_enter(obj->dev, &idx)) {
		tacc_vlate_bo_free(bo->ctx, bo->handle);	/* a binding in doubt */
		if (bound)
			ret = tacc_vbo_send_unbind(bo);
		ret = ret ?: tacc_vbo_msg_idle(bo->ctx, TACC_VIRTIO_BO_DESTROY, &d, sizeof(d));
		drm_dev_exit(idx);
		if (ret == -ENODEV) {	/* a removal began: its reset frees the pages */
			wait_event(vd->idle_wq, READ_ONCE(vd->reset_done));
			ret = 0;
		}
		if (ret)
			drm_warn(obj->dev, "BO %u not destroyed: %d\n", bo->handle, ret);
	}
	if (bound) {
		mutex_lock(&bo->ctx->vm_lock);
		drm_mm_remove_node(&bo->va);
		mutex_unlock(&bo->ctx->vm_lock);
	}
	/* pages the backend may still hold stay pinned (leaked) rather than reused */
	if (!ret)
		tacc_vbo_unpin(bo);
	else
		tacc_vbo_leak(bo);
	if (bo->user) {
		tacc_user_uncharge(bo->user, TACC_Q_ENTS, bo->nents);
		tacc_user_uncharge_bo(bo->user, bo->type == DRM_TACC_BO_DEVICE ? obj->size : 0);
		tacc_user_put(bo->user);
		atomic_dec(&bo->ctx->nr_bos);
	}
	if (bo->type == DRM_TACC_BO_HOST) {
		drm_gem_shmem_free(&bo->shmem);
		return;
	}
	drm_gem_object_release(obj);
	kfree(bo);
}

static int tacc_vgem_mmap(struct drm_gem_object *obj, struct vm_area_struct *vma)
{
	if (to_tacc_vbo(obj)->type != DRM_TACC_BO_HOST)
		return -EINVAL;
	return drm_gem_shmem_object_mmap(obj, vma);
}

/* A BO is its creator's (bo->ctx, freed with that file): GEM_OPEN elsewhere is refused. */
static int tacc_vgem_open(struct drm_gem_object *obj, struct drm_file *file)
{
	return to_tacc_vbo(obj)->ctx == file->driver_priv ? 0 : -EPERM;
}

static const struct drm_gem_object_funcs tacc_vshmem_funcs = {
	.status = tacc_gem_status,
	.free = tacc_vgem_free,
	.open = tacc_vgem_open,
	.export = tacc_vbo_no_export,
	.print_info = drm_gem_shmem_object_print_info,
	.pin = drm_gem_shmem_object_pin,
	.unpin = drm_gem_shmem_object_unpin,
	.get_sg_table = drm_gem_shmem_object_get_sg_table,
	.vmap = drm_gem_shmem_object_vmap,
	.vunmap = drm_gem_shmem_object_vunmap,
	.mmap = tacc_vgem_mmap,
	.vm_ops = &drm_gem_shmem_vm_ops,
};

static const struct drm_gem_object_funcs tacc_vprivate_funcs = {
	.status = tacc_gem_status,
	.free = tacc_vgem_free,
	.open = tacc_vgem_open,
	.export = tacc_vbo_no_export,
};

struct drm_gem_object *tacc_vgem_create_object(struct drm_device *dev, size_t size)
{
	struct tacc_vbo *bo;

	bo = kzalloc(sizeof(*bo), GFP_KERNEL);
	if (!bo)
		return ERR_PTR(-ENOMEM);
	bo->type = DRM_TACC_BO_HOST;
	INIT_LIST_HEAD(&bo->dma_node);
	bo->shmem.base.funcs = &tacc_vshmem_funcs;
	return &bo->shmem.base;
}

/* -------------------------------------------------------------- ioctls ---- */

static struct tacc_vbo *tacc_vbo_alloc(struct tacc_vctx *ctx, u32 type, u64 size)
{
	struct drm_gem_shmem_object *shmem;
	struct tacc_vbo *bo;

	if (type == DRM_TACC_BO_HOST) {
		shmem = drm_gem_shmem_create(&ctx->vd->drm, size);
		if (IS_ERR(shmem))
			return ERR_CAST(shmem);
		bo = container_of(shmem, struct tacc_vbo, shmem);
	} else {
		bo = kzalloc(sizeof(*bo), GFP_KERNEL);
		if (!bo)
			return ERR_PTR(-ENOMEM);
		bo->type = type;
		INIT_LIST_HEAD(&bo->dma_node);
		bo->shmem.base.funcs = &tacc_vprivate_funcs;
		drm_gem_private_object_init(&ctx->vd->drm, &bo->shmem.base, size);
	}
	bo->ctx = ctx;
	return bo;
}

static int tacc_vbo_create_check(struct tacc_vdev *vd, const struct drm_tacc_bo_create *args)
{
	if (args->flags & ~DRM_TACC_BO_F_ALL || args->pad || args->type >= DRM_TACC_BO_TYPE_COUNT)
		return -EINVAL;
	if (!args->size || args->size > TACC_VIRTIO_MAX_BO_SIZE ||
	    args->size > (u64)READ_ONCE(tacc_max_bo_mib) << 20)
		return -EINVAL;	/* max_bo_mib, as on the PF */
	if (args->type == DRM_TACC_BO_USERPTR)
		return args->userptr && PAGE_ALIGNED(args->userptr) &&
		       PAGE_ALIGNED(args->size) ? 0 : -EINVAL;
	if (args->userptr)
		return -EINVAL;
	if (args->type == DRM_TACC_BO_DEVICE && !vd->has_devmem)
		return -EOPNOTSUPP;	/* F_DEVMEM not negotiated */
	return 0;
}

int tacc_vbo_create_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_bo_create *args = data;
	struct tacc_vbo *bo;
	u64 size, handle;
	int ret, idx;
	u32 gem;

	ret = tacc_vbo_create_check(to_tacc_vdev(dev), args);
	if (ret)
		return ret;
	size = PAGE_ALIGN(args->size);
	/* beyond the window: no user's share could hold it (the backend's answer) */
	if (args->type == DRM_TACC_BO_DEVICE && size > to_tacc_vdev(dev)->devmem_size)
		return -ENOSPC;
	if (atomic_inc_return(&ctx->nr_bos) > TACC_V_MAX_BOS) {
		atomic_dec(&ctx->nr_bos);
		return -EMFILE;
	}
	/* the user's BOs and device memory (tacc_quota.c): -EDQUOT */
	ret = tacc_user_charge_bo(ctx->user, ctx->unlimited,
				  args->type == DRM_TACC_BO_DEVICE ? size : 0,
				  to_tacc_vdev(dev)->devmem_size);
	if (ret)
		goto out_count;
	if (!drm_dev_enter(dev, &idx)) {
		ret = -ENODEV;
		goto out_charge;
	}
	bo = tacc_vbo_alloc(ctx, args->type, size);
	if (IS_ERR(bo)) {
		ret = PTR_ERR(bo);
		drm_dev_exit(idx);
		goto out_charge;
	}
	bo->user = tacc_user_get(ctx->user);	/* the charges are the BO's now */
	bo->flags = args->flags;
	if (bo->type == DRM_TACC_BO_HOST)
		ret = tacc_vbo_pin(bo);
	else if (bo->type == DRM_TACC_BO_USERPTR)
		ret = tacc_vuserptr_pin(bo, args->userptr);
	if (ret)
		goto out_put;
	ret = tacc_vbo_send_create(bo, &handle);
	if (tacc_vctrl_unsure(ret))
		bo->unsure = true;	/* the device may hold its pages */
	if (ret)
		goto out_put;
	bo->handle = handle;
	if (!(args->flags & DRM_TACC_BO_F_NO_BIND)) {
		mutex_lock(&ctx->vm_lock);
		ret = tacc_vbo_bind(bo, 0, 0, size, false, args->flags & DRM_TACC_BO_F_READONLY);
		mutex_unlock(&ctx->vm_lock);
		if (ret)
			goto out_put;
	}
	ret = drm_gem_handle_create(file, &bo->shmem.base, &gem);
	if (ret)
		goto out_put;
	args->handle = gem;
	args->va = drm_mm_node_allocated(&bo->va) ? bo->va.start : 0;
out_put:
	drm_gem_object_put(&bo->shmem.base);	/* on error: frees it, backend side too */
	drm_dev_exit(idx);
	return ret;

out_charge:
	tacc_user_uncharge_bo(ctx->user, args->type == DRM_TACC_BO_DEVICE ? size : 0);
out_count:
	atomic_dec(&ctx->nr_bos);
	return ret;
}

int tacc_vbo_info_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_bo_info *args = data;
	struct drm_gem_object *obj;
	struct tacc_vbo *bo;
	int ret = 0;

	if (args->pad)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_vbo(obj);
	args->mmap_offset = 0;
	if (bo->type == DRM_TACC_BO_HOST) {
		ret = drm_gem_create_mmap_offset(obj);
		if (ret)
			goto out;
		args->mmap_offset = drm_vma_node_offset_addr(&obj->vma_node);
	}
	mutex_lock(&ctx->vm_lock);
	args->va = drm_mm_node_allocated(&bo->va) ? bo->va.start : 0;
	args->bound_size = drm_mm_node_allocated(&bo->va) ? bo->va.size : 0;
	mutex_unlock(&ctx->vm_lock);
	args->size = obj->size;
	args->type = bo->type;
	args->flags = bo->flags;
out:
	drm_gem_object_put(obj);
	return ret;
}

static int tacc_vbind_check(const struct drm_tacc_vm_bind *args, u64 bo_size, u64 *size)
{
	if (args->flags & ~DRM_TACC_BIND_F_ALL || !PAGE_ALIGNED(args->bo_offset) ||
	    args->bo_offset >= bo_size)
		return -EINVAL;
	*size = args->size ?: bo_size - args->bo_offset;
	if (!PAGE_ALIGNED(*size) || *size > bo_size - args->bo_offset)
		return -EINVAL;
	if (!(args->flags & DRM_TACC_BIND_F_FIXED))
		return 0;
	if (!PAGE_ALIGNED(args->va) || args->va < TACC_V_VA_START || args->va >= TACC_V_VA_END ||
	    *size > TACC_V_VA_END - args->va)
		return -EINVAL;
	return 0;
}

int tacc_vvm_bind_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_vm_bind *args = data;
	struct drm_gem_object *obj;
	struct tacc_vbo *bo;
	bool ro;
	u64 size;
	int ret, idx;

	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_vbo(obj);
	ret = tacc_vbind_check(args, obj->size, &size);
	if (ret)
		goto out_put;
	if (!drm_dev_enter(dev, &idx)) {
		ret = -ENODEV;
		goto out_put;
	}
	ro = (args->flags & DRM_TACC_BIND_F_READONLY) || (bo->flags & DRM_TACC_BO_F_READONLY);
	mutex_lock(&ctx->vm_lock);
	ret = tacc_vbo_bind(bo, args->va, args->bo_offset, size,
			    args->flags & DRM_TACC_BIND_F_FIXED, ro);
	if (!ret) {
		args->va = bo->va.start;
		args->page_size = PAGE_SIZE;	/* the backend picks its PTEs */
	}
	mutex_unlock(&ctx->vm_lock);
	drm_dev_exit(idx);
out_put:
	drm_gem_object_put(obj);
	return ret;
}

int tacc_vvm_unbind_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_tacc_vm_unbind *args = data;
	struct drm_gem_object *obj;
	struct tacc_vbo *bo;
	int ret, idx;

	if (args->flags & ~DRM_TACC_VM_UNBIND_F_ALL)
		return -EINVAL;
	obj = drm_gem_object_lookup(file, args->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_vbo(obj);
	if (args->flags & DRM_TACC_VM_UNBIND_NOWAIT)
		ret = atomic_read(&ctx->inflight) ? -EBUSY : 0;
	else
		ret = tacc_vctx_wait_quiet(ctx, true);
	if (ret)
		goto out_put;
	if (!drm_dev_enter(dev, &idx)) {
		ret = -ENODEV;
		goto out_put;
	}
	mutex_lock(&ctx->vm_lock);
	ret = drm_mm_node_allocated(&bo->va) ? tacc_vbo_send_unbind(bo) : -EINVAL;
	if (!ret)
		drm_mm_remove_node(&bo->va);
	mutex_unlock(&ctx->vm_lock);
	drm_dev_exit(idx);
out_put:
	drm_gem_object_put(obj);
	return ret;
}

/* The device VA of @len bytes at @op, in a BO of @type bound in the file's VM. */
int tacc_vbo_va(struct drm_file *file, const struct drm_tacc_operand *op, u64 len,
		u32 align, int type, u64 *va)
{
	struct tacc_vctx *ctx = file->driver_priv;
	struct drm_gem_object *obj;
	struct tacc_vbo *bo;
	int ret = 0;

	if (op->pad || !op->handle || !len || !IS_ALIGNED(op->offset, align))
		return -EINVAL;
	obj = drm_gem_object_lookup(file, op->handle);
	if (!obj)
		return -ENOENT;
	bo = to_tacc_vbo(obj);
	if ((type == TACC_VT_DEV && bo->type != DRM_TACC_BO_DEVICE) ||
	    (type == TACC_VT_HOST && bo->type == DRM_TACC_BO_DEVICE)) {
		ret = -EINVAL;
		goto out;
	}
	mutex_lock(&ctx->vm_lock);
	if (!drm_mm_node_allocated(&bo->va) || op->offset < bo->bind_offset ||
	    len > bo->va.size || op->offset - bo->bind_offset > bo->va.size - len)
		ret = -EINVAL;
	else
		*va = bo->va.start + (op->offset - bo->bind_offset);
	mutex_unlock(&ctx->vm_lock);
out:
	drm_gem_object_put(obj);
	return ret;
}
