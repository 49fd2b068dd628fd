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

/*
 * Payload TLPs of the first @len bytes of a transfer whose host-side and
 * device-side addresses start at offsets @host_off and @dev_off: the DMA
 * engine moves bursts of at most MPS bytes that never cross an MPS boundary
 * of the device-side address and splits each burst again at the MPS
 * boundaries of the host-side address, so [0, len) is cut at every x in
 * (0, len) where (dev_off + x) or (host_off + x) is a multiple of MPS:
 *   cuts(o) = (o % MPS + len - 1) / MPS
 *   tlps = 1 + cuts(dev_off) + (same offset mod MPS ? 0 : cuts(host_off))
 * Aligned, this is ceil(len / MPS).
 */
uint64_t tacc_link_tlps(TaccState *s, uint64_t len, uint64_t host_off,
                        uint64_t dev_off)
{
    uint64_t h = host_off % s->mps, d = dev_off % s->mps;
    uint64_t n;

    if (!len) {
        return 0;
    }
    n = 1 + (d + len - 1) / s->mps;
    if (h != d) {
        n += (h + len - 1) / s->mps;
    }
    return n;
}

/*
 * Link bytes of payload bytes [pos, pos + len) of the transfer described by
 * @r (link_kind, link_host_off, link_dev_off).  A part is charged the TLPs
 * that start in it (prefix differences), so the link steps of a transfer
 * add up to the whole transfer's count and a step boundary that is not a
 * cut costs nothing.
 *   H2D: down = len + tlps * CPL overhead (completions),
 *        up   = read requests of MRRS bytes
 *   D2H: up   = len + tlps * MWr overhead (posted writes)
 */
void tacc_link_cost(TaccState *s, const TaccResult *r, uint64_t pos,
                    uint64_t len, uint64_t *down, uint64_t *up,
                    uint64_t *tlps)
{
    uint64_t h = r->link_host_off, d = r->link_dev_off;
    uint64_t n = tacc_link_tlps(s, pos + len, h, d) -
                 tacc_link_tlps(s, pos, h, d);

    *tlps = n;
    if (r->link_kind == TACC_LINK_H2D) {
        *down = len + n * TACC_LINK_CPL_OVERHEAD;
        *up = (DIV_ROUND_UP(pos + len, s->mrrs) - DIV_ROUND_UP(pos, s->mrrs)) *
              TACC_LINK_MRD_BYTES;
    } else {
        *down = 0;
        *up = len + n * TACC_LINK_MWR_OVERHEAD;
    }
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
