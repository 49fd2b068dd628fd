"""Host-address alignment in the link model: payload TLPs are split at MPS
boundaries of the device-side AND the host-side address (docs/hardware.md
section 9, "PCIe link").  Counters, the trace record and the modelled duration
must follow tacc.model.link's formula exactly."""

import pytest
from tacc import hw
from tacc.hw.records import d_copy
from tacc.model import link as linkmodel
from tacc.testing.taccdev import CHUNK, DEVMEM_VA, LinkModel

SIZES = [64 << 10, 1 << 20, 4096 + 100]
# (host-side offset, device-side offset): aligned, host misaligned by 64 relative
# to the device side, both misaligned by the same 64 B, device side misaligned
OFFSETS = [(0, 0), (64, 0), (64, 64), (0, 64)]


def aligned_copy(dev, pf, n, h2d, host_off, dev_off, q=0):
    """One COPY_H2D / COPY_D2H of n bytes (TLB warmed first); returns the CQE, the
    counter deltas, the link busy deltas (ticks) and the command's trace record."""
    host = dev.alloc(n + 4096) + host_off
    dva = DEVMEM_VA + 0x20_0000 + dev_off
    op = hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H
    src, dst = (host, dva) if h2d else (dva, host)
    pf.run_job(q, [d_copy(op, src, dst, n)])  # warm the TLB
    pf.trace_enable(size=16)  # PROD restarts at 0 only when tracing was off
    p0 = pf.r32(hw.TACC_REG_TRACE_PROD)
    pf.w32(hw.TACC_REG_TRACE_CONS, p0)
    c0 = pf.counters()
    g0 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    cq = pf.run_job(q, [d_copy(op, src, dst, n)])
    c1 = pf.counters()
    g1 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    assert pf.r32(hw.TACC_REG_TRACE_PROD) == p0 + 1
    rec = pf.trace_read(p0, p0 + 1, 16)[0]
    return cq, {k: c1[k] - c0[k] for k in c1}, (g1[0] - g0[0], g1[1] - g0[1]), rec


@pytest.mark.parametrize("h2d", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("host_off,dev_off", OFFSETS, ids=[f"h{h}-d{d}" for h, d in OFFSETS])
@pytest.mark.parametrize("n", SIZES)
def test_misaligned_copy(dev, pf, n, h2d, host_off, dev_off):
    lm = LinkModel()
    cq, d, gbusy, rec = aligned_copy(dev, pf, n, h2d, host_off, dev_off)
    assert cq.status == hw.TACC_ST_OK
    assert d["tlb_walk_reads"] == 0
    c = lm.prefix(n, h2d, host_off, dev_off)
    if h2d:
        # completions: cut at the root port's RCB of the host address and at request
        # boundaries (MRRS from the start, 4 KiB of the host address); the device side
        # does not matter
        tlps = linkmodel.completions(n, lm.mrrs, lm.rcb, host_off)
        reqs = linkmodel.read_requests(n, lm.mrrs, host_off)
        assert reqs == -(-n // lm.mrrs) + (
            0 if host_off % lm.mrrs == 0 else (host_off % 4096 + n - 1) // 4096)
        assert c.tlps == (tlps, reqs)
        assert tlps == -(-n // lm.rcb) + (
            0 if host_off % lm.rcb == 0 else 1 + (n - 1) // lm.mrrs)
    else:
        tlps = linkmodel.payload_tlps(n, lm.mps, host_off=host_off, dev_off=dev_off)
        aligned = -(-n // lm.mps)
        if host_off % lm.mps == dev_off % lm.mps:
            assert tlps - aligned in ((0,) if host_off == 0 else (0, 1))
        else:
            assert tlps > 1.9 * aligned  # every MPS block is cut in two
        assert c.tlps == (0, tlps)
    # TLPs: counters and the trace record
    assert rec.opcode == (hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H)
    assert rec.bytes == n and rec.tlps == tlps
    assert d["h2d_tlps"] == (tlps if h2d else 0) and d["d2h_tlps"] == (0 if h2d else tlps)
    assert d["d2h_req_tlps"] == c.tlps[1] if h2d else d["d2h_req_tlps"] == 0
    assert (d["h2d_link_bytes"], d["d2h_link_bytes"]) == c.bytes
    assert (d["dllp_h2d_bytes"], d["dllp_d2h_bytes"]) == tuple(8 * x for x in c.dllp)
    over = (linkmodel.LINK_CPL_OVERHEAD if h2d else linkmodel.LINK_MWR_OVERHEAD) * tlps
    assert c.bytes[0 if h2d else 1] == n + over + 8 * c.dllp[0 if h2d else 1]
    # the modelled duration: the 64 KiB link steps with their share of the TLPs
    dur_ps = (cq.end - cq.start) * 1000
    assert abs(dur_ps - lm.copy_ps(n, h2d, host_off=host_off, dev_off=dev_off)) < 1000
    assert (rec.t_end - rec.t_start) == cq.end - cq.start
    # link occupancy per direction: the sum of the steps' t_link (ticks, floored once)
    # and the job's control traffic (link-ctrl-cost on)
    steps = [lm.step_bytes(a, min(CHUNK, n - a), h2d, host_off, dev_off)
             for a in range(0, n, CHUNK)]
    assert tuple(sum(s[i] for s in steps) for i in (0, 1)) == c.bytes
    for i, ctrl in enumerate(("ctrl_h2d_link_bytes", "ctrl_d2h_link_bytes")):
        busy_ps = sum(lm.t_link_ps(s[i]) for s in steps if s[i]) + lm.t_link_ps(d[ctrl])
        assert abs(gbusy[i] * 1000 - busy_ps) < 1000 + 8
    assert d["link_stall_ticks"] == 0


@pytest.mark.parametrize("h2d", [True, False], ids=["h2d", "d2h"])
def test_misaligned_host_is_slower(dev, pf, h2d):
    """A host buffer at page offset 64 adds TLPs: H2D one completion per read request
    (a request's end no longer falls on an RCB boundary), D2H doubles the memory writes.
    The copy is slower by the extra headers' (and DLLPs') link time, and only by that."""
    lm = LinkModel()
    n = 4 << 20
    res = {}
    mis = 32 if h2d else 64  # H2D: RCB (64 B) misaligned; D2H: MPS misaligned
    for off in (0, mis):
        cq, d, _, rec = aligned_copy(dev, pf, n, h2d, off, 0)
        assert cq.status == hw.TACC_ST_OK
        res[off] = (cq.end - cq.start, rec.tlps,
                    d["h2d_link_bytes"] if h2d else d["d2h_link_bytes"])
    (t0, p0, l0), (t1, p1, l1) = res[0], res[mis]
    c0, c1 = lm.prefix(n, h2d), lm.prefix(n, h2d, host_off=mis)
    if h2d:
        assert p0 == n // lm.rcb and p1 == p0 + n // lm.mrrs
    else:
        assert p0 == n // lm.mps and p1 == 2 * p0
    i = 0 if h2d else 1
    assert (l0, l1) == (c0.bytes[i], c1.bytes[i])
    extra_ps = lm.copy_ps(n, h2d, host_off=mis) - lm.copy_ps(n, h2d)
    assert abs((t1 - t0) * 1000 - extra_ps) < 2000
    assert t1 > t0
