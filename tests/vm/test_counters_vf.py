"""Per-function counters with SR-IOV: a VF's copy shows in the VF's counters (sysfs,
mmap, perf PMU tacc_<hex> of the VF) and in the PF's global link counters only; the
VF's PMU appears with the VF and goes away with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tacc.counters import Function, default_catalogue, deltas, functions, open_backend
from tacc.counters.workload import CopyWorkload, Device

SIZE = 1 << 20
PMUS = Path("/sys/bus/event_source/devices")


@pytest.fixture(scope="module")
def vf() -> Iterator[tuple[Function, Function]]:
    pf = functions()[0]
    numvfs = pf.path / "sriov_numvfs"
    if int(numvfs.read_text()) != 0:
        pytest.skip("VFs already enabled by the VM configuration")
    numvfs.write_text("1")
    try:
        end = time.monotonic() + 30
        while True:
            fns = [f for f in functions() if f.vf]
            if fns and (fns[0].path / "counters" / "catalogue").exists() and \
                    list((fns[0].path / "accel").glob("accel*")):
                break
            assert time.monotonic() < end, "VF did not appear"
            time.sleep(0.1)
        for f in (pf, fns[0]):
            (f.path / "power" / "control").write_text("on")
        yield pf, fns[0]
    finally:
        (pf.path / "power" / "control").write_text("auto")
        if int(numvfs.read_text()):
            numvfs.write_text("0")


def test_vf_pmu_has_no_global_events(vf: tuple[Function, Function]) -> None:
    _, v = vf
    ev = PMUS / v.pmu_name / "events"
    assert (ev / "h2d_bytes").read_text().strip() == "event=0x02"
    assert not (ev / "link_h2d_bytes").exists()
    assert not any(c.is_global for c in v.catalogue)


def test_vf_copy_counted_on_the_vf_only(vf: tuple[Function, Function]) -> None:
    pf, v = vf
    cats = {f.pci: default_catalogue(f) for f in (pf, v)}
    bes = {(f.pci, n): open_backend(n, f, cats[f.pci]) for f in (pf, v)
           for n in ("sysfs", "mmap", "perf")}
    try:
        before = {k: b.read() for k, b in bes.items()}
        with Device(v.accel_node) as dev:
            wl = CopyWorkload(dev, SIZE)
            wl.run("h2d")
            wl.close()
        after = {k: b.read() for k, b in bes.items()}
    finally:
        for b in bes.values():
            b.close()
    for n in ("sysfs", "mmap", "perf"):
        dv = deltas(cats[v.pci].names, before[(v.pci, n)].values, after[(v.pci, n)].values)
        dp = deltas(cats[pf.pci].names, before[(pf.pci, n)].values, after[(pf.pci, n)].values)
        assert dv["h2d_bytes"] == SIZE, n
        assert dp["h2d_bytes"] == 0, n
        assert dp["link_h2d_payload"] == SIZE, n  # the shared link sees every function


def test_vf_pmu_goes_away_with_the_vf(vf: tuple[Function, Function]) -> None:
    pf, v = vf
    assert (PMUS / v.pmu_name).exists()
    (pf.path / "sriov_numvfs").write_text("0")
    names = {p.name for p in PMUS.iterdir() if p.name.startswith("tacc_")}
    assert names == {pf.pmu_name}
