"""Payload TLP count of a transfer with misaligned host/device addresses (devinfo).

docs/hardware.md section 9, "PCIe link": [0, len) is cut at every x where the
device-side address d + x or the host-side address h + x is a multiple of MPS; the
closed form in tacc.capture.devinfo.payload_tlps must equal a brute-force count.
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


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 1 << 24), mps=MPS, h=st.integers(0, 4095), d=st.integers(0, 4095))
def test_payload_tlps_bounds(n, mps, h, d):
    aligned = -(-n // mps)
    assert devinfo.payload_tlps(n, mps) == aligned
    assert devinfo.payload_tlps(n, mps, h, h) in (aligned, aligned + 1)
    t = devinfo.payload_tlps(n, mps, h, d)
    assert aligned <= t <= 2 * aligned + 1
    # each extra TLP costs exactly its header
    down, up, cpl = devinfo.h2d_link_bytes(n, mps, 512, h, d)
    assert cpl == t and down == n + t * devinfo.LINK_CPL_OVERHEAD
    assert up == -(-n // 512) * devinfo.LINK_MRD_BYTES  # read requests: not address-dependent
    assert devinfo.d2h_link_bytes(n, mps, h, d) == (n + t * devinfo.LINK_MWR_OVERHEAD, t)


@settings(max_examples=100, deadline=None)
@given(n=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=20), mps=MPS)
def test_payload_tlps_array_matches_scalar(n, mps):
    arr = np.array(n, np.int64)
    assert list(devinfo.payload_tlps(arr, mps)) == [devinfo.payload_tlps(x, mps) for x in n]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5 * CHUNK + 999), h=st.integers(0, 4095), d=st.integers(0, 4095),
       h2d=st.booleans())
def test_link_steps_add_up(n, h, d, h2d):
    """The 64 KiB link steps carry exactly the transfer's TLPs (no extra cut at a step
    boundary), so their link bytes add up to the whole transfer's."""
    lm = LinkModel()
    down = up = 0
    for a in range(0, n, CHUNK):
        sd, su = lm.step_bytes(a, min(CHUNK, n - a), h2d, h, d)
        down, up = down + sd, up + su
    if h2d:
        assert (down, up) == lm.h2d_bytes(n, h, d)[:2]
    else:
        assert (down, up) == (0, lm.d2h_bytes(n, h, d)[0])


def test_worked_example():
    """docs/hardware.md section 9: 4096 + 100 bytes, MPS 256, host offset 64."""
    assert devinfo.payload_tlps(4196, 256) == 17
    assert devinfo.payload_tlps(4196, 256, host_off=64) == 33
    assert devinfo.payload_tlps(4196, 256, host_off=64, dev_off=64) == 17
    assert devinfo.h2d_link_bytes(4196, 256, 512, host_off=64) == (4196 + 33 * 20, 9 * 24, 33)
