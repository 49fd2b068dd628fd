// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc SR-IOV: the PF carves one device-memory partition per VF from the
 * top of its window (TACC_REG_VF_DEVMEM_*) and enables the VFs, which this
 * same driver binds.  The PF stays powered while VFs exist.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pm_runtime.h>

#include <drm/drm_print.h>

#include "tacc_drv.h"

static unsigned int tacc_vf_devmem_mib = 32;
module_param_named(vf_devmem_mib, tacc_vf_devmem_mib, uint, 0644);
MODULE_PARM_DESC(vf_devmem_mib, "Device memory given to each VF, MiB");

void tacc_sriov_restore(struct tacc_device *tdev)
{
	int i;

	if (!(tdev->caps & TACC_CAP_SRIOV))
		return;
	for (i = 0; i < TACC_MAX_VFS; i++) {
		struct drm_mm_node *n = &tdev->vf_nodes[i];
		bool on = i < tdev->num_vfs && drm_mm_node_allocated(n);

		tacc_wr64(tdev, TACC_REG_VF_DEVMEM_BASE(i), on ? n->start : 0);
		tacc_wr64(tdev, TACC_REG_VF_DEVMEM_SIZE(i), on ? n->size : 0);
	}
}

static void tacc_sriov_release(struct tacc_device *tdev)
{
	int i;

	mutex_lock(&tdev->devmem_lock);
	for (i = 0; i < TACC_MAX_VFS; i++) {
		if (drm_mm_node_allocated(&tdev->vf_nodes[i])) {
			tdev->devmem_used -= tdev->vf_nodes[i].size;
			drm_mm_remove_node(&tdev->vf_nodes[i]);
		}
	}
	mutex_unlock(&tdev->devmem_lock);
}

/*
 * Scrub the windows of VFs 0 .. n-1 (window offsets of the PF = device
 * memory addresses), waiting: a window changes owner only once overwritten.
 */
static int tacc_sriov_scrub(struct tacc_device *tdev, int n)
{
	int i, ret;

	for (i = 0; i < n; i++) {
		struct drm_mm_node *node = &tdev->vf_nodes[i];

		if (!drm_mm_node_allocated(node))
			continue;
		ret = tacc_scrub_range_sync(tdev, node->start, node->size);
		if (ret) {
			drm_err(&tdev->drm, "VF%d window 0x%llx+0x%llx: scrub failed (%d)\n",
				i + 1, node->start, node->size, ret);
			return ret;
		}
	}
	return 0;
}

/* Windows a failed scrub left reserved (tdev->vf_dirty): scrub again, release. */
static int tacc_sriov_clean(struct tacc_device *tdev)
{
	int ret;

	if (!tdev->vf_dirty)
		return 0;
	ret = tacc_sriov_scrub(tdev, TACC_MAX_VFS);
	if (ret)
		return -EIO;
	tdev->vf_dirty = false;
	tacc_sriov_release(tdev);
	return 0;
}

/* Reserve the VF windows; PF memory still being scrubbed there is waited for. */
static int tacc_sriov_reserve(struct tacc_device *tdev, int num_vfs, u64 per_vf)
{
	unsigned long deadline = jiffies + 2 * HZ;
	int i, ret;
	u32 gen;

	for (;;) {
		gen = atomic_read(&tdev->scrub_gen);
		ret = 0;
		mutex_lock(&tdev->devmem_lock);
		for (i = 0; i < num_vfs; i++) {
			struct drm_mm_node *n = &tdev->vf_nodes[i];

			n->start = tdev->devmem_size - (u64)(i + 1) * per_vf;
			n->size = per_vf;
			ret = drm_mm_reserve_node(&tdev->devmem_mm, n);
			if (ret)
				break;
			tdev->devmem_used += per_vf;
		}
		mutex_unlock(&tdev->devmem_lock);
		if (!ret)
			return 0;
		tacc_sriov_release(tdev);
		if (time_after(jiffies, deadline))
			return -EBUSY;	/* PF buffers live there */
		ret = tacc_scrub_wait_release(tdev, gen, deadline - jiffies);
		if (ret < 0)
			return ret;
		if (!ret)
			return -EBUSY;
	}
}

static int tacc_sriov_disable(struct tacc_device *tdev)
{
	struct pci_dev *pdev = tdev->pdev;

	if (!tdev->num_vfs)
		return 0;
	if (pci_vfs_assigned(pdev)) {
		drm_err(&tdev->drm, "VFs are assigned, cannot disable SR-IOV\n");
		return -EPERM;
	}
	pci_disable_sriov(pdev);
	/* the windows go back to the PF: scrubbed first, or kept reserved */
	if (tacc_sriov_scrub(tdev, tdev->num_vfs))
		tdev->vf_dirty = true;
	tdev->num_vfs = 0;
	if (!tdev->vf_dirty)
		tacc_sriov_release(tdev);
	tacc_sriov_restore(tdev);
	tacc_genl_event(tdev, TACC_EVENT_VF_DISABLE, NULL, 0, 0, 0, 0, 0, GFP_KERNEL);
	pm_runtime_mark_last_busy(&pdev->dev);
	pm_runtime_put_autosuspend(&pdev->dev);
	return 0;
}

static int tacc_sriov_enable(struct tacc_device *tdev, int num_vfs)
{
	struct pci_dev *pdev = tdev->pdev;
	u64 per_vf = (u64)tacc_vf_devmem_mib << 20;
	int ret;

	if (!(tdev->caps & TACC_CAP_SRIOV) || tdev->is_vf)
		return -EOPNOTSUPP;
	if (num_vfs > TACC_MAX_VFS)
		return -EINVAL;
	if (!per_vf || per_vf * TACC_MAX_VFS >= tdev->devmem_size)
		per_vf = tdev->devmem_size / (2 * TACC_MAX_VFS);
	per_vf = ALIGN_DOWN(per_vf, TACC_SZ_2M);
	if (!per_vf)
		return -ENOSPC;

	ret = pm_runtime_resume_and_get(&pdev->dev);
	if (ret)
		return ret;

	ret = tacc_sriov_clean(tdev);
	if (ret)
		goto err_release;
	ret = tacc_sriov_reserve(tdev, num_vfs, per_vf);
	if (ret)
		goto err_release;
	/* whatever the PF (or an earlier driver) left there: a VF starts clean */
	ret = tacc_sriov_scrub(tdev, num_vfs);
	if (ret) {
		ret = -EIO;
		goto err_release;
	}

	tdev->num_vfs = num_vfs;
	tacc_sriov_restore(tdev);
	ret = pci_enable_sriov(pdev, num_vfs);
	if (ret)
		goto err_regs;
	tacc_genl_event(tdev, TACC_EVENT_VF_ENABLE, NULL, 0, 0, num_vfs, 0, 0, GFP_KERNEL);
	return num_vfs;

err_regs:
	tdev->num_vfs = 0;
	tacc_sriov_restore(tdev);
err_release:
	if (!tdev->vf_dirty)
		tacc_sriov_release(tdev);
	pm_runtime_mark_last_busy(&pdev->dev);
	pm_runtime_put_autosuspend(&pdev->dev);
	return ret;
}

int tacc_sriov_configure(struct pci_dev *pdev, int num_vfs)
{
	struct tacc_device *tdev = pci_get_drvdata(pdev);

	if (!tdev)
		return -ENODEV;
	if (!num_vfs)
		return tacc_sriov_disable(tdev);
	if (tdev->num_vfs)
		return -EBUSY;
	return tacc_sriov_enable(tdev, num_vfs);
}

void tacc_sriov_fini(struct tacc_device *tdev)
{
	tacc_sriov_disable(tdev);
	if (tdev->vf_dirty) {		/* the function goes: nobody gets them */
		tdev->vf_dirty = false;
		tacc_sriov_release(tdev);
	}
}
