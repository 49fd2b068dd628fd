"""Link model fidelity (hw 1.2, docs/hardware.md section 9): data lands at its modelled
time, control traffic is counted and (property link-ctrl-cost, CAPS bit 10) costs link
time, and flow control (tags, posted credits) bounds throughput."""

import subprocess
from contextlib import contextmanager

import pytest
from conftest import map_ctx0
from tacc import hw
from tacc.hw.records import d_copy, desc
from tacc.model import link as linkmodel
from tacc.testing.qtest import QEMU
from tacc.testing.taccdev import CHUNK, DEVMEM_VA, LinkModel, Tacc

OLD, NEW = b"\xaa", b"\x5b"


def test_d2h_data_lands_at_its_modelled_time(dev, pf):
    """A driver that reads a COPY_D2H's destination before the copy's modelled
    completion sees the old bytes: each 64 KiB step's data lands when that step ends,
    the last step's at the completion."""
    lm = LinkModel()
    n = 3 * CHUNK
    host = dev.alloc(n)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, dev.alloc(n), DEVMEM_VA, n)])  # warm TLB
    dev.qt.memwrite(host, NEW * n)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA, n)])  # device: NEW
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])  # warm TLB of host
    dev.qt.memset(host, n, OLD[0])
    _, ds = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])
    t0 = pf.r64(hw.TACC_REG_DEVCLK)
    pf.submit(0, ds)
    step0 = (lm.cmd_ns * 1000 + lm.step_ps(0, CHUNK, False)) // 1000
    dev.qt.clock_step(step0 - 2)  # step 1 still on the link
    assert dev.qt.memread(host, n) == OLD * n
    dev.qt.clock_step(4)  # step 1 ended: its data landed, nothing else
    got = dev.qt.memread(host, n)
    assert got[:CHUNK] == NEW * CHUNK and got[CHUNK:] == OLD * (n - CHUNK)
    end = t0 + lm.copy_ps(n, False) // 1000
    now = pf.r64(hw.TACC_REG_DEVCLK)
    dev.qt.clock_step(end - now - 3)  # all steps done, the posted-write latency left
    got = dev.qt.memread(host, n)
    assert got[:2 * CHUNK] == NEW * 2 * CHUNK and got[2 * CHUNK:] == OLD * CHUNK
    assert not pf.cqes(0)
    dev.qt.clock_step(10**6)
    cq = pf.cqes(0)
    assert cq and cq[0].status == hw.TACC_ST_OK
    assert dev.qt.memread(host, n) == NEW * n
    assert abs((cq[0].end - cq[0].start) * 1000 - lm.copy_ps(n, False)) < 1000


def test_dma_error_mid_copy_lands_only_what_came_before(dev, pf):
    """The injected DMA failure hits the first step's landing: nothing lands, the
    command fails with DMA_ERROR and counts no payload (as before hw 1.2)."""
    n = 2 * CHUNK
    host = dev.alloc(n)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])
    dev.qt.memset(host, n, OLD[0])
    c0 = pf.counters()
    dev.qom_set("x-fi-fail-next-dma", True)
    cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])
    assert cq.status == hw.TACC_ST_DMA_ERROR
    d = {k: v - c0[k] for k, v in pf.counters().items()}
    assert d["dma_errors"] == 1 and d["d2h_bytes"] == 0 and d["d2h_tlps"] == 0
    assert dev.qt.memread(host, n) == OLD * n


def job_ctrl(lm: LinkModel, ndesc: int, trace: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(TLPs, link bytes) per direction of a job's control traffic: each descriptor
    fetch (a 128-byte host read), one CQE (32 B write), and with tracing one 64-byte
    record + 8-byte write-back per command (no MSI-X under qtest: vectors masked)."""
    tl, by = [0, 0], [0, 0]

    def add(kind, n):
        c = linkmodel.link_prefix(kind, n, lm.mps, lm.mrrs, lm.rcb)
        for i in (0, 1):
            tl[i] += c.tlps[i]
            by[i] += c.bytes[i]
    for _ in range(ndesc):
        add("h2d", 128)
        if trace:
            add("d2h", 64)
            add("d2h", 8)
    add("d2h", 32)
    return (tl[0], tl[1]), (by[0], by[1])


@pytest.mark.parametrize("trace", [False, True], ids=["untraced", "traced"])
def test_control_traffic_counted_exactly(dev, pf, trace):
    lm = LinkModel()
    if trace:
        pf.trace_enable(size=64, wb=dev.alloc(4096))
    c0 = pf.counters()
    g0 = pf.gcnt("link_h2d_bytes"), pf.gcnt("link_d2h_bytes")
    pf.run_job(1, [desc(hw.TACC_OP_NOP)] * 5)
    d = {k: v - c0[k] for k, v in pf.counters().items()}
    tl, by = job_ctrl(lm, 5, trace)
    assert (d["ctrl_h2d_tlps"], d["ctrl_d2h_tlps"]) == tl == (5 * 2, 5 * (1 + 2 * trace) + 1)
    assert (d["ctrl_h2d_link_bytes"], d["ctrl_d2h_link_bytes"]) == by
    # the global link bytes count control traffic too; NOPs carry no payload
    assert (pf.gcnt("link_h2d_bytes") - g0[0], pf.gcnt("link_d2h_bytes") - g0[1]) == by
    assert d["h2d_link_bytes"] == d["d2h_link_bytes"] == 0


@contextmanager
def own_device(props: str):
    """A QEMU of its own with extra properties: (device, PF after reset, ctx 0 mapped)."""
    d = Tacc("sriov-max-vfs=0," + props)
    try:
        root = map_ctx0(d)
        d.pf.reset()
        d.pf.set_ptbr(0, root)
        yield d, d.pf
    finally:
        d.close()


def traced_nops_during_d2h(props: str) -> tuple[int, int, dict[str, int]]:
    """A 4 MiB COPY_D2H on queue 0 while queue 1 runs 64 traced NOPs: (copy duration
    ticks, CAPS, counter deltas)."""
    with own_device(props) as (d, pf):
        n = 4 << 20
        host = d.alloc(n)
        pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])  # warm TLB
        pf.trace_enable(size=256, wb=d.alloc(4096))
        c0 = pf.counters()
        _, copy = pf.job_of(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])
        _, nops = pf.job_of(1, [desc(hw.TACC_OP_NOP)] * 64)
        pf.submit(0, copy)
        pf.submit(1, nops)
        d.qt.clock_step(10**9)
        cq = pf.cqes(0)[0]
        assert cq.status == hw.TACC_ST_OK and len(pf.cqes(1)) == 1
        return (cq.end - cq.start, pf.r32(hw.TACC_REG_CAPS),
                {k: v - c0[k] for k, v in pf.counters().items()})


def test_link_ctrl_cost_property_observer_effect():
    """link-ctrl-cost (on by default, CAPS bit 10): the trace records of other queues'
    commands take upstream link time, so a concurrent COPY_D2H is slower by at most
    their link time; off, the copy takes its uncontended time.  Counted alike."""
    lm = LinkModel()
    on_t, on_caps, on_d = traced_nops_during_d2h("")
    off_t, off_caps, off_d = traced_nops_during_d2h("link-ctrl-cost=off")
    assert on_caps & hw.TACC_CAP_LINK_CTRL_COST and not off_caps & hw.TACC_CAP_LINK_CTRL_COST
    assert abs(off_t * 1000 - lm.copy_ps(4 << 20, False)) < 1000
    keys = ("ctrl_h2d_tlps", "ctrl_d2h_tlps", "ctrl_h2d_link_bytes", "ctrl_d2h_link_bytes",
            "d2h_link_bytes", "d2h_tlps")
    assert {k: on_d[k] for k in keys} == {k: off_d[k] for k in keys}
    # 64 records + 64 write-backs + the NOP job's requests and CQE share the upstream
    extra_ps = on_t * 1000 - off_t * 1000
    assert 0 < extra_ps <= lm.t_link_ps(on_d["ctrl_d2h_link_bytes"]) + 64 * 3 * 1000


# the credit loop of a posted write at Gen4 x16, MPS 256 (docs/hardware.md section 9):
# write latency + one UpdateFC per 4 TLPs (their link time) + the UpdateFC's own time
LOOP4_NS = 200 + (4 * linkmodel.t_link_ps(256 + 24, 4, 16) + linkmodel.t_link_ps(8, 4, 16)) / 1000


@pytest.mark.parametrize("h2d,props,bound_gbps", [
    (True, "link-gen=5,tags=8", 8 * 512 / 600),  # 8 tags x MRRS per read latency
    (False, "posted-credits=16", 16 * 16 / LOOP4_NS),  # 256 B of data credits per loop
    (False, "posted-hdr-credits=4", 4 * 256 / LOOP4_NS),  # 4 headers per loop
])
def test_flow_control_bounds_throughput(h2d, props, bound_gbps):
    """Tags bound a host read, the root port's posted header and data credits (returned
    one credit loop later, by UpdateFC every 4 TLPs) a host write: the copy takes the
    formula's time exactly and runs at the bound's rate."""
    with own_device(props) as (d, pf):
        lm = LinkModel(gen=5 if "gen=5" in props else 4, tags=8 if h2d else 32,
                       posted_credits=16 if "posted-credits" in props else 1024,
                       posted_hdr_credits=4 if "hdr" in props else 64)
        n = 1 << 20
        host = d.alloc(n)
        op = hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H
        src, dst = (host, DEVMEM_VA) if h2d else (DEVMEM_VA, host)
        pf.run_job(0, [d_copy(op, src, dst, n)])
        cq = pf.run_job(0, [d_copy(op, src, dst, n)])
        dur_ps = (cq.end - cq.start) * 1000
        assert abs(dur_ps - lm.copy_ps(n, h2d)) < 1000
        # the flow-control bound, not the link, sets the time: within 1 % of it
        link_ps = (lm.cmd_ns + (lm.rd_ns if h2d else lm.wr_ns)) * 1000
        bw = n / ((dur_ps - link_ps) * 1e-3)  # bytes per ns = GB/s
        assert bw == pytest.approx(bound_gbps, rel=0.01)
        assert bw < 0.5 * linkmodel.link_raw_bw(lm.gen, 16) / 1e9


@pytest.mark.parametrize("mps", [128, 256])
def test_posted_credits_burst_after_idle(mps):
    """A full credit pool lets a burst go at link rate: after idle, a host write of
    at most posted-hdr-credits TLPs pays no credit wait; a longer one runs at the
    pool's rate (posted-hdr-credits TLPs per credit loop), exactly as the formula
    says."""
    ph = 8
    with own_device(f"mps={mps},posted-hdr-credits={ph}") as (d, pf):
        lm = LinkModel(mps=mps, posted_hdr_credits=ph)
        free = LinkModel(mps=mps, posted_hdr_credits=1 << 16)
        host = d.alloc(1 << 16)
        for n in (ph * mps, 4 * ph * mps):
            pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])  # TLB
            d.qt.clock_step(10**5)  # idle: every credit back
            cq = pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])
            dur_ps = (cq.end - cq.start) * 1000
            assert abs(dur_ps - lm.copy_ps(n, False)) < 1000, n
            if n <= ph * mps:
                assert lm.copy_ps(n, False) == free.copy_ps(n, False)
            else:
                assert lm.copy_ps(n, False) > free.copy_ps(n, False) + 100_000


@pytest.mark.parametrize("bad,msg", [("rcb=96", "rcb must be 64 or 128"),
                                     ("tags=0", "tags must be"),
                                     ("posted-credits=0", "posted-credits 1..65536"),
                                     ("posted-hdr-credits=0", "posted-hdr-credits 1..4096")])
def test_bad_link_properties_refused(bad, msg):
    """QEMU refuses to create the device, naming the property (one line, exit 1)."""
    r = subprocess.run([str(QEMU), "-machine", "q35", "-accel", "qtest", "-display", "none",
                        "-nodefaults", "-L", "/usr/share/seabios", "-L", "/usr/share/qemu",
                        "-device", "tacc," + bad], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and msg in r.stderr, r.stderr


DEVCTL = 0x08  # PCIe capability: Device Control (MPS [7:5], MRRS [14:12])


def _devctl(dev: Tacc, mps: int, mrrs: int) -> int:
    """Program the PF's Device Control as an OS does (Linux's pcie_set_mps /
    pcie_set_readrq); returns what reads back."""
    cap = dev.qt.find_cap(dev.bus, dev.pf.devfn, 0x10)
    v = dev.qt.cfg_read(dev.bus, dev.pf.devfn, cap + DEVCTL, 2) & ~(7 << 5 | 7 << 12)
    v |= ((mps.bit_length() - 8) << 5) | ((mrrs.bit_length() - 8) << 12)
    dev.qt.cfg_write(dev.bus, dev.pf.devfn, cap + DEVCTL, v, 2)
    return dev.qt.cfg_read(dev.bus, dev.pf.devfn, cap + DEVCTL, 2)


def test_mps_and_mrrs_follow_device_control():
    """The link model cuts TLPs at the Max_Payload_Size and Max_Read_Request_Size the OS
    programmed in Device Control, up to what the device supports (the properties, which
    are also the power-on presets).  Before: QEMU left DevCtl's MPS/MRRS fields
    read-only, so Linux's "Max Payload Size set to 128 (was 256, max 256)" (the q35
    root port supports 128) did not stick and the device kept sending 256-byte writes
    to a 128-byte root port."""
    with own_device("mps=256,mrrs=512") as (d, pf):
        n = 64 << 10
        host = d.alloc(n)
        assert pf.r32(hw.TACC_REG_LINK_PARAMS) == 256 | 512 << 16
        back = _devctl(d, 128, 256)
        assert (back >> 5 & 7, back >> 12 & 7) == (0, 1), hex(back)
        assert pf.r32(hw.TACC_REG_LINK_PARAMS) == 128 | 256 << 16
        pf.run_job(0, [d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA, host, n)])  # warm TLB
        lm = LinkModel(mps=128, mrrs=256)
        for h2d, key, want in ((False, "d2h_tlps", linkmodel.payload_tlps(n, 128)),
                               (True, "d2h_req_tlps", linkmodel.read_requests(n, 256))):
            c0 = pf.counters()
            op = hw.TACC_OP_COPY_H2D if h2d else hw.TACC_OP_COPY_D2H
            src, dst = (host, DEVMEM_VA) if h2d else (DEVMEM_VA, host)
            cq = pf.run_job(0, [d_copy(op, src, dst, n)])
            assert cq.status == hw.TACC_ST_OK
            assert pf.counters()[key] - c0[key] == want == n // (128 if not h2d else 256)
            assert abs((cq.end - cq.start) * 1000 - lm.copy_ps(n, h2d)) < 1000
        # above what the device supports: the device's limits (a guest error logged)
        _devctl(d, 512, 4096)
        assert pf.r32(hw.TACC_REG_LINK_PARAMS) == 256 | 512 << 16
