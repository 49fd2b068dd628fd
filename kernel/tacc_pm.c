// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc power management: runtime PM with autosuspend (jobs and the trace
 * and sample ring consumers hold references), full reprogramming after
 * D3hot, which loses the queue state; system sleep through the runtime
 * callbacks (suspend stops the sample ring in tacc_hw_fini(), resume
 * restarts it with a new epoch in tacc_hw_init()).
 */
#include <linux/delay.h>
#include <linux/pm_runtime.h>

#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

static bool tacc_counter_is_hwm(u32 page, u32 slot)
{
	return !page && slot >= TACC_CNT_queue0_depth_hwm && slot <= TACC_CNT_queue3_depth_hwm;
}

/*
 * The device zeroes a function's counters in every function reset (D3hot ->
 * D0, FLR): fold the values into a per-driver base so sysfs counters stay
 * monotonic and never need to wake a suspended device.  The global page is
 * device-wide and never reset: keep its last snapshot, to be shown while
 * suspended, instead of summing it.
 */
void tacc_counters_cache(struct tacc_device *tdev)
{
	u64 snap[TACC_SAMPLE_SLOTS * 2];
	u32 pages = tdev->is_vf ? 1 : 2;
	u32 p, i, tries;
	unsigned long flags;

	for (p = 0; p < pages; p++) {
		void __iomem *base = tdev->cnt + p * TACC_CNT_GLOBAL_PAGE;

		for (tries = 0; tries < 8; tries++) {
			u64 g0 = readq(base + 8 * TACC_CNT_SLOT_GEN), g1;

			for (i = 0; i < TACC_SAMPLE_SLOTS; i++)
				snap[p * TACC_SAMPLE_SLOTS + i] = readq(base + 8 * i);
			g1 = readq(base + 8 * TACC_CNT_SLOT_GEN);
			if (!(g0 & 1) && g0 == g1)
				break;
		}
	}
	spin_lock_irqsave(&tdev->cnt_lock, flags);
	for (p = 0; p < pages; p++) {
		for (i = 2; i < TACC_SAMPLE_SLOTS; i++) {
			u64 *b = &tdev->cnt_base[p * TACC_SAMPLE_SLOTS + i];
			u64 v = snap[p * TACC_SAMPLE_SLOTS + i];

			if (tacc_counter_is_hwm(p, i))
				*b = max(*b, v);
			else if (p == 1)
				*b = v;	/* the global page survives function resets */
			else
				*b += v;
		}
	}
	spin_unlock_irqrestore(&tdev->cnt_lock, flags);
}

static int tacc_runtime_suspend(struct device *dev)
{
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));

	tacc_counters_cache(tdev);
	tacc_hw_fini(tdev);
	atomic64_inc(&tdev->pm_suspends);
	trace_tacc_pm(tacc_devid(tdev), 0, 3);
	tacc_genl_event(tdev, TACC_EVENT_PM, NULL, 0, 0, 3, 0, 0, GFP_KERNEL);
	return 0;
}

static int tacc_runtime_resume(struct device *dev)
{
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));
	int ret;

	ret = tacc_hw_init(tdev);
	atomic64_inc(&tdev->pm_resumes);
	trace_tacc_pm(tacc_devid(tdev), 3, 0);
	tacc_genl_event(tdev, TACC_EVENT_PM, NULL, 0, 0, 0, 0, 0, GFP_KERNEL);
	return ret;
}

/* A system suspend waits this long for the jobs in flight, then fails. */
#define TACC_SUSPEND_DRAIN_MS	10000

static void tacc_sched_start_all(struct tacc_device *tdev)
{
	u32 i;

	for (i = 0; i < tdev->num_queues; i++)
		drm_sched_wqueue_start(&tdev->queues[i].sched);
}

/*
 * The device loses its jobs in D3: stop the schedulers first (no new job
 * reaches the device), then wait for the jobs in flight, checked under the
 * queue locks; if they do not drain, fail the suspend with -EBUSY rather
 * than power the function down under them.
 */
static int tacc_system_suspend(struct device *dev)
{
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));
	int ret;
	u32 i;

	for (i = 0; i < tdev->num_queues; i++)
		drm_sched_wqueue_stop(&tdev->queues[i].sched);
	if (!tacc_queues_wait_idle(tdev, TACC_SUSPEND_DRAIN_MS)) {
		drm_warn(&tdev->drm, "system suspend: jobs still running after %u ms\n",
			 TACC_SUSPEND_DRAIN_MS);
		tacc_sched_start_all(tdev);
		return -EBUSY;
	}
	ret = pm_runtime_force_suspend(dev);
	if (ret)
		tacc_sched_start_all(tdev);
	return ret;
}

static int tacc_system_resume(struct device *dev)
{
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));
	int ret;

	ret = pm_runtime_force_resume(dev);
	tacc_sched_start_all(tdev);
	return ret;
}

const struct dev_pm_ops tacc_pm_ops = {
	SYSTEM_SLEEP_PM_OPS(tacc_system_suspend, tacc_system_resume)
	RUNTIME_PM_OPS(tacc_runtime_suspend, tacc_runtime_resume, NULL)
};

void tacc_pm_init(struct tacc_device *tdev)
{
	struct device *dev = tacc_to_dev(tdev);

	pm_runtime_set_autosuspend_delay(dev, tacc_autosuspend_ms);
	pm_runtime_use_autosuspend(dev);
	pm_runtime_allow(dev);
	pm_runtime_mark_last_busy(dev);
	pm_runtime_put_autosuspend(dev);
}

void tacc_pm_fini(struct tacc_device *tdev)
{
	struct device *dev = tacc_to_dev(tdev);

	pm_runtime_get_noresume(dev);
	pm_runtime_forbid(dev);
	pm_runtime_dont_use_autosuspend(dev);
}
