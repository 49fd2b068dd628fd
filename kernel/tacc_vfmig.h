/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc VF migration: the PF's admin operations on one of its VFs
 * (docs/hardware.md section 16), exported by tacc.ko in the TACC namespace
 * for the VFIO variant driver tacc_vfio_pci.ko, as mlx5_core exports its
 * commands to mlx5-vfio-pci.
 */
#ifndef __TACC_VFMIG_H__
#define __TACC_VFMIG_H__

#include <linux/dma-mapping.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/types.h>

struct tacc_device;

/**
 * struct tacc_vfmig_buf - a buffer the PF's DMA reads or writes.
 * @sgt: its pages, DMA-mapped for the PF in one contiguous IOVA range.
 * @vaddr: a kernel mapping of them.
 * @dma: the IOVA (the PF's) of the first byte.
 * @size: bytes.
 */
struct tacc_vfmig_buf {
	struct sg_table *sgt;
	void *vaddr;
	dma_addr_t dma;
	size_t size;
};

struct tacc_device *tacc_vfmig_get_pf(struct pci_dev *vf, u32 *fn);
int tacc_vfmig_buf_alloc(struct tacc_device *pf, size_t size, struct tacc_vfmig_buf *buf);
void tacc_vfmig_buf_free(struct tacc_device *pf, struct tacc_vfmig_buf *buf);
int tacc_vfmig_query(struct tacc_device *pf, u32 fn, u64 *size);
int tacc_vfmig_stop(struct tacc_device *pf, u32 fn);
int tacc_vfmig_resume(struct tacc_device *pf, u32 fn);
int tacc_vfmig_save(struct tacc_device *pf, u32 fn, struct tacc_vfmig_buf *buf, u64 *len);
int tacc_vfmig_load(struct tacc_device *pf, u32 fn, struct tacc_vfmig_buf *buf, u64 len);
int tacc_vfmig_log_start(struct tacc_device *pf, u32 fn, u64 iova, u64 len, u32 pgshift);
int tacc_vfmig_log_stop(struct tacc_device *pf, u32 fn);
int tacc_vfmig_log_report(struct tacc_device *pf, u32 fn, u64 iova, u64 len,
			  struct tacc_vfmig_buf *bitmap, u64 *bytes);
u32 tacc_vfmig_vf_state(struct tacc_device *pf, u32 fn);
u32 tacc_vfmig_epoch(struct tacc_device *pf);

#endif
