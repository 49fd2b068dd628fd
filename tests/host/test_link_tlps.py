"""TLP counts of the link model against brute-force walks (devinfo, hw 1.2).

docs/hardware.md section 9, "PCIe link": a host write (D2H) is cut at every x where the
device-side address d + x or the host-side address h + x is a multiple of MPS; a host
read (H2D) is issued as read requests of MRRS bytes from the transfer's start that never
cross a 4 KiB boundary of the host address, and the root port returns each request in
completions cut at its Read Completion Boundary.  The closed forms in
tacc.capture.devinfo (and tacc-model.c, tests/device/test_link_align.py) must equal the
brute-force counts.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tacc.capture import devinfo
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
    assert devinfo.payload_tlps(n, mps, host_off=h, dev_off=d) == want
    assert brute_bursts(n, mps, h, d) == want
    # only the offsets modulo MPS matter, and the two sides play symmetric roles
    assert devinfo.payload_tlps(n, mps, h % mps, d % mps) == want
    assert devinfo.payload_tlps(n, mps, d, h) == want


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
    assert devinfo.read_requests(n, mrrs, h) == len(reqs)
    assert all(ln <= mrrs and (h + x) // 4096 == (h + x + ln - 1) // 4096 for x, ln in reqs)
    assert devinfo.completions(n, mrrs, rcb, h) == brute_completions(n, mrrs, rcb, h)
    # only the host offset modulo 4 KiB matters (requests), modulo RCB (completions)
    assert devinfo.read_requests(n, mrrs, h % 4096) == len(reqs)
    assert devinfo.completions(n, mrrs, rcb, h % rcb) == devinfo.completions(n, mrrs, rcb, h)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1 << 24), mps=MPS, h=st.integers(0, 4095), d=st.integers(0, 4095))
def test_payload_tlps_bounds(n, mps, h, d):
    aligned = -(-n // mps)
    assert devinfo.payload_tlps(n, mps) == aligned
    assert devinfo.payload_tlps(n, mps, h, h) in (aligned, aligned + 1)
    t = devinfo.payload_tlps(n, mps, h, d)
    assert aligned <= t <= 2 * aligned + 1
    # each extra write TLP costs exactly its header (and its share of the DLLPs)
    up, wr = devinfo.d2h_link_bytes(n, mps, h, d)
    assert wr == t and up == n + t * devinfo.LINK_MWR_OVERHEAD
    c = devinfo.link_prefix("d2h", n, mps, host_off=h, dev_off=d)
    assert c.dllp == (-(-t // 4) * 2, 0) and c.bytes == (8 * c.dllp[0], up)
    # host reads: the device side does not matter
    down, upr, cpl = devinfo.h2d_link_bytes(n, mps, 512, h, d)
    assert (down, upr, cpl) == devinfo.h2d_link_bytes(n, mps, 512, h, 0)
    req = devinfo.read_requests(n, 512, h)
    assert cpl == devinfo.completions(n, 512, 64, h)
    assert down == n + cpl * devinfo.LINK_CPL_OVERHEAD + 8 * 2 * -(-req // 4)
    assert upr == req * devinfo.LINK_MRD_BYTES + 8 * -(-cpl // 4)


@settings(max_examples=100, deadline=None)
@given(n=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=20), mps=MPS)
def test_payload_tlps_array_matches_scalar(n, mps):
    arr = np.array(n, np.int64)
    assert list(devinfo.payload_tlps(arr, mps)) == [devinfo.payload_tlps(x, mps) for x in n]


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
    assert devinfo.payload_tlps(4196, 256) == 17
    assert devinfo.payload_tlps(4196, 256, host_off=64) == 33
    assert devinfo.payload_tlps(4196, 256, host_off=64, dev_off=64) == 17
    # reads: aligned 9 requests (8 x 512 + 100), 66 completions (65 x 64 + 36)
    assert devinfo.read_requests(4196, 512) == 9
    assert devinfo.completions(4196, 512, 64) == 66
    # at host offset 32: 4 KiB cut at 4064 adds a request; every request ends mid-RCB
    assert devinfo.read_requests(4196, 512, 32) == 10
    assert devinfo.completions(4196, 512, 64, 32) == 1 + (32 + 4195) // 64 + 4195 // 512
    assert devinfo.h2d_link_bytes(4196, 256, 512) == (
        4196 + 66 * 20 + 8 * (3 + 3), 9 * 24 + 8 * 17, 66)


def test_reference_table_error():
    """The model against the issue's reference table (real hardware, large pinned
    copies): every row within 12 % (goal 10 %; Gen3 D2H is +11.4 %, see
    docs/hardware.md section 9, "Against real hardware")."""
    rows = {(4, "h2d"): 25.13e9, (3, "h2d"): 12.15e9, (3, "d2h"): 12.89e9}
    for (gen, dirn), real in rows.items():
        lm = LinkModel(gen=gen)
        for n in (1 << 20, 32 << 20, 512 << 20):
            got = n / (lm.copy_ps(n, dirn == "h2d") * 1e-12)
            assert abs(got / real - 1) < 0.12, (gen, dirn, n, got)
