"""Host-address alignment in the link model: payload TLPs are split at MPS
boundaries of the device-side AND the host-side address (docs/hardware.md
section 9, "PCIe link").  Counters, the trace record and the modelled duration
must follow tacc.capture.devinfo's formula exactly."""

import pytest
from tacc.capture import devinfo
from tacc.testing.taccdev import CHUNK, DEVMEM_VA, HW, LinkModel, d_copy

SIZES = [64 << 10, 1 << 20, 4096 + 100]
# (host-side offset, device-side offset): aligned, host misaligned by 64 relative
# to the device side, both misaligned by the same 64 B, device side misaligned
OFFSETS = [(0, 0), (64, 0), (64, 64), (0, 64)]


def aligned_copy(dev, pf, n, h2d, host_off, dev_off, q=0):
    """One COPY_H2D / COPY_D2H of n bytes (TLB warmed first); returns the CQE, the
    counter deltas, the link busy deltas (ticks) and the command's trace record."""
    host = dev.alloc(n + 4096) + host_off
    dva = DEVMEM_VA + 0x20_0000 + dev_off
    op = HW.TACC_OP_COPY_H2D if h2d else HW.TACC_OP_COPY_D2H
    src, dst = (host, dva) if h2d else (dva, host)
    pf.run_job(q, [d_copy(op, src, dst, n)])  # warm the TLB
    pf.trace_enable(size=16)  # PROD restarts at 0 only when tracing was off
    p0 = pf.r32(HW.TACC_REG_TRACE_PROD)
    pf.w32(HW.TACC_REG_TRACE_CONS, p0)
    c0 = pf.counters()
    g0 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    cq = pf.run_job(q, [d_copy(op, src, dst, n)])
    c1 = pf.counters()
    g1 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    assert pf.r32(HW.TACC_REG_TRACE_PROD) == p0 + 1
    rec = pf.trace_read(p0, p0 + 1, 16)[0]
    return cq, {k: c1[k] - c0[k] for k in c1}, (g1[0] - g0[0], g1[1] - g0[1]), rec


@pytest.mark.parametrize("h2d", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("host_off,dev_off", OFFSETS, ids=[f"h{h}-d{d}" for h, d in OFFSETS])
@pytest.mark.parametrize("n", SIZES)
def test_misaligned_copy(dev, pf, n, h2d, host_off, dev_off):
    lm = LinkModel()
    cq, d, gbusy, rec = aligned_copy(dev, pf, n, h2d, host_off, dev_off)
    assert cq.status == HW.TACC_ST_OK
    assert d["tlb_walk_reads"] == 0
    tlps = devinfo.payload_tlps(n, lm.mps, host_off=host_off, dev_off=dev_off)
    aligned = -(-n // lm.mps)
    if host_off % lm.mps == dev_off % lm.mps:
        assert tlps - aligned in ((0,) if host_off == 0 else (0, 1))
    else:
        assert tlps > 1.9 * aligned  # every MPS block is cut in two
    # TLPs: counters and the trace record
    assert rec.opcode == (HW.TACC_OP_COPY_H2D if h2d else HW.TACC_OP_COPY_D2H)
    assert rec.bytes == n and rec.tlps == tlps
    if h2d:
        down, up, want = lm.h2d_bytes(n, host_off, dev_off)
        assert want == tlps
        assert d["h2d_tlps"] == tlps and d["d2h_tlps"] == 0
        assert d["h2d_link_bytes"] == down == n + tlps * devinfo.LINK_CPL_OVERHEAD
        assert d["d2h_link_bytes"] == up == -(-n // lm.mrrs) * devinfo.LINK_MRD_BYTES
    else:
        up, want = lm.d2h_bytes(n, host_off, dev_off)
        down = 0
        assert want == tlps
        assert d["d2h_tlps"] == tlps and d["h2d_tlps"] == 0
        assert d["d2h_link_bytes"] == up == n + tlps * devinfo.LINK_MWR_OVERHEAD
        assert d["h2d_link_bytes"] == 0
    # the modelled duration: the 64 KiB link steps with their share of the TLPs
    dur_ps = (cq.end - cq.start) * 1000
    assert abs(dur_ps - lm.copy_ps(n, h2d, host_off=host_off, dev_off=dev_off)) < 1000
    assert (rec.t_end - rec.t_start) == cq.end - cq.start
    # link occupancy per direction: the sum of the steps' t_link (ticks, floored once)
    steps = [lm.step_bytes(a, min(CHUNK, n - a), h2d, host_off, dev_off)
             for a in range(0, n, CHUNK)]
    assert sum(s[0] for s in steps) == down and sum(s[1] for s in steps) == up
    busy_ps = [sum(lm.t_link_ps(s[i]) for s in steps if s[i]) for i in (0, 1)]
    assert abs(gbusy[0] * 1000 - busy_ps[0]) < 1000 and abs(gbusy[1] * 1000 - busy_ps[1]) < 1000
    assert d["link_stall_ticks"] == 0


@pytest.mark.parametrize("h2d", [True, False], ids=["h2d", "d2h"])
def test_misaligned_host_is_slower(dev, pf, h2d):
    """A host buffer at page offset 64 doubles the payload TLPs: the copy is slower
    by the extra headers' link time, and only by that."""
    lm = LinkModel()
    n = 4 << 20
    res = {}
    for off in (0, 64):
        cq, d, _, rec = aligned_copy(dev, pf, n, h2d, off, 0)
        assert cq.status == HW.TACC_ST_OK
        res[off] = (cq.end - cq.start, rec.tlps,
                    d["h2d_link_bytes"] if h2d else d["d2h_link_bytes"])
    (t0, p0, l0), (t1, p1, l1) = res[0], res[64]
    over = devinfo.LINK_CPL_OVERHEAD if h2d else devinfo.LINK_MWR_OVERHEAD
    assert p0 == n // lm.mps and p1 == 2 * p0
    assert l1 - l0 == (p1 - p0) * over
    extra_ps = lm.copy_ps(n, h2d, host_off=64) - lm.copy_ps(n, h2d)
    assert abs((t1 - t0) * 1000 - extra_ps) < 2000
    assert t1 > t0
