// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc SR-IOV: the PF carves one device-memory partition per VF from the
 * top of its window (TACC_REG_VF_DEVMEM_*), gives each VF its queue mask
 * and arbitration weight (the per-VF policy of sysfs sriov_policy/, set
 * while VFs are disabled) and enables the VFs, which this same driver
 * binds.  The device enforces the policy.  The PF stays powered while VFs
 * exist.
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pm_runtime.h>

#include <drm/drm_print.h>

#include "tacc_drv.h"

static unsigned int tacc_vf_devmem_mib = 32;
module_param_named(vf_devmem_mib, tacc_vf_devmem_mib, uint, 0644);
MODULE_PARM_DESC(vf_devmem_mib, "Default device memory of each VF, MiB (sriov_policy/)");

/*
 * What the PF may carve for all its VFs together: half its memory, and no
 * more than what the virtio-tacc window leaves.
 */
static u64 tacc_vf_devmem_limit(struct tacc_device *tdev)
{
	u64 rest = tdev->devmem_size - tdev->virtio_node.size;

	return ALIGN_DOWN(min(tdev->devmem_size / 2, rest), TACC_SZ_2M);
}

static u32 tacc_vf_queues(struct tacc_device *tdev)
{
	return GENMASK(tdev->num_queues - 1, 0);
}

/* Probe: the default policy (vf_devmem_mib each, all queues, weight 1). */
void tacc_sriov_init(struct tacc_device *tdev)
{
	u64 per_vf = (u64)tacc_vf_devmem_mib << 20;
	int i;

	if (tdev->is_vf || !(tdev->caps & TACC_CAP_SRIOV))
		return;
	per_vf = min(per_vf, tacc_vf_devmem_limit(tdev) / TACC_MAX_VFS);
	for (i = 0; i < TACC_MAX_VFS; i++) {
		tdev->vf_policy[i].devmem_bytes = ALIGN_DOWN(per_vf, TACC_SZ_2M);
		tdev->vf_policy[i].queue_mask = tacc_vf_queues(tdev);
		tdev->vf_policy[i].weight = 1;
	}
}

/* Windows, weights (and, before VF Enable, queue masks) into the device. */
static void tacc_sriov_write_policy(struct tacc_device *tdev, bool masks)
{
	int i;

	for (i = 0; i < TACC_MAX_VFS; i++) {
		struct drm_mm_node *n = &tdev->vf_nodes[i];
		bool on = i < tdev->num_vfs && drm_mm_node_allocated(n);

		tacc_wr64(tdev, TACC_REG_VF_DEVMEM_BASE(i), on ? n->start : 0);
		tacc_wr64(tdev, TACC_REG_VF_DEVMEM_SIZE(i), on ? n->size : 0);
		tacc_wr(tdev, TACC_REG_ARB_WEIGHT(i + 1), tdev->vf_policy[i].weight);
		/* the device refuses mask writes while VFs are enabled (it keeps them) */
		if (masks && (tdev->caps & TACC_CAP_VF_POLICY))
			tacc_wr(tdev, TACC_REG_VF_QUEUE_MASK(i), tdev->vf_policy[i].queue_mask);
	}
}

void tacc_sriov_restore(struct tacc_device *tdev)
{
	if (tdev->caps & TACC_CAP_SRIOV)
		tacc_sriov_write_policy(tdev, !pci_num_vf(tdev->pdev));
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

/*
 * Reserve the VF windows (VF 1 at the top, each below the previous one,
 * below the virtio-tacc window where one would meet it: -ENOSPC if it does
 * not fit); PF memory still being scrubbed there is waited for.
 */
static int tacc_sriov_reserve(struct tacc_device *tdev, int num_vfs)
{
	unsigned long deadline = jiffies + 2 * HZ;
	int i, ret;
	u64 top;
	u32 gen;

	for (;;) {
		gen = atomic_read(&tdev->scrub_gen);
		ret = 0;
		top = tdev->devmem_size;
		mutex_lock(&tdev->devmem_lock);
		for (i = 0; i < num_vfs; i++) {
			struct drm_mm_node *n = &tdev->vf_nodes[i];

			n->size = tdev->vf_policy[i].devmem_bytes;
			if (top >= n->size &&
			    tacc_devmem_virtio_overlaps(tdev, top - n->size, n->size))
				top = min(top, tdev->virtio_node.start);
			if (top < n->size) {
				n->size = 0;
				ret = -E2BIG;	/* no room below the virtio window */
				break;
			}
			n->start = top - n->size;
			top = n->start;
			/* the virtio window is a node: a VF window meeting it is refused */
			ret = drm_mm_reserve_node(&tdev->devmem_mm, n);
			if (ret)
				break;
			tdev->devmem_used += n->size;
		}
		mutex_unlock(&tdev->devmem_lock);
		if (!ret)
			return 0;
		tacc_sriov_release(tdev);
		if (ret == -E2BIG)
			return -ENOSPC;
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
	int ret;

	if (!(tdev->caps & TACC_CAP_SRIOV) || tdev->is_vf)
		return -EOPNOTSUPP;
	if (num_vfs > TACC_MAX_VFS)
		return -EINVAL;
	if (!tdev->vf_policy[0].devmem_bytes)
		return -ENOSPC;		/* a device too small to carve VF windows */

	ret = pm_runtime_resume_and_get(&pdev->dev);
	if (ret)
		return ret;

	ret = tacc_sriov_clean(tdev);
	if (ret)
		goto err_release;
	ret = tacc_sriov_reserve(tdev, num_vfs);
	if (ret)
		goto err_release;
	/* whatever the PF (or an earlier driver) left there: a VF starts clean */
	ret = tacc_sriov_scrub(tdev, num_vfs);
	if (ret) {
		ret = -EIO;
		goto err_release;
	}

	tdev->num_vfs = num_vfs;
	tacc_sriov_write_policy(tdev, true);
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
	int ret;

	if (!tdev)
		return -ENODEV;
	mutex_lock(&tdev->sriov_lock);
	if (!num_vfs)
		ret = tacc_sriov_disable(tdev);
	else if (tdev->num_vfs)
		ret = -EBUSY;
	else
		ret = tacc_sriov_enable(tdev, num_vfs);
	mutex_unlock(&tdev->sriov_lock);
	return ret;
}

void tacc_sriov_fini(struct tacc_device *tdev)
{
	mutex_lock(&tdev->sriov_lock);
	tacc_sriov_disable(tdev);
	mutex_unlock(&tdev->sriov_lock);
	if (tdev->vf_dirty) {		/* the function goes: nobody gets them */
		tdev->vf_dirty = false;
		tacc_sriov_release(tdev);
	}
}

/* ------------------------------------------------- sriov_policy/ ---- */

enum tacc_policy_field { TACC_POL_DEVMEM, TACC_POL_QUEUE_MASK, TACC_POL_WEIGHT };

struct tacc_policy_attr {
	struct device_attribute attr;
	u8 vf;				/* 0-based */
	u8 field;			/* enum tacc_policy_field */
};

static u64 tacc_policy_devmem_sum(struct tacc_device *tdev)
{
	u64 sum = 0;
	int i;

	for (i = 0; i < TACC_MAX_VFS; i++)
		sum += tdev->vf_policy[i].devmem_bytes;
	return sum;
}

/*
 * A new value for one field: -EINVAL outside its range (a window is a
 * non-zero 2 MiB multiple, a queue mask a non-empty set of the VF's
 * queues, a weight 1 .. TACC_ARB_WEIGHT_MAX), -ENOSPC if the windows of
 * all VFs together no longer fit what the PF can carve.
 */
static int tacc_policy_set(struct tacc_device *tdev, int vf, int field, u64 v)
{
	struct tacc_vf_policy *p = &tdev->vf_policy[vf];
	u64 limit = tacc_vf_devmem_limit(tdev);

	lockdep_assert_held(&tdev->sriov_lock);
	switch (field) {
	case TACC_POL_DEVMEM:
		if (!v || !IS_ALIGNED(v, TACC_SZ_2M))
			return -EINVAL;
		if (v > limit || tacc_policy_devmem_sum(tdev) - p->devmem_bytes + v > limit)
			return -ENOSPC;
		p->devmem_bytes = v;
		return 0;
	case TACC_POL_QUEUE_MASK:
		if (!v || (v & ~(u64)tacc_vf_queues(tdev)))
			return -EINVAL;
		p->queue_mask = v;
		return 0;
	case TACC_POL_WEIGHT:
		if (!v || v > TACC_ARB_WEIGHT_MAX)
			return -EINVAL;
		p->weight = v;
		return 0;
	}
	return -EINVAL;
}

static ssize_t tacc_policy_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_policy_attr *pa = container_of(attr, struct tacc_policy_attr, attr);
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));
	struct tacc_vf_policy p;

	mutex_lock(&tdev->sriov_lock);
	p = tdev->vf_policy[pa->vf];
	mutex_unlock(&tdev->sriov_lock);
	switch (pa->field) {
	case TACC_POL_DEVMEM:
		return sysfs_emit(buf, "%llu\n", p.devmem_bytes);
	case TACC_POL_QUEUE_MASK:
		return sysfs_emit(buf, "0x%x\n", p.queue_mask);
	default:
		return sysfs_emit(buf, "%u\n", p.weight);
	}
}

/* Settable while VFs are disabled (-EBUSY otherwise); applied at enable. */
static ssize_t tacc_policy_store(struct device *dev, struct device_attribute *attr,
				 const char *buf, size_t count)
{
	struct tacc_policy_attr *pa = container_of(attr, struct tacc_policy_attr, attr);
	struct tacc_device *tdev = pci_get_drvdata(to_pci_dev(dev));
	u64 v;
	int ret;

	ret = kstrtou64(buf, 0, &v);
	if (ret)
		return ret;
	mutex_lock(&tdev->sriov_lock);
	if (tdev->num_vfs)
		ret = -EBUSY;
	else
		ret = tacc_policy_set(tdev, pa->vf, pa->field, v);
	mutex_unlock(&tdev->sriov_lock);
	return ret ?: count;
}

static ssize_t devmem_limit_bytes_show(struct device *dev, struct device_attribute *attr,
				       char *buf)
{
	return sysfs_emit(buf, "%llu\n",
			  tacc_vf_devmem_limit(pci_get_drvdata(to_pci_dev(dev))));
}
static DEVICE_ATTR_RO(devmem_limit_bytes);

#define TACC_POL_ATTR(_name, _vf, _field)					\
	{ .attr = __ATTR(_name, 0644, tacc_policy_show, tacc_policy_store),	\
	  .vf = (_vf), .field = (_field) }

static_assert(TACC_MAX_VFS == 4);
static struct tacc_policy_attr tacc_policy_list[] = {
	TACC_POL_ATTR(vf1_devmem_bytes, 0, TACC_POL_DEVMEM),
	TACC_POL_ATTR(vf1_queue_mask, 0, TACC_POL_QUEUE_MASK),
	TACC_POL_ATTR(vf1_weight, 0, TACC_POL_WEIGHT),
	TACC_POL_ATTR(vf2_devmem_bytes, 1, TACC_POL_DEVMEM),
	TACC_POL_ATTR(vf2_queue_mask, 1, TACC_POL_QUEUE_MASK),
	TACC_POL_ATTR(vf2_weight, 1, TACC_POL_WEIGHT),
	TACC_POL_ATTR(vf3_devmem_bytes, 2, TACC_POL_DEVMEM),
	TACC_POL_ATTR(vf3_queue_mask, 2, TACC_POL_QUEUE_MASK),
	TACC_POL_ATTR(vf3_weight, 2, TACC_POL_WEIGHT),
	TACC_POL_ATTR(vf4_devmem_bytes, 3, TACC_POL_DEVMEM),
	TACC_POL_ATTR(vf4_queue_mask, 3, TACC_POL_QUEUE_MASK),
	TACC_POL_ATTR(vf4_weight, 3, TACC_POL_WEIGHT),
};

#define TACC_POL_A(i)	(&tacc_policy_list[i].attr.attr)

static struct attribute *tacc_policy_attrs[] = {
	TACC_POL_A(0), TACC_POL_A(1), TACC_POL_A(2), TACC_POL_A(3),
	TACC_POL_A(4), TACC_POL_A(5), TACC_POL_A(6), TACC_POL_A(7),
	TACC_POL_A(8), TACC_POL_A(9), TACC_POL_A(10), TACC_POL_A(11),
	&dev_attr_devmem_limit_bytes.attr,
	NULL
};

static_assert(ARRAY_SIZE(tacc_policy_attrs) == ARRAY_SIZE(tacc_policy_list) + 2);

/* On a PF with SR-IOV and TACC_CAP_VF_POLICY; one file set per possible VF. */
static umode_t tacc_policy_visible(struct kobject *kobj, struct attribute *attr, int n)
{
	struct pci_dev *pdev = to_pci_dev(kobj_to_dev(kobj));
	struct tacc_device *tdev = pci_get_drvdata(pdev);
	u32 need = TACC_CAP_SRIOV | TACC_CAP_VF_POLICY;

	if (!tdev || tdev->is_vf || (tdev->caps & need) != need)
		return 0;
	if (n < ARRAY_SIZE(tacc_policy_list) &&
	    tacc_policy_list[n].vf >= pci_sriov_get_totalvfs(pdev))
		return 0;
	return attr->mode;
}

const struct attribute_group tacc_sriov_policy_group = {
	.name = "sriov_policy",
	.attrs = tacc_policy_attrs,
	.is_visible = tacc_policy_visible,
};
