// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc perf PMU: the device's hardware counters as uncore-style perf events
 * (docs/counters.md), one PMU per PCI function, named tacc_<hex> with
 * hex = domain << 16 | bus << 8 | devfn (as dwc_pcie_pmu does: perf PMU
 * names cannot hold colons).
 *
 *   perf stat -a -e tacc_100/h2d_bytes/,tacc_100/d2h_bytes/ -- CMD
 *
 * Events are the counters of the TACC_FUNC_COUNTERS and (PF only)
 * TACC_GLOBAL_COUNTERS X-lists of tacc_hw.h; config = slot | global << 8.
 * Counting only: no sampling, no task context, no interrupt.  Reads go
 * through tacc_counter_read(), the same source as the sysfs files: the
 * counter block while the function is powered, the snapshot folded in at
 * suspend otherwise, so a read never wakes the device.  Every event of the
 * PF's PMU needs CAP_PERFMON, also where perf_event_paranoid would let an
 * unprivileged user open it: the PF's function counters sum the work of
 * every tenant of the PF, its global ones every function's link traffic.  A
 * VF's events (its own counters) follow perf's system-wide rule alone.
 */
#include <linux/cpuhotplug.h>
#include <linux/cpumask.h>
#include <linux/kref.h>
#include <linux/perf_event.h>
#include <linux/pm_runtime.h>
#include <linux/slab.h>

#include "tacc_drv.h"

#define TACC_PMU_SLOT_MASK	0xffull
#define TACC_PMU_GLOBAL_BIT	8
#define TACC_NUM_PMU_CNTS	(TACC_FUNC_CNT_END - 2 + TACC_GLOBAL_CNT_END - 2)

struct tacc_pmu {
	struct pmu pmu;
	struct kref ref;		/* registration + one per event */
	atomic_t users;			/* 1 for the function + one per event */
	struct rcu_work reap;		/* unregisters once users hit 0 */
	spinlock_t lock;		/* tdev: cleared at fini */
	struct tacc_device *tdev;
	bool is_vf;
	int node;
	struct hlist_node cpuhp_node;
	int on_cpu;
	struct list_head list;
	char name[24];
	/* sysfs: events/ built from the X-lists */
	struct perf_pmu_events_attr *ev;
	struct attribute **ev_ptrs;
	struct attribute_group ev_group;
	const struct attribute_group *groups[4];
	char ev_str[TACC_NUM_PMU_CNTS][24];
	char unit_name[TACC_NUM_PMU_CNTS][32];
};

static DEFINE_MUTEX(tacc_pmu_lock);	/* tacc_pmu_list, tacc_pmu_hp_state */
static LIST_HEAD(tacc_pmu_list);
static int tacc_pmu_hp_state = -1;
static struct workqueue_struct *tacc_pmu_wq;	/* reaps detached PMUs */

static void tacc_pmu_hp_put(void);

#define to_tacc_pmu(p)	container_of(p, struct tacc_pmu, pmu)

static u32 tacc_pmu_slot(struct perf_event *event)
{
	return event->attr.config & TACC_PMU_SLOT_MASK;
}

static bool tacc_pmu_global(struct perf_event *event)
{
	return event->attr.config & BIT_ULL(TACC_PMU_GLOBAL_BIT);
}

/* ------------------------------------------------------------ sysfs ---- */

static ssize_t cpumask_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_pmu *tp = to_tacc_pmu(dev_get_drvdata(dev));

	return cpumap_print_to_pagebuf(true, buf, cpumask_of(tp->on_cpu));
}
static DEVICE_ATTR_RO(cpumask);

static struct attribute *tacc_pmu_cpumask_attrs[] = {
	&dev_attr_cpumask.attr,
	NULL
};

static const struct attribute_group tacc_pmu_cpumask_group = {
	.attrs = tacc_pmu_cpumask_attrs,
};

PMU_FORMAT_ATTR(event, "config:0-7");
PMU_FORMAT_ATTR(global, "config:8");

static struct attribute *tacc_pmu_format_attrs[] = {
	&format_attr_event.attr,
	&format_attr_global.attr,
	NULL
};

static const struct attribute_group tacc_pmu_format_group = {
	.name = "format",
	.attrs = tacc_pmu_format_attrs,
};

/*
 * events/<name> = "event=0x<slot>[,global=1]" and events/<name>.unit = the
 * X-list unit (perf stat prints it next to the count).  Built at probe from
 * the X-lists; a VF gets no global events (its global page reads zero).
 */
struct tacc_pmu_cnt {
	const char *name;
	const char *unit;
	const char *desc;
	u8 slot;
	bool global;
};

#define TACC_PMU_FCNT(name, idx, unit, desc)	{ #name, unit, desc, idx, false },
#define TACC_PMU_GCNT(name, idx, unit, desc)	{ #name, unit, desc, idx, true },
static const struct tacc_pmu_cnt tacc_pmu_cnts[] = {
	TACC_FUNC_COUNTERS(TACC_PMU_FCNT)
	TACC_GLOBAL_COUNTERS(TACC_PMU_GCNT)
};

static int tacc_pmu_build_events(struct tacc_pmu *tp)
{
	u32 i, n = 0, max = 2 * ARRAY_SIZE(tacc_pmu_cnts);

	tp->ev = kcalloc(max, sizeof(*tp->ev), GFP_KERNEL);
	tp->ev_ptrs = kcalloc(max + 1, sizeof(*tp->ev_ptrs), GFP_KERNEL);
	if (!tp->ev || !tp->ev_ptrs)
		return -ENOMEM;
	for (i = 0; i < ARRAY_SIZE(tacc_pmu_cnts); i++) {
		const struct tacc_pmu_cnt *c = &tacc_pmu_cnts[i];
		struct perf_pmu_events_attr *ev = &tp->ev[n], *un = &tp->ev[n + 1];

		if (c->global && tp->is_vf)
			continue;
		snprintf(tp->ev_str[i], sizeof(tp->ev_str[i]), "event=0x%02x%s", c->slot,
			 c->global ? ",global=1" : "");
		snprintf(tp->unit_name[i], sizeof(tp->unit_name[i]), "%s.unit", c->name);
		sysfs_attr_init(&ev->attr.attr);
		ev->attr.attr.name = c->name;
		ev->attr.attr.mode = 0444;
		ev->attr.show = perf_event_sysfs_show;
		ev->event_str = tp->ev_str[i];
		sysfs_attr_init(&un->attr.attr);
		un->attr.attr.name = tp->unit_name[i];
		un->attr.attr.mode = 0444;
		un->attr.show = perf_event_sysfs_show;
		un->event_str = c->unit;
		tp->ev_ptrs[n] = &ev->attr.attr;
		tp->ev_ptrs[n + 1] = &un->attr.attr;
		n += 2;
	}
	tp->ev_group.name = "events";
	tp->ev_group.attrs = tp->ev_ptrs;
	tp->groups[0] = &tp->ev_group;
	tp->groups[1] = &tacc_pmu_format_group;
	tp->groups[2] = &tacc_pmu_cpumask_group;
	tp->groups[3] = NULL;
	return 0;
}

/* ----------------------------------------------------------- events ---- */

static bool tacc_pmu_valid_slot(bool global, u32 slot)
{
	if (slot < 2)
		return false;
	return global ? slot < TACC_GLOBAL_CNT_END : slot < TACC_FUNC_CNT_END;
}

/*
 * The counter value now, or false while the function is between D0 and
 * D3hot: during a runtime suspend or resume the driver's snapshot base and
 * the registers do not add up yet, so the caller keeps its last value.
 */
static bool tacc_pmu_value(struct tacc_pmu *tp, struct perf_event *event, u64 *val)
{
	struct tacc_device *tdev;
	unsigned long flags;
	bool ok = false;

	spin_lock_irqsave(&tp->lock, flags);
	tdev = tp->tdev;
	if (tdev) {
		struct device *dev = tacc_to_dev(tdev);
		int active = pm_runtime_get_if_active(dev);

		if (active > 0 || pm_runtime_status_suspended(dev)) {
			*val = tacc_counter_read(tdev, tacc_pmu_global(event),
						 tacc_pmu_slot(event));
			ok = true;
		}
		if (active > 0)
			pm_runtime_put_autosuspend(dev);
	}
	spin_unlock_irqrestore(&tp->lock, flags);
	return ok;
}

static void tacc_pmu_update(struct perf_event *event)
{
	struct tacc_pmu *tp = to_tacc_pmu(event->pmu);
	struct hw_perf_event *hwc = &event->hw;
	u64 prev, now;

	do {
		prev = local64_read(&hwc->prev_count);
		if (!tacc_pmu_value(tp, event, &now))
			return;
	} while (local64_cmpxchg(&hwc->prev_count, prev, now) != prev);

	/*
	 * A value below the previous one means the function was reset (FLR)
	 * without the driver folding its counters: count from the new base.
	 */
	if (now >= prev)
		local64_add(now - prev, &event->count);
}

static void tacc_pmu_free(struct tacc_pmu *tp)
{
	kfree(tp->ev_ptrs);
	kfree(tp->ev);
	kfree(tp);
}

static void tacc_pmu_release(struct kref *ref)
{
	tacc_pmu_free(container_of(ref, struct tacc_pmu, ref));
}

/*
 * perf_pmu_unregister() of 6.12 frees the PMU's per-CPU contexts that open
 * events still point to (their pmu_ctx), and _free_event() uses them after
 * ->destroy: so a PMU is unregistered only once its function is gone *and*
 * its last event was freed, an RCU grace period after that event's
 * ->destroy (queue_rcu_work), never under an event.
 */
static void tacc_pmu_unregister(struct tacc_pmu *tp)
{
	mutex_lock(&tacc_pmu_lock);
	list_del(&tp->list);
	perf_pmu_unregister(&tp->pmu);
	cpuhp_state_remove_instance_nocalls(tacc_pmu_hp_state, &tp->cpuhp_node);
	tacc_pmu_hp_put();
	mutex_unlock(&tacc_pmu_lock);
	kref_put(&tp->ref, tacc_pmu_release);	/* the registration's */
}

static void tacc_pmu_reap(struct work_struct *work)
{
	tacc_pmu_unregister(container_of(to_rcu_work(work), struct tacc_pmu, reap));
}

static void tacc_pmu_users_put(struct tacc_pmu *tp)
{
	if (atomic_dec_and_test(&tp->users))
		queue_rcu_work(tacc_pmu_wq, &tp->reap);
}

static void tacc_pmu_event_destroy(struct perf_event *event)
{
	struct tacc_pmu *tp = to_tacc_pmu(event->pmu);

	tacc_pmu_users_put(tp);
	kref_put(&tp->ref, tacc_pmu_release);
}

static int tacc_pmu_event_init(struct perf_event *event)
{
	struct tacc_pmu *tp = to_tacc_pmu(event->pmu);
	bool global = tacc_pmu_global(event);
	struct perf_event *sibling;

	if (event->attr.type != event->pmu->type)
		return -ENOENT;
	if (is_sampling_event(event))
		return -EOPNOTSUPP;
	if (event->cpu < 0 || (event->attach_state & PERF_ATTACH_TASK))
		return -EINVAL;
	if (event->attr.config & ~(TACC_PMU_SLOT_MASK | BIT_ULL(TACC_PMU_GLOBAL_BIT)))
		return -EINVAL;
	if (!tacc_pmu_valid_slot(global, tacc_pmu_slot(event)))
		return -EINVAL;
	if (global && tp->is_vf)
		return -EINVAL;
	if (!tp->is_vf && !perfmon_capable())
		return -EACCES;	/* every tenant's work, other functions' traffic */
	if (!READ_ONCE(tp->tdev))
		return -ENODEV;	/* function gone, PMU waiting for its events */

	/*
	 * A sibling: its group may hold only this PMU's and software events.
	 * perf_try_init_event() holds the leader's ctx->mutex for a sibling
	 * only, which for_each_sibling_event() asserts (lockdep): a new leader
	 * has no ctx yet and no siblings to check.
	 */
	if (event->group_leader != event) {
		if (event->group_leader->pmu != event->pmu &&
		    !is_software_event(event->group_leader))
			return -EINVAL;
		for_each_sibling_event(sibling, event->group_leader) {
			if (sibling->pmu != event->pmu && !is_software_event(sibling))
				return -EINVAL;
		}
	}

	if (!atomic_inc_not_zero(&tp->users))
		return -ENODEV;
	event->cpu = tp->on_cpu;
	kref_get(&tp->ref);
	event->destroy = tacc_pmu_event_destroy;
	return 0;
}

static void tacc_pmu_start(struct perf_event *event, int flags)
{
	struct tacc_pmu *tp = to_tacc_pmu(event->pmu);
	u64 now = 0;

	event->hw.state = 0;
	if (!tacc_pmu_value(tp, event, &now))
		now = 0;
	local64_set(&event->hw.prev_count, now);
}

static void tacc_pmu_stop(struct perf_event *event, int flags)
{
	if (event->hw.state & PERF_HES_STOPPED)
		return;
	tacc_pmu_update(event);
	event->hw.state |= PERF_HES_STOPPED | PERF_HES_UPTODATE;
}

static int tacc_pmu_add(struct perf_event *event, int flags)
{
	event->hw.state = PERF_HES_STOPPED | PERF_HES_UPTODATE;
	if (flags & PERF_EF_START)
		tacc_pmu_start(event, PERF_EF_RELOAD);
	perf_event_update_userpage(event);
	return 0;
}

static void tacc_pmu_del(struct perf_event *event, int flags)
{
	tacc_pmu_stop(event, PERF_EF_UPDATE);
	perf_event_update_userpage(event);
}

/* ---------------------------------------------------------- hotplug ---- */

static int tacc_pmu_online_cpu(unsigned int cpu, struct hlist_node *node)
{
	struct tacc_pmu *tp = hlist_entry_safe(node, struct tacc_pmu, cpuhp_node);

	if (tp->on_cpu < 0)
		tp->on_cpu = cpumask_local_spread(0, tp->node);
	return 0;
}

static int tacc_pmu_offline_cpu(unsigned int cpu, struct hlist_node *node)
{
	struct tacc_pmu *tp = hlist_entry_safe(node, struct tacc_pmu, cpuhp_node);
	unsigned int target;

	if (cpu != tp->on_cpu)
		return 0;
	target = cpumask_any_but(cpu_online_mask, cpu);
	if (target >= nr_cpu_ids) {
		tp->on_cpu = -1;
		return 0;
	}
	perf_pmu_migrate_context(&tp->pmu, cpu, target);
	tp->on_cpu = target;
	return 0;
}

/* The multi-instance hotplug state lives while any tacc PMU does. */
static int tacc_pmu_hp_get(void)
{
	int ret;

	lockdep_assert_held(&tacc_pmu_lock);
	if (tacc_pmu_hp_state >= 0)
		return 0;
	ret = cpuhp_setup_state_multi(CPUHP_AP_ONLINE_DYN, "perf/tacc:online",
				      tacc_pmu_online_cpu, tacc_pmu_offline_cpu);
	if (ret < 0)
		return ret;
	tacc_pmu_hp_state = ret;
	return 0;
}

static void tacc_pmu_hp_put(void)
{
	lockdep_assert_held(&tacc_pmu_lock);
	if (tacc_pmu_hp_state >= 0 && list_empty(&tacc_pmu_list)) {
		cpuhp_remove_multi_state(tacc_pmu_hp_state);
		tacc_pmu_hp_state = -1;
	}
}

/* ------------------------------------------------------ probe/remove ---- */

/**
 * tacc_pmu_init - register the perf PMU of a function.
 * @tdev: the function, probed far enough for tacc_counter_read().
 *
 * A PMU is an observability extra: failure is logged and not fatal.
 */
int tacc_pmu_init(struct tacc_device *tdev)
{
	struct pci_dev *pdev = tdev->pdev;
	struct tacc_pmu *tp;
	int ret;

	tp = kzalloc(sizeof(*tp), GFP_KERNEL);
	if (!tp)
		return -ENOMEM;
	kref_init(&tp->ref);
	atomic_set(&tp->users, 1);
	INIT_RCU_WORK(&tp->reap, tacc_pmu_reap);
	spin_lock_init(&tp->lock);
	tp->tdev = tdev;
	tp->is_vf = tdev->is_vf;
	tp->node = dev_to_node(&pdev->dev);
	tp->on_cpu = -1;
	snprintf(tp->name, sizeof(tp->name), "tacc_%x", tacc_devid(tdev));
	ret = tacc_pmu_build_events(tp);
	if (ret) {
		tacc_pmu_free(tp);
		return ret;
	}
	tp->pmu = (struct pmu) {
		.module		= THIS_MODULE,
		.parent		= &pdev->dev,
		.attr_groups	= tp->groups,
		.capabilities	= PERF_PMU_CAP_NO_EXCLUDE | PERF_PMU_CAP_NO_INTERRUPT,
		.task_ctx_nr	= perf_invalid_context,
		.event_init	= tacc_pmu_event_init,
		.add		= tacc_pmu_add,
		.del		= tacc_pmu_del,
		.start		= tacc_pmu_start,
		.stop		= tacc_pmu_stop,
		.read		= tacc_pmu_update,
	};

	/* a detached PMU of the same name may be on its way out: let it go */
	rcu_barrier();
	flush_workqueue(tacc_pmu_wq);
	mutex_lock(&tacc_pmu_lock);
	ret = tacc_pmu_hp_get();
	if (ret)
		goto err_unlock;
	ret = cpuhp_state_add_instance(tacc_pmu_hp_state, &tp->cpuhp_node);
	if (ret)
		goto err_hp;
	ret = perf_pmu_register(&tp->pmu, tp->name, -1);
	if (ret)
		goto err_instance;
	list_add(&tp->list, &tacc_pmu_list);
	mutex_unlock(&tacc_pmu_lock);
	return 0;

err_instance:
	cpuhp_state_remove_instance_nocalls(tacc_pmu_hp_state, &tp->cpuhp_node);
err_hp:
	tacc_pmu_hp_put();
err_unlock:
	mutex_unlock(&tacc_pmu_lock);
	pci_warn(pdev, "perf PMU %s not registered: %d\n", tp->name, ret);
	tacc_pmu_free(tp);
	return ret;
}

/**
 * tacc_pmu_fini - detach the PMU of a function (no-op without one).
 * @tdev: the function.
 *
 * The PMU no longer reads the function; events still open read their last
 * value, and new ones fail with -ENODEV.  It is unregistered now if no
 * event is open, else after the last one is freed (tacc_pmu_users_put()).
 */
void tacc_pmu_fini(struct tacc_device *tdev)
{
	struct tacc_pmu *tp, *found = NULL;
	unsigned long flags;

	mutex_lock(&tacc_pmu_lock);
	list_for_each_entry(tp, &tacc_pmu_list, list) {
		if (tp->tdev == tdev) {
			found = tp;
			break;
		}
	}
	if (found) {
		spin_lock_irqsave(&found->lock, flags);
		WRITE_ONCE(found->tdev, NULL);
		spin_unlock_irqrestore(&found->lock, flags);
	}
	mutex_unlock(&tacc_pmu_lock);
	if (found && atomic_dec_and_test(&found->users))
		tacc_pmu_unregister(found);
}

int tacc_pmu_module_init(void)
{
	tacc_pmu_wq = alloc_workqueue("tacc-pmu", WQ_UNBOUND, 0);
	return tacc_pmu_wq ? 0 : -ENOMEM;
}

/* No event is open (each holds the module): only queued reaps are left. */
void tacc_pmu_module_exit(void)
{
	rcu_barrier();
	destroy_workqueue(tacc_pmu_wq);
}
