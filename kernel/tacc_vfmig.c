// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc VF migration, PF side: the admin operations of docs/hardware.md
 * section 16 (registers 0x900..0x97f of the PF, TACC_CAP_VF_MIGRATION),
 * exported to the VFIO variant driver tacc_vfio_pci.ko.  Each operation
 * completes inside the register write that starts it; one runs at a time
 * per PF (vfmig_lock).  Buffers are the PF's DMA: the state blob and the
 * dirty bitmap never pass through a VF's address space.
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/iopoll.h>
#include <linux/module.h>
#include <linux/pci.h>

#include "tacc_drv.h"
#include "tacc_vfmig.h"

#define TACC_VFMIG_STOP_TIMEOUT_MS	10000

/* A refusal of the device as an errno (the status is logged at debug level). */
static int tacc_vfmig_errno(u32 st)
{
	switch (st) {
	case TACC_VFMIG_ST_OK:
		return 0;
	case TACC_VFMIG_ST_BAD_OP:
	case TACC_VFMIG_ST_BAD_FN:
		return -ENODEV;
	case TACC_VFMIG_ST_BAD_STATE:
		return -EBUSY;
	case TACC_VFMIG_ST_DMA_ERROR:
		return -EIO;
	case TACC_VFMIG_ST_BAD_VERSION:
		return -EPROTONOSUPPORT;
	case TACC_VFMIG_ST_WRONG_FN:
		return -EACCES;
	default:	/* BAD_ARG, BAD_MAGIC, BAD_LENGTH, BAD_CRC, MISMATCH, BAD_DATA */
		return -EINVAL;
	}
}

/*
 * How long SAVE or LOAD may read BUSY (hw 1.6: the device copies the window a
 * slice at a time): generous beside the TCG model's ~0.2 s for a 32 MiB window.
 */
#define TACC_VFMIG_BUSY_S	60

/* One operation on VF @fn, vfmig_lock held: its status as an errno. */
static int tacc_vfmig_cmd(struct tacc_device *pf, u32 op, u32 fn)
{
	u32 st;

	lockdep_assert_held(&pf->vfmig_lock);
	if (!pf->hw_up)
		return -EAGAIN;
	tacc_wr(pf, TACC_REG_VFMIG_CMD, op | fn << TACC_VFMIG_CMD_FN_SHIFT);
	/* the read is ordered after the write; sleeps while SAVE/LOAD runs */
	if (read_poll_timeout(tacc_rd, st, st != TACC_VFMIG_ST_BUSY, 100,
			      TACC_VFMIG_BUSY_S * USEC_PER_SEC, false, pf,
			      TACC_REG_VFMIG_STATUS)) {
		dev_err(&pf->pdev->dev, "VF%u: migration operation %u still busy after %u s\n",
			fn, op, TACC_VFMIG_BUSY_S);
		return -ETIMEDOUT;
	}
	if (st)
		dev_dbg(&pf->pdev->dev, "VF%u: migration operation %u: status %u\n", fn, op, st);
	return tacc_vfmig_errno(st);
}

/* An operation without arguments or result: tacc_vfmig_cmd() under vfmig_lock. */
static int tacc_vfmig_cmd_locked(struct tacc_device *pf, u32 op, u32 fn)
{
	int ret;

	mutex_lock(&pf->vfmig_lock);
	ret = tacc_vfmig_cmd(pf, op, fn);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}

/**
 * tacc_vfmig_get_pf - the tacc PF of a VF, if it can migrate it.
 * @vf: a VF of a PF that tacc.ko drives.
 * @fn: out: the VF's function number on the device (1-based).
 *
 * The PF's tacc_device lives as long as its VFs: tacc.ko disables SR-IOV
 * (removing the VFs and their drivers) before it lets the PF go.
 *
 * Return: the PF, or an ERR_PTR: -ENODEV when @vf is not a VF of a tacc
 * PF, -EOPNOTSUPP when the device has no VF migration (hw < 1.4).
 */
struct tacc_device *tacc_vfmig_get_pf(struct pci_dev *vf, u32 *fn)
{
	struct tacc_device *pf;
	int id;

	pf = pci_iov_get_pf_drvdata(vf, &tacc_pci_driver);
	if (IS_ERR(pf))
		return pf;
	if (!(pf->caps & TACC_CAP_VF_MIGRATION))
		return ERR_PTR(-EOPNOTSUPP);
	id = pci_iov_vf_id(vf);
	if (id < 0 || id >= TACC_MAX_VFS)
		return ERR_PTR(-ENODEV);
	*fn = id + 1;
	return pf;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_get_pf, TACC);

/**
 * tacc_vfmig_buf_alloc - memory the PF's DMA reads and writes.
 * @pf: the PF.
 * @size: bytes (rounded up to a page).
 * @buf: out: the buffer.
 *
 * Pages from anywhere, mapped at one contiguous IOVA of the PF (the
 * operations take one address and one length) and into the kernel.
 *
 * Return: 0, -ENOMEM, or -EOPNOTSUPP when the PF's DMA cannot map them
 * contiguously (no IOMMU translation and no contiguous memory).
 */
int tacc_vfmig_buf_alloc(struct tacc_device *pf, size_t size, struct tacc_vfmig_buf *buf)
{
	struct device *dev = &pf->pdev->dev;
	int ret;

	size = PAGE_ALIGN(size);
	buf->sgt = dma_alloc_noncontiguous(dev, size, DMA_BIDIRECTIONAL, GFP_KERNEL, 0);
	if (!buf->sgt)
		return -ENOMEM;
	if (buf->sgt->nents != 1) {
		ret = -EOPNOTSUPP;
		goto err_free;
	}
	buf->vaddr = dma_vmap_noncontiguous(dev, size, buf->sgt);
	if (!buf->vaddr) {
		ret = -ENOMEM;
		goto err_free;
	}
	buf->dma = sg_dma_address(buf->sgt->sgl);
	buf->size = size;
	return 0;

err_free:
	dma_free_noncontiguous(dev, size, buf->sgt, DMA_BIDIRECTIONAL);
	buf->sgt = NULL;
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_buf_alloc, TACC);

/**
 * tacc_vfmig_buf_free - free a buffer of tacc_vfmig_buf_alloc().
 * @pf: the PF it was allocated for.
 * @buf: the buffer (no-op when empty).
 */
void tacc_vfmig_buf_free(struct tacc_device *pf, struct tacc_vfmig_buf *buf)
{
	struct device *dev = &pf->pdev->dev;

	if (!buf->sgt)
		return;
	dma_vunmap_noncontiguous(dev, buf->vaddr);
	dma_free_noncontiguous(dev, buf->size, buf->sgt, DMA_BIDIRECTIONAL);
	buf->sgt = NULL;
	buf->vaddr = NULL;
	buf->size = 0;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_buf_free, TACC);

/**
 * tacc_vfmig_query - the size of VF @fn's state blob (QUERY).
 * @pf: the PF.
 * @fn: the VF (1-based).
 * @size: out: bytes a SAVE writes.
 *
 * Return: 0 or a negative errno.
 */
int tacc_vfmig_query(struct tacc_device *pf, u32 fn, u64 *size)
{
	int ret;

	mutex_lock(&pf->vfmig_lock);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_QUERY, fn);
	if (!ret)
		*size = tacc_rd64(pf, TACC_REG_VFMIG_RESULT);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_query, TACC);

/**
 * tacc_vfmig_epoch - a count that moves whenever the PF loses VF migration state.
 * @pf: the PF.
 *
 * It changes when the PF's function stops (before a function reset, an FLR,
 * an AER recovery or a suspend) and again once it is reinitialised: the
 * device ends every VF's stop and log then (docs/hardware.md section 16),
 * and a SAVE or LOAD running ends with BAD_STATE.  A caller that saw
 * another value before knows that what it stopped or logged is gone.
 *
 * Return: the current value.
 */
u32 tacc_vfmig_epoch(struct tacc_device *pf)
{
	return atomic_read(&pf->vfmig_epoch);
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_epoch, TACC);

/**
 * tacc_vfmig_vf_state - VF_STATE of VF @fn (run state, LOGGING bit).
 * @pf: the PF.
 * @fn: the VF (1-based).
 *
 * Return: the register's value.
 */
u32 tacc_vfmig_vf_state(struct tacc_device *pf, u32 fn)
{
	return tacc_rd(pf, TACC_REG_VFMIG_VF_STATE(fn - 1));
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_vf_state, TACC);

/**
 * tacc_vfmig_stop - stop VF @fn and wait until nothing of it runs.
 * @pf: the PF.
 * @fn: the VF (1-based).
 *
 * STOP, then VF_STATE polled until STOPPED: commands already on engines
 * complete first.  If they do not within 10 s the VF is resumed again.
 *
 * Return: 0, -ETIMEDOUT, or the errno of a refused operation.
 */
int tacc_vfmig_stop(struct tacc_device *pf, u32 fn)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(TACC_VFMIG_STOP_TIMEOUT_MS);
	int ret;

	mutex_lock(&pf->vfmig_lock);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_STOP, fn);
	while (!ret && (tacc_vfmig_vf_state(pf, fn) & TACC_VFMIG_STATE_MASK) !=
	       TACC_VFMIG_STOPPED) {
		if (time_after(jiffies, deadline)) {
			dev_warn(&pf->pdev->dev, "VF%u: still stopping after %u ms: resumed\n",
				 fn, TACC_VFMIG_STOP_TIMEOUT_MS);
			tacc_vfmig_cmd(pf, TACC_VFMIG_OP_RESUME, fn);
			ret = -ETIMEDOUT;
			break;
		}
		usleep_range(50, 200);
	}
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_stop, TACC);

/**
 * tacc_vfmig_resume - let VF @fn run again (RESUME).
 * @pf: the PF.
 * @fn: the VF (1-based).
 *
 * Return: 0 or a negative errno.
 */
int tacc_vfmig_resume(struct tacc_device *pf, u32 fn)
{
	return tacc_vfmig_cmd_locked(pf, TACC_VFMIG_OP_RESUME, fn);
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_resume, TACC);

/**
 * tacc_vfmig_save - a stopped VF's state blob into @buf (SAVE).
 * @pf: the PF.
 * @fn: the VF (1-based).
 * @buf: the buffer, at least tacc_vfmig_query() bytes.
 * @len: out: the blob's bytes.
 *
 * Return: 0 or a negative errno (-EBUSY: the VF is not stopped).
 */
int tacc_vfmig_save(struct tacc_device *pf, u32 fn, struct tacc_vfmig_buf *buf, u64 *len)
{
	int ret;

	mutex_lock(&pf->vfmig_lock);
	tacc_wr64(pf, TACC_REG_VFMIG_ADDR, buf->dma);
	tacc_wr64(pf, TACC_REG_VFMIG_LEN, buf->size);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_SAVE, fn);
	if (!ret)
		*len = tacc_rd64(pf, TACC_REG_VFMIG_RESULT);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_save, TACC);

/**
 * tacc_vfmig_load - replace a stopped VF's state with the blob in @buf (LOAD).
 * @pf: the PF.
 * @fn: the VF (1-based).
 * @buf: the buffer holding the blob.
 * @len: the blob's bytes (at most @buf's size).
 *
 * The device checks the whole blob before it changes anything; a refused
 * blob leaves the VF, the PF and the other VFs as they were.
 *
 * Return: 0; -EINVAL (damaged, truncated, not a blob, another window
 * size), -EPROTONOSUPPORT (another version), -EACCES (another VF's), -EBUSY
 * (the VF is not stopped), or another negative errno.
 */
int tacc_vfmig_load(struct tacc_device *pf, u32 fn, struct tacc_vfmig_buf *buf, u64 len)
{
	int ret;

	if (len > buf->size)
		return -EINVAL;
	mutex_lock(&pf->vfmig_lock);
	tacc_wr64(pf, TACC_REG_VFMIG_ADDR, buf->dma);
	tacc_wr64(pf, TACC_REG_VFMIG_LEN, len);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_LOAD, fn);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_load, TACC);

/**
 * tacc_vfmig_log_start - log the pages of a VF's IOVA range its DMA writes.
 * @pf: the PF.
 * @fn: the VF (1-based).
 * @iova: start of the range (the VF's IOVA), aligned to the page.
 * @len: its bytes, a multiple of the page, at most 2^24 pages.
 * @pgshift: log2 of the page size, 12 .. 30.
 *
 * Return: 0 or a negative errno (-EBUSY: logging already).
 */
int tacc_vfmig_log_start(struct tacc_device *pf, u32 fn, u64 iova, u64 len, u32 pgshift)
{
	int ret;

	mutex_lock(&pf->vfmig_lock);
	tacc_wr64(pf, TACC_REG_VFMIG_LOG_IOVA, iova);
	tacc_wr64(pf, TACC_REG_VFMIG_LOG_LEN, len);
	tacc_wr(pf, TACC_REG_VFMIG_LOG_PGSHIFT, pgshift);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_LOG_START, fn);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_log_start, TACC);

/**
 * tacc_vfmig_log_stop - end a VF's dirty logging (LOG_STOP).
 * @pf: the PF.
 * @fn: the VF (1-based).
 *
 * Return: 0 or a negative errno (-EBUSY: not logging).
 */
int tacc_vfmig_log_stop(struct tacc_device *pf, u32 fn)
{
	return tacc_vfmig_cmd_locked(pf, TACC_VFMIG_OP_LOG_STOP, fn);
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_log_stop, TACC);

/**
 * tacc_vfmig_log_report - the dirty bitmap of a logged range, read and cleared.
 * @pf: the PF.
 * @fn: the VF (1-based).
 * @iova: start, inside the logged range, aligned to its page.
 * @len: bytes, a multiple of the page.
 * @bitmap: out: little-endian 64-bit words, bit i = page i of the range.
 * @bytes: out: the bitmap's bytes.
 *
 * Return: 0 or a negative errno (-EINVAL: outside the logged range, or
 * @bitmap too small).
 */
int tacc_vfmig_log_report(struct tacc_device *pf, u32 fn, u64 iova, u64 len,
			  struct tacc_vfmig_buf *bitmap, u64 *bytes)
{
	int ret;

	mutex_lock(&pf->vfmig_lock);
	tacc_wr64(pf, TACC_REG_VFMIG_LOG_IOVA, iova);
	tacc_wr64(pf, TACC_REG_VFMIG_LOG_LEN, len);
	tacc_wr64(pf, TACC_REG_VFMIG_ADDR, bitmap->dma);
	tacc_wr64(pf, TACC_REG_VFMIG_LEN, bitmap->size);
	ret = tacc_vfmig_cmd(pf, TACC_VFMIG_OP_LOG_REPORT, fn);
	if (!ret)
		*bytes = tacc_rd64(pf, TACC_REG_VFMIG_RESULT);
	mutex_unlock(&pf->vfmig_lock);
	return ret;
}
EXPORT_SYMBOL_NS_GPL(tacc_vfmig_log_report, TACC);
