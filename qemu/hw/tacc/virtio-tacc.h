/*
 * virtio-tacc: the paravirtual tacc function (docs/virtio.md).
 *
 * The backend (virtio-tacc.c) is a VirtIODevice that is, to the tacc
 * device, one more function (TACC_FN_VIRTIO) with its own queues, contexts,
 * trace ring and counters, driving the PF's engines through the scheduler
 * like the PF and the VFs.  virtio-tacc-pci.c is its virtio-pci proxy.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#ifndef HW_VIRTIO_TACC_H
#define HW_VIRTIO_TACC_H

#include "hw/virtio/virtio.h"
#include "qemu/queue.h"
#include "qemu/timer.h"
#include "tacc.h"
#include "tacc_virtio.h"

#define TYPE_VIRTIO_TACC "virtio-tacc-device"
OBJECT_DECLARE_SIMPLE_TYPE(VirtIOTacc, VIRTIO_TACC)

typedef struct VtBo VtBo;
typedef struct VtBatch VtBatch;
typedef struct VtJob VtJob;
typedef struct VtMig VtMig;

typedef QSIMPLEQ_HEAD(VtJobList, VtJob) VtJobList;

typedef struct VtBind {
    uint64_t va, size, offset;
    VtBo *bo;
    bool ro;
} VtBind;

typedef struct VtCtx {
    bool used;
    uint32_t root;              /* page-table page id of the level-0 table */
    GArray *binds;              /* VtBind */
    uint32_t inflight;          /* jobs queued or running */
    uint64_t last_seqno[TACC_VIRTIO_NUM_RINGS];
} VtCtx;

struct VirtIOTacc {
    VirtIODevice parent_obj;

    /* properties */
    TaccState *pf;
    uint64_t devmem_base, devmem_size;
    uint64_t features;          /* TACC_VIRTIO_F_* offered */

    TaccFunc func;              /* the function on the tacc device */
    VirtQueue *ctrl_vq, *submit_vq;
    MemoryRegion fences_mr, counters_mr;
    uint8_t *fences;

    VtCtx ctx[TACC_NUM_CONTEXTS];
    GHashTable *bos;            /* handle -> VtBo */
    uint32_t next_handle;
    uint32_t ents_total;        /* page-list entries of all BOs */
    uint64_t **pt;              /* page-table pages by id (0 unused) */
    uint32_t pt_used;

    VtJobList pending[TACC_VIRTIO_NUM_RINGS];     /* not yet in the FIFO */
    VtJobList inflight[TACC_VIRTIO_NUM_RINGS];    /* in the FIFO, in order */
    uint32_t next_job;
    uint32_t pending_cmds;      /* commands of the pending lists */
    QEMUBH *submit_bh;          /* takes more buffers once there is room */
    bool resetting;
    QEMUBH *reset_bh;
    Error *unplug_blocker;      /* the PF is not device_del'ed while linked */
    bool detached;              /* the PF was removed (guest eject) */
    int64_t fi_ctx_id;          /* x-fi-ctx-id (-1: off) */
    uint32_t fi_ctrl_delay_ms;  /* x-fi-ctrl-delay-ms (0: off) */
    int64_t fi_ctrl_short;      /* x-fi-ctrl-short (-1: off) */
    uint32_t fi_page_entries;   /* x-fi-page-entries: the page-entry pool */
    VirtQueueElement *ctrl_held;    /* an answer held by x-fi-ctrl-delay-ms */
    uint32_t ctrl_held_len;     /* its used length */
    QEMUTimer *ctrl_timer;      /* releases ctrl_held */
    VtMig *mig;                 /* held buffers and jobs being loaded */
};

#endif
