// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc sysfs ABI (docs/sysfs-abi.md), under the PCI device:
 *   tacc/            device information, clock_sync, live objects, PM counts
 *   counters/        one file per function counter + catalogue
 *   global_counters/ one file per global counter (PF only, root only)
 * Counter files read the live registers when the device is powered and the
 * snapshot taken at suspend otherwise: reading never wakes the device.
 *
 * The PF's function-wide telemetry (its counters, queue_stats, live_objects)
 * sums the work of every tenant of the PF: root only (0400), as the PF's
 * rings need CAP_PERFMON (docs/uapi.md "Threat model").  A VF's are its
 * node's users' (0444).
 */
#include <linux/bitfield.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/pm_runtime.h>
#include <linux/sysfs.h>

#include "tacc_drv.h"

static struct tacc_device *tacc_sysfs_dev(struct device *dev)
{
	return pci_get_drvdata(to_pci_dev(dev));
}

u64 tacc_counter_read(struct tacc_device *tdev, bool global, u32 slot)
{
	u32 page = global ? 1 : 0;
	unsigned long flags;
	bool live = false;
	u64 base, v = 0;

	spin_lock_irqsave(&tdev->cnt_lock, flags);
	base = tdev->cnt_base[page * TACC_SAMPLE_SLOTS + slot];
	spin_unlock_irqrestore(&tdev->cnt_lock, flags);
	if (pm_runtime_get_if_active(tacc_to_dev(tdev)) > 0) {
		v = readq(tdev->cnt + page * TACC_CNT_GLOBAL_PAGE + 8 * slot);
		pm_runtime_put_autosuspend(tacc_to_dev(tdev));
		live = true;
	}
	if (global)	/* never reset: live value, or the snapshot of the last suspend */
		return live ? v : base;
	if (!global && slot >= TACC_CNT_queue0_depth_hwm && slot <= TACC_CNT_queue3_depth_hwm)
		return max(base, v);
	return base + v;
}

/* ------------------------------------------------------------ counters ---- */

struct tacc_cnt_attr {
	struct device_attribute attr;
	u32 slot;
	bool global;
	const char *unit;
	const char *desc;
};

static ssize_t tacc_cnt_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_cnt_attr *ca = container_of(attr, struct tacc_cnt_attr, attr);

	return sysfs_emit(buf, "%llu\n", tacc_counter_read(tacc_sysfs_dev(dev), ca->global,
							   ca->slot));
}

#define TACC_FCNT_DEF(_name, _idx, _unit, _desc)				\
	{ .attr = __ATTR(_name, 0444, tacc_cnt_show, NULL), .slot = _idx,	\
	  .global = false, .unit = _unit, .desc = _desc },
#define TACC_GCNT_DEF(_name, _idx, _unit, _desc)				\
	{ .attr = __ATTR(_name, 0400, tacc_cnt_show, NULL), .slot = _idx,	\
	  .global = true, .unit = _unit, .desc = _desc },

/* generated from the X-lists of tacc_hw.h: one file per counter */
static struct tacc_cnt_attr tacc_fcnt_list[] = {
	TACC_FUNC_COUNTERS(TACC_FCNT_DEF)
};

static struct tacc_cnt_attr tacc_gcnt_list[] = {
	TACC_GLOBAL_COUNTERS(TACC_GCNT_DEF)
};

/* The catalogue's text, one line per counter: it outgrew a page (the L1.x slots) */
#define TACC_CATALOGUE_MAX	(32 * 1024)

static size_t tacc_catalogue_text(struct tacc_device *tdev, char *buf, size_t size)
{
	size_t len;
	u32 i;

	len = scnprintf(buf, size, "# version %u: name slot unit scope description\n",
			TACC_CNT_VERSION);
	for (i = 0; i < ARRAY_SIZE(tacc_fcnt_list); i++) {
		const struct tacc_cnt_attr *ca = &tacc_fcnt_list[i];

		len += scnprintf(buf + len, size - len, "%s %u %s function %s\n",
				 ca->attr.attr.name, ca->slot, ca->unit, ca->desc);
	}
	for (i = 0; !tdev->is_vf && i < ARRAY_SIZE(tacc_gcnt_list); i++) {
		const struct tacc_cnt_attr *ca = &tacc_gcnt_list[i];

		len += scnprintf(buf + len, size - len, "%s %u %s global %s\n",
				 ca->attr.attr.name, ca->slot, ca->unit, ca->desc);
	}
	WARN_ON_ONCE(len >= size - 1);	/* TACC_CATALOGUE_MAX too small: truncated */
	return len;
}

/*
 * counters/catalogue: a binary attribute read in pieces, as a text file longer
 * than the page a show() may fill (sysfs_emit_at truncated it at 4096 bytes, in
 * the middle of a line, once the global counters reached slot 21).
 */
static ssize_t catalogue_read(struct file *filp, struct kobject *kobj,
			      struct bin_attribute *attr, char *buf, loff_t off, size_t count)
{
	struct tacc_device *tdev = tacc_sysfs_dev(kobj_to_dev(kobj));
	ssize_t ret;
	size_t len;
	char *text;

	text = kvmalloc(TACC_CATALOGUE_MAX, GFP_KERNEL);
	if (!text)
		return -ENOMEM;
	len = tacc_catalogue_text(tdev, text, TACC_CATALOGUE_MAX);
	ret = memory_read_from_buffer(buf, count, &off, text, len);
	kvfree(text);
	return ret;
}
static BIN_ATTR_RO(catalogue, 0);

static struct bin_attribute *tacc_counter_bin_attrs[] = {
	&bin_attr_catalogue,
	NULL
};

/* The PF's files of every tenant's work: root only; a VF's stay world-readable. */
static umode_t tacc_pf_root_only(struct kobject *kobj, umode_t mode)
{
	struct tacc_device *tdev = tacc_sysfs_dev(kobj_to_dev(kobj));

	return tdev && !tdev->is_vf ? 0400 : mode;
}

static umode_t tacc_counter_visible(struct kobject *kobj, struct attribute *attr, int n)
{
	return tacc_pf_root_only(kobj, attr->mode);
}

static struct attribute *tacc_counter_attrs[ARRAY_SIZE(tacc_fcnt_list) + 1];
static struct attribute *tacc_global_counter_attrs[ARRAY_SIZE(tacc_gcnt_list) + 1];

/* Module init: fill the attribute arrays from the counter tables. */
void tacc_sysfs_init(void)
{
	u32 i;

	for (i = 0; i < ARRAY_SIZE(tacc_fcnt_list); i++)
		tacc_counter_attrs[i] = &tacc_fcnt_list[i].attr.attr;
	for (i = 0; i < ARRAY_SIZE(tacc_gcnt_list); i++)
		tacc_global_counter_attrs[i] = &tacc_gcnt_list[i].attr.attr;
}

static umode_t tacc_global_visible(struct kobject *kobj, struct attribute *attr, int n)
{
	struct tacc_device *tdev = tacc_sysfs_dev(kobj_to_dev(kobj));

	return tdev && !tdev->is_vf ? attr->mode : 0;
}

static const struct attribute_group tacc_counter_group = {
	.name = "counters",
	.attrs = tacc_counter_attrs,
	.bin_attrs = tacc_counter_bin_attrs,
	.is_visible = tacc_counter_visible,	/* the catalogue is not telemetry: 0444 */
};

static const struct attribute_group tacc_global_counter_group = {
	.name = "global_counters",
	.attrs = tacc_global_counter_attrs,
	.is_visible = tacc_global_visible,
};

/* ---------------------------------------------------------- device info ---- */

static const char *tacc_gen_speed(u32 gen)
{
	static const char *const speeds[] = {
		"Unknown", "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe",
		"16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe",
	};

	return gen < ARRAY_SIZE(speeds) ? speeds[gen] : speeds[0];
}

#define TACC_INFO_ATTR(_name, _fmt, ...)					\
static ssize_t _name##_show(struct device *dev, struct device_attribute *attr,	\
			    char *buf)						\
{										\
	struct tacc_device *tdev = tacc_sysfs_dev(dev);				\
										\
	return sysfs_emit(buf, _fmt "\n", __VA_ARGS__);			\
}										\
static DEVICE_ATTR_RO(_name)

TACC_INFO_ATTR(function, "%u", tdev->func);
TACC_INFO_ATTR(is_vf, "%u", tdev->is_vf);
TACC_INFO_ATTR(hw_version, "%u.%u", tdev->hw_version >> 16, tdev->hw_version & 0xffff);
TACC_INFO_ATTR(caps, "0x%x", tdev->caps);
/*
 * The link as trained now: the PF's Link Status (a degraded link retrains at a
 * lower speed or width at run time, docs/hardware.md "Link faults"); config
 * space answers in D3hot too.  LINK_STATUS as read at probe if it cannot be read.
 */
static u32 tacc_link_now(struct tacc_device *tdev)
{
	u16 sta;

	if (pcie_capability_read_word(pci_physfn(tdev->pdev), PCI_EXP_LNKSTA, &sta) ||
	    !(sta & PCI_EXP_LNKSTA_NLW))
		return tdev->link_status;
	return FIELD_GET(PCI_EXP_LNKSTA_CLS, sta) |
	       FIELD_GET(PCI_EXP_LNKSTA_NLW, sta) << TACC_LINK_WIDTH_SHIFT;
}

TACC_INFO_ATTR(link_speed, "%s", tacc_gen_speed(tacc_link_now(tdev) & TACC_LINK_GEN_MASK));
TACC_INFO_ATTR(link_width, "%u", (tacc_link_now(tdev) & TACC_LINK_WIDTH_MASK) >>
	       TACC_LINK_WIDTH_SHIFT);
TACC_INFO_ATTR(max_link_speed, "%s", tacc_gen_speed(tdev->link_cap & TACC_LINK_GEN_MASK));
TACC_INFO_ATTR(max_link_width, "%u", (tdev->link_cap & TACC_LINK_WIDTH_MASK) >>
	       TACC_LINK_WIDTH_SHIFT);
TACC_INFO_ATTR(max_payload_bytes, "%u", tdev->link_params & 0xffff);
TACC_INFO_ATTR(max_read_request_bytes, "%u", tdev->link_params >> 16);
TACC_INFO_ATTR(devmem_bytes, "%llu", tdev->devmem_size);
TACC_INFO_ATTR(devmem_used_bytes, "%llu", tdev->devmem_used);
TACC_INFO_ATTR(engines, "%u", tdev->num_engines);
TACC_INFO_ATTR(queues, "%u", tdev->num_queues);
TACC_INFO_ATTR(queue_mask, "0x%x", tdev->queue_mask);
TACC_INFO_ATTR(contexts, "%u", tdev->num_contexts);
TACC_INFO_ATTR(clock_hz, "%u", tdev->clock_hz);
TACC_INFO_ATTR(tlb_entries, "%u", tdev->tlb_entries);
/* The roofline's peaks (TACC_CAP_ROOFLINE, read at probe; 0 without) */
TACC_INFO_ATTR(peak_fp32_gflops, "%u", tdev->peak_fp32_gflops);
TACC_INFO_ATTR(peak_bf16_gflops, "%u", tdev->peak_bf16_gflops);
TACC_INFO_ATTR(devmem_gbps, "%u", tdev->devmem_gbps);

/* The model's time scale can change at run time: read it live when powered. */
static ssize_t time_scale_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);

	if (pm_runtime_get_if_active(dev) > 0) {
		tdev->time_scale = tacc_rd(tdev, TACC_REG_TIME_SCALE);
		pm_runtime_put_autosuspend(dev);
	}
	return sysfs_emit(buf, "%u\n", tdev->time_scale);
}
static DEVICE_ATTR_RO(time_scale);
TACC_INFO_ATTR(num_vfs, "%d", tdev->num_vfs);
TACC_INFO_ATTR(pm_suspends, "%llu", (u64)atomic64_read(&tdev->pm_suspends));
TACC_INFO_ATTR(pm_resumes, "%llu", (u64)atomic64_read(&tdev->pm_resumes));
TACC_INFO_ATTR(mmu_faults, "%llu", (u64)atomic64_read(&tdev->mmu_faults));
TACC_INFO_ATTR(dma_errors, "%llu", (u64)atomic64_read(&tdev->dma_errors));
TACC_INFO_ATTR(fatal_errors, "%llu", (u64)atomic64_read(&tdev->fatal_errors));
TACC_INFO_ATTR(function_resets, "%llu", (u64)atomic64_read(&tdev->dev_resets));

static ssize_t engine_names_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);
	ssize_t len = 0;
	u32 i;

	for (i = 0; i < tdev->num_engines; i++) {
		if (i == TACC_ENGINE_DMA_H2D)
			len += sysfs_emit_at(buf, len, "%u dma_h2d\n", i);
		else if (i == TACC_ENGINE_DMA_D2H)
			len += sysfs_emit_at(buf, len, "%u dma_d2h\n", i);
		else
			len += sysfs_emit_at(buf, len, "%u compute%u\n", i,
					     i - TACC_ENGINE_COMPUTE0);
	}
	return len;
}
static DEVICE_ATTR_RO(engine_names);

static ssize_t live_objects_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_live *l = &tacc_sysfs_dev(dev)->live;

	return sysfs_emit(buf,
			  "contexts %d\nbos %d\nmappings %d\njobs %d\nfences %d\npt_pages %d\nuserptr_pages %ld\ndevmem_bytes %ld\n",
			  atomic_read(&l->ctxs), atomic_read(&l->bos), atomic_read(&l->mappings),
			  atomic_read(&l->jobs), tacc_fence_ctx_live(tacc_sysfs_dev(dev)->fctx),
			  atomic_read(&l->pt_pages), atomic_long_read(&l->userptr_pages),
			  atomic_long_read(&l->devmem_bytes));
}
static DEVICE_ATTR_RO(live_objects);

/* Per-user counts (tacc_quota.c): root only on every function, they name uids. */
static ssize_t users_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return tacc_quota_emit(&tacc_sysfs_dev(dev)->quota, buf);
}
static DEVICE_ATTR_ADMIN_RO(users);

/*
 * Bracketed samples: CLOCK_MONOTONIC before, device clock, CLOCK_MONOTONIC
 * after, in ns / ticks; the bracket width bounds the pairing error.  The
 * fourth column is the device's host-clock register read in the same
 * bracket: captures of several VMs are aligned through it.  The fifth
 * (TACC_CAP_VM_PAUSED) is the host time the VM has stood still: paused, or
 * stopped to migrate, while device and guest clocks stood with it.
 * Reading this file wakes the device, except the PF for a reader without
 * CAP_PERFMON: -EACCES while it is suspended (waking it is a device-wide
 * effect, and its wake-ups are counted in pm_resumes).
 */
#define TACC_CLOCK_SYNC_SAMPLES	4
static ssize_t clock_sync_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);
	bool paused = tdev->caps & TACC_CAP_VM_PAUSED;
	u64 before, devclk, hostclk, after, vm_paused = 0;
	unsigned long flags;
	ssize_t len = 0;
	int i, ret;

	ret = !tdev->is_vf && !perfmon_capable() ? pm_runtime_get_if_active(dev) : -EINVAL;
	if (!ret)
		return -EACCES;
	if (ret < 0) {	/* may wake it, or runtime PM disabled: powered */
		ret = pm_runtime_resume_and_get(dev);
		if (ret)
			return ret;
	}
	for (i = 0; i < TACC_CLOCK_SYNC_SAMPLES; i++) {
		local_irq_save(flags);
		before = ktime_get_ns();
		devclk = tacc_rd64(tdev, TACC_REG_DEVCLK);
		hostclk = tacc_rd64(tdev, TACC_REG_HOSTCLK);
		if (paused)
			vm_paused = tacc_rd64(tdev, TACC_REG_VM_PAUSED_NS);
		after = ktime_get_ns();
		local_irq_restore(flags);
		len += sysfs_emit_at(buf, len, "%llu %llu %llu %llu", before, devclk, after,
				     hostclk);
		len += paused ? sysfs_emit_at(buf, len, " %llu\n", vm_paused) :
				sysfs_emit_at(buf, len, "\n");
	}
	pm_runtime_mark_last_busy(dev);
	pm_runtime_put_autosuspend(dev);
	return len;
}
static DEVICE_ATTR_RO(clock_sync);

static ssize_t queue_stats_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);
	ssize_t len = 0;
	u32 i;

	len += sysfs_emit_at(buf, len, "# queue jobs_done jobs_failed resets bad_cqes irqs\n");
	for (i = 0; i < tdev->num_queues; i++) {
		struct tacc_queue *q = &tdev->queues[i];

		len += sysfs_emit_at(buf, len, "%u %llu %llu %llu %llu %llu\n", i, q->jobs_done,
				     q->jobs_failed, q->resets, q->bad_cqes, q->irqs);
	}
	return len;
}
static DEVICE_ATTR_RO(queue_stats);

/*
 * Handing the function to another driver (tacc vfio bind): "1" refuses new opens
 * of the accel node with -EBUSY, and is itself refused with -EBUSY while a file
 * of the node is open; checked and set under ctx_lock, so no open slips between
 * the check and the unbind that follows.  "1" then waits (up to 30 s,
 * interruptibly) until every DEVICE BO of the function is freed and scrubbed:
 * -EBUSY if not by then, -EIO if a range could not be scrubbed (handoff
 * stays off).  "0" ends it.  Gone with the binding.
 */
static ssize_t handoff_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);

	return sysfs_emit(buf, "%u\n", READ_ONCE(tdev->handoff));
}

static ssize_t handoff_store(struct device *dev, struct device_attribute *attr,
			     const char *buf, size_t count)
{
	struct tacc_device *tdev = tacc_sysfs_dev(dev);
	bool on;
	int ret;

	ret = kstrtobool(buf, &on);
	if (ret)
		return ret;
	mutex_lock(&tdev->ctx_lock);
	if (on && tacc_ctx_open_files(tdev, 0))
		ret = -EBUSY;
	else
		WRITE_ONCE(tdev->handoff, on);
	mutex_unlock(&tdev->ctx_lock);
	if (ret || !on)
		return ret ?: count;
	/* the last user's freed memory is overwritten before anyone else gets it */
	ret = tacc_scrub_drain(tdev, true, 30 * HZ, true);
	if (ret) {
		drm_warn(&tdev->drm, "handoff refused: device memory not scrubbed (%d)\n", ret);
		mutex_lock(&tdev->ctx_lock);
		WRITE_ONCE(tdev->handoff, false);
		mutex_unlock(&tdev->ctx_lock);
		return ret == -ETIMEDOUT ? -EBUSY : ret;
	}
	return count;
}
static DEVICE_ATTR_RW(handoff);

static struct attribute *tacc_info_attrs[] = {
	&dev_attr_function.attr,
	&dev_attr_is_vf.attr,
	&dev_attr_hw_version.attr,
	&dev_attr_caps.attr,
	&dev_attr_link_speed.attr,
	&dev_attr_link_width.attr,
	&dev_attr_max_link_speed.attr,
	&dev_attr_max_link_width.attr,
	&dev_attr_max_payload_bytes.attr,
	&dev_attr_max_read_request_bytes.attr,
	&dev_attr_devmem_bytes.attr,
	&dev_attr_devmem_used_bytes.attr,
	&dev_attr_engines.attr,
	&dev_attr_engine_names.attr,
	&dev_attr_queues.attr,
	&dev_attr_queue_mask.attr,
	&dev_attr_contexts.attr,
	&dev_attr_clock_hz.attr,
	&dev_attr_time_scale.attr,
	&dev_attr_tlb_entries.attr,
	&dev_attr_peak_fp32_gflops.attr,
	&dev_attr_peak_bf16_gflops.attr,
	&dev_attr_devmem_gbps.attr,
	&dev_attr_num_vfs.attr,
	&dev_attr_pm_suspends.attr,
	&dev_attr_pm_resumes.attr,
	&dev_attr_mmu_faults.attr,
	&dev_attr_dma_errors.attr,
	&dev_attr_fatal_errors.attr,
	&dev_attr_function_resets.attr,
	&dev_attr_live_objects.attr,
	&dev_attr_users.attr,
	&dev_attr_clock_sync.attr,
	&dev_attr_queue_stats.attr,
	&dev_attr_handoff.attr,
	NULL
};

static umode_t tacc_info_visible(struct kobject *kobj, struct attribute *attr, int n)
{
	if (attr == &dev_attr_live_objects.attr || attr == &dev_attr_queue_stats.attr)
		return tacc_pf_root_only(kobj, attr->mode);
	return attr->mode;
}

static const struct attribute_group tacc_info_group = {
	.name = "tacc",
	.attrs = tacc_info_attrs,
	.is_visible = tacc_info_visible,
};

const struct attribute_group *tacc_dev_groups[] = {
	&tacc_info_group,
	&tacc_counter_group,
	&tacc_global_counter_group,
	&tacc_sriov_policy_group,
	NULL
};
