/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc per-user limits (docs/sysfs-abi.md "Per-user limits"): what the open
 * files of one uid hold on one function (PF, VF or virtio-tacc node), kept by
 * the function and checked against the module parameters below.
 */
#ifndef __TACC_QUOTA_H__
#define __TACC_QUOTA_H__

#include <linux/mutex.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/xarray.h>

enum tacc_quota_res {
	TACC_Q_CTXS,		/* open files (contexts) */
	TACC_Q_BOS,		/* BOs */
	TACC_Q_DEVMEM,		/* bytes of DEVICE BOs */
	TACC_Q_ENTS,		/* virtio: page-list entries of HOST and USERPTR BOs */
	TACC_Q_NR
};

/* One function's accounting: uid -> struct tacc_user. */
struct tacc_quota {
	struct mutex lock;	/* users, every user's refs and used[] */
	struct xarray users;	/* __kuid_val() -> struct tacc_user */
};

/* What one uid holds on the function; freed with its last reference. */
struct tacc_user {
	struct tacc_quota *q;
	kuid_t uid;
	unsigned int refs;	/* its files and BOs (q->lock) */
	u64 used[TACC_Q_NR];	/* q->lock */
};

/* module parameters, 0 = no limit (tacc_quota.c; max_bo_mib: tacc_gem.c) */
extern unsigned int tacc_max_ctx_per_process;
extern unsigned int tacc_max_bo_mib;
extern unsigned int tacc_max_ctx_per_user;
extern unsigned int tacc_max_bos_per_user;
extern unsigned int tacc_user_devmem_pct;

void tacc_quota_init(struct tacc_quota *q);
void tacc_quota_fini(struct tacc_quota *q);
struct tacc_user *tacc_user_open(struct tacc_quota *q, bool exempt);
void tacc_user_close(struct tacc_user *u);
struct tacc_user *tacc_user_get(struct tacc_user *u);
void tacc_user_put(struct tacc_user *u);
int tacc_user_charge(struct tacc_user *u, enum tacc_quota_res res, u64 n, u64 limit);
void tacc_user_uncharge(struct tacc_user *u, enum tacc_quota_res res, u64 n);
u64 tacc_user_share(u64 total);
int tacc_user_charge_bo(struct tacc_user *u, bool unlimited, u64 devmem, u64 devmem_own);
void tacc_user_uncharge_bo(struct tacc_user *u, u64 devmem);
ssize_t tacc_quota_emit(struct tacc_quota *q, char *buf);

#endif /* __TACC_QUOTA_H__ */
