
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
	/* map updates only when the value changes (an update costs several */
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

/* Emits a job's event: its tag and seqno, b, the queue, w and v. */
static __always_inline int job_ev(struct tacc_ev *e, u64 tag, u64 seqno, u64 b, u16 queue,
				  u32 w, u32 v)
{
	e->tag = tag;
	e->a = seqno;
	e->b = b;
	e->y = queue;
	e->w = w;
	e->v = v;
	emit(e);
	return 0;
}

/*
 * A context's event, emitted when tracing is on and the context's owner passes the
 * process filters (owner_proc fills its pid, tid and comm).
 */
static __always_inline int ctx_ev(struct tacc_ev *e, u32 dev, u32 ctx, u64 tag, u64 a, u16 y,
				  u32 w, u32 v, s32 z)
{
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !owner_proc(e, dev, ctx))
		return 0;
	e->z = z;
	return job_ev(e, tag, a, 0, y, w, v);
}

/* A device's event (no process of its own): emitted unless a process filter is set. */
static __always_inline int dev_ev(struct tacc_ev *e, u32 dev, u32 w, u32 v)
{
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || filtering_proc() || !pass_dev(dev))
		return 0;
	e->dev = dev;
	e->w = w;
	e->v = v;
	emit(e);
	return 0;
}

/*
 * An event of the calling process (buffer objects, bindings), emitted when it passes
 * the filters: ctx in x, the rest in a, b, c, d, w, v.
 */
static __always_inline int proc_ev(struct tacc_ev *e, u32 dev, u32 ctx, u64 a, u64 b, u64 c,
				   u64 d, u32 w, u32 v)
{
	if (!(cfgv(CFG_FLAGS) & F_EMIT) || !cur_proc(e, dev))
		return 0;
	e->x = ctx;
	e->a = a;
	e->b = b;
	e->c = c;
	e->d = d;
	e->w = w;
	e->v = v;
	emit(e);
	return 0;
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
	e.x = args->ctx;
	return job_ev(&e, args->tag, args->seqno, args->bytes, args->queue, args->mix,
		      args->ncmds);
}

static __always_inline int on_doorbell(struct tp_tacc_doorbell *args)
{
	struct tacc_ev e = { .kind = KIND_DOORBELL };
	return ctx_ev(&e, args->dev, args->ctx, args->tag, args->seqno, args->queue,
		      args->hw_job, args->tail, 0);
}

static __always_inline int on_irq(struct tp_tacc_irq *args)
{
	struct tacc_ev e = { .kind = KIND_IRQ };
	return dev_ev(&e, args->dev, args->vector, args->status);
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
	return job_ev(&e, args->tag, args->seqno, 0, args->queue, args->hw_job, args->tail);
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
	e.c = args->dev_end;
	e.z = args->error;
	return job_ev(&e, args->tag, args->seqno, args->dev_start, args->queue, args->hw_job,
		      args->status);
}

static __always_inline int on_bo_create(struct tp_tacc_bo_create *args)
{
	struct tacc_ev e = { .kind = KIND_BO_CREATE };
	return proc_ev(&e, args->dev, args->ctx, args->bo, args->size, 0, 0, args->type,
		       args->flags);
}

static __always_inline int on_bo_destroy(struct tp_tacc_bo_destroy *args)
{
	struct tacc_ev e = { .kind = KIND_BO_DESTROY };
	return proc_ev(&e, args->dev, 0, args->bo, args->size, 0, 0, args->type, 0);
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

static __always_inline int on_vm_bind(struct tp_tacc_vm_bind *args)
{
	struct tacc_ev e = { .kind = KIND_VM_BIND };
	return proc_ev(&e, args->dev, args->ctx, args->va, args->size, args->bo,
		       args->page_size, 0, 0);
}

static __always_inline int on_vm_unbind(struct tp_tacc_vm_unbind *args)
{
	struct tacc_ev e = { .kind = KIND_VM_UNBIND };
	return proc_ev(&e, args->dev, args->ctx, args->va, args->size, args->bo,
		       args->page_size, 0, 0);
}

static __always_inline int on_mmu_fault(struct tp_tacc_mmu_fault *args)
{
	struct tacc_ev e = { .kind = KIND_MMU_FAULT };
	return ctx_ev(&e, args->dev, args->ctx, args->tag, args->addr, args->queue, args->type,
		      args->write, 0);
}

static __always_inline int on_pm(struct tp_tacc_pm *args)
{
	struct tacc_ev e = { .kind = KIND_PM };
	return dev_ev(&e, args->dev, args->from, args->to);
}

static __always_inline int on_reset(struct tp_tacc_reset *args)
{
	struct tacc_ev e = { .kind = KIND_RESET };
	return ctx_ev(&e, args->dev, args->ctx, args->tag, args->seqno, args->queue, 0, 0,
		      args->reason);
}

static __always_inline int on_trace_drop(struct tp_tacc_trace_drop *args)
{
	struct tacc_ev e = { .kind = KIND_TRACE_DROP };
	return dev_ev(&e, args->dev, args->dropped, args->total);
}
