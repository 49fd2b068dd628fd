/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Final statuses of a file's finished jobs, shared by the PCI and virtio
 * drivers (tacc_fence.c): WAIT never reports success for a failed job.
 */
#ifndef TACC_STATUS_H
#define TACC_STATUS_H

#include <linux/mutex.h>
#include <linux/types.h>
#include <linux/xarray.h>

/* Failed jobs of one file, by seqno; a seqno without a record succeeded. */
struct tacc_failures {
	struct mutex lock;		/* xa stores, floor, count */
	struct xarray xa;		/* seqno -> xa_mk_value(-errno) */
	u64 floor;			/* seqnos <= floor: records dropped, unknown */
	u32 count;
};

void tacc_failures_init(struct tacc_failures *h);
void tacc_failures_fini(struct tacc_failures *h);
void tacc_failures_record(struct tacc_failures *h, u64 seqno, int error);
int tacc_failures_status(struct tacc_failures *h, u64 seqno, int *status);

#endif
