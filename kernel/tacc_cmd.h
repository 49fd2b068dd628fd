/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * tacc_cmd.h - the one validator of user commands, shared by the PF/VF submit
 * path (tacc_job.c) and the virtio-tacc frontend (tacc_virtio_job.c).
 */
#ifndef __TACC_CMD_H__
#define __TACC_CMD_H__

#include <linux/types.h>
#include "include/tacc_hw.h"
#include "include/uapi/drm/tacc_accel.h"

/* Memory an operand must be: any BO, a host BO, a device BO. */
enum tacc_cmd_kind { TACC_CMD_ANY, TACC_CMD_HOST, TACC_CMD_DEV };

/**
 * struct tacc_cmd_opnd - what one operand of a command must be.
 * @len: its extent in bytes from its first byte (0: unused, all zero).
 * @align: required alignment of its offset.
 * @kind: enum tacc_cmd_kind.
 * @write: the command writes it.
 * @addr: the opcode has a payload address field for it (@field), used or
 *        not: the user's value there must be zero either way.
 * @field: payload byte offset of its device VA in the descriptor.
 */
struct tacc_cmd_opnd {
	u64 len;
	u32 align;
	u8 kind;
	bool write;
	bool addr;
	u16 field;
};

struct tacc_cmd_spec {
	struct tacc_cmd_opnd op[DRM_TACC_CMD2_OPERANDS];
};

int tacc_cmd_from_v1(const struct drm_tacc_cmd *c, struct drm_tacc_cmd2 *c2);
int tacc_cmd_check(const struct drm_tacc_cmd2 *c, u32 caps, struct tacc_cmd_spec *spec);
void tacc_cmd_desc(const struct drm_tacc_cmd2 *c, const struct tacc_cmd_spec *spec,
		   const u64 *va, struct tacc_desc *d);

#endif /* __TACC_CMD_H__ */
