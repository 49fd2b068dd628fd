/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * tacc_hw.h - the register-level contract of the tacc accelerator.
 *
 * One truth, shared by the QEMU device model (qemu/) and the Linux driver
 * (kernel/): registers, descriptors, completion entries, page-table entries,
 * trace records and the counter block.  docs/hardware.md explains it in prose;
 * where the two disagree, fix both.
 *
 * All multi-byte fields are little endian.  64-bit registers may be read with
 * one aligned 8-byte access (single-copy atomic) or as LO then HI 4-byte
 * accesses (reading LO latches HI).
 */
#ifndef TACC_HW_H
#define TACC_HW_H

#include <linux/types.h>

/* ---------------------------------------------------------------- PCI ---- */
/* Not allocated by the PCI-SIG: a private ID pair for an emulated device. */
#define TACC_PCI_VENDOR_ID		0x7acc
#define TACC_PCI_DEVICE_ID_PF		0x0001
#define TACC_PCI_DEVICE_ID_VF		0x0002
#define TACC_PCI_CLASS			0x120000	/* processing accelerator */
#define TACC_PCI_REVISION		0x01

#define TACC_BAR_REGS			0	/* 64 KiB registers */
#define TACC_BAR_COUNTERS		2	/* 8 KiB counter block, mmap-able */
#define TACC_BAR_MSIX			4	/* MSI-X table and PBA */
#define TACC_BAR_REGS_SIZE		0x10000
#define TACC_BAR_COUNTERS_SIZE		0x2000

#define TACC_MAX_VFS			4
#define TACC_NUM_QUEUES			4	/* per function */
#define TACC_NUM_CONTEXTS		16	/* per function */
#define TACC_NUM_DMA_ENGINES		2	/* H2D, D2H (shared by all functions) */
#define TACC_NUM_COMPUTE_ENGINES	4	/* shared by all functions */
#define TACC_NUM_ENGINES		(TACC_NUM_DMA_ENGINES + TACC_NUM_COMPUTE_ENGINES)

/* MSI-X vectors: one per queue, then error, then trace/sampling. */
#define TACC_MSIX_QUEUE(q)		(q)
#define TACC_MSIX_ERROR			TACC_NUM_QUEUES
#define TACC_MSIX_TRACE			(TACC_NUM_QUEUES + 1)
#define TACC_MSIX_VECTORS		(TACC_NUM_QUEUES + 2)

#define TACC_CLOCK_HZ			1000000000ULL	/* device clock: 1 tick = 1 ns */

/* Engine ids, as used in trace records and counters. */
enum tacc_engine {
	TACC_ENGINE_DMA_H2D = 0,
	TACC_ENGINE_DMA_D2H = 1,
	TACC_ENGINE_COMPUTE0 = 2,	/* compute engines 2 .. 5 */
	TACC_ENGINE_LOCAL = 0xff,	/* queue-local: NOP, FENCE, TIMESTAMP, BARRIER */
};

/* ----------------------------------------------------- BAR0: global ---- */
#define TACC_REG_ID			0x000	/* RO: TACC_ID_MAGIC */
#define   TACC_ID_MAGIC			0x54414343	/* "TACC" */
#define TACC_REG_VERSION		0x004	/* RO: major << 16 | minor */
#define   TACC_HW_VERSION_MAJOR		1
#define   TACC_HW_VERSION_MINOR		7
#define TACC_REG_CAPS			0x008	/* RO: TACC_CAP_* */
#define   TACC_CAP_VF			(1u << 0)	/* this function is a VF */
#define   TACC_CAP_SRIOV		(1u << 1)
#define   TACC_CAP_MMU_2M		(1u << 2)
#define   TACC_CAP_TRACE		(1u << 3)
#define   TACC_CAP_SAMPLING		(1u << 4)
#define   TACC_CAP_FILL			(1u << 5)	/* TACC_OP_FILL (hw 1.1) */
#define   TACC_CAP_TLB_INV_DONE		(1u << 6)	/* TLB_INV_SEQ/DONE (hw 1.1) */
#define   TACC_CAP_VF_POLICY		(1u << 7)	/* per-VF policy, QUEUE_MASK (hw 1.2) */
#define   TACC_CAP_TLP_CAPTURE		(1u << 8)	/* TLP capture, PF registers 0x600 (hw 1.2) */
#define   TACC_CAP_LINK_PM		(1u << 9)	/* PF: ASPM L0s/L1 model, registers 0x700 (hw 1.2) */
#define   TACC_CAP_LINK_CTRL_COST	(1u << 10)	/* control traffic costs link time (hw 1.2) */
#define   TACC_CAP_VIRTIO_FN		(1u << 11)	/* PF: a virtio-tacc function is attached (hw 1.2) */
#define   TACC_CAP_GEMM_EX		(1u << 12)	/* GEMM transposes, batch, bias, dtypes (hw 1.3) */
#define   TACC_CAP_BF16			(1u << 13)	/* TACC_DT_BF16 operands, fp32 accumulation (hw 1.3) */
#define   TACC_CAP_NN_OPS		(1u << 14)	/* SOFTMAX, NORM, GATHER, eltwise GELU..CAST, row broadcast (hw 1.3) */
#define   TACC_CAP_CMD_LIST		(1u << 15)	/* TACC_OP_LIST command lists (hw 1.3) */
#define   TACC_CAP_TRACE_V3		(1u << 16)	/* 128-byte trace records: FLOPs, bytes, list id (hw 1.3) */
#define   TACC_CAP_ROOFLINE		(1u << 17)	/* per-dtype peaks, PEAK_* and DEVMEM_GBPS registers (hw 1.3) */
#define   TACC_CAP_VF_MIGRATION		(1u << 18)	/* PF: VF migration, registers 0x900 (hw 1.4) */
#define   TACC_CAP_NORM_STATS		(1u << 19)	/* NORM writes per-row statistics (hw 1.5) */
#define   TACC_CAP_VM_PAUSED		(1u << 20)	/* VM_PAUSED_NS: the host time the VM stood still (hw 1.7) */
#define TACC_REG_FUNC			0x00c	/* RO: 0 = PF, n = VF n (1-based) */
#define TACC_REG_NUM_QUEUES		0x010	/* RO */
#define TACC_REG_NUM_CONTEXTS		0x014	/* RO */
#define TACC_REG_NUM_ENGINES		0x018	/* RO: DMA + compute */
#define TACC_REG_MSIX_VECTORS		0x01c	/* RO */
#define TACC_REG_DEVMEM_SIZE		0x020	/* RO 64: this function's device memory */
#define TACC_REG_LINK_CAP		0x028	/* RO: TACC_LINK_* (maximum) */
#define TACC_REG_LINK_STATUS		0x02c	/* RO: TACC_LINK_* (negotiated) */
#define   TACC_LINK_GEN_MASK		0x0000000f	/* 3, 4, 5 */
#define   TACC_LINK_WIDTH_SHIFT		4
#define   TACC_LINK_WIDTH_MASK		0x000003f0	/* lanes: 1 .. 16 */
#define TACC_REG_LINK_PARAMS		0x030	/* RO: MPS [15:0], MRRS [31:16], bytes */
#define TACC_REG_TLB_ENTRIES		0x034	/* RO: device TLB size */
#define TACC_REG_CLOCK_HZ		0x038	/* RO: device clock rate (1e9) */
#define TACC_REG_TIME_SCALE		0x03c	/* RO: modelled-time scale x 1000 */
#define TACC_REG_DEVCLK			0x040	/* RO 64: device clock, ticks */
#define TACC_REG_HOSTCLK		0x048	/* RO 64: host realtime clock, ns */
#define TACC_REG_CTRL			0x050	/* RW */
#define   TACC_CTRL_ENABLE		(1u << 0)
#define   TACC_CTRL_RESET		(1u << 1)	/* self-clearing function reset */
#define TACC_REG_STATUS			0x054	/* RO */
#define   TACC_STATUS_READY		(1u << 0)
#define   TACC_STATUS_FATAL		(1u << 1)
#define   TACC_STATUS_IDLE		(1u << 2)	/* no command in flight */
#define TACC_REG_IRQ_STATUS		0x058	/* RW1C: causes behind the error and trace vectors */
#define TACC_REG_IRQ_MASK		0x05c	/* RW: 1 = cause enabled */
#define   TACC_IRQ_MMU_FAULT		(1u << 0)
#define   TACC_IRQ_DMA_ERROR		(1u << 1)
#define   TACC_IRQ_FATAL		(1u << 2)
#define   TACC_IRQ_QUEUE_ERROR		(1u << 3)	/* bad ring configuration */
#define   TACC_IRQ_TRACE		(1u << 4)	/* trace ring half full */
#define   TACC_IRQ_SAMPLE		(1u << 5)	/* sample ring half full */
#define TACC_REG_SCRATCH		0x060	/* RW: scratch, for driver self-test */
/* Roofline of one compute engine and of device memory (TACC_CAP_ROOFLINE, hw 1.3) */
#define TACC_REG_PEAK_FP32_GFLOPS	0x064	/* RO: per compute engine, GFLOP/s */
#define TACC_REG_PEAK_BF16_GFLOPS	0x068	/* RO: per compute engine, GFLOP/s */
#define TACC_REG_DEVMEM_GBPS		0x06c	/* RO: device-memory bandwidth, GB/s */
/*
 * Host ns the VM stood still (paused, or stopped for a migration) since the
 * device was created, carried across a migration (TACC_CAP_VM_PAUSED, hw 1.7).
 * It moves only while the VM is stopped, so its halves never tear.
 */
#define TACC_REG_VM_PAUSED_NS		0x070	/* RO 64 */

/* ------------------------------------------------------ BAR0: MMU ---- */
/*
 * Context page-table roots: 64-bit each, TACC_NUM_CONTEXTS of them.
 * Bit 0 = valid, bits 51:12 = IOVA of the level-0 table.
 */
#define TACC_REG_CTX_PTBR(ctx)		(0x100 + (ctx) * 8)
#define   TACC_PTBR_VALID		(1ull << 0)
#define TACC_REG_TLB_INV		0x180	/* WO: ctx, or TACC_TLB_INV_ALL */
#define   TACC_TLB_INV_ALL		(1u << 31)
#define TACC_REG_FAULT_ADDR		0x188	/* RO 64: device VA that faulted */
#define TACC_REG_FAULT_INFO		0x190	/* RO: see TACC_FAULT_* */
#define   TACC_FAULT_CTX_MASK		0x0000ffff
#define   TACC_FAULT_QUEUE_SHIFT	16
#define   TACC_FAULT_QUEUE_MASK		0x00ff0000
#define   TACC_FAULT_TYPE_SHIFT		24
#define   TACC_FAULT_TYPE_MASK		0x0f000000
#define   TACC_FAULT_WRITE		(1u << 28)
#define   TACC_FAULT_VALID		(1u << 31)
#define TACC_REG_FAULT_CLEAR		0x194	/* WO: write 1 to re-arm fault capture */
#define TACC_REG_FAULT_TAG		0x198	/* RO 64: user tag of the faulting command */
/*
 * TLB invalidation completion (TACC_CAP_TLB_INV_DONE): the driver writes a
 * sequence number to TLB_INV_SEQ, then the context (or ALL) to TLB_INV;
 * once the invalidation is complete (no later translation of the function
 * uses an entry cached before it) the device copies the sequence to
 * TLB_INV_DONE.  The driver polls TLB_INV_DONE == seq.  docs/hardware.md.
 */
#define TACC_REG_TLB_INV_SEQ		0x1a0	/* RW: sequence of the next TLB_INV */
#define TACC_REG_TLB_INV_DONE		0x1a4	/* RO: sequence of the last completed one */

enum tacc_fault_type {
	TACC_FAULT_NONE = 0,
	TACC_FAULT_UNMAPPED = 1,	/* invalid PTE on the walk */
	TACC_FAULT_PERMISSION = 2,	/* write to a read-only page */
	TACC_FAULT_WALK_DMA = 3,	/* page-table read failed (IOMMU) */
	TACC_FAULT_DEVMEM_RANGE = 4,	/* device address outside the window */
	TACC_FAULT_BAD_CTX = 5,		/* context has no valid PTBR */
	TACC_FAULT_MEM_KIND = 6,	/* page maps host memory where device memory
					 * is required, or the reverse (copy
					 * direction, compute operands) */
};

/* ---------------------------------------------------- BAR0: trace ---- */
#define TACC_REG_TRACE_BASE		0x200	/* RW 64: IOVA of the record ring */
#define TACC_REG_TRACE_SIZE		0x208	/* RW: entries, power of two */
#define TACC_REG_TRACE_CTRL		0x20c	/* RW: TACC_TRACE_CTRL_* */
#define   TACC_TRACE_CTRL_ENABLE	(1u << 0)
#define   TACC_TRACE_CTRL_V3		(1u << 1)	/* 128-byte version-3 records (TACC_CAP_TRACE_V3) */
#define TACC_REG_TRACE_PROD		0x210	/* RO: free-running producer index */
#define TACC_REG_TRACE_CONS		0x214	/* RW: free-running consumer index */
#define TACC_REG_TRACE_DROPPED		0x218	/* RO: records dropped (ring full) */
#define TACC_REG_TRACE_WB		0x220	/* RW 64: IOVA of struct tacc_ring_wb, 0 = off */

/* ------------------------------------------------- BAR0: sampling ---- */
#define TACC_REG_SAMPLE_BASE		0x300	/* RW 64: IOVA of the sample ring */
#define TACC_REG_SAMPLE_SIZE		0x308	/* RW: entries, power of two */
#define TACC_REG_SAMPLE_PERIOD		0x30c	/* RW: ns, 0 = off, minimum 100000 */
#define TACC_REG_SAMPLE_PROD		0x310	/* RO */
#define TACC_REG_SAMPLE_CONS		0x314	/* RW */
#define TACC_REG_SAMPLE_DROPPED		0x318	/* RO */
#define TACC_REG_SAMPLE_WB		0x320	/* RW 64: IOVA of struct tacc_ring_wb */
#define TACC_SAMPLE_MIN_PERIOD_NS	100000

/* ---------------------------------------- BAR0: SR-IOV (PF only) ---- */
/* Device-memory partition of VF n (0-based): base and size, 64-bit each. */
#define TACC_REG_VF_DEVMEM_BASE(vf)	(0x400 + (vf) * 0x10)
#define TACC_REG_VF_DEVMEM_SIZE(vf)	(0x408 + (vf) * 0x10)
/*
 * Arbitration weight of function f (0 = PF, 1.. = VFs); 0 means 1.  With
 * TACC_CAP_VF_POLICY (hw 1.2) a shared engine serves the functions by
 * deficit round-robin: a function's turn adds weight * TACC_ARB_QUANTUM to
 * its deficit, and it runs head commands while the deficit covers their
 * cost (a copy's or fill's length in bytes; TACC_ARB_QUANTUM for any other
 * command), so a function's share of an engine's bytes is its weight share.
 * Writes above TACC_ARB_WEIGHT_MAX are refused.
 */
#define TACC_REG_ARB_WEIGHT(f)		(0x480 + (f) * 4)
#define TACC_ARB_WEIGHT_MAX		255
#define TACC_ARB_QUANTUM		4096	/* bytes per weight unit and turn */

/* ----------------------------- BAR0: per-VF policy (TACC_CAP_VF_POLICY) ---- */
/*
 * QUEUE_MASK, on every function: bit q set = queue q may be enabled (the
 * PF: all of them).  A VF's mask is set by the PF in VF_QUEUE_MASK(vf)
 * (0-based VF), writable only while VF Enable is clear; a zero mask or a
 * bit >= TACC_NUM_QUEUES is refused.  Enabling a queue outside the mask is
 * refused (Q_CTRL reads back without ENABLE).  Reset value: all queues.
 * A VF's device memory (VF_DEVMEM_*) and weight (ARB_WEIGHT) are the rest
 * of its policy; docs/hardware.md "Per-VF policy".
 */
#define TACC_REG_QUEUE_MASK		0x4c0	/* RO: this function's queues */
#define TACC_REG_VF_QUEUE_MASK(vf)	(0x4c4 + (vf) * 4)	/* RW, PF only */
#define   TACC_QUEUE_MASK_ALL		((1u << TACC_NUM_QUEUES) - 1)

/* -------------------------------- BAR0: virtio function (PF only) ---- */
/*
 * The virtio-tacc function (docs/virtio.md) is function TACC_FN_VIRTIO: its
 * arbitration weight is TACC_REG_ARB_WEIGHT(TACC_FN_VIRTIO), its device-memory
 * window (carved from the PF's, like a VF's) is programmed here.  Reset
 * values: the virtio-tacc-pci devmem-base/devmem-size properties.  Present
 * when CAPS has TACC_CAP_VIRTIO_FN (hw 1.2).
 */
#define TACC_FN_VIRTIO			(TACC_MAX_VFS + 1)
#define TACC_REG_VIRTIO_DEVMEM_BASE	0x800	/* RW 64 */
#define TACC_REG_VIRTIO_DEVMEM_SIZE	0x808	/* RW 64 */

/* --------------------------- BAR0: VF migration (PF only, hw 1.4) ---- */
/*
 * Admin operations of the PF on one of its VFs (TACC_CAP_VF_MIGRATION), for
 * a VFIO migration driver (docs/hardware.md section 16).  Registers
 * 0x900..0x97f exist on the PF only: a VF reads 0 there and its writes are
 * ignored (and logged).  The PF's driver writes the operands, then
 * TACC_REG_VFMIG_CMD = op | vf << TACC_VFMIG_CMD_FN_SHIFT (vf: the VF's
 * FUNC value, 1-based); the operation is done when the write returns, and
 * TACC_REG_VFMIG_STATUS holds its TACC_VFMIG_ST_* (RESULT its result).
 * Buffers are IOVAs of the PF, read and written with the PF's own DMA.
 *
 * STOP: the VF fetches and starts nothing more, its sample timer stops;
 * commands already on engines complete (their CQEs and trace records are
 * written), then VF_STATE reads STOPPED.  RESUME: it runs again.  QUERY:
 * RESULT = the size of its state blob.  SAVE (STOPPED): the blob to
 * [ADDR, +LEN), RESULT = its size.  LOAD (STOPPED): the blob of LEN bytes
 * at ADDR replaces the VF's state and device-memory window, or is refused
 * with nothing changed.  LOG_START: log the pages of [LOG_IOVA, +LOG_LEN)
 * (page size 1 << LOG_PGSHIFT) the VF's DMA writes; LOG_REPORT: the bitmap
 * of [LOG_IOVA, +LOG_LEN) (inside the logged range, page aligned) to
 * [ADDR, +LEN), bit i = page i, and those bits cleared; LOG_STOP.
 */
#define TACC_REG_VFMIG_CMD		0x900	/* WO: op | vf << 8, runs the operation */
#define   TACC_VFMIG_CMD_FN_SHIFT	8
#define TACC_REG_VFMIG_STATUS		0x904	/* RO: TACC_VFMIG_ST_* of the last operation */
#define TACC_REG_VFMIG_ADDR		0x908	/* RW 64: buffer IOVA (PF's DMA), 8-byte aligned */
#define TACC_REG_VFMIG_LEN		0x910	/* RW 64: buffer bytes */
#define TACC_REG_VFMIG_RESULT		0x918	/* RO 64: blob or bitmap bytes */
#define TACC_REG_VFMIG_LOG_IOVA		0x920	/* RW 64: VF IOVA of a range */
#define TACC_REG_VFMIG_LOG_LEN		0x928	/* RW 64: its bytes */
#define TACC_REG_VFMIG_LOG_PGSHIFT	0x930	/* RW: log2 of the page size, 12 .. 30 */
#define TACC_REG_VFMIG_VF_STATE(vf)	(0x940 + (vf) * 4)	/* RO: 0-based vf */
#define TACC_REG_VFMIG_END		0x980
#define   TACC_VFMIG_STATE_MASK		0x3
#define   TACC_VFMIG_STATE_LOGGING	(1u << 8)	/* dirty logging on */
#define TACC_VFMIG_PGSHIFT_MIN		12
#define TACC_VFMIG_PGSHIFT_MAX		30
#define TACC_VFMIG_LOG_MAX_PAGES	(1ull << 24)	/* a logged range: 2 MiB of bitmap */

/* VF run states (VF_STATE bits 1:0) */
enum tacc_vfmig_state {
	TACC_VFMIG_RUNNING = 0,
	TACC_VFMIG_STOPPING = 1,	/* stopped, commands on engines still completing */
	TACC_VFMIG_STOPPED = 2,		/* nothing of the VF runs: SAVE and LOAD allowed */
};

/* Operations (VFMIG_CMD bits 7:0) */
enum tacc_vfmig_op {
	TACC_VFMIG_OP_QUERY = 1,
	TACC_VFMIG_OP_STOP = 2,
	TACC_VFMIG_OP_RESUME = 3,
	TACC_VFMIG_OP_SAVE = 4,
	TACC_VFMIG_OP_LOAD = 5,
	TACC_VFMIG_OP_LOG_START = 6,
	TACC_VFMIG_OP_LOG_STOP = 7,
	TACC_VFMIG_OP_LOG_REPORT = 8,
};

/* Statuses (VFMIG_STATUS) */
enum tacc_vfmig_status {
	TACC_VFMIG_ST_OK = 0,
	TACC_VFMIG_ST_BAD_OP = 1,	/* unknown operation */
	TACC_VFMIG_ST_BAD_FN = 2,	/* not an enabled VF */
	TACC_VFMIG_ST_BAD_STATE = 3,	/* SAVE/LOAD of a VF not STOPPED, logging already on/off */
	TACC_VFMIG_ST_BAD_ARG = 4,	/* buffer too small or misaligned, bad range or page shift */
	TACC_VFMIG_ST_DMA_ERROR = 5,	/* the PF's DMA of the buffer was refused */
	TACC_VFMIG_ST_BAD_MAGIC = 6,	/* LOAD: not a tacc VF state */
	TACC_VFMIG_ST_BAD_VERSION = 7,	/* LOAD: blob or VMState version not known */
	TACC_VFMIG_ST_BAD_LENGTH = 8,	/* LOAD: lengths disagree (truncated, padded) */
	TACC_VFMIG_ST_BAD_CRC = 9,	/* LOAD: damaged */
	TACC_VFMIG_ST_WRONG_FN = 10,	/* LOAD: another VF's state */
	TACC_VFMIG_ST_MISMATCH = 11,	/* LOAD: device-memory window size differs */
	TACC_VFMIG_ST_BAD_DATA = 12,	/* LOAD: refused by the state checks (section 15's) */
	TACC_VFMIG_ST_BUSY = 13,	/* hw 1.6: SAVE/LOAD still running; poll until it ends */
};

#define TACC_VFSTATE_MAGIC		0x53465654	/* "TVFS" */
#define TACC_VFSTATE_VERSION		1
#define TACC_VFSTATE_REGS_MAX		(1u << 20)	/* bytes of registers a blob may hold */

/**
 * struct tacc_vfstate_hdr - header of a VF state blob (SAVE, LOAD).
 * @magic: TACC_VFSTATE_MAGIC.
 * @version: TACC_VFSTATE_VERSION.
 * @hdr_size: sizeof(struct tacc_vfstate_hdr).
 * @fn: the VF it was saved from (FUNC value, 1-based); LOAD takes it only
 *	into the same VF.
 * @flags: 0.
 * @crc: CRC-32 (IEEE 802.3, as zlib's crc32) of the whole blob with this
 *	field 0.
 * @total_len: bytes of the blob: hdr_size + regs_len + devmem_len.
 * @regs_len: bytes of the function's registers and queues (QEMU VMState
 *	"tacc/func-regs", the section-15 encoding of a function without its
 *	PCI state), after the header.
 * @devmem_len: bytes of the VF's device-memory window, after the registers.
 * @hw_version: TACC_REG_VERSION of the device that saved it.
 * @regs_version: version of the register encoding (1).
 * @dev_ns: device time at save.
 * @rsvd: 0.
 */
struct tacc_vfstate_hdr {
	__le32 magic;
	__le16 version;
	__le16 hdr_size;
	__le16 fn;
	__le16 flags;
	__le32 crc;
	__le64 total_len;
	__le64 regs_len;
	__le64 devmem_len;
	__le32 hw_version;
	__le32 regs_version;
	__le64 dev_ns;
	__le64 rsvd;
};

/* --------------------------------------------------- BAR0: queues ---- */
#define TACC_QUEUE_BASE(q)		(0x1000 + (q) * 0x100)
#define TACC_Q_SQ_BASE			0x00	/* RW 64: IOVA, 4 KiB aligned */
#define TACC_Q_SQ_SIZE			0x08	/* RW: entries, power of two, 2..4096 */
#define TACC_Q_SQ_TAIL			0x0c	/* WO doorbell: index of next free slot */
#define TACC_Q_SQ_HEAD			0x10	/* RO: next slot the device will fetch */
#define TACC_Q_CQ_BASE			0x18	/* RW 64: IOVA, 4 KiB aligned */
#define TACC_Q_CQ_SIZE			0x20	/* RW: entries, power of two, 2..4096 */
#define TACC_Q_CQ_HEAD			0x24	/* RW: driver consumer index */
#define TACC_Q_CQ_TAIL			0x28	/* RO: device producer index */
#define TACC_Q_CTRL			0x2c	/* RW */
#define   TACC_Q_CTRL_ENABLE		(1u << 0)
#define   TACC_Q_CTRL_RESET		(1u << 1)	/* self-clearing: abort and empty */
#define   TACC_Q_CTRL_IRQ		(1u << 2)	/* MSI-X on completion entries */
#define TACC_Q_STATUS			0x30	/* RO */
#define   TACC_Q_STATUS_IDLE		(1u << 0)
#define   TACC_Q_STATUS_ERROR		(1u << 1)	/* bad ring configuration */
#define   TACC_Q_STATUS_HUNG		(1u << 2)	/* engine stopped (fault injection) */
#define TACC_Q_DEPTH			0x34	/* RO: descriptors fetched, not completed */

/* ------------------------------------------------------ descriptors ---- */
enum tacc_opcode {
	TACC_OP_NOP = 0,
	TACC_OP_COPY_H2D = 1,		/* host -> device memory, DMA H2D engine */
	TACC_OP_COPY_D2H = 2,		/* device -> host memory, DMA D2H engine */
	TACC_OP_COPY_D2D = 3,		/* device -> device memory, DMA H2D engine */
	TACC_OP_GEMM = 4,		/* C = alpha * op(A) x op(B) + beta * C + bias */
	TACC_OP_ELTWISE = 5,		/* elementwise, see tacc_eltwise_op */
	TACC_OP_FENCE = 6,		/* write a 64-bit value */
	TACC_OP_TIMESTAMP = 7,		/* write the device clock (u64) */
	TACC_OP_BARRIER = 8,		/* wait for every queue of the function to drain */
	TACC_OP_FILL = 9,		/* fill device memory (window offsets), TACC_CAP_FILL */
	TACC_OP_SOFTMAX = 10,		/* row softmax, scale, causal mask (TACC_CAP_NN_OPS) */
	TACC_OP_NORM = 11,		/* LayerNorm / RMSNorm over rows (TACC_CAP_NN_OPS) */
	TACC_OP_GATHER = 12,		/* rows of a table by an index vector (TACC_CAP_NN_OPS) */
	TACC_OP_LIST = 13,		/* execute a command list (TACC_CAP_CMD_LIST) */
	TACC_OP_MAX
};

enum tacc_eltwise_op {
	TACC_ELT_ADD = 0,		/* c = a + b */
	TACC_ELT_MUL = 1,		/* c = a * b */
	TACC_ELT_RELU = 2,		/* c = max(a, 0) */
	TACC_ELT_SCALE = 3,		/* c = a * scalar */
	TACC_ELT_GELU = 4,		/* tanh form (hw 1.3, TACC_CAP_NN_OPS) */
	TACC_ELT_SILU = 5,		/* c = a / (1 + exp(-a)) */
	TACC_ELT_EXP = 6,		/* c = exp(a) */
	TACC_ELT_CAST = 7,		/* c = a converted to dtype_c */
	TACC_ELT_MAX
};

/*
 * Element types of compute operands (hw 1.3).  0 is fp32, so a hw 1.2
 * descriptor (those bytes zero) keeps its meaning.  Arithmetic is fp32:
 * bf16 operands are widened exactly, results rounded to bf16 by round to
 * nearest even (NaN stays NaN).  I32 is for GATHER indices only.
 */
enum tacc_dtype {
	TACC_DT_FP32 = 0,
	TACC_DT_BF16 = 1,
	TACC_DT_I32 = 2,
	TACC_DT_MAX
};

#define TACC_DESC_F_IRQ		(1u << 0)	/* raise the queue vector after this */
#define TACC_DESC_F_LAST	(1u << 1)	/* last command of a job: write a CQE */

#define TACC_DESC_SIZE		128
#define TACC_COPY_MAX_LEN	(1ull << 32)	/* exclusive */
#define TACC_GEMM_MAX_DIM	4096		/* m, n, k: 1 .. 4096 */
#define TACC_GEMM_MAX_MNK	(1ull << 30)	/* batch * m * n * k, inclusive */
#define TACC_GEMM_MAX_LD	65536		/* lda, ldb, ldc */
#define TACC_GEMM_MAX_BATCH	65536		/* batch: 0 (= 1) .. 65536 */
#define TACC_ELT_MAX_N		(1ull << 26)	/* eltwise elements, inclusive */
#define TACC_ROW_MAX_COLS	65536		/* SOFTMAX, NORM, GATHER: cols, ld */
#define TACC_ROW_MAX_N		(1ull << 26)	/* rows * cols, inclusive */

/* GEMM flags (hw 1.3, TACC_CAP_GEMM_EX) */
#define TACC_GEMM_F_TRANS_A	(1u << 0)	/* op(A) = A^T: A is K x M, lda >= m */
#define TACC_GEMM_F_TRANS_B	(1u << 1)	/* op(B) = B^T: B is N x K, ldb >= k */
#define TACC_GEMM_F_BIAS	(1u << 2)	/* add the row vector bias[n] (dtype_c) to every row */
#define TACC_GEMM_F_ALL		0x7

/* ELTWISE flags (hw 1.3) */
#define TACC_ELT_F_ROW_BCAST	(1u << 0)	/* ADD/MUL: b is one row of cols elements */
#define TACC_ELT_F_ALL		0x1

/* SOFTMAX flags (hw 1.3) */
#define TACC_SOFTMAX_F_CAUSAL	(1u << 0)	/* column j of row r masked if j > r % period + pos */
#define TACC_SOFTMAX_F_ALL	0x1

enum tacc_norm_kind {
	TACC_NORM_LAYER = 0,		/* (x - mean) / sqrt(var + eps) * gamma + beta */
	TACC_NORM_RMS = 1,		/* x / sqrt(mean(x^2) + eps) * gamma */
	TACC_NORM_MAX
};

/*
 * NORM flags (hw 1.5, TACC_CAP_NORM_STATS).  STATS: the statistics of each
 * row are written at stats, fp32: LAYER rows means then rows 1/sqrt(var +
 * eps); RMS rows 1/sqrt(mean(x^2) + eps).
 */
#define TACC_NORM_F_STATS	(1u << 0)	/* write the row statistics */
#define TACC_NORM_F_ALL		0x1

/* Command lists (hw 1.3, TACC_CAP_CMD_LIST) */
#define TACC_LIST_MAX_CMDS	65536		/* count: 1 .. 65536 */
#define TACC_LIST_MAX_PATCHES	4096		/* npatch: 0 .. 4096 */
#define TACC_LIST_PARAMS	16		/* u32 parameter words in the LIST descriptor */
#define TACC_LIST_MAX_DEPTH	1		/* a listed command may not be a LIST */

enum tacc_patch_op {
	TACC_PATCH_SET32 = 0,		/* u32 at offset = param */
	TACC_PATCH_ADD32 = 1,		/* u32 at offset += param * mult (mod 2^32) */
	TACC_PATCH_ADD64 = 2,		/* u64 at offset += param * mult (mod 2^64) */
	TACC_PATCH_MAX
};

/**
 * struct tacc_list_patch - one parameter reference of a command list, 16 bytes.
 * @cmd: index of the listed command it patches; a table is sorted by @cmd
 *       (non-decreasing).
 * @offset: byte offset in that command's 104-byte payload (4-aligned for the
 *          32-bit ops, 8-aligned for ADD64, inside the payload).
 * @param: index into the LIST descriptor's params[] (< TACC_LIST_PARAMS).
 * @op: enum tacc_patch_op.
 * @mult: ADD32/ADD64 multiplier (two's complement), SET32: 0.
 *
 * The device applies the patches of a command to its fetched copy before
 * executing it; the list in memory is never written.
 */
struct tacc_list_patch {
	__u32 cmd;
	__u16 offset;
	__u8  param;
	__u8  op;
	__u64 mult;
};

#define TACC_LIST_PATCH_SIZE	16

/**
 * struct tacc_desc - one command, 128 bytes, in a submission ring.
 * @opcode: enum tacc_opcode.
 * @flags: TACC_DESC_F_*.
 * @ctx: context (address space) the command runs in.
 * @index: index of the command in its job.
 * @job: job sequence number (driver's), copied into completions and traces.
 * @tag: user tag (correlation id), copied into completions and traces.
 *
 * Every address is a device virtual address in @ctx, translated by the
 * device MMU; only page tables, rings and write-back areas are IOVAs.
 * Payload bytes an opcode does not use are reserved: zero (hw 1.3 gives
 * meaning to GEMM and ELTWISE bytes a hw 1.2 device ignored; zero keeps
 * the hw 1.2 behaviour).
 */
struct tacc_desc {
	__u8  opcode;
	__u8  flags;
	__u16 ctx;
	__u16 index;
	__u16 rsvd0;
	__u32 job;
	__u32 rsvd1;
	__u64 tag;
	union {
		struct {
			__u64 src;
			__u64 dst;
			__u64 len;	/* bytes, 1 .. TACC_COPY_MAX_LEN - 1 */
		} copy;
		struct {
			__u64 a;	/* op(A): M x K, row major, lda elements per row */
			__u64 b;	/* op(B): K x N, ldb */
			__u64 c;	/* M x N, ldc */
			__u32 m, n, k;
			__u32 lda, ldb, ldc;
			__u32 alpha;	/* fp32 bits */
			__u32 beta;	/* fp32 bits */
			/* hw 1.3 (TACC_CAP_GEMM_EX); all zero = the hw 1.2 fp32 GEMM */
			__u8  dtype_ab;	/* enum tacc_dtype of A and B: FP32, BF16 */
			__u8  dtype_c;	/* of C (and of bias): FP32, BF16 */
			__u8  gflags;	/* TACC_GEMM_F_* */
			__u8  rsvd;
			__u32 batch;	/* 0 or 1: one GEMM; else batch GEMMs */
			__u64 bias;	/* TACC_GEMM_F_BIAS: VA of n elements, else 0 */
			__u64 stride_a;	/* elements between batches of A */
			__u64 stride_b;	/* of B (0: B shared by the batches) */
			__u64 stride_c;	/* of C */
			__u64 rsvd2;
		} gemm;
		struct {
			__u64 a;
			__u64 b;	/* ADD and MUL only */
			__u64 c;
			__u64 n;	/* elements */
			__u32 op;	/* enum tacc_eltwise_op */
			__u32 scalar;	/* fp32 bits (SCALE) */
			/* hw 1.3; zero = fp32 */
			__u8  dtype_a;	/* enum tacc_dtype of a (and b) */
			__u8  dtype_c;	/* of c; CAST: the target type */
			__u8  eflags;	/* TACC_ELT_F_* */
			__u8  rsvd;
			__u32 cols;	/* ROW_BCAST: b has cols elements, cols divides n */
		} eltwise;
		struct {
			__u64 addr;	/* 8-byte aligned VA */
			__u64 value;
		} fence;
		struct {
			__u64 addr;	/* 8-byte aligned VA */
		} timestamp;
		struct {
			__u64 dst;	/* offset in the function's device-memory
					 * window (not a VA: no MMU, @ctx unused),
					 * 8-byte aligned */
			__u64 len;	/* bytes, multiple of 8, 8 .. TACC_COPY_MAX_LEN - 8 */
			__u64 value;	/* 64-bit pattern, stored little endian */
		} fill;
		struct {
			__u64 x;	/* rows x cols, ldx elements per row */
			__u64 y;	/* rows x cols, ldy (may equal x) */
			__u32 rows, cols;
			__u32 ldx, ldy;
			__u32 scale;	/* fp32 bits: softmax(scale * x) */
			__u32 sflags;	/* TACC_SOFTMAX_F_* */
			__u32 pos;	/* CAUSAL: position of row 0 (decode) */
			__u32 period;	/* CAUSAL: rows per mask block (heads
					 * stacked); 0 = rows */
			__u8  dtype_x;
			__u8  dtype_y;
			__u16 rsvd;
		} softmax;
		struct {
			__u64 x;	/* rows x cols, ldx */
			__u64 y;	/* rows x cols, ldy (may equal x) */
			__u64 gamma;	/* cols elements, dtype_w */
			__u64 beta;	/* LAYER: cols elements, dtype_w; RMS: 0 */
			__u32 rows, cols;
			__u32 ldx, ldy;
			__u32 eps;	/* fp32 bits, >= 0 */
			__u8  kind;	/* enum tacc_norm_kind */
			__u8  dtype_x;
			__u8  dtype_y;
			__u8  dtype_w;	/* gamma and beta */
			/* hw 1.5 (TACC_CAP_NORM_STATS); zero: no statistics */
			__u32 nflags;	/* TACC_NORM_F_* */
			__u32 rsvd;
			__u64 stats;	/* TACC_NORM_F_STATS: VA of the statistics
					 * (2 x rows fp32 LAYER, rows RMS), else 0 */
		} norm;
		struct {
			__u64 table;	/* table_rows x cols, ld_table, dtype */
			__u64 idx;	/* rows I32 indices */
			__u64 out;	/* rows x cols, ld_out, dtype */
			__u32 rows, cols;
			__u32 ld_table, ld_out;
			__u32 table_rows;	/* an index outside [0, table_rows): BAD_INDEX */
			__u8  dtype;
			__u8  rsvd[3];
		} gather;
		struct {
			__u64 list;	/* VA of count struct tacc_desc, 128-byte aligned */
			__u64 patches;	/* VA of npatch struct tacc_list_patch, 16-byte aligned */
			__u32 count;	/* 1 .. TACC_LIST_MAX_CMDS */
			__u32 npatch;	/* 0 .. TACC_LIST_MAX_PATCHES (0: patches = 0) */
			__u32 list_id;	/* copied into the listed commands' trace records */
			__u32 rsvd;
			__u32 params[TACC_LIST_PARAMS];
			__u64 rsvd2;
		} list;
		__u8 payload[104];
	};
};

/* Completion status, in CQEs and trace records. */
enum tacc_status {
	TACC_ST_OK = 0,
	TACC_ST_BAD_OPCODE = 1,
	TACC_ST_BAD_LENGTH = 2,		/* zero/huge length, bad GEMM shape */
	TACC_ST_MMU_FAULT = 3,
	TACC_ST_DMA_ERROR = 4,		/* IOMMU refused, or injected */
	TACC_ST_BAD_CTX = 5,
	TACC_ST_ABORTED = 6,		/* queue reset while in flight, or skipped after an error */
	TACC_ST_BAD_ALIGN = 7,		/* misaligned fence/timestamp/fp32 operand */
	TACC_ST_NOT_PERMITTED = 8,	/* command not allowed in a list (FILL, BARRIER) */
	TACC_ST_BAD_LIST = 9,		/* list nested, malformed listed command or patch */
	TACC_ST_BAD_INDEX = 10,		/* GATHER index outside the table */
};

/**
 * struct tacc_cqe - completion entry, 32 bytes, written once per job (the
 * descriptor with TACC_DESC_F_LAST, or the first failing one; the rest of
 * a failed job is skipped up to and including its F_LAST descriptor).
 */
struct tacc_cqe {
	__u32 job;
	__u16 status;		/* enum tacc_status */
	__u8  queue;
	__u8  rsvd;
	__u64 tag;		/* tag of the last (or failing) command */
	__u64 start;		/* device ticks: first command started */
	__u64 end;		/* device ticks: last command ended */
};

#define TACC_CQE_SIZE		32
/* Fault injection "corrupt the next completion": job inverted, status: */
#define TACC_ST_CORRUPT		0xffff

/* ------------------------------------------------ link model ---- */
/*
 * PCIe link model constants (docs/hardware.md section 9, "PCIe link", hw 1.2).
 * Gen3, 4 and 5 use 128b/130b encoding, with one SKP ordered set (one block)
 * after every TACC_LINK_SKP_INTERVAL data blocks.  Per-TLP overhead: 4 bytes
 * STP token + sequence number, the TLP header (4 DW for 64-bit memory
 * requests, 3 DW for completions), 4 bytes LCRC.  Read requests never
 * exceed MRRS nor cross a 4 KiB boundary; the root port returns each in
 * completions cut at its Read Completion Boundary (QOM "rcb").  The receiver
 * of TLPs acknowledges every TACC_LINK_ACK_TLPS of them with an ACK DLLP;
 * the root port returns posted and non-posted credits with an UpdateFC DLLP
 * every TACC_LINK_FC_TLPS TLPs (the device advertises infinite completion
 * credits, so completions need none).
 */
#define TACC_LINK_ENC_NUM	128
#define TACC_LINK_ENC_DEN	130
#define TACC_LINK_SKP_INTERVAL	370	/* data blocks per SKP ordered set */
#define TACC_LINK_MWR_OVERHEAD	24	/* per memory-write TLP (D2H payload) */
#define TACC_LINK_CPL_OVERHEAD	20	/* per completion-with-data TLP (H2D payload) */
#define TACC_LINK_MRD_BYTES	24	/* per memory-read request TLP (upstream) */
#define TACC_LINK_DLLP_BYTES	8	/* ACK or UpdateFC: 6 bytes + 2-byte SDP token */
#define TACC_LINK_ACK_TLPS	4	/* TLPs acknowledged per ACK DLLP */
#define TACC_LINK_FC_TLPS	4	/* TLPs whose credits one UpdateFC returns */
#define TACC_LINK_RD_BOUNDARY	4096	/* a read request never crosses it */
#define TACC_LINK_FC_UNIT	16	/* bytes per flow-control data credit */
#define TACC_LINK_MSI_BYTES	4	/* an MSI-X message: one 4-byte memory write */

/* ------------------------------------------------ TLP capture (PF) ---- */
/*
 * The device records the TLPs of its link model (docs/hardware.md section
 * 11, TACC_CAP_TLP_CAPTURE): one struct tacc_tlp_rec per TLP that passes the
 * filters, into a ring with the trace ring's producer/consumer/drop rules.
 */
#define TACC_REG_TLPCAP_BASE		0x600	/* RW64: ring IOVA, 64-byte aligned */
#define TACC_REG_TLPCAP_SIZE		0x608	/* RW: entries, power of two */
#define TACC_REG_TLPCAP_CTRL		0x60c	/* RW */
#define   TACC_TLPCAP_CTRL_ENABLE	(1u << 0)	/* zeroes PROD, CONS, DROPPED, seq */
#define   TACC_TLPCAP_CTRL_NO_CTRL	(1u << 1)	/* leave out control traffic */
#define TACC_REG_TLPCAP_PROD		0x610	/* RO, free running */
#define TACC_REG_TLPCAP_CONS		0x614	/* RW, free running */
#define TACC_REG_TLPCAP_DROPPED		0x618	/* RO */
#define TACC_REG_TLPCAP_FUNCS		0x61c	/* RW: bit f = function f; 0 = all */
#define TACC_REG_TLPCAP_KINDS		0x620	/* RW: bit k = TACC_TLP_k; 0 = all */
#define TACC_REG_TLPCAP_WB		0x628	/* RW64: struct tacc_ring_wb IOVA */
#define TACC_REG_TLPCAP_ADDR_LO		0x630	/* RW64: capture addresses in [LO, HI) */
#define TACC_REG_TLPCAP_ADDR_HI		0x638	/* RW64: 0 = no address filter */
#define TACC_REG_TLPCAP_END		0x700
#define TACC_TLPCAP_MAX_ENTRIES		(1u << 20)

enum tacc_tlp_kind {
	TACC_TLP_MRD = 0,	/* memory read request (upstream) */
	TACC_TLP_MWR = 1,	/* memory write (upstream) */
	TACC_TLP_CPLD = 2,	/* completion with data (downstream) */
};

#define TACC_TLP_FMT_MRD64	0x20	/* header byte 0: Fmt 001 (4DW, no data), MRd */
#define TACC_TLP_FMT_MWR64	0x60	/* Fmt 011 (4DW, data), MWr */
#define TACC_TLP_FMT_CPLD	0x4a	/* Fmt 010 (3DW, data), Type 01010 CplD */
#define TACC_TLP_F_UP		(1u << 0)	/* device to host */
#define TACC_TLP_F_CTRL		(1u << 1)	/* control traffic */
#define TACC_TLP_VERSION	1

/**
 * struct tacc_tlp_rec - one captured TLP, 64 bytes.
 * @t_ps: modelled time the TLP starts on the link, picoseconds.
 * @addr: bus address (MRd/MWr: the request's; CplD: its first byte's).
 * @cmd_tag: user tag of the command (0: control traffic).
 * @seq: capture sequence number; a gap is a drop.
 * @payload: payload bytes (MRd: bytes requested).
 * @link_bytes: bytes on the link (payload and TLP overhead).
 * @req_id: requester ID (the function's BDF).
 * @cpl_id: completer ID (CplD: the root port's BDF).
 * @tag: MRd/CplD tag.
 * @len_dw: the header's Length field (DW).
 * @byte_count: CplD: bytes of the request left, this one included.
 * @fmt_type: header byte 0 (TACC_TLP_FMT_*).
 * @kind: enum tacc_tlp_kind.
 * @flags: TACC_TLP_F_*.
 * @be: first DW byte enables [3:0], last DW [7:4] (MRd/MWr).
 * @lower_addr: CplD: address [6:0].
 * @func: function (0 = PF, n = VF n).
 * @version: TACC_TLP_VERSION.
 * @queue: queue of the command (255: none).
 * @ctx: context of the command.
 * @job: job of the command.
 * @rsvd: 0.
 */
struct tacc_tlp_rec {
	__u64 t_ps;
	__u64 addr;
	__u64 cmd_tag;
	__u32 seq;
	__u16 payload;
	__u16 link_bytes;
	__u16 req_id;
	__u16 cpl_id;
	__u16 tag;
	__u16 len_dw;
	__u16 byte_count;
	__u8  fmt_type;
	__u8  kind;
	__u8  flags;
	__u8  be;
	__u8  lower_addr;
	__u8  func;
	__u8  version;
	__u8  queue;
	__u16 ctx;
	__u32 job;
	__u64 rsvd;
};

#define TACC_TLP_REC_SIZE	64

/* ---------------------------------------------------- page tables ---- */
/*
 * Three levels of 512 8-byte entries in 4 KiB tables (host memory, IOVAs):
 * VA[38:30] indexes level 0, VA[29:21] level 1, VA[20:12] level 2.
 * A level-1 entry with TACC_PTE_HUGE maps a 2 MiB page; level-0 entries are
 * never leaves.  A leaf with TACC_PTE_DEVMEM maps device memory (address =
 * offset in the function's window), otherwise host memory (address = IOVA).
 */
#define TACC_VA_BITS		39
#define TACC_PAGE_SHIFT		12
#define TACC_HUGE_SHIFT		21
#define TACC_PT_ENTRIES		512
#define TACC_PTE_VALID		(1ull << 0)
#define TACC_PTE_WRITE		(1ull << 1)
#define TACC_PTE_HUGE		(1ull << 2)
#define TACC_PTE_DEVMEM		(1ull << 3)
#define TACC_PTE_ADDR_MASK	0x000ffffffffff000ull

/* ------------------------------ BAR0: link power management (PF) ---- */
/*
 * ASPM L0s/L1 of the device's link (docs/hardware.md "Link power management",
 * TACC_CAP_LINK_PM): a state is used when the ASPM Control bits of Link
 * Control enable it on both ends of the link (this device's PCIe capability
 * and its upstream port's).  Times are device ticks.  Counts and residency
 * include the state the link is in at the time of the read.
 */
#define TACC_REG_LINKPM_STATE		0x700	/* RO */
#define   TACC_LINKPM_STATE_MASK	0x3	/* TACC_LINKPM_L0, _L0S, _L1 */
#define   TACC_LINKPM_SUB_SHIFT		2	/* in L1: TACC_LINKPM_L1_0, _1, _2 */
#define   TACC_LINKPM_SUB_MASK		(0x3u << 2)
#define   TACC_LINKPM_EN_L0S		(1u << 4)	/* both ends enable L0s */
#define   TACC_LINKPM_EN_L1		(1u << 5)	/* both ends enable L1 */
#define   TACC_LINKPM_EN_L1_1		(1u << 6)	/* both ends' L1SS: ASPM L1.1 */
#define   TACC_LINKPM_EN_L1_2		(1u << 7)	/* ASPM L1.2 and LTR on both ends */
#define   TACC_LINKPM_LTR_L1_2		(1u << 8)	/* LTR >= LTR_L1.2_THRESHOLD */
#define TACC_REG_LINKPM_L0S_ENTRY	0x704	/* RO: idle ns before L0s */
#define TACC_REG_LINKPM_L0S_EXIT	0x708	/* RO: L0s exit latency, ns */
#define TACC_REG_LINKPM_L1_ENTRY	0x70c	/* RO: idle ns before L1 */
#define TACC_REG_LINKPM_L1_EXIT		0x710	/* RO: L1 exit latency, ns */
#define TACC_REG_LINKPM_L11_EXIT	0x714	/* RO: L1.1 exit latency, ns */
#define TACC_REG_LINKPM_L0S_ENTRIES	0x718	/* RO64 */
#define TACC_REG_LINKPM_L0S_EXITS	0x720	/* RO64 */
#define TACC_REG_LINKPM_L0S_TICKS	0x728	/* RO64: residency */
#define TACC_REG_LINKPM_L1_ENTRIES	0x730	/* RO64 */
#define TACC_REG_LINKPM_L1_EXITS	0x738	/* RO64 */
#define TACC_REG_LINKPM_L1_TICKS	0x740	/* RO64: residency */
#define TACC_REG_LINKPM_EXIT_TICKS	0x748	/* RO64: exit latency the link paid */
/* L1 PM Substates (docs/hardware.md "L1 PM Substates"): L1.1/L1.2 within L1 */
#define TACC_REG_LINKPM_L11_ENTRIES	0x750	/* RO32 */
#define TACC_REG_LINKPM_L11_EXITS	0x754	/* RO32 */
#define TACC_REG_LINKPM_L11_TICKS	0x758	/* RO64: residency */
#define TACC_REG_LINKPM_L12_ENTRIES	0x760	/* RO32 */
#define TACC_REG_LINKPM_L12_EXITS	0x764	/* RO32 */
#define TACC_REG_LINKPM_L12_TICKS	0x768	/* RO64: residency */
#define TACC_REG_LINKPM_L12_EXIT	0x770	/* RO: L1.2 exit latency now, ns */
#define TACC_REG_LINKPM_L12_THRESHOLD	0x774	/* RO: LTR_L1.2_THRESHOLD now, ns */
#define TACC_REG_LINKPM_LTR		0x778	/* RO: latency tolerance reported, ns */
#define TACC_REG_LINKPM_END		0x780

enum tacc_linkpm_state {
	TACC_LINKPM_L0 = 0,
	TACC_LINKPM_L0S = 1,
	TACC_LINKPM_L1 = 2,
};

enum tacc_linkpm_substate {	/* LINKPM_STATE[3:2] in L1 */
	TACC_LINKPM_L1_0 = 0,
	TACC_LINKPM_L1_1 = 1,
	TACC_LINKPM_L1_2 = 2,
};

/* -------------------------------------------------------- trace ring ---- */
#define TACC_TRACE_VERSION	2
#define TACC_TRACE_VERSION_3	3
/*
 * Version 2 (hw 1.2) adds event records: @opcode >= TACC_TRACE_EV_BASE is not
 * a command but an event of the function's front end (docs/virtio.md,
 * "Trace records"); the layout is unchanged, version-1 readers skip them.
 * Version 3 (hw 1.3, TRACE_CTRL.V3) is struct tacc_trace_rec3: the same
 * first 64 bytes (version 3) then the command's FLOPs, device-memory bytes
 * and command-list id, 128 bytes per record.
 */
#define TACC_TRACE_EV_BASE		0xf0
#define TACC_TRACE_EV_VIRTIO_KICK	0xf0	/* a submit buffer taken from the virtqueue */
#define TACC_TRACE_EV_VIRTIO_DISPATCH	0xf1	/* a job handed to a hardware queue */

/**
 * struct tacc_trace_rec - one record per executed command, 64 bytes.
 * @seq: per-function record sequence; a gap is a drop (also counted).
 * Times are device ticks: @t_fetch when the descriptor was fetched,
 * @t_start when its engine began, @t_end when it completed.
 */
struct tacc_trace_rec {
	__u8  version;
	__u8  opcode;
	__u8  engine;
	__u8  queue;
	__u16 func;
	__u16 ctx;
	__u32 seq;
	__u32 job;
	__u64 tag;
	__u64 t_fetch;
	__u64 t_start;
	__u64 t_end;
	__u32 bytes;
	__u32 tlps;
	__u16 index;
	__u16 status;
	__u16 tlb_misses;
	__u16 rsvd;
};

#define TACC_TRACE_REC_SIZE	64

/**
 * struct tacc_trace_rec3 - version-3 record (TRACE_CTRL.V3), 128 bytes.
 * @rec: the version-2 fields (rec.version = 3); for a listed command
 *       rec.index is its position in the list and rec.tag its own tag.
 * @flops: floating-point operations of the command (docs/hardware.md
 *         "FLOPs and bytes of a command").
 * @devmem_rd: device-memory bytes read.
 * @devmem_wr: device-memory bytes written.
 * @list_id: the list's id for a listed command, 0 otherwise.
 * @list_index: index of the LIST descriptor in its job (listed commands).
 * @dtype: the command's operand dtype (GEMM: A and B), enum tacc_dtype.
 * @sub_op: ELTWISE op, NORM kind, GEMM flags; else 0.
 * @rsvd: 0.
 */
struct tacc_trace_rec3 {
	struct tacc_trace_rec rec;
	__u64 flops;
	__u64 devmem_rd;
	__u64 devmem_wr;
	__u32 list_id;
	__u16 list_index;
	__u8  dtype;
	__u8  sub_op;
	__u64 rsvd[4];
};

#define TACC_TRACE_REC3_SIZE	128

/* Producer write-back for trace and sample rings (when *_WB is set). */
struct tacc_ring_wb {
	__u32 prod;
	__u32 dropped;
};

/* ----------------------------------------------------------- counters ---- */
/*
 * BAR2 page 0: this function's counters; page 1 (PF only; zero on VFs):
 * global counters.  Each counter is a u64 at 8 * index.  Slot 0 holds
 * TACC_CNT_HDR(): version << 32 | number of counters of the page.
 * Slot 1 is the update generation: odd while the device updates counters,
 * even otherwise; a reader wanting a consistent set reads gen, the
 * counters, gen again, and retries if gen was odd or changed.
 *
 * X(name, index, unit, description)
 */
#define TACC_CNT_VERSION		1
#define TACC_CNT_HDR(n)			(((__u64)TACC_CNT_VERSION << 32) | (n))
#define TACC_CNT_SLOT_HDR		0
#define TACC_CNT_SLOT_GEN		1
#define TACC_CNT_GLOBAL_PAGE		0x1000

#define TACC_FUNC_COUNTERS(X) \
	X(h2d_bytes,         2, "bytes",  "payload bytes read from host memory") \
	X(d2h_bytes,         3, "bytes",  "payload bytes written to host memory") \
	X(h2d_tlps,          4, "tlps",   "TLPs carrying H2D payload") \
	X(d2h_tlps,          5, "tlps",   "TLPs carrying D2H payload") \
	X(h2d_link_bytes,    6, "bytes",  "H2D link bytes incl. headers, framing, requests") \
	X(d2h_link_bytes,    7, "bytes",  "D2H link bytes incl. headers, framing, requests") \
	X(link_stall_ticks,  8, "ticks",  "engine ticks spent waiting for the link") \
	X(tlb_hits,          9, "events", "device TLB hits") \
	X(tlb_misses,       10, "events", "device TLB misses") \
	X(tlb_walk_reads,   11, "events", "page-table entries read by walks") \
	X(mmu_faults,       12, "events", "MMU faults") \
	X(dma_errors,       13, "events", "DMA accesses refused by the IOMMU") \
	X(irqs,             14, "events", "MSI-X messages sent") \
	X(trace_records,    15, "records", "trace records written") \
	X(trace_dropped,    16, "records", "trace records dropped (ring full)") \
	X(jobs_completed,   17, "jobs",   "completion entries written") \
	X(cmds_completed,   18, "cmds",   "commands executed") \
	X(flops,            19, "flop",   "floating-point operations executed") \
	X(busy_dma_h2d,     20, "ticks",  "DMA H2D engine busy for this function") \
	X(busy_dma_d2h,     21, "ticks",  "DMA D2H engine busy for this function") \
	X(busy_compute0,    22, "ticks",  "compute engine 0 busy for this function") \
	X(busy_compute1,    23, "ticks",  "compute engine 1 busy for this function") \
	X(busy_compute2,    24, "ticks",  "compute engine 2 busy for this function") \
	X(busy_compute3,    25, "ticks",  "compute engine 3 busy for this function") \
	X(cmds_dma_h2d,     26, "cmds",   "commands on the DMA H2D engine") \
	X(cmds_dma_d2h,     27, "cmds",   "commands on the DMA D2H engine") \
	X(cmds_compute0,    28, "cmds",   "commands on compute engine 0") \
	X(cmds_compute1,    29, "cmds",   "commands on compute engine 1") \
	X(cmds_compute2,    30, "cmds",   "commands on compute engine 2") \
	X(cmds_compute3,    31, "cmds",   "commands on compute engine 3") \
	X(queue0_depth_hwm, 32, "cmds",   "queue 0 depth high-water mark") \
	X(queue1_depth_hwm, 33, "cmds",   "queue 1 depth high-water mark") \
	X(queue2_depth_hwm, 34, "cmds",   "queue 2 depth high-water mark") \
	X(queue3_depth_hwm, 35, "cmds",   "queue 3 depth high-water mark") \
	X(devmem_read_bytes,  36, "bytes", "device memory bytes read") \
	X(devmem_write_bytes, 37, "bytes", "device memory bytes written") \
	X(d2h_req_tlps,     38, "tlps",   "read-request TLPs of H2D copies (upstream)") \
	X(dllp_h2d_bytes,   39, "bytes",  "DLLP bytes downstream, in h2d_link_bytes") \
	X(dllp_d2h_bytes,   40, "bytes",  "DLLP bytes upstream, in d2h_link_bytes") \
	X(ctrl_h2d_tlps,    41, "tlps",   "control TLPs downstream (descriptor completions)") \
	X(ctrl_d2h_tlps,    42, "tlps",   "control TLPs upstream (requests, CQEs, MSI-X, trace, samples)") \
	X(ctrl_h2d_link_bytes, 43, "bytes", "control traffic link bytes downstream") \
	X(ctrl_d2h_link_bytes, 44, "bytes", "control traffic link bytes upstream") \
	X(ctrl_dllp_h2d_bytes, 45, "bytes", "DLLP bytes in ctrl_h2d_link_bytes") \
	X(ctrl_dllp_d2h_bytes, 46, "bytes", "DLLP bytes in ctrl_d2h_link_bytes") \
	X(flops_bf16,       47, "flop",   "FLOPs of commands with bf16 operands (in flops)") \
	X(compute_ideal_ticks, 48, "ticks", "roofline time of compute commands: max(flops/peak, bytes/bw)") \
	X(list_launches,    49, "cmds",   "LIST commands executed") \
	X(list_cmds,        50, "cmds",   "listed commands executed (in cmds_completed)") \
	X(list_errors,      51, "cmds",   "lists ended by a refused or malformed listed command")

#define TACC_GLOBAL_COUNTERS(X) \
	X(link_h2d_busy_ticks,  2, "ticks", "H2D link direction busy") \
	X(link_d2h_busy_ticks,  3, "ticks", "D2H link direction busy") \
	X(link_h2d_bytes,       4, "bytes", "all H2D link bytes, every function") \
	X(link_d2h_bytes,       5, "bytes", "all D2H link bytes, every function") \
	X(link_h2d_payload,     6, "bytes", "H2D payload bytes, every function") \
	X(link_d2h_payload,     7, "bytes", "D2H payload bytes, every function") \
	X(uptime_ticks,         8, "ticks", "device clock at the last counter update") \
	X(link_l0s_entries,     9, "events", "link entered ASPM L0s") \
	X(link_l0s_exits,      10, "events", "link left L0s for a TLP") \
	X(link_l0s_ticks,      11, "ticks", "link in L0s") \
	X(link_l1_entries,     12, "events", "link entered ASPM L1") \
	X(link_l1_exits,       13, "events", "link left L1 for a TLP") \
	X(link_l1_ticks,       14, "ticks", "link in L1") \
	X(link_pm_exit_ticks,  15, "ticks", "L0s/L1 exit latency the link paid") \
	X(link_l11_entries,    16, "events", "link entered L1.1 (within L1)") \
	X(link_l11_exits,      17, "events", "link left L1.1 for a TLP") \
	X(link_l11_ticks,      18, "ticks", "link in L1.1 (in link_l1_ticks)") \
	X(link_l12_entries,    19, "events", "link entered L1.2 (within L1)") \
	X(link_l12_exits,      20, "events", "link left L1.2 for a TLP") \
	X(link_l12_ticks,      21, "ticks", "link in L1.2 (in link_l1_ticks)")

#define TACC_CNT_ENUM(name, idx, unit, desc)	TACC_CNT_##name = (idx),
enum tacc_func_counter { TACC_FUNC_COUNTERS(TACC_CNT_ENUM) TACC_FUNC_CNT_END };
enum tacc_global_counter { TACC_GLOBAL_COUNTERS(TACC_CNT_ENUM) TACC_GLOBAL_CNT_END };
#undef TACC_CNT_ENUM

/*
 * Device-side sampling: each sample ring entry is a snapshot of the
 * function's counter page (the global page is appended for the PF).
 * 8-byte header words then the counters in slot order.
 */
struct tacc_sample_hdr {
	__u32 version;		/* TACC_CNT_VERSION */
	__u32 nslots;		/* u64 counter slots following this header */
	__u64 seq;		/* sample number, free running */
	__u64 devclk;		/* device ticks when taken */
};

#define TACC_SAMPLE_SLOTS	64	/* function page slots 0..63 */
#define TACC_SAMPLE_SIZE	(sizeof(struct tacc_sample_hdr) + 2 * TACC_SAMPLE_SLOTS * 8)

#endif /* TACC_HW_H */
