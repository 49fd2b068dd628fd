// SPDX-License-Identifier: GPL-2.0-only OR MIT
/*
 * fdinfo of the accel nodes (PF, VF and the virtio-tacc function) in the keys of
 * Documentation/gpu/drm-usage-stats.rst: drm_show_fdinfo() prints drm-driver,
 * drm-client-id and drm-pdev; here drm-engine-queue<N> (ns the client's jobs kept
 * queue N busy), the memory stats of drm_show_memory_stats() (drm-total-memory,
 * drm-shared-memory, drm-resident-memory, drm-active-memory) and tacc-* keys.
 */

#include <drm/drm_file.h>
#include <drm/drm_gem.h>
#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_virtio.h"

/* drm_gem_object_funcs.status: a BO with backing (device memory, pages) is resident */
enum drm_gem_object_status tacc_gem_status(struct drm_gem_object *obj)
{
	struct drm_gem_shmem_object *shmem = to_drm_gem_shmem_obj(obj);

	/* device and userptr BOs are backed from creation; a host BO once it has pages */
	if (!obj->filp || shmem->pages)
		return DRM_GEM_OBJECT_RESIDENT;
	return 0;
}

static void tacc_fdinfo_bo_sizes(struct drm_printer *p, struct drm_file *file,
				 u32 (*type)(struct drm_gem_object *obj))
{
	struct drm_gem_object *obj;
	u64 host = 0, devmem = 0, user = 0;
	int id;

	spin_lock(&file->table_lock);
	idr_for_each_entry(&file->object_idr, obj, id) {
		u32 t = type(obj);

		if (t == DRM_TACC_BO_DEVICE)
			devmem += obj->size;
		else if (t == DRM_TACC_BO_USERPTR)
			user += obj->size;
		else
			host += obj->size;
	}
	spin_unlock(&file->table_lock);
	drm_show_memory_stats(p, file);
	/* the split of drm-total-memory by kind (driver keys: not a drm- region, which
	 * tools would add to the total)
	 */
	drm_printf(p, "tacc-memory-host:\t%llu KiB\n", host >> 10);
	drm_printf(p, "tacc-memory-device:\t%llu KiB\n", devmem >> 10);
	drm_printf(p, "tacc-memory-userptr:\t%llu KiB\n", user >> 10);
}

static u32 tacc_bo_kind(struct drm_gem_object *obj)
{
	return to_tacc_bo(obj)->type;
}

void tacc_show_fdinfo(struct drm_printer *p, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(file->minor->dev);
	struct tacc_ctx *ctx = file->driver_priv;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++)
		drm_printf(p, "drm-engine-queue%u:\t%llu ns\n", i,
			   (u64)atomic64_read(&ctx->busy_ns[i]));
	for (i = 0; i < tdev->num_queues; i++)
		drm_printf(p, "tacc-jobs-queue%u:\t%llu\n", i, (u64)atomic64_read(&ctx->jobs[i]));
	tacc_fdinfo_bo_sizes(p, file, tacc_bo_kind);
	drm_printf(p, "tacc-context:\t%u\n", ctx->id);
	/* the context's device page-table pages, its root included */
	drm_printf(p, "tacc-pt-pages:\t%u\n", READ_ONCE(ctx->vm.nr_tables));
	drm_printf(p, "tacc-mmu-faults:\t%llu\n", (u64)atomic64_read(&ctx->faults));
	drm_printf(p, "tacc-resets:\t%llu\n", (u64)atomic64_read(&ctx->resets));
}

static u32 tacc_vbo_kind(struct drm_gem_object *obj)
{
	return to_tacc_vbo(obj)->type;
}

void tacc_vshow_fdinfo(struct drm_printer *p, struct drm_file *file)
{
	struct tacc_vctx *ctx = file->driver_priv;
	u32 i;

	/* ns with one of the client's jobs in the ring, queued to completed (the host's view) */
	for (i = 0; i < TACC_VIRTIO_NUM_RINGS; i++)
		drm_printf(p, "drm-engine-queue%u:\t%llu ns\n", i, READ_ONCE(ctx->busy_ns[i]));
	for (i = 0; i < TACC_VIRTIO_NUM_RINGS; i++)
		drm_printf(p, "tacc-jobs-queue%u:\t%llu\n", i, READ_ONCE(ctx->jobs[i]));
	tacc_fdinfo_bo_sizes(p, file, tacc_vbo_kind);
	drm_printf(p, "tacc-context:\t%u\n", ctx->id);
}
