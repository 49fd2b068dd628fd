/*
 * tacc: emulated PCIe ML accelerator - internal definitions.
 *
 * The register-level contract is kernel/include/tacc_hw.h (shared with the
 * driver); docs/hardware.md explains it.  This header holds the device
 * model's own state.
 *
 * Split by concern (like hw/nvme):
 *   tacc-pci.c    QOM types (PF "tacc", VF "tacc-vf"), PCI config space,
 *                 SR-IOV, PM, FLR, resets, properties, ground truth
 *   tacc-regs.c   BAR0 registers, BAR2 counter block
 *   tacc-sched.c  queues, descriptor fetch, engines, arbitration, event loop
 *   tacc-exec.c   functional execution of commands (copies, GEMM, ...)
 *   tacc-ops.c    the arithmetic of compute commands (plain functions)
 *   tacc-list.c   command lists: listed-command fetch, patches, checks
 *   tacc-mmu.c    device MMU: page-table walks, TLB
 *   tacc-model.c  timing model: PCIe link, compute, device memory
 *   tacc-trace.c  trace ring, counter sampling
 *   tacc-linkpm.c link power management (ASPM L0s/L1)
 *   virtio-tacc.c the paravirtual function's backend (docs/virtio.md)
 *   virtio-tacc-pci.c  its virtio-pci proxy "virtio-tacc-pci"
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#ifndef HW_TACC_H
#define HW_TACC_H

#include "hw/pci/pci_device.h"
#include "system/dma.h"
#include "qemu/timer.h"
#include "qemu/thread.h"
#include "system/runstate.h"
#include "migration/vmstate.h"
#include "qom/object.h"
#include "tacc_hw.h"

#define TYPE_TACC       "tacc"
#define TYPE_TACC_VF    "tacc-vf"
#define TYPE_TACC_FUNC  "tacc-func"     /* abstract parent of both */

OBJECT_DECLARE_SIMPLE_TYPE(TaccFunc, TACC_FUNC)
OBJECT_DECLARE_SIMPLE_TYPE(TaccState, TACC)

#define TACC_NUM_FUNCS          (TACC_FN_VIRTIO + 1)   /* PF, VFs, virtio */
#define TACC_FIFO_DEPTH         256     /* fetched descriptors per queue */
#define TACC_MSIX_BAR_SIZE      0x1000
#define TACC_MSIX_PBA_OFFSET    0x800
#define TACC_CHUNK_BYTES        (64 * 1024)  /* link model step */

enum { TACC_PHASE_PRE, TACC_PHASE_LINK, TACC_PHASE_POST };

#define PS_PER_NS               1000ull

/* Execution units: 6 shared engines, then one local unit per queue. */
#define TACC_UNIT_LOCAL(fn, q)  \
    (TACC_NUM_ENGINES + (fn) * TACC_NUM_QUEUES + (q))
#define TACC_NUM_UNITS          \
    (TACC_NUM_ENGINES + TACC_NUM_FUNCS * TACC_NUM_QUEUES)

enum tacc_engine_class {
    TACC_CLASS_H2D,         /* COPY_H2D, COPY_D2D */
    TACC_CLASS_D2H,         /* COPY_D2H */
    TACC_CLASS_COMPUTE,     /* GEMM, ELTWISE */
    TACC_CLASS_LOCAL,       /* NOP, FENCE, TIMESTAMP, BARRIER */
    TACC_NUM_CLASSES
};

typedef struct TaccCmd {
    struct tacc_desc d;
    uint64_t t_fetch_ps;
    uint64_t seq;               /* fetch order (device-wide): BARRIER waits */
    /* a listed command (tacc-list.c), or a LIST's end */
    bool listed;
    uint16_t preset;            /* != 0: fails with this status, runs nothing */
    uint32_t list_id;
    uint16_t list_index;        /* the LIST's index in its job */
    uint64_t fetch_ps;          /* its fetch from list memory: added to pre_ps */
    uint32_t fetch_hits, fetch_misses, fetch_walks;
    uint64_t fetch_devmem;      /* list bytes read from device memory */
    uint64_t list_start_ps;     /* LIST end: when its first command started */
} TaccCmd;

/* the hw 1.3 features every function kind has (docs/hardware.md section 14) */
#define TACC_CAP_HW13   (TACC_CAP_GEMM_EX | TACC_CAP_BF16 | TACC_CAP_NN_OPS | \
                         TACC_CAP_CMD_LIST | TACC_CAP_TRACE_V3 | TACC_CAP_ROOFLINE)
/* and the hw 1.5 ones (section 14) */
#define TACC_CAP_HW15   TACC_CAP_NORM_STATS

#define TACC_GEMM_THREAD_MNK    (1ull << 21)   /* bigger GEMMs: thread pool */

/*
 * A GEMM's staging and result.  A big one is computed on QEMU's thread pool
 * (tacc-exec.c): from submission until its completion callback has run
 * (in_pool), only the worker touches A, B, C and bias, and only the
 * completion callback frees the job.
 */
typedef struct TaccGemmJob {
    uint64_t m, n, k, lda, ldb, ldc;    /* lda, ldb: of the packed A, B */
    uint64_t batch;
    bool trans_a, trans_b, shared_b;
    float alpha, beta;
    float *A, *B, *C;           /* packed fp32: batch x (A, B, C m x n) */
    float *bias;                /* n, or NULL */
    bool in_pool;               /* submitted, completion callback not run */
    bool cancel;                /* atomic: an aborted job stops at next batch */
    TaccState *s;               /* owner; NULL once the device is gone */
    struct TaccGemmJob *next;   /* TaccState.orphans */
    int fn;                     /* charged to gemm_host_bytes[fn] ... */
    uint64_t host_bytes;        /* ... this many bytes, until freed */
} TaccGemmJob;

/* What executing one command did: filled by tacc-exec.c. */
enum { TACC_LINK_NONE, TACC_LINK_H2D, TACC_LINK_D2H };

/* Link traffic of a transfer (or part of one), per direction: 0 down, 1 up. */
typedef struct TaccLinkCount {
    uint64_t tlps[2];           /* TLPs (H2D: completions down, requests up) */
    uint64_t dllp[2];           /* ACK / UpdateFC DLLPs */
    uint64_t bytes[2];          /* link bytes: payload, TLP overhead, DLLPs */
} TaccLinkCount;

typedef struct TaccResult {
    uint16_t status;
    uint64_t bytes;             /* payload bytes (trace record) */
    uint64_t h2d_bytes, d2h_bytes;      /* link payload by direction */
    uint64_t h2d_tlps, d2h_tlps;        /* payload TLPs by direction */
    uint64_t h2d_link, d2h_link;        /* link bytes incl. overhead */
    uint64_t req_tlps;                  /* read requests (upstream) */
    uint64_t dllp_bytes[2];             /* DLLP bytes in h2d_link, d2h_link */
    uint64_t devmem_rd, devmem_wr;
    uint64_t flops;
    bool bf16;                  /* bf16 operands (flops_bf16) */
    uint64_t ideal_ps;          /* roofline term: compute_ideal_ticks */
    uint32_t tlb_hits, tlb_misses, walk_reads;
    bool fault;
    /* timing: pre_ps, then link_payload bytes of link_kind, then post_ps */
    uint64_t pre_ps;
    int link_kind;
    uint64_t link_payload;
    uint32_t link_host_off, link_dev_off;  /* start offsets modulo 4 KiB */
    bool land;                          /* a host copy: data lands per step */
    uint64_t land_pos, land_len;        /* landed so far, and still to land */
    uint64_t post_ps;
    /* deferred 8-byte write at completion (fence, timestamp) */
    bool post_write;
    bool post_write_devmem;
    uint64_t post_addr;
    uint64_t post_value;
    TaccGemmJob *gemm;          /* GEMM result to write back at completion */
    /* host work left after dispatch (a big copy/eltwise): tacc_exec_continue */
    int work;                   /* TACC_WORK_* */
    /*
     * work_phase: eltwise read A, read B, compute, write C; GEMM gather A,
     * B, C, bias, probe C.  work_pos: copy, FILL: bytes done; eltwise: bytes
     * of the phase; GEMM: rows done in the phase.
     */
    int work_phase;
    uint64_t work_pos;
    uint64_t work_start_ps;
    uint8_t *work_buf;          /* copy bounce buffer, row-op scratch */
    uint64_t work_buf_len;      /* row ops: bytes of work_buf */
    float *work_a, *work_b;     /* eltwise operands */
} TaccResult;

enum {
    TACC_WORK_NONE, TACC_WORK_COPY, TACC_WORK_ELT, TACC_WORK_FILL,
    TACC_WORK_GEMM, TACC_WORK_ROWS,
};

typedef struct TaccUnit {
    bool busy;
    int fn, q;
    int engine;                 /* engine id for traces (or LOCAL) */
    TaccCmd cmd;
    TaccResult res;
    uint64_t start_ps;          /* dispatch time */
    uint64_t next_ps;           /* next event: a link step, or the end */
    int phase;                  /* TACC_PHASE_* */
    uint64_t link_left;         /* payload bytes still to move */
    uint64_t stall_ps;
} TaccUnit;

typedef struct TaccQueue {
    uint64_t sq_base, cq_base;
    uint32_t sq_size, cq_size;
    uint32_t sq_tail, sq_head;
    uint32_t cq_head, cq_tail;
    uint32_t ctrl, status;
    TaccCmd fifo[TACC_FIFO_DEPTH];
    uint32_t f_head, f_count;
    bool running;               /* head command is on a unit */
    bool skipping;              /* skip to the job's F_LAST after an error */
    bool job_open;
    uint64_t job_start_ps;
    uint64_t ready_ps;          /* earliest start of the next command */
    bool cqe_pending;           /* CQ full: waiting for CQ_HEAD */
    struct tacc_cqe pending_cqe;
    bool pending_irq;
    /* the LIST at the FIFO head being executed (tacc-list.c) */
    bool list_on;
    bool list_cur_ok;           /* list_cur holds command list_pos */
    bool list_end;              /* its commands are done: the LIST ends */
    uint32_t list_pos, list_patch;
    uint16_t list_status;
    uint64_t list_start_ps;
    TaccCmd list_cur;
} TaccQueue;

typedef struct TaccTlbEntry {
    bool valid;
    uint8_t fn;
    uint16_t ctx;
    uint8_t shift;              /* 12 or 21 */
    uint64_t vpn;               /* va >> shift */
    uint64_t pte;               /* leaf PTE */
    uint64_t lru;
} TaccTlbEntry;

/*
 * A function that is not a PCI function of this device (virtio-tacc: its
 * PCIDevice part is unused) reaches memory, interrupts and its queues'
 * input and output through these hooks; NULL for the PF and the VFs.
 */
typedef struct TaccFuncOps {
    AddressSpace *(*dma_as)(TaccFunc *f);
    bool (*active)(TaccFunc *f);
    void (*notify)(TaccFunc *f, unsigned vector);
    void (*fetch)(TaccFunc *f, int q, uint64_t t_ps);      /* fill the FIFO */
    void (*complete)(TaccFunc *f, int q, const struct tacc_cqe *cqe);
    bool (*pt_read)(TaccFunc *f, uint64_t addr, uint64_t *pte);
    void (*queue_reset)(TaccFunc *f, int q);   /* its FIFO was emptied */
    uint16_t (*requester_id)(TaccFunc *f);     /* its DMA's, on the PF's link */
} TaccFuncOps;

struct TaccFunc {
    PCIDevice parent_obj;

    TaccState *pf;
    const TaccFuncOps *ops;     /* NULL: a PCI function (PF, VF) */
    int fn;                     /* 0 = PF, 1.. = VF number + 1 */
    MemoryRegion bar0, bar2, bar4;

    uint32_t ctrl, status_fatal, irq_status, irq_mask, scratch;
    uint64_t ptbr[TACC_NUM_CONTEXTS];
    uint64_t fault_addr, fault_tag;
    uint32_t fault_info;
    uint32_t clk_latch[2];      /* HI latched by LO reads: DEVCLK, HOSTCLK */
    uint32_t tlb_inv_seq, tlb_inv_done;

    uint64_t trace_base, trace_wb;
    uint32_t trace_size, trace_ctrl, trace_prod, trace_cons, trace_dropped;
    uint32_t trace_seq;

    uint64_t sample_base, sample_wb, sample_seq;
    uint32_t sample_size, sample_period, sample_prod, sample_cons;
    uint32_t sample_dropped;
    QEMUTimer sample_timer;

    TaccQueue q[TACC_NUM_QUEUES];
    uint64_t cnt[TACC_SAMPLE_SLOTS];    /* counter page 0 */
    uint64_t busy_ps[TACC_NUM_ENGINES];
    uint64_t stall_ps;
    uint8_t rr_queue[TACC_NUM_CLASSES];

    int64_t mig_sample_dev;     /* migration: sample deadline, device ns */
};

/* What a TLP capture needs of a transfer (tacc-tlpcap.c). */
typedef struct TaccTlpSrc {
    TaccFunc *f;
    int q;
    const TaccCmd *cmd;         /* NULL: control traffic */
    bool bus;                   /* host is a bus address, else a device VA */
    uint64_t host;              /* host side at payload offset 0 */
    uint64_t dev_off;           /* device side at payload offset 0 (writes) */
    uint64_t len;               /* the whole transfer */
    uint64_t page_va, page_bus; /* translation cache: page VA + 1, bus addr */
} TaccTlpSrc;

/* ASPM counters of the link (tacc-linkpm.c), ps */
typedef struct TaccLinkPm {
    uint64_t l0s_entries, l0s_exits, l0s_ps;
    uint64_t l1_entries, l1_exits, l1_ps;
    uint64_t exit_ps;           /* exit latency paid */
    uint64_t l11_entries, l11_exits, l11_ps;   /* L1 PM Substates, within L1 */
    uint64_t l12_entries, l12_exits, l12_ps;
    int state;                  /* TACC_LINKPM_* (a view's) */
    int sub;                    /* TACC_LINKPM_L1_* in L1 (a view's) */
} TaccLinkPm;

/*
 * A pool of posted credits as a rate (tacc_link_posted): its theoretical
 * return time tat_ps + tat_rem / pool picoseconds.
 */
typedef struct TaccPostedPool {
    uint64_t tat_ps, tat_rem;
} TaccPostedPool;

/* Dirty-page log of one VF (tacc-vfmig.c) */
typedef struct TaccDirtyLog {
    bool on;
    uint64_t iova, len;         /* the logged range */
    uint32_t shift;             /* log2 of the page size */
    unsigned long *bmap;        /* bit per page of the range */
} TaccDirtyLog;

/*
 * A VF migration SAVE or LOAD in progress (tacc-vfmig.c): host work done one
 * x-host-slice per main-loop turn from vfmig_bh while VFMIG_STATUS reads BUSY.
 */
typedef struct TaccVfmigJob {
    uint8_t op;                 /* 0 (none), TACC_VFMIG_OP_SAVE or _LOAD */
    uint8_t fn;                 /* the VF */
    bool apply;                 /* LOAD: checked; copying the window in */
    uint64_t base, wsize;       /* the VF's window when the operation began */
    uint64_t addr, len;         /* the buffer (PF DMA) */
    uint64_t pos;               /* bytes of the current stage done */
    uint64_t rlen;              /* the registers part's bytes */
    uint32_t crc;               /* CRC-32 so far */
    uint8_t *blob;              /* LOAD: the blob as read */
    struct tacc_vfstate_hdr hdr;        /* SAVE: the header, written last */
} TaccVfmigJob;

typedef struct TaccGroundTruth {
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t h2d_link_bytes, d2h_link_bytes;
    uint64_t busy_ps[TACC_NUM_ENGINES];
    uint64_t trace_records, trace_dropped;
    uint64_t cmds, jobs, faults, dma_errors, irqs;
    uint64_t flops;
} TaccGroundTruth;

struct TaccState {
    TaccFunc func;

    /* properties */
    uint64_t devmem_size;
    uint8_t link_gen, link_width;       /* capable */
    uint8_t lnk_gen, lnk_width;         /* negotiated now (x-link-*-now) */
    uint32_t mps_cap, mrrs_cap;         /* supported (properties), presets */
    uint32_t mps, mrrs;         /* in use: Device Control's, up to the above */
    uint32_t rcb;               /* root port's read completion boundary */
    uint32_t tags;              /* outstanding read requests */
    uint32_t posted_credits;    /* root port's posted data credits (16 B) */
    uint32_t posted_hdr_credits;        /* ... and posted header credits */
    bool link_ctrl_cost;        /* control traffic reserves link time */
    uint32_t aspm_l0s_entry_ns, aspm_l0s_exit_ns;      /* ASPM (linkpm) */
    uint32_t aspm_l1_entry_ns, aspm_l1_exit_ns;
    bool l1ss;                  /* L1 PM Substates capability (linkpm) */
    uint8_t l1ss_cm_restore_us;
    uint32_t l1ss_t_power_on_us, aspm_l11_exit_ns, ltr_ns;
    uint32_t tlb_entries;
    uint32_t time_scale;        /* x 1000 */
    uint32_t cmd_latency_ns, read_latency_ns, write_latency_ns;
    uint32_t walk_latency_ns;
    uint32_t compute_gflops, devmem_gbps;
    uint32_t bf16_gflops;
    uint8_t total_vfs;

    /* fault injection (qom-set at run time) */
    int32_t fi_hang_engine;
    bool fi_fail_next_dma;
    bool fi_corrupt_next_cqe;
    bool fi_fatal;
    bool fi_tlb_inv_stall;    /* TLB_INV neither invalidates nor completes */

    MemoryRegion devmem_mr;     /* device memory: migratable RAM */
    uint8_t *devmem;            /* its host pointer */
    uint64_t vf_mem_base[TACC_MAX_VFS], vf_mem_size[TACC_MAX_VFS];
    TaccFunc *virtio;           /* attached virtio-tacc function, or NULL */
    uint64_t virtio_mem_base, virtio_mem_size;
    uint64_t virtio_mem_reset[2];       /* its properties: base, size */
    bool (*virtio_window_busy)(TaccFunc *f);   /* device BOs exist */
    void (*virtio_detach)(TaccFunc *f);        /* the PF goes away */
    uint32_t arb_weight[TACC_NUM_FUNCS];
    uint32_t vf_queue_mask[TACC_MAX_VFS];      /* TACC_REG_VF_QUEUE_MASK */

    TaccTlbEntry *tlb;
    uint64_t tlb_clock;

    TaccUnit unit[TACC_NUM_UNITS];
    uint64_t ev_ps;             /* time of the event the model processes */
    uint64_t link_free_ps[2];   /* 0 = down (H2D), 1 = up (D2H) */
    uint64_t link_busy_ps[2];
    TaccPostedPool ph_pool, pd_pool;    /* posted credits (tacc-model.c) */
    TaccLinkPm lpm;             /* ASPM state machine (tacc-linkpm.c) */
    uint64_t lpm_last_ps;       /* end of the link's last TLP */
    uint64_t lpm_wake_ps;       /* link usable again (after an exit) */
    uint64_t lpm_fetch_ps;      /* descriptors ready then (0: none) */
    uint64_t gcnt[TACC_SAMPLE_SLOTS];   /* counter page 1 */
    uint64_t cnt_gen;
    uint8_t rr_fn[TACC_NUM_CLASSES];
    uint64_t deficit[TACC_NUM_CLASSES][TACC_NUM_FUNCS];  /* bytes, DRR */
    QEMUTimer timer;
    bool in_run;

    TaccGroundTruth gt;

    /* TLP capture (tacc-tlpcap.c, PF registers 0x600-0x6ff) */
    uint64_t tc_base, tc_wb, tc_addr_lo, tc_addr_hi;
    uint32_t tc_size, tc_ctrl, tc_prod, tc_cons, tc_dropped, tc_seq;
    uint32_t tc_funcs, tc_kinds, tc_nbuf;
    uint16_t tc_tag[TACC_NUM_FUNCS];
    struct tacc_tlp_rec tc_buf[64];

    /* re-entrancy guard (tacc_enter): device entry points now active */
    uint32_t depth;
    /*
     * Host work per device entry (x-worst-turn-ns): the entering thread's
     * CPU time at the outermost tacc_enter, the longest entry and the sum.
     */
    int64_t turn_cpu_t0;
    const char *turn_what;
    uint64_t worst_turn_ns;
    uint64_t entry_cpu_ns;      /* all entries' CPU time (x-entry-cpu-ns) */
    uint32_t dma_depth;         /* inside one of its own DMAs / MSI-X writes */
    uint32_t reset_pending;     /* bit fn: a reset deferred to reset_bh */
    QEMUBH *reset_bh;
    uint64_t config_dma_refused;        /* DMA/MSI-X aimed at ECAM */
    uint64_t reentrant_refused;
    uint64_t fetch_seq;
    TaccGemmJob *orphans;       /* aborted GEMMs still in the thread pool */

    /*
     * Host work the model waits for (tacc-sched.c "host work"): a unit whose
     * big copy/eltwise is still being moved (in host_slice-byte slices, one
     * per main-loop turn, from host_bh), or whose GEMM worker has not
     * finished at its completion time.  Modelled time stops at host_t.
     */
    TaccUnit *host_unit;
    bool host_gemm;
    uint64_t host_t;
    QEMUBH *host_bh;
    uint64_t host_slice;
    /*
     * Host memory of GEMM operand staging (packed fp32 A, B, C, bias) held
     * per function, from dispatch until the job is freed; a GEMM that would
     * take a function beyond gemm_host_max ends with BAD_LENGTH.
     */
    uint64_t gemm_host_max;
    uint64_t gemm_host_bytes[TACC_NUM_FUNCS];

    /*
     * Device time: QEMU's virtual clock plus dev_clock_off, which is 0 until
     * an incoming migration sets it so that device time goes on from the
     * saved value whatever the destination's clock reads (tacc-vmstate.c).
     */
    int64_t dev_clock_off;
    int64_t mig_dev_ns;         /* migration: device time at save */
    int64_t mig_timer_dev;      /* migration: scheduler deadline, or -1 */
    bool mig_reclock;           /* loaded: reclock when the VM runs */
    VMChangeStateEntry *vmse;   /* stopping quiesces host work */
    /* VM_PAUSED_NS (hw 1.7): host ns stopped; when this stop began (0: none) */
    uint64_t vm_paused_ns;
    int64_t vm_stop_host_ns;
    /* VF migration (tacc-vfmig.c, PF registers 0x900-0x97f) */
    uint64_t vfmig_addr, vfmig_len, vfmig_result;
    uint64_t vfmig_log_iova, vfmig_log_len;
    uint32_t vfmig_cmd, vfmig_status, vfmig_log_shift;
    TaccVfmigJob vfmig_job;
    QEMUBH *vfmig_bh;
    bool vf_stopped[TACC_MAX_VFS];      /* STOP until RESUME */
    TaccDirtyLog vf_log[TACC_MAX_VFS];
};

/* tacc-pci.c */
int64_t tacc_dev_ns(TaccState *s);
void tacc_quiesce(TaccState *s);
void tacc_vmstate_reclock(TaccState *s);   /* the loaded VM starts running */
TaccFunc *tacc_func(TaccState *s, int fn);     /* NULL if not enabled */
void tacc_func_reset(TaccFunc *f);
void tacc_irq_cause(TaccFunc *f, uint32_t cause);
void tacc_irq_fire(TaccFunc *f, uint32_t causes);
bool tacc_enter(TaccState *s, TaccFunc *f, const char *what);
void tacc_leave(TaccState *s);
void tacc_msix_notify(TaccFunc *f, unsigned vector);
bool tacc_func_active(TaccFunc *f);
uint64_t tacc_now_ps(TaccState *s);
void tacc_window(TaccFunc *f, uint64_t *base, uint64_t *size);
AddressSpace *tacc_func_as(TaccFunc *f);
MemTxResult tacc_func_dma(TaccFunc *f, uint64_t addr, void *buf, uint64_t len,
                          bool write);
uint32_t tacc_queue_mask(TaccFunc *f);
void tacc_policy_reset(TaccState *s, bool masks);

/* tacc-vmstate.c */
extern const VMStateDescription tacc_vmstate_pf;
extern const VMStateDescription tacc_vmstate_vf;
extern const VMStateDescription tacc_vmstate_func_regs;
bool tacc_vmstate_func_loaded(TaccFunc *f);
size_t tacc_vmstate_func_save_buf(TaccFunc *f, uint8_t **out);
int tacc_vmstate_func_load_buf(TaccFunc *f, const uint8_t *buf, size_t len);

/* tacc-regs.c */
extern const MemoryRegionOps tacc_bar0_ops;
extern const MemoryRegionOps tacc_bar2_ops;
void tacc_counters_begin(TaccState *s);
void tacc_counters_end(TaccState *s);

/* tacc-sched.c */
void tacc_sched_run(TaccState *s);
void tacc_sched_poll(TaccState *s);
void tacc_sched_timer(void *opaque);
void tacc_queue_doorbell(TaccFunc *f, int q, uint32_t tail);
void tacc_queue_doorbell_at(TaccFunc *f, int q, uint32_t tail, uint64_t t);
bool tacc_host_pending(TaccState *s);
void tacc_queue_ctrl(TaccFunc *f, int q, uint32_t val);
void tacc_queue_cq_head(TaccFunc *f, int q, uint32_t head);
void tacc_queue_reset(TaccFunc *f, int q);
bool tacc_fifo_push(TaccFunc *f, int q, const struct tacc_desc *d,
                    uint64_t t_ps);
void tacc_func_abort_all(TaccFunc *f);
void tacc_func_kick(TaccFunc *f);
uint32_t tacc_queue_status(TaccFunc *f, int q);
bool tacc_func_idle(TaccFunc *f);

/* tacc-exec.c */
enum tacc_engine_class tacc_op_class(uint8_t opcode);
enum tacc_engine_class tacc_cmd_class(const TaccCmd *c);
bool tacc_desc_hw13(const struct tacc_desc *d);
uint16_t tacc_exec_read(TaccFunc *f, int q, TaccCmd *c, uint64_t va,
                        void *buf, uint64_t len, TaccResult *res);

/* tacc-list.c */
TaccCmd *tacc_list_head(TaccFunc *f, int qi, uint64_t t);
bool tacc_list_step(TaccFunc *f, int qi, const TaccCmd *c, uint16_t status);
void tacc_list_reset(TaccQueue *q);

/* tacc-ops.c: arithmetic, no device state (main loop or a worker) */
size_t tacc_dtype_size(unsigned dt);
float tacc_bf16_to_f32(uint16_t h);
uint16_t tacc_f32_to_bf16(float f);
void tacc_widen(const void *src, unsigned dt, float *dst, size_t n);
void tacc_narrow(const float *src, unsigned dt, void *dst, size_t n);
void tacc_ops_gemm(TaccGemmJob *j);
uint64_t tacc_elt_flops_per(unsigned op);
void tacc_ops_eltwise(unsigned op, float *a, const float *b, size_t bcols,
                      size_t from, size_t to, float scalar);
void tacc_ops_softmax(float *x, size_t r0, size_t r1, size_t cols,
                      float scale, bool causal, uint64_t pos, uint64_t period);
void tacc_ops_norm(float *x, size_t rows, size_t cols, unsigned kind,
                   const float *gamma, const float *beta, float eps,
                   float *mean_out, float *inv_out);
void tacc_exec(TaccFunc *f, int q, TaccCmd *cmd, uint64_t start_ps,
               TaccResult *res);
bool tacc_exec_continue(TaccFunc *f, int q, TaccCmd *c, TaccResult *res,
                        uint64_t budget);
void tacc_exec_drop(TaccResult *res);
bool tacc_copy_land(TaccFunc *f, int q, TaccCmd *c, TaccResult *res);
void tacc_host_bh(void *opaque);
uint16_t tacc_gemm_finish(TaccFunc *f, int q, TaccCmd *c, TaccResult *res);
void tacc_gemm_job_free(TaccState *s, TaccGemmJob *j);
bool tacc_gemm_busy(TaccState *s);
MemTxResult tacc_dma_read(TaccFunc *f, uint64_t iova, void *buf, uint64_t len);
MemTxResult tacc_dma_write(TaccFunc *f, uint64_t iova, const void *buf,
                           uint64_t len);

/* tacc-mmu.c */
typedef struct TaccXlate {
    uint64_t addr;              /* IOVA or device-memory window offset */
    uint64_t page_left;         /* bytes to the end of the page */
    bool devmem;
    bool writable;
} TaccXlate;
int tacc_mmu_translate(TaccFunc *f, unsigned ctx, uint64_t va,
                       TaccXlate *x, TaccResult *res);
void tacc_tlb_invalidate(TaccState *s, int fn, int ctx);   /* ctx -1: all */

/* tacc-model.c */
uint64_t tacc_link_ps(TaccState *s, uint64_t bytes);
uint64_t tacc_scale_ps(TaccState *s, uint64_t ps);
uint64_t tacc_link_tlps(TaccState *s, uint64_t len, uint64_t host_off,
                        uint64_t dev_off);
uint64_t tacc_link_reqs(TaccState *s, uint64_t len, uint64_t host_off);
uint64_t tacc_link_cpls(TaccState *s, uint64_t len, uint64_t host_off);
void tacc_link_prefix(TaccState *s, int kind, uint64_t len, uint64_t host_off,
                      uint64_t dev_off, TaccLinkCount *c);
void tacc_link_cost(TaccState *s, const TaccResult *r, uint64_t pos,
                    uint64_t len, TaccLinkCount *c);
uint64_t tacc_link_fc_ps(TaccState *s, int kind, uint64_t payload,
                         uint64_t reqs);
uint64_t tacc_link_posted(TaccState *s, uint64_t t, uint64_t tlps,
                          uint64_t payload);
uint64_t tacc_link_ctrl(TaccFunc *f, bool write, uint64_t iova,
                        uint64_t len);
uint64_t tacc_ev_ps(TaccState *s);
uint64_t tacc_compute_ps(TaccState *s, uint64_t flops, uint64_t devmem_bytes);
uint64_t tacc_roofline_ps(TaccState *s, uint64_t flops, uint64_t devmem_bytes,
                          bool bf16);
unsigned tacc_link_rate_gt(TaccState *s);

/* tacc-linkpm.c */
uint32_t tacc_lpm_enabled(TaccState *s);
void tacc_lpm_view(TaccState *s, uint64_t t, TaccLinkPm *v);
uint64_t tacc_lpm_wake(TaccState *s, uint64_t t);
void tacc_lpm_busy(TaccState *s, uint64_t end_ps);
void tacc_lpm_settle(TaccState *s, uint64_t t);
void tacc_lpm_counters(TaccState *s, uint64_t t);
bool tacc_lpm_reg_read(TaccState *s, hwaddr addr, unsigned size,
                       uint64_t *val);
void tacc_lpm_reset(TaccState *s);
void tacc_lpm_init_cap(TaccState *s, PCIDevice *pdev);
bool tacc_lpm_init_l1ss(TaccState *s, PCIDevice *pdev, uint16_t offset,
                        Error **errp);
uint32_t tacc_lpm_config_write(TaccState *s, PCIDevice *pdev, uint32_t addr,
                               int len);
void tacc_lpm_config_written(TaccState *s, PCIDevice *pdev, uint32_t addr,
                             int len, uint32_t old_ctl1);
void tacc_lpm_reset_l1ss(PCIDevice *pdev);
void tacc_link_fault_props(Object *obj);

/* tacc-tlpcap.c */
bool tacc_tlpcap_wanted(TaccState *s, TaccFunc *f, bool ctrl);
void tacc_tlpcap_read(TaccState *s, TaccTlpSrc *t, uint64_t pos, uint64_t c,
                      uint64_t t_ps);
void tacc_tlpcap_write(TaccState *s, TaccTlpSrc *t, uint64_t pos, uint64_t c,
                       uint64_t t_ps);
bool tacc_tlpcap_reg_write(TaccState *s, hwaddr addr, uint64_t val,
                           unsigned size);
bool tacc_tlpcap_reg_read(TaccState *s, hwaddr addr, unsigned size,
                          uint64_t *val);
void tacc_tlpcap_reset(TaccState *s);

/* tacc-vfmig.c */
bool tacc_vfmig_stopped(TaccFunc *f);
void tacc_vfmig_dirty(TaccFunc *f, uint64_t addr, uint64_t len);
bool tacc_vfmig_busy(TaccState *s);
void tacc_vfmig_reset(TaccState *s);
void tacc_vfmig_bh(void *opaque);
void tacc_vfmig_vf_gone(TaccState *s, int fn);
bool tacc_vfmig_reg_write(TaccState *s, hwaddr addr, uint64_t val,
                          unsigned size);
bool tacc_vfmig_reg_read(TaccState *s, hwaddr addr, unsigned size,
                         uint64_t *val);

/* tacc-trace.c */
void tacc_trace_record(TaccFunc *f, TaccUnit *u, uint64_t end_ps);
void tacc_trace_put(TaccFunc *f, struct tacc_trace_rec *r);
void tacc_trace_put3(TaccFunc *f, struct tacc_trace_rec3 *r);
void tacc_sample_rearm(TaccFunc *f);
void tacc_sample_timer(void *opaque);
void tacc_ring_wb(TaccFunc *f, uint64_t wb, uint32_t prod, uint32_t dropped);

#endif
