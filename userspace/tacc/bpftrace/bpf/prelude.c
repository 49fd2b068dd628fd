
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
