"""The capture's CRC-32 is zlib's whichever implementation computes it.

taccd takes ISA-L's ``isal_zlib.crc32`` (faster) when installed; the format's CRC stays
zlib's: same results on every size and alignment, incrementally (seeded) and one-shot,
on bytes and on the numpy views the writer hands it, and a capture written with one reads
with the other.
"""

from __future__ import annotations

import os
import random
import zlib

import numpy as np
import pytest
from tacc.capture import framing

isal_zlib = pytest.importorskip("isal.isal_zlib", reason="setup installs isal (pyproject)")


def test_setup_installed_isal_and_framing_uses_it() -> None:
    # a missing isal would silently fall back to zlib: setup must have installed it
    assert framing.CRC32_IMPL == "isal"
    assert framing.crc32 is isal_zlib.crc32


@pytest.mark.parametrize("size", [0, 1, 3, 7, 8, 15, 16, 63, 64, 65, 255, 4096, 65537,
                                  (256 << 10) + 13, 4 << 20])
def test_same_crc_as_zlib(size: int) -> None:
    data = os.urandom(size)
    assert isal_zlib.crc32(data) == zlib.crc32(data)
    for off in (1, 3, 5):  # unaligned views
        mv = memoryview(data)[off:]
        assert isal_zlib.crc32(mv) == zlib.crc32(mv)


def test_incremental_and_numpy_pieces() -> None:
    rng = random.Random(18)
    arrs = [np.frombuffer(os.urandom(rng.randrange(1, 5000)), np.uint8) for _ in range(50)]
    for seed in (0, 1, 0xFFFFFFFF, 0x12345678):
        a = b = seed
        for x in arrs:
            a = isal_zlib.crc32(x, a)
            b = zlib.crc32(x, b)
            assert a == b
    rec = np.zeros(1000, dtype=[("t", "<i8"), ("v", "<u4")])[::3]  # a strided view
    buf = np.ascontiguousarray(rec).view(np.uint8)
    assert isal_zlib.crc32(buf) == zlib.crc32(buf.tobytes())


def test_chunks_read_back_with_zlib() -> None:
    payload = os.urandom(100_003)
    chunk = framing.encode_chunk(7, 11, payload)
    head = chunk[:framing.CHUNK_HEADER_SIZE]
    # the header carries zlib's CRC of the payload and of its first 20 bytes
    assert int.from_bytes(head[16:20], "little") == zlib.crc32(payload)
    assert int.from_bytes(head[20:24], "little") == zlib.crc32(head[:20])
