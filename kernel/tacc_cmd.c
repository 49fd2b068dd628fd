// SPDX-License-Identifier: GPL-2.0-only
/*
 * tacc_cmd.c - the one validator of user commands (docs/uapi.md "SUBMIT").
 *
 * Both submit paths, the PF/VF one (tacc_job.c) and the virtio-tacc
 * frontend (tacc_virtio_job.c), turn each user command into a struct
 * drm_tacc_cmd2 (tacc_cmd_from_v1() for the 128-byte form), check it here
 * against the device's rules (docs/hardware.md sections 3 and 14: opcode,
 * shapes, limits, dtypes, flags, reserved bytes, unused operands), learn
 * what each operand must be (extent, alignment, memory kind), resolve the
 * operands against their own bindings, and build the descriptor with
 * tacc_cmd_desc().  A LIST is checked as one command: its listed commands
 * are the device's to check (docs/uapi.md "Threat model").
 */
#include <linux/bits.h>
#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/overflow.h>
#include <linux/string.h>

#include "tacc_cmd.h"

#define TACC_CMD_MAX_STRIDE	BIT_ULL(40)	/* elements: beyond any window */

static bool tacc_cmd_opnd_unused(const struct drm_tacc_operand *op)
{
	return !op->handle && !op->pad && !op->offset;
}

/**
 * tacc_cmd_from_v1 - the 256-byte form of a 128-byte user command.
 * @c: the command (struct drm_tacc_cmd, the hw 1.2 opcodes).
 * @c2: out: the same command as struct drm_tacc_cmd2, for tacc_cmd_check().
 *
 * Every field an opcode does not use must be zero, on every function kind
 * (a COPY with a value, a GEMM with an eltwise op ...): docs/uapi.md "SUBMIT".
 *
 * Return: 0, or -EINVAL for a non-zero unused field or an unknown opcode.
 */
int tacc_cmd_from_v1(const struct drm_tacc_cmd *c, struct drm_tacc_cmd2 *c2)
{
	struct tacc_desc d;
	bool two = c->elt_op == DRM_TACC_ELT_ADD || c->elt_op == DRM_TACC_ELT_MUL;
	bool gemm_f = c->m || c->n || c->k || c->lda || c->ldb || c->ldc || c->alpha ||
		      c->beta;
	bool elt_f = c->elt_op || c->scalar;

	if (c->flags || c->rsvd)
		return -EINVAL;
	memset(c2, 0, sizeof(*c2));
	memset(&d, 0, sizeof(d));
	c2->opcode = c->opcode;
	c2->tag = c->tag;
	c2->op[0] = c->a;
	c2->op[1] = c->b;
	c2->op[2] = c->c;
	switch (c->opcode) {
	case DRM_TACC_OP_NOP:
	case DRM_TACC_OP_BARRIER:
		if (c->size || c->value || gemm_f || elt_f)
			return -EINVAL;
		break;
	case DRM_TACC_OP_COPY_H2D:
	case DRM_TACC_OP_COPY_D2H:
	case DRM_TACC_OP_COPY_D2D:
		if (c->value || gemm_f || elt_f)
			return -EINVAL;
		d.copy.len = c->size;
		break;
	case DRM_TACC_OP_GEMM:
		if (c->size || c->value || elt_f)
			return -EINVAL;
		d.gemm.m = c->m;
		d.gemm.n = c->n;
		d.gemm.k = c->k;
		d.gemm.lda = c->lda;
		d.gemm.ldb = c->ldb;
		d.gemm.ldc = c->ldc;
		d.gemm.alpha = c->alpha;
		d.gemm.beta = c->beta;
		break;
	case DRM_TACC_OP_ELTWISE:
		/* the hw 1.2 ops only: the others need drm_tacc_cmd2 */
		if (c->value || gemm_f || c->elt_op > DRM_TACC_ELT_SCALE ||
		    (c->scalar && c->elt_op != DRM_TACC_ELT_SCALE) ||
		    (!two && !tacc_cmd_opnd_unused(&c->b)))
			return -EINVAL;
		d.eltwise.n = c->size;
		d.eltwise.op = c->elt_op;
		d.eltwise.scalar = c->scalar;
		break;
	case DRM_TACC_OP_FENCE:
	case DRM_TACC_OP_TIMESTAMP:
		if (c->size || gemm_f || elt_f ||
		    (c->opcode == DRM_TACC_OP_TIMESTAMP && c->value))
			return -EINVAL;
		d.fence.value = c->value;
		break;
	default:
		return -EINVAL;
	}
	memcpy(c2->args, d.payload, sizeof(c2->args));
	return 0;
}

static size_t tacc_cmd_dt_size(unsigned int dt)
{
	return dt == TACC_DT_BF16 ? 2 : 4;
}

static bool tacc_cmd_dt_float(unsigned int dt)
{
	return dt == TACC_DT_FP32 || dt == TACC_DT_BF16;
}

static u64 tacc_cmd_rows(u64 rows, u64 cols, u64 ld, unsigned int dt)
{
	return ((rows - 1) * ld + cols) * tacc_cmd_dt_size(dt);
}

static void tacc_cmd_set(struct tacc_cmd_spec *spec, int i, u16 field, u64 len, u32 align,
			 u8 kind, bool write)
{
	spec->op[i].addr = true;
	spec->op[i].field = field;
	spec->op[i].len = len;
	spec->op[i].align = align;
	spec->op[i].kind = kind;
	spec->op[i].write = write;
}

#define TACC_F(x)	((u16)(offsetof(struct tacc_desc, x) - offsetof(struct tacc_desc, payload)))

/* Are bytes [from, 104) of the payload zero? */
static bool tacc_cmd_tail_zero(const struct tacc_desc *d, size_t from)
{
	return !memchr_inv(d->payload + from, 0, sizeof(d->payload) - from);
}

static int tacc_cmd_gemm(const struct tacc_desc *d, u32 caps, struct tacc_cmd_spec *spec)
{
	u64 m = d->gemm.m, n = d->gemm.n, k = d->gemm.k;
	u64 batch = d->gemm.batch ? d->gemm.batch : 1;
	bool ta = d->gemm.gflags & TACC_GEMM_F_TRANS_A;
	bool tb = d->gemm.gflags & TACC_GEMM_F_TRANS_B;
	bool bias = d->gemm.gflags & TACC_GEMM_F_BIAS;
	unsigned int sab = d->gemm.dtype_ab, sc = d->gemm.dtype_c;
	u64 ea, eb, ec;

	if (!tacc_cmd_tail_zero(d, TACC_F(gemm.dtype_ab)) && !(caps & TACC_CAP_GEMM_EX))
		return -EOPNOTSUPP;
	if ((sab == TACC_DT_BF16 || sc == TACC_DT_BF16) && !(caps & TACC_CAP_BF16))
		return -EOPNOTSUPP;
	if (!tacc_cmd_dt_float(sab) || !tacc_cmd_dt_float(sc) ||
	    (d->gemm.gflags & ~TACC_GEMM_F_ALL) || d->gemm.rsvd || d->gemm.rsvd2)
		return -EINVAL;
	if (!m || !n || !k || m > TACC_GEMM_MAX_DIM || n > TACC_GEMM_MAX_DIM ||
	    k > TACC_GEMM_MAX_DIM || batch > TACC_GEMM_MAX_BATCH ||
	    batch * m * n * k > TACC_GEMM_MAX_MNK ||
	    d->gemm.lda < (ta ? m : k) || d->gemm.ldb < (tb ? k : n) || d->gemm.ldc < n ||
	    d->gemm.lda > TACC_GEMM_MAX_LD || d->gemm.ldb > TACC_GEMM_MAX_LD ||
	    d->gemm.ldc > TACC_GEMM_MAX_LD || (batch > 1 && !d->gemm.stride_c) ||
	    d->gemm.stride_a > TACC_CMD_MAX_STRIDE || d->gemm.stride_b > TACC_CMD_MAX_STRIDE ||
	    d->gemm.stride_c > TACC_CMD_MAX_STRIDE)
		return -EINVAL;
	ea = (batch - 1) * d->gemm.stride_a * tacc_cmd_dt_size(sab) +
	     tacc_cmd_rows(ta ? k : m, ta ? m : k, d->gemm.lda, sab);
	eb = (batch - 1) * d->gemm.stride_b * tacc_cmd_dt_size(sab) +
	     tacc_cmd_rows(tb ? n : k, tb ? k : n, d->gemm.ldb, sab);
	ec = (batch - 1) * d->gemm.stride_c * tacc_cmd_dt_size(sc) +
	     tacc_cmd_rows(m, n, d->gemm.ldc, sc);
	tacc_cmd_set(spec, 0, TACC_F(gemm.a), ea, tacc_cmd_dt_size(sab), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 1, TACC_F(gemm.b), eb, tacc_cmd_dt_size(sab), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 2, TACC_F(gemm.c), ec, tacc_cmd_dt_size(sc), TACC_CMD_DEV, true);
	tacc_cmd_set(spec, 3, TACC_F(gemm.bias), bias ? n * tacc_cmd_dt_size(sc) : 0,
		     tacc_cmd_dt_size(sc), TACC_CMD_DEV, false);
	return 0;
}

static int tacc_cmd_eltwise(const struct tacc_desc *d, u32 caps, struct tacc_cmd_spec *spec)
{
	unsigned int op = d->eltwise.op, da = d->eltwise.dtype_a, dc = d->eltwise.dtype_c;
	bool two = op == TACC_ELT_ADD || op == TACC_ELT_MUL;
	bool bcast = d->eltwise.eflags & TACC_ELT_F_ROW_BCAST;
	u64 n = d->eltwise.n, cols = d->eltwise.cols;

	if (!tacc_cmd_tail_zero(d, TACC_F(eltwise.cols) + sizeof(d->eltwise.cols)))
		return -EINVAL;		/* past its last field, on every device */
	if ((op >= TACC_ELT_GELU || !tacc_cmd_tail_zero(d, TACC_F(eltwise.dtype_a))) &&
	    !(caps & TACC_CAP_NN_OPS))
		return -EOPNOTSUPP;
	if ((da == TACC_DT_BF16 || dc == TACC_DT_BF16) && !(caps & TACC_CAP_BF16))
		return -EOPNOTSUPP;
	if (op >= TACC_ELT_MAX || !tacc_cmd_dt_float(da) || !tacc_cmd_dt_float(dc) ||
	    (d->eltwise.eflags & ~TACC_ELT_F_ALL) || d->eltwise.rsvd ||
	    (bcast && !two) || (!bcast && cols) ||
	    (d->eltwise.scalar && op != TACC_ELT_SCALE) ||
	    !n || n > TACC_ELT_MAX_N || (bcast && (!cols || n % cols)))
		return -EINVAL;
	tacc_cmd_set(spec, 0, TACC_F(eltwise.a), n * tacc_cmd_dt_size(da),
		     tacc_cmd_dt_size(da), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 1, TACC_F(eltwise.b),
		     two ? (bcast ? cols : n) * tacc_cmd_dt_size(da) : 0,
		     tacc_cmd_dt_size(da), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 2, TACC_F(eltwise.c), n * tacc_cmd_dt_size(dc),
		     tacc_cmd_dt_size(dc), TACC_CMD_DEV, true);
	return 0;
}

static bool tacc_cmd_rows_ok(u64 rows, u64 cols, u64 ldx, u64 ldy)
{
	return rows && cols && cols <= TACC_ROW_MAX_COLS && rows * cols <= TACC_ROW_MAX_N &&
	       ldx >= cols && ldy >= cols && ldx <= TACC_ROW_MAX_COLS && ldy <= TACC_ROW_MAX_COLS;
}

static int tacc_cmd_softmax(const struct tacc_desc *d, struct tacc_cmd_spec *spec)
{
	u64 rows = d->softmax.rows, cols = d->softmax.cols;
	unsigned int dx = d->softmax.dtype_x, dy = d->softmax.dtype_y;
	bool causal = d->softmax.sflags & TACC_SOFTMAX_F_CAUSAL;

	if (!tacc_cmd_dt_float(dx) || !tacc_cmd_dt_float(dy) ||
	    (d->softmax.sflags & ~TACC_SOFTMAX_F_ALL) || d->softmax.rsvd ||
	    (!causal && (d->softmax.pos || d->softmax.period)) ||
	    !tacc_cmd_tail_zero(d, TACC_F(softmax.rsvd) + 2) ||
	    !tacc_cmd_rows_ok(rows, cols, d->softmax.ldx, d->softmax.ldy))
		return -EINVAL;
	tacc_cmd_set(spec, 0, TACC_F(softmax.x), tacc_cmd_rows(rows, cols, d->softmax.ldx, dx),
		     tacc_cmd_dt_size(dx), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 1, TACC_F(softmax.y), tacc_cmd_rows(rows, cols, d->softmax.ldy, dy),
		     tacc_cmd_dt_size(dy), TACC_CMD_DEV, true);
	return 0;
}

static int tacc_cmd_norm(const struct tacc_desc *d, u32 caps, struct tacc_cmd_spec *spec)
{
	u64 rows = d->norm.rows, cols = d->norm.cols;
	unsigned int dx = d->norm.dtype_x, dy = d->norm.dtype_y, dw = d->norm.dtype_w;
	bool layer = d->norm.kind == TACC_NORM_LAYER;
	bool stats = d->norm.nflags & TACC_NORM_F_STATS;
	u32 eps = d->norm.eps;

	if (d->norm.nflags && !(caps & TACC_CAP_NORM_STATS))
		return -EOPNOTSUPP;
	/* eps: finite and >= 0 (sign clear, exponent not all ones) */
	if (!tacc_cmd_dt_float(dx) || !tacc_cmd_dt_float(dy) || !tacc_cmd_dt_float(dw) ||
	    d->norm.kind >= TACC_NORM_MAX || (eps & BIT(31)) ||
	    (eps & 0x7f800000) == 0x7f800000 ||
	    (d->norm.nflags & ~TACC_NORM_F_ALL) || d->norm.rsvd ||
	    !tacc_cmd_tail_zero(d, TACC_F(norm.stats)) ||
	    !tacc_cmd_rows_ok(rows, cols, d->norm.ldx, d->norm.ldy))
		return -EINVAL;
	tacc_cmd_set(spec, 0, TACC_F(norm.x), tacc_cmd_rows(rows, cols, d->norm.ldx, dx),
		     tacc_cmd_dt_size(dx), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 1, TACC_F(norm.y), tacc_cmd_rows(rows, cols, d->norm.ldy, dy),
		     tacc_cmd_dt_size(dy), TACC_CMD_DEV, true);
	tacc_cmd_set(spec, 2, TACC_F(norm.gamma), cols * tacc_cmd_dt_size(dw),
		     tacc_cmd_dt_size(dw), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 3, TACC_F(norm.beta), layer ? cols * tacc_cmd_dt_size(dw) : 0,
		     tacc_cmd_dt_size(dw), TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 4, TACC_F(norm.stats), stats ? (layer ? 2 : 1) * rows * 4 : 0, 4,
		     TACC_CMD_DEV, true);
	return 0;
}

static int tacc_cmd_gather(const struct tacc_desc *d, struct tacc_cmd_spec *spec)
{
	u64 rows = d->gather.rows, cols = d->gather.cols, trows = d->gather.table_rows;
	unsigned int dt = d->gather.dtype;

	if (!tacc_cmd_dt_float(dt) || !tacc_cmd_tail_zero(d, TACC_F(gather.rsvd)) ||
	    !tacc_cmd_rows_ok(rows, cols, d->gather.ld_table, d->gather.ld_out) || !trows)
		return -EINVAL;
	tacc_cmd_set(spec, 0, TACC_F(gather.table),
		     tacc_cmd_rows(trows, cols, d->gather.ld_table, dt), tacc_cmd_dt_size(dt),
		     TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 1, TACC_F(gather.idx), rows * 4, 4, TACC_CMD_DEV, false);
	tacc_cmd_set(spec, 2, TACC_F(gather.out), tacc_cmd_rows(rows, cols, d->gather.ld_out, dt),
		     tacc_cmd_dt_size(dt), TACC_CMD_DEV, true);
	return 0;
}

static int tacc_cmd_list(const struct tacc_desc *d, struct tacc_cmd_spec *spec)
{
	if (!d->list.list_id || d->list.rsvd || d->list.rsvd2 || !d->list.count ||
	    d->list.count > TACC_LIST_MAX_CMDS || d->list.npatch > TACC_LIST_MAX_PATCHES)
		return -EINVAL;
	tacc_cmd_set(spec, 0, TACC_F(list.list), (u64)d->list.count * TACC_DESC_SIZE,
		     TACC_DESC_SIZE, TACC_CMD_ANY, false);
	tacc_cmd_set(spec, 1, TACC_F(list.patches), (u64)d->list.npatch * TACC_LIST_PATCH_SIZE,
		     TACC_LIST_PATCH_SIZE, TACC_CMD_ANY, false);
	return 0;
}

static bool tacc_cmd_rowop_bf16(const struct tacc_desc *d, u32 opcode)
{
	switch (opcode) {
	case DRM_TACC_OP_SOFTMAX:
		return d->softmax.dtype_x == TACC_DT_BF16 || d->softmax.dtype_y == TACC_DT_BF16;
	case DRM_TACC_OP_NORM:
		return d->norm.dtype_x == TACC_DT_BF16 || d->norm.dtype_y == TACC_DT_BF16 ||
		       d->norm.dtype_w == TACC_DT_BF16;
	default:
		return d->gather.dtype == TACC_DT_BF16;
	}
}

/**
 * tacc_cmd_check - validate a user command and say what its operands must be.
 * @c: the command.
 * @caps: the function's TACC_CAP_* (hw 1.3 features need theirs).
 * @spec: out: per operand its extent, alignment, memory kind, access.
 *
 * Return: 0; -EINVAL for a command the device would refuse (or a payload
 * address field that is not zero); -EOPNOTSUPP for a feature @caps lacks.
 */
int tacc_cmd_check(const struct drm_tacc_cmd2 *c, u32 caps, struct tacc_cmd_spec *spec)
{
	enum tacc_cmd_kind src, dst;
	struct tacc_desc d;
	int i, ret = 0;

	memset(spec, 0, sizeof(*spec));
	if (c->flags || memchr_inv(c->rsvd, 0, sizeof(c->rsvd)))
		return -EINVAL;
	memset(&d, 0, sizeof(d));
	memcpy(d.payload, c->args, sizeof(d.payload));
	switch (c->opcode) {
	case DRM_TACC_OP_NOP:
	case DRM_TACC_OP_BARRIER:
		if (!tacc_cmd_tail_zero(&d, 0))
			return -EINVAL;
		break;
	case DRM_TACC_OP_COPY_H2D:
	case DRM_TACC_OP_COPY_D2H:
	case DRM_TACC_OP_COPY_D2D:
		if (!d.copy.len || d.copy.len >= TACC_COPY_MAX_LEN ||
		    !tacc_cmd_tail_zero(&d, TACC_F(copy.len) + 8))
			return -EINVAL;
		src = c->opcode == DRM_TACC_OP_COPY_H2D ? TACC_CMD_HOST : TACC_CMD_DEV;
		dst = c->opcode == DRM_TACC_OP_COPY_D2H ? TACC_CMD_HOST : TACC_CMD_DEV;
		tacc_cmd_set(spec, 0, TACC_F(copy.src), d.copy.len, 1, src, false);
		tacc_cmd_set(spec, 1, TACC_F(copy.dst), d.copy.len, 1, dst, true);
		break;
	case DRM_TACC_OP_GEMM:
		ret = tacc_cmd_gemm(&d, caps, spec);
		break;
	case DRM_TACC_OP_ELTWISE:
		ret = tacc_cmd_eltwise(&d, caps, spec);
		break;
	case DRM_TACC_OP_FENCE:
	case DRM_TACC_OP_TIMESTAMP:
		if ((c->opcode == DRM_TACC_OP_TIMESTAMP && d.fence.value) ||
		    !tacc_cmd_tail_zero(&d, TACC_F(fence.value) + 8))
			return -EINVAL;
		tacc_cmd_set(spec, 0, TACC_F(fence.addr), 8, 8, TACC_CMD_ANY, true);
		break;
	case DRM_TACC_OP_SOFTMAX:
	case DRM_TACC_OP_NORM:
	case DRM_TACC_OP_GATHER:
		if (!(caps & TACC_CAP_NN_OPS))
			return -EOPNOTSUPP;
		if (!(caps & TACC_CAP_BF16) && tacc_cmd_rowop_bf16(&d, c->opcode))
			return -EOPNOTSUPP;
		ret = c->opcode == DRM_TACC_OP_SOFTMAX ? tacc_cmd_softmax(&d, spec) :
		      c->opcode == DRM_TACC_OP_NORM ? tacc_cmd_norm(&d, caps, spec) :
		      tacc_cmd_gather(&d, spec);
		break;
	case DRM_TACC_OP_LIST:
		if (!(caps & TACC_CAP_CMD_LIST))
			return -EOPNOTSUPP;
		ret = tacc_cmd_list(&d, spec);
		break;
	default:			/* FILL is the kernel's, the rest unknown */
		return -EINVAL;
	}
	if (ret)
		return ret;
	/*
	 * The driver writes the VAs: the user's address fields are zero, those
	 * of the operands this command does not use (a GEMM's bias without
	 * TACC_GEMM_F_BIAS, a one-operand eltwise's b ...) included.
	 */
	for (i = 0; i < DRM_TACC_CMD2_OPERANDS; i++) {
		if (spec->op[i].addr && memchr_inv(d.payload + spec->op[i].field, 0, 8))
			return -EINVAL;
		if (!spec->op[i].len && !tacc_cmd_opnd_unused(&c->op[i]))
			return -EINVAL;
	}
	return 0;
}

/* The descriptor of a checked command, its operands at device VAs @va. */
void tacc_cmd_desc(const struct drm_tacc_cmd2 *c, const struct tacc_cmd_spec *spec,
		   const u64 *va, struct tacc_desc *d)
{
	int i;

	memset(d, 0, sizeof(*d));
	d->opcode = c->opcode;
	d->tag = c->tag;
	memcpy(d->payload, c->args, sizeof(d->payload));
	for (i = 0; i < DRM_TACC_CMD2_OPERANDS; i++) {
		if (spec->op[i].len)
			memcpy(d->payload + spec->op[i].field, &va[i], 8);
	}
}
