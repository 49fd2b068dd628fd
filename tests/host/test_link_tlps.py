"""TLP counts of the link model against brute-force walks (devinfo, hw 1.2).

docs/hardware.md section 9, "PCIe link": a host write (D2H) is cut at every x where the
device-side address d + x or the host-side address h + x is a multiple of MPS; a host
read (H2D) is issued as read requests of MRRS bytes from the transfer's start that never
cross a 4 KiB boundary of the host address, and the root port returns each request in
completions cut at its Read Completion Boundary.  The closed forms in
tacc.model.link (and tacc-model.c, tests/device/test_link_align.py) must equal the
brute-force counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.model import link as linkmodel
from tacc.testing.taccdev import CHUNK, LinkModel

MPS = st.sampled_from([128, 256, 512])


def brute_pieces(n: int, mps: int, h: int, d: int) -> int:
    """Walk the transfer byte by byte: a piece ends where either address is aligned."""
    if n == 0:
        return 0
    return 1 + sum(1 for x in range(1, n) if (d + x) % mps == 0 or (h + x) % mps == 0)


def brute_bursts(n: int, mps: int, h: int, d: int) -> int:
    """The DMA engine as the documentation describes it: bursts of at most MPS bytes
    that never cross an MPS boundary of the device address, each burst split again at
    MPS boundaries of the host address."""
    tlps, x = 0, 0
    while x < n:
        burst = min(n - x, mps - (d + x) % mps)
        y = x
        while y < x + burst:
            piece = min(x + burst - y, mps - (h + y) % mps)
            tlps += 1
            y += piece
        x += burst
    return tlps


@settings(max_examples=400, deadline=None)
@given(n=st.integers(0, 5000), mps=MPS, h=st.integers(0, 1 << 20), d=st.integers(0, 1 << 20))
def test_payload_tlps_is_the_number_of_pieces(n, mps, h, d):
    want = brute_pieces(n, mps, h % mps, d % mps)
    assert linkmodel.payload_tlps(n, mps, host_off=h, dev_off=d) == want
    assert brute_bursts(n, mps, h, d) == want
    # only the offsets modulo MPS matter, and the two sides play symmetric roles
    assert linkmodel.payload_tlps(n, mps, h % mps, d % mps) == want
    assert linkmodel.payload_tlps(n, mps, d, h) == want


def brute_requests(n: int, mrrs: int, h: int) -> list[tuple[int, int]]:
    """The read requests as the DMA engine issues them: the transfer's MRRS-sized pieces
    (from its start), each split where it would cross a 4 KiB boundary of the host
    address."""
    reqs, x = [], 0
    while x < n:
        ln = min(n - x, mrrs - x % mrrs, 4096 - (h + x) % 4096)
        reqs.append((x, ln))
        x += ln
    return reqs


def brute_completions(n: int, mrrs: int, rcb: int, h: int) -> int:
    """Each request's data returned in completions ending at RCB-aligned host addresses."""
    cpl = 0
    for x, ln in brute_requests(n, mrrs, h):
        y = x
        while y < x + ln:
            y += min(x + ln - y, rcb - (h + y) % rcb)
            cpl += 1
    return cpl


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 20000), mrrs=st.sampled_from([128, 256, 512, 1024, 4096]),
       rcb=st.sampled_from([64, 128]), h=st.integers(0, 1 << 20))
def test_requests_and_completions_brute_force(n, mrrs, rcb, h):
    reqs = brute_requests(n, mrrs, h)
    assert linkmodel.read_requests(n, mrrs, h) == len(reqs)
    assert all(ln <= mrrs and (h + x) // 4096 == (h + x + ln - 1) // 4096 for x, ln in reqs)
    assert linkmodel.completions(n, mrrs, rcb, h) == brute_completions(n, mrrs, rcb, h)
    # only the host offset modulo 4 KiB matters (requests), modulo RCB (completions)
    assert linkmodel.read_requests(n, mrrs, h % 4096) == len(reqs)
    assert linkmodel.completions(n, mrrs, rcb, h % rcb) == linkmodel.completions(n, mrrs, rcb, h)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1 << 24), mps=MPS, h=st.integers(0, 4095), d=st.integers(0, 4095))
def test_payload_tlps_bounds(n, mps, h, d):
    aligned = -(-n // mps)
    assert linkmodel.payload_tlps(n, mps) == aligned
    assert linkmodel.payload_tlps(n, mps, h, h) in (aligned, aligned + 1)
    t = linkmodel.payload_tlps(n, mps, h, d)
    assert aligned <= t <= 2 * aligned + 1
    # each extra write TLP costs exactly its header (and its share of the DLLPs)
    up, wr = linkmodel.d2h_link_bytes(n, mps, h, d)
    assert wr == t and up == n + t * linkmodel.LINK_MWR_OVERHEAD
    c = linkmodel.link_prefix("d2h", n, mps, host_off=h, dev_off=d)
    assert c.dllp == (-(-t // 4) * 2, 0) and c.bytes == (8 * c.dllp[0], up)
    # host reads: the device side does not matter
    down, upr, cpl = linkmodel.h2d_link_bytes(n, mps, 512, h, d)
    assert (down, upr, cpl) == linkmodel.h2d_link_bytes(n, mps, 512, h, 0)
    req = linkmodel.read_requests(n, 512, h)
    assert cpl == linkmodel.completions(n, 512, 64, h)
    assert down == n + cpl * linkmodel.LINK_CPL_OVERHEAD + 8 * 2 * -(-req // 4)
    assert upr == req * linkmodel.LINK_MRD_BYTES + 8 * -(-cpl // 4)


@settings(max_examples=100, deadline=None)
@given(n=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=20), mps=MPS)
def test_payload_tlps_array_matches_scalar(n, mps):
    arr = np.array(n, np.int64)
    assert list(linkmodel.payload_tlps(arr, mps)) == [linkmodel.payload_tlps(x, mps) for x in n]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5 * CHUNK + 999), h=st.integers(0, 4095), d=st.integers(0, 4095),
       h2d=st.booleans())
def test_link_steps_add_up(n, h, d, h2d):
    """The 64 KiB link steps carry exactly the transfer's TLPs and DLLPs (no extra cut at
    a step boundary), so their link bytes add up to the whole transfer's."""
    lm = LinkModel()
    down = up = 0
    for a in range(0, n, CHUNK):
        sd, su = lm.step_bytes(a, min(CHUNK, n - a), h2d, h, d)
        down, up = down + sd, up + su
    assert (down, up) == lm.prefix(n, h2d, h, d).bytes


def test_worked_example():
    """docs/hardware.md section 9: 4096 + 100 bytes, MPS 256, MRRS 512, RCB 64."""
    assert linkmodel.payload_tlps(4196, 256) == 17
    assert linkmodel.payload_tlps(4196, 256, host_off=64) == 33
    assert linkmodel.payload_tlps(4196, 256, host_off=64, dev_off=64) == 17
    # reads: aligned 9 requests (8 x 512 + 100), 66 completions (65 x 64 + 36)
    assert linkmodel.read_requests(4196, 512) == 9
    assert linkmodel.completions(4196, 512, 64) == 66
    # at host offset 32: 4 KiB cut at 4064 adds a request; every request ends mid-RCB
    assert linkmodel.read_requests(4196, 512, 32) == 10
    assert linkmodel.completions(4196, 512, 64, 32) == 1 + (32 + 4195) // 64 + 4195 // 512
    assert linkmodel.h2d_link_bytes(4196, 256, 512) == (
        4196 + 66 * 20 + 8 * (3 + 3), 9 * 24 + 8 * 17, 66)


def brute_posted_bound(steps: list[tuple[int, int, int]], loop: int, pool: int) -> list[int]:
    """The credit-rate rule of docs/hardware.md section 9 written out with exact
    fractions: a pool of ``pool`` credits returns ``pool`` credits per ``loop`` ps, so a
    step that takes ``n`` credits at time ``t`` ends no earlier than its theoretical
    return time minus one loop (``steps``: (t, n, 0) tuples)."""
    from fractions import Fraction
    tat, out = Fraction(0), []
    for t, n, _ in steps:
        tat = max(tat, Fraction(t)) + Fraction(n * loop, pool)
        out.append(max(0, -(-tat.numerator // tat.denominator) - loop))
    return out


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 10**7), st.integers(1, 4096), st.just(0)),
                      min_size=1, max_size=12),
       loop=st.integers(1, 10**6), pool=st.integers(1, 4096))
def test_posted_credit_rule_exact(steps, loop, pool):
    """linkmodel.PostedPool (the C model's tacc_link_posted) is the fraction-exact rule."""
    steps = sorted(steps)
    pp = linkmodel.PostedPool(loop, pool)
    assert [pp.take(t, n) for t, n, _ in steps] == brute_posted_bound(steps, loop, pool)


@pytest.mark.parametrize("gen,mps,ph,pd", [(4, 256, 64, 1024), (5, 128, 64, 1024),
                                           (4, 256, 4, 1024), (3, 256, 64, 16),
                                           (5, 256, 16, 256)])
def test_posted_credits_steady_rate(gen, mps, ph, pd):
    """A long host write runs at the smallest of the link's payload rate, ph TLPs and
    pd * 16 bytes per credit loop (write latency + 4 TLPs' link time for the UpdateFC
    cadence + the UpdateFC DLLP), within 0.5 %; a burst that fits the pool is free."""
    lm = LinkModel(gen=gen, mps=mps, posted_hdr_credits=ph, posted_credits=pd)
    loop = linkmodel.fc_loop_ps(gen, 16, mps, lm.wr_ns)
    assert loop == lm.wr_ns * 1000 + 4 * linkmodel.t_link_ps(mps + 24, gen, 16) + \
        linkmodel.t_link_ps(8, gen, 16)
    n = 64 << 20
    link_bw = n / (linkmodel.copy_link_ps("d2h", n, gen, 16, mps, posted_hdr_credits=1 << 20,
                                        posted_credits=1 << 20) * 1e-12)
    want = min(link_bw, ph * mps / (loop * 1e-12), pd * 16 / (loop * 1e-12))
    got = n / (lm.copy_ps(n, False) * 1e-12 - (lm.cmd_ns + lm.wr_ns) * 1e-9)
    assert got == pytest.approx(want, rel=0.005)
    assert linkmodel.link_max_payload_bw(gen, 16, mps, "d2h", posted_hdr_credits=ph,
                                       posted_credits=pd) == pytest.approx(want, rel=0.005)
    small = min(ph, pd * 16 // mps) * mps
    assert linkmodel.copy_link_ps("d2h", small, gen, 16, mps, posted_hdr_credits=ph,
                                posted_credits=pd) == linkmodel.copy_link_ps(
        "d2h", small, gen, 16, mps, posted_hdr_credits=1 << 20, posted_credits=1 << 20)


# Measured on real hardware, large pinned copies (table; tools/bench/bench_link.py
# REFERENCE): (gen, dir, mps, GB/s).  The P100 host's D2H is what 128-byte write TLPs give
# (docs/hardware.md section 9, "Against real hardware"); with 256-byte TLPs the model is
# 11 % above it.
REFERENCE = [(4, "h2d", 256, 25.13e9), (3, "h2d", 256, 12.15e9), (3, "d2h", 128, 12.89e9)]


def test_reference_table_error():
    """The model against the issue's reference table: every row within 10 % for copies
    of 1 MiB and more , the D2H row with the host's 128-byte MPS; with
    MPS 256 that row is +11 % (the figure docs/hardware.md reports)."""
    for gen, dirn, mps, real in REFERENCE:
        lm = LinkModel(gen=gen, mps=mps)
        for n in (1 << 20, 32 << 20, 512 << 20):
            got = n / (lm.copy_ps(n, dirn == "h2d") * 1e-12)
            assert abs(got / real - 1) < 0.10, (gen, dirn, n, got)
    at256 = LinkModel(gen=3, mps=256)
    err = (32 << 20) / (at256.copy_ps(32 << 20, False) * 1e-12) / 12.89e9 - 1
    assert 0.10 < err < 0.12
