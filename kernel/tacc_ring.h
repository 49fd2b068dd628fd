/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc_ring - a device ring towards one user-space consumer (tacc_ring.c),
 * shared by the PCI functions (trace, sample and TLP capture rings) and the
 * virtio-tacc frontend (its trace ring, docs/virtio.md section 13).
 */
#ifndef __TACC_RING_H__
#define __TACC_RING_H__

#include <linux/device.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/types.h>

#include <drm/drm_device.h>
#include <drm/drm_file.h>

#include "include/uapi/drm/tacc_accel.h"

/*
 * A device ring towards one user-space consumer: allocated by its OPEN ioctl
 * for its consumer and freed by CLOSE, file release or surprise removal.
 */
struct tacc_ring {
	struct mutex lock;		/* everything below */
	struct drm_device *drm;		/* the node it belongs to */
	struct device *dma_dev;		/* allocates it; NULL: contiguous pages, CPU-physical */
	struct device *pm_dev;		/* kept in D0 by the consumer; NULL: no runtime PM */
	void *cpu;			/* header page, then the entries */
	dma_addr_t dma;
	size_t size;
	unsigned long gen;		/* OPEN count: a mapping's vm_private_data */
	struct drm_file *owner;		/* the one registered consumer */
	bool owner_perfmon;		/* the owner had CAP_PERFMON at OPEN */
	struct drm_file *evicted;	/* owner displaced by a CAP_PERFMON OPEN */
	u32 entries;
	u32 cons;			/* consumer index, as ADVANCE set it */
	u32 period_ns;			/* sample ring: sampling period */
	u32 last_dropped;		/* trace ring: drops already reported */
	u32 rec_size;			/* trace ring: 64, or 128 (version-3 records) */
	/* TLP capture ring: the OPEN's filters, re-programmed after a reset */
	u32 tc_flags, tc_funcs, tc_kinds;
	u64 tc_addr_lo, tc_addr_hi;
};

/* Stops the device writing to the ring, then tacc_ring_retire_locked(). */
typedef void (*tacc_ring_stop_fn)(struct tacc_ring *r);
/* Programs the device with the ring's memory (header already filled). */
typedef int (*tacc_ring_setup_fn)(struct tacc_ring *r);

void tacc_ring_init(struct tacc_ring *r, struct drm_device *drm, struct device *dma_dev,
		    struct device *pm_dev);
vm_fault_t tacc_ring_fault(struct vm_fault *vmf, struct tacc_ring *r, u64 mmap_offset);
int tacc_ring_mmap(struct tacc_ring *r, struct drm_file *file, struct vm_area_struct *vma,
		   const struct vm_operations_struct *ops);
void tacc_ring_release_dma(struct tacc_ring *r);
int tacc_ring_close(struct tacc_ring *r, struct drm_file *file, tacc_ring_stop_fn stop);
void tacc_ring_retire_locked(struct tacc_ring *r, u64 mmap_offset);
int tacc_ring_advance_begin(struct tacc_ring *r, struct drm_file *file, size_t prod_off,
			    size_t cons_off, u32 cons, u32 *prod, int *idx);
void tacc_ring_advance_end(struct tacc_ring *r, int idx);

/* The trace ring's uAPI (DRM_IOCTL_TACC_TRACE_*) over any function kind. */
int tacc_trace_open(struct tacc_ring *tr, struct drm_file *file,
		    struct drm_tacc_trace_open *args, bool v3_ok,
		    tacc_ring_setup_fn setup, tacc_ring_stop_fn stop);
int tacc_trace_advance_begin(struct tacc_ring *tr, struct drm_file *file,
			     struct drm_tacc_trace_advance *args, int *idx);
int tacc_trace_close(struct tacc_ring *tr, struct drm_file *file,
		     const struct drm_tacc_trace_close *args, tacc_ring_stop_fn stop);
void tacc_trace_hdr_reset(struct tacc_ring *tr, u32 dropped);

/* The device's producer write-back (struct tacc_ring_wb) sits in the header. */
#define TACC_TRACE_WB_OFFSET	offsetof(struct drm_tacc_trace_header, prod)

#endif /* __TACC_RING_H__ */
