/*
 * tacc: the arithmetic of compute commands (docs/hardware.md section 14).
 *
 * Plain functions: operands already gathered into host buffers in, results
 * out; no device state, so they run on the main loop or on a worker thread.
 * Arithmetic is fp32; bf16 is widened exactly and narrowed by round to
 * nearest even (what ml_dtypes.bfloat16 does).  The GEMM goes through the
 * host's BLAS (OpenBLAS cblas_sgemm).
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include <math.h>
#include <cblas.h>
#include "tacc.h"

size_t tacc_dtype_size(unsigned dt)
{
    return dt == TACC_DT_BF16 ? 2 : 4;
}

float tacc_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;

    memcpy(&v, &bits, 4);
    return v;
}

uint16_t tacc_f32_to_bf16(float f)
{
    uint32_t bits;

    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (bits >> 16) | 0x0040;           /* NaN: quiet, same sign */
    }
    bits += 0x7fffu + ((bits >> 16) & 1);       /* round to nearest even */
    return bits >> 16;
}

/* @n elements of type @dt (little endian) at @src -> fp32 at @dst */
void tacc_widen(const void *src, unsigned dt, float *dst, size_t n)
{
    if (dt == TACC_DT_BF16) {
        const uint8_t *p = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = tacc_bf16_to_f32(lduw_le_p(p + 2 * i));
        }
    } else if (dst != src) {
        memmove(dst, src, n * 4);
    }
}

/* fp32 at @src -> @n elements of type @dt at @dst (may alias @src) */
void tacc_narrow(const float *src, unsigned dt, void *dst, size_t n)
{
    if (dt == TACC_DT_BF16) {
        uint8_t *p = dst;
        for (size_t i = 0; i < n; i++) {
            stw_le_p(p + 2 * i, tacc_f32_to_bf16(src[i]));
        }
    } else if (dst != src) {
        memmove(dst, src, n * 4);
    }
}

/*
 * C_i = alpha op(A_i) op(B_i) + beta C_i (+ bias) for each batch, packed
 * operands: A_i is m x k (k x m transposed, lda = its row length), B_i k x n
 * (n x k), C_i m x n.  Stops between batches when cancelled.
 */
void tacc_ops_gemm(TaccGemmJob *j)
{
    uint64_t sa = j->m * j->k, sb = j->shared_b ? 0 : j->k * j->n;
    uint64_t sc = j->m * j->n;

    for (uint64_t i = 0; i < j->batch && !qatomic_read(&j->cancel); i++) {
        float *C = j->C + i * sc;

        cblas_sgemm(CblasRowMajor, j->trans_a ? CblasTrans : CblasNoTrans,
                    j->trans_b ? CblasTrans : CblasNoTrans, j->m, j->n, j->k,
                    j->alpha, j->A + i * sa, j->lda, j->B + i * sb, j->ldb,
                    j->beta, C, j->n);
        if (j->bias) {
            for (uint64_t r = 0; r < j->m; r++) {
                for (uint64_t x = 0; x < j->n; x++) {
                    C[r * j->n + x] += j->bias[x];
                }
            }
        }
    }
}

/* FLOPs per element of an eltwise op (docs/hardware.md "FLOPs and bytes") */
uint64_t tacc_elt_flops_per(unsigned op)
{
    switch (op) {
    case TACC_ELT_GELU:
        return 8;
    case TACC_ELT_SILU:
        return 4;
    case TACC_ELT_CAST:
        return 0;
    default:
        return 1;
    }
}

static float tacc_gelu(float x)
{
    const float k = 0.7978845608028654f;        /* sqrt(2 / pi) */

    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/*
 * a[i] = op(a[i], b[i % bcols]) in place for i in [@from, @to) (b: NULL for
 * unary ops)
 */
void tacc_ops_eltwise(unsigned op, float *a, const float *b, size_t bcols,
                      size_t from, size_t to, float scalar)
{
    for (size_t i = from; i < to; i++) {
        float x = a[i];

        switch (op) {
        case TACC_ELT_ADD:
            x += b[bcols ? i % bcols : i];
            break;
        case TACC_ELT_MUL:
            x *= b[bcols ? i % bcols : i];
            break;
        case TACC_ELT_RELU:
            x = x > 0.0f ? x : 0.0f;
            break;
        case TACC_ELT_SCALE:
            x *= scalar;
            break;
        case TACC_ELT_GELU:
            x = tacc_gelu(x);
            break;
        case TACC_ELT_SILU:
            x = x / (1.0f + expf(-x));
            break;
        case TACC_ELT_EXP:
            x = expf(x);
            break;
        default:                /* CAST: the conversion is the narrowing */
            break;
        }
        a[i] = x;
    }
}

/*
 * Row softmax of rows [@r0, @r1) of packed rows x cols, in place; masked
 * columns become 0.
 */
void tacc_ops_softmax(float *x, size_t r0, size_t r1, size_t cols,
                      float scale, bool causal, uint64_t pos, uint64_t period)
{
    for (size_t r = r0; r < r1; r++) {
        float *row = x + r * cols;
        size_t valid = cols;
        float mx = -INFINITY;
        double sum = 0.0;

        if (causal) {
            uint64_t last = (period ? r % period : r) + pos;    /* unmasked */
            valid = last + 1 < cols ? last + 1 : cols;
        }
        for (size_t j = 0; j < valid; j++) {
            row[j] *= scale;
            mx = row[j] > mx ? row[j] : mx;
        }
        for (size_t j = 0; j < valid; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        for (size_t j = 0; j < valid; j++) {
            row[j] = (float)(row[j] / sum);
        }
        for (size_t j = valid; j < cols; j++) {
            row[j] = 0.0f;
        }
    }
}

/*
 * LayerNorm / RMSNorm of packed rows x cols, in place; each row's mean and
 * 1/sqrt(var + eps) (RMS: 1/sqrt(mean(x^2) + eps)) into @mean[r], @inv[r]
 * when they are not NULL.
 */
void tacc_ops_norm(float *x, size_t rows, size_t cols, unsigned kind,
                   const float *gamma, const float *beta, float eps,
                   float *mean_out, float *inv_out)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * cols;
        double mean = 0.0, var = 0.0;
        float inv, m;

        if (kind == TACC_NORM_LAYER) {
            for (size_t j = 0; j < cols; j++) {
                mean += row[j];
            }
            mean /= cols;
        }
        m = (float)mean;
        for (size_t j = 0; j < cols; j++) {
            double d = row[j] - m;
            var += d * d;
        }
        inv = (float)(1.0 / sqrt(var / cols + eps));
        if (mean_out) {
            mean_out[r] = m;
        }
        if (inv_out) {
            inv_out[r] = inv;
        }
        for (size_t j = 0; j < cols; j++) {
            float y = (row[j] - m) * inv * gamma[j];
            row[j] = beta ? y + beta[j] : y;
        }
    }
}
