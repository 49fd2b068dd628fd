/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc - DRM accel driver for the tacc PCIe accelerator: internal header.
 */
#ifndef __TACC_DRV_H__
#define __TACC_DRV_H__

#include <linux/atomic.h>
#include <linux/dma-fence.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/kref.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include <drm/drm_device.h>
#include <drm/drm_file.h>
#include <drm/drm_gem_shmem_helper.h>
#include <drm/drm_mm.h>
#include <drm/gpu_scheduler.h>

#include "include/tacc_hw.h"
#include "include/uapi/drm/tacc_accel.h"
#include "tacc_quota.h"
#include "tacc_ring.h"
#include "tacc_status.h"

#define DRIVER_NAME		"tacc"
#define DRIVER_DESC		"tacc PCIe accelerator"

#define TACC_SQ_ENTRIES		256
#define TACC_CQ_ENTRIES		256
#define TACC_MAX_CMDS		64
#define TACC_MAX_INFLIGHT	128	/* jobs per file and queue */
#define TACC_MAX_BOS		4096	/* per file */
#define TACC_VA_START		0x200000ull
#define TACC_VA_END		BIT_ULL(TACC_VA_BITS)
#define TACC_SZ_2M		BIT_ULL(TACC_HUGE_SHIFT)

/*
 * TLB_INV completion wait (sleeping): poll step and timeout.  The first read
 * needs no sleep when the device is done at once; each later step sleeps
 * usleep_range(26, 100), within usleep_range()'s 10 us - 20 ms: a shorter
 * step (10: 3..10 us) is over before a slow kernel reaches schedule(), and
 * the wait turns into a 10 ms busy poll.
 */
#define TACC_TLB_INV_POLL_US	100
#define TACC_TLB_INV_TIMEOUT_US	10000

#define TACC_NUM_FUNC_COUNTERS	(TACC_FUNC_CNT_END - 2)
#define TACC_NUM_GLOBAL_COUNTERS (TACC_GLOBAL_CNT_END - 2)

struct tacc_device;
struct tacc_ctx;

/* Live-object counts, exposed by debugfs and sysfs. */
struct tacc_live {
	atomic_t ctxs;
	atomic_t bos;
	atomic_t mappings;
	atomic_t jobs;
	atomic_t pt_pages;
	atomic_long_t userptr_pages;
	atomic_long_t devmem_bytes;
};

struct tacc_fence_ctx;

/* A job's hardware fence (tacc_fence.c): never dereferences the device. */
struct tacc_fence {
	struct dma_fence base;		/* first: dma_fence_free() */
	struct tacc_fence_ctx *fctx;
	u32 queue;
	bool kernel;		/* a scrub job's: not counted live (the entity keeps one) */
};

struct tacc_queue {
	struct tacc_device *tdev;
	u32 idx;
	struct drm_gpu_scheduler sched;
	char name[sizeof("tacc-q4294967295")];	/* "tacc-q%u" of any u32: never truncated */

	spinlock_t lock;		/* ring indices, inflight, fences */
	struct tacc_desc *sq;
	dma_addr_t sq_dma;
	u32 sq_tail;
	struct tacc_cqe *cq;
	dma_addr_t cq_dma;
	u32 cq_head;
	u32 next_hw_job;
	u64 fence_ctx;
	u64 fence_seqno;
	struct list_head inflight;	/* struct tacc_job, submission order */

	u64 jobs_done;
	u64 jobs_failed;
	u64 resets;
	u64 bad_cqes;
	u64 irqs;
};

struct tacc_pt {
	u64 *cpu;
	dma_addr_t dma;
	struct tacc_pt **child;		/* 512 entries, levels 0 and 1 */
	struct list_head dead;		/* pruned, freed after the TLB invalidation */
};

struct tacc_vm {
	struct mutex lock;		/* PTEs, va_mm, bindings */
	struct drm_mm va_mm;
	struct tacc_pt root;
	u32 nr_tables;
};

/* One per open file: a hardware context with its own address space. */
struct tacc_ctx {
	struct kref ref;
	struct tacc_device *tdev;
	struct drm_file *file;		/* NULL once the file is closed */
	u32 id;
	pid_t pid;
	char comm[TASK_COMM_LEN];
	struct tacc_user *user;		/* the opener's uid: charged, until the file closes */
	bool unlimited;			/* opened with CAP_SYS_ADMIN: counted, not limited */
	struct tacc_vm vm;
	struct drm_sched_entity entity[TACC_NUM_QUEUES];
	atomic_t inflight[TACC_NUM_QUEUES];
	atomic_t nr_bos;
	atomic_long_t userptr_pages;

	u64 out_fence_ctx;		/* + queue: syncobj fences (tacc_fence.c) */
	struct mutex submit_lock;	/* seqno order = arm/push order */
	spinlock_t seq_lock;
	u64 last_seqno;
	struct xarray jobs_xa;		/* seqno -> finished fence, until freed */
	/* finished fence of the last job per queue (submit_lock): VM_UNBIND waits */
	struct dma_fence *last_fence[TACC_NUM_QUEUES];
	bool kernel;			/* the scrub context (tacc_scrub.c): no VM, no file */
	bool close_stuck;		/* a close-path wait timed out (tacc_ctx_close_wait) */
	struct list_head stale_node;	/* tacc_device.tlb_stale, after its release */
	struct tacc_failures failed;	/* final statuses of freed jobs */

	/* statistics (fdinfo) */
	atomic64_t busy_ns[TACC_NUM_QUEUES];
	atomic64_t jobs[TACC_NUM_QUEUES];
	atomic64_t faults;
	atomic64_t fault_addr;
	atomic64_t resets;
};

struct tacc_bo {
	struct drm_gem_shmem_object shmem;	/* base.* used by every type */
	u32 type;
	u32 flags;
	/* DEVICE */
	struct drm_mm_node devmem;
	/* USERPTR */
	struct page **pages;
	unsigned long npages;
	struct sg_table *sgt;		/* USERPTR: own; HOST: the helper's */
	struct tacc_ctx *uctx;		/* owner (its file only may open it): accounting */
	struct tacc_user *user;		/* the owner's uid: charged until freed */
	struct mm_struct *pin_mm;	/* USERPTR: pinned_vm charged (tacc_gem.c) */
	/* binding in the owning file's VM (protected by vm->lock) */
	struct tacc_mapping *map;
	/* on tdev->bo_dma_list while sgt is DMA-mapped (tdev->bo_dma_lock) */
	struct list_head dma_node;
};

struct tacc_mapping {
	struct drm_mm_node node;
	struct tacc_bo *bo;
	struct tacc_ctx *ctx;
	u64 bo_offset;
	u64 size;
	u64 page_size;
	bool readonly;
};

struct tacc_job {
	struct drm_sched_job base;
	struct tacc_ctx *ctx;
	struct tacc_queue *q;
	u32 num_cmds;
	struct tacc_desc *descs;
	struct drm_gem_object **bos;
	u32 num_bos;
	struct tacc_fence *hw_fence;
	bool hw_fence_init;
	struct list_head node;		/* q->inflight */
	u32 hw_job;
	u64 seqno;
	u64 tag;			/* tag of the last command */
	u64 bytes;			/* bytes its copy commands move */
	u32 mix;			/* BIT(opcode) of each command */
	u64 dev_start;
	u64 dev_end;
	int status;
	bool pm_ref;
};

/**
 * struct tacc_vf_policy - what the PF gives one VF (sysfs sriov_policy/).
 * @devmem_bytes: size of its device-memory window, 2 MiB multiple.
 * @queue_mask: queues it may enable (TACC_REG_VF_QUEUE_MASK).
 * @weight: its arbitration weight (TACC_REG_ARB_WEIGHT), 1 .. 255.
 */
struct tacc_vf_policy {
	u64 devmem_bytes;
	u32 queue_mask;
	u32 weight;
};

struct tacc_device {
	struct drm_device drm;
	struct pci_dev *pdev;
	void __iomem *regs;
	void __iomem *cnt;
	resource_size_t cnt_phys;
	bool is_vf;
	u32 func;
	u32 hw_version;
	u32 caps;
	u32 num_queues;
	u32 num_contexts;
	u32 num_engines;
	u64 devmem_size;
	u32 clock_hz;
	u32 link_cap;
	u32 link_status;
	u32 link_params;
	u32 tlb_entries;
	u32 time_scale;
	u32 peak_fp32_gflops;	/* TACC_CAP_ROOFLINE, else 0 */
	u32 peak_bf16_gflops;
	u32 devmem_gbps;

	struct tacc_queue queues[TACC_NUM_QUEUES];
	struct workqueue_struct *reset_wq;

	struct tacc_quota quota;	/* per-user limits (tacc_quota.c) */

	struct mutex ctx_lock;		/* ctxs[], PTBR programming */
	struct tacc_ctx *ctxs[TACC_NUM_CONTEXTS];

	struct mutex devmem_lock;	/* devmem_mm, devmem_used, vf_nodes */
	struct drm_mm devmem_mm;
	u64 devmem_used;

	/* device-memory scrubbing (tacc_scrub.c) */
	struct tacc_ctx *kctx;		/* kernel context running FILL jobs */
	struct workqueue_struct *scrub_q;
	struct list_head scrub_list;	/* freed ranges not yet released (devmem_lock) */
	wait_queue_head_t scrub_wq;	/* a scrubbed range was released */
	atomic_t scrub_pending;		/* on scrub_list, not quarantined */
	u32 scrub_queue;		/* the lowest usable queue: runs the FILLs */
	atomic_t scrub_gen;		/* ranges released so far */
	atomic64_t scrub_jobs;
	atomic64_t scrub_bytes;
	atomic64_t scrub_failed;
	bool scrub_dying;
	bool vf_dirty;			/* VF windows not scrubbed at disable */

	/* TLB invalidation completion (TACC_CAP_TLB_INV_DONE) */
	struct mutex tlb_lock;		/* one invalidation in flight; sleeps */
	u32 tlb_seq;
	atomic64_t tlb_inv_timeouts;	/* invalidations the device did not complete */
	atomic64_t tlb_recoveries;	/* function resets they caused */
	atomic_t pt_leaked;		/* table pages kept: no reset after a timeout */
	atomic_t bo_leaked;		/* BOs kept so */
	unsigned long tlb_stale_ids;	/* ctx_lock: slots not reused until a reset */
	struct mutex tlb_stale_lock;	/* tlb_stale, tlb_stale_dead */
	struct list_head tlb_stale;	/* released contexts whose tables wait for it */
	bool tlb_stale_dead;		/* tacc_remove freed them: free at once */
	struct work_struct tlb_work;	/* resets, then frees tlb_stale */

	struct tacc_ring trace;
	struct tacc_ring sample;
	struct tacc_ring tlpcap;	/* PF: TLP capture (TACC_CAP_TLP_CAPTURE) */

	/* BOs with a DMA mapping: unmapped by tacc_remove, not at free */
	struct mutex bo_dma_lock;	/* bo_dma_list, dma_released, bo->sgt */
	struct list_head bo_dma_list;	/* struct tacc_bo.dma_node */
	bool dma_released;

	/* SR-IOV (PF) */
	struct mutex sriov_lock;	/* num_vfs changes, vf_policy */
	int num_vfs;
	struct drm_mm_node vf_nodes[TACC_MAX_VFS];
	struct drm_mm_node virtio_node;	/* the virtio-tacc window, reserved at probe */
	struct tacc_vf_policy vf_policy[TACC_MAX_VFS];
	u32 queue_mask;			/* TACC_REG_QUEUE_MASK: usable queues */
	struct mutex vfmig_lock;	/* one VF migration operation at a time */
	atomic_t vfmig_epoch;		/* moves with hw_up: tacc_vfmig_epoch() */

	/* runtime PM */
	bool hw_up;			/* set under every queue lock */
	bool ptbr_live;			/* ctx_lock: roots loaded, write through */
	bool handoff;			/* ctx_lock: tacc/handoff, opens refused */
	atomic64_t pm_suspends;
	atomic64_t pm_resumes;
	u64 cnt_base[TACC_SAMPLE_SLOTS * 2];	/* sums over past resets */
	spinlock_t cnt_lock;

	/* errors and function-level recovery (tacc_reset.c) */
	struct mutex reset_lock;	/* in_reset, hw_init by recovery */
	bool in_reset;
	int fail_pending;		/* reset_lock: AER, jobs to fail once reset */
	u32 recover_delay_ms;		/* debugfs test knob, 0 */
	u32 resume_delay_ms;		/* debugfs test knob, 0 */
	bool aer_pending;		/* error_detected seen, resume not yet */
	struct work_struct fatal_work;
	atomic64_t dev_resets;
	atomic64_t mmu_faults;
	atomic64_t dma_errors;
	atomic64_t fatal_errors;

	struct tacc_live live;
	struct tacc_fence_ctx *fctx;	/* timeline names and live fences */
	struct list_head list;		/* tacc_devices */

	/* debugfs test knobs (tacc_debugfs.c), 0 = off: widen race windows */
	u32 fault_ctx_delay_ms;		/* MMU-fault ctx lookup, ctx_lock held */
	u32 free_job_delay_ms;		/* tacc_free_job, between status and fence */
	u32 scrub_delay_ms;		/* tacc_scrub_bo: the FILL of a freed BO queued later */
};

#define to_tacc_dev(d)		container_of(d, struct tacc_device, drm)
#define to_tacc_bo(o)		container_of(o, struct tacc_bo, shmem.base)
#define to_tacc_job(j)		container_of(j, struct tacc_job, base)
#define to_tacc_fence(f)	container_of(f, struct tacc_fence, base)

static inline u32 tacc_rd(struct tacc_device *tdev, u32 reg)
{
	return readl(tdev->regs + reg);
}

static inline void tacc_wr(struct tacc_device *tdev, u32 reg, u32 val)
{
	writel(val, tdev->regs + reg);
}

static inline u64 tacc_rd64(struct tacc_device *tdev, u32 reg)
{
	return lo_hi_readq(tdev->regs + reg);
}

static inline void tacc_wr64(struct tacc_device *tdev, u32 reg, u64 val)
{
	lo_hi_writeq(val, tdev->regs + reg);
}

static inline u32 tacc_qrd(struct tacc_queue *q, u32 reg)
{
	return tacc_rd(q->tdev, TACC_QUEUE_BASE(q->idx) + reg);
}

static inline void tacc_qwr(struct tacc_queue *q, u32 reg, u32 val)
{
	tacc_wr(q->tdev, TACC_QUEUE_BASE(q->idx) + reg, val);
}

/**
 * tacc_devid() - the function's id in tracepoints and netlink events.
 * @tdev: the function.
 *
 * Return: PCI domain << 16 | bus << 8 | devfn.
 */
static inline u32 tacc_devid(struct tacc_device *tdev)
{
	return pci_dev_id(tdev->pdev) | (pci_domain_nr(tdev->pdev->bus) << 16);
}

static inline struct device *tacc_to_dev(struct tacc_device *tdev)
{
	return &tdev->pdev->dev;
}

/* tacc_drv.c */
extern unsigned int tacc_job_timeout_ms;
extern unsigned int tacc_close_wait_ms;
extern unsigned int tacc_autosuspend_ms;
int tacc_hw_init(struct tacc_device *tdev);
void tacc_hw_fini(struct tacc_device *tdev);
void tacc_hw_stop(struct tacc_device *tdev, bool mmio);
struct tacc_ctx *tacc_ctx_get(struct tacc_ctx *ctx);
void tacc_ctx_put(struct tacc_ctx *ctx);
unsigned int tacc_ctx_open_files(struct tacc_device *tdev, pid_t pid);
int tacc_hw_program_ctx(struct tacc_device *tdev, u32 id, u64 ptbr);
int tacc_tlb_invalidate(struct tacc_device *tdev, u32 ctx);
int tacc_tlb_recover(struct tacc_device *tdev);

/* tacc_gem.c */
struct drm_gem_object *tacc_gem_create_object(struct drm_device *dev, size_t size);
int tacc_bo_create_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_bo_info_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_bo_get_sgt(struct tacc_bo *bo, struct sg_table **sgt);
int tacc_devmem_init(struct tacc_device *tdev);
bool tacc_devmem_virtio_overlaps(struct tacc_device *tdev, u64 start, u64 size);
void tacc_bo_release_dma(struct tacc_device *tdev);

/* tacc_mmu.c */
int tacc_vm_init(struct tacc_device *tdev, struct tacc_vm *vm);
void tacc_vm_fini(struct tacc_device *tdev, struct tacc_vm *vm);
void tacc_vm_release_dma(struct tacc_device *tdev, struct tacc_vm *vm);
void tacc_vm_stale_init(struct tacc_device *tdev);
void tacc_vm_defer_free(struct tacc_ctx *ctx);
void tacc_vm_stale_release(struct tacc_device *tdev);
int tacc_vm_bind(struct tacc_ctx *ctx, struct tacc_bo *bo, u64 va, u64 bo_offset,
		 u64 size, u32 flags, u64 *out_va, u64 *out_pgsz);
void tacc_vm_unbind_locked(struct tacc_ctx *ctx, struct tacc_bo *bo);
void tacc_vm_unbind(struct tacc_ctx *ctx, struct tacc_bo *bo);
int tacc_vm_bind_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_vm_unbind_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
void tacc_vm_dump(struct seq_file *m, struct tacc_vm *vm);

/* tacc_job.c */
int tacc_queues_init(struct tacc_device *tdev);
void tacc_queues_fail(struct tacc_device *tdev, int error);
void tacc_queues_quiesce(struct tacc_device *tdev);
bool tacc_queues_wait_idle(struct tacc_device *tdev, unsigned int ms);
void tacc_queues_release_dma(struct tacc_device *tdev);
void tacc_queue_hw_setup(struct tacc_queue *q);
void tacc_queue_process_cq(struct tacc_queue *q);
int tacc_ctx_entities_init(struct tacc_ctx *ctx);
void tacc_ctx_entities_fini(struct tacc_ctx *ctx);
void tacc_ctx_seq_fini(struct tacc_ctx *ctx);
void tacc_job_handle_fault(struct tacc_device *tdev);
int tacc_submit_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_wait_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_ctx_wait_jobs(struct tacc_ctx *ctx, bool nowait, bool intr);
bool tacc_ctx_close_wait(struct tacc_ctx *ctx);
void tacc_ctx_fences_fini(struct tacc_ctx *ctx);

/* tacc_scrub.c */
int tacc_scrub_init(struct tacc_device *tdev);
void tacc_scrub_bo(struct tacc_device *tdev, struct tacc_bo *bo);
int tacc_scrub_range_sync(struct tacc_device *tdev, u64 start, u64 size);
int tacc_scrub_probe(struct tacc_device *tdev);
int tacc_scrub_drain(struct tacc_device *tdev, bool all_bos, long timeout, bool intr);
int tacc_scrub_wait_release(struct tacc_device *tdev, u32 gen, long timeout);

/* tacc_fence.c */
int tacc_fence_ctx_create(struct tacc_device *tdev);
void tacc_fence_ctx_put(struct tacc_fence_ctx *fctx);
int tacc_fence_ctx_live(struct tacc_fence_ctx *fctx);
void tacc_hw_fence_init(struct tacc_fence *fence, struct tacc_queue *q);
struct dma_fence *tacc_out_fence_alloc(void);
void tacc_out_fence_arm(struct dma_fence *f, struct tacc_device *tdev, u32 queue,
			u64 context, u64 seqno, struct dma_fence *finished);

/* tacc_irq.c */
int tacc_irq_init(struct tacc_device *tdev);

/* tacc_reset.c */
extern const struct pci_error_handlers tacc_err_handlers;
void tacc_aer_init(struct tacc_device *tdev);
void tacc_reset_init(struct tacc_device *tdev);
void tacc_reset_fini(struct tacc_device *tdev);
void tacc_reset_fatal(struct tacc_device *tdev);

/* tacc_pm.c */
extern const struct dev_pm_ops tacc_pm_ops;
void tacc_pm_init(struct tacc_device *tdev);
void tacc_pm_fini(struct tacc_device *tdev);
void tacc_counters_cache(struct tacc_device *tdev);

/* tacc_sriov.c */
int tacc_sriov_configure(struct pci_dev *pdev, int num_vfs);

extern struct pci_driver tacc_pci_driver;
void tacc_sriov_restore(struct tacc_device *tdev);
void tacc_sriov_fini(struct tacc_device *tdev);
void tacc_sriov_init(struct tacc_device *tdev);
extern const struct attribute_group tacc_sriov_policy_group;

static inline bool tacc_queue_usable(struct tacc_device *tdev, u32 q)
{
	return q < tdev->num_queues && (tdev->queue_mask & BIT(q));
}

/* tacc_sysfs.c */
extern const struct attribute_group *tacc_dev_groups[];
void tacc_sysfs_init(void);
u64 tacc_counter_read(struct tacc_device *tdev, bool global, u32 slot);

/* tacc_pmu.c */
int tacc_pmu_init(struct tacc_device *tdev);
void tacc_pmu_fini(struct tacc_device *tdev);
int tacc_pmu_module_init(void);
void tacc_pmu_module_exit(void);

/* tacc_debugfs.c */
void tacc_debugfs_init(struct drm_minor *minor);

/* tacc_netlink.c */
int tacc_genl_init(void);
void tacc_genl_fini(void);
void tacc_genl_event(struct tacc_device *tdev, u32 event, struct tacc_ctx *ctx,
		     u32 queue, u64 addr, u32 info, u64 tag, u64 seqno, gfp_t gfp);

/* tacc_ring.c: the trace ring */
int tacc_trace_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_trace_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_trace_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_trace_mmap(struct tacc_device *tdev, struct drm_file *file,
		    struct vm_area_struct *vma);
void tacc_trace_hw_setup(struct tacc_device *tdev);
void tacc_trace_release(struct tacc_device *tdev, struct drm_file *file);
void tacc_trace_release_dma(struct tacc_device *tdev);

/* tacc_ring.c: the device-side counter sampling ring */
int tacc_sample_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_sample_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_sample_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_sample_mmap(struct tacc_device *tdev, struct drm_file *file,
		     struct vm_area_struct *vma);
void tacc_sample_hw_setup(struct tacc_device *tdev);
void tacc_sample_release(struct tacc_device *tdev, struct drm_file *file);
void tacc_sample_release_dma(struct tacc_device *tdev);

/* tacc_ring.c: TLP capture */
int tacc_tlpcap_open_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_tlpcap_advance_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_tlpcap_close_ioctl(struct drm_device *dev, void *data, struct drm_file *file);
int tacc_tlpcap_mmap(struct tacc_device *tdev, struct drm_file *file,
		     struct vm_area_struct *vma);
void tacc_tlpcap_hw_setup(struct tacc_device *tdev);
void tacc_tlpcap_release(struct tacc_device *tdev, struct drm_file *file);
void tacc_tlpcap_release_dma(struct tacc_device *tdev);

/* tacc_coredump.c */
void tacc_coredump(struct tacc_device *tdev, const char *reason, struct tacc_queue *q,
		   struct tacc_job *job);

/* tacc_fdinfo.c (tacc_vshow_fdinfo: tacc_virtio.h) */
enum drm_gem_object_status tacc_gem_status(struct drm_gem_object *obj);
void tacc_show_fdinfo(struct drm_printer *p, struct drm_file *file);

#endif /* __TACC_DRV_H__ */
