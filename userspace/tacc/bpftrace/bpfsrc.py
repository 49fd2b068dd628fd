"""C source of the one BPF program behind accel-bpftrace and taccd's capture mode.

Every tacc tracepoint and host tracepoint has a handler; the tool attaches only the
ones its mode needs, and filters (pid, comm, device) and modes live in an array map,
so one compiled program serves every subcommand (compile once per process / test
session).  Tracepoint record structs are generated from tracefs (tpformat.c_struct).
"""

from __future__ import annotations

from pathlib import Path

from . import btf
from .tpformat import Format, c_struct, read_format

# Mode bits of cfg[CFG_FLAGS]
F_EMIT = 1  # driver events to the ring buffer
F_LAT = 2  # latency histograms
F_TOP = 4  # per-process job table
F_DMA = 8  # per-process DMA table
F_HOST = 16  # host events (sched, block, net) of traced processes to the ring buffer
F_AUTOTRACE = 32  # processes calling tacc ioctls become traced
F_BYTES = 64  # no-op: tacc_submit carries the copy bytes (was a kprobe reading the commands)
# ioctl_enter/exit not attached (mode "jobs"): the submit handler records the context's
# owner and traces the process (issue 18: the IOCTL records are no per-job fact, and the
# two ioctl handlers ran 16 times per mlp batch)
F_OWNER_AT_SUBMIT = 128

CFG_FLAGS, CFG_PID, CFG_DEV, CFG_HAS_DEV, CFG_HAS_COMM = 0, 1, 2, 3, 4

# per-CPU stats slots
ST_EMIT, ST_DROP, ST_HOST_EMIT, ST_HOST_DROP, ST_NOJOB = 0, 1, 2, 3, 4
NSTATS = 8
# entries of the scheduler handlers' prefilter array (ids are taken modulo this)
TRACED_IDS = 16384

TACC_EVENTS = ("tacc_ioctl_enter", "tacc_ioctl_exit", "tacc_submit", "tacc_doorbell",
               "tacc_irq", "tacc_job_start", "tacc_job_done", "tacc_bo_create",
               "tacc_bo_destroy", "tacc_dma_map", "tacc_dma_unmap", "tacc_vm_bind",
               "tacc_vm_unbind", "tacc_mmu_fault", "tacc_pm", "tacc_reset", "tacc_trace_drop")
# Driver tracepoints are attached as raw tracepoints: their handlers get the TP_PROTO
# arguments (kernel/tacc_trace.h), in this order, as the record's same-named fields
# (``cmd`` is stored as ``nr``).  Raw tracepoints guard recursion per program, whereas
# classic tracepoints and kprobes share one per-CPU guard: a classic tacc_job_done
# handler firing in the completion IRQ while any other handler ran on that CPU was
# skipped by the kernel, and the job lost its completion event (issue 8).  They are
# also cheaper (no trace record is built).  tests/host checks this table against the
# header.
RAW_ARGS: dict[str, tuple[str, ...]] = {
    "tacc_ioctl_enter": ("dev", "ctx", "nr"),
    "tacc_ioctl_exit": ("dev", "ctx", "nr", "ret"),
    "tacc_submit": ("dev", "ctx", "queue", "seqno", "tag", "ncmds", "bytes", "mix"),
    "tacc_doorbell": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "tail"),
    "tacc_irq": ("dev", "vector", "status"),
    "tacc_job_start": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "tail"),
    "tacc_job_done": ("dev", "ctx", "queue", "seqno", "tag", "hw_job", "status", "error",
                      "dev_start", "dev_end"),
    "tacc_bo_create": ("dev", "ctx", "bo", "type", "size", "flags"),
    "tacc_bo_destroy": ("dev", "bo", "type", "size"),
    "tacc_dma_map": ("dev", "bo", "iova", "len", "nents", "dir"),
    "tacc_dma_unmap": ("dev", "bo", "iova", "len", "nents", "dir"),
    "tacc_vm_bind": ("dev", "ctx", "bo", "va", "size", "page_size"),
    "tacc_vm_unbind": ("dev", "ctx", "bo", "va", "size", "page_size"),
    "tacc_mmu_fault": ("dev", "ctx", "queue", "tag", "addr", "type", "write"),
    "tacc_pm": ("dev", "from", "to"),
    "tacc_reset": ("dev", "ctx", "queue", "seqno", "tag", "reason"),
    "tacc_trace_drop": ("dev", "dropped", "total"),
}
# driver tracepoints the BPF program does not attach: tacc_device_event repeats the
# genetlink events for stock tools; taccd records those from the family (device_events)
NOT_TRACED = ("tacc_device_event",)
HOST_EVENTS = (("sched", "sched_switch"), ("sched", "sched_wakeup"),
               ("block", "block_rq_issue"), ("block", "block_rq_complete"),
               ("net", "net_dev_start_xmit"), ("net", "netif_receive_skb"))

PRELUDE = r"""
#include <uapi/linux/ptrace.h>

struct tacc_ev {
	u64 ts, tag, a, b, c, d;
	u32 pid, tid, dev, x, w, v;
	s32 z;
	u16 y;
	u8 kind, cpu;
	char comm[16];
	char comm2[16];
};

struct comm_t { char c[16]; };
struct ctxkey { u32 dev; u32 ctx; };
struct owner_t { u32 pid; u32 tid; char comm[16]; };
struct jobkey { u32 dev; u32 ctx; u64 seqno; };
struct jobval { u64 t_submit; u64 t_start; u64 bytes; u32 pid; u32 ncmds; };
struct hkey { u32 dev; u16 queue; u8 which; u8 slot; };
struct topval { u64 jobs, cmds, bytes, busy_ticks, submits, errors, lat_ns; char comm[16]; };
struct dmaval { u64 maps, unmaps, map_bytes, unmap_bytes, map_ns, unmap_ns, segs;
		char comm[16]; };
struct dkey { u32 pid; u8 dir; u8 slot; u16 pad; };
struct blkkey { u32 dev; u32 pad; u64 sector; };
struct blkval { u64 ts; u32 pid; u32 tid; u64 bytes; char comm[16]; };
struct unmapval { u64 ts; u64 len; };

BPF_RINGBUF_OUTPUT(events, RB_PAGES);
BPF_ARRAY(cfg, u64, 8);
BPF_ARRAY(cfg_comm, struct comm_t, 1);
BPF_PERCPU_ARRAY(stats, u64, NSTATS);
BPF_HASH(owners, struct ctxkey, struct owner_t, 4096);
BPF_HASH(jobs, struct jobkey, struct jobval, 65536);
BPF_HASH(ioctl_t0, u32, u64, 4096);
BPF_HASH(traced_tgid, u32, u8, 4096);
BPF_HASH(traced_tid, u32, u8, 16384);
/* the scheduler handlers' prefilter (issue 18: they run on every context switch and
 * wakeup of the system, and two hash lookups each cost more than the switch under TCG):
 * one byte per id & (TRACED_IDS - 1), set with every traced_tgid/traced_tid entry and
 * never cleared (a stale byte costs one hash lookup, never an event); an array lookup is
 * inlined by the verifier */
BPF_ARRAY(traced_any, u8, TRACED_IDS);
BPF_HASH(lat, struct hkey, u64, 4096);
BPF_HASH(top, u32, struct topval, 4096);
BPF_HASH(dma, u32, struct dmaval, 4096);
BPF_HASH(dmahist, struct dkey, u64, 4096);
BPF_HASH(dma_t0, u32, u64, 4096);
BPF_HASH(unmap_t0, u32, struct unmapval, 4096);
BPF_HASH(blk, struct blkkey, struct blkval, 4096);

static __always_inline void mark_traced(u32 id)
{
	u32 i = id & (TRACED_IDS - 1);
	u8 *v = traced_any.lookup(&i);
	if (v)
		*v = 1;
}

static __always_inline u8 maybe_traced(u32 id)
{
	u32 i = id & (TRACED_IDS - 1);
	u8 *v = traced_any.lookup(&i);
	return v ? *v : 0;
}

static __always_inline u64 cfgv(u32 i)
{
	u64 *v = cfg.lookup(&i);
	return v ? *v : 0;
}

static __always_inline void stat_inc(u32 i)
{
	u64 *v = stats.lookup(&i);
	if (v)
		(*v)++;
}

static __always_inline int comm_eq(const char *a)
{
	u32 z = 0;
	struct comm_t *want = cfg_comm.lookup(&z);
	if (!want)
		return 0;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (a[i] != want->c[i])
			return 0;
		if (!a[i])
			return 1;
	}
	return 1;
}

/* filter on a process: pid (tgid) and comm */
static __always_inline int pass_proc(u32 pid, const char *comm)
{
	u64 want = cfgv(CFG_PID);
	if (want && want != pid)
		return 0;
	if (cfgv(CFG_HAS_COMM) && !comm_eq(comm))
		return 0;
	return 1;
}

static __always_inline int pass_dev(u32 dev)
{
	return !cfgv(CFG_HAS_DEV) || cfgv(CFG_DEV) == dev;
}

static __always_inline int filtering_proc(void)
{
	return cfgv(CFG_PID) || cfgv(CFG_HAS_COMM);
}

static __always_inline void emit(struct tacc_ev *e)
{
	e->ts = bpf_ktime_get_ns();
	e->cpu = bpf_get_smp_processor_id();
	if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP) < 0)
		stat_inc(ST_DROP);
	else
		stat_inc(ST_EMIT);
}

static __always_inline void emit_host(struct tacc_ev *e)
{
	e->ts = bpf_ktime_get_ns();
	e->cpu = bpf_get_smp_processor_id();
	if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP) < 0)
		stat_inc(ST_HOST_DROP);
	else
		stat_inc(ST_HOST_EMIT);
}

/* the current task as the event's process */
static __always_inline int cur_proc(struct tacc_ev *e, u32 dev)
{
	u64 id = bpf_get_current_pid_tgid();
	e->pid = id >> 32;
	e->tid = (u32)id;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	e->dev = dev;
	return pass_dev(dev) && pass_proc(e->pid, e->comm);
}

/* the context's owner as the event's process (events in irq/worker context) */
static __always_inline int owner_proc(struct tacc_ev *e, u32 dev, u32 ctx)
{
	struct ctxkey k = { .dev = dev, .ctx = ctx };
	struct owner_t *o = owners.lookup(&k);
	e->dev = dev;
	e->x = ctx;
	if (o) {
		e->pid = o->pid;
		e->tid = o->tid;
		__builtin_memcpy(e->comm, o->comm, 16);
	}
	if (!pass_dev(dev))
		return 0;
	if (!o)
		return !filtering_proc();
	return pass_proc(e->pid, e->comm);
}

/* floor(log2(v)), 0 for v <= 1: a binary search over the bits, no loop (the earlier
 * "#pragma unroll" loop with an early exit made clang print "loop not unrolled" once per
 * caller at every compile, issue 13) */
static __always_inline u8 log2l(u64 v)
{
	u8 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1)
		r += 1;
	return r;
}

static __always_inline void hist(u32 dev, u32 queue, u8 which, u64 v)
{
	struct hkey k = { .dev = dev, .queue = queue, .which = which, .slot = log2l(v) };
	lat.increment(k);
}
"""

DRIVER_HANDLERS = r"""
static __always_inline int comm16_eq(const char *a, const char *b)
{
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (a[i] != b[i])
			return 0;
		if (!a[i])
			return 1;
	}
	return 1;
}

/* the calling task as the owner of (dev, ctx), and as traced (F_AUTOTRACE): from
 * ioctl_enter, or from submit when the ioctl events are not attached (F_OWNER_AT_SUBMIT) */
static __always_inline void note_owner(u32 dev, u32 ctx, u64 flags)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;
	/* map updates only when the value changes (issue 18: an update costs several */
	/* lookups' worth; this handler was the dearest, 2.1 us per ioctl under TCG) */
	if (ctx != 0xffffffff) {
		struct ctxkey k = { .dev = dev, .ctx = ctx };
		struct owner_t o = { .pid = tgid, .tid = tid };
		struct owner_t *cur = owners.lookup(&k);
		bpf_get_current_comm(&o.comm, sizeof(o.comm));
		if (!cur || cur->pid != tgid || cur->tid != tid || !comm16_eq(cur->comm, o.comm))
			owners.update(&k, &o);
	}
	if (flags & F_AUTOTRACE) {
		u8 one = 1;
		if (!traced_tgid.lookup(&tgid)) {
			traced_tgid.update(&tgid, &one);
			mark_traced(tgid);
		}
		if (!traced_tid.lookup(&tid)) {
			traced_tid.update(&tid, &one);
			mark_traced(tid);
		}
	}
}

static __always_inline int on_ioctl_enter(struct tp_tacc_ioctl_enter *args)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 ts = bpf_ktime_get_ns();
	note_owner(args->dev, args->ctx, cfgv(CFG_FLAGS));
	ioctl_t0.update(&tid, &ts);
	return 0;
}

static __always_inline int on_ioctl_exit(struct tp_tacc_ioctl_exit *args)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 *t0 = ioctl_t0.lookup(&tid);
	struct tacc_ev e = {};
	if (!t0)
		return 0;
	e.d = bpf_ktime_get_ns() - *t0;
	ioctl_t0.delete(&tid);
	if (!(cfgv(CFG_FLAGS) & F_EMIT))
		return 0;
	e.kind = KIND_IOCTL;
	e.a = args->nr;
	e.x = args->ctx;
	e.z = args->ret;
	if (cur_proc(&e, args->dev))
		emit(&e);
	return 0;
}

static __always_inline int on_submit(struct tp_tacc_submit *args)
{
	u64 flags = cfgv(CFG_FLAGS);
	struct tacc_ev e = {};
	struct jobkey k = { .dev = args->dev, .ctx = args->ctx, .seqno = args->seqno };
	struct jobval j = { .t_submit = bpf_ktime_get_ns(), .ncmds = args->ncmds };
	int pass;
	if (flags & F_OWNER_AT_SUBMIT)
		note_owner(args->dev, args->ctx, flags);
	pass = cur_proc(&e, args->dev);
	j.pid = e.pid;
	j.bytes = args->bytes;
	jobs.update(&k, &j);
	if (!pass)
		return 0;
	if (flags & F_TOP) {
		struct topval zero = {}, *t;
		__builtin_memcpy(zero.comm, e.comm, 16);
		t = top.lookup_or_try_init(&e.pid, &zero);
		if (t)
			__sync_fetch_and_add(&t->submits, 1);
	}
	if (!(flags & F_EMIT))
		return 0;
	e.kind = KIND_SUBMIT;
	e.tag = args->tag;
	e.a = args->seqno;
	e.b = args->bytes;
	e.w = args->mix;
	e.x = args->ctx;
	e.y = args->queue;
	e.v = args->ncmds;
	emit(&e);
	return 0;
}

static __always_inline int on_doorbell(struct tp_tacc_doorbell *args)
{
	struct tacc_ev e = { .kind = KIND_DOORBELL };
	if (!(cfgv(CFG_FLAGS) & F_EMIT))
		return 0;
	if (!owner_proc(&e, args->dev, args->ctx))
		return 0;
	e.tag = args->tag;
	e.a = args->seqno;
	e.y = args->queue;
	e.w = args->hw_job;
	e.v = args->tail;
	emit(&e);
	return 0;
}

static __always_inline int on_irq(struct tp_tacc_irq *args)
{
	struct tacc_ev e = { .kind = KIND_IRQ };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || filtering_proc() || !pass_dev(args->dev))
		return 0;
	e.dev = args->dev;
	e.w = args->vector;
	e.v = args->status;
	emit(&e);
	return 0;
}

static __always_inline int on_job_start(struct tp_tacc_job_start *args)
{
	u64 flags = cfgv(CFG_FLAGS);
	struct tacc_ev e = { .kind = KIND_JOB_START };
	struct jobkey k = { .dev = args->dev, .ctx = args->ctx, .seqno = args->seqno };
	struct jobval *j = jobs.lookup(&k);
	int pass = owner_proc(&e, args->dev, args->ctx);
	u64 now = bpf_ktime_get_ns();
	if (j) {
		j->t_start = now;
		e.d = now - j->t_submit;
		if (pass && (flags & F_LAT))
			hist(args->dev, args->queue, 1, e.d);
	}
	if (!pass || !(flags & F_EMIT))
		return 0;
	e.tag = args->tag;
	e.a = args->seqno;
	e.y = args->queue;
	e.w = args->hw_job;
	e.v = args->tail;
	emit(&e);
	return 0;
}

static __always_inline int on_job_done(struct tp_tacc_job_done *args)
{
	u64 flags = cfgv(CFG_FLAGS);
	struct tacc_ev e = { .kind = KIND_JOB_DONE };
	struct jobkey k = { .dev = args->dev, .ctx = args->ctx, .seqno = args->seqno };
	struct jobval *j = jobs.lookup(&k);
	int pass = owner_proc(&e, args->dev, args->ctx);
	u64 now = bpf_ktime_get_ns(), bytes = 0, ticks = 0;
	u32 ncmds = 0;
	if (args->dev_end > args->dev_start)
		ticks = args->dev_end - args->dev_start;
	if (j) {
		e.d = now - j->t_submit;
		bytes = j->bytes;
		ncmds = j->ncmds;
		if (!e.pid)
			e.pid = j->pid;
		jobs.delete(&k);
	} else {
		stat_inc(ST_NOJOB);
	}
	if (!pass)
		return 0;
	if ((flags & F_LAT) && j) {
		hist(args->dev, args->queue, 0, e.d);
		hist(args->dev, args->queue, 2, ticks);
	}
	if (flags & F_TOP) {
		struct topval zero = {}, *t;
		__builtin_memcpy(zero.comm, e.comm, 16);
		t = top.lookup_or_try_init(&e.pid, &zero);
		if (t) {
			__sync_fetch_and_add(&t->jobs, 1);
			__sync_fetch_and_add(&t->cmds, ncmds);
			__sync_fetch_and_add(&t->bytes, bytes);
			__sync_fetch_and_add(&t->busy_ticks, ticks);
			__sync_fetch_and_add(&t->lat_ns, e.d);
			if (args->error)
				__sync_fetch_and_add(&t->errors, 1);
		}
	}
	if (!(flags & F_EMIT))
		return 0;
	e.tag = args->tag;
	e.a = args->seqno;
	e.b = args->dev_start;
	e.c = args->dev_end;
	e.y = args->queue;
	e.w = args->hw_job;
	e.v = args->status;
	e.z = args->error;
	emit(&e);
	return 0;
}

static __always_inline int on_bo_create(struct tp_tacc_bo_create *args)
{
	struct tacc_ev e = { .kind = KIND_BO_CREATE };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !cur_proc(&e, args->dev))
		return 0;
	e.a = args->bo;
	e.b = args->size;
	e.x = args->ctx;
	e.w = args->type;
	e.v = args->flags;
	emit(&e);
	return 0;
}

static __always_inline int on_bo_destroy(struct tp_tacc_bo_destroy *args)
{
	struct tacc_ev e = { .kind = KIND_BO_DESTROY };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !cur_proc(&e, args->dev))
		return 0;
	e.a = args->bo;
	e.b = args->size;
	e.w = args->type;
	emit(&e);
	return 0;
}

static __always_inline void dma_account(struct tacc_ev *e, int unmap, u64 len, u64 ns,
					u32 nents)
{
	struct dmaval zero = {}, *d;
	struct dkey hk = { .pid = e->pid, .dir = unmap, .slot = log2l(len) };
	__builtin_memcpy(zero.comm, e->comm, 16);
	d = dma.lookup_or_try_init(&e->pid, &zero);
	if (d) {
		if (unmap) {
			__sync_fetch_and_add(&d->unmaps, 1);
			__sync_fetch_and_add(&d->unmap_bytes, len);
			__sync_fetch_and_add(&d->unmap_ns, ns);
		} else {
			__sync_fetch_and_add(&d->maps, 1);
			__sync_fetch_and_add(&d->map_bytes, len);
			__sync_fetch_and_add(&d->map_ns, ns);
		}
		__sync_fetch_and_add(&d->segs, nents);
	}
	dmahist.increment(hk);
}

int kp_dma_map(struct pt_regs *ctx)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 ts = bpf_ktime_get_ns();
	dma_t0.update(&tid, &ts);
	return 0;
}

static __always_inline int on_dma_map(struct tp_tacc_dma_map *args)
{
	u64 flags = cfgv(CFG_FLAGS);
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 *t0 = dma_t0.lookup(&tid);
	struct tacc_ev e = { .kind = KIND_DMA_MAP };
	if (t0) {
		e.d = bpf_ktime_get_ns() - *t0;
		dma_t0.delete(&tid);
	}
	if (!cur_proc(&e, args->dev))
		return 0;
	if (flags & F_DMA)
		dma_account(&e, 0, args->len, e.d, args->nents);
	if (!(flags & F_EMIT))
		return 0;
	e.a = args->iova;
	e.b = args->len;
	e.c = args->bo;
	e.w = args->nents;
	e.v = args->dir;
	emit(&e);
	return 0;
}

static __always_inline int on_dma_unmap(struct tp_tacc_dma_unmap *args)
{
	u64 flags = cfgv(CFG_FLAGS);
	struct tacc_ev e = { .kind = KIND_DMA_UNMAP };
	if (!cur_proc(&e, args->dev))
		return 0;
	if (flags & F_DMA) {
		struct unmapval u = { .ts = bpf_ktime_get_ns(), .len = args->len };
		dma_account(&e, 1, args->len, 0, args->nents);
		unmap_t0.update(&e.tid, &u);
	}
	if (!(flags & F_EMIT))
		return 0;
	e.a = args->iova;
	e.b = args->len;
	e.c = args->bo;
	e.w = args->nents;
	e.v = args->dir;
	emit(&e);
	return 0;
}

/* kretprobe of dma_unmap_sg_attrs: time of an unmap the tracepoint announced */
int kr_dma_unmap(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, pid = id >> 32;
	struct unmapval *u = unmap_t0.lookup(&tid);
	struct dmaval *d;
	if (!u)
		return 0;
	d = dma.lookup(&pid);
	if (d)
		__sync_fetch_and_add(&d->unmap_ns, bpf_ktime_get_ns() - u->ts);
	unmap_t0.delete(&tid);
	return 0;
}

static __always_inline int vm_ev(struct tacc_ev *e, u32 dev, u32 ctx, u64 bo, u64 va, u64 size,
					u64 page_size)
{
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !cur_proc(e, dev))
		return 0;
	e->x = ctx;
	e->a = va;
	e->b = size;
	e->c = bo;
	e->d = page_size;
	emit(e);
	return 0;
}

static __always_inline int on_vm_bind(struct tp_tacc_vm_bind *args)
{
	struct tacc_ev e = { .kind = KIND_VM_BIND };
	return vm_ev(&e, args->dev, args->ctx, args->bo, args->va, args->size, args->page_size);
}

static __always_inline int on_vm_unbind(struct tp_tacc_vm_unbind *args)
{
	struct tacc_ev e = { .kind = KIND_VM_UNBIND };
	return vm_ev(&e, args->dev, args->ctx, args->bo, args->va, args->size, args->page_size);
}

static __always_inline int on_mmu_fault(struct tp_tacc_mmu_fault *args)
{
	struct tacc_ev e = { .kind = KIND_MMU_FAULT };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !owner_proc(&e, args->dev, args->ctx))
		return 0;
	e.tag = args->tag;
	e.a = args->addr;
	e.y = args->queue;
	e.w = args->type;
	e.v = args->write;
	emit(&e);
	return 0;
}

static __always_inline int on_pm(struct tp_tacc_pm *args)
{
	struct tacc_ev e = { .kind = KIND_PM };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || filtering_proc() || !pass_dev(args->dev))
		return 0;
	e.dev = args->dev;
	e.w = args->from;
	e.v = args->to;
	emit(&e);
	return 0;
}

static __always_inline int on_reset(struct tp_tacc_reset *args)
{
	struct tacc_ev e = { .kind = KIND_RESET };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !owner_proc(&e, args->dev, args->ctx))
		return 0;
	e.tag = args->tag;
	e.a = args->seqno;
	e.y = args->queue;
	e.z = args->reason;
	emit(&e);
	return 0;
}

static __always_inline int on_trace_drop(struct tp_tacc_trace_drop *args)
{
	struct tacc_ev e = { .kind = KIND_TRACE_DROP };
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || filtering_proc() || !pass_dev(args->dev))
		return 0;
	e.dev = args->dev;
	e.w = args->dropped;
	e.v = args->total;
	emit(&e);
	return 0;
}
"""

HOST_HANDLERS = r"""
/* map values (1), not pointers, are combined: clang may OR two lookup results,
 * which the verifier rejects ("pointer |= pointer prohibited") */
static __always_inline u8 traced_cur(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	u8 *v = traced_tgid.lookup(&tgid);
	return v ? *v : 0;
}

/* whether a switch from the current task to ``next`` may concern a traced process */
static __always_inline u8 switch_maybe(u32 next)
{
	return maybe_traced(bpf_get_current_pid_tgid() >> 32) | maybe_traced(next);
}

/* called by raw_sched_switch once switch_maybe() passed (the raw wrappers prefilter) */
static __always_inline int on_sched_switch(struct tp_sched_switch *args)
{
	u32 next = args->next_pid;
	u8 *nv = traced_tid.lookup(&next);
	u8 next_t = nv ? *nv : 0;
	struct tacc_ev e = { .kind = HOST_BASE + 1 };
	if (!(traced_cur() | next_t))
		return 0;
	e.pid = bpf_get_current_pid_tgid() >> 32;
	e.tid = args->prev_pid;
	e.x = next;
	e.z = args->prev_state;
	__builtin_memcpy(e.comm, args->prev_comm, 16);
	__builtin_memcpy(e.comm2, args->next_comm, 16);
	emit_host(&e);
	return 0;
}

static __always_inline int on_sched_wakeup(struct tp_sched_wakeup *args)
{
	u32 tid = args->pid;
	struct tacc_ev e = { .kind = HOST_BASE + 2 };
	if (!traced_tid.lookup(&tid))  /* raw_sched_wakeup prefiltered */
		return 0;
	e.tid = tid;
	e.y = args->target_cpu;
	__builtin_memcpy(e.comm, args->comm, 16);
	emit_host(&e);
	return 0;
}

int on_block_rq_issue(struct tp_block_rq_issue *args)
{
	u64 id = bpf_get_current_pid_tgid();
	struct tacc_ev e = { .kind = HOST_BASE + 3 };
	struct blkkey k = { .dev = args->dev, .sector = args->sector };
	struct blkval v = {};
	if (!traced_cur())
		return 0;
	v.ts = bpf_ktime_get_ns();
	v.pid = id >> 32;
	v.tid = (u32)id;
	v.bytes = args->bytes;
	bpf_get_current_comm(&v.comm, sizeof(v.comm));
	blk.update(&k, &v);
	e.pid = v.pid;
	e.tid = v.tid;
	e.x = args->dev;
	e.a = args->sector;
	e.b = args->bytes;
	__builtin_memcpy(e.comm, v.comm, 16);
	emit_host(&e);
	return 0;
}

int on_block_rq_complete(struct tp_block_rq_complete *args)
{
	struct blkkey k = { .dev = args->dev, .sector = args->sector };
	struct blkval *v = blk.lookup(&k);
	struct tacc_ev e = { .kind = HOST_BASE + 4 };
	if (!v)
		return 0;
	e.pid = v->pid;
	e.tid = v->tid;
	e.x = args->dev;
	e.a = args->sector;
	e.b = v->bytes;
	e.d = bpf_ktime_get_ns() - v->ts;
	e.z = args->error;
	__builtin_memcpy(e.comm, v->comm, 16);
	blk.delete(&k);
	emit_host(&e);
	return 0;
}

int on_net_dev_start_xmit(struct tp_net_dev_start_xmit *args)
{
	u64 id = bpf_get_current_pid_tgid();
	struct tacc_ev e = { .kind = HOST_BASE + 5 };
	if (!traced_cur())
		return 0;
	e.pid = id >> 32;
	e.tid = (u32)id;
	e.b = args->len;
	bpf_get_current_comm(&e.comm, sizeof(e.comm));
	emit_host(&e);
	return 0;
}

int on_netif_receive_skb(struct tp_netif_receive_skb *args)
{
	struct tacc_ev e = { .kind = HOST_BASE + 6 };
	e.b = args->len;
	emit_host(&e);
	return 0;
}
"""


# The scheduler events are raw tracepoints too: a classic sched_wakeup handler shares the
# per-CPU guard with the kprobes, so a wakeup (often from irq_work) that interrupted one
# of our kprobe handlers was skipped and counted as a HOST drop (CI, session 2).  These
# wrappers rebuild the classic record from the TP_PROTO arguments, as the kernel's
# TP_fast_assign does (include/trace/events/sched.h, 6.12):
#   sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
#                unsigned int prev_state)
#   sched_wakeup(struct task_struct *p)
#
# They read struct task_struct at offsets from the kernel's BTF (btf.py, TASK_OFFSETS):
# including <linux/sched.h> for its layout cost 3 s of a compile's 8.5 s of guest time.
# The task states are include/linux/sched.h's (6.12), as __trace_sched_switch_state
# reports them; tests/host checks them against the guest kernel's headers.
TASK_STATES = {"TASK_INTERRUPTIBLE": 0x1, "TASK_UNINTERRUPTIBLE": 0x2, "TASK_NOLOAD": 0x400,
               "TASK_RTLOCK_WAIT": 0x1000, "TASK_REPORT": 0x7F}
TASK_OFFSETS = {"task_struct": ["pid", "comm", "exit_state", "thread_info"],
                "thread_info": ["cpu"]}
RAW_HOST: dict[str, str] = {
    "sched_switch": r"""
#define TASK_IDLE (TASK_UNINTERRUPTIBLE | TASK_NOLOAD)
#define TASK_REPORT_IDLE (TASK_REPORT + 1)
#define TASK_REPORT_MAX (TASK_REPORT_IDLE << 1)
#define TASK_READ(dst, p, off) bpf_probe_read_kernel(&(dst), sizeof(dst), (char *)(p) + (off))

static __always_inline s32 switch_state(u64 preempt, u32 prev_state, void *p)
{
	// __trace_sched_switch_state(): TASK_REPORT_MAX when preempted, else the
	// reported state bit (fls of the state index)
	u32 exit_state = 0, state;
	if (preempt)
		return TASK_REPORT_MAX;
	TASK_READ(exit_state, p, OFF_TASK_EXIT_STATE);
	state = (prev_state | exit_state) & TASK_REPORT;
	if ((prev_state & TASK_IDLE) == TASK_IDLE)
		state = TASK_REPORT_IDLE;
	if (prev_state & TASK_RTLOCK_WAIT)
		state = TASK_UNINTERRUPTIBLE;
#pragma unroll
	for (int i = 7; i >= 0; i--)
		if (state & (1u << i))
			return 1 << i;
	return 0;
}

int raw_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	void *prev = (void *)ctx->args[1];
	void *next = (void *)ctx->args[2];
	struct tp_sched_switch a = {};
	TASK_READ(a.next_pid, next, OFF_TASK_PID);
	if (!switch_maybe(a.next_pid))  // before the other reads: most switches stop here
		return 0;
	TASK_READ(a.prev_pid, prev, OFF_TASK_PID);
	TASK_READ(a.prev_comm, prev, OFF_TASK_COMM);
	TASK_READ(a.next_comm, next, OFF_TASK_COMM);
	a.prev_state = switch_state(ctx->args[0], (u32)ctx->args[3], prev);
	return on_sched_switch(&a);
}
""",
    "sched_wakeup": r"""
int raw_sched_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
	void *p = (void *)ctx->args[0];
	struct tp_sched_wakeup a = {};
	TASK_READ(a.pid, p, OFF_TASK_PID);
	if (!maybe_traced(a.pid))
		return 0;
	TASK_READ(a.comm, p, OFF_TASK_COMM);
	TASK_READ(a.target_cpu, p, OFF_TASK_CPU);  // thread_info.cpu (THREAD_INFO_IN_TASK)
	return on_sched_wakeup(&a);
}
""",
}


def handler_name(event: str) -> str:
    """The BPF function attached to ``event``: raw_* for raw tracepoints, else on_*."""
    if event in RAW_ARGS:
        return "raw_" + event.removeprefix("tacc_")
    if event in RAW_HOST:
        return "raw_" + event
    return "on_" + event


def is_raw(event: str) -> bool:
    """Whether ``event`` is attached as a raw tracepoint."""
    return event in RAW_ARGS or event in RAW_HOST


def raw_wrapper(event: str, fmt: Format) -> str:
    """A raw-tracepoint program filling the record struct from the TP_PROTO arguments."""
    missing = [f for f in RAW_ARGS[event] if fmt.field(f) is None]
    if missing:
        raise ValueError(f"tracepoint tacc:{event} has no field {', '.join(missing)}: "
                         "the loaded tacc.ko does not match this tool")
    short = event.removeprefix("tacc_")
    lines = [f"int raw_{short}(struct bpf_raw_tracepoint_args *ctx)", "{",
             f"\tstruct tp_{event} a = {{}};"]
    lines += [f"\ta.{f} = ctx->args[{i}];" for i, f in enumerate(RAW_ARGS[event])]
    lines += [f"\treturn on_{short}(&a);", "}"]
    return "\n".join(lines)


def task_defines(btf_path: Path = btf.VMLINUX) -> list[str]:
    """The task_struct offsets and task states the scheduler handlers use, as #defines."""
    off = btf.offsets(TASK_OFFSETS, btf_path)
    cpu = off["task_struct.thread_info"] + off["thread_info.cpu"]
    out = [f"#define OFF_TASK_PID {off['task_struct.pid']}",
           f"#define OFF_TASK_COMM {off['task_struct.comm']}",
           f"#define OFF_TASK_EXIT_STATE {off['task_struct.exit_state']}",
           f"#define OFF_TASK_CPU {cpu}"]
    return out + [f"#define {k} {v:#x}" for k, v in TASK_STATES.items()]


def build_source(root: Path, rb_pages: int = 1024, max_scan_cmds: int = 32,
                 host: bool = True, btf_path: Path = btf.VMLINUX
                 ) -> tuple[str, dict[str, Format]]:
    """The program text for the loaded driver; returns (source, formats found)."""
    from tacc.capture.schema import DriverKind

    from .events import HOST_BASE

    formats: dict[str, Format] = {}
    structs = []
    for ev in TACC_EVENTS:
        fmt = read_format(root, "tacc", ev)
        if fmt is None:
            raise FileNotFoundError(f"tracepoint tacc:{ev} not found")
        formats[f"tacc:{ev}"] = fmt
        structs.append(c_struct(fmt, f"tp_{ev}"))
    src_host = ""
    if host:
        present: set[str] = set()
        for system, ev in HOST_EVENTS:
            fmt = read_format(root, system, ev)
            if fmt is None:
                continue
            formats[f"{system}:{ev}"] = fmt
            structs.append(c_struct(fmt, f"tp_{ev}"))
            present.add(ev)
        # keep the helper and the handlers whose tracepoint exists
        body = HOST_HANDLERS

        def start(ev: str) -> int:  # the line defining on_<ev>
            return body.rfind("\n", 0, body.find(f"int on_{ev}(")) + 1

        names = [ev for _, ev in HOST_EVENTS]
        chunks = [body[:start(names[0])]]
        for i, n in enumerate(names):
            s = start(n)
            e = start(names[i + 1]) if i + 1 < len(names) else len(body)
            if n in present:
                chunks.append(body[s:e])
                chunks.append(RAW_HOST.get(n, ""))
        src_host = "".join(chunks)
        if present & {"sched_switch", "sched_wakeup"}:
            src_host = "\n".join(task_defines(btf_path)) + "\n" + src_host
    defines = [f"#define RB_PAGES {rb_pages}", f"#define NSTATS {NSTATS}",
               f"#define TRACED_IDS {TRACED_IDS}",
               f"#define MAX_SCAN_CMDS {max_scan_cmds}", f"#define HOST_BASE {HOST_BASE}"]
    for name, val in (("F_EMIT", F_EMIT), ("F_LAT", F_LAT), ("F_TOP", F_TOP), ("F_DMA", F_DMA),
                      ("F_HOST", F_HOST), ("F_AUTOTRACE", F_AUTOTRACE), ("F_BYTES", F_BYTES),
                      ("F_OWNER_AT_SUBMIT", F_OWNER_AT_SUBMIT),
                      ("CFG_FLAGS", CFG_FLAGS), ("CFG_PID", CFG_PID), ("CFG_DEV", CFG_DEV),
                      ("CFG_HAS_DEV", CFG_HAS_DEV), ("CFG_HAS_COMM", CFG_HAS_COMM),
                      ("ST_EMIT", ST_EMIT), ("ST_DROP", ST_DROP), ("ST_HOST_EMIT", ST_HOST_EMIT),
                      ("ST_HOST_DROP", ST_HOST_DROP), ("ST_NOJOB", ST_NOJOB)):
        defines.append(f"#define {name} {val}")
    for k in DriverKind:
        defines.append(f"#define KIND_{k.name} {int(k)}")
    wrappers = "\n\n".join(raw_wrapper(ev, formats[f"tacc:{ev}"]) for ev in TACC_EVENTS)
    src = "\n".join(defines) + "\n" + PRELUDE + "\n" + "\n\n".join(structs) + "\n" + \
        DRIVER_HANDLERS + "\n" + wrappers + "\n" + src_host
    return src, formats
