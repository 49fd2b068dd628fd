/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc_virtio - the guest frontend of virtio-tacc (docs/virtio.md): a
 * virtio_driver in tacc.ko exposing the tacc DRM accel uAPI on its own
 * /dev/accel node.  Internal header of tacc_virtio*.c.
 */
#ifndef __TACC_VIRTIO_DRV_H__
#define __TACC_VIRTIO_DRV_H__

#include <linux/dma-fence.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include <drm/drm_device.h>
#include <drm/drm_file.h>
#include <drm/drm_gem_shmem_helper.h>
#include <drm/drm_mm.h>

#include "include/tacc_hw.h"
#include "include/tacc_virtio.h"
#include "include/uapi/drm/tacc_accel.h"
#include "tacc_quota.h"
#include "tacc_ring.h"
#include "tacc_status.h"

#define TACC_V_MAX_CMDS		64	/* per submit, as on the PF */
#define TACC_V_MAX_INFLIGHT	128	/* jobs per file, all rings */
#define TACC_V_MAX_BOS		4096	/* per file, as on the PF */
#define TACC_V_SEQ_SLOTS	256	/* per file: remembered job fences */
#define TACC_V_VA_START		0x200000ull
#define TACC_V_VA_END		BIT_ULL(39)
#define TACC_V_SZ_2M		BIT_ULL(21)
#define TACC_V_CTRL_TIMEOUT	(5 * HZ)
#define TACC_V_BATCH_JOBS	64	/* jobs per submit buffer */
#define TACC_V_RING_BATCHES	2	/* buffers in flight per ring before jobs are held */
#define TACC_V_POLL_US		20	/* WAIT's fence-slot poll interval */

/* One virtio-tacc function: one DRM accel device. */
struct tacc_vdev {
	struct drm_device drm;
	struct virtio_device *vdev;
	struct virtqueue *ctrlq;
	struct virtqueue *submitq;
	struct device *dma_dev;		/* NULL: no ACCESS_PLATFORM, guest-physical */
	u32 devid;			/* tracepoints' dev: the virtio PCI function's id */

	struct tacc_quota quota;	/* per-user limits (tacc_quota.c) */
	struct mutex files_lock;	/* files: a process's count and its new context */
	struct list_head files;		/* struct tacc_vctx of the open files */
	/* closed files' contexts whose jobs the device still held (files_lock) */
	struct list_head stuck;

	struct mutex ctrl_lock;		/* one control request at a time */
	/* backend contexts held by open files (atomic bit ops): ids the device gave */
	DECLARE_BITMAP(ctx_ids, TACC_NUM_CONTEXTS);
	wait_queue_head_t ctrl_wq;	/* a control buffer was used */

	spinlock_t submit_lock;		/* submitq, staged, inflight, ring_batches, gone */
	struct list_head staged;	/* struct tacc_vjob not yet queued, submission order */
	struct list_head inflight;	/* struct tacc_vbatch on the submit queue */
	u32 ring_batches[TACC_VIRTIO_NUM_RINGS];	/* batches in flight per ring */
	struct delayed_work flush_work;	/* an in-fence signalled: queue what is ready */
	bool gone;			/* removed or reset: nothing new is queued */
	bool unplugging;		/* remove started: idle waits end */
	bool reset_done;		/* removed: the device holds no buffer or page */
	wait_queue_head_t idle_wq;	/* a context's last job in flight completed */
	struct tacc_vstats {		/* debugfs virtio_stats (submit_lock) */
		u64 jobs;		/* jobs queued */
		u64 batches;		/* submit buffers queued */
		u64 kicks;		/* notifications of the submit queue */
		u64 irqs;		/* submit queue callbacks (interrupts) */
		u64 used;		/* submit buffers used by the device */
		u64 complete_ns;	/* in the callback */
	} st;
	atomic64_t slot_waits;		/* WAITs answered from the fence page */
	atomic64_t submit_ns;		/* in the SUBMIT ioctl */
	/* debugfs virtio_stats: a device that answers late or short */
	atomic64_t ctrl_timeouts;	/* control requests not answered in time */
	atomic64_t ctrl_late;		/* their answers used later (buffers freed then) */
	atomic64_t ctrl_short;		/* answers shorter than tacc_virtio_resp */
	atomic64_t leaked_bos;		/* BOs freed while the device may hold them */
	atomic64_t leaked_pages;	/* their guest pages, kept pinned, never reused */
	atomic64_t ctx_stuck;		/* contexts closed while the device held jobs */
	atomic64_t ctx_reaped;		/* ... destroyed later, once those ended */
	struct work_struct reap_work;	/* a stuck context's last job ended */

	/* control requests answered late (tacc_virtio_late.c) */
	spinlock_t late_lock;		/* late_used, late_ready */
	struct list_head late_used;	/* struct tacc_vreq: late answers, not yet read */
	struct list_head late_ready;	/* struct tacc_vlate: answered, to be settled */
	struct mutex late_settle;	/* settling; a context's records at its destroy */
	struct list_head late_lost;	/* struct tacc_vlate: contexts never given back */
	struct work_struct late_work;	/* late answers came: settle them */
	atomic_t late_pending;		/* timed-out requests the device still holds */
	atomic64_t late_settled;	/* late outcomes settled: context or range back */
	atomic64_t ctx_lost;		/* backend contexts that cannot be given back */
	atomic64_t va_lost;		/* VA ranges that stay taken until their file closes */

	struct mutex dma_lock;		/* dma_bos */
	struct list_head dma_bos;	/* struct tacc_vbo with pages DMA mapped */

	/* configuration space, read at probe */
	u32 version;
	u32 caps;
	u32 func;
	u32 num_contexts;
	u32 num_rings;
	u32 max_job_cmds;
	u64 devmem_size;
	bool has_devmem;		/* TACC_VIRTIO_F_DEVMEM negotiated */
	bool has_trace;			/* TACC_VIRTIO_F_TRACE negotiated */
	struct tacc_ring trace;		/* the function's trace ring (TRACE_SETUP) */
	u64 cnt_phys;			/* shared memory region 1: the counter block, */
	u64 cnt_len;			/* 0 if the device has none */
	struct tacc_virtio_fence *fences;	/* shared memory region 0, NULL if none */
};

/* One open file: one backend context (device address space). */
/* close() and GEM_CLOSE's bound on waiting for jobs, ms (tacc_drv.c) */
extern unsigned int tacc_close_wait_ms;

struct tacc_vctx {
	struct tacc_vdev *vd;
	u32 id;				/* backend context */
	pid_t pid;			/* the opener's thread-group id (max_ctx_per_process) */
	struct list_head node;		/* vd->files */
	struct tacc_user *user;		/* the opener's uid: charged, until the file closes */
	bool unlimited;			/* opened with CAP_SYS_ADMIN: counted, not limited */
	atomic_t nr_bos;		/* the file's BOs (TACC_V_MAX_BOS) */
	struct mutex vm_lock;		/* va_mm, bindings */
	struct drm_mm va_mm;
	u64 fence_ctx;			/* + ring */

	spinlock_t seq_lock;		/* last_seqno, slots, inflight */
	u64 last_seqno;
	struct {
		u64 seqno;
		struct dma_fence *fence;
	} slot[TACC_V_SEQ_SLOTS];
	struct tacc_failures failed;	/* failed jobs whose slot was reused */
	atomic_t inflight;		/* jobs queued, not completed (vd->idle_wq) */
	bool stuck;			/* a close path gave up waiting for the device */
	struct list_head late;		/* struct tacc_vlate holding a range (vm_lock) */
	/* per ring: jobs the used buffers reported failed by the device (submit_lock) */
	u32 dev_failed[TACC_VIRTIO_NUM_RINGS];
	struct mutex submit_lock;	/* seqno order = queue order */
	/* fdinfo (vd->submit_lock): per ring, ns with a job queued, jobs, last completion */
	u64 busy_ns[TACC_VIRTIO_NUM_RINGS];
	u64 jobs[TACC_VIRTIO_NUM_RINGS];
	u64 busy_end[TACC_VIRTIO_NUM_RINGS];
};

struct tacc_vbo {
	struct drm_gem_shmem_object shmem;	/* base.* used by every type */
	struct tacc_vctx *ctx;		/* owner: the creating file */
	struct tacc_user *user;		/* the owner's uid: charged until freed */
	u32 nents;			/* page-list entries charged to it (HOST, USERPTR) */
	u32 type;			/* enum drm_tacc_bo_type */
	u32 flags;			/* DRM_TACC_BO_F_* */
	u32 handle;			/* backend handle, 0 = none */
	bool unsure;			/* BO_CREATE's outcome unknown: pages leaked */
	struct sg_table *sgt;		/* HOST, USERPTR: pinned pages, DMA mapped */
	struct page **pages;		/* USERPTR: the pinned user pages */
	unsigned long npages;
	struct mm_struct *pin_mm;	/* USERPTR: charged pinned_vm */
	struct list_head dma_node;	/* on vd->dma_bos while sgt is DMA mapped */
	/* binding (ctx->vm_lock) */
	struct drm_mm_node va;
	u64 bind_offset;
	bool readonly;
};

enum { TACC_VT_ANY, TACC_VT_HOST, TACC_VT_DEV };	/* tacc_vbo_va() @type */

/*
 * One submitted job: its fence, and its part of a submit buffer (the job
 * header and commands) until the batch carrying it is used.
 */
struct tacc_vjob {
	struct dma_fence fence;		/* first: dma_fence_free() */
	spinlock_t lock;		/* fence lock: lives with the fence */
	struct tacc_vctx *ctx;		/* valid until the job completed */
	struct list_head node;		/* vd->staged, then its batch's jobs */
	void *buf;			/* struct tacc_virtio_job + commands */
	size_t len;
	u16 ring;
	u32 mix;			/* BIT(opcode) of its commands (tacc_submit) */
	u64 bytes;			/* its copies' bytes (tacc_submit) */
	u32 ndeps;			/* in-fences, waited for before it is queued */
	struct dma_fence *deps[DRM_TACC_MAX_IN_SYNCOBJS];
	struct dma_fence_cb dep_cb;	/* on deps[dep_armed - 1], with a job reference */
	u32 dep_armed;			/* 0: no callback pending */
	bool queued;			/* in a submit buffer (no longer staged) */
	u64 queued_ns;			/* ktime when queued (fdinfo busy time) */
	bool early;			/* not its batch's last job: WAIT polls its fence slot */
};

/* One submit buffer: up to TACC_V_BATCH_JOBS jobs of one ring, one kick. */
struct tacc_vbatch {
	struct list_head node;		/* vd->inflight */
	struct list_head jobs;		/* struct tacc_vjob, buffer order */
	u32 njobs;
	u16 ring;
	struct tacc_virtio_submit hdr;
	void *resp;			/* tacc_virtio_submit_resp + njobs job statuses */
	size_t resp_len;
	struct scatterlist sg[];	/* hdr, each job, resp */
};

static inline struct tacc_vdev *to_tacc_vdev(struct drm_device *dev)
{
	return container_of(dev, struct tacc_vdev, drm);
}

static inline struct tacc_vbo *to_tacc_vbo(struct drm_gem_object *obj)
{
	return container_of(obj, struct tacc_vbo, shmem.base);
}

/*
 * What a control request leaves to settle when its answer comes after the
 * frontend gave up on it (-ETIMEDOUT) or comes short (-EPROTO): a backend
 * context nobody holds (CTX_CREATE, CTX_DESTROY) or a VA range that may be
 * bound (VM_BIND, VM_UNBIND).  tacc_virtio_late.c.
 */
struct tacc_vlate {
	struct list_head node;		/* vd->late_ready or vd->late_lost */
	u16 type;			/* TACC_VIRTIO_*: the request it follows */
	bool inflight;			/* a request's, until its answer was read */
	int ret;			/* the answer: errno (-EPROTO: short) */
	u64 value;			/* ... and its value */
	/* contexts: the opener's uid, its context charge held until settled */
	struct tacc_user *user;
	u32 id;				/* CTX_DESTROY: the backend context */
	/* ranges: the file (NULL once it closed) and the range, in ctx->va_mm */
	struct tacc_vctx *ctx;
	struct list_head ctx_node;	/* ctx->late (ctx->vm_lock) */
	struct drm_mm_node va;
	u32 handle;			/* VM_BIND: the backend BO */
};

/* tacc_virtio.c: transport */
int tacc_vctrl(struct tacc_vdev *vd, void *req, size_t req_len, const void *body,
	       size_t body_len, u64 *value);
int tacc_vctrl_late(struct tacc_vdev *vd, void *req, size_t req_len, const void *body,
		    size_t body_len, u64 *value, struct tacc_vlate *late);
int tacc_vctrl_idle(struct tacc_vctx *ctx, void *req, size_t len, struct tacc_vlate *late);
void tacc_vctrl_read_late(struct tacc_vdev *vd);

/* tacc_vctrl() failed without knowing whether the device carried it out. */
static inline bool tacc_vctrl_unsure(int ret)
{
	return ret == -ETIMEDOUT || ret == -EPROTO;
}

u32 tacc_vpage_entries(struct tacc_vdev *vd);
void tacc_vhdr(struct tacc_virtio_hdr *hdr, u16 type, u32 ctx);
int tacc_vstatus_errno(u32 status);
int tacc_vbuf_sgs(struct scatterlist *sg, unsigned int nsg, const void *buf, size_t len);
int tacc_virtio_register(void);
void tacc_virtio_unregister(void);

/* tacc_virtio_late.c: late answers settled */
void tacc_vlate_init(struct tacc_vdev *vd);
struct tacc_vlate *tacc_vlate_alloc(u16 type);
void tacc_vlate_queue(struct tacc_vdev *vd, struct tacc_vlate *late, int ret, u64 value);
void tacc_vlate_kick(struct tacc_vdev *vd);
void tacc_vlate_ctx_fini(struct tacc_vctx *ctx);
void tacc_vlate_bo_free(struct tacc_vctx *ctx, u32 handle);
void tacc_vlate_remove(struct tacc_vdev *vd);

/* tacc_virtio_gem.c: buffer objects and bindings */
struct drm_gem_object *tacc_vgem_create_object(struct drm_device *dev, size_t size);
int tacc_vbo_create_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_vbo_info_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_vvm_bind_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_vvm_unbind_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
void tacc_vbo_dma_map_done(struct tacc_vbo *bo);
void tacc_vbo_dma_unmap(struct tacc_vbo *bo);
enum dma_data_direction tacc_vbo_dma_dir(const struct tacc_vbo *bo);
void tacc_vbos_release_dma(struct tacc_vdev *vd);
int tacc_vbo_va(struct drm_file *file, const struct drm_tacc_operand *op, u64 len,
		u32 align, int type, u64 *va);

/* tacc_virtio_userptr.c: USERPTR BOs */
int tacc_vuserptr_pin(struct tacc_vbo *bo, u64 uaddr);
void tacc_vuserptr_unpin(struct tacc_vbo *bo);
void tacc_vuserptr_leak(struct tacc_vbo *bo);

/* tacc_virtio_job.c: submit, completion, wait */
int tacc_vsubmit_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_vwait_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
void tacc_vsubmit_done(struct virtqueue *vq);
void tacc_vdebugfs_init(struct tacc_vdev *vd);
void tacc_vjobs_init(struct tacc_vdev *vd);
void tacc_vjobs_fail(struct tacc_vdev *vd, int error);
bool tacc_vctx_wait_idle(struct tacc_vctx *ctx);
bool tacc_vctx_ended(struct tacc_vctx *ctx);
int tacc_vctx_wait_quiet(struct tacc_vctx *ctx, bool intr);
void tacc_vctx_seq_fini(struct tacc_vctx *ctx);

/* tacc_fdinfo.c: the BOs' fdinfo status (also in tacc_drv.h) and the virtio node's fdinfo */
enum drm_gem_object_status tacc_gem_status(struct drm_gem_object *obj);
void tacc_vshow_fdinfo(struct drm_printer *p, struct drm_file *file);

#endif /* __TACC_VIRTIO_DRV_H__ */
