
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
