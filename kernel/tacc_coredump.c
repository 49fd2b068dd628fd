// SPDX-License-Identifier: GPL-2.0-only OR MIT
/*
 * Device coredump (devcoredump) of a hung job or a fatal device error, read from
 * /sys/class/devcoredump/devcdN/data (the failing_device link names the function):
 * a text dump of the function's registers, every queue's state, the faulting job's
 * commands and the last records of the device trace ring (docs/sysfs-abi.md).
 * Built before the queue or function is reset; dev_coredumpv()
 * owns the buffer (freed when read out, or after its timeout).
 */

#include <linux/devcoredump.h>
#include <linux/ktime.h>
#include <linux/sizes.h>
#include <linux/vmalloc.h>

#include <drm/drm_print.h>

#include "tacc_drv.h"

#define TACC_DUMP_SIZE		SZ_64K
#define TACC_DUMP_CMDS		64	/* commands of the faulting job */
#define TACC_DUMP_TRACE_RECS	32	/* last device trace records */

static const struct {
	const char *name;
	u32 reg;
	bool wide;
} tacc_dump_regs[] = {
	{ "VERSION", TACC_REG_VERSION }, { "CAPS", TACC_REG_CAPS },
	{ "FUNC", TACC_REG_FUNC }, { "CTRL", TACC_REG_CTRL },
	{ "STATUS", TACC_REG_STATUS }, { "IRQ_STATUS", TACC_REG_IRQ_STATUS },
	{ "IRQ_MASK", TACC_REG_IRQ_MASK }, { "DEVCLK", TACC_REG_DEVCLK, true },
	{ "FAULT_ADDR", TACC_REG_FAULT_ADDR, true }, { "FAULT_INFO", TACC_REG_FAULT_INFO },
	{ "FAULT_TAG", TACC_REG_FAULT_TAG, true }, { "TLB_INV_SEQ", TACC_REG_TLB_INV_SEQ },
	{ "TLB_INV_DONE", TACC_REG_TLB_INV_DONE }, { "TRACE_CTRL", TACC_REG_TRACE_CTRL },
	{ "TRACE_PROD", TACC_REG_TRACE_PROD }, { "TRACE_DROPPED", TACC_REG_TRACE_DROPPED },
	{ "QUEUE_MASK", TACC_REG_QUEUE_MASK },
};

static void tacc_dump_regs_print(struct drm_printer *p, struct tacc_device *tdev)
{
	u32 i;

	drm_printf(p, "registers:\n");
	for (i = 0; i < ARRAY_SIZE(tacc_dump_regs); i++) {
		if (tacc_dump_regs[i].wide)
			drm_printf(p, "  %s: 0x%016llx\n", tacc_dump_regs[i].name,
				   tacc_rd64(tdev, tacc_dump_regs[i].reg));
		else
			drm_printf(p, "  %s: 0x%08x\n", tacc_dump_regs[i].name,
				   tacc_rd(tdev, tacc_dump_regs[i].reg));
	}
}

static void tacc_dump_queues(struct drm_printer *p, struct tacc_device *tdev, bool hw)
{
	u32 i;

	drm_printf(p, "queues:\n");
	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];

		drm_printf(p, "  queue %u: sq_tail %u cq_head %u jobs_done %llu jobs_failed %llu resets %llu",
			   i, q->sq_tail, q->cq_head, q->jobs_done, q->jobs_failed, q->resets);
		if (hw)
			drm_printf(p, " SQ_HEAD %u CQ_TAIL %u STATUS 0x%x DEPTH %u",
				   tacc_qrd(q, TACC_Q_SQ_HEAD), tacc_qrd(q, TACC_Q_CQ_TAIL),
				   tacc_qrd(q, TACC_Q_STATUS), tacc_qrd(q, TACC_Q_DEPTH));
		drm_printf(p, "\n");
	}
}

static void tacc_dump_job(struct drm_printer *p, struct tacc_queue *q, struct tacc_job *job)
{
	u32 i;

	drm_printf(p, "job: queue %u context %u pid %d comm %s seqno %llu hw_job %u tag 0x%llx commands %u\n",
		   q->idx, job->ctx->id, job->ctx->pid, job->ctx->comm, job->seqno, job->hw_job,
		   job->tag, job->num_cmds);
	for (i = 0; i < min_t(u32, job->num_cmds, TACC_DUMP_CMDS); i++) {
		const u64 *w = (const u64 *)&job->descs[i];

		drm_printf(p, "  cmd %u: opcode %u flags 0x%x tag 0x%llx words %016llx %016llx %016llx %016llx %016llx %016llx %016llx %016llx\n",
			   i, job->descs[i].opcode, job->descs[i].flags, job->descs[i].tag,
			   w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
	}
}

static void tacc_dump_trace(struct drm_printer *p, struct tacc_device *tdev, bool hw)
{
	struct tacc_ring *tr = &tdev->trace;
	u32 prod, n, i;

	mutex_lock(&tr->lock);
	if (!tr->cpu || !tr->entries || !hw) {
		drm_printf(p, "trace: ring not open\n");
		goto out;
	}
	prod = tacc_rd(tdev, TACC_REG_TRACE_PROD);
	n = min3(prod, tr->entries, (u32)TACC_DUMP_TRACE_RECS);
	drm_printf(p, "trace: last %u of %u records\n", n, prod);
	for (i = prod - n; i != prod; i++) {
		const struct tacc_trace_rec *r = tr->cpu + PAGE_SIZE +
			(size_t)(i & (tr->entries - 1)) * TACC_TRACE_REC_SIZE;

		drm_printf(p, "  rec seq %u opcode %u engine %u queue %u ctx %u job %u tag 0x%llx fetch %llu start %llu end %llu status %u\n",
			   r->seq, r->opcode, r->engine, r->queue, r->ctx, r->job, r->tag,
			   r->t_fetch, r->t_start, r->t_end, r->status);
	}
out:
	mutex_unlock(&tr->lock);
}

/**
 * tacc_coredump() - a devcoredump of the function, before it is reset.
 * @tdev: the function.
 * @reason: "job timeout" or "fatal error".
 * @q: the queue of @job, or NULL.
 * @job: the faulting job, or NULL (a fatal error names none).
 *
 * Context: may sleep (vmalloc, the trace ring's mutex).
 */
void tacc_coredump(struct tacc_device *tdev, const char *reason, struct tacc_queue *q,
		   struct tacc_job *job)
{
	struct drm_print_iterator pi = {};
	struct drm_printer p;
	bool hw = tdev->hw_up;
	char *buf;

	buf = vmalloc(TACC_DUMP_SIZE);
	if (!buf)
		return;
	pi.data = buf;
	pi.remain = TACC_DUMP_SIZE;
	p = drm_coredump_printer(&pi);
	drm_printf(&p, "tacc devcoredump 1\n");
	drm_printf(&p, "reason: %s\n", reason);
	drm_printf(&p, "device: %s\n", pci_name(tdev->pdev));
	/* CLOCK_MONOTONIC: where the timeline places the dump */
	drm_printf(&p, "time_ns: %llu\n", ktime_get_ns());
	if (hw)
		tacc_dump_regs_print(&p, tdev);
	else
		drm_printf(&p, "registers: function down\n");
	tacc_dump_queues(&p, tdev, hw);
	if (q && job)
		tacc_dump_job(&p, q, job);
	tacc_dump_trace(&p, tdev, hw);
	drm_printf(&p, "end\n");
	dev_coredumpv(tacc_to_dev(tdev), buf, pi.offset, GFP_KERNEL);
}
