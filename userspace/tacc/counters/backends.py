"""Four ways to read the counters of one function, behind one interface.

``read()`` returns a :class:`Snapshot` of the selected counters (catalogue order).
Only differences between two snapshots of the same backend are comparable across
backends: sysfs gives the driver's totals (monotonic across runtime suspends),
mmap the raw counter block (zeroed by every function reset), perf the counts since
the events were opened, device the raw counter block as the device sampled it into
the driver's sample ring (device.py).  See docs/counters.md.
"""

from __future__ import annotations

import ctypes as C
import mmap
import os
import time
from pathlib import Path

import numpy as np

from tacc.libc import NR_PERF_EVENT_OPEN, PERF_ATTR_SIZE, PerfEventAttr, libc
from tacc.runtime import uapi

from .base import Backend, Snapshot
from .catalogue import (
    GLOBAL_PAGE,
    SLOT_GEN,
    SLOT_HDR,
    SYSFS_ROOT,
    Catalogue,
    CounterError,
    Function,
)
from .device import DeviceBackend

ALL_ONES = 0xFFFF_FFFF_FFFF_FFFF
SEQLOCK_TRIES = 16


# ------------------------------------------------------------------- sysfs ----
class SysfsBackend(Backend):
    """One file per counter (``counters/``: the PF's root only; ``global_counters/``
    root only)."""

    name = "sysfs"

    def __init__(self, fn: Function, catalogue: Catalogue | None = None) -> None:
        super().__init__(fn, catalogue)
        self.fds: list[int] = []
        try:
            for c in self.catalogue:
                d = fn.global_dir() if c.is_global else fn.counters_dir
                self.fds.append(os.open(d / c.name, os.O_RDONLY))
        except PermissionError as exc:
            self.close()
            raise CounterError(f"{fn.pci}: {exc.filename}: global counters and the PF's "
                               "need root") from exc
        except FileNotFoundError as exc:
            self.close()
            raise CounterError(f"{fn.pci}: {exc.filename} missing") from exc

    def read(self) -> Snapshot:
        t0 = time.monotonic_ns()
        vals = np.fromiter((int(os.pread(fd, 32, 0)) for fd in self.fds), np.uint64,
                           len(self.fds))
        return Snapshot(vals, (t0 + time.monotonic_ns()) // 2)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


# -------------------------------------------------------------------- mmap ----
class MmapBackend(Backend):
    """The BAR2 counter block mapped read-only through the accel node.

    On a VF page 0 (its function counters) is open to the node's users; on the PF both
    pages need CAP_PERFMON (its function page sums every tenant's work, page 1 holds the
    global counters).  A consistent snapshot reads gen, the counters, gen again and retries
    while gen is odd or moved (tacc_hw.h).  In D3hot the BAR does not decode (all
    ones on hardware, zeros under QEMU): a page whose header slot is not
    ``version << 32 | n`` gives an ``unavailable`` snapshot, never its values.
    """

    name = "mmap"

    def __init__(self, fn: Function, catalogue: Catalogue | None = None,
                 node: Path | None = None) -> None:
        super().__init__(fn, catalogue)
        self.fd = os.open(node or fn.accel_node, os.O_RDWR)
        try:
            need_global = any(c.is_global for c in self.catalogue)
            size = 2 * GLOBAL_PAGE if need_global else GLOBAL_PAGE
            try:
                self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ,
                                    offset=uapi.MMAP_COUNTERS)
            except PermissionError as exc:
                what = "the global counter page" if fn.vf else "the PF's counter page"
                raise CounterError(f"{fn.pci}: mmap of {what} needs CAP_PERFMON") from exc
        except BaseException:
            os.close(self.fd)
            raise
        self.u64 = np.frombuffer(self.mm, dtype="<u8")
        slots = np.array([c.offset // 8 for c in self.catalogue], dtype=np.intp)
        # one contiguous copy per page (few MMIO exits), then a gather in RAM
        self.spans: list[tuple[int, int]] = []
        for page in (0, 1):
            on = slots[(slots >= page * 512) & (slots < (page + 1) * 512)]
            if len(on):  # from the header slot: a read without it is undefined
                self.spans.append((page * 512 + SLOT_HDR, int(on.max()) + 1))
        base = np.cumsum([0] + [hi - lo for lo, hi in self.spans])
        pos = np.empty(len(slots), np.intp)
        for (lo, hi), b in zip(self.spans, base, strict=False):
            m = (slots >= lo) & (slots < hi)
            pos[m] = slots[m] - lo + b
        self.pos = pos
        self.gens = [(lo // 512) * 512 + SLOT_GEN for lo, _ in self.spans]
        self.version = self.catalogue.version or 1  # TACC_CNT_VERSION, header bits 63:32

    def page_view(self, page: int = 0) -> np.ndarray:
        """A numpy structured view (hdr, gen, counters by name) of one live page."""
        cat = self.catalogue.select(scope="global" if page else "function")
        dt = cat.page_dtype(2 * GLOBAL_PAGE if page else GLOBAL_PAGE)
        return np.ndarray((), dtype=dt, buffer=self.mm, offset=page * GLOBAL_PAGE)

    def header(self) -> int:
        return int(self.u64[SLOT_HDR])

    def read(self) -> Snapshot:
        u64, gens, spans = self.u64, self.gens, self.spans
        t0 = time.monotonic_ns()
        tries = 0
        for tries in range(SEQLOCK_TRIES):  # noqa: B007
            g0 = [int(u64[g]) for g in gens]
            if ALL_ONES in g0:
                return Snapshot(np.zeros(len(self.pos), np.uint64), t0, False, "unavailable",
                                tries)
            parts = [u64[lo:hi].copy() for lo, hi in spans]
            g1 = [int(u64[g]) for g in gens]
            if g0 == g1 and not any(g & 1 for g in g0):
                if any(int(p[SLOT_HDR]) >> 32 != self.version for p in parts):
                    # D3hot: the BAR does not decode (all ones on hardware, zero on QEMU)
                    return Snapshot(np.zeros(len(self.pos), np.uint64), t0, False,
                                    "unavailable", tries)
                vals = (parts[0] if len(parts) == 1 else np.concatenate(parts))[self.pos]
                return Snapshot(vals, (t0 + time.monotonic_ns()) // 2, True, "ok", tries)
        gone = ALL_ONES in [int(u64[g]) for g in gens]
        return Snapshot(np.zeros(len(self.pos), np.uint64), t0, False,
                        "unavailable" if gone else "torn", SEQLOCK_TRIES)

    def close(self) -> None:
        if getattr(self, "mm", None) is not None:
            del self.u64
            self.mm.close()
            self.mm = None  # type: ignore[assignment]
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# -------------------------------------------------------------------- perf ----
PERF_FORMAT_GROUP = 1 << 3


def pmu_dir(fn: Function) -> Path:
    return SYSFS_ROOT / "bus" / "event_source" / "devices" / fn.pmu_name


def perf_config(fn: Function, event: str) -> int:
    """Encode an event of the PMU's events/ directory through its format/ fields."""
    d = pmu_dir(fn)
    spec = (d / "events" / event).read_text().strip()
    config = 0
    for term in spec.split(","):
        key, _, val = term.partition("=")
        fmt = (d / "format" / key).read_text().strip()  # e.g. config:0-7
        target, _, bits = fmt.partition(":")
        if target != "config":
            raise CounterError(f"{fn.pmu_name}: format {key} uses {target}")
        lo, _, hi = bits.partition("-")
        width = int(hi or lo) - int(lo) + 1
        config |= (int(val or "1", 0) & ((1 << width) - 1)) << int(lo)
    return config


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int) -> int:
    fd = libc.syscall(NR_PERF_EVENT_OPEN, C.byref(attr), pid, cpu, group_fd, 0)
    if fd < 0:
        err = C.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


class PerfBackend(Backend):
    """The driver's perf PMU (tacc_<hex>), one counting group, read in one read(2)."""

    name = "perf"

    def __init__(self, fn: Function, catalogue: Catalogue | None = None) -> None:
        super().__init__(fn, catalogue)
        d = pmu_dir(fn)
        if not d.exists():
            raise CounterError(f"{fn.pci}: no perf PMU {fn.pmu_name}")
        ptype = int((d / "type").read_text())
        cpu = int((d / "cpumask").read_text().split(",")[0].split("-")[0])
        self.fds: list[int] = []
        try:
            for c in self.catalogue:
                attr = PerfEventAttr(type=ptype, size=PERF_ATTR_SIZE,
                                     config=perf_config(fn, c.name),
                                     read_format=PERF_FORMAT_GROUP)
                leader = self.fds[0] if self.fds else -1
                self.fds.append(perf_event_open(attr, -1, cpu, leader))
        except OSError as exc:
            self.close()
            raise CounterError(f"{fn.pmu_name}: perf_event_open: {exc.strerror} "
                               "(system-wide events need CAP_PERFMON; global ones always)") from exc
        self.nbytes = 8 * (1 + len(self.fds))

    def read(self) -> Snapshot:
        t0 = time.monotonic_ns()
        buf = os.read(self.fds[0], self.nbytes)
        vals = np.frombuffer(buf, "<u8")[1:].copy()
        return Snapshot(vals, (t0 + time.monotonic_ns()) // 2)

    def close(self) -> None:
        for fd in reversed(self.fds):
            os.close(fd)
        self.fds = []



BACKENDS: dict[str, type[Backend]] = {
    "sysfs": SysfsBackend, "mmap": MmapBackend, "perf": PerfBackend, "device": DeviceBackend,
}


def open_backend(name: str, fn: Function, catalogue: Catalogue | None = None,
                 **kwargs: object) -> Backend:
    """``kwargs`` go to the backend (``device``: ``period_ns``, ``entries``)."""
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise CounterError(f"unknown backend {name!r} (have {', '.join(BACKENDS)})") from None
    return cls(fn, catalogue, **kwargs)  # type: ignore[arg-type]


def default_catalogue(fn: Function) -> Catalogue:
    """Function counters, plus the global ones when this process may read them."""
    cat = fn.catalogue
    if fn.vf or os.geteuid() != 0:
        return cat.select(scope="function")
    return cat
