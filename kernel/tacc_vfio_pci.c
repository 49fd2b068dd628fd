// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_vfio_pci: the VFIO variant driver of tacc VFs.  vfio-pci-core does
 * the device's regions, interrupts and resets; this adds the VFIO migration
 * uAPI v2 (STOP, STOP_COPY, RESUMING, RUNNING) and DMA dirty-page tracking,
 * done by the PF's admin operations through tacc.ko (docs/vfio.md
 * "Migration", docs/hardware.md section 16), as mlx5-vfio-pci does through
 * mlx5_core.  It binds only through driver_override.
 *
 * Locking as mlx5's: state_mutex serializes the state machine, the
 * migration files and logging; a reset_done that finds it held defers its
 * work to the holder's unlock (reset_lock, deferred_reset), because the
 * VFIO core holds its locks across a reset (memory_lock, taken in a BAR
 * mmap's fault under mmap_lock).  A file's lock is held across the copy to
 * or from user memory, which may fault (mmap_lock), so the reset's work
 * never takes it: it only marks the files disabled and queues drop_work,
 * which takes state_mutex then each file's lock (the order of every state
 * change) in process context, outside the reset, and frees their buffers
 * (tacc_vfio_drop_fds()); a state change or close before it does the same.
 *
 * A reset of the PF (function reset, FLR, AER recovery) ends the VF's stop
 * and log on the device without the VF's driver seeing a reset: tacc.ko's
 * epoch (tacc_vfmig_epoch()) moves then, and the next holder of
 * state_mutex, or a read or write of a file made before, sees it.
 */
#include <linux/anon_inodes.h>
#include <linux/file.h>
#include <linux/interval_tree.h>
#include <linux/iova_bitmap.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/seq_file.h>
#include <linux/vfio.h>
#include <linux/vfio_pci_core.h>

#include "include/tacc_hw.h"
#include "tacc_vfmig.h"

/**
 * struct tacc_vfio_migf - a migration data file (STOP_COPY or RESUMING).
 * @filp: the file.
 * @lock: serializes read/write with disabling.
 * @tvdev: the device.
 * @buf: the state blob, in the PF's DMA space.
 * @limit: the VF's blob size (QUERY): no more may be written.
 * @total: bytes of @buf holding data (STOP_COPY: the blob; RESUMING: written).
 * @epoch: the PF's tacc_vfmig_epoch() when the file was made.
 * @disabled: the device left the state: reads and writes fail with -ENODEV.
 *	Set without @lock (a reset); @buf is freed only under @lock.
 */
struct tacc_vfio_migf {
	struct file *filp;
	struct mutex lock;	/* read/write against freeing buf */
	struct tacc_vfio_dev *tvdev;
	struct tacc_vfmig_buf buf;
	u64 limit;
	u64 total;
	u32 epoch;
	bool disabled;
};

/**
 * struct tacc_vfio_dev - a tacc VF bound to tacc_vfio_pci.
 * @core_device: vfio-pci-core's device.
 * @pf: the PF's tacc_device (tacc.ko), or NULL without migration.
 * @fn: the VF's function number (1-based).
 * @state_mutex: the state machine, the files, logging.
 * @reset_lock: guards @deferred_reset.
 * @deferred_reset: a reset happened while @state_mutex was held.
 * @drop_work: frees the buffers of the files a reset disabled.
 * @mig_state: the VFIO migration state.
 * @stopped: the device has the VF stopped (STOP done, RESUME not yet).
 * @epoch: the PF's tacc_vfmig_epoch() the state above belongs to.
 * @saving: the STOP_COPY file, or NULL.
 * @resuming: the RESUMING file, or NULL.
 * @logging: dirty logging is on.
 * @log_iova: the logged range's start ...
 * @log_len: ... bytes ...
 * @log_pgshift: ... and page shift.
 * @log_bitmap: the PF's buffer for LOG_REPORT, sized for the whole range.
 */
struct tacc_vfio_dev {
	struct vfio_pci_core_device core_device;
	struct tacc_device *pf;
	u32 fn;
	struct mutex state_mutex;	/* mig_state, stopped, files, logging */
	spinlock_t reset_lock;		/* deferred_reset */
	bool deferred_reset;
	struct work_struct drop_work;
	enum vfio_device_mig_state mig_state;
	bool stopped;
	u32 epoch;
	struct tacc_vfio_migf *saving;
	struct tacc_vfio_migf *resuming;
	bool logging;
	u64 log_iova;
	u64 log_len;
	u32 log_pgshift;
	struct tacc_vfmig_buf log_bitmap;
};

static struct tacc_vfio_dev *tacc_vfio_drvdata(struct pci_dev *pdev)
{
	struct vfio_pci_core_device *core_device = dev_get_drvdata(&pdev->dev);

	return container_of(core_device, struct tacc_vfio_dev, core_device);
}

static struct tacc_vfio_dev *to_tvdev(struct vfio_device *vdev)
{
	return container_of(vdev, struct tacc_vfio_dev, core_device.vdev);
}

/*
 * Disabled, and its buffer freed once no read or write uses it.  Not in a
 * reset's context (the file's lock, see the top).  While a file is the
 * device's (saving, resuming), the device's owner frees its buffer, so
 * tvdev is alive then.
 */
static void tacc_vfio_disable_fd(struct tacc_vfio_migf *migf)
{
	mutex_lock(&migf->lock);
	WRITE_ONCE(migf->disabled, true);
	migf->total = 0;
	if (migf->buf.sgt)
		tacc_vfmig_buf_free(migf->tvdev->pf, &migf->buf);
	mutex_unlock(&migf->lock);
}

/* Both files disabled and dropped, state_mutex held, not in a reset. */
static void tacc_vfio_disable_fds(struct tacc_vfio_dev *tvdev)
{
	if (tvdev->saving) {
		tacc_vfio_disable_fd(tvdev->saving);
		fput(tvdev->saving->filp);
		tvdev->saving = NULL;
	}
	if (tvdev->resuming) {
		tacc_vfio_disable_fd(tvdev->resuming);
		fput(tvdev->resuming->filp);
		tvdev->resuming = NULL;
	}
}

/*
 * After a reset the VFIO state is RUNNING and the files fail their reads
 * and writes (-ENODEV); drop_work frees their buffers soon after (or the
 * next state change, whichever comes first).  An FLR keeps the VF stopped
 * on the device (its owner cannot end a stop), so it is resumed here.
 * Runs in reset_done's context: no file lock.
 */
static void tacc_vfio_reset_state(struct tacc_vfio_dev *tvdev)
{
	if (tvdev->saving)
		WRITE_ONCE(tvdev->saving->disabled, true);
	if (tvdev->resuming)
		WRITE_ONCE(tvdev->resuming->disabled, true);
	if (tvdev->saving || tvdev->resuming)
		schedule_work(&tvdev->drop_work);
	if (tvdev->stopped && !tacc_vfmig_resume(tvdev->pf, tvdev->fn))
		tvdev->stopped = false;
	tvdev->mig_state = VFIO_DEVICE_STATE_RUNNING;
}

/* The files a reset disabled, dropped; state_mutex held, not in a reset. */
static void tacc_vfio_drop_fds(struct tacc_vfio_dev *tvdev)
{
	if (tvdev->mig_state == VFIO_DEVICE_STATE_RUNNING)
		tacc_vfio_disable_fds(tvdev);
}

/* Logging off, state_mutex held. */
static void tacc_vfio_log_off(struct tacc_vfio_dev *tvdev)
{
	if (!tvdev->logging)
		return;
	tacc_vfmig_log_stop(tvdev->pf, tvdev->fn);
	tacc_vfmig_buf_free(tvdev->pf, &tvdev->log_bitmap);
	tvdev->logging = false;
}

/*
 * state_mutex, and what a reset of the PF since its last holder ended: the
 * VF runs and logs nothing on the device (a later LOG_STOP or RESUME would
 * be refused), so the VFIO state is RUNNING as after the VF's own reset.
 */
static void tacc_vfio_state_mutex_lock(struct tacc_vfio_dev *tvdev)
{
	u32 epoch;

	mutex_lock(&tvdev->state_mutex);
	epoch = tacc_vfmig_epoch(tvdev->pf);
	if (epoch == tvdev->epoch)
		return;
	tvdev->epoch = epoch;
	tvdev->stopped = false;
	tacc_vfio_reset_state(tvdev);
	if (tvdev->logging) {
		tacc_vfmig_buf_free(tvdev->pf, &tvdev->log_bitmap);
		tvdev->logging = false;
	}
}

/* Every state_mutex unlock: runs a reset that came meanwhile (mlx5's pattern). */
static void tacc_vfio_state_mutex_unlock(struct tacc_vfio_dev *tvdev)
{
again:
	spin_lock(&tvdev->reset_lock);
	if (tvdev->deferred_reset) {
		tvdev->deferred_reset = false;
		spin_unlock(&tvdev->reset_lock);
		tacc_vfio_reset_state(tvdev);
		goto again;
	}
	mutex_unlock(&tvdev->state_mutex);
	spin_unlock(&tvdev->reset_lock);
}

/*
 * The reset's buffers freed: in process context, holding no lock of the
 * VFIO core, with state_mutex then each file's lock, as a state change.
 */
static void tacc_vfio_drop_work(struct work_struct *work)
{
	struct tacc_vfio_dev *tvdev = container_of(work, struct tacc_vfio_dev, drop_work);

	tacc_vfio_state_mutex_lock(tvdev);
	tacc_vfio_drop_fds(tvdev);
	tacc_vfio_state_mutex_unlock(tvdev);
}

/* The file cannot be used: disabled, or made before a reset of the PF. */
static bool tacc_vfio_migf_gone(struct tacc_vfio_migf *migf)
{
	lockdep_assert_held(&migf->lock);
	return READ_ONCE(migf->disabled) || migf->epoch != tacc_vfmig_epoch(migf->tvdev->pf);
}

static int tacc_vfio_release_file(struct inode *inode, struct file *filp)
{
	struct tacc_vfio_migf *migf = filp->private_data;

	tacc_vfio_disable_fd(migf);
	mutex_destroy(&migf->lock);
	kfree(migf);
	return 0;
}

static ssize_t tacc_vfio_save_read(struct file *filp, char __user *buf, size_t len,
				   loff_t *pos)
{
	struct tacc_vfio_migf *migf = filp->private_data;
	ssize_t done;

	if (pos)
		return -ESPIPE;
	pos = &filp->f_pos;

	mutex_lock(&migf->lock);
	if (tacc_vfio_migf_gone(migf)) {
		done = -ENODEV;
		goto out_unlock;
	}
	if (*pos < 0 || *pos > migf->total) {
		done = -EINVAL;
		goto out_unlock;
	}
	len = min_t(u64, migf->total - *pos, len);
	if (len && copy_to_user(buf, migf->buf.vaddr + *pos, len)) {
		done = -EFAULT;
		goto out_unlock;
	}
	*pos += len;
	done = len;
out_unlock:
	mutex_unlock(&migf->lock);
	return done;
}

static ssize_t tacc_vfio_resume_write(struct file *filp, const char __user *buf,
				      size_t len, loff_t *pos)
{
	struct tacc_vfio_migf *migf = filp->private_data;
	loff_t end;
	ssize_t done;

	if (pos)
		return -ESPIPE;
	pos = &filp->f_pos;

	if (*pos < 0 || check_add_overflow((loff_t)len, *pos, &end))
		return -EINVAL;

	mutex_lock(&migf->lock);
	if (tacc_vfio_migf_gone(migf)) {
		done = -ENODEV;
		goto out_unlock;
	}
	if (end > migf->limit) {	/* longer than any blob of this VF */
		done = -EFBIG;
		goto out_unlock;
	}
	if (copy_from_user(migf->buf.vaddr + *pos, buf, len)) {
		done = -EFAULT;
		goto out_unlock;
	}
	*pos = end;
	migf->total = max_t(u64, migf->total, end);
	done = len;
out_unlock:
	mutex_unlock(&migf->lock);
	return done;
}

/* fdinfo: the PF buffer the file holds (0 once freed), and whether it is disabled. */
static void tacc_vfio_show_fdinfo(struct seq_file *m, struct file *filp)
{
	struct tacc_vfio_migf *migf = filp->private_data;

	mutex_lock(&migf->lock);
	seq_printf(m, "tacc-mig-buffer-bytes:\t%zu\n", migf->buf.sgt ? migf->buf.size : 0);
	seq_printf(m, "tacc-mig-disabled:\t%d\n", READ_ONCE(migf->disabled));
	mutex_unlock(&migf->lock);
}

static const struct file_operations tacc_vfio_save_fops = {
	.owner = THIS_MODULE,
	.read = tacc_vfio_save_read,
	.release = tacc_vfio_release_file,
	.show_fdinfo = tacc_vfio_show_fdinfo,
};

static const struct file_operations tacc_vfio_resume_fops = {
	.owner = THIS_MODULE,
	.write = tacc_vfio_resume_write,
	.release = tacc_vfio_release_file,
	.show_fdinfo = tacc_vfio_show_fdinfo,
};

/* A migration file with a PF buffer of the VF's blob size. */
static struct tacc_vfio_migf *tacc_vfio_migf_new(struct tacc_vfio_dev *tvdev, bool save)
{
	struct tacc_vfio_migf *migf;
	u64 size;
	int ret;

	ret = tacc_vfmig_query(tvdev->pf, tvdev->fn, &size);
	if (ret)
		return ERR_PTR(ret);
	migf = kzalloc(sizeof(*migf), GFP_KERNEL_ACCOUNT);
	if (!migf)
		return ERR_PTR(-ENOMEM);
	mutex_init(&migf->lock);
	migf->tvdev = tvdev;
	migf->limit = size;
	migf->epoch = tvdev->epoch;
	ret = tacc_vfmig_buf_alloc(tvdev->pf, size, &migf->buf);
	if (ret)
		goto err_free;
	migf->filp = anon_inode_getfile("tacc_vfio_mig", save ? &tacc_vfio_save_fops :
					&tacc_vfio_resume_fops, migf, save ? O_RDONLY : O_WRONLY);
	if (IS_ERR(migf->filp)) {
		ret = PTR_ERR(migf->filp);
		goto err_buf;
	}
	stream_open(migf->filp->f_inode, migf->filp);
	return migf;

err_buf:
	tacc_vfmig_buf_free(tvdev->pf, &migf->buf);
err_free:
	mutex_destroy(&migf->lock);
	kfree(migf);
	return ERR_PTR(ret);
}

/* STOP -> STOP_COPY: SAVE into a new file's buffer. */
static struct file *tacc_vfio_stop_copy(struct tacc_vfio_dev *tvdev)
{
	struct tacc_vfio_migf *migf;
	u64 len;
	int ret;

	migf = tacc_vfio_migf_new(tvdev, true);
	if (IS_ERR(migf))
		return ERR_CAST(migf);
	ret = tacc_vfmig_save(tvdev->pf, tvdev->fn, &migf->buf, &len);
	if (ret) {
		fput(migf->filp);
		return ERR_PTR(ret);
	}
	migf->total = len;
	get_file(migf->filp);
	tvdev->saving = migf;
	return migf->filp;
}

/* One arc of vfio_mig_get_next_state(), state_mutex held. */
static struct file *tacc_vfio_step(struct tacc_vfio_dev *tvdev, enum vfio_device_mig_state new)
{
	enum vfio_device_mig_state cur = tvdev->mig_state;
	struct tacc_vfio_migf *migf;
	int ret;

	if (cur == VFIO_DEVICE_STATE_RUNNING && new == VFIO_DEVICE_STATE_STOP) {
		ret = tacc_vfmig_stop(tvdev->pf, tvdev->fn);
		if (ret)
			return ERR_PTR(ret);
		tvdev->stopped = true;
		return NULL;
	}
	if (cur == VFIO_DEVICE_STATE_STOP && new == VFIO_DEVICE_STATE_RUNNING) {
		ret = tacc_vfmig_resume(tvdev->pf, tvdev->fn);
		if (ret)
			return ERR_PTR(ret);
		tvdev->stopped = false;
		return NULL;
	}
	if (cur == VFIO_DEVICE_STATE_STOP && new == VFIO_DEVICE_STATE_STOP_COPY)
		return tacc_vfio_stop_copy(tvdev);
	if (cur == VFIO_DEVICE_STATE_STOP_COPY && new == VFIO_DEVICE_STATE_STOP) {
		tacc_vfio_disable_fds(tvdev);
		return NULL;
	}
	if (cur == VFIO_DEVICE_STATE_STOP && new == VFIO_DEVICE_STATE_RESUMING) {
		migf = tacc_vfio_migf_new(tvdev, false);
		if (IS_ERR(migf))
			return ERR_CAST(migf);
		get_file(migf->filp);
		tvdev->resuming = migf;
		return migf->filp;
	}
	if (cur == VFIO_DEVICE_STATE_RESUMING && new == VFIO_DEVICE_STATE_STOP) {
		migf = tvdev->resuming;
		mutex_lock(&migf->lock);
		ret = tacc_vfmig_load(tvdev->pf, tvdev->fn, &migf->buf, migf->total);
		mutex_unlock(&migf->lock);
		if (ret)
			return ERR_PTR(ret);
		tacc_vfio_disable_fds(tvdev);
		return NULL;
	}
	/* vfio_mig_get_next_state() uses no other arc for STOP_COPY-only devices */
	WARN_ON(true);
	return ERR_PTR(-EINVAL);
}

static struct file *tacc_vfio_set_state(struct vfio_device *vdev,
					enum vfio_device_mig_state new_state)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	enum vfio_device_mig_state next;
	struct file *res = NULL;
	int ret;

	tacc_vfio_state_mutex_lock(tvdev);
	tacc_vfio_drop_fds(tvdev);
	while (new_state != tvdev->mig_state) {
		ret = vfio_mig_get_next_state(vdev, tvdev->mig_state, new_state, &next);
		if (ret) {
			res = ERR_PTR(ret);
			break;
		}
		res = tacc_vfio_step(tvdev, next);
		if (IS_ERR(res))
			break;
		tvdev->mig_state = next;
		if (WARN_ON(res && new_state != tvdev->mig_state)) {
			fput(res);
			res = ERR_PTR(-EINVAL);
			break;
		}
	}
	tacc_vfio_state_mutex_unlock(tvdev);
	return res;
}

static int tacc_vfio_get_state(struct vfio_device *vdev, enum vfio_device_mig_state *state)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);

	tacc_vfio_state_mutex_lock(tvdev);
	*state = tvdev->mig_state;
	tacc_vfio_state_mutex_unlock(tvdev);
	return 0;
}

static int tacc_vfio_get_data_size(struct vfio_device *vdev, unsigned long *stop_copy_length)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	u64 size;
	int ret;

	ret = tacc_vfmig_query(tvdev->pf, tvdev->fn, &size);
	if (!ret)
		*stop_copy_length = size;
	return ret;
}

static const struct vfio_migration_ops tacc_vfio_mig_ops = {
	.migration_set_state = tacc_vfio_set_state,
	.migration_get_state = tacc_vfio_get_state,
	.migration_get_data_size = tacc_vfio_get_data_size,
};

/*
 * DMA logging.  The device logs one range per VF: VFIO's ranges are folded
 * into one (vfio_combine_iova_ranges), the page size is the caller's within
 * 4 KiB .. 1 GiB, raised until the range has at most 2^24 pages.
 */
static int tacc_vfio_log_start(struct vfio_device *vdev, struct rb_root_cached *ranges,
			       u32 nnodes, u64 *page_size)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	struct interval_tree_node *node;
	u64 start, end;
	u32 shift;
	int ret;

	if (!*page_size || !is_power_of_2(*page_size))	/* the core does not check it */
		return -EINVAL;
	shift = clamp_t(u32, ilog2(*page_size), TACC_VFMIG_PGSHIFT_MIN, TACC_VFMIG_PGSHIFT_MAX);
	vfio_combine_iova_ranges(ranges, nnodes, 1);
	node = interval_tree_iter_first(ranges, 0, ULONG_MAX);
	if (!node)
		return -EINVAL;
	for (;;) {
		start = round_down((u64)node->start, 1ull << shift);
		end = round_up((u64)node->last + 1, 1ull << shift);
		if ((end - start) >> shift <= TACC_VFMIG_LOG_MAX_PAGES)
			break;
		if (++shift > TACC_VFMIG_PGSHIFT_MAX)
			return -E2BIG;
	}

	tacc_vfio_state_mutex_lock(tvdev);
	if (tvdev->logging) {
		ret = -EBUSY;
		goto out_unlock;
	}
	ret = tacc_vfmig_buf_alloc(tvdev->pf, DIV_ROUND_UP((end - start) >> shift, 64) * 8,
				   &tvdev->log_bitmap);
	if (ret)
		goto out_unlock;
	ret = tacc_vfmig_log_start(tvdev->pf, tvdev->fn, start, end - start, shift);
	if (ret) {
		tacc_vfmig_buf_free(tvdev->pf, &tvdev->log_bitmap);
		goto out_unlock;
	}
	tvdev->logging = true;
	tvdev->log_iova = start;
	tvdev->log_len = end - start;
	tvdev->log_pgshift = shift;
	*page_size = 1ull << shift;
out_unlock:
	tacc_vfio_state_mutex_unlock(tvdev);
	return ret;
}

static int tacc_vfio_log_stop(struct vfio_device *vdev)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);

	tacc_vfio_state_mutex_lock(tvdev);
	tacc_vfio_log_off(tvdev);
	tacc_vfio_state_mutex_unlock(tvdev);
	return 0;
}

static int tacc_vfio_log_read_and_clear(struct vfio_device *vdev, unsigned long iova,
					unsigned long length, struct iova_bitmap *dirty)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	u64 start, end, bytes, page, i;
	const __le64 *words;
	int ret = 0;

	tacc_vfio_state_mutex_lock(tvdev);
	if (!tvdev->logging) {
		ret = -EINVAL;
		goto out_unlock;
	}
	page = 1ull << tvdev->log_pgshift;
	start = max_t(u64, round_down(iova, page), tvdev->log_iova);
	end = min_t(u64, round_up((u64)iova + length, page), tvdev->log_iova + tvdev->log_len);
	if (start >= end)	/* nothing of it is logged: nothing is dirty */
		goto out_unlock;
	ret = tacc_vfmig_log_report(tvdev->pf, tvdev->fn, start, end - start,
				    &tvdev->log_bitmap, &bytes);
	if (ret)
		goto out_unlock;
	words = tvdev->log_bitmap.vaddr;
	for (i = 0; i < (end - start) >> tvdev->log_pgshift; i++) {
		if (le64_to_cpu(words[i / 64]) & BIT_ULL(i % 64))
			iova_bitmap_set(dirty, start + i * page, page);
	}
out_unlock:
	tacc_vfio_state_mutex_unlock(tvdev);
	return ret;
}

static const struct vfio_log_ops tacc_vfio_log_ops = {
	.log_start = tacc_vfio_log_start,
	.log_stop = tacc_vfio_log_stop,
	.log_read_and_clear = tacc_vfio_log_read_and_clear,
};

static int tacc_vfio_init_dev(struct vfio_device *vdev)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	struct pci_dev *pdev = to_pci_dev(vdev->dev);
	struct tacc_device *pf;
	int ret;

	ret = vfio_pci_core_init_dev(vdev);
	if (ret)
		return ret;
	pf = tacc_vfmig_get_pf(pdev, &tvdev->fn);
	if (IS_ERR(pf)) {	/* a plain vfio-pci device then */
		pci_info(pdev, "no migration: PF not on tacc.ko or hw < 1.4 (%pe)\n", pf);
		return 0;
	}
	tvdev->pf = pf;
	mutex_init(&tvdev->state_mutex);
	spin_lock_init(&tvdev->reset_lock);
	INIT_WORK(&tvdev->drop_work, tacc_vfio_drop_work);
	vdev->migration_flags = VFIO_MIGRATION_STOP_COPY;
	vdev->mig_ops = &tacc_vfio_mig_ops;
	vdev->log_ops = &tacc_vfio_log_ops;
	return 0;
}

static void tacc_vfio_release_dev(struct vfio_device *vdev)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);

	if (tvdev->pf) {
		cancel_work_sync(&tvdev->drop_work);
		mutex_destroy(&tvdev->state_mutex);
	}
	vfio_pci_core_release_dev(vdev);
}

static int tacc_vfio_open_device(struct vfio_device *vdev)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);
	int ret;

	ret = vfio_pci_core_enable(&tvdev->core_device);
	if (ret)
		return ret;
	if (tvdev->pf) {
		tvdev->mig_state = VFIO_DEVICE_STATE_RUNNING;
		tvdev->epoch = tacc_vfmig_epoch(tvdev->pf);
	}
	vfio_pci_core_finish_enable(&tvdev->core_device);
	return 0;
}

/* The last user left: no file, no stop, no log survives it. */
static void tacc_vfio_close_device(struct vfio_device *vdev)
{
	struct tacc_vfio_dev *tvdev = to_tvdev(vdev);

	if (tvdev->pf) {
		tacc_vfio_state_mutex_lock(tvdev);
		tacc_vfio_reset_state(tvdev);
		tacc_vfio_disable_fds(tvdev);
		tacc_vfio_log_off(tvdev);
		tacc_vfio_state_mutex_unlock(tvdev);
	}
	vfio_pci_core_close_device(vdev);
}

static const struct vfio_device_ops tacc_vfio_ops = {
	.name = "tacc-vfio-pci",
	.init = tacc_vfio_init_dev,
	.release = tacc_vfio_release_dev,
	.open_device = tacc_vfio_open_device,
	.close_device = tacc_vfio_close_device,
	.ioctl = vfio_pci_core_ioctl,
	.device_feature = vfio_pci_core_ioctl_feature,
	.read = vfio_pci_core_read,
	.write = vfio_pci_core_write,
	.mmap = vfio_pci_core_mmap,
	.request = vfio_pci_core_request,
	.match = vfio_pci_core_match,
	.bind_iommufd = vfio_iommufd_physical_bind,
	.unbind_iommufd = vfio_iommufd_physical_unbind,
	.attach_ioas = vfio_iommufd_physical_attach_ioas,
	.detach_ioas = vfio_iommufd_physical_detach_ioas,
};

static int tacc_vfio_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct tacc_vfio_dev *tvdev;
	int ret;

	tvdev = vfio_alloc_device(tacc_vfio_dev, core_device.vdev, &pdev->dev, &tacc_vfio_ops);
	if (IS_ERR(tvdev))
		return PTR_ERR(tvdev);
	dev_set_drvdata(&pdev->dev, &tvdev->core_device);
	ret = vfio_pci_core_register_device(&tvdev->core_device);
	if (ret)
		goto err_put;
	return 0;

err_put:
	vfio_put_device(&tvdev->core_device.vdev);
	return ret;
}

static void tacc_vfio_remove(struct pci_dev *pdev)
{
	struct tacc_vfio_dev *tvdev = tacc_vfio_drvdata(pdev);

	vfio_pci_core_unregister_device(&tvdev->core_device);
	vfio_put_device(&tvdev->core_device.vdev);
}

/*
 * A reset (FLR through VFIO_DEVICE_RESET, AER): the state is RUNNING again.
 * The VFIO core holds its locks across the reset and takes them with
 * mmap_lock, so a held state_mutex defers the work to its holder's unlock,
 * and the work takes no file lock (tacc_vfio_reset_state()).
 */
static void tacc_vfio_reset_done(struct pci_dev *pdev)
{
	struct tacc_vfio_dev *tvdev = tacc_vfio_drvdata(pdev);

	if (!tvdev->pf)
		return;
	spin_lock(&tvdev->reset_lock);
	tvdev->deferred_reset = true;
	if (!mutex_trylock(&tvdev->state_mutex)) {
		spin_unlock(&tvdev->reset_lock);
		return;
	}
	spin_unlock(&tvdev->reset_lock);
	tacc_vfio_state_mutex_unlock(tvdev);
}

static const struct pci_device_id tacc_vfio_pci_table[] = {
	{ PCI_DRIVER_OVERRIDE_DEVICE_VFIO(TACC_PCI_VENDOR_ID, TACC_PCI_DEVICE_ID_VF) },
	{ }
};
MODULE_DEVICE_TABLE(pci, tacc_vfio_pci_table);

static const struct pci_error_handlers tacc_vfio_err_handlers = {
	.reset_done = tacc_vfio_reset_done,
	.error_detected = vfio_pci_core_aer_err_detected,
};

static struct pci_driver tacc_vfio_pci_driver = {
	.name = KBUILD_MODNAME,
	.id_table = tacc_vfio_pci_table,
	.probe = tacc_vfio_probe,
	.remove = tacc_vfio_remove,
	.err_handler = &tacc_vfio_err_handlers,
	.driver_managed_dma = true,
};
module_pci_driver(tacc_vfio_pci_driver);

MODULE_IMPORT_NS(TACC);
#if IS_ENABLED(CONFIG_IOMMUFD_DRIVER)
/* iova_bitmap_set() of the dirty-page report (a stub without iommufd) */
MODULE_IMPORT_NS(IOMMUFD);
#endif
MODULE_LICENSE("GPL");
MODULE_AUTHOR("tacc project");
MODULE_DESCRIPTION("tacc VFIO PCI: tacc VFs for user space and VMs, with live migration");
