// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc interrupts: one MSI-X vector per queue (completions), one for
 * errors (MMU fault, DMA error, fatal), one for the trace/sample rings.
 */
#include <linux/delay.h>
#include <linux/interrupt.h>
#include <linux/pci.h>

#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

static irqreturn_t tacc_queue_irq(int irq, void *arg)
{
	struct tacc_queue *q = arg;

	trace_tacc_irq(tacc_devid(q->tdev), TACC_MSIX_QUEUE(q->idx), 0);
	tacc_queue_process_cq(q);
	return IRQ_HANDLED;
}

static void tacc_handle_mmu_fault(struct tacc_device *tdev)
{
	u32 info = tacc_rd(tdev, TACC_REG_FAULT_INFO);
	u64 addr = tacc_rd64(tdev, TACC_REG_FAULT_ADDR);
	u64 tag = tacc_rd64(tdev, TACC_REG_FAULT_TAG);
	u32 id = info & TACC_FAULT_CTX_MASK;
	u32 queue = (info & TACC_FAULT_QUEUE_MASK) >> TACC_FAULT_QUEUE_SHIFT;
	u32 type = (info & TACC_FAULT_TYPE_MASK) >> TACC_FAULT_TYPE_SHIFT;
	struct tacc_ctx *ctx = NULL;

	tacc_wr(tdev, TACC_REG_FAULT_CLEAR, 1);
	if (!(info & TACC_FAULT_VALID))
		return;
	atomic64_inc(&tdev->mmu_faults);

	/*
	 * ctxs[] holds a context until its release takes ctx_lock, also after
	 * its last reference is gone: take a reference only on a live one.
	 */
	mutex_lock(&tdev->ctx_lock);
	if (unlikely(READ_ONCE(tdev->fault_ctx_delay_ms)))
		msleep(READ_ONCE(tdev->fault_ctx_delay_ms));
	if (id < tdev->num_contexts && tdev->ctxs[id] &&
	    kref_get_unless_zero(&tdev->ctxs[id]->ref))
		ctx = tdev->ctxs[id];
	mutex_unlock(&tdev->ctx_lock);

	trace_tacc_mmu_fault(tacc_devid(tdev), id, queue, tag, addr, type,
			     !!(info & TACC_FAULT_WRITE));
	if (ctx) {
		atomic64_inc(&ctx->faults);
		atomic64_set(&ctx->fault_addr, addr);
	}
	drm_dbg_driver(&tdev->drm, "MMU fault ctx %u queue %u va 0x%llx type %u%s tag 0x%llx\n",
		       id, queue, addr, type, (info & TACC_FAULT_WRITE) ? " write" : "", tag);
	tacc_genl_event(tdev, TACC_EVENT_MMU_FAULT, ctx, queue, addr, info, tag, 0, GFP_KERNEL);
	if (ctx)
		tacc_ctx_put(ctx);
}

static irqreturn_t tacc_error_irq_thread(int irq, void *arg)
{
	struct tacc_device *tdev = arg;
	u32 status = tacc_rd(tdev, TACC_REG_IRQ_STATUS);

	trace_tacc_irq(tacc_devid(tdev), TACC_MSIX_ERROR, status);
	if (!status || status == ~0u)
		return IRQ_NONE;
	tacc_wr(tdev, TACC_REG_IRQ_STATUS, status);

	if (status & TACC_IRQ_MMU_FAULT)
		tacc_handle_mmu_fault(tdev);
	if (status & TACC_IRQ_DMA_ERROR) {
		atomic64_inc(&tdev->dma_errors);
		tacc_genl_event(tdev, TACC_EVENT_DMA_ERROR, NULL, 0, 0, status, 0, 0, GFP_KERNEL);
	}
	if (status & TACC_IRQ_FATAL) {
		atomic64_inc(&tdev->fatal_errors);
		drm_err(&tdev->drm, "fatal device error, status 0x%x\n",
			tacc_rd(tdev, TACC_REG_STATUS));
		tacc_genl_event(tdev, TACC_EVENT_FATAL, NULL, 0, 0, status, 0, 0, GFP_KERNEL);
		tacc_reset_fatal(tdev);	/* unless AER recovers it first */
	}
	if (status & TACC_IRQ_QUEUE_ERROR)
		drm_err(&tdev->drm, "queue configuration error\n");
	return IRQ_HANDLED;
}

/*
 * Trace/sample vector.  The trace cause stays masked; the SAMPLE cause
 * (sample ring half full) is unmasked while a sample consumer exists.  The
 * consumer polls the ring's mapped header, so acking is all there is to do.
 */
static irqreturn_t tacc_trace_irq(int irq, void *arg)
{
	struct tacc_device *tdev = arg;
	u32 status = tacc_rd(tdev, TACC_REG_IRQ_STATUS);

	if (status == ~0u)
		status = 0;
	status &= TACC_IRQ_TRACE | TACC_IRQ_SAMPLE;
	if (status)
		tacc_wr(tdev, TACC_REG_IRQ_STATUS, status);
	trace_tacc_irq(tacc_devid(tdev), TACC_MSIX_TRACE, status);
	return IRQ_HANDLED;
}

int tacc_irq_init(struct tacc_device *tdev)
{
	struct pci_dev *pdev = tdev->pdev;
	struct device *dev = &pdev->dev;
	int ret, n;
	u32 i;

	n = pci_alloc_irq_vectors(pdev, TACC_MSIX_VECTORS, TACC_MSIX_VECTORS, PCI_IRQ_MSIX);
	if (n < 0)
		return n;

	for (i = 0; i < tdev->num_queues; i++) {
		ret = devm_request_irq(dev, pci_irq_vector(pdev, TACC_MSIX_QUEUE(i)),
				       tacc_queue_irq, 0,
				       devm_kasprintf(dev, GFP_KERNEL, "tacc-%s-q%u",
						      pci_name(pdev), i),
				       &tdev->queues[i]);
		if (ret)
			return ret;
	}
	ret = devm_request_threaded_irq(dev, pci_irq_vector(pdev, TACC_MSIX_ERROR), NULL,
					tacc_error_irq_thread, IRQF_ONESHOT,
					devm_kasprintf(dev, GFP_KERNEL, "tacc-%s-err",
						       pci_name(pdev)), tdev);
	if (ret)
		return ret;
	return devm_request_irq(dev, pci_irq_vector(pdev, TACC_MSIX_TRACE), tacc_trace_irq, 0,
				devm_kasprintf(dev, GFP_KERNEL, "tacc-%s-trace", pci_name(pdev)),
				tdev);
}
