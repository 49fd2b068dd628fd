/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR MIT) */
/*
 * tacc_accel.h - ioctl ABI of the tacc DRM accel driver (/dev/accel/accelN).
 *
 * Usable from user space without <drm/drm.h>: the few DRM core definitions
 * needed are provided below when the kernel's DRM uAPI header is absent.
 * Every structure has fixed-size fields, naturally aligned, with explicit
 * padding; padding and reserved fields must be zero on input.
 * docs/uapi.md documents semantics and every errno.
 */
#ifndef _UAPI_TACC_ACCEL_H_
#define _UAPI_TACC_ACCEL_H_

#include <linux/types.h>
#include <linux/ioctl.h>

#if defined(__KERNEL__)
#include <drm/drm.h>
#endif

#if defined(__cplusplus)
extern "C" {
#endif

#ifndef DRM_IOCTL_BASE
#define DRM_IOCTL_BASE			'd'
#endif
#ifndef DRM_COMMAND_BASE
#define DRM_COMMAND_BASE		0x40
#endif

/**
 * DRM_TACC_API_VERSION - bumped on every additive ABI change.
 *
 * 2: DRM_TACC_VM_UNBIND_NOWAIT; VM_UNBIND (and GEM_CLOSE of a bound BO)
 *    waits for the context's jobs submitted before it.
 * 4: struct drm_tacc_cmd2 (SUBMIT cmd_size 256): the hw 1.3 operations
 *    and command lists; DRM_TACC_TRACE_F_V3 (128-byte trace records).
 */
#define DRM_TACC_API_VERSION		4

/* Driver ioctl numbers, relative to DRM_COMMAND_BASE. */
#define DRM_TACC_GET_PARAM		0x00
#define DRM_TACC_BO_CREATE		0x01
#define DRM_TACC_BO_INFO		0x02
#define DRM_TACC_VM_BIND		0x03
#define DRM_TACC_VM_UNBIND		0x04
#define DRM_TACC_SUBMIT			0x05
#define DRM_TACC_WAIT			0x06
#define DRM_TACC_TRACE_OPEN		0x07
#define DRM_TACC_TRACE_ADVANCE		0x08
#define DRM_TACC_TRACE_CLOSE		0x09
#define DRM_TACC_SAMPLE_OPEN		0x0a
#define DRM_TACC_SAMPLE_ADVANCE		0x0b
#define DRM_TACC_SAMPLE_CLOSE		0x0c
#define DRM_TACC_TLPCAP_OPEN		0x0d
#define DRM_TACC_TLPCAP_ADVANCE		0x0e
#define DRM_TACC_TLPCAP_CLOSE		0x0f

/* ------------------------------------------------------------ params ---- */
enum drm_tacc_param {
	DRM_TACC_PARAM_API_VERSION = 0,		/* DRM_TACC_API_VERSION */
	DRM_TACC_PARAM_HW_VERSION = 1,		/* major << 16 | minor */
	DRM_TACC_PARAM_CAPS = 2,		/* TACC_CAP_* of the function */
	DRM_TACC_PARAM_FUNC = 3,		/* 0 = PF, n = VF n */
	DRM_TACC_PARAM_NUM_QUEUES = 4,
	DRM_TACC_PARAM_NUM_CONTEXTS = 5,
	DRM_TACC_PARAM_NUM_ENGINES = 6,
	DRM_TACC_PARAM_DEVMEM_SIZE = 7,		/* bytes usable by this function */
	DRM_TACC_PARAM_CLOCK_HZ = 8,		/* device clock rate */
	DRM_TACC_PARAM_CONTEXT_ID = 9,		/* hardware context of this file */
	DRM_TACC_PARAM_COUNTERS_MMAP_OFFSET = 10,
	DRM_TACC_PARAM_COUNTERS_MMAP_SIZE = 11,	/* VF 4096; PF 8192 (CAP_PERFMON) or 0 */
	DRM_TACC_PARAM_MAX_CMDS = 12,		/* commands per submit */
	DRM_TACC_PARAM_MAX_INFLIGHT = 13,	/* jobs per file and queue */
	DRM_TACC_PARAM_VA_START = 14,
	DRM_TACC_PARAM_VA_END = 15,		/* exclusive */
	DRM_TACC_PARAM_CTX_FAULTS = 16,		/* MMU faults of this context */
	DRM_TACC_PARAM_CTX_FAULT_ADDR = 17,	/* last faulting device VA */
	DRM_TACC_PARAM_DEVCLK = 18,		/* device clock now (wakes the device) */
	DRM_TACC_PARAM_QUEUE_SIZE = 19,		/* SQ entries of queue @index */
	DRM_TACC_PARAM_LAST_SEQNO = 20,		/* last seqno returned by SUBMIT */
	DRM_TACC_PARAM_CTX_RESETS = 21,		/* timed-out jobs of this context */
	DRM_TACC_PARAM_TRACE_MMAP_OFFSET = 22,
	DRM_TACC_PARAM_DEVMEM_FREE = 23,	/* bytes not allocated */
	DRM_TACC_PARAM_FUNC_KIND = 24,		/* enum drm_tacc_func_kind (uAPI 3) */
	DRM_TACC_PARAM_COUNT
};

/**
 * enum drm_tacc_func_kind - DRM_TACC_PARAM_FUNC_KIND: what kind of function
 * the node drives (uAPI 3).  The same ioctls work on every kind; a virtio
 * node answers -EOPNOTSUPP to the parameters and ioctls it does not provide
 * (docs/uapi.md, "virtio-tacc nodes").
 * @DRM_TACC_FUNC_KIND_PF: a physical function (tacc.ko's PCI driver).
 * @DRM_TACC_FUNC_KIND_VF: an SR-IOV virtual function (tacc.ko's PCI driver).
 * @DRM_TACC_FUNC_KIND_VIRTIO: the paravirtual virtio-tacc function
 *                             (tacc.ko's virtio driver, docs/virtio.md).
 */
enum drm_tacc_func_kind {
	DRM_TACC_FUNC_KIND_PF = 0,
	DRM_TACC_FUNC_KIND_VF = 1,
	DRM_TACC_FUNC_KIND_VIRTIO = 2,
};

/**
 * struct drm_tacc_get_param - DRM_IOCTL_TACC_GET_PARAM argument.
 * @param: enum drm_tacc_param.
 * @index: queue index for per-queue parameters, else 0.
 * @value: out: the value.
 */
struct drm_tacc_get_param {
	__u32 param;
	__u32 index;
	__u64 value;
};

/* ------------------------------------------------------- buffer objects ---- */
enum drm_tacc_bo_type {
	DRM_TACC_BO_HOST = 0,		/* shmem host memory, mmap-able */
	DRM_TACC_BO_DEVICE = 1,		/* device memory, not CPU visible */
	DRM_TACC_BO_USERPTR = 2,	/* existing user memory, pinned */
	DRM_TACC_BO_TYPE_COUNT
};

#define DRM_TACC_BO_F_NO_BIND		(1u << 0)	/* no automatic VM binding */
#define DRM_TACC_BO_F_READONLY		(1u << 1)	/* device may only read */
#define DRM_TACC_BO_F_ALL		(DRM_TACC_BO_F_NO_BIND | DRM_TACC_BO_F_READONLY)

/**
 * struct drm_tacc_bo_create - DRM_IOCTL_TACC_BO_CREATE argument.
 * @size: bytes; rounded up to 4 KiB (HOST, DEVICE); page multiple (USERPTR).
 * @userptr: USERPTR only: page-aligned user address, else 0.
 * @type: enum drm_tacc_bo_type.
 * @flags: DRM_TACC_BO_F_*.
 * @handle: out: GEM handle.
 * @pad: must be 0.
 * @va: out: device virtual address of the automatic binding, 0 with
 *      DRM_TACC_BO_F_NO_BIND.
 */
struct drm_tacc_bo_create {
	__u64 size;
	__u64 userptr;
	__u32 type;
	__u32 flags;
	__u32 handle;
	__u32 pad;
	__u64 va;
};

/**
 * struct drm_tacc_bo_info - DRM_IOCTL_TACC_BO_INFO argument.
 * @handle: GEM handle.
 * @pad: must be 0.
 * @mmap_offset: out: fake offset for mmap() of the DRM fd; 0 if the BO
 *               cannot be mapped by the CPU (DEVICE, USERPTR).
 * @va: out: device VA of the BO's binding in this file's VM, 0 if unbound.
 * @size: out: size in bytes.
 * @bound_size: out: bytes of the BO covered by the binding.
 * @type: out: enum drm_tacc_bo_type.
 * @flags: out: DRM_TACC_BO_F_* given at creation.
 */
struct drm_tacc_bo_info {
	__u32 handle;
	__u32 pad;
	__u64 mmap_offset;
	__u64 va;
	__u64 size;
	__u64 bound_size;
	__u32 type;
	__u32 flags;
};

#define DRM_TACC_BIND_F_FIXED		(1u << 0)	/* use @va, else the driver picks */
#define DRM_TACC_BIND_F_READONLY	(1u << 1)	/* map without device write */
#define DRM_TACC_BIND_F_ALL		(DRM_TACC_BIND_F_FIXED | DRM_TACC_BIND_F_READONLY)

/**
 * struct drm_tacc_vm_bind - DRM_IOCTL_TACC_VM_BIND argument.
 *
 * Binds [@bo_offset, @bo_offset + @size) of a BO into the file's device
 * address space.  A BO has at most one binding per file.
 *
 * @handle: GEM handle.
 * @flags: DRM_TACC_BIND_F_*.
 * @va: in with DRM_TACC_BIND_F_FIXED (4 KiB aligned), out: bound VA.
 * @bo_offset: 4 KiB aligned offset in the BO.
 * @size: bytes, 4 KiB multiple; 0 = up to the end of the BO.
 * @page_size: out: largest device page size used (4096 or 2097152).
 */
struct drm_tacc_vm_bind {
	__u32 handle;
	__u32 flags;
	__u64 va;
	__u64 bo_offset;
	__u64 size;
	__u64 page_size;
};

/* VM_UNBIND flags (API version 2) */
#define DRM_TACC_VM_UNBIND_NOWAIT	0x1u	/* bit 0: -EBUSY instead of waiting */
#define DRM_TACC_VM_UNBIND_F_ALL	DRM_TACC_VM_UNBIND_NOWAIT

/**
 * struct drm_tacc_vm_unbind - DRM_IOCTL_TACC_VM_UNBIND argument.
 *
 * The mapping is removed only once every job the context submitted before
 * this call has finished (its device VAs cannot change under a job in
 * flight).  The wait is interruptible: a signal ends it with -ERESTARTSYS
 * (-EINTR to a handler without SA_RESTART) and the binding still in place.
 * With DRM_TACC_VM_UNBIND_NOWAIT the call returns -EBUSY instead of waiting
 * while such a job is unfinished.
 *
 * @handle: GEM handle whose binding is removed.
 * @flags: DRM_TACC_VM_UNBIND_*.
 */
struct drm_tacc_vm_unbind {
	__u32 handle;
	__u32 flags;
};

/* -------------------------------------------------------------- submit ---- */
/* Opcodes: the device's (enum tacc_opcode in tacc_hw.h), repeated as ABI. */
#define DRM_TACC_OP_NOP			0
#define DRM_TACC_OP_COPY_H2D		1
#define DRM_TACC_OP_COPY_D2H		2
#define DRM_TACC_OP_COPY_D2D		3
#define DRM_TACC_OP_GEMM		4
#define DRM_TACC_OP_ELTWISE		5
#define DRM_TACC_OP_FENCE		6
#define DRM_TACC_OP_TIMESTAMP		7
#define DRM_TACC_OP_BARRIER		8
/* hw 1.3, struct drm_tacc_cmd2 only (uAPI 4) */
#define DRM_TACC_OP_SOFTMAX		10
#define DRM_TACC_OP_NORM		11
#define DRM_TACC_OP_GATHER		12
#define DRM_TACC_OP_LIST		13

#define DRM_TACC_ELT_ADD		0
#define DRM_TACC_ELT_MUL		1
#define DRM_TACC_ELT_RELU		2
#define DRM_TACC_ELT_SCALE		3
#define DRM_TACC_ELT_GELU		4	/* hw 1.3 */
#define DRM_TACC_ELT_SILU		5
#define DRM_TACC_ELT_EXP		6
#define DRM_TACC_ELT_CAST		7

/**
 * struct drm_tacc_operand - a place in a buffer object.
 * @handle: GEM handle, 0 when the operand is unused.
 * @pad: must be 0.
 * @offset: byte offset in the BO (relative to the BO, not to its binding).
 */
struct drm_tacc_operand {
	__u32 handle;
	__u32 pad;
	__u64 offset;
};

/**
 * struct drm_tacc_cmd - one command of a job, 128 bytes.
 *
 * Operand use by opcode (unused operands must have handle 0):
 *  COPY_*:    @a = source, @b = destination, @size = bytes.
 *  GEMM:      @a (M x K, @lda), @b (K x N, @ldb), @c (M x N, @ldc), fp32,
 *             C = @alpha * A x B + @beta * C (fp32 bit patterns).
 *  ELTWISE:   @a, @b (ADD, MUL only), @c = result, @size = elements,
 *             @elt_op = DRM_TACC_ELT_*, @scalar (SCALE, fp32 bits).
 *  FENCE:     @a = 8-byte aligned destination, @value written.
 *  TIMESTAMP: @a = 8-byte aligned destination of the device clock.
 *  NOP, BARRIER: no operand.
 *
 * @opcode: DRM_TACC_OP_*.
 * @flags: must be 0.
 * @tag: user tag (correlation id) copied to completions and trace records.
 * @a: first operand.
 * @b: second operand.
 * @c: third operand.
 * @size: bytes (COPY) or elements (ELTWISE), else 0.
 * @value: FENCE value, else 0.
 * @m: GEMM rows of A and C.
 * @n: GEMM columns of B and C.
 * @k: GEMM columns of A, rows of B.
 * @lda: GEMM elements per row of A (>= @k).
 * @ldb: GEMM elements per row of B (>= @n).
 * @ldc: GEMM elements per row of C (>= @n).
 * @alpha: GEMM fp32 bits.
 * @beta: GEMM fp32 bits.
 * @elt_op: ELTWISE operation.
 * @scalar: ELTWISE SCALE fp32 bits.
 * @rsvd: must be 0.
 */
struct drm_tacc_cmd {
	__u32 opcode;
	__u32 flags;
	__u64 tag;
	struct drm_tacc_operand a;
	struct drm_tacc_operand b;
	struct drm_tacc_operand c;
	__u64 size;
	__u64 value;
	__u32 m;
	__u32 n;
	__u32 k;
	__u32 lda;
	__u32 ldb;
	__u32 ldc;
	__u32 alpha;
	__u32 beta;
	__u32 elt_op;
	__u32 scalar;
	__u64 rsvd;
};

#define DRM_TACC_CMD2_OPERANDS	6

/**
 * struct drm_tacc_cmd2 - one command of a job, 256 bytes (uAPI 4, SUBMIT
 * with @cmd_size 256); carries every opcode, the hw 1.3 ones included.
 *
 * @args is the device descriptor's 104-byte payload (union of struct
 * tacc_desc in tacc_hw.h) with every address field zero: the driver writes
 * the device VA of @op[i] into the payload's i-th address field, in the
 * payload's field order:
 *  COPY_*:  op[0] src, op[1] dst.
 *  GEMM:    op[0] a, op[1] b, op[2] c, op[3] bias (TACC_GEMM_F_BIAS).
 *  ELTWISE: op[0] a, op[1] b (ADD, MUL), op[2] c.
 *  FENCE, TIMESTAMP: op[0] addr.
 *  SOFTMAX: op[0] x, op[1] y.
 *  NORM:    op[0] x, op[1] y, op[2] gamma, op[3] beta (LAYER), op[4] stats
 *           (TACC_NORM_F_STATS, hw 1.5: TACC_CAP_NORM_STATS).
 *  GATHER:  op[0] table, op[1] idx, op[2] out.
 *  LIST:    op[0] list, op[1] patches (npatch > 0).
 * The driver checks each operand's whole extent against its binding, the
 * memory kind, alignment, shapes, dtypes, flags and reserved bytes (the
 * rules of docs/hardware.md, one validator for every function kind), and
 * for LIST only the list and patch table themselves: the device checks
 * each listed command as it runs it (docs/uapi.md, "Threat model").
 *
 * @opcode: DRM_TACC_OP_* (FILL is refused: kernel only).
 * @flags: must be 0.
 * @tag: user tag.
 * @op: operands; unused ones all zero.
 * @args: descriptor payload.
 * @rsvd: must be 0.
 */
struct drm_tacc_cmd2 {
	__u32 opcode;
	__u32 flags;
	__u64 tag;
	struct drm_tacc_operand op[DRM_TACC_CMD2_OPERANDS];
	__u8  args[104];
	__u64 rsvd[5];
};

/**
 * struct drm_tacc_submit - DRM_IOCTL_TACC_SUBMIT argument.
 * @cmds: user pointer to @num_cmds struct drm_tacc_cmd, or (uAPI 4) of
 *        struct drm_tacc_cmd2 when @cmd_size is 256.
 * @in_syncobjs: user pointer to @num_in_syncobjs __u32 syncobj handles
 *               (binary syncobjs) the job waits for.
 * @num_cmds: 1 .. DRM_TACC_PARAM_MAX_CMDS.
 * @num_in_syncobjs: 0 .. DRM_TACC_MAX_IN_SYNCOBJS.
 * @queue: hardware queue, 0 .. DRM_TACC_PARAM_NUM_QUEUES - 1.
 * @out_syncobj: syncobj handle that receives the job's fence, 0 = none.
 * @flags: must be 0.
 * @cmd_size: sizeof(struct drm_tacc_cmd) or sizeof(struct drm_tacc_cmd2).
 * @seqno: out: per-file job sequence number, for DRM_IOCTL_TACC_WAIT.
 */
struct drm_tacc_submit {
	__u64 cmds;
	__u64 in_syncobjs;
	__u32 num_cmds;
	__u32 num_in_syncobjs;
	__u32 queue;
	__u32 out_syncobj;
	__u32 flags;
	__u32 cmd_size;
	__u64 seqno;
};

#define DRM_TACC_MAX_IN_SYNCOBJS	16

/**
 * struct drm_tacc_wait - DRM_IOCTL_TACC_WAIT argument.
 * @seqno: a seqno returned by DRM_IOCTL_TACC_SUBMIT on this file.
 * @timeout_ns: relative timeout; 0 polls; negative waits forever.
 * @flags: must be 0.
 * @status: out: 0, or the job's negative errno (-ETIMEDOUT hang, -EFAULT
 *          MMU fault, -EIO DMA error, -EINVAL rejected by the device,
 *          -ECANCELED aborted).
 */
struct drm_tacc_wait {
	__u64 seqno;
	__s64 timeout_ns;
	__u32 flags;
	__s32 status;
};

/* -------------------------------------------------------- trace ring ---- */
/**
 * struct drm_tacc_trace_open - DRM_IOCTL_TACC_TRACE_OPEN argument.
 *
 * Registers the calling file as the one consumer of the device trace ring,
 * allocates the ring and enables device tracing.  mmap() @mmap_size bytes at
 * @mmap_offset (read-only) to see struct drm_tacc_trace_header then the
 * records (struct tacc_trace_rec of tacc_hw.h) at header.data_offset.
 * On the PF the ring shows every context: CAP_PERFMON is needed (-EACCES);
 * on a VF or a virtio-tacc node any user of the node may open it.  A
 * CAP_PERFMON opener takes over a ring held by an unprivileged owner, whose
 * ADVANCE/CLOSE then fail with -ENODEV and whose mapping faults (SIGBUS), as
 * after CLOSE.
 *
 * @flags: 0 or DRM_TACC_TRACE_F_V3 (uAPI 4, devices with TACC_CAP_TRACE_V3:
 *         struct tacc_trace_rec3 records of 128 bytes).
 * @entries: in: records wanted, a power of two between
 *           DRM_TACC_TRACE_MIN_ENTRIES and DRM_TACC_TRACE_MAX_ENTRIES, or 0
 *           for DRM_TACC_TRACE_DEFAULT_ENTRIES; out: records in the ring.
 * @mmap_offset: out.
 * @mmap_size: out.
 */
struct drm_tacc_trace_open {
	__u32 flags;
	__u32 entries;
	__u64 mmap_offset;
	__u64 mmap_size;
};

#define DRM_TACC_TRACE_MIN_ENTRIES	64
#define DRM_TACC_TRACE_MAX_ENTRIES	32768
#define DRM_TACC_TRACE_F_V3		(1u << 0)	/* uAPI 4: 128-byte version-3 records */
#define DRM_TACC_TRACE_DEFAULT_ENTRIES	4096

/**
 * struct drm_tacc_trace_header - first page of the mapped trace ring.
 * @version: DRM_TACC_TRACE_HDR_VERSION.
 * @rec_size: bytes per record (64, or 128 with DRM_TACC_TRACE_F_V3).
 * @entries: records in the ring.
 * @rec_version: record format version (TACC_TRACE_VERSION).
 * @data_offset: offset of record 0 from the start of the mapping.
 * @prod: free-running producer index (written by the device).
 * @dropped: records the device dropped because the ring was full.
 * @cons: free-running consumer index (written by the driver on ADVANCE).
 * @epoch: incremented when the ring is reset (indices restart at 0).
 */
struct drm_tacc_trace_header {
	__u32 version;
	__u32 rec_size;
	__u32 entries;
	__u32 rec_version;
	__u64 data_offset;
	__u32 prod;
	__u32 dropped;
	__u32 cons;
	__u32 epoch;
};

#define DRM_TACC_TRACE_HDR_VERSION	1

/**
 * struct drm_tacc_trace_advance - DRM_IOCTL_TACC_TRACE_ADVANCE argument.
 * @cons: new free-running consumer index (between the current consumer
 *        index and the producer index).
 * @flags: must be 0.
 * @prod: out: producer index.
 * @dropped: out: records dropped so far.
 */
struct drm_tacc_trace_advance {
	__u32 cons;
	__u32 flags;
	__u32 prod;
	__u32 dropped;
};

/**
 * struct drm_tacc_trace_close - DRM_IOCTL_TACC_TRACE_CLOSE argument.
 * @flags: must be 0.
 * @pad: must be 0.
 */
struct drm_tacc_trace_close {
	__u32 flags;
	__u32 pad;
};

/* ------------------------------------------------------- sample ring ---- */
/**
 * struct drm_tacc_sample_open - DRM_IOCTL_TACC_SAMPLE_OPEN argument.
 *
 * Registers the calling file as the one consumer of the function's
 * device-side counter sampling ring, allocates a ring of @entries entries
 * and starts sampling every @period_ns ns of device time.  mmap()
 * @mmap_size bytes at @mmap_offset (read-only) to see struct
 * drm_tacc_sample_header then the entries (struct tacc_sample_hdr of
 * tacc_hw.h followed by 2 * TACC_SAMPLE_SLOTS u64 counter slots,
 * header.entry_size bytes each) at header.data_offset.  Who may open: as
 * for the trace ring (struct drm_tacc_trace_open).
 *
 * @period_ns: sampling period, >= DRM_TACC_SAMPLE_MIN_PERIOD_NS.
 * @entries: ring entries, a power of two between 2 and
 *           DRM_TACC_SAMPLE_MAX_ENTRIES.
 * @flags: must be 0.
 * @pad: must be 0.
 * @mmap_offset: out.
 * @mmap_size: out.
 */
struct drm_tacc_sample_open {
	__u32 period_ns;
	__u32 entries;
	__u32 flags;
	__u32 pad;
	__u64 mmap_offset;
	__u64 mmap_size;
};

#define DRM_TACC_SAMPLE_MIN_PERIOD_NS	100000
#define DRM_TACC_SAMPLE_MAX_ENTRIES	2048

/**
 * struct drm_tacc_sample_header - first page of the mapped sample ring.
 * @version: DRM_TACC_SAMPLE_HDR_VERSION.
 * @entry_size: bytes per entry (TACC_SAMPLE_SIZE, 1048).
 * @entries: entries in the ring.
 * @period_ns: sampling period.
 * @data_offset: offset of entry 0 from the start of the mapping.
 * @prod: free-running producer index (written by the device).
 * @dropped: samples the device dropped because the ring was full
 *           (SAMPLE_DROPPED, written by the device; zeroed only by a
 *           function reset).
 * @cons: free-running consumer index (written by the driver on ADVANCE).
 * @epoch: incremented when the ring is reset (indices restart at 0).
 * @dropped_base: value of @dropped when the ring was (re)started; the
 *                samples dropped since then are @dropped - @dropped_base.
 * @pad: 0.
 */
struct drm_tacc_sample_header {
	__u32 version;
	__u32 entry_size;
	__u32 entries;
	__u32 period_ns;
	__u64 data_offset;
	__u32 prod;
	__u32 dropped;
	__u32 cons;
	__u32 epoch;
	__u32 dropped_base;
	__u32 pad;
};

#define DRM_TACC_SAMPLE_HDR_VERSION	1

/**
 * struct drm_tacc_sample_advance - DRM_IOCTL_TACC_SAMPLE_ADVANCE argument.
 * @cons: new free-running consumer index (between the current consumer
 *        index and the producer index).
 * @flags: must be 0.
 * @prod: out: producer index.
 * @dropped: out: samples dropped since SAMPLE_OPEN or the last ring reset
 *           (header.dropped - header.dropped_base).
 */
struct drm_tacc_sample_advance {
	__u32 cons;
	__u32 flags;
	__u32 prod;
	__u32 dropped;
};

/**
 * struct drm_tacc_sample_close - DRM_IOCTL_TACC_SAMPLE_CLOSE argument.
 * @flags: must be 0.
 * @pad: must be 0.
 */
struct drm_tacc_sample_close {
	__u32 flags;
	__u32 pad;
};

/* ------------------------------------------------- TLP capture ring ---- */
/**
 * struct drm_tacc_tlpcap_open - DRM_IOCTL_TACC_TLPCAP_OPEN argument (uAPI 3).
 *
 * Registers the calling file as the one consumer of the device's TLP capture
 * (PF only, TACC_CAP_TLP_CAPTURE; -EOPNOTSUPP otherwise), allocates the ring,
 * programs the device-side filters and starts capturing.  mmap() @mmap_size
 * bytes at @mmap_offset (read-only) to see struct drm_tacc_trace_header
 * (rec_size TACC_TLP_REC_SIZE, rec_version TACC_TLP_VERSION) then the
 * records (struct tacc_tlp_rec of tacc_hw.h).  ADVANCE and CLOSE take
 * struct drm_tacc_trace_advance and struct drm_tacc_trace_close.  The
 * capture shows every function and context: CAP_PERFMON is needed
 * (-EACCES); a second consumer gets -EBUSY.
 *
 * @flags: DRM_TACC_TLPCAP_NO_CTRL or 0.
 * @entries: in: records wanted, a power of two between
 *           DRM_TACC_TLPCAP_MIN_ENTRIES and DRM_TACC_TLPCAP_MAX_ENTRIES, or 0
 *           for DRM_TACC_TLPCAP_DEFAULT_ENTRIES; out: records in the ring.
 * @funcs: bit f: capture function f (0 = PF, n = VF n); 0 = all.
 * @kinds: bit k: capture TLP kind k (enum tacc_tlp_kind); 0 = all.
 * @addr_lo: capture only TLPs whose bus address is in [@addr_lo, @addr_hi).
 * @addr_hi: 0 = no address filter.
 * @pad: must be 0.
 * @mmap_offset: out.
 * @mmap_size: out.
 */
struct drm_tacc_tlpcap_open {
	__u32 flags;
	__u32 entries;
	__u32 funcs;
	__u32 kinds;
	__u64 addr_lo;
	__u64 addr_hi;
	__u32 pad;
	__u32 pad2;
	__u64 mmap_offset;
	__u64 mmap_size;
};

#define DRM_TACC_TLPCAP_NO_CTRL		0x1	/* leave out control traffic */
#define DRM_TACC_TLPCAP_MIN_ENTRIES	64
#define DRM_TACC_TLPCAP_MAX_ENTRIES	262144
#define DRM_TACC_TLPCAP_DEFAULT_ENTRIES	16384

/* Fixed mmap() offsets of the DRM fd (below DRM's GEM offset range). */
#define DRM_TACC_MMAP_COUNTERS		0x10000000ull
#define DRM_TACC_MMAP_TRACE		0x20000000ull
#define DRM_TACC_MMAP_SAMPLE		0x30000000ull
#define DRM_TACC_MMAP_TLPCAP		0x40000000ull

#define DRM_IOCTL_TACC_GET_PARAM \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_GET_PARAM, struct drm_tacc_get_param)
#define DRM_IOCTL_TACC_BO_CREATE \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_BO_CREATE, struct drm_tacc_bo_create)
#define DRM_IOCTL_TACC_BO_INFO \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_BO_INFO, struct drm_tacc_bo_info)
#define DRM_IOCTL_TACC_VM_BIND \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_VM_BIND, struct drm_tacc_vm_bind)
#define DRM_IOCTL_TACC_VM_UNBIND \
	_IOW(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_VM_UNBIND, struct drm_tacc_vm_unbind)
#define DRM_IOCTL_TACC_SUBMIT \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_SUBMIT, struct drm_tacc_submit)
#define DRM_IOCTL_TACC_WAIT \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_WAIT, struct drm_tacc_wait)
#define DRM_IOCTL_TACC_TRACE_OPEN \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TRACE_OPEN, struct drm_tacc_trace_open)
#define DRM_IOCTL_TACC_TRACE_ADVANCE \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TRACE_ADVANCE, \
	      struct drm_tacc_trace_advance)
#define DRM_IOCTL_TACC_TRACE_CLOSE \
	_IOW(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TRACE_CLOSE, struct drm_tacc_trace_close)
#define DRM_IOCTL_TACC_SAMPLE_OPEN \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_SAMPLE_OPEN, struct drm_tacc_sample_open)
#define DRM_IOCTL_TACC_SAMPLE_ADVANCE \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_SAMPLE_ADVANCE, \
	      struct drm_tacc_sample_advance)
#define DRM_IOCTL_TACC_SAMPLE_CLOSE \
	_IOW(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_SAMPLE_CLOSE, \
	     struct drm_tacc_sample_close)
#define DRM_IOCTL_TACC_TLPCAP_OPEN \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TLPCAP_OPEN, struct drm_tacc_tlpcap_open)
#define DRM_IOCTL_TACC_TLPCAP_ADVANCE \
	_IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TLPCAP_ADVANCE, \
	      struct drm_tacc_trace_advance)
#define DRM_IOCTL_TACC_TLPCAP_CLOSE \
	_IOW(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_TACC_TLPCAP_CLOSE, struct drm_tacc_trace_close)

/*
 * DRM core ioctls usable on the accel node, mirrored with tacc names so
 * user space needs no <drm/drm.h>; layouts equal the core's.
 */

/**
 * struct drm_tacc_gem_close - mirror of struct drm_gem_close.
 * @handle: GEM handle to close.
 * @pad: must be 0.
 */
struct drm_tacc_gem_close {
	__u32 handle;
	__u32 pad;
};

/**
 * struct drm_tacc_syncobj_create - mirror of struct drm_syncobj_create.
 * @handle: out: syncobj handle.
 * @flags: 1 = create signaled.
 */
struct drm_tacc_syncobj_create {
	__u32 handle;
	__u32 flags;
};

/**
 * struct drm_tacc_syncobj_destroy - mirror of struct drm_syncobj_destroy.
 * @handle: syncobj handle.
 * @pad: must be 0.
 */
struct drm_tacc_syncobj_destroy {
	__u32 handle;
	__u32 pad;
};

/**
 * struct drm_tacc_syncobj_wait - mirror of struct drm_syncobj_wait.
 * @handles: user pointer to __u32 handles.
 * @timeout_nsec: absolute CLOCK_MONOTONIC timeout.
 * @count_handles: number of handles.
 * @flags: DRM_SYNCOBJ_WAIT_FLAGS_* (1 = all, 2 = wait for submit).
 * @first_signaled: out.
 * @pad: must be 0.
 * @deadline_nsec: used with flag 8 only.
 */
struct drm_tacc_syncobj_wait {
	__u64 handles;
	__s64 timeout_nsec;
	__u32 count_handles;
	__u32 flags;
	__u32 first_signaled;
	__u32 pad;
	__u64 deadline_nsec;
};

#define DRM_IOCTL_TACC_GEM_CLOSE \
	_IOW(DRM_IOCTL_BASE, 0x09, struct drm_tacc_gem_close)
#define DRM_IOCTL_TACC_SYNCOBJ_CREATE \
	_IOWR(DRM_IOCTL_BASE, 0xBF, struct drm_tacc_syncobj_create)
#define DRM_IOCTL_TACC_SYNCOBJ_DESTROY \
	_IOWR(DRM_IOCTL_BASE, 0xC0, struct drm_tacc_syncobj_destroy)
#define DRM_IOCTL_TACC_SYNCOBJ_WAIT \
	_IOWR(DRM_IOCTL_BASE, 0xC3, struct drm_tacc_syncobj_wait)

/* ----------------------------------------------------- generic netlink ---- */
#define TACC_GENL_NAME			"tacc"
#define TACC_GENL_VERSION		1
#define TACC_GENL_MCGRP_EVENTS		"events"

enum tacc_genl_cmd {
	TACC_GENL_CMD_UNSPEC = 0,
	TACC_GENL_CMD_EVENT = 1,	/* multicast: one asynchronous event */
};

enum tacc_genl_event {
	TACC_EVENT_MMU_FAULT = 1,
	TACC_EVENT_HANG = 2,
	TACC_EVENT_RESET = 3,
	TACC_EVENT_FATAL = 4,
	TACC_EVENT_PM = 5,
	TACC_EVENT_VF_ENABLE = 6,
	TACC_EVENT_VF_DISABLE = 7,
	TACC_EVENT_DMA_ERROR = 8,
};

enum tacc_genl_attr {
	TACC_A_UNSPEC = 0,
	TACC_A_EVENT = 1,	/* u32: enum tacc_genl_event */
	TACC_A_DEVICE = 2,	/* string: PCI address, 0000:01:00.0 */
	TACC_A_MINOR = 3,	/* u32: accel minor */
	TACC_A_CTX = 4,		/* u32: context id */
	TACC_A_PID = 5,		/* u32: tgid owning the context */
	TACC_A_QUEUE = 6,	/* u32 */
	TACC_A_ADDR = 7,	/* u64: faulting device VA */
	TACC_A_INFO = 8,	/* u32: TACC_REG_FAULT_INFO, or PM state, or VF count */
	TACC_A_TAG = 9,		/* u64: user tag */
	TACC_A_SEQNO = 10,	/* u64: file job seqno */
	TACC_A_TIMESTAMP = 11,	/* u64: CLOCK_MONOTONIC ns */
	TACC_A_PAD = 12,
	__TACC_A_MAX,
};

#define TACC_A_MAX (__TACC_A_MAX - 1)

#if defined(__cplusplus)
}
#endif

#endif /* _UAPI_TACC_ACCEL_H_ */
