"""``tlb_thrash`` on a capture attached after the buffers were bound (docs/analysis.md):
no VM_BIND record then says which pages are 4 KiB, the device's walks do (a 4 KiB page
walks three levels, a 2 MiB page two), so the rule prices the same walks from the
counters.  On the real tlb_thrash twins (make fixtures)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from realcaps import FIXTURES, extract
from tacc.analyze.data import Data, load
from tacc.analyze.rules import Thresholds
from tacc.analyze.rules.tlb_thrash import tlb_thrash
from tacc.capture import open_capture
from tacc.capture.schema import DriverKind


def _data(name: str, root: Path) -> Data:
    return load(open_capture(extract(FIXTURES / f"{name}.tar.xz", root)))


def _without_binds(d: Data) -> Data:
    return dataclasses.replace(d, drv=d.drv[d.drv["kind"] != DriverKind.VM_BIND])


def test_attached_after_the_binds_prices_the_same_walks(tmp_path: Path) -> None:
    d = _data("tlb_thrash-bad", tmp_path)
    th = Thresholds()
    (whole,) = tlb_thrash(d, th)
    assert whole.evidence["page_sizes"] == {"4096": whole.evidence["page_sizes"]["4096"]}
    (attached,) = tlb_thrash(_without_binds(d), th)
    # every miss walked three levels (tlb_walk_reads / tlb_misses of the counters = 3):
    # all 4 KiB, as the binds said
    assert attached.evidence["walk_reads_per_miss"] == 3.0
    assert attached.evidence["share_of_walks_on_4k_pages"] == 1.0
    assert attached.time_lost_ns == whole.time_lost_ns
    assert attached.evidence["tlb_misses"] == whole.evidence["tlb_misses"]
    assert attached.evidence["page_sizes"] == {}
    assert "2 MiB pages" in attached.suggestion


def test_attached_good_twin_stays_silent(tmp_path: Path) -> None:
    """The good twin's operands are on 2 MiB pages: its compute commands hardly miss."""
    d = _data("tlb_thrash-good", tmp_path)
    assert tlb_thrash(_without_binds(d), Thresholds()) == []
    assert tlb_thrash(d, Thresholds()) == []
    # its misses are the copies' (host pages); its GEMMs missed 3 times in all
    c = d.cmds
    assert int(c.tlb[c.is_compute].sum()) == 3 and int(c.tlb[c.is_copy].sum()) == 771


@pytest.mark.parametrize("per_miss,share", [(2.0, 0.0), (3.0, 1.0), (2.5, 0.6)])
def test_share_of_walk_time_on_4k_pages(per_miss: float, share: float) -> None:
    """f of the misses on 4 KiB pages (3 reads), 1 - f on 2 MiB (2 reads): reads per miss
    = 2 + f, and the 4 KiB walks' share of the walk time 3f / (2 + f)."""
    from tacc.analyze.rules.tlb_thrash import small_page_walk_share

    assert np.isclose(small_page_walk_share(per_miss), share)
