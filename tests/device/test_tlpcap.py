"""TLP capture (hw 1.2, docs/hardware.md section 11): the device records every TLP of
its link model; the records agree exactly with the counters (commands and control
traffic alike) and with the formulas of section 9; filters apply in the device; a full
ring drops and counts."""

import numpy as np
import pytest
from tacc import hw
from tacc.hw.records import d_copy, d_fence
from tacc.model import link as linkmodel
from tacc.pcie import CPLD, F_CTRL, F_UP, MRD, MWR, TLP_DTYPE, summary
from tacc.testing.taccdev import DEVMEM_VA, LinkModel

RING = 1 << 15


def cap_on(dev, pf, size=RING, funcs=0, kinds=0, addr=(0, 0), ctrl_off=False):
    ring, wb = dev.alloc(size * 64), dev.alloc(4096)
    pf.w64(hw.TACC_REG_TLPCAP_BASE, ring)
    pf.w32(hw.TACC_REG_TLPCAP_SIZE, size)
    pf.w64(hw.TACC_REG_TLPCAP_WB, wb)
    pf.w32(hw.TACC_REG_TLPCAP_FUNCS, funcs)
    pf.w32(hw.TACC_REG_TLPCAP_KINDS, kinds)
    pf.w64(hw.TACC_REG_TLPCAP_ADDR_LO, addr[0])
    pf.w64(hw.TACC_REG_TLPCAP_ADDR_HI, addr[1])
    pf.w32(hw.TACC_REG_TLPCAP_CTRL, hw.TACC_TLPCAP_CTRL_ENABLE |
           (hw.TACC_TLPCAP_CTRL_NO_CTRL if ctrl_off else 0))
    return ring, wb


def cap_read(dev, pf, ring, size=RING) -> np.ndarray:
    prod = pf.r32(hw.TACC_REG_TLPCAP_PROD)
    assert prod <= size
    return np.frombuffer(dev.qt.memread(ring, prod * 64), TLP_DTYPE).copy()


def cap_off(pf):
    pf.w32(hw.TACC_REG_TLPCAP_CTRL, 0)


def mixed_job(dev, pf, q=0):
    """COPY_H2D of 100 KiB from host offset 32 (off the RCB and MRRS), COPY_D2H of
    70000 B to host offset 64 from device offset 0, a FENCE to host memory."""
    h1, h2, fence = dev.alloc(200 << 10) + 32, dev.alloc(100 << 10) + 64, dev.alloc(4096)
    descs = [d_copy(hw.TACC_OP_COPY_H2D, h1, DEVMEM_VA, 100 << 10),
             d_copy(hw.TACC_OP_COPY_D2H, DEVMEM_VA + (1 << 20), h2, 70000),
             d_fence(fence, 7)]
    pf.run_job(q, descs)  # warm the TLB
    return descs, (h1, h2, fence)


def test_capture_agrees_with_counters(dev, pf):
    lm = LinkModel()
    pf.trace_enable(size=64, wb=dev.alloc(4096))
    descs, (h1, h2, fence) = mixed_job(dev, pf)
    ring, _ = cap_on(dev, pf)
    c0 = pf.counters()
    pf.run_job(0, descs, tag=0x1234)
    c = {k: v - c0[k] for k, v in pf.counters().items()}
    recs = cap_read(dev, pf, ring)
    cap_off(pf)
    assert pf.r32(hw.TACC_REG_TLPCAP_DROPPED) == 0
    assert list(recs["seq"]) == list(range(len(recs)))
    assert (recs["version"] == hw.TACC_TLP_VERSION).all()
    s = summary(recs)
    # commands: TLP counts, payload, link bytes without the DLLPs
    assert s["h2d_cmd"]["tlps"] == c["h2d_tlps"]
    assert s["d2h_cmd"]["tlps"] == c["d2h_tlps"] + c["d2h_req_tlps"]
    assert s["h2d_cmd"]["payload"] == c["h2d_bytes"] == 100 << 10
    assert s["d2h_cmd"]["payload"] == c["d2h_bytes"] == 70000 + 8
    assert s["h2d_cmd"]["link_bytes"] == c["h2d_link_bytes"] - c["dllp_h2d_bytes"]
    assert s["d2h_cmd"]["link_bytes"] == c["d2h_link_bytes"] - c["dllp_d2h_bytes"]
    # control traffic, counted the same way
    assert s["h2d_ctrl"]["tlps"] == c["ctrl_h2d_tlps"] > 0
    assert s["d2h_ctrl"]["tlps"] == c["ctrl_d2h_tlps"] > 0
    assert s["h2d_ctrl"]["link_bytes"] == c["ctrl_h2d_link_bytes"] - c["ctrl_dllp_h2d_bytes"]
    assert s["d2h_ctrl"]["link_bytes"] == c["ctrl_d2h_link_bytes"] - c["ctrl_dllp_d2h_bytes"]
    # and the formulas of section 9
    cmd = recs[(recs["flags"] & F_CTRL) == 0]
    assert (cmd["cmd_tag"] == 0x1234).all()
    assert (cmd["kind"] == CPLD).sum() == linkmodel.completions(100 << 10, lm.mrrs, lm.rcb, 32)
    assert (cmd["kind"] == MRD).sum() == linkmodel.read_requests(100 << 10, lm.mrrs, 32)
    assert (cmd["kind"] == MWR).sum() == linkmodel.payload_tlps(70000, lm.mps, 64, 0) + 1


def test_records_are_well_formed_tlps(dev, pf):
    lm = LinkModel()
    descs, (h1, h2, fence) = mixed_job(dev, pf)
    ring, _ = cap_on(dev, pf, ctrl_off=True)
    pf.run_job(0, descs)
    recs = cap_read(dev, pf, ring)
    cap_off(pf)
    assert not (recs["flags"] & F_CTRL).any()
    up = (recs["flags"] & F_UP) != 0
    assert (up == (recs["kind"] != CPLD)).all()
    assert set(recs["fmt_type"][recs["kind"] == MRD]) == {hw.TACC_TLP_FMT_MRD64}
    assert set(recs["fmt_type"][recs["kind"] == CPLD]) == {hw.TACC_TLP_FMT_CPLD}
    # the identity-mapped context: bus addresses are the host buffers'
    rd = recs[recs["kind"] == MRD]
    assert rd["addr"][0] == h1 and (rd["payload"] <= lm.mrrs).all()
    assert ((rd["addr"] // 4096) == ((rd["addr"] + rd["payload"] - 1) // 4096)).all()
    assert (rd["tag"] < lm.tags).all()
    assert (rd["len_dw"] == (rd["addr"] % 4 + rd["payload"] + 3) // 4).all()
    # every request's completions: in order, cut at the RCB, byte counts down to the last
    cpl = recs[recs["kind"] == CPLD]
    assert ((cpl["addr"] // lm.rcb) == ((cpl["addr"] + cpl["payload"] - 1) // lm.rcb)).all()
    assert (cpl["lower_addr"] == cpl["addr"] % 128).all()
    i = 0
    for r in rd:
        left = int(r["payload"])
        t0 = None
        while left:
            c = cpl[i]
            assert c["tag"] == r["tag"] and c["byte_count"] == left
            if t0 is None:  # the first completion: read-latency-ns after the request
                t0 = int(c["t_ps"])
                assert t0 - int(r["t_ps"]) == lm.rd_ns * 1000
            left -= int(c["payload"])
            i += 1
    assert i == len(cpl)
    wr = recs[recs["kind"] == MWR]
    assert wr["addr"][0] == h2 and wr["addr"][-1] == fence and wr["payload"][-1] == 8
    assert (np.diff(wr["t_ps"][:-1].astype(np.int64)) > 0).all()
    assert (wr["link_bytes"] == wr["payload"] + linkmodel.LINK_MWR_OVERHEAD).all()


@pytest.mark.parametrize("flt", ["funcs", "kinds", "addr"])
def test_filters_apply_in_the_device(dev, pf, flt):
    descs, (h1, h2, fence) = mixed_job(dev, pf)
    kw = {"funcs": {"funcs": 1 << 1},  # VF 1 only: nothing of the PF
          "kinds": {"kinds": 1 << MWR},
          "addr": {"addr": (h2, h2 + 4096)}}[flt]
    ring, _ = cap_on(dev, pf, **kw)
    pf.run_job(0, descs)
    recs = cap_read(dev, pf, ring)
    cap_off(pf)
    if flt == "funcs":
        assert len(recs) == 0
    elif flt == "kinds":
        assert len(recs) and (recs["kind"] == MWR).all()
    else:
        assert len(recs) and ((recs["addr"] >= h2) & (recs["addr"] < h2 + 4096)).all()
        assert (recs["kind"] == MWR).all()
    assert pf.r32(hw.TACC_REG_TLPCAP_DROPPED) == 0


def test_full_ring_drops_and_counts(dev, pf):
    host = dev.alloc(64 << 10)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA, 64 << 10)])
    ring, wb = cap_on(dev, pf, size=8, ctrl_off=True)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA, 64 << 10)])
    n = 128 + 1024  # requests + completions of 64 KiB
    assert pf.r32(hw.TACC_REG_TLPCAP_PROD) == 8
    assert pf.r32(hw.TACC_REG_TLPCAP_DROPPED) == n - 8
    recs = cap_read(dev, pf, ring, 8)
    assert list(recs["seq"]) == list(range(8))  # never overwritten
    assert tuple(np.frombuffer(dev.qt.memread(wb, 8), "<u4")) == (8, n - 8)
    # consuming frees the ring: the next TLPs are recorded, seq shows the gap
    pf.w32(hw.TACC_REG_TLPCAP_CONS, 8)
    pf.run_job(0, [d_copy(hw.TACC_OP_COPY_H2D, host, DEVMEM_VA, 64)])
    assert pf.r32(hw.TACC_REG_TLPCAP_PROD) == 10
    r = np.frombuffer(dev.qt.memread(ring, 16 * 8), TLP_DTYPE)[:2]
    assert list(r["seq"]) == [n, n + 1] and list(r["kind"]) == [MRD, CPLD]
    cap_off(pf)


def test_capture_registers_pf_only_and_checked(dev, pf):
    (vf,) = dev.enable_vfs(1)
    assert not vf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_TLP_CAPTURE
    assert pf.r32(hw.TACC_REG_CAPS) & hw.TACC_CAP_TLP_CAPTURE
    vf.w32(hw.TACC_REG_TLPCAP_SIZE, 64)
    assert vf.r32(hw.TACC_REG_TLPCAP_SIZE) == 0 and pf.r32(hw.TACC_REG_TLPCAP_SIZE) == 0
    for bad in (0, 3, (1 << 20) + 1):
        pf.w32(hw.TACC_REG_TLPCAP_SIZE, bad)
        assert pf.r32(hw.TACC_REG_TLPCAP_SIZE) == 0
    pf.w32(hw.TACC_REG_TLPCAP_SIZE, 64)
    pf.w32(hw.TACC_REG_TLPCAP_CONS, 5)  # beyond PROD: refused
    assert pf.r32(hw.TACC_REG_TLPCAP_CONS) == 0
    dev.enable_vfs(0)
