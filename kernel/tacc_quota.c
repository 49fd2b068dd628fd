// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc per-user limits: each function (PF, VF, virtio-tacc node) counts what
 * the open files of each uid hold - contexts, BOs, bytes of device memory and,
 * on a virtio node, the backend's page-list entries - in an xarray keyed by
 * the uid of the file's opener, and refuses with -EDQUOT what would take a
 * user beyond its limit.  The limits are module parameters, read at each
 * check (0 = no limit); a file opened with CAP_SYS_ADMIN is counted but not
 * limited (docs/sysfs-abi.md "Per-user limits").
 *
 * A struct tacc_user lives while a file or a BO of its uid does: each holds a
 * reference, taken and dropped under the function's quota lock.
 */
#include <linux/cred.h>
#include <linux/math64.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "tacc_quota.h"

unsigned int tacc_max_ctx_per_process = 4;
module_param_named(max_ctx_per_process, tacc_max_ctx_per_process, uint, 0644);
MODULE_PARM_DESC(max_ctx_per_process,
		 "Open contexts of a function per process (0: no limit; CAP_SYS_ADMIN exempt)");

unsigned int tacc_max_ctx_per_user = 8;
module_param_named(max_ctx_per_user, tacc_max_ctx_per_user, uint, 0644);
MODULE_PARM_DESC(max_ctx_per_user,
		 "Open contexts of a function per user (uid), all its processes (0: no limit; CAP_SYS_ADMIN exempt)");

unsigned int tacc_max_bos_per_user = 1024;
module_param_named(max_bos_per_user, tacc_max_bos_per_user, uint, 0644);
MODULE_PARM_DESC(max_bos_per_user,
		 "BOs of a function per user (uid) (0: no limit; CAP_SYS_ADMIN exempt)");

unsigned int tacc_user_devmem_pct = 50;
module_param_named(user_devmem_pct, tacc_user_devmem_pct, uint, 0644);
MODULE_PARM_DESC(user_devmem_pct,
		 "Device memory of a function one user (uid) may hold, percent of the function's (0 or >= 100: no limit; CAP_SYS_ADMIN exempt)");

void tacc_quota_init(struct tacc_quota *q)
{
	mutex_init(&q->lock);
	xa_init(&q->users);
}

/* Every file and BO is gone: nothing is left to free. */
void tacc_quota_fini(struct tacc_quota *q)
{
	WARN_ON(!xa_empty(&q->users));
	xa_destroy(&q->users);
	mutex_destroy(&q->lock);
}

static struct tacc_user *tacc_user_lookup(struct tacc_quota *q, kuid_t uid)
{
	struct tacc_user *u;
	int ret;

	lockdep_assert_held(&q->lock);
	u = xa_load(&q->users, __kuid_val(uid));
	if (u)
		return u;
	u = kzalloc(sizeof(*u), GFP_KERNEL);
	if (!u)
		return ERR_PTR(-ENOMEM);
	u->q = q;
	u->uid = uid;
	ret = xa_err(xa_store(&q->users, __kuid_val(uid), u, GFP_KERNEL));
	if (ret) {
		kfree(u);
		return ERR_PTR(ret);
	}
	return u;
}

static void tacc_user_put_locked(struct tacc_user *u)
{
	struct tacc_quota *q = u->q;

	lockdep_assert_held(&q->lock);
	if (--u->refs)
		return;
	WARN_ON(memchr_inv(u->used, 0, sizeof(u->used)));
	xa_erase(&q->users, __kuid_val(u->uid));
	kfree(u);
}

static int tacc_user_charge_locked(struct tacc_user *u, enum tacc_quota_res res, u64 n,
				   u64 limit)
{
	lockdep_assert_held(&u->q->lock);
	if (limit && (n > limit || u->used[res] > limit - n))
		return -EDQUOT;
	u->used[res] += n;
	return 0;
}

/**
 * tacc_user_open() - charge a new file (context) to the caller's uid.
 * @q: the function's accounting.
 * @exempt: the opener is not limited (CAP_SYS_ADMIN); still counted.
 *
 * Return: the user, with a reference for the file (tacc_user_close()), or
 * ERR_PTR(-EDQUOT) when the uid holds max_ctx_per_user files of the function
 * already, or ERR_PTR(-ENOMEM).
 */
struct tacc_user *tacc_user_open(struct tacc_quota *q, bool exempt)
{
	unsigned int limit = exempt ? 0 : READ_ONCE(tacc_max_ctx_per_user);
	struct tacc_user *u;
	int ret;

	mutex_lock(&q->lock);
	u = tacc_user_lookup(q, current_euid());
	if (IS_ERR(u))
		goto out;
	u->refs++;
	ret = tacc_user_charge_locked(u, TACC_Q_CTXS, 1, limit);
	if (ret) {
		tacc_user_put_locked(u);
		u = ERR_PTR(ret);
	}
out:
	mutex_unlock(&q->lock);
	return u;
}

/* The file is closed: its context no longer counts, its reference goes. */
void tacc_user_close(struct tacc_user *u)
{
	struct tacc_quota *q = u->q;

	mutex_lock(&q->lock);
	u->used[TACC_Q_CTXS]--;
	tacc_user_put_locked(u);
	mutex_unlock(&q->lock);
}

struct tacc_user *tacc_user_get(struct tacc_user *u)
{
	mutex_lock(&u->q->lock);
	u->refs++;
	mutex_unlock(&u->q->lock);
	return u;
}

void tacc_user_put(struct tacc_user *u)
{
	struct tacc_quota *q = u->q;

	mutex_lock(&q->lock);
	tacc_user_put_locked(u);
	mutex_unlock(&q->lock);
}

/**
 * tacc_user_charge() - count @n more of @res for the user, within @limit.
 * @u: the user (a file's).
 * @res: what is counted.
 * @n: how much more.
 * @limit: the most the user may hold; 0: no limit.
 *
 * Return: 0, or -EDQUOT (nothing charged).
 */
int tacc_user_charge(struct tacc_user *u, enum tacc_quota_res res, u64 n, u64 limit)
{
	int ret;

	mutex_lock(&u->q->lock);
	ret = tacc_user_charge_locked(u, res, n, limit);
	mutex_unlock(&u->q->lock);
	return ret;
}

void tacc_user_uncharge(struct tacc_user *u, enum tacc_quota_res res, u64 n)
{
	mutex_lock(&u->q->lock);
	if (!WARN_ON(u->used[res] < n))
		u->used[res] -= n;
	mutex_unlock(&u->q->lock);
}

/* The share (user_devmem_pct) one user may hold of a pool of @total; 0: no limit. */
u64 tacc_user_share(u64 total)
{
	unsigned int pct = READ_ONCE(tacc_user_devmem_pct);

	if (!pct || pct >= 100)
		return 0;
	return max_t(u64, div_u64(total, 100) * pct, 1);
}

/**
 * tacc_user_charge_bo() - charge a new BO to its file's user.
 * @u: the file's user.
 * @unlimited: the file was opened with CAP_SYS_ADMIN: counted, never refused.
 * @devmem: bytes of device memory it takes (a DEVICE BO), else 0.
 * @devmem_own: the device memory the function's BOs may take.
 *
 * Return: 0, or -EDQUOT past max_bos_per_user or past user_devmem_pct of
 * @devmem_own (nothing charged then).
 */
int tacc_user_charge_bo(struct tacc_user *u, bool unlimited, u64 devmem, u64 devmem_own)
{
	int ret;

	ret = tacc_user_charge(u, TACC_Q_BOS, 1,
			       unlimited ? 0 : READ_ONCE(tacc_max_bos_per_user));
	if (ret || !devmem)
		return ret;
	ret = tacc_user_charge(u, TACC_Q_DEVMEM, devmem,
			       unlimited ? 0 : tacc_user_share(devmem_own));
	if (ret)
		tacc_user_uncharge(u, TACC_Q_BOS, 1);
	return ret;
}

void tacc_user_uncharge_bo(struct tacc_user *u, u64 devmem)
{
	tacc_user_uncharge(u, TACC_Q_BOS, 1);
	if (devmem)
		tacc_user_uncharge(u, TACC_Q_DEVMEM, devmem);
}

/**
 * tacc_quota_emit() - the users' counts as text, one line per uid.
 * @q: the function's accounting.
 * @buf: a page (sysfs show() buffer).
 *
 * Return: bytes written.
 */
ssize_t tacc_quota_emit(struct tacc_quota *q, char *buf)
{
	struct tacc_user *u;
	unsigned long uid;
	ssize_t len;

	len = sysfs_emit(buf, "# uid contexts bos devmem_bytes page_entries\n");
	mutex_lock(&q->lock);
	xa_for_each(&q->users, uid, u)
		len += sysfs_emit_at(buf, len, "%u %llu %llu %llu %llu\n",
				     from_kuid(&init_user_ns, u->uid), u->used[TACC_Q_CTXS],
				     u->used[TACC_Q_BOS], u->used[TACC_Q_DEVMEM],
				     u->used[TACC_Q_ENTS]);
	mutex_unlock(&q->lock);
	return len;
}
