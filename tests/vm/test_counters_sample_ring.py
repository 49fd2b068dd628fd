"""Device-side counter sampling through the driver's sample ring (SAMPLE_OPEN/ADVANCE/
CLOSE, DRM_TACC_MMAP_SAMPLE) and the ``device`` counters backend: samples at the period,
counters against sysfs and mmap, drops when the consumer stalls, errnos, one consumer,
and the consumer's CPU cost at 10 kHz against the polling backends (reported, not
asserted: see the junit properties and docs/counters.md)."""

from __future__ import annotations

import ctypes as C
import errno
import fcntl
import json
import mmap
import os
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from tacc.counters import DeviceBackend, Function, default_catalogue, functions, open_backend
from tacc.counters.sampler import Sampler
from tacc.counters.workload import TIMESTAMP_BYTES, CopyWorkload, Device
from tacc.runtime import uapi as ru

SIZE = 4 << 20
PERIOD_NS = 100_000


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Iterator[dict[str, object]]:
    """Measurements, written next to junit.xml as sample_ring.json (copied back to
    build/test-results/vm-<config>/out/ by scripts/test-vm) and as suite properties."""
    out: dict[str, object] = {}
    yield out
    xml = getattr(request.config.option, "xmlpath", None)
    if xml and out:
        from pathlib import Path

        Path(xml).with_name("sample_ring.json").write_text(json.dumps(out, indent=1) + "\n")


@pytest.fixture(scope="module")
def fn() -> Iterator[Function]:
    f = functions()[0]
    assert f.vf == 0
    yield f


def _open(fd: int, period_ns: int = PERIOD_NS, entries: int = 1024, flags: int = 0,
          pad: int = 0) -> ru.drm_tacc_sample_open:
    a = ru.drm_tacc_sample_open(period_ns=period_ns, entries=entries, flags=flags, pad=pad)
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_OPEN, a, True)
    return a


def _advance(fd: int, cons: int, flags: int = 0) -> ru.drm_tacc_sample_advance:
    a = ru.drm_tacc_sample_advance(cons=cons, flags=flags)
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_ADVANCE, a, True)
    return a


def _close(fd: int, flags: int = 0) -> None:
    fcntl.ioctl(fd, ru.DRM_IOCTL_TACC_SAMPLE_CLOSE, ru.drm_tacc_sample_close(flags=flags), True)


def _errno(func) -> int:  # type: ignore[no-untyped-def]
    try:
        func()
    except OSError as exc:
        return int(exc.errno or 0)
    return 0


def _drain_for(be: DeviceBackend, seconds: float, step: float = 0.01):  # type: ignore[no-untyped-def]
    seqs, clks, vals = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        b = be.drain()
        seqs.append(b.seq)
        clks.append(b.devclk)
        vals.append(b.values)
        time.sleep(step)
    return np.concatenate(seqs), np.concatenate(clks), np.concatenate(vals)


def test_samples_arrive_at_the_period(fn: Function, report: dict[str, object]) -> None:
    cat = default_catalogue(fn)
    with DeviceBackend(fn, cat, period_ns=PERIOD_NS, entries=1024) as be:
        assert be.entries == 1024 and be.hdr.period_ns == PERIOD_NS
        assert be.hdr.data_offset == mmap.PAGESIZE
        seq, clk, _ = _drain_for(be, 0.3)
        assert be.dropped == 0
    n = len(seq)
    assert n > 100, n  # 0.3 s at 10 kHz of virtual time
    assert (np.diff(seq.astype(np.int64)) == 1).all()
    d = np.diff(clk.astype(np.int64))
    ticks = PERIOD_NS * fn.clock_hz // 1_000_000_000
    report["period_ticks"] = int(ticks)
    report["samples_in_0.3s"] = int(n)
    report["devclk_delta_min_median_p99_max"] = [int(d.min()), int(np.median(d)),
                                                 int(np.percentile(d, 99)), int(d.max())]
    report["devclk_delta_exact_share"] = float((d == ticks).mean())
    # The test VM runs with -icount (virtual time): intervals are the period exactly,
    # but a timer can still fire a little late when it falls inside a translated
    # block (seen: 1 of 2,894 at +147 ticks), and the model re-arms from the time it
    # took the sample.  So: never early, >= 99 % exact, never more than 1 % late.
    assert (d >= ticks).all(), d.min()
    assert (d == ticks).mean() >= 0.99, (d.min(), d.max())
    assert d.max() <= ticks + ticks // 100, d.max()


def test_last_sample_matches_sysfs_and_mmap(fn: Function) -> None:
    cat = default_catalogue(fn)
    names = cat.names
    sysfs = open_backend("sysfs", fn, cat)
    with DeviceBackend(fn, cat, period_ns=PERIOD_NS, entries=1024) as be, \
            Device(fn.accel_node) as dev:
        wl = CopyWorkload(dev, SIZE)
        time.sleep(0.005)
        first = be.read()
        s0 = sysfs.read()
        wl.run("h2d")
        time.sleep(0.01)  # many periods: the last sample is after the copy
        s1 = sysfs.read()
        with open_backend("mmap", fn, cat) as mm:
            m1 = mm.read()
        be.drain()
        time.sleep(0.002)
        last = be.read()
        wl.close()
    sysfs.close()
    assert first.valid and last.valid and s1.valid and m1.valid
    i = {n: k for k, n in enumerate(names)}
    dsample = last.values.astype(np.int64) - first.values.astype(np.int64)
    dsysfs = s1.values.astype(np.int64) - s0.values.astype(np.int64)
    assert dsample[i["h2d_bytes"]] == SIZE
    assert dsample[i["cmds_dma_h2d"]] == 1
    for name in ("h2d_bytes", "d2h_bytes", "h2d_tlps", "cmds_completed", "jobs_completed"):
        # same interval up to the workload: within its bytes (exact when idle around it)
        assert abs(dsample[i[name]] - dsysfs[i[name]]) <= SIZE + TIMESTAMP_BYTES, name
        assert dsample[i[name]] == dsysfs[i[name]], name
        # raw values: the ring holds D0, so the mmap block was not reset under us
        assert int(last.values[i[name]]) == int(m1.values[i[name]]), name


def test_drops_counted_when_the_consumer_stalls(fn: Function) -> None:
    with DeviceBackend(fn, default_catalogue(fn), period_ns=PERIOD_NS, entries=4) as be:
        batches = []
        for _ in range(3):
            time.sleep(0.03)  # ~300 periods, a 4-entry ring not advanced meanwhile
            batches.append(be.drain())
        assert be.mm is not None
        hdr = ru.drm_tacc_sample_header.from_buffer_copy(be.mm, 0)
    for b in batches:
        assert len(b) == 4
        assert (np.diff(b.seq.astype(np.int64)) == 1).all()
    assert batches[0].dropped > 100, batches[0].dropped
    assert hdr.dropped - hdr.dropped_base >= batches[-1].dropped
    # The samples dropped while batch k sat unread (counted by the ADVANCE that freed
    # it) are exactly the gap in seq between batch k and batch k+1.
    prev = 0
    for a, b in zip(batches, batches[1:], strict=False):
        gap = int(b.seq[0]) - int(a.seq[-1]) - 1
        assert gap == a.dropped - prev, (gap, a.dropped, prev)
        prev = a.dropped


def test_bad_inputs_errnos(fn: Function) -> None:
    fd = os.open(fn.accel_node, os.O_RDWR)
    try:
        assert _errno(lambda: _open(fd, period_ns=PERIOD_NS - 1)) == errno.EINVAL
        assert _errno(lambda: _open(fd, period_ns=0)) == errno.EINVAL
        assert _errno(lambda: _open(fd, entries=3)) == errno.EINVAL
        assert _errno(lambda: _open(fd, entries=0)) == errno.EINVAL
        assert _errno(lambda: _open(fd, entries=1)) == errno.EINVAL
        assert _errno(lambda: _open(fd, entries=2 * ru.SAMPLE_MAX_ENTRIES)) == errno.EINVAL
        assert _errno(lambda: _open(fd, flags=1)) == errno.EINVAL
        assert _errno(lambda: _open(fd, pad=1)) == errno.EINVAL
        # not the consumer
        assert _errno(lambda: _advance(fd, 0)) == errno.EPERM
        assert _errno(lambda: _close(fd)) == errno.EPERM
        assert _errno(lambda: mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ,
                                        offset=ru.MMAP_SAMPLE)) == errno.EACCES
        a = _open(fd, entries=ru.SAMPLE_MAX_ENTRIES)
        assert a.mmap_offset == ru.MMAP_SAMPLE and a.mmap_size >= 4096 + 1048 * 2048
        assert _errno(lambda: _open(fd)) == errno.EALREADY
        assert _errno(lambda: _advance(fd, 0, flags=1)) == errno.EINVAL
        assert _errno(lambda: mmap.mmap(fd, a.mmap_size, mmap.MAP_SHARED,
                                        mmap.PROT_READ | mmap.PROT_WRITE,
                                        offset=ru.MMAP_SAMPLE)) == errno.EACCES
        assert _errno(lambda: mmap.mmap(fd, a.mmap_size + 4096, mmap.MAP_SHARED,
                                        mmap.PROT_READ, offset=ru.MMAP_SAMPLE)) == errno.EINVAL
        time.sleep(0.002)
        adv = _advance(fd, 0)
        # beyond the producer index (the device keeps producing every 100 us, so prod + 1
        # may be valid by the next call: 100,000 samples ahead is 10 s away)
        assert _errno(lambda: _advance(fd, adv.prod + 100_000)) == errno.EINVAL
        assert _advance(fd, adv.prod).prod >= adv.prod
        assert _errno(lambda: _close(fd, flags=1)) == errno.EINVAL
        _close(fd)
        assert _errno(lambda: _advance(fd, 0)) == errno.EPERM
    finally:
        os.close(fd)


def test_second_opener_gets_ebusy(fn: Function) -> None:
    fd1 = os.open(fn.accel_node, os.O_RDWR)
    fd2 = os.open(fn.accel_node, os.O_RDWR)
    try:
        a = _open(fd1)
        assert _errno(lambda: _open(fd2)) == errno.EBUSY
        assert _errno(lambda: _advance(fd2, 0)) == errno.EPERM
        assert _errno(lambda: mmap.mmap(fd2, a.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ,
                                        offset=ru.MMAP_SAMPLE)) == errno.EACCES
        os.close(fd1)  # file release stops the ring and frees the consumer slot
        fd1 = -1
        _open(fd2)
        _close(fd2)
    finally:
        for fd in (fd1, fd2):
            if fd >= 0:
                os.close(fd)


def test_close_unmaps_and_runtime_pm_returns(fn: Function) -> None:
    """While a consumer exists the function stays in D0; after close it may suspend."""
    fd = os.open(fn.accel_node, os.O_RDWR)
    try:
        a = _open(fd, entries=16)
        mm = mmap.mmap(fd, a.mmap_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=a.mmap_offset)
        hdr = ru.drm_tacc_sample_header.from_buffer_copy(mm, 0)
        assert hdr.version == ru.SAMPLE_HDR_VERSION and hdr.entries == 16
        assert fn.runtime_status == "active"
        mm.close()
        _close(fd)
    finally:
        os.close(fd)


def _idle_s() -> float:
    """Guest idle time summed over CPUs (nohz idle clock of /proc/uptime)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[1])


def _cpu_of(fn: Function, backend: str, seconds: float) -> dict[str, float]:
    cat = fn.catalogue.select(scope="function")
    ncpu = os.cpu_count() or 1
    with Sampler([fn], 10_000, backend, catalogues={fn.pci: cat}) as s:
        i0 = _idle_s()
        st = s.run(duration_s=seconds)
        i1 = _idle_s()
    busy = 100.0 * (1.0 - (i1 - i0) / (st.wall_s * ncpu)) * ncpu  # % of one CPU
    return {"cpu_pct": round(100.0 * st.cpu_s / st.wall_s, 2),
            "system_busy_pct": round(busy, 2), "samples": st.samples,
            "missed": st.missed, "wall_s": round(st.wall_s, 3)}


# make test measures the device backend (its assertions); the polling backends it is
# compared with (docs/counters.md's table) cost ~12 s of the strict boot: make test-long
@pytest.mark.parametrize("backend", ["device", pytest.param("mmap", marks=pytest.mark.long),
                                     pytest.param("sysfs", marks=pytest.mark.long)])
def test_consumer_cpu_at_10khz(fn: Function, report: dict[str, object], backend: str,
                              record_testsuite_property) -> None:  # type: ignore[no-untyped-def]
    """CPU of the sampler process at 10 kHz: device ring vs mmap and sysfs polling."""
    ctl = fn.path / "power" / "control"
    old = ctl.read_text().strip()
    ctl.write_text("on")  # mmap needs D0; same conditions for every backend
    try:
        i0 = _idle_s()
        time.sleep(1.0)
        ncpu = os.cpu_count() or 1
        idle = {"system_busy_pct": round(100.0 * (ncpu - (_idle_s() - i0)), 2)}
        r = _cpu_of(fn, backend, 2.0)
    finally:
        ctl.write_text(old)
    record_testsuite_property(f"cpu_{backend}", json.dumps(r))
    res = report.setdefault("cpu_10khz_2s", {})
    assert isinstance(res, dict)
    res[backend] = r
    res.setdefault("idle_baseline", idle)
    print(f"sample-ring CPU at 10 kHz, {backend}:", json.dumps(r), file=sys.__stderr__)
    # 2 s at 10 kHz of device time: every tick is a sample or a counted miss
    assert r["samples"] + r["missed"] >= 19_000, r
    if backend == "device":
        assert r["samples"] > 5000 and r["missed"] == 0, r


def test_cli_sample_device_backend(fn: Function, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tacc counters sample --backend device: the rate is the device's period."""
    import subprocess
    from pathlib import Path

    from tacc.capture import open_capture

    tacc = str(Path(sys.executable).with_name("tacc"))
    out = tmp_path / "cap"
    r = subprocess.run([tacc, "counters", "sample", "-o", str(out), "-r", "5000", "-t", "0.3",
                        "-d", fn.pci, "-b", "device", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    rec = open_capture(out).read("counters")
    assert len(rec) == st["samples"] > 100
    seq = rec["seq"].astype(np.int64)
    assert seq[0] == 0 and int((np.diff(seq) - 1).sum()) == st["missed"] == 0
    d = np.diff(rec["devclk"].astype(np.int64))
    assert abs(np.median(d) - 200_000 * fn.clock_hz // 1_000_000_000) <= 20_000


def test_ctypes_header_mirror(fn: Function) -> None:
    assert C.sizeof(ru.drm_tacc_sample_header) == 48
