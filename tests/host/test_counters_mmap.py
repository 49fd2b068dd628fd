"""The mmap backend's consistent-snapshot protocol, on a file standing in for BAR2."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from tacc.capture.schema import FUNC_COUNTERS
from tacc.counters import MmapBackend, functions
from tacc.counters.catalogue import GLOBAL_PAGE
from tacc.counters.fakesys import make_function
from tacc.runtime.uapi import MMAP_COUNTERS

HDR_FN = (1 << 32) | 38
HDR_GL = (1 << 32) | 9


class FakeBar:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self.fd, MMAP_COUNTERS + 2 * GLOBAL_PAGE)
        self.mm = mmap.mmap(self.fd, 2 * GLOBAL_PAGE, offset=MMAP_COUNTERS)
        self.u64 = np.frombuffer(self.mm, "<u8")
        self.set(0, HDR_FN)
        self.set(512, HDR_GL)

    def set(self, slot: int, v: int) -> None:
        self.u64[slot] = v


@pytest.fixture
def bar(tmp_path: Path) -> FakeBar:
    make_function(tmp_path / "sys")
    return FakeBar(tmp_path / "bar")


def _backend(tmp_path: Path, glob: bool = True) -> MmapBackend:
    fn = functions(tmp_path / "sys")[0]
    cat = fn.catalogue if glob else fn.catalogue.select(scope="function")
    return MmapBackend(fn, cat, node=tmp_path / "bar")


def test_consistent_snapshot(tmp_path: Path, bar: FakeBar) -> None:
    bar.set(2, 111)
    bar.set(512 + 8, 999)
    with _backend(tmp_path) as b:
        s = b.read()
        assert s.valid and s.state == "ok" and s.retries == 0
        assert int(s.values[b.catalogue.index("h2d_bytes")]) == 111
        assert int(s.values[b.catalogue.index("uptime_ticks")]) == 999
        assert int(b.page_view()["h2d_bytes"]) == 111
        assert int(b.page_view(1)["uptime_ticks"]) == 999


def test_odd_generation_is_torn_not_garbage(tmp_path: Path, bar: FakeBar) -> None:
    bar.set(1, 3)  # an update that never completes
    with _backend(tmp_path, glob=False) as b:
        s = b.read()
    assert not s.valid and s.state == "torn" and s.retries > 0
    assert not s.values.any()


@pytest.mark.parametrize("fill", [0, 0xFFFF_FFFF_FFFF_FFFF])
def test_d3hot_page_is_unavailable(tmp_path: Path, bar: FakeBar, fill: int) -> None:
    """A BAR that does not decode reads zeros (QEMU) or all ones (hardware)."""
    bar.u64[:] = fill
    with _backend(tmp_path) as b:
        s = b.read()
    assert not s.valid and s.state == "unavailable"
    assert not s.values.any()


def test_only_needed_pages_are_mapped(tmp_path: Path, bar: FakeBar) -> None:
    with _backend(tmp_path, glob=False) as b:
        assert len(b.mm) == GLOBAL_PAGE
        assert b.spans == [(0, max(slot for _, slot in FUNC_COUNTERS) + 1)]
