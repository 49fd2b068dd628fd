// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc - the device's two rings towards one user-space consumer: the trace
 * ring (one record per command, docs/hardware.md section 6) and the counter
 * sample ring (section 7).
 *
 * Both are DMA-coherent buffers the device writes and the consumer maps
 * read-only: a header page (the device writes prod/dropped there by DMA) then
 * the entries.  One registered consumer per function; it returns consumed
 * entries with an ADVANCE ioctl and keeps the device in D0 (a D3hot would
 * reset the ring).  A function reset or a resume re-programs the ring with
 * indices at 0 and a new epoch (tacc_hw_init()).  Each OPEN sizes and
 * allocates its ring; CLOSE (or the file's release) stops the device
 * writing to it, zaps the consumer's mapping and frees it.
 *
 * Who may open (docs/uapi.md "Threat model"): a trace ring records every
 * command of every user of the function's node, so it needs CAP_PERFMON on
 * every function.  The PF's sample ring sums every tenant of the PF (and has
 * the global counters): CAP_PERFMON; a VF's shows the VF's own counter page
 * and is open to whoever may open the VF's node.  A CAP_PERFMON opener takes
 * a slot held by an unprivileged owner over: that owner's ring is retired as
 * by CLOSE, its next ADVANCE or CLOSE gets -ENODEV.
 *
 * The same code serves the virtio-tacc frontend's trace ring (tacc_virtio.c):
 * the generic part below knows the ring's DRM node, the device that
 * allocates it (none: physically contiguous pages, the device sees
 * CPU-physical addresses) and the one kept powered (none: no runtime PM);
 * how the device is told about the ring is the caller's (registers here,
 * control messages there).
 *
 * Mappings are populated on fault, under the ring lock, and only while the
 * OPEN that created them (ring->gen, kept in vm_private_data) is the live
 * one: retire zaps at the real mmap offset with the lock held, so no page of
 * a retired ring can be reached again and any later access is SIGBUS.
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/pm_runtime.h>
#include <linux/vmalloc.h>

#include <drm/drm_drv.h>
#include <drm/drm_file.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

/* ---------------------------------------------------------- both rings ---- */

void tacc_ring_init(struct tacc_ring *r, struct drm_device *drm, struct device *dma_dev,
		    struct device *pm_dev)
{
	mutex_init(&r->lock);
	r->drm = drm;
	r->dma_dev = dma_dev;
	r->pm_dev = pm_dev;
}

/*
 * ADVANCE: @cons must lie between the consumer's index and the device's
 * producer index (free-running u32 indices).
 */
static int tacc_ring_advance_locked(struct tacc_ring *r, const u32 *hdr_prod, u32 *hdr_cons,
				    u32 cons, u32 *prod)
{
	u32 p = READ_ONCE(*hdr_prod);

	if (cons - r->cons > p - r->cons)
		return -EINVAL;
	r->cons = cons;
	WRITE_ONCE(*hdr_cons, cons);
	*prod = p;
	return 0;
}

/* The PF's sample ring shows every tenant's work; a VF's, its node's users'. */
static bool tacc_sample_may_open(struct tacc_device *tdev)
{
	return tdev->is_vf || perfmon_capable();
}

/* dma_alloc_coherent() memory: linear map (dma-direct) or vmap (dma-iommu). */
static unsigned long tacc_ring_pfn(void *p)
{
	return is_vmalloc_addr(p) ? vmalloc_to_pfn(p) : PHYS_PFN(virt_to_phys(p));
}

vm_fault_t tacc_ring_fault(struct vm_fault *vmf, struct tacc_ring *r, u64 mmap_offset)
{
	struct vm_area_struct *vma = vmf->vma;
	unsigned long pgoff = vmf->pgoff - (mmap_offset >> PAGE_SHIFT);
	vm_fault_t ret = VM_FAULT_SIGBUS;

	mutex_lock(&r->lock);
	if (r->cpu && (unsigned long)vma->vm_private_data == r->gen &&
	    pgoff < r->size >> PAGE_SHIFT)
		ret = vmf_insert_pfn(vma, vmf->address,
				     tacc_ring_pfn(r->cpu + (pgoff << PAGE_SHIFT)));
	mutex_unlock(&r->lock);
	return ret;
}

static vm_fault_t tacc_trace_vm_fault(struct vm_fault *vmf)
{
	struct drm_file *file = vmf->vma->vm_file->private_data;

	return tacc_ring_fault(vmf, &to_tacc_dev(file->minor->dev)->trace, DRM_TACC_MMAP_TRACE);
}

static vm_fault_t tacc_sample_vm_fault(struct vm_fault *vmf)
{
	struct drm_file *file = vmf->vma->vm_file->private_data;

	return tacc_ring_fault(vmf, &to_tacc_dev(file->minor->dev)->sample, DRM_TACC_MMAP_SAMPLE);
}

static const struct vm_operations_struct tacc_trace_vm_ops = {
	.fault = tacc_trace_vm_fault,
};

static const struct vm_operations_struct tacc_sample_vm_ops = {
	.fault = tacc_sample_vm_fault,
};

/*
 * Only the registered consumer may map its ring, read-only.  The mapping
 * keeps its real offset (retire zaps there) and the OPEN's generation.
 */
int tacc_ring_mmap(struct tacc_ring *r, struct drm_file *file, struct vm_area_struct *vma,
		   const struct vm_operations_struct *ops)
{
	unsigned long size = vma->vm_end - vma->vm_start;
	int ret;

	if (vma->vm_flags & VM_WRITE)
		return -EACCES;
	mutex_lock(&r->lock);
	if (r->owner != file)
		ret = -EACCES;
	else if (!r->cpu)
		ret = -ENODEV;
	else if (size > r->size)
		ret = -EINVAL;
	else
		ret = 0;
	if (!ret) {
		vm_flags_mod(vma, VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP, VM_MAYWRITE);
		vma->vm_private_data = (void *)r->gen;
		vma->vm_ops = ops;
	}
	mutex_unlock(&r->lock);
	return ret;
}

/*
 * Without a DMA device (virtio-tacc without ACCESS_PLATFORM) the device
 * reads CPU-physical addresses: physically contiguous, zeroed pages.
 */
static int tacc_ring_alloc_locked(struct tacc_ring *r, size_t size)
{
	r->size = size;
	if (r->dma_dev) {
		r->cpu = dma_alloc_coherent(r->dma_dev, size, &r->dma, GFP_KERNEL);
	} else {
		r->cpu = alloc_pages_exact(size, GFP_KERNEL | __GFP_ZERO);
		r->dma = r->cpu ? virt_to_phys(r->cpu) : 0;
	}
	return r->cpu ? 0 : -ENOMEM;
}

static void tacc_ring_free_locked(struct tacc_ring *r)
{
	if (r->cpu && r->dma_dev)
		dma_free_coherent(r->dma_dev, r->size, r->cpu, r->dma);
	else if (r->cpu)
		free_pages_exact(r->cpu, r->size);
	r->cpu = NULL;
}

/* Surprise removal: drm_dev_unplug() zapped the user mappings already. */
void tacc_ring_release_dma(struct tacc_ring *r)
{
	mutex_lock(&r->lock);
	tacc_ring_free_locked(r);
	mutex_unlock(&r->lock);
}

/*
 * The consumer's end: @stop disables the ring and drops the PM reference.
 * A consumer whose slot was taken over learns it here once (-ENODEV).
 */
int tacc_ring_close(struct tacc_ring *r, struct drm_file *file, tacc_ring_stop_fn stop)
{
	int ret = 0;

	mutex_lock(&r->lock);
	if (r->owner == file) {
		stop(r);
	} else if (r->evicted == file) {
		r->evicted = NULL;
		ret = -ENODEV;
	} else {
		ret = -EPERM;
	}
	mutex_unlock(&r->lock);
	return ret;
}

/* ADVANCE by someone other than the consumer. */
static int tacc_ring_not_owner_locked(struct tacc_ring *r, struct drm_file *file)
{
	lockdep_assert_held(&r->lock);
	return r->evicted == file ? -ENODEV : -EPERM;
}

/*
 * ADVANCE of @r by @file: the consumer index moves to @cons (header fields
 * at @prod_off and @cons_off of the ring's first page); *@prod gets the
 * producer index.  With 0 returned the ring lock is still held and the
 * device entered (*@idx): the caller tells the device r->cons, reads what
 * else it reports, then calls tacc_ring_advance_end().
 */
int tacc_ring_advance_begin(struct tacc_ring *r, struct drm_file *file, size_t prod_off,
			    size_t cons_off, u32 cons, u32 *prod, int *idx)
{
	int ret;

	mutex_lock(&r->lock);
	if (r->owner != file) {
		ret = tacc_ring_not_owner_locked(r, file);
		goto out;
	}
	if (!r->cpu || !drm_dev_enter(r->drm, idx)) {
		ret = -ENODEV;
		goto out;
	}
	ret = tacc_ring_advance_locked(r, r->cpu + prod_off, r->cpu + cons_off, cons, prod);
	if (!ret)
		return 0;
	drm_dev_exit(*idx);
out:
	mutex_unlock(&r->lock);
	return ret;
}

void tacc_ring_advance_end(struct tacc_ring *r, int idx)
{
	drm_dev_exit(idx);
	mutex_unlock(&r->lock);
}

/* A PCI function's ADVANCE: the consumer index goes to register @cons_reg. */
static int tacc_ring_advance_reg(struct tacc_device *tdev, struct tacc_ring *r,
				 struct drm_file *file, size_t prod_off, size_t cons_off,
				 u32 cons_reg, u32 cons, u32 *prod, int *idx)
{
	int ret = tacc_ring_advance_begin(r, file, prod_off, cons_off, cons, prod, idx);

	if (!ret)
		tacc_wr(tdev, cons_reg, r->cons);
	return ret;
}

static void tacc_ring_put_pm(struct tacc_ring *r)
{
	r->owner = NULL;
	if (!r->pm_dev)
		return;
	pm_runtime_mark_last_busy(r->pm_dev);
	pm_runtime_put_autosuspend(r->pm_dev);
}

/*
 * OPEN: @file becomes the consumer of a new ring of @size bytes.  A
 * CAP_PERFMON opener retires an unprivileged owner's ring first (@stop).
 */
static int tacc_ring_claim_locked(struct tacc_ring *r, struct drm_file *file, size_t size,
				  tacc_ring_stop_fn stop)
{
	bool perfmon = perfmon_capable();
	int ret;

	lockdep_assert_held(&r->lock);
	if (r->owner == file)
		return -EALREADY;
	if (r->owner && (r->owner_perfmon || !perfmon))
		return -EBUSY;
	if (r->owner) {
		r->evicted = r->owner;
		stop(r);
	}
	ret = tacc_ring_alloc_locked(r, size);
	if (ret)
		return ret;
	r->owner = file;
	r->owner_perfmon = perfmon;
	r->gen++;
	return 0;
}

/*
 * CLOSE or release, the device no longer writing to the ring: a mapping left
 * behind faults (SIGBUS) from now on, the memory is freed, the device may
 * suspend again.  After a surprise removal the memory is gone already.
 */
void tacc_ring_retire_locked(struct tacc_ring *r, u64 mmap_offset)
{
	struct drm_device *dev = r->drm;
	int idx;

	if (drm_dev_enter(dev, &idx)) {
		unmap_mapping_range(dev->anon_inode->i_mapping, mmap_offset, r->size, 1);
		tacc_ring_free_locked(r);
		drm_dev_exit(idx);
	}
	tacc_ring_put_pm(r);
}

/*
 * The start of every OPEN: the node still there (*@idx entered) and, with
 * runtime PM, the device powered for the consumer (D3hot would reset the
 * ring).  Taken before the ring lock: a resume reprograms the ring under it.
 */
static int tacc_ring_open_begin(struct tacc_ring *r, int *idx)
{
	int ret;

	if (!drm_dev_enter(r->drm, idx))
		return -ENODEV;
	ret = r->pm_dev ? pm_runtime_resume_and_get(r->pm_dev) : 0;
	if (ret)
		drm_dev_exit(*idx);
	return ret;
}

/* A failed OPEN, after tacc_ring_open_begin() and with the ring lock held. */
static void tacc_ring_open_fail(struct tacc_ring *r, int idx)
{
	mutex_unlock(&r->lock);
	if (r->pm_dev)
		pm_runtime_put_autosuspend(r->pm_dev);
	drm_dev_exit(idx);
}

/* Stop a ring's DMA: the device no longer writes to it once this returns. */
static void tacc_ring_hw_stop(struct tacc_device *tdev, u32 ctrl, u32 wb, u32 base)
{
	int idx;

	if (drm_dev_enter(&tdev->drm, &idx)) {
		tacc_wr(tdev, ctrl, 0);
		tacc_wr64(tdev, wb, 0);
		tacc_wr64(tdev, base, 0);
		tacc_rd(tdev, ctrl);	/* flush: no DMA to the ring after this */
		drm_dev_exit(idx);
	}
}

/* ----------------------------------------------------------- trace ring ---- */

static_assert(TACC_TRACE_REC_SIZE == 64 && TACC_TRACE_REC3_SIZE == 128);

static void tacc_trace_stop_locked(struct tacc_ring *tr);

/*
 * Indices restart at 0 when the device is (re)programmed; @dropped seeds the
 * header's drop count with the device's cumulative one (see below).
 */
void tacc_trace_hdr_reset(struct tacc_ring *tr, u32 dropped)
{
	struct drm_tacc_trace_header *hdr = tr->cpu;

	hdr->prod = 0;
	hdr->cons = 0;
	tr->cons = 0;
	tr->last_dropped = dropped;
	hdr->dropped = dropped;
	WRITE_ONCE(hdr->epoch, hdr->epoch + 1);
}

static void tacc_trace_hw_setup_locked(struct tacc_device *tdev)
{
	struct tacc_ring *tr = &tdev->trace;

	tacc_wr(tdev, TACC_REG_TRACE_CTRL, 0);
	if (!tr->cpu || !tr->owner)
		return;
	/*
	 * The device's drop count is cumulative since the last function reset
	 * and its next write-back reports all of it: seed the header with it,
	 * so that a new consumer sees no stale 0 and counts only the drops of
	 * its own run.
	 */
	tacc_trace_hdr_reset(tr, tacc_rd(tdev, TACC_REG_TRACE_DROPPED));
	tacc_wr64(tdev, TACC_REG_TRACE_BASE, tr->dma + PAGE_SIZE);
	tacc_wr(tdev, TACC_REG_TRACE_SIZE, tr->entries);
	tacc_wr64(tdev, TACC_REG_TRACE_WB, tr->dma + TACC_TRACE_WB_OFFSET);
	tacc_wr(tdev, TACC_REG_TRACE_CONS, 0);
	/* enabling zeroes the device's PROD and CONS; V3 is latched with it */
	tacc_wr(tdev, TACC_REG_TRACE_CTRL, TACC_TRACE_CTRL_ENABLE |
		(tr->rec_size == TACC_TRACE_REC3_SIZE ? TACC_TRACE_CTRL_V3 : 0));
}

static int tacc_trace_setup_pci(struct tacc_ring *tr)
{
	tacc_trace_hw_setup_locked(container_of(tr, struct tacc_device, trace));
	return 0;
}

/*
 * From tacc_hw_init() (probe, runtime/system resume, reset recovery), never
 * with the ring lock held: TRACE_OPEN takes its PM reference before the lock.
 */
void tacc_trace_hw_setup(struct tacc_device *tdev)
{
	mutex_lock(&tdev->trace.lock);
	tacc_trace_hw_setup_locked(tdev);
	mutex_unlock(&tdev->trace.lock);
}

void tacc_trace_release_dma(struct tacc_device *tdev)
{
	tacc_ring_release_dma(&tdev->trace);
}

static int tacc_trace_entries(u32 want)
{
	if (!want)
		return DRM_TACC_TRACE_DEFAULT_ENTRIES;
	if (want < DRM_TACC_TRACE_MIN_ENTRIES || want > DRM_TACC_TRACE_MAX_ENTRIES ||
	    !is_power_of_2(want))
		return -EINVAL;
	return want;
}

/*
 * TRACE_OPEN on any function: CAP_PERFMON, since the ring records the
 * commands of every user of the node (docs/uapi.md "Threat model"); @setup
 * tells the device about the new ring, @stop retires a ring taken over.
 */
int tacc_trace_open(struct tacc_ring *tr, struct drm_file *file,
		    struct drm_tacc_trace_open *args, bool v3_ok,
		    tacc_ring_setup_fn setup, tacc_ring_stop_fn stop)
{
	bool v3 = args->flags & DRM_TACC_TRACE_F_V3;
	u32 rec = v3 ? TACC_TRACE_REC3_SIZE : TACC_TRACE_REC_SIZE;
	struct drm_tacc_trace_header *hdr;
	int entries, idx, ret;

	if (args->flags & ~DRM_TACC_TRACE_F_V3)
		return -EINVAL;
	if (v3 && !v3_ok)
		return -EOPNOTSUPP;
	entries = tacc_trace_entries(args->entries);
	if (entries < 0)
		return entries;
	if (!perfmon_capable())
		return -EACCES;
	ret = tacc_ring_open_begin(tr, &idx);
	if (ret)
		return ret;

	mutex_lock(&tr->lock);
	ret = tacc_ring_claim_locked(tr, file, PAGE_SIZE + (size_t)entries * rec, stop);
	if (ret)
		goto out_fail;
	hdr = tr->cpu;
	hdr->version = DRM_TACC_TRACE_HDR_VERSION;
	hdr->rec_size = rec;
	hdr->entries = entries;
	hdr->rec_version = v3 ? TACC_TRACE_VERSION_3 : TACC_TRACE_VERSION;
	tr->rec_size = rec;
	hdr->data_offset = PAGE_SIZE;
	tr->entries = entries;
	ret = setup(tr);
	if (ret) {
		stop(tr);	/* retires the ring and drops the PM reference */
		mutex_unlock(&tr->lock);
		drm_dev_exit(idx);
		return ret;
	}
	args->entries = entries;
	args->mmap_offset = DRM_TACC_MMAP_TRACE;
	args->mmap_size = tr->size;
	mutex_unlock(&tr->lock);
	drm_dev_exit(idx);
	return 0;

out_fail:
	tacc_ring_open_fail(tr, idx);
	return ret;
}

int tacc_trace_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);

	return tacc_trace_open(&tdev->trace, file, data, tdev->caps & TACC_CAP_TRACE_V3,
			       tacc_trace_setup_pci, tacc_trace_stop_locked);
}

static void tacc_trace_check_drops(struct tacc_device *tdev, u32 dropped)
{
	struct tacc_ring *tr = &tdev->trace;

	if (dropped != tr->last_dropped) {
		trace_tacc_trace_drop(tacc_devid(tdev), dropped - tr->last_dropped, dropped);
		tr->last_dropped = dropped;
	}
}

/* TRACE_ADVANCE's checks; with 0 returned as tacc_ring_advance_begin(). */
int tacc_trace_advance_begin(struct tacc_ring *tr, struct drm_file *file,
			     struct drm_tacc_trace_advance *args, int *idx)
{
	struct drm_tacc_trace_header *hdr;
	int ret;

	if (args->flags)
		return -EINVAL;
	ret = tacc_ring_advance_begin(tr, file, offsetof(typeof(*hdr), prod),
				      offsetof(typeof(*hdr), cons), args->cons, &args->prod, idx);
	if (ret)
		return ret;
	hdr = tr->cpu;
	args->dropped = READ_ONCE(hdr->dropped);
	return 0;
}

int tacc_trace_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct drm_tacc_trace_advance *args = data;
	int idx, ret;

	ret = tacc_trace_advance_begin(&tdev->trace, file, args, &idx);
	if (ret)
		return ret;
	tacc_wr(tdev, TACC_REG_TRACE_CONS, tdev->trace.cons);
	tacc_trace_check_drops(tdev, args->dropped);
	tacc_ring_advance_end(&tdev->trace, idx);
	return 0;
}

static void tacc_trace_stop_locked(struct tacc_ring *tr)
{
	struct tacc_device *tdev = container_of(tr, struct tacc_device, trace);

	tacc_ring_hw_stop(tdev, TACC_REG_TRACE_CTRL, TACC_REG_TRACE_WB, TACC_REG_TRACE_BASE);
	tacc_ring_retire_locked(tr, DRM_TACC_MMAP_TRACE);
}

int tacc_trace_close(struct tacc_ring *tr, struct drm_file *file,
		     const struct drm_tacc_trace_close *args, tacc_ring_stop_fn stop)
{
	if (args->flags || args->pad)
		return -EINVAL;
	return tacc_ring_close(tr, file, stop);
}

int tacc_trace_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	return tacc_trace_close(&to_tacc_dev(dev)->trace, file, data, tacc_trace_stop_locked);
}

void tacc_trace_release(struct tacc_device *tdev, struct drm_file *file)
{
	tacc_ring_close(&tdev->trace, file, tacc_trace_stop_locked);
}

int tacc_trace_mmap(struct tacc_device *tdev, struct drm_file *file,
		    struct vm_area_struct *vma)
{
	return tacc_ring_mmap(&tdev->trace, file, vma, &tacc_trace_vm_ops);
}

/* ---------------------------------------------------------- sample ring ---- */

#define TACC_SAMPLE_WB_OFFSET	offsetof(struct drm_tacc_sample_header, prod)

static_assert(DRM_TACC_SAMPLE_MIN_PERIOD_NS == TACC_SAMPLE_MIN_PERIOD_NS);

static void tacc_sample_stop_locked(struct tacc_ring *sr);

static void tacc_sample_hw_setup_locked(struct tacc_device *tdev)
{
	struct tacc_ring *sr = &tdev->sample;
	struct drm_tacc_sample_header *hdr = sr->cpu;
	u32 mask;

	tacc_wr(tdev, TACC_REG_SAMPLE_PERIOD, 0);
	if (!hdr || !sr->owner)
		return;
	hdr->prod = 0;
	hdr->cons = 0;
	hdr->dropped = tacc_rd(tdev, TACC_REG_SAMPLE_DROPPED);
	WRITE_ONCE(hdr->dropped_base, hdr->dropped);
	sr->cons = 0;
	WRITE_ONCE(hdr->epoch, hdr->epoch + 1);
	tacc_wr64(tdev, TACC_REG_SAMPLE_BASE, sr->dma + PAGE_SIZE);
	tacc_wr(tdev, TACC_REG_SAMPLE_SIZE, sr->entries);
	tacc_wr64(tdev, TACC_REG_SAMPLE_WB, sr->dma + TACC_SAMPLE_WB_OFFSET);
	tacc_wr(tdev, TACC_REG_SAMPLE_CONS, 0);
	mask = tacc_rd(tdev, TACC_REG_IRQ_MASK);
	tacc_wr(tdev, TACC_REG_IRQ_MASK, mask | TACC_IRQ_SAMPLE);
	/* starting zeroes the device's PROD and CONS */
	tacc_wr(tdev, TACC_REG_SAMPLE_PERIOD, sr->period_ns);
}

/*
 * From tacc_hw_init() (probe, runtime/system resume, reset recovery), never
 * with the ring lock held: SAMPLE_OPEN takes its PM reference before the lock.
 */
void tacc_sample_hw_setup(struct tacc_device *tdev)
{
	mutex_lock(&tdev->sample.lock);
	tacc_sample_hw_setup_locked(tdev);
	mutex_unlock(&tdev->sample.lock);
}

void tacc_sample_release_dma(struct tacc_device *tdev)
{
	tacc_ring_release_dma(&tdev->sample);
}

static int tacc_sample_open_check(struct tacc_device *tdev,
				  const struct drm_tacc_sample_open *args)
{
	if (args->flags || args->pad)
		return -EINVAL;
	if (args->period_ns < DRM_TACC_SAMPLE_MIN_PERIOD_NS)
		return -EINVAL;
	if (args->entries < 2 || args->entries > DRM_TACC_SAMPLE_MAX_ENTRIES ||
	    !is_power_of_2(args->entries))
		return -EINVAL;
	if (!(tdev->caps & TACC_CAP_SAMPLING))
		return -EOPNOTSUPP;
	return 0;
}

int tacc_sample_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ring *sr = &tdev->sample;
	struct drm_tacc_sample_open *args = data;
	struct drm_tacc_sample_header *hdr;
	int idx, ret;

	ret = tacc_sample_open_check(tdev, args);
	if (ret)
		return ret;
	if (!tacc_sample_may_open(tdev))
		return -EACCES;
	ret = tacc_ring_open_begin(sr, &idx);
	if (ret)
		return ret;

	mutex_lock(&sr->lock);
	ret = tacc_ring_claim_locked(sr, file,
				     PAGE_ALIGN(PAGE_SIZE + (size_t)args->entries *
						TACC_SAMPLE_SIZE), tacc_sample_stop_locked);
	if (ret) {
		tacc_ring_open_fail(sr, idx);
		return ret;
	}
	hdr = sr->cpu;
	hdr->version = DRM_TACC_SAMPLE_HDR_VERSION;
	hdr->entry_size = TACC_SAMPLE_SIZE;
	hdr->entries = args->entries;
	hdr->period_ns = args->period_ns;
	hdr->data_offset = PAGE_SIZE;
	sr->entries = args->entries;
	sr->period_ns = args->period_ns;
	tacc_sample_hw_setup_locked(tdev);
	args->mmap_offset = DRM_TACC_MMAP_SAMPLE;
	args->mmap_size = sr->size;
	mutex_unlock(&sr->lock);
	drm_dev_exit(idx);
	return 0;
}

int tacc_sample_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ring *sr = &tdev->sample;
	struct drm_tacc_sample_advance *args = data;
	struct drm_tacc_sample_header *hdr;
	int idx, ret;

	if (args->flags)
		return -EINVAL;
	ret = tacc_ring_advance_reg(tdev, sr, file, offsetof(typeof(*hdr), prod),
				    offsetof(typeof(*hdr), cons), TACC_REG_SAMPLE_CONS,
				    args->cons, &args->prod, &idx);
	if (ret)
		return ret;
	hdr = sr->cpu;
	args->dropped = READ_ONCE(hdr->dropped) - READ_ONCE(hdr->dropped_base);
	tacc_ring_advance_end(sr, idx);
	return 0;
}

static void tacc_sample_stop_locked(struct tacc_ring *sr)
{
	struct tacc_device *tdev = container_of(sr, struct tacc_device, sample);
	int idx;

	if (drm_dev_enter(&tdev->drm, &idx)) {
		tacc_wr(tdev, TACC_REG_SAMPLE_PERIOD, 0);
		tacc_wr(tdev, TACC_REG_IRQ_MASK,
			tacc_rd(tdev, TACC_REG_IRQ_MASK) & ~TACC_IRQ_SAMPLE);
		tacc_wr64(tdev, TACC_REG_SAMPLE_WB, 0);
		tacc_wr64(tdev, TACC_REG_SAMPLE_BASE, 0);
		tacc_rd(tdev, TACC_REG_SAMPLE_PERIOD);	/* flush: no DMA to the ring after this */
		drm_dev_exit(idx);
	}
	tacc_ring_retire_locked(sr, DRM_TACC_MMAP_SAMPLE);
}

int tacc_sample_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct drm_tacc_sample_close *args = data;

	if (args->flags || args->pad)
		return -EINVAL;
	return tacc_ring_close(&tdev->sample, file, tacc_sample_stop_locked);
}

void tacc_sample_release(struct tacc_device *tdev, struct drm_file *file)
{
	tacc_ring_close(&tdev->sample, file, tacc_sample_stop_locked);
}

int tacc_sample_mmap(struct tacc_device *tdev, struct drm_file *file,
		     struct vm_area_struct *vma)
{
	return tacc_ring_mmap(&tdev->sample, file, vma, &tacc_sample_vm_ops);
}

/* --------------------------------------------------- TLP capture ring ---- */
/*
 * The device's record of every TLP on its link (docs/hardware.md section 11,
 * TACC_CAP_TLP_CAPTURE, PF only).  It shows every function's and context's
 * traffic: CAP_PERFMON is needed, as for the PF's trace ring.  Same ring
 * protocol as the trace ring: header page (struct drm_tacc_trace_header,
 * rec_size TACC_TLP_REC_SIZE), then the records; filters are applied by the
 * device.
 */
static_assert(sizeof(struct tacc_tlp_rec) == TACC_TLP_REC_SIZE);

static void tacc_tlpcap_stop_locked(struct tacc_ring *r);

static void tacc_tlpcap_hw_setup_locked(struct tacc_device *tdev)
{
	struct tacc_ring *r = &tdev->tlpcap;
	struct drm_tacc_trace_header *hdr = r->cpu;

	tacc_wr(tdev, TACC_REG_TLPCAP_CTRL, 0);
	if (!hdr || !r->owner)
		return;
	hdr->prod = 0;
	hdr->cons = 0;
	hdr->dropped = 0;
	r->cons = 0;
	WRITE_ONCE(hdr->epoch, hdr->epoch + 1);
	tacc_wr64(tdev, TACC_REG_TLPCAP_BASE, r->dma + PAGE_SIZE);
	tacc_wr(tdev, TACC_REG_TLPCAP_SIZE, r->entries);
	tacc_wr64(tdev, TACC_REG_TLPCAP_WB, r->dma + TACC_TRACE_WB_OFFSET);
	tacc_wr(tdev, TACC_REG_TLPCAP_FUNCS, r->tc_funcs);
	tacc_wr(tdev, TACC_REG_TLPCAP_KINDS, r->tc_kinds);
	tacc_wr64(tdev, TACC_REG_TLPCAP_ADDR_LO, r->tc_addr_lo);
	tacc_wr64(tdev, TACC_REG_TLPCAP_ADDR_HI, r->tc_addr_hi);
	/* enabling zeroes the device's PROD, CONS, DROPPED and sequence */
	tacc_wr(tdev, TACC_REG_TLPCAP_CTRL, TACC_TLPCAP_CTRL_ENABLE |
		(r->tc_flags & DRM_TACC_TLPCAP_NO_CTRL ? TACC_TLPCAP_CTRL_NO_CTRL : 0));
}

void tacc_tlpcap_hw_setup(struct tacc_device *tdev)
{
	if (tdev->is_vf)
		return;
	mutex_lock(&tdev->tlpcap.lock);
	tacc_tlpcap_hw_setup_locked(tdev);
	mutex_unlock(&tdev->tlpcap.lock);
}

void tacc_tlpcap_release_dma(struct tacc_device *tdev)
{
	tacc_ring_release_dma(&tdev->tlpcap);
}

static int tacc_tlpcap_entries(u32 want)
{
	if (!want)
		return DRM_TACC_TLPCAP_DEFAULT_ENTRIES;
	if (want < DRM_TACC_TLPCAP_MIN_ENTRIES || want > DRM_TACC_TLPCAP_MAX_ENTRIES ||
	    !is_power_of_2(want))
		return -EINVAL;
	return want;
}

static int tacc_tlpcap_check(struct tacc_device *tdev, const struct drm_tacc_tlpcap_open *args)
{
	if (args->flags & ~DRM_TACC_TLPCAP_NO_CTRL || args->pad || args->pad2)
		return -EINVAL;
	if (args->addr_hi && args->addr_hi <= args->addr_lo)
		return -EINVAL;
	if (args->funcs >> (1 + TACC_MAX_VFS) || args->kinds >> (TACC_TLP_CPLD + 1))
		return -EINVAL;
	if (tdev->is_vf || !(tdev->caps & TACC_CAP_TLP_CAPTURE))
		return -EOPNOTSUPP;
	return tacc_tlpcap_entries(args->entries);
}

int tacc_tlpcap_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ring *r = &tdev->tlpcap;
	struct drm_tacc_tlpcap_open *args = data;
	struct drm_tacc_trace_header *hdr;
	int entries, idx, ret;

	entries = tacc_tlpcap_check(tdev, args);
	if (entries < 0)
		return entries;
	if (!perfmon_capable())
		return -EACCES;
	ret = tacc_ring_open_begin(r, &idx);
	if (ret)
		return ret;

	mutex_lock(&r->lock);
	ret = tacc_ring_claim_locked(r, file, PAGE_SIZE + (size_t)entries * TACC_TLP_REC_SIZE,
				     tacc_tlpcap_stop_locked);
	if (ret) {
		tacc_ring_open_fail(r, idx);
		return ret;
	}
	hdr = r->cpu;
	hdr->version = DRM_TACC_TRACE_HDR_VERSION;
	hdr->rec_size = TACC_TLP_REC_SIZE;
	hdr->entries = entries;
	hdr->rec_version = TACC_TLP_VERSION;
	hdr->data_offset = PAGE_SIZE;
	r->entries = entries;
	r->tc_flags = args->flags;
	r->tc_funcs = args->funcs;
	r->tc_kinds = args->kinds;
	r->tc_addr_lo = args->addr_lo;
	r->tc_addr_hi = args->addr_hi;
	tacc_tlpcap_hw_setup_locked(tdev);
	args->entries = entries;
	args->mmap_offset = DRM_TACC_MMAP_TLPCAP;
	args->mmap_size = r->size;
	mutex_unlock(&r->lock);
	drm_dev_exit(idx);
	return 0;
}

int tacc_tlpcap_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct tacc_ring *r = &tdev->tlpcap;
	struct drm_tacc_trace_advance *args = data;
	int idx, ret;

	if (args->flags)
		return -EINVAL;
	ret = tacc_ring_advance_reg(tdev, r, file, offsetof(struct drm_tacc_trace_header, prod),
				    offsetof(struct drm_tacc_trace_header, cons),
				    TACC_REG_TLPCAP_CONS, args->cons, &args->prod, &idx);
	if (ret)
		return ret;
	args->dropped = tacc_rd(tdev, TACC_REG_TLPCAP_DROPPED);
	tacc_ring_advance_end(r, idx);
	return 0;
}

static void tacc_tlpcap_stop_locked(struct tacc_ring *r)
{
	struct tacc_device *tdev = container_of(r, struct tacc_device, tlpcap);

	tacc_ring_hw_stop(tdev, TACC_REG_TLPCAP_CTRL, TACC_REG_TLPCAP_WB, TACC_REG_TLPCAP_BASE);
	tacc_ring_retire_locked(r, DRM_TACC_MMAP_TLPCAP);
}

int tacc_tlpcap_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file)
{
	struct tacc_device *tdev = to_tacc_dev(dev);
	struct drm_tacc_trace_close *args = data;

	if (args->flags || args->pad)
		return -EINVAL;
	return tacc_ring_close(&tdev->tlpcap, file, tacc_tlpcap_stop_locked);
}

void tacc_tlpcap_release(struct tacc_device *tdev, struct drm_file *file)
{
	tacc_ring_close(&tdev->tlpcap, file, tacc_tlpcap_stop_locked);
}

static vm_fault_t tacc_tlpcap_vm_fault(struct vm_fault *vmf)
{
	struct drm_file *file = vmf->vma->vm_file->private_data;

	return tacc_ring_fault(vmf, &to_tacc_dev(file->minor->dev)->tlpcap, DRM_TACC_MMAP_TLPCAP);
}

static const struct vm_operations_struct tacc_tlpcap_vm_ops = {
	.fault = tacc_tlpcap_vm_fault,
};

int tacc_tlpcap_mmap(struct tacc_device *tdev, struct drm_file *file,
		     struct vm_area_struct *vma)
{
	return tacc_ring_mmap(&tdev->tlpcap, file, vma, &tacc_tlpcap_vm_ops);
}
