// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc generic netlink family "tacc": asynchronous device events (MMU
 * fault, hang, reset, fatal error, PM transition, VF enable/disable) on
 * the multicast group "events".  Attributes: enum tacc_genl_attr.
 */
#include <linux/ktime.h>
#include <net/genetlink.h>

#include <drm/drm_accel.h>
#include <drm/drm_file.h>

#include "tacc_drv.h"
#include "tacc_trace.h"

/* Events name other owners' pids and fault addresses: CAP_NET_ADMIN to join. */
static const struct genl_multicast_group tacc_mcgrps[] = {
	{ .name = TACC_GENL_MCGRP_EVENTS, .flags = GENL_MCAST_CAP_NET_ADMIN, },
};

static struct genl_family tacc_genl_family = {
	.name = TACC_GENL_NAME,
	.version = TACC_GENL_VERSION,
	.maxattr = TACC_A_MAX,
	.module = THIS_MODULE,
	.netnsok = false,
	.mcgrps = tacc_mcgrps,
	.n_mcgrps = ARRAY_SIZE(tacc_mcgrps),
	.resv_start_op = TACC_GENL_CMD_EVENT + 1,
};

static bool tacc_genl_registered;

void tacc_genl_event(struct tacc_device *tdev, u32 event, struct tacc_ctx *ctx,
		     u32 queue, u64 addr, u32 info, u64 tag, u64 seqno, gfp_t gfp)
{
	struct sk_buff *skb;
	void *hdr;

	trace_tacc_device_event(tacc_devid(tdev), event, ctx ? ctx->id : U32_MAX, queue, addr,
				info, tag, seqno);
	if (!tacc_genl_registered || !genl_has_listeners(&tacc_genl_family, &init_net, 0))
		return;
	skb = genlmsg_new(NLMSG_DEFAULT_SIZE, gfp);
	if (!skb)
		return;
	hdr = genlmsg_put(skb, 0, 0, &tacc_genl_family, 0, TACC_GENL_CMD_EVENT);
	if (!hdr)
		goto err;
	if (nla_put_u32(skb, TACC_A_EVENT, event) ||
	    nla_put_string(skb, TACC_A_DEVICE, pci_name(tdev->pdev)) ||
	    nla_put_u32(skb, TACC_A_MINOR, tdev->drm.accel ? tdev->drm.accel->index : 0) ||
	    nla_put_u32(skb, TACC_A_QUEUE, queue) ||
	    nla_put_u32(skb, TACC_A_INFO, info) ||
	    nla_put_u64_64bit(skb, TACC_A_ADDR, addr, TACC_A_PAD) ||
	    nla_put_u64_64bit(skb, TACC_A_TAG, tag, TACC_A_PAD) ||
	    nla_put_u64_64bit(skb, TACC_A_SEQNO, seqno, TACC_A_PAD) ||
	    nla_put_u64_64bit(skb, TACC_A_TIMESTAMP, ktime_get_ns(), TACC_A_PAD))
		goto err;
	if (ctx && (nla_put_u32(skb, TACC_A_CTX, ctx->id) ||
		    nla_put_u32(skb, TACC_A_PID, ctx->pid)))
		goto err;
	genlmsg_end(skb, hdr);
	genlmsg_multicast(&tacc_genl_family, skb, 0, 0, gfp);
	return;
err:
	nlmsg_free(skb);
}

int tacc_genl_init(void)
{
	int ret = genl_register_family(&tacc_genl_family);

	tacc_genl_registered = !ret;
	return ret;
}

void tacc_genl_fini(void)
{
	if (tacc_genl_registered)
		genl_unregister_family(&tacc_genl_family);
	tacc_genl_registered = false;
}
