"""Counters in the guest: every backend (sysfs, mmap, perf) against a copy of known size,
the device's own timestamps, the stock perf tool, tacc stat and the permission model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tacc.counters import (
    CounterError,
    Function,
    LinkInfo,
    MmapBackend,
    default_catalogue,
    deltas,
    derive,
    functions,
    open_backend,
)
from tacc.counters.workload import TIMESTAMP_BYTES, CopyWorkload, Device
from tacc.model import link as linkmodel
from tacc.testing.unpriv import python_as_tacc_user

BACKENDS = ("sysfs", "mmap", "perf")
SIZE = 4 << 20
BIG = 16 << 20
PY = sys.executable


@pytest.fixture(scope="module")
def fn() -> Iterator[Function]:
    """The PF, kept in D0 (power/control=on) so raw mmap counters are not reset under us."""
    f = functions()[0]
    ctl = f.path / "power" / "control"
    old = ctl.read_text().strip()
    ctl.write_text("on")
    yield f
    ctl.write_text(old)


@pytest.fixture(scope="module")
def workload(fn: Function) -> Iterator[CopyWorkload]:
    with Device(fn.accel_node) as dev:
        wl = CopyWorkload(dev, SIZE)
        yield wl
        wl.close()


TACC = str(Path(sys.executable).with_name("tacc"))  # the console script


def _measure(fn: Function, run, names: list[str] | None = None):  # type: ignore[no-untyped-def]
    cat = default_catalogue(fn)
    bes = {n: open_backend(n, fn, cat) for n in BACKENDS}
    try:
        before = {n: b.read() for n, b in bes.items()}
        res = run()
        after = {n: b.read() for n, b in bes.items()}
    finally:
        for b in bes.values():
            b.close()
    for n in BACKENDS:
        assert before[n].valid and after[n].valid, (n, before[n].state, after[n].state)
    d = {n: deltas(cat.names, before[n].values, after[n].values) for n in BACKENDS}
    return res, d


def test_catalogue_matches_sysfs_and_pmu(fn: Function) -> None:
    cat = fn.catalogue
    assert cat.version == 1
    names = {c.name for c in cat}
    assert {"h2d_bytes", "d2h_bytes", "busy_dma_h2d", "tlb_hits", "link_h2d_bytes"} <= names
    events = Path("/sys/bus/event_source/devices") / fn.pmu_name / "events"
    for c in cat:
        d = fn.global_dir() if c.is_global else fn.counters_dir
        assert (d / c.name).exists(), c.name
        spec = (events / c.name).read_text().strip()
        assert spec == f"event=0x{c.slot:02x}" + (",global=1" if c.is_global else ""), spec
        assert (events / f"{c.name}.unit").read_text().strip() == c.unit
    pmu = events.parent
    assert (pmu / "cpumask").read_text().strip() == "0"
    assert (pmu / "format" / "event").read_text().strip() == "config:0-7"


def ts_down_bytes(fn: Function) -> int:
    """Downstream DLLP bytes of the workload's 8-byte TIMESTAMP writes."""
    return TIMESTAMP_BYTES // 8 * linkmodel.link_prefix("d2h", 8, fn.mps).bytes[0]


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_copy_bytes_exact_in_every_backend(fn: Function, workload: CopyWorkload,
                                           direction: str) -> None:
    _, d = _measure(fn, lambda: workload.run(direction))
    # hw 1.2 (docs/hardware.md section 9): H2D payload TLPs are the root port's
    # completions (64 B RCB); link bytes include the DLLPs, also the root port's ACK and
    # UpdateFC for the TIMESTAMPs' writes
    link = linkmodel.link_prefix("h2d", SIZE, fn.mps)
    for n in BACKENDS:
        if direction == "h2d":
            assert d[n]["h2d_bytes"] == SIZE, n
            assert d[n]["h2d_tlps"] == link.tlps[0] == math.ceil(SIZE / linkmodel.DEFAULT_RCB), n
            assert d[n]["h2d_link_bytes"] == link.bytes[0] + ts_down_bytes(fn), n
            assert d[n]["d2h_bytes"] == TIMESTAMP_BYTES, n
            assert d[n]["cmds_dma_h2d"] == 1, n
        else:
            assert d[n]["d2h_bytes"] == SIZE + TIMESTAMP_BYTES, n
            assert d[n]["h2d_bytes"] == 0, n
            assert d[n]["cmds_dma_d2h"] == 1, n
        assert d[n]["jobs_completed"] == 1, n
        assert d[n]["cmds_completed"] == 3, n
        if os.geteuid() == 0:
            assert d[n][f"link_{direction}_payload"] == d[n][f"{direction}_bytes"], n
    # the three backends agree counter by counter (levels excepted)
    for name in d["sysfs"]:
        if not name.endswith("_hwm") and name != "uptime_ticks":
            assert d["sysfs"][name] == d["mmap"][name] == d["perf"][name], name


def test_bandwidth_matches_device_timestamps(fn: Function) -> None:
    with Device(fn.accel_node) as dev:
        wl = CopyWorkload(dev, BIG)
        res, d = _measure(fn, lambda: wl.run("h2d"))
        wl.close()
    truth = BIG / res.ticks * fn.clock_hz / 1e9  # GB/s between the two TIMESTAMPs
    link = LinkInfo(fn.gen, fn.width, fn.mps, fn.clock_hz)
    for n in BACKENDS:
        m = derive(d[n], 1.0, link)
        assert abs(m["h2d_engine_gbps"] - truth) / truth < 0.01, (n, m["h2d_engine_gbps"], truth)
        assert 0 < m["h2d_engine_gbps"] / (link.max_bw("h2d") / 1e9) <= 1.0
        assert m["h2d_tlp_efficiency"] == pytest.approx(
            BIG / (linkmodel.link_prefix("h2d", BIG, fn.mps).bytes[0] + ts_down_bytes(fn)))


def test_mmap_structured_view_and_header(fn: Function, workload: CopyWorkload) -> None:
    with MmapBackend(fn, fn.catalogue.select(scope="function")) as mb:
        assert mb.header() >> 32 == 1
        v = mb.page_view()
        assert int(v["gen"]) % 2 == 0
        snap = mb.read()
        assert snap.valid and snap.retries == 0
        assert int(v["h2d_bytes"]) == int(snap.values[mb.catalogue.index("h2d_bytes")])
        # the contiguous-copy fast path equals slot-by-slot reads
        for i, c in enumerate(mb.catalogue):
            if not c.name.endswith("_hwm"):
                assert int(mb.u64[c.slot]) == int(snap.values[i]), c.name


def test_stock_perf_tool(fn: Function) -> None:
    ev = ",".join(f"{fn.pmu_name}/{e}/" for e in ("h2d_bytes", "h2d_tlps", "cmds_dma_h2d"))
    r = subprocess.run(["perf", "stat", "-x,", "-e", ev, "--", PY, "-m",
                        "tacc.counters.workload", "--size", str(SIZE)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {}
    for line in r.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 3 and fn.pmu_name in parts[2]:
            got[parts[2].split("/")[1]] = (int(parts[0]), parts[1])
    assert got["h2d_bytes"] == (SIZE, "bytes"), r.stderr
    assert got["h2d_tlps"][0] == math.ceil(SIZE / linkmodel.DEFAULT_RCB)  # completions
    # the copy; plus the driver's FILL scrubbing the workload's DEVICE BO at its exit
    # when it completes before perf reads the counters (asynchronous, no link bytes)
    assert got["cmds_dma_h2d"][0] in (1, 2), r.stderr


@pytest.mark.parametrize("backend", [
    "sysfs", pytest.param("mmap", marks=pytest.mark.long), pytest.param("perf",
                                                                        marks=pytest.mark.long)])
def test_tacc_stat_json(fn: Function, backend: str) -> None:
    r = subprocess.run([TACC, "stat", "--json", "-b", backend, "-d", fn.pci,
                        "--", PY, "-m", "tacc.counters.workload", "--size", str(SIZE),
                        "--dir", "d2h"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout[r.stdout.index("{\n"):])["functions"][0]
    assert rep["counters"]["d2h_bytes"]["value"] == SIZE + TIMESTAMP_BYTES, backend
    assert rep["derived"]["d2h_gbps"] > 0


def test_tacc_stat_text_and_top_once(fn: Function) -> None:
    r = subprocess.run([TACC, "stat", "--", "true"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Performance counter stats for 'true'" in r.stdout
    assert fn.pci in r.stdout
    r = subprocess.run([TACC, "top", "-n", "1", "-i", "0.2"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "160"})
    assert r.returncode == 0, r.stderr
    assert fn.pci in r.stdout and "TLB hit" in r.stdout


def test_unprivileged_function_counters_only(fn: Function) -> None:
    """tacc-user on the PF: every backend refused, for the function counters too (the PF's
    function page sums every tenant's work: sysfs 0400, mmap and PMU CAP_PERFMON;
    docs/sysfs-abi.md "Permissions", docs/counters.md), each with a one-line reason."""
    code = ("from tacc.counters import *; f = functions()[0]; "
            "cat = default_catalogue(f); assert not any(c.is_global for c in cat)\n"
            "for b in (\"mmap\", \"sysfs\", \"perf\"):\n"
            "    for scope, c in ((\"fn\", cat), (\"all\", f.catalogue)):\n"
            "        try: open_backend(b, f, c)\n"
            "        except CounterError as e: print(b, scope, \"refused:\", e)\n")
    r = python_as_tacc_user(code, timeout=60)
    for b in ("mmap", "sysfs", "perf"):
        for scope in ("fn", "all"):
            assert f"{b} {scope} refused:" in r.stdout, (b, scope, r.stdout, r.stderr)
    assert "mmap fn refused: " + fn.pci + ": mmap of the PF's counter page needs CAP_PERFMON" \
        in r.stdout, r.stdout


def test_global_mmap_needs_perfmon_as_root_works(fn: Function) -> None:
    with MmapBackend(fn, fn.catalogue) as mb:
        s = mb.read()
        assert s.valid
        assert int(s.values[mb.catalogue.index("uptime_ticks")]) > 0
    with pytest.raises(CounterError):
        fn.catalogue.select(["h2d_bytes", "no_such_counter"])
