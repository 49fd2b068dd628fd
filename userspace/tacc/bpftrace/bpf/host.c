
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

/* the request's operation from the tracepoint's rwbs (the kernel's blk_fill_rwbs: an
 * optional F for a preflush, then R read, W write, D discard, F flush, N other):
 * 1 read, 2 write, 3 flush, 4 discard, 0 other (capture-format.md, host records) */
static __always_inline u32 blk_op(u8 c0, u8 c1)
{
	u8 c = c0 == 'F' ? c1 : c0;
	return c == 'R' ? 1 : c == 'W' ? 2 : c == 'D' ? 4 : c0 == 'F' ? 3 : 0;
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
	e.v = blk_op(args->rwbs[0], args->rwbs[1]);
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
	e.v = blk_op(args->rwbs[0], args->rwbs[1]);
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
