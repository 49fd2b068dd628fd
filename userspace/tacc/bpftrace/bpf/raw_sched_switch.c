
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
