"""The timing model: link formula, both directions, compute, contention."""

import pytest
from conftest import map_ctx0
from tacc import hw
from tacc.hw.records import d_copy
from tacc.model import link as linkmodel
from tacc.testing.taccdev import DEVMEM_VA, LinkModel, Tacc

SIZES = [64, 256, 4096, 65536, 1 << 20, 8 << 20]


def timed_copy(dev, pf, n, h2d, q=0):
    host = dev.alloc(max(n, 4096))
    op = hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H
    src, dst = (host, DEVMEM_VA) if h2d else (DEVMEM_VA, host)
    pf.run_job(q, [d_copy(op, src, dst, n)])  # warm the TLB
    c0 = pf.counters()
    g0 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    cq = pf.run_job(q, [d_copy(op, src, dst, n)])
    c1 = pf.counters()
    g1 = pf.gcnt("link_h2d_busy_ticks"), pf.gcnt("link_d2h_busy_ticks")
    d = {k: c1[k] - c0[k] for k in c1}
    return cq, d, (g1[0] - g0[0], g1[1] - g0[1])


@pytest.mark.parametrize("h2d", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("n", SIZES)
def test_link_formula(dev, pf, n, h2d):
    lm = LinkModel()
    cq, d, gbusy = timed_copy(dev, pf, n, h2d)
    assert cq.status == hw.TACC_ST_OK
    assert d["tlb_walk_reads"] == 0 and d["tlb_misses"] == 0
    assert d["tlb_hits"] >= 2
    dur = cq.end - cq.start
    want_ps = lm.copy_ps(n, h2d)
    assert abs(dur * 1000 - want_ps) < 1000  # exact up to tick rounding
    # modelled bandwidth from the counters and timestamps vs the closed formula: 1 %
    payload = d["h2d_bytes"] if h2d else d["d2h_bytes"]
    assert payload == n
    bw = payload / (dur * 1e-9)
    assert bw == pytest.approx(lm.formula_bw(n, h2d), rel=0.01)
    c = lm.prefix(n, h2d)
    assert (d["h2d_link_bytes"], d["d2h_link_bytes"]) == c.bytes
    assert (d["dllp_h2d_bytes"], d["dllp_d2h_bytes"]) == tuple(8 * x for x in c.dllp)
    if h2d:
        assert d["h2d_tlps"] == c.tlps[0] and d["d2h_req_tlps"] == c.tlps[1]
        # the link's busy time: the copy's steps and the job's control traffic
        # (descriptor fetch, CQE, MSI-X: link-ctrl-cost is on by default)
        busy = lm.t_link_ps(c.bytes[0] + d["ctrl_h2d_link_bytes"])
        assert abs(gbusy[0] * 1000 - busy) <= 1000 + 1000 * -(-n // (64 << 10)) + 8
        assert abs(d["busy_dma_h2d"] - dur) <= 1
    else:
        assert d["d2h_tlps"] == c.tlps[1]
        assert abs(d["busy_dma_d2h"] - dur) <= 1
    assert d["link_stall_ticks"] == 0


def test_small_size_collapse(dev, pf):
    lm = LinkModel()
    bws = [lm.formula_bw(n, True) for n in (64, 4096, 1 << 20, 64 << 20)]
    # large copies approach the modelled maximum: 64 B completions (RCB), their headers
    # and the DLLPs leave about 76 % of the raw link (docs/hardware.md section 9)
    mx = linkmodel.link_max_payload_bw(lm.gen, lm.width, lm.mps, "h2d")
    assert bws[0] < 0.01 * lm.bw and 0.99 * mx < bws[-1] < mx < 0.8 * lm.bw
    assert bws == sorted(bws)


def test_directions_independent_and_shared(dev, pf):
    """H2D and D2H overlap (independent directions); two H2D queues serialize
    on the single H2D engine; H2D read requests share the upstream direction."""
    lm = LinkModel()
    n = 4 << 20
    a, b = dev.alloc(n), dev.alloc(n)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, n)])
    pf.run_job(1, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + n, b, n)])
    j0, d0 = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA, n)])
    j1, d1 = pf.job_of(1, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + n, b, n)])
    s0 = pf.cnt("link_stall_ticks")
    pf.submit(0, d0)
    pf.submit(1, d1)
    dev.qt.clock_step(10**9)
    c0, c1 = pf.cqes(0)[0], pf.cqes(1)[0]
    assert c0.start == c1.start
    t_h2d, t_d2h = (c0.end - c0.start) * 1000, (c1.end - c1.start) * 1000
    assert lm.copy_ps(n, True) <= t_h2d < 1.10 * lm.copy_ps(n, True)
    assert lm.copy_ps(n, False) <= t_d2h < 1.10 * lm.copy_ps(n, False)
    assert pf.cnt("link_stall_ticks") > s0  # they did contend for the upstream direction
    # two H2D copies on two queues: one engine, back to back
    jobs = [pf.job_of(q, [d_copy(hw.TACC_OP_COPY_H2D, a, DEVMEM_VA + q * n, n)]) for q in (2, 3)]
    for q, (_, ds) in zip((2, 3), jobs, strict=False):
        pf.submit(q, ds)
    dev.qt.clock_step(10**9)
    e2, e3 = pf.cqes(2)[0], pf.cqes(3)[0]
    assert e3.start == e2.end or e2.start == e3.end


@pytest.mark.parametrize("gen,width", [(3, 8), (5, 4)])
def test_link_gen_width(gen, width):
    d = Tacc(f"link-gen={gen},link-width={width},sriov-max-vfs=0,mps=128,mrrs=256")
    try:
        root = map_ctx0(d)
        pf = d.pf
        pf.reset()
        pf.set_ptbr(0, root)
        assert pf.r32(hw.TACC_REG_LINK_STATUS) == gen | width << 4
        lm = LinkModel(gen=gen, width=width, mps=128, mrrs=256)
        for n in (100, 1 << 20):
            cq, dd, _ = timed_copy(d, pf, n, True)
            assert abs((cq.end - cq.start) * 1000 - lm.copy_ps(n, True)) < 1000
            assert dd["h2d_tlps"] == -(-n // 64)  # completions: the root port's 64 B RCB
        exp = d.qt.find_cap(0, 0x08, 0x10)
        lnk = d.qt.cfg_read(0, 0x08, exp + 0x12, 2)
        assert lnk & 0xF == {3: 3, 5: 5}[gen] and (lnk >> 4) & 0x3F == width
    finally:
        d.close()


def test_time_scale():
    d = Tacc("time-scale=2500,sriov-max-vfs=0")
    try:
        root = map_ctx0(d)
        d.pf.reset()
        d.pf.set_ptbr(0, root)
        n = 1 << 20
        cq, _, _ = timed_copy(d, d.pf, n, True)
        assert abs((cq.end - cq.start) * 1000 - 2.5 * LinkModel().copy_ps(n, True)) < 20_000
    finally:
        d.close()


def test_time_scale_settable_at_run_time(dev, pf):
    """qom-set time-scale stretches later commands by time-scale/1000; the register
    follows; bad values are refused and change nothing."""
    lm = LinkModel()
    n = 1 << 20
    cq, _, _ = timed_copy(dev, pf, n, True)
    base = cq.end - cq.start
    assert abs(base * 1000 - lm.copy_ps(n, True)) < 1000
    try:
        dev.qom_set("time-scale", 4000)
        assert dev.qom_get("time-scale") == 4000
        assert pf.r32(hw.TACC_REG_TIME_SCALE) == 4000
        cq, _, _ = timed_copy(dev, pf, n, True)
        assert abs((cq.end - cq.start) - 4 * base) <= 4
        for bad in (0, 10_000_001):
            with pytest.raises(Exception, match="time-scale"):
                dev.qom_set("time-scale", bad)
        assert dev.qom_get("time-scale") == 4000
    finally:
        dev.qom_set("time-scale", 1000)
    cq, _, _ = timed_copy(dev, pf, n, True)
    assert cq.end - cq.start == base
