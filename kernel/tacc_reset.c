// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc function-level recovery: AER (pci_error_handlers), FLR through
 * sysfs "reset" (reset_prepare/reset_done) and the driver's own recovery
 * of a fatal device error when AER does not act.  All three stop the
 * schedulers, fail every job the device held with an error fence, and
 * reprogram the function after its reset.
 */
#include <linux/aer.h>
#include <linux/delay.h>
#include <linux/pci.h>
#include <linux/pm_runtime.h>

#include <drm/drm_drv.h>
#include <drm/drm_print.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

/*
 * The device reports its fatal error as an AER uncorrectable internal
 * error, which the AER mask hides by default: unmask it (PF only: VFs
 * share the PF's AER reporting).  pci_save_state() keeps the mask, so the
 * restore after a reset keeps it too.
 */
void tacc_aer_init(struct tacc_device *tdev)
{
	struct pci_dev *pdev = tdev->pdev;
	int aer = pci_find_ext_capability(pdev, PCI_EXT_CAP_ID_ERR);
	u32 mask;

	if (!aer || tdev->is_vf)
		return;
	pci_read_config_dword(pdev, aer + PCI_ERR_UNCOR_MASK, &mask);
	if (mask & PCI_ERR_UNC_INTN)
		pci_write_config_dword(pdev, aer + PCI_ERR_UNCOR_MASK, mask & ~PCI_ERR_UNC_INTN);
}

/*
 * Stop submission, make the function quiet, and only then fail everything
 * it held: a failed fence tells user space the job's memory is its own
 * again, so nothing of the job may still run (ivpu_pm_reset_prepare_cb:
 * stop the schedulers, stop the hardware, then signal).  @mmio is false
 * when the function does not answer (AER).  The device may still DMA then
 * (on x86 nothing stops it before the link reset): with @defer the jobs are
 * failed only once the function was reset (tacc_recover_fail_deferred()
 * from slot_reset, the driver's own reset, or tacc_recover_end()).
 * Returns false when a recovery was already under way.
 */
static bool tacc_recover_begin(struct tacc_device *tdev, int error, bool mmio, bool defer)
{
	u32 delay;
	u32 i;

	mutex_lock(&tdev->reset_lock);
	if (tdev->in_reset) {
		mutex_unlock(&tdev->reset_lock);
		return false;
	}
	tdev->in_reset = true;
	for (i = 0; i < tdev->num_queues; i++)
		drm_sched_wqueue_stop(&tdev->queues[i].sched);
	tacc_hw_stop(tdev, mmio && pm_runtime_active(tacc_to_dev(tdev)));
	if (defer)
		tdev->fail_pending = error;
	else
		tacc_queues_fail(tdev, error);
	mutex_unlock(&tdev->reset_lock);

	/* test knob (debugfs, 0): hold the reset right after the fences failed (or not) */
	delay = READ_ONCE(tdev->recover_delay_ms);
	if (delay)
		msleep(delay);
	return true;
}

/*
 * The jobs of a recovery begun without MMIO, once the function was reset
 * (or its registers answer again: @mmio, then its queues are disabled first
 * and what completed keeps its status).
 */
static void tacc_recover_fail_deferred_locked(struct tacc_device *tdev, bool mmio)
{
	lockdep_assert_held(&tdev->reset_lock);
	if (!tdev->fail_pending)
		return;
	if (mmio && pm_runtime_active(tacc_to_dev(tdev)))
		tacc_queues_quiesce(tdev);
	tacc_queues_fail(tdev, tdev->fail_pending);
	tdev->fail_pending = 0;
}

static void tacc_recover_fail_deferred(struct tacc_device *tdev, bool mmio)
{
	mutex_lock(&tdev->reset_lock);
	tacc_recover_fail_deferred_locked(tdev, mmio);
	mutex_unlock(&tdev->reset_lock);
}

/* The function was reset: reprogram it and restart submission. */
static int tacc_recover_end(struct tacc_device *tdev, int reason)
{
	int ret = 0;
	u32 i;

	mutex_lock(&tdev->reset_lock);
	if (!tdev->in_reset) {
		mutex_unlock(&tdev->reset_lock);
		return 0;
	}
	/* AER without slot_reset: stop the queues now, before their jobs fail */
	tacc_recover_fail_deferred_locked(tdev, true);
	/* a suspended function is reprogrammed by its runtime resume */
	if (pm_runtime_get_if_active(tacc_to_dev(tdev)) > 0) {
		ret = tacc_hw_init(tdev);
		pm_runtime_mark_last_busy(tacc_to_dev(tdev));
		pm_runtime_put_autosuspend(tacc_to_dev(tdev));
	}
	for (i = 0; i < tdev->num_queues; i++)
		drm_sched_wqueue_start(&tdev->queues[i].sched);
	tdev->in_reset = false;
	atomic64_inc(&tdev->dev_resets);
	mutex_unlock(&tdev->reset_lock);

	trace_tacc_reset(tacc_devid(tdev), ~0u, ~0u, 0, 0, reason);
	tacc_genl_event(tdev, TACC_EVENT_RESET, NULL, ~0u, 0, reason, 0, 0, GFP_KERNEL);
	if (ret)
		drm_err(&tdev->drm, "function reset: reinitialisation failed (%d)\n", ret);
	else
		drm_info(&tdev->drm, "function reset (%d): recovered\n", reason);
	return ret;
}

/*
 * A fatal error without AER recovery (AER not native, masked, or a VF),
 * or an AER recovery that stopped after error_detected (the root port's
 * secondary bus reset failed: the core then calls neither slot_reset nor
 * resume; QEMU's q35 root port did so until qemu/patches/0007, for want
 * of Data Link Layer Link Active): the driver restores the function's
 * config space and resets it itself.
 */
static void tacc_fatal_work(struct work_struct *work)
{
	struct tacc_device *tdev = container_of(work, struct tacc_device, fatal_work);
	bool fatal, stuck;
	int idx, t;

	if (drm_dev_enter(&tdev->drm, &idx)) {	/* the state before AER or we reset it */
		if (tdev->hw_up && (tacc_rd(tdev, TACC_REG_STATUS) & TACC_STATUS_FATAL))
			tacc_coredump(tdev, "fatal error", NULL, NULL);
		drm_dev_exit(idx);
	}
	msleep(200);
	for (t = 0; t < 30 && READ_ONCE(tdev->aer_pending); t++)
		msleep(100);
	if (!drm_dev_enter(&tdev->drm, &idx))
		return;
	mutex_lock(&tdev->reset_lock);
	stuck = tdev->in_reset && tdev->aer_pending;
	fatal = !tdev->in_reset && tdev->hw_up &&
		(tacc_rd(tdev, TACC_REG_STATUS) & TACC_STATUS_FATAL);
	mutex_unlock(&tdev->reset_lock);
	if (stuck) {
		drm_warn(&tdev->drm, "AER recovery did not complete: resetting the function\n");
		pci_restore_state(tdev->pdev);
		pci_save_state(tdev->pdev);
		tacc_recover_fail_deferred(tdev, true);
		WRITE_ONCE(tdev->aer_pending, false);
		tacc_recover_end(tdev, -EIO);
	} else if (fatal) {
		drm_warn(&tdev->drm, "fatal error not recovered by AER: resetting the function\n");
		tacc_recover_begin(tdev, -EIO, true, false);
		tacc_recover_end(tdev, -EIO);
	}
	drm_dev_exit(idx);
}

/**
 * tacc_tlb_recover() - reset the function after a TLB invalidation timeout.
 * @tdev: the function.
 *
 * The device may still translate through the entries the invalidation was
 * to drop, so what they map must not be freed yet.  A function reset
 * (CTRL_RESET in tacc_hw_init()) empties its TLB; its jobs fail with -EIO as
 * in any reset.  If another recovery (AER, FLR) holds the function, its
 * reset does the same: wait for it, sleeping.
 *
 * Return: 0 once the function was reset, else an error (keep the pages).
 */
int tacc_tlb_recover(struct tacc_device *tdev)
{
	s64 before = atomic64_read(&tdev->dev_resets);
	int t;

	if (tacc_recover_begin(tdev, -EIO, true, false)) {
		atomic64_inc(&tdev->tlb_recoveries);
		drm_warn(&tdev->drm, "TLB invalidation timed out: resetting the function\n");
		return tacc_recover_end(tdev, -EIO);
	}
	for (t = 0; t < 100 && atomic64_read(&tdev->dev_resets) == before; t++)
		msleep(100);
	return atomic64_read(&tdev->dev_resets) != before ? 0 : -ETIMEDOUT;
}

void tacc_reset_init(struct tacc_device *tdev)
{
	mutex_init(&tdev->reset_lock);
	INIT_WORK(&tdev->fatal_work, tacc_fatal_work);
}

void tacc_reset_fini(struct tacc_device *tdev)
{
	cancel_work_sync(&tdev->fatal_work);
}

void tacc_reset_fatal(struct tacc_device *tdev)
{
	schedule_work(&tdev->fatal_work);
}

/* ------------------------------------------------------------------ AER ---- */

static pci_ers_result_t tacc_error_detected(struct pci_dev *pdev, pci_channel_state_t state)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (!tdev)
		return PCI_ERS_RESULT_DISCONNECT;
	drm_err(&tdev->drm, "PCI error detected, channel state %d\n", state);
	if (state == pci_channel_io_normal)
		return PCI_ERS_RESULT_CAN_RECOVER;
	if (state == pci_channel_io_perm_failure) {
		tacc_recover_begin(tdev, -ENODEV, false, false);
		return PCI_ERS_RESULT_DISCONNECT;
	}
	/* frozen: the device may DMA until the link reset; fail the jobs after it */
	tacc_recover_begin(tdev, -EIO, false, true);
	WRITE_ONCE(tdev->aer_pending, true);
	schedule_work(&tdev->fatal_work);	/* in case the core gives up */
	return PCI_ERS_RESULT_NEED_RESET;
}

static pci_ers_result_t tacc_mmio_enabled(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	/* a non-fatal error: the function still works unless it says FATAL */
	if (tdev && (tacc_rd(tdev, TACC_REG_STATUS) & TACC_STATUS_FATAL))
		return PCI_ERS_RESULT_NEED_RESET;
	return PCI_ERS_RESULT_RECOVERED;
}

static pci_ers_result_t tacc_slot_reset(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (!tdev)
		return PCI_ERS_RESULT_DISCONNECT;
	pci_restore_state(pdev);
	pci_save_state(pdev);
	if (tacc_rd(tdev, TACC_REG_ID) != TACC_ID_MAGIC) {
		drm_err(&tdev->drm, "slot reset: device does not answer\n");
		tacc_recover_fail_deferred(tdev, false);
		return PCI_ERS_RESULT_DISCONNECT;
	}
	/* the function went through the link reset: error_detected's jobs fail now */
	tacc_recover_fail_deferred(tdev, true);
	/* a reset without error_detected (e.g. AER of another function) */
	tacc_recover_begin(tdev, -EIO, true, false);
	return PCI_ERS_RESULT_RECOVERED;
}

static void tacc_resume(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (tdev) {
		WRITE_ONCE(tdev->aer_pending, false);
		tacc_recover_end(tdev, -EIO);
	}
}

/* ------------------------------------------------------------------ FLR ---- */

static void tacc_reset_prepare(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (!tdev)
		return;
	/* FLR zeroes the function's counters: fold them into the base first */
	if (pm_runtime_get_if_active(&pdev->dev) > 0) {
		tacc_counters_cache(tdev);
		pm_runtime_put_noidle(&pdev->dev);
	}
	tacc_recover_begin(tdev, -EIO, true, false);
}

static void tacc_reset_done(struct pci_dev *pdev)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (tdev)
		tacc_recover_end(tdev, -EIO);
}

const struct pci_error_handlers tacc_err_handlers = {
	.error_detected = tacc_error_detected,
	.mmio_enabled = tacc_mmio_enabled,
	.slot_reset = tacc_slot_reset,
	.resume = tacc_resume,
	.reset_prepare = tacc_reset_prepare,
	.reset_done = tacc_reset_done,
};
