/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * tacc_virtio.h - the virtio-tacc protocol: the paravirtual tacc function.
 *
 * One truth, shared by the backend in QEMU (qemu/hw/tacc/virtio-tacc.c), the
 * guest frontend and the Python virtqueue driver of tests/device (parsed,
 * never retyped).  docs/virtio.md is the prose, written like a section of
 * the virtio specification; where the two disagree, fix both.
 *
 * Every structure is little endian, naturally aligned, without padding the
 * compiler would add.  Commands inside a job are struct tacc_desc of
 * tacc_hw.h.
 */
#ifndef TACC_VIRTIO_H
#define TACC_VIRTIO_H

#include <linux/types.h>

/* Not assigned by the virtio TC (spec 1.3 ends at 45; crosvm uses 61-63). */
#define TACC_VIRTIO_ID			57
#define TACC_VIRTIO_PCI_DEVICE_ID	(0x1040 + TACC_VIRTIO_ID)	/* 0x1079 */

/* Protocol version in the config space: major << 16 | minor. */
#define TACC_VIRTIO_VERSION_MAJOR	1
#define TACC_VIRTIO_VERSION_MINOR	1	/* 1.1: config page_entries */

/* ------------------------------------------------------ feature bits ---- */
#define TACC_VIRTIO_F_DEVMEM		0	/* device-memory BOs */
#define TACC_VIRTIO_F_FILL		1	/* TACC_OP_FILL in jobs */
#define TACC_VIRTIO_F_TRACE		2	/* TRACE_SETUP/CONSUME, kick records */
#define TACC_VIRTIO_F_INFER		3	/* hw 1.3 operations and TACC_OP_LIST in jobs */
#define TACC_VIRTIO_F_TRACE_V3		4	/* TRACE_SETUP enable TACC_VIRTIO_TRACE_V3 */

/* ------------------------------------------------------- virtqueues ---- */
#define TACC_VIRTIO_VQ_CONTROL		0
#define TACC_VIRTIO_VQ_SUBMIT		1
#define TACC_VIRTIO_NUM_VQS		2
#define TACC_VIRTIO_VQ_SIZE		256

/* ---------------------------------------------- shared memory regions ---- */
#define TACC_VIRTIO_SHM_FENCES		0	/* 4 KiB, struct tacc_virtio_fence */
#define TACC_VIRTIO_SHM_COUNTERS	1	/* 8 KiB, the counter block (BAR2 layout) */
#define TACC_VIRTIO_SHM_BAR		4
#define TACC_VIRTIO_SHM_FENCES_OFF	0x0000
#define TACC_VIRTIO_SHM_FENCES_SIZE	0x1000
#define TACC_VIRTIO_SHM_COUNTERS_OFF	0x2000
#define TACC_VIRTIO_SHM_COUNTERS_SIZE	0x2000
#define TACC_VIRTIO_SHM_BAR_SIZE	0x4000

/* Limits */
#define TACC_VIRTIO_NUM_RINGS		4	/* = TACC_NUM_QUEUES */
#define TACC_VIRTIO_MAX_JOB_CMDS	256	/* = the hardware queue FIFO: a job enters it whole */
#define TACC_VIRTIO_MAX_BATCH_JOBS	256
#define TACC_VIRTIO_MAX_BOS		4096	/* per function */
#define TACC_VIRTIO_MAX_BO_ENTS		65536	/* page-list entries of one BO */
#define TACC_VIRTIO_MAX_FN_ENTS		(1u << 20)	/* ... of all BOs of the function */
#define TACC_VIRTIO_MAX_BO_SIZE		(1ull << 32)
#define TACC_VIRTIO_MAX_PT_PAGES	16384	/* backend page-table pages, per function */

/**
 * struct tacc_virtio_config - device configuration space, read only.
 * @version: TACC_VIRTIO_VERSION_MAJOR << 16 | TACC_VIRTIO_VERSION_MINOR.
 * @caps: TACC_CAP_* of the function (what TACC_REG_CAPS would say).
 * @func: function index on the tacc device (TACC_FN_VIRTIO).
 * @num_contexts: contexts (device address spaces), TACC_NUM_CONTEXTS.
 * @num_rings: rings a job may name, TACC_VIRTIO_NUM_RINGS.
 * @max_job_cmds: commands per job, at most.
 * @devmem_size: bytes of the function's device-memory window.
 * @page_entries: page-list entries of all BOs of the function, at most
 *	(TACC_VIRTIO_MAX_FN_ENTS or fewer; since 1.1, read as 0 before).
 * @rsvd: 0.
 */
struct tacc_virtio_config {
	__le32 version;
	__le32 caps;
	__le32 func;
	__le32 num_contexts;
	__le32 num_rings;
	__le32 max_job_cmds;
	__le64 devmem_size;
	__le32 page_entries;
	__le32 rsvd;
};

/* ------------------------------------------------------ message types ---- */
enum tacc_virtio_type {
	TACC_VIRTIO_CTX_CREATE = 0x0001,
	TACC_VIRTIO_CTX_DESTROY = 0x0002,
	TACC_VIRTIO_BO_CREATE = 0x0003,
	TACC_VIRTIO_BO_DESTROY = 0x0004,
	TACC_VIRTIO_VM_BIND = 0x0005,
	TACC_VIRTIO_VM_UNBIND = 0x0006,
	TACC_VIRTIO_TRACE_SETUP = 0x0007,	/* TACC_VIRTIO_F_TRACE */
	TACC_VIRTIO_TRACE_CONSUME = 0x0008,	/* TACC_VIRTIO_F_TRACE */
	TACC_VIRTIO_SUBMIT = 0x0100,		/* submit queue only */
};

/* Response status */
enum tacc_virtio_status {
	TACC_VIRTIO_OK = 0,
	TACC_VIRTIO_ERR_UNSPEC = 1,
	TACC_VIRTIO_ERR_INVAL = 2,	/* malformed, misaligned, out of range */
	TACC_VIRTIO_ERR_NOSPC = 3,	/* no context slot, handle, page table, devmem */
	TACC_VIRTIO_ERR_NOENT = 4,	/* no such context, BO or binding */
	TACC_VIRTIO_ERR_PERM = 5,	/* names another context's BO */
	TACC_VIRTIO_ERR_BUSY = 6,	/* jobs in flight, BO bound, range in use */
	TACC_VIRTIO_ERR_UNSUPP = 7,	/* unknown type, or feature not negotiated */
	TACC_VIRTIO_ERR_DMA = 8,	/* guest memory not readable (IOMMU) */
	TACC_VIRTIO_ERR_VERSION = 9,	/* header version not understood */
};

#define TACC_VIRTIO_MSG_VERSION		1

/**
 * struct tacc_virtio_hdr - first bytes of every request (both queues).
 * @type: enum tacc_virtio_type.
 * @version: TACC_VIRTIO_MSG_VERSION.
 * @flags: 0.
 * @ctx: context the request acts in (ignored by CTX_CREATE).
 * @tag: user tag (correlation id) of the API call, 0 if none.
 */
struct tacc_virtio_hdr {
	__le16 type;
	__u8   version;
	__u8   flags;
	__le32 ctx;
	__le64 tag;
};

/**
 * struct tacc_virtio_resp - first bytes of every control response.
 * @status: enum tacc_virtio_status.
 * @value: CTX_CREATE: the context; BO_CREATE: the handle; else 0.
 */
struct tacc_virtio_resp {
	__le32 status;
	__le32 rsvd;
	__le64 value;
};

#define TACC_VIRTIO_BO_DEVMEM		(1u << 0)

/* BO_CREATE body; host BOs follow it with @nr_ents struct tacc_virtio_mem_entry. */
struct tacc_virtio_bo_create {
	__le64 size;		/* bytes, multiple of 4096, 4096 .. MAX_BO_SIZE */
	__le32 flags;		/* TACC_VIRTIO_BO_* */
	__le32 nr_ents;		/* 0 for device-memory BOs */
};

/* One guest-physical (IOVA with ACCESS_PLATFORM) range of a host BO. */
struct tacc_virtio_mem_entry {
	__le64 addr;		/* 4 KiB aligned */
	__le32 length;		/* multiple of 4096, not 0 */
	__le32 padding;
};

struct tacc_virtio_bo_destroy {
	__le32 handle;
	__le32 padding;
};

#define TACC_VIRTIO_BIND_READONLY	(1u << 0)

struct tacc_virtio_vm_bind {
	__le32 handle;
	__le32 flags;		/* TACC_VIRTIO_BIND_* */
	__le64 va;		/* device VA, 4 KiB aligned, below 1 << TACC_VA_BITS */
	__le64 offset;		/* into the BO, 4 KiB aligned */
	__le64 size;		/* multiple of 4096, not 0 */
};

struct tacc_virtio_vm_unbind {
	__le64 va;		/* exactly a range one VM_BIND mapped */
	__le64 size;
};

struct tacc_virtio_trace_setup {
	__le64 base;		/* ring IOVA, 64-byte aligned; 0 = off */
	__le64 wb;		/* struct tacc_ring_wb IOVA, 8-byte aligned, 0 = none */
	__le32 entries;		/* power of two, 2 .. 1 << 20 */
	__le32 enable;		/* 1 = on; | TACC_VIRTIO_TRACE_V3 */
};

#define TACC_VIRTIO_TRACE_V3		(1u << 1)	/* 128-byte records, base 128-aligned */

struct tacc_virtio_trace_consume {
	__le32 cons;		/* free-running consumer index */
	__le32 padding;
};

/* ------------------------------------------------------------ submit ---- */
/**
 * struct tacc_virtio_submit - a batch: the header's @ctx and @tag are
 * ignored; @njobs struct tacc_virtio_job follow, each followed by its
 * @ncmds struct tacc_desc.
 */
struct tacc_virtio_submit {
	struct tacc_virtio_hdr hdr;	/* type TACC_VIRTIO_SUBMIT */
	__le32 njobs;			/* 1 .. TACC_VIRTIO_MAX_BATCH_JOBS */
	__le32 rsvd;
};

/**
 * struct tacc_virtio_job - one job of a batch.
 * @ctx: context (created by this driver) the commands run in.
 * @ring: 0 .. TACC_VIRTIO_NUM_RINGS - 1; jobs of one ring run in order.
 * @ncmds: 1 .. TACC_VIRTIO_MAX_JOB_CMDS.
 * @seqno: fence value of the (ctx, ring) timeline; greater than the last.
 * @tag: user tag of the job (trace records, kick/dispatch records).
 */
struct tacc_virtio_job {
	__le32 ctx;
	__le16 ring;
	__le16 ncmds;
	__le64 seqno;
	__le64 tag;
	__le64 rsvd;
};

/* Device-writable part of a submit buffer; @njobs job statuses follow if room. */
struct tacc_virtio_submit_resp {
	__le32 status;		/* OK, or why the whole batch was refused */
	__le32 njobs;		/* jobs completed (all of them when OK) */
	__le32 failed;		/* jobs that completed with an error */
	__le32 rsvd;
};

struct tacc_virtio_job_status {
	__le64 seqno;
	__le16 status;		/* enum tacc_status of tacc_hw.h */
	__le16 index;		/* command that failed (0 when OK) */
	__le32 rsvd;
};

/**
 * struct tacc_virtio_fence - shared-memory region TACC_VIRTIO_SHM_FENCES
 * holds one per (context, ring), at (ctx * TACC_VIRTIO_NUM_RINGS + ring) *
 * 16.  The device writes @status and @failed, then (release) @seqno, after
 * the job's results are visible to the driver.
 */
struct tacc_virtio_fence {
	__le64 seqno;		/* last completed job of the timeline */
	__le32 status;		/* enum tacc_status of that job */
	__le32 failed;		/* jobs of the timeline that failed, total */
};

#define TACC_VIRTIO_FENCE_SIZE		16

#endif /* TACC_VIRTIO_H */
