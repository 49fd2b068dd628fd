"""Sample counters at a fixed rate (up to 10 kHz with mmap or device) into a capture.

Each tick reads every function once and appends one ``counters`` record per function
(``devclk, seq, fid`` + one u64 column per counter, raw cumulative values; the columns
are matched by name against the catalogue the driver publishes).  ``seq`` is the tick
number: a gap is a miss, and every miss is also counted (``SamplerStats.missed`` and a
``drops`` record with source COUNTERS), never lost silently.
"""

from __future__ import annotations

import ctypes as C
import os
import resource
import time
from dataclasses import dataclass, field
from threading import Event

import numpy as np

from tacc.capture import CaptureWriter
from tacc.capture.schema import CLOCK_DTYPE, COUNTERS_DTYPE, DROPS_DTYPE, DropSource
from tacc.devices import parse_clock_sync
from tacc.libc import libc

from .backends import default_catalogue, open_backend
from .base import Backend
from .catalogue import Catalogue, Function

MAX_RATE_HZ = 10_000.0
BATCH = 1024
CLOCK_MONOTONIC = 1
TIMER_ABSTIME = 1
PR_SET_TIMERSLACK = 29


class _Timespec(C.Structure):
    _fields_ = [("tv_sec", C.c_long), ("tv_nsec", C.c_long)]


def sleep_until(t_ns: int) -> None:
    ts = _Timespec(t_ns // 1_000_000_000, t_ns % 1_000_000_000)
    libc.clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, C.byref(ts), None)


@dataclass
class SamplerStats:
    ticks: int = 0  # ticks scheduled
    samples: int = 0  # records written (ticks x functions, minus unavailable)
    missed: int = 0  # ticks skipped because the loop was late
    unavailable: int = 0  # reads without a defined value (D3hot, reset)
    torn: int = 0
    retries: int = 0  # seqlock retries
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process, user + system, during run()
    unmapped: list[str] = field(default_factory=list)  # catalogue names with no column

    @property
    def rate_hz(self) -> float:
        return self.ticks / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_per_sample_us(self) -> float:
        return self.cpu_s / self.ticks * 1e6 if self.ticks else 0.0

    def as_dict(self) -> dict[str, float | int | list[str]]:
        return {"ticks": self.ticks, "samples": self.samples, "missed": self.missed,
                "unavailable": self.unavailable, "torn": self.torn, "retries": self.retries,
                "wall_s": self.wall_s, "cpu_s": self.cpu_s, "rate_hz": self.rate_hz,
                "cpu_per_sample_us": self.cpu_per_sample_us, "unmapped": self.unmapped}


class _Source:
    """One function: backend, column mapping into COUNTERS_DTYPE rows (as u64 words)."""

    def __init__(self, fid: int, fn: Function, backend: Backend, stats: SamplerStats) -> None:
        self.fid = fid
        self.fn = fn
        self.backend = backend
        words = {name: COUNTERS_DTYPE.fields[name][1] // 8 for name in COUNTERS_DTYPE.names
                 if name != "_pad"}
        cols, sel = [], []
        for i, c in enumerate(backend.catalogue):
            col = ("g_" if c.is_global else "") + c.name
            if col in words:
                cols.append(words[col])
                sel.append(i)
            else:
                stats.unmapped.append(f"{fn.pci}:{c.name}")
        self.cols = np.array(cols, dtype=np.intp)
        self.sel = np.array(sel, dtype=np.intp)
        cat = backend.catalogue
        up = "uptime_ticks"
        self.uptime = cat.index(up) if up in cat.names and cat.get(up).is_global else -1
        self.w_devclk = words["devclk"]
        self.w_seq = words["seq"]
        self.w_fid = words["fid"]  # fid + 6 pad bytes share this word


def clock_pairs(fn: Function, fid: int) -> np.ndarray:
    """The driver's bracketed (mono, devclk, mono[, hostclk, vm_paused_ns]) samples
    (reading wakes the device)."""
    try:
        text = (fn.path / "tacc" / "clock_sync").read_text()
    except OSError:
        return np.zeros(0, CLOCK_DTYPE)
    return parse_clock_sync(text, fid)


class Sampler:
    def __init__(self, fns: list[Function], rate_hz: float, backend: str = "mmap",
                 catalogues: dict[str, Catalogue] | None = None, spin_us: float = 0.0) -> None:
        """``spin_us``: wait for deadlines closer than this by spinning instead of
        sleeping (no timer wakeup and idle exit per sample: their cost moves into the
        sampler's own loop)."""
        self.spin_ns = int(spin_us * 1000)
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate must be in (0, {MAX_RATE_HZ:g}] Hz")
        self.fns = fns
        self.rate_hz = rate_hz
        self.period_ns = int(round(1e9 / rate_hz))
        if backend == "device" and self.period_ns > 0xFFFF_FFFF:
            raise ValueError("device sampling: rate must be >= 0.25 Hz (u32 period in ns)")
        self.stats = SamplerStats()
        self.backend_name = backend
        self.sources: list[_Source] = []
        kw: dict[str, object] = {"period_ns": self.period_ns} if backend == "device" else {}
        try:
            for fid, fn in enumerate(fns):
                cat = (catalogues or {}).get(fn.pci) or default_catalogue(fn)
                self.sources.append(_Source(fid, fn, open_backend(backend, fn, cat, **kw),
                                            self.stats))
        except BaseException:
            self.close()
            raise
        self.itemsize_words = COUNTERS_DTYPE.itemsize // 8

    def close(self) -> None:
        for s in self.sources:
            s.backend.close()
        self.sources = []

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _clock(self, writer: CaptureWriter | None) -> list[np.ndarray]:
        pairs = [clock_pairs(s.fn, s.fid) for s in self.sources]
        if writer is not None:
            for p in pairs:
                writer.append("clock_sync", p)
        return pairs

    def run(self, duration_s: float | None = None, writer: CaptureWriter | None = None,
            stop: Event | None = None, max_ticks: int | None = None) -> SamplerStats:
        """Sample until ``duration_s``, ``max_ticks`` or ``stop``; returns the statistics."""
        if self.backend_name == "device":
            return self._run_device(duration_s, writer, stop, max_ticks)
        try:
            libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
        except AttributeError:
            pass
        st = self.stats
        start_pairs = self._clock(writer)
        # device ticks from CLOCK_MONOTONIC when no global uptime counter is readable
        offs = []
        for p in start_pairs:
            if len(p):
                k = int(np.argmin(p["mono_after"] - p["mono_before"]))
                mid = (int(p["mono_before"][k]) + int(p["mono_after"][k])) // 2
                offs.append(int(p["devclk"][k]) - mid)
            else:
                offs.append(0)
        nsrc = len(self.sources)
        buf = np.zeros(BATCH * nsrc, COUNTERS_DTYPE)
        w = buf.view("<u8").reshape(len(buf), self.itemsize_words)
        drops: list[tuple[int, int]] = []
        n = 0
        period = self.period_ns
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t_start = time.monotonic_ns()
        t_end = t_start + int(duration_s * 1e9) if duration_s else None
        tick = 0
        while True:
            for s in self.sources:
                snap = s.backend.read()
                st.retries += snap.retries
                if not snap.valid:
                    if snap.state == "torn":
                        st.torn += 1
                    else:
                        st.unavailable += 1
                    continue
                row = w[n]
                row[s.cols] = snap.values[s.sel]
                row[s.w_seq] = tick
                row[s.w_fid] = s.fid
                row[s.w_devclk] = (snap.values[s.uptime] if s.uptime >= 0
                                   else snap.t_ns + offs[s.fid])
                n += 1
            st.ticks += 1
            if n + nsrc > len(buf):
                if writer is not None:
                    writer.append("counters", buf[:n].copy())
                st.samples += n
                n = 0
            nxt = tick + 1
            if ((t_end is not None and t_start + nxt * period >= t_end)
                    or (max_ticks is not None and st.ticks >= max_ticks)
                    or (stop is not None and stop.is_set())):
                break
            now = time.monotonic_ns()
            late = (now - t_start) // period  # newest tick whose deadline has passed
            if late > nxt:  # skip the ticks we are too late for, and count them
                st.missed += late - nxt
                drops.append((now, late - nxt))
                nxt = late
            tick = nxt
            deadline = t_start + tick * period
            if deadline - now > self.spin_ns:
                sleep_until(deadline)
            else:
                while time.monotonic_ns() < deadline:
                    pass
        st.wall_s = (time.monotonic_ns() - t_start) / 1e9
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        st.cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        st.samples += n
        if writer is not None:
            writer.append("counters", buf[:n].copy())
            self._finish(writer, drops)
        return st


    def _run_device(self, duration_s: float | None, writer: CaptureWriter | None,
                    stop: Event | None, max_ticks: int | None) -> SamplerStats:
        """The device samples; this loop only drains the rings, a few times per ring.

        One record per device sample: ``seq`` is the device's sample number relative
        to the first one of the function (a gap is a drop), ``devclk`` the device's
        timestamp.  Drops are counted from SAMPLE_DROPPED (``missed`` and ``drops``
        records); ``ticks`` counts the samples of the first function.
        """
        from .device import DeviceBackend

        st = self.stats
        self._clock(writer)
        backends = [s.backend for s in self.sources]
        assert all(isinstance(b, DeviceBackend) for b in backends)
        entries = min(b.entries for b in backends)  # type: ignore[attr-defined]
        # come back at a quarter of the ring (device SAMPLE irq is at half), <= 50 ms
        poll_ns = max(1_000_000, min(50_000_000, entries * self.period_ns // 4))
        seq0: list[int | None] = [None] * len(self.sources)
        dropped0 = [b.dropped for b in backends]  # type: ignore[attr-defined]
        drops: list[tuple[int, int]] = []
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t_start = time.monotonic_ns()
        t_end = t_start + int(duration_s * 1e9) if duration_s else None
        done = False
        while not done:
            now = time.monotonic_ns()
            if ((t_end is not None and now >= t_end) or (stop is not None and stop.is_set())
                    or (max_ticks is not None and st.ticks >= max_ticks)):
                done = True  # one last drain
            for s in self.sources:
                b = s.backend.drain()  # type: ignore[attr-defined]
                n = len(b)
                if s.fid == 0 and max_ticks is not None:
                    n = min(n, max(0, max_ticks - st.ticks))
                if b.dropped != dropped0[s.fid]:
                    st.missed += b.dropped - dropped0[s.fid]
                    drops.append((now, b.dropped - dropped0[s.fid]))
                    dropped0[s.fid] = b.dropped
                if not n:
                    continue
                if seq0[s.fid] is None:
                    seq0[s.fid] = int(b.seq[0])
                rows = np.zeros(n, COUNTERS_DTYPE)
                w = rows.view("<u8").reshape(n, self.itemsize_words)
                w[:, s.cols] = b.values[:n][:, s.sel]
                w[:, s.w_seq] = b.seq[:n] - np.uint64(seq0[s.fid])
                w[:, s.w_fid] = s.fid
                w[:, s.w_devclk] = b.devclk[:n]
                if writer is not None:
                    writer.append("counters", rows)
                st.samples += n
                if s.fid == 0:
                    st.ticks += n
            if not done:
                sleep_until(time.monotonic_ns() + poll_ns)
        st.wall_s = (time.monotonic_ns() - t_start) / 1e9
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        st.cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        if writer is not None:
            self._finish(writer, drops)
        return st

    def _finish(self, writer: CaptureWriter, drops: list[tuple[int, int]]) -> None:
        """End of a run: the closing clock pairs and the missed samples as drops."""
        self._clock(writer)
        if drops:
            d = np.zeros(len(drops), DROPS_DTYPE)
            d["t_ns"] = [t for t, _ in drops]
            d["count"] = [c for _, c in drops]
            d["source"] = int(DropSource.COUNTERS)
            d["fid"] = 0xFFFF
            d["pid"] = os.getpid()
            writer.append("drops", d)


def capture_meta(fns: list[Function], rate_hz: float, backend: str) -> dict[str, object]:
    """meta.json fields for a counters-only capture (docs/capture-format.md)."""
    return {
        "node": os.uname().nodename,
        "kernel": os.uname().release,
        "devices": [{"pci": f.pci, "pf": f.pf, "vf": f.vf, "clock_hz": f.clock_hz,
                     "time_scale": f.time_scale,
                     "link": {"gen": f.gen, "width": f.width, "mps": f.mps, "mrrs": f.mrrs}}
                    for f in fns],
        "options": {"counters": {"rate_hz": rate_hz, "backend": backend}},
    }
