/*
 * tacc: timing model (PCIe link, compute, device memory).
 *
 * Every duration is computed here, in picoseconds of modelled time, and
 * documented in docs/hardware.md ("Timing model").  The formulas must stay
 * in step with that document and with tools/bench/bench_link.py.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */
#include "qemu/osdep.h"
#include "tacc.h"

unsigned tacc_link_rate_gt(TaccState *s)
{
    switch (s->link_gen) {
    case 3:
        return 8;
    case 5:
        return 32;
    default:
        return 16;
    }
}

uint64_t tacc_scale_ps(TaccState *s, uint64_t ps)
{
    if (s->time_scale == 1000) {
        return ps;
    }
    return muldiv64(ps, s->time_scale, 1000);
}

/*
 * Time to move @bytes over one direction of the link:
 *   bytes * 8 bit / (lanes * rate GT/s * 128/130)    (128b/130b, Gen3+)
 * = ceil(bytes * 8 * 130 * 1000 / (lanes * rate * 128)) ps
 */
uint64_t tacc_link_ps(TaccState *s, uint64_t bytes)
{
    uint64_t den = (uint64_t)s->link_width * tacc_link_rate_gt(s) *
                   TACC_LINK_ENC_NUM;
    uint64_t num = 8 * TACC_LINK_ENC_DEN * 1000;
    /* bytes < 2^40 here (chunks), so no overflow */
    return tacc_scale_ps(s, (bytes * num + den - 1) / den);
}

/* A read of @len bytes: completions downstream, requests upstream. */
void tacc_link_h2d_cost(TaccState *s, uint64_t len, uint64_t *down,
                        uint64_t *up, uint64_t *tlps)
{
    uint64_t cpl = DIV_ROUND_UP(len, s->mps);
    uint64_t req = DIV_ROUND_UP(len, s->mrrs);

    *tlps = cpl;
    *down = len + cpl * TACC_LINK_CPL_OVERHEAD;
    *up = req * TACC_LINK_MRD_BYTES;
}

/* A posted write of @len bytes upstream. */
void tacc_link_d2h_cost(TaccState *s, uint64_t len, uint64_t *up,
                        uint64_t *tlps)
{
    uint64_t n = DIV_ROUND_UP(len, s->mps);

    *tlps = n;
    *up = len + n * TACC_LINK_MWR_OVERHEAD;
}

/*
 * Compute engine time: the larger of the arithmetic time and the device
 * memory time (a roofline):  max(flops / F, bytes / BW_devmem).
 *   flops * 1000 / gflops  ps,   bytes * 1000 / gbps  ps
 */
uint64_t tacc_compute_ps(TaccState *s, uint64_t flops, uint64_t devmem_bytes)
{
    uint64_t c = muldiv64(flops, 1000, MAX(s->compute_gflops, 1));
    uint64_t m = muldiv64(devmem_bytes, 1000, MAX(s->devmem_gbps, 1));

    return tacc_scale_ps(s, MAX(c, m));
}
/* timing model: see docs/hardware.md section 9 */
