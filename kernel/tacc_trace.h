/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Tracepoints of the tacc driver, system "tacc".  docs/tracepoints.md
 * documents every field.  Events that belong to a job carry its user tag,
 * context and queue.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM tacc

#if !defined(__TACC_TRACE_H__) || defined(TRACE_HEADER_MULTI_READ)
#define __TACC_TRACE_H__

#include <linux/tracepoint.h>
#include <linux/pci.h>

TRACE_EVENT(tacc_ioctl_enter,
	TP_PROTO(u32 dev, u32 ctx, unsigned int cmd),
	TP_ARGS(dev, ctx, cmd),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, nr)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->nr = cmd;
	),
	TP_printk("dev=%x ctx=%u nr=0x%x", __entry->dev, __entry->ctx, __entry->nr)
);

TRACE_EVENT(tacc_ioctl_exit,
	TP_PROTO(u32 dev, u32 ctx, unsigned int cmd, int ret),
	TP_ARGS(dev, ctx, cmd, ret),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, nr)
		__field(int, ret)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->nr = cmd;
		__entry->ret = ret;
	),
	TP_printk("dev=%x ctx=%u nr=0x%x ret=%d", __entry->dev, __entry->ctx,
		  __entry->nr, __entry->ret)
);

TRACE_EVENT(tacc_submit,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 seqno, u64 tag, u32 ncmds, u64 bytes,
		 u32 mix),
	TP_ARGS(dev, ctx, queue, seqno, tag, ncmds, bytes, mix),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u32, ncmds)
		__field(u64, seqno)
		__field(u64, tag)
		__field(u64, bytes)
		__field(u32, mix)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->ncmds = ncmds;
		__entry->seqno = seqno;
		__entry->tag = tag;
		__entry->bytes = bytes;
		__entry->mix = mix;
	),
	TP_printk("dev=%x ctx=%u queue=%u seqno=%llu tag=0x%llx ncmds=%u bytes=%llu mix=0x%x",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->seqno,
		  __entry->tag, __entry->ncmds, __entry->bytes, __entry->mix)
);

TRACE_EVENT(tacc_doorbell,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 seqno, u64 tag, u32 hw_job, u32 tail),
	TP_ARGS(dev, ctx, queue, seqno, tag, hw_job, tail),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u32, hw_job)
		__field(u32, tail)
		__field(u64, seqno)
		__field(u64, tag)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->hw_job = hw_job;
		__entry->tail = tail;
		__entry->seqno = seqno;
		__entry->tag = tag;
	),
	TP_printk("dev=%x ctx=%u queue=%u seqno=%llu tag=0x%llx hw_job=%u tail=%u",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->seqno,
		  __entry->tag, __entry->hw_job, __entry->tail)
);

TRACE_EVENT(tacc_irq,
	TP_PROTO(u32 dev, u32 vector, u32 status),
	TP_ARGS(dev, vector, status),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, vector)
		__field(u32, status)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->vector = vector;
		__entry->status = status;
	),
	TP_printk("dev=%x vector=%u status=0x%x", __entry->dev, __entry->vector,
		  __entry->status)
);

TRACE_EVENT(tacc_job_start,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 seqno, u64 tag, u32 hw_job, u32 tail),
	TP_ARGS(dev, ctx, queue, seqno, tag, hw_job, tail),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u32, hw_job)
		__field(u64, seqno)
		__field(u64, tag)
		__field(u32, tail)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->hw_job = hw_job;
		__entry->seqno = seqno;
		__entry->tag = tag;
		__entry->tail = tail;
	),
	TP_printk("dev=%x ctx=%u queue=%u seqno=%llu tag=0x%llx hw_job=%u tail=%u",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->seqno,
		  __entry->tag, __entry->hw_job, __entry->tail)
);

TRACE_EVENT(tacc_job_done,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 seqno, u64 tag, u32 hw_job,
		 u32 status, int error, u64 dev_start, u64 dev_end),
	TP_ARGS(dev, ctx, queue, seqno, tag, hw_job, status, error, dev_start, dev_end),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u32, hw_job)
		__field(u64, seqno)
		__field(u64, tag)
		__field(u32, status)
		__field(int, error)
		__field(u64, dev_start)
		__field(u64, dev_end)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->hw_job = hw_job;
		__entry->seqno = seqno;
		__entry->tag = tag;
		__entry->status = status;
		__entry->error = error;
		__entry->dev_start = dev_start;
		__entry->dev_end = dev_end;
	),
	TP_printk("dev=%x ctx=%u queue=%u seqno=%llu tag=0x%llx hw_job=%u status=%u error=%d start=%llu end=%llu",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->seqno,
		  __entry->tag, __entry->hw_job, __entry->status, __entry->error,
		  __entry->dev_start, __entry->dev_end)
);

TRACE_EVENT(tacc_bo_create,
	TP_PROTO(u32 dev, u32 ctx, const void *bo, u32 type, u64 size, u32 flags),
	TP_ARGS(dev, ctx, bo, type, size, flags),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(const void *, bo)
		__field(u32, type)
		__field(u32, flags)
		__field(u64, size)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->bo = bo;
		__entry->type = type;
		__entry->flags = flags;
		__entry->size = size;
	),
	TP_printk("dev=%x ctx=%u bo=%p type=%u size=%llu flags=0x%x",
		  __entry->dev, __entry->ctx, __entry->bo, __entry->type,
		  __entry->size, __entry->flags)
);

TRACE_EVENT(tacc_bo_destroy,
	TP_PROTO(u32 dev, const void *bo, u32 type, u64 size),
	TP_ARGS(dev, bo, type, size),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(const void *, bo)
		__field(u32, type)
		__field(u64, size)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->bo = bo;
		__entry->type = type;
		__entry->size = size;
	),
	TP_printk("dev=%x bo=%p type=%u size=%llu", __entry->dev, __entry->bo,
		  __entry->type, __entry->size)
);

DECLARE_EVENT_CLASS(tacc_dma_class,
	TP_PROTO(u32 dev, const void *bo, u64 iova, u64 len, u32 nents, u32 dir),
	TP_ARGS(dev, bo, iova, len, nents, dir),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(const void *, bo)
		__field(u64, iova)
		__field(u64, len)
		__field(u32, nents)
		__field(u32, dir)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->bo = bo;
		__entry->iova = iova;
		__entry->len = len;
		__entry->nents = nents;
		__entry->dir = dir;
	),
	TP_printk("dev=%x bo=%p iova=0x%llx len=%llu segments=%u dir=%u",
		  __entry->dev, __entry->bo, __entry->iova, __entry->len,
		  __entry->nents, __entry->dir)
);

DEFINE_EVENT(tacc_dma_class, tacc_dma_map,
	TP_PROTO(u32 dev, const void *bo, u64 iova, u64 len, u32 nents, u32 dir),
	TP_ARGS(dev, bo, iova, len, nents, dir));

DEFINE_EVENT(tacc_dma_class, tacc_dma_unmap,
	TP_PROTO(u32 dev, const void *bo, u64 iova, u64 len, u32 nents, u32 dir),
	TP_ARGS(dev, bo, iova, len, nents, dir));

DECLARE_EVENT_CLASS(tacc_vm_class,
	TP_PROTO(u32 dev, u32 ctx, const void *bo, u64 va, u64 size, u64 page_size),
	TP_ARGS(dev, ctx, bo, va, size, page_size),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(const void *, bo)
		__field(u64, va)
		__field(u64, size)
		__field(u64, page_size)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->bo = bo;
		__entry->va = va;
		__entry->size = size;
		__entry->page_size = page_size;
	),
	TP_printk("dev=%x ctx=%u bo=%p va=0x%llx size=%llu page_size=%llu",
		  __entry->dev, __entry->ctx, __entry->bo, __entry->va,
		  __entry->size, __entry->page_size)
);

DEFINE_EVENT(tacc_vm_class, tacc_vm_bind,
	TP_PROTO(u32 dev, u32 ctx, const void *bo, u64 va, u64 size, u64 page_size),
	TP_ARGS(dev, ctx, bo, va, size, page_size));

DEFINE_EVENT(tacc_vm_class, tacc_vm_unbind,
	TP_PROTO(u32 dev, u32 ctx, const void *bo, u64 va, u64 size, u64 page_size),
	TP_ARGS(dev, ctx, bo, va, size, page_size));

TRACE_EVENT(tacc_mmu_fault,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 tag, u64 addr, u32 type, bool write),
	TP_ARGS(dev, ctx, queue, tag, addr, type, write),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u64, tag)
		__field(u64, addr)
		__field(u32, type)
		__field(bool, write)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->tag = tag;
		__entry->addr = addr;
		__entry->type = type;
		__entry->write = write;
	),
	TP_printk("dev=%x ctx=%u queue=%u tag=0x%llx addr=0x%llx type=%u write=%d",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->tag,
		  __entry->addr, __entry->type, __entry->write)
);

TRACE_EVENT(tacc_pm,
	TP_PROTO(u32 dev, u32 from, u32 to),
	TP_ARGS(dev, from, to),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, from)
		__field(u32, to)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->from = from;
		__entry->to = to;
	),
	TP_printk("dev=%x from=D%u to=D%u", __entry->dev, __entry->from, __entry->to)
);

TRACE_EVENT(tacc_reset,
	TP_PROTO(u32 dev, u32 ctx, u32 queue, u64 seqno, u64 tag, int reason),
	TP_ARGS(dev, ctx, queue, seqno, tag, reason),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u64, seqno)
		__field(u64, tag)
		__field(int, reason)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->seqno = seqno;
		__entry->tag = tag;
		__entry->reason = reason;
	),
	TP_printk("dev=%x ctx=%u queue=%u seqno=%llu tag=0x%llx reason=%d",
		  __entry->dev, __entry->ctx, __entry->queue, __entry->seqno,
		  __entry->tag, __entry->reason)
);

/* every device event tacc.ko sends on its genetlink family, for stock tools (perf, ftrace) */
TRACE_EVENT(tacc_device_event,
	TP_PROTO(u32 dev, u32 event, u32 ctx, u32 queue, u64 addr, u32 info, u64 tag,
		 u64 seqno),
	TP_ARGS(dev, event, ctx, queue, addr, info, tag, seqno),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, event)
		__field(u32, ctx)
		__field(u32, queue)
		__field(u64, addr)
		__field(u32, info)
		__field(u64, tag)
		__field(u64, seqno)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->event = event;
		__entry->ctx = ctx;
		__entry->queue = queue;
		__entry->addr = addr;
		__entry->info = info;
		__entry->tag = tag;
		__entry->seqno = seqno;
	),
	TP_printk("dev=%x event=%u ctx=%u queue=%u addr=0x%llx info=0x%x tag=0x%llx seqno=%llu",
		  __entry->dev, __entry->event, __entry->ctx, __entry->queue, __entry->addr,
		  __entry->info, __entry->tag, __entry->seqno)
);

TRACE_EVENT(tacc_trace_drop,
	TP_PROTO(u32 dev, u32 dropped, u32 total),
	TP_ARGS(dev, dropped, total),
	TP_STRUCT__entry(
		__field(u32, dev)
		__field(u32, dropped)
		__field(u32, total)
	),
	TP_fast_assign(
		__entry->dev = dev;
		__entry->dropped = dropped;
		__entry->total = total;
	),
	TP_printk("dev=%x dropped=%u total=%u", __entry->dev, __entry->dropped,
		  __entry->total)
);

#endif /* __TACC_TRACE_H__ */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE tacc_trace
#include <trace/define_trace.h>
