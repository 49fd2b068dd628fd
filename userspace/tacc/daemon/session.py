"""One capture: every collector into one capture directory (docs/taccd.md).

Used by taccd's capture mode and by ``accel-bpftrace record``.  ``tick()`` is called by
the owner's loop (every ~50 ms): it drains the BPF ring buffer, the device trace rings
and the API rings in bulk, samples counters and clock pairs when due, and counts every
drop into the ``drops`` stream.  Device events (driver netlink, functions appearing or
disappearing) are written to the ``device_events`` stream as they arrive
(``device_event``, ``add_function``, ``remove_function``) and flushed with the rest.  Disk
use is bounded by ``max_bytes``: past it, event records are counted as drops instead of
written.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tacc import hw
from tacc.capture import CaptureWriter
from tacc.capture.schema import (
    DEVICE_EVENTS_DTYPE,
    DROPS_DTYPE,
    NO_CTX,
    NO_FID,
    NO_QUEUE,
    DeviceEventKind,
    DropSource,
)
from tacc.counters.catalogue import CounterError
from tacc.devices import (
    TaccFunction,
    icount_info,
    kernel_release,
    machine_info,
    read_clock_sync,
)
from tacc.libc import libc

from .apiring import ApiRings
from .apiring import available as api_available
from .counters import CounterBlock, SampleRingCounters, SysfsCounters
from .devring import DeviceTraceRing, TraceRingError, trace_v3_supported
from .options import Options
from .procinfo import ProcessTable

# enum tacc_fault_type, by value: "unmapped", "permission", ...
FAULT_TYPES = {v: k.removeprefix("TACC_FAULT_").lower()
               for k, v in hw.ENUMS["tacc_fault_type"].items()}


# BPF events converted per slice of a tick (the device trace rings are drained between
# slices) and how often the program's cumulative drop counters are read
BPF_SLICE = 8192
BPF_STATS_S = 1.0
# When the BPF ring is drained: at every tick while it is quiet (at most BPF_IDLE events
# pending: a 50 ms latency, as before); busier, once BPF_BATCH events are pending or
# BPF_MAX_AGE_S after the last drain, so that a drain's fixed cost (tens of numpy calls,
# ~1 ms under TCG) is spread over more events.  The ring (16 MiB, ~140k events) holds
# more than a second of the heaviest load measured; a full ring's drops are counted.
BPF_IDLE = 256
# The device trace rings and the runtime API rings are drained when a ring is
# 1/RING_WATERMARK full or RING_MAX_AGE_S after its last drain (and at a flush, between
# BPF slices, at the end): a drain's fixed cost (the numpy calls, an ioctl) is paid a few
# times a second instead of at every 50 ms tick.  The rest of the ring is the
# headroom for a late tick; a full ring's drops are counted as before.
RING_WATERMARK = 4
RING_MAX_AGE_S = 0.25
BPF_BATCH = 8192
BPF_MAX_AGE_S = 0.2


# glibc malloc: M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_malloc_tuned = False


def tune_malloc() -> None:
    """Keep freed memory for reuse while capturing.  Every tick allocates and frees
    arrays of up to a few MB; by default glibc serves blocks that size with mmap (or trims
    the heap after them), so every tick page-faults its arrays in again and the kernel
    zeroes each page: under TCG that doubled the cost of converting an event.  Blocks
    up to 32 MiB now come from the heap, which shrinks only past 128 MiB free
    (``release_memory`` gives it back when a capture ends)."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    if hasattr(libc, "mallopt"):  # glibc
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 128 << 20)
    _malloc_tuned = True


def release_memory() -> None:
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class CaptureSession:
    def __init__(self, path: str | os.PathLike[str], functions: list[TaccFunction],
                 opts: Options, program: Any | None = None, tool: str = "taccd",
                 node: str | None = None) -> None:
        tune_malloc()
        self.path = Path(path)
        self.opts = opts
        self.program = program
        self.functions = list(functions)
        self.fid_of_dev = {f.devid: i for i, f in enumerate(self.functions)}
        self.fid_of_pci = {f.pci: i for i, f in enumerate(self.functions)}
        self.warnings: list[str] = []
        self.tlp_rings: dict[int, Any] = {}  # PF fid -> tacc.pcie.ring.TlpRing
        self.tlp_dropped: dict[int, int] = {}  # PF fid -> the ring's drops so far
        if opts.tlp:  # first: a refusal leaves no capture directory behind
            self._open_tlp()
        self.added: list[dict[str, Any]] = []
        self.removed: set[int] = set()
        # the trace record version asked of each function's ring: 3 where its CAPS
        # advertise it (FLOPs and bytes per command, minor 12), else 2
        self.trace_version = {fid: self._trace_version(fn)
                              for fid, fn in enumerate(self.functions)}
        meta = {
            "node": node or os.environ.get("TACC_NODE_ID") or socket.gethostname(),
            "devices": [{**f.meta(), "trace_version": self.trace_version[fid]}
                        for fid, f in enumerate(self.functions)],
            "kernel": kernel_release(),
            "qemu": machine_info().get("product_version", ""),
            "machine": machine_info(),
            "icount": icount_info(),
            "time_scale": float(self.functions[0].meta()["time_scale"]) if self.functions
            else 1.0,
            "clock_pairs": [],
            "options": opts.to_json(),
            "tool": tool,
            "python": platform.python_version(),
            "started_mono_ns": time.monotonic_ns(),
        }
        self.started_mono_ns = int(meta["started_mono_ns"])
        self.dumps_seen: set[tuple[str, int]] = set()  # devcoredumps: (devcdN, time_ns)
        try:
            self.writer = CaptureWriter(self.path, meta, chunk_bytes=256 << 10)
        except BaseException:
            for t in self.tlp_rings.values():
                t.close()
            raise
        self.procs = ProcessTable(self.writer.string_id)  # containers: cgroup, pid ns
        self.bytes_written = 0
        self.drops: dict[tuple[int, int], int] = {}
        self.counts: dict[str, int] = {}
        self.rings: dict[int, DeviceTraceRing] = {}
        self.t_ring: dict[tuple[str, int], float] = {}  # (ring, fid) -> its last drain
        self.counters: dict[int, CounterBlock | SysfsCounters] = {}  # sampled by taccd
        self.sample_rings: dict[int, SampleRingCounters] = {}  # sampled by the device
        self.api: ApiRings | None = None
        self.t_counters = self.t_clock = self.t_flush = self.t_bpf_stats = self.t_bpf = 0.0
        self.counters_due: float | None = None  # next slot of the counter sample grid
        self._open_collectors()
        self._read_counters()  # taccd-sampled counters: a sample at the start too
        self.clock_sample()
        from tacc.capture.clockx import Requester

        self.clockx = Requester(opts.peers) if opts.peers else None

    # ---------------------------------------------------------- collectors ---
    def _open_collectors(self) -> None:
        for fid, fn in enumerate(self.functions):
            self._open_function(fid, fn)
        if self.opts.api:
            ok, why = api_available()
            if ok:
                self.api = ApiRings(self.writer.string_id, self.fid_of_pci,
                                    set(self.opts.pids) or None)
            else:
                self.warnings.append(f"runtime API rings not captured: {why}")

    def _open_tlp(self) -> None:
        """The TLP capture ring of every PF in the capture, with the options' device-side
        filters (raises TlpCaptureError, one line: the caller asked for the stream, a
        capture without it would mislead)."""
        from tacc.pcie.ring import TlpCaptureError, TlpRing

        pfs = [(fid, fn) for fid, fn in enumerate(self.functions)
               if fn.kind == "pf" and fn.accel]
        if not pfs:
            raise TlpCaptureError("the TLP stream needs a PF in the capture (its link's "
                                  "analyzer): none is bound to tacc")
        try:
            for fid, fn in pfs:
                assert fn.accel is not None
                self.tlp_rings[fid] = TlpRing(fn.accel, self.opts.tlp_entries,
                                              *self.opts.tlp_filters())
                self.tlp_dropped[fid] = 0
        except BaseException:
            for t in self.tlp_rings.values():
                t.close()
            raise

    def _close_rings(self) -> None:
        for ring in self.rings.values():
            ring.close()
        for t in self.tlp_rings.values():
            t.close()
        for c in self.counters.values():
            c.close()
        for sr in self.sample_rings.values():
            sr.close()

    def _trace_version(self, fn: TaccFunction) -> int:
        return 3 if (self.opts.device_trace and fn.accel
                     and trace_v3_supported(fn.accel)) else 2

    def _open_function(self, fid: int, fn: TaccFunction) -> None:
        if self.opts.device_trace and fn.accel:
            v = self.trace_version.setdefault(fid, self._trace_version(fn))
            try:
                ring = self.rings[fid] = DeviceTraceRing(fn.accel, fid,
                                                         self.opts.trace_entries, v == 3)
                if ring.version != v:
                    self.warnings.append(f"{fn.pci}: trace records of version "
                                         f"{ring.version}, not {v}: the driver refused "
                                         f"version {v}")
            except (TraceRingError, OSError) as exc:
                self.warnings.append(f"{fn.pci}: device trace not captured: {exc}")
        if self.opts.counters_hz > 0:
            # a virtio-tacc function has no sample ring (its SAMPLE ioctls fail): taccd's
            # reads, without a warning
            if self.opts.counters_source == "device" and fn.accel and fn.kind != "virtio":
                try:
                    sr = self.sample_rings[fid] = SampleRingCounters(
                        fn, fid, self.opts.counters_hz, self._device_clock(fn))
                    self._append("counters", sr.bracket(), DropSource.COUNTERS)
                    return
                except (CounterError, OSError) as exc:
                    self.warnings.append(f"{fn.pci}: counters sampled by taccd, not the "
                                         f"device: {exc}")
            try:
                self.counters[fid] = CounterBlock(fn, fid, self._device_clock(fn))
            except OSError:
                self.counters[fid] = SysfsCounters(fn, fid)

    def _device_clock(self, fn: TaccFunction) -> Callable[[], int] | None:
        """For a VF or a virtio-tacc function (no global page of its own): its device's
        clock, read from its PF's mmap'd counter block; None for a PF, or when the PF's
        block has no global page (not root) and its samples keep device time 0."""
        pf = self.fid_of_pci.get(fn.pf) if fn.kind != "pf" else None
        if pf is None:
            return None
        block = self.counters.get(pf)
        if pf in self.sample_rings:
            block = self.sample_rings[pf].block
        if isinstance(block, CounterBlock) and block.has_global_page:
            return block.uptime
        return None

    def add_function(self, fn: TaccFunction) -> None:
        """A function appeared (VF enabled) during the capture."""
        if fn.pci in self.fid_of_pci:
            fid = self.fid_of_pci[fn.pci]
            if fid in self.removed:  # came back (VFs re-enabled, device re-plugged)
                self.removed.discard(fid)
                self.functions[fid] = fn
                self._hotplug(DeviceEventKind.HOTPLUG_ADD, fid, fn, time.monotonic_ns())
                self._open_function(fid, fn)
            return
        fid = len(self.functions)
        self.functions.append(fn)
        self.fid_of_dev[fn.devid] = fid
        self.fid_of_pci[fn.pci] = fid
        t_ns = time.monotonic_ns()
        self.trace_version[fid] = self._trace_version(fn)
        self.added.append({"fid": fid, "t_ns": t_ns, **fn.meta(),
                           "trace_version": self.trace_version[fid]})
        self._hotplug(DeviceEventKind.HOTPLUG_ADD, fid, fn, t_ns)
        self._open_function(fid, fn)

    def remove_function(self, pci: str) -> None:
        fid = self.fid_of_pci.get(pci)
        if fid is None or fid in self.removed:
            return
        self.removed.add(fid)
        self._hotplug(DeviceEventKind.HOTPLUG_REMOVE, fid, self.functions[fid],
                      time.monotonic_ns())
        for _, owner, drain in self._device_rings():  # what it produced so far, then closed
            ring = owner.pop(fid, None)
            if ring is not None:
                try:
                    drain(fid, ring)
                except OSError:
                    pass
                ring.close()
        c = self.counters.pop(fid, None)
        if c is not None:
            c.close()

    # ------------------------------------------------------- device events ---
    def device_event(self, ev: dict[str, Any]) -> None:
        """One decoded netlink event (``netlink.decode``) -> a ``device_events`` record.

        Events of functions outside the capture (``--device``) are not recorded; with no
        device filter, an event of a function taccd has not seen yet keeps fid NO_FID
        (taccd rediscovers devices first, see main.py)."""
        pci = str(ev.get("device", ""))
        fid = self.fid_of_pci.get(pci)
        if fid is None and self.opts.device:
            return
        num = int(ev.get("event", 0) or 0)
        try:
            kind = DeviceEventKind(num)
        except ValueError:
            kind = DeviceEventKind.OTHER
        if kind in (DeviceEventKind.HOTPLUG_ADD, DeviceEventKind.HOTPLUG_REMOVE):
            kind = DeviceEventKind.OTHER  # not a netlink number
        info = int(ev.get("info", 0) or 0)
        r = np.zeros(1, DEVICE_EVENTS_DTYPE)
        t = ev.get("timestamp") or ev.get("recv_mono_ns") or time.monotonic_ns()
        r["t_ns"] = int(t)
        r["fid"] = NO_FID if fid is None else fid
        r["kind"] = int(kind)
        r["tag"] = int(ev.get("tag", 0) or 0)
        r["addr"] = int(ev.get("addr", 0) or 0)
        r["seqno"] = int(ev.get("seqno", 0) or 0)
        r["pid"] = int(ev.get("pid", 0) or 0)
        r["arg"] = num if kind == DeviceEventKind.OTHER else info
        ctx = ev.get("ctx")
        if ctx is None and kind == DeviceEventKind.MMU_FAULT:
            ctx = info & hw.TACC_FAULT_CTX_MASK  # the context was gone when the driver looked
        r["ctx"] = NO_CTX if ctx is None else int(ctx) & 0xFFFFFFFF
        queue = int(ev.get("queue", 0) or 0)
        queued = kind in (DeviceEventKind.MMU_FAULT, DeviceEventKind.HANG,
                          DeviceEventKind.RESET, DeviceEventKind.OTHER)
        r["queue"] = NO_QUEUE if not queued or queue >= NO_QUEUE else queue
        detail = f"{ev.get('name') or kind.name.lower()} {pci}".strip()
        if kind == DeviceEventKind.MMU_FAULT:
            ftype = (info & hw.TACC_FAULT_TYPE_MASK) >> hw.TACC_FAULT_TYPE_SHIFT
            r["status"] = ftype
            detail += (f" {FAULT_TYPES.get(ftype, f'type {ftype}')}"
                       f" {'write' if info & hw.TACC_FAULT_WRITE else 'read'}")
        elif kind == DeviceEventKind.PM:
            detail += f" D{info} ({'suspended' if info else 'resumed'})"
        elif kind == DeviceEventKind.RESET and queue >= NO_QUEUE:
            detail += f" function reset, reason {info}"
        elif kind == DeviceEventKind.VF_ENABLE:
            detail += f" {info} VFs"
        self._device_record(r, detail)

    def _collect_devcoredumps(self) -> None:
        """tacc.ko's devcoredumps of the capture's functions taken since it started
        (kernel/tacc_coredump.c, /sys/class/devcoredump): each copied to
        devcoredump/<n>.txt and a DEVCOREDUMP device event at the dump's time (arg n; the
        job's ctx, queue, tag, seqno, pid when a job timed out), then freed (the kernel
        keeps a dump for 5 minutes otherwise; the capture holds it now).  Dumps from
        before the capture are left to their readers."""
        from tacc import devcoredump as dc

        for pci, fid in self.fid_of_pci.items():
            for d in dc.dumps_of(pci):
                try:
                    text = (d / "data").read_text(errors="replace")
                    dump = dc.parse(text)
                except (OSError, ValueError):
                    continue
                key = (d.name, dump.time_ns)
                if key in self.dumps_seen or dump.time_ns < self.started_mono_ns:
                    continue
                self.dumps_seen.add(key)
                n = len(self.dumps_seen)
                out = self.path / "devcoredump" / f"{n}.txt"
                out.parent.mkdir(exist_ok=True)
                out.write_text(text)
                dc.free(d)
                job = dump.job
                r = np.zeros(1, DEVICE_EVENTS_DTYPE)
                r["t_ns"], r["fid"] = dump.time_ns, fid
                r["kind"] = int(DeviceEventKind.DEVCOREDUMP)
                r["ctx"] = int(job.get("context", NO_CTX))
                r["queue"] = int(job.get("queue", NO_QUEUE))
                r["tag"] = int(job.get("tag", "0"), 0)
                r["seqno"] = int(job.get("seqno", 0))
                r["pid"] = int(job.get("pid", 0))
                r["arg"] = n
                self._device_record(r, f"devcoredump {pci} {dump.reason}: devcoredump/{n}.txt")

    def _hotplug(self, kind: DeviceEventKind, fid: int, fn: TaccFunction, t_ns: int) -> None:
        r = np.zeros(1, DEVICE_EVENTS_DTYPE)
        r["t_ns"], r["fid"], r["kind"] = t_ns, fid, int(kind)
        r["ctx"], r["queue"] = NO_CTX, NO_QUEUE
        r["arg"] = fn.vf
        what = "add" if kind == DeviceEventKind.HOTPLUG_ADD else "remove"
        self._device_record(r, f"hotplug {what} {fn.pci} " + (
            "virtio" if fn.kind == "virtio" else f"VF {fn.vf}" if fn.vf else "PF"))

    def _device_record(self, r: np.ndarray, detail: str) -> None:
        if self.bytes_written + r.nbytes > self.opts.max_bytes:
            self.drop(DropSource.DEVICE_EVENTS, 1, int(r["fid"][0]))
            return
        r["name_id"] = self.writer.string_id(detail) if detail else 0
        self._append("device_events", r, DropSource.DEVICE_EVENTS)

    # --------------------------------------------------------------- data ---
    def _append(self, stream: str, recs: np.ndarray, source: DropSource) -> None:
        if not len(recs):
            return
        if self.bytes_written + recs.nbytes > self.opts.max_bytes:
            self.drop(source, len(recs))
            return
        self.writer.append(stream, recs)
        self.bytes_written += recs.nbytes
        self.counts[stream] = self.counts.get(stream, 0) + len(recs)

    def drop(self, source: DropSource, count: int, fid: int = NO_FID, pid: int = 0) -> None:
        if count:
            key = (int(source), fid)
            self.drops[key] = self.drops.get(key, 0) + count
            d = np.zeros(1, DROPS_DTYPE)
            d["t_ns"], d["count"], d["pid"], d["fid"], d["source"] = (
                time.monotonic_ns(), count, pid, fid, int(source))
            self.writer.append("drops", d)

    def _write_ring(self, fid: int, ring: DeviceTraceRing) -> None:
        res = ring.drain()
        self._append("device_trace", res.records, DropSource.DEVICE_TRACE)
        self.drop(DropSource.DEVICE_TRACE, res.dropped, fid)

    def drain_bpf(self, ev: np.ndarray) -> None:
        from tacc.bpftrace.events import HOST_BASE, to_driver, to_host

        if not len(ev):
            return
        mask = ev["kind"] < HOST_BASE
        drv = to_driver(ev, self.fid_of_dev, mask)
        self._append("driver", drv, DropSource.DRIVER)
        self._append("processes", self.procs.see(drv["pid"]), DropSource.DRIVER)
        if self.opts.host_events:
            self._append("host", to_host(ev, mask), DropSource.HOST)

    def _drain_tlp(self, pf_fid: int, ring: Any) -> None:
        from tacc.capture.schema import TLP_DTYPE

        recs = ring.drain()
        pf = self.functions[pf_fid].pci
        out = np.zeros(len(recs), TLP_DTYPE)
        for name in recs.dtype.names:
            out[name] = recs[name]
        fid = np.full(256, NO_FID, np.uint16)  # func on the PF's link -> capture fid
        for i, fn in enumerate(self.functions):
            if fn.pf == pf and 0 <= fn.vf < 256 and i not in self.removed:
                fid[fn.vf] = i
        out["fid"] = fid[recs["func"]]
        self._append("tlp", out, DropSource.TLP)
        self.drop(DropSource.TLP, ring.dropped - self.tlp_dropped[pf_fid], pf_fid)
        self.tlp_dropped[pf_fid] = ring.dropped

    def _drain_samples(self, fid: int, ring: SampleRingCounters) -> None:
        recs, lost = ring.drain()
        self._append("counters", recs, DropSource.COUNTERS)
        self.drop(DropSource.COUNTERS, lost, fid)

    def _ring_due(self, key: tuple[str, int], ring: DeviceTraceRing | SampleRingCounters,
                  now: float) -> bool:
        """A device ring is drained at its watermark or its age (RING_MAX_AGE_S)."""
        if now - self.t_ring.get(key, 0.0) >= RING_MAX_AGE_S or \
                ring.pending() * RING_WATERMARK >= ring.entries:
            self.t_ring[key] = now
            return True
        return False

    def _device_rings(self) -> tuple[tuple[str, dict[int, Any], Any], ...]:
        """(name, fid -> ring, its drain) of every ring read from a device."""
        return (("TLP ring", self.tlp_rings, self._drain_tlp),
                ("trace ring", self.rings, self._write_ring),
                ("sample ring", self.sample_rings, self._drain_samples))

    def _drain_devices(self, force: bool = True, now: float = 0.0) -> None:
        for what, owner, drain in self._device_rings():
            for fid, ring in list(owner.items()):
                try:
                    if not force and owner is not self.tlp_rings and \
                            not self._ring_due((what, fid), ring, now):
                        continue
                    drain(fid, ring)
                except (OSError, CounterError) as exc:  # device gone
                    self.warnings.append(f"fid {fid}: {what}: {exc}")
                    ring.close()
                    del owner[fid]

    def _drain_program(self) -> None:
        """The BPF ring in slices of at most ``BPF_SLICE`` events, the device trace rings
        drained between slices: a busy tick (tens of thousands of events, slowed further by
        the traced workload sharing the CPU) must not leave a device ring to overflow."""
        assert self.program is not None
        reader = self.program.reader
        # what is pending now, at most: events arriving meanwhile wait for the next tick
        budget = max(reader.pending_bytes() // reader.stride, 0)
        while True:
            ev = reader.drain(min(BPF_SLICE, max(budget, 1)))
            self.drain_bpf(ev)
            budget -= len(ev)
            if len(ev) < BPF_SLICE or budget <= 0:
                break
            self._between_slices()

    def _between_slices(self) -> None:
        """What must not wait for a long tick to end: the device trace rings (4096
        records by default) and a counter sample that has come due."""
        self._drain_devices()
        hz = self.opts.counters_hz
        if hz > 0 and self.counters_due is not None:
            now = time.monotonic()
            if now >= self.counters_due - 0.5 / hz:
                self.sample_counters(now)

    def clock_sample(self) -> None:
        for fid, fn in enumerate(self.functions):
            if fid in self.counters or fid in self.rings or fn.accel:
                recs = read_clock_sync(fn, fid)
                if not len(recs):
                    self.drop(DropSource.CLOCK, 1, fid)
                self._append("clock_sync", recs, DropSource.CLOCK)

    def _bpf_due(self, now: float) -> bool:
        reader = self.program.reader  # type: ignore[union-attr]
        pending = reader.pending_bytes() // reader.stride
        return pending > 0 and (pending <= BPF_IDLE or pending >= BPF_BATCH
                                or now - self.t_bpf >= BPF_MAX_AGE_S)

    def tick(self, now: float | None = None, final: bool = False) -> None:
        """Drain and sample what is due (``final``: everything, the capture ends)."""
        now = time.monotonic() if now is None else now
        flush = now - self.t_flush >= self.opts.flush_s
        self._drain_devices(final or flush, now)
        if final or flush:
            self._collect_devcoredumps()
        if self.program is not None:
            # before a flush too: what is on disk is at most one flush period old
            if final or flush or self._bpf_due(now):
                self.t_bpf = now
                self._drain_program()
                self._drain_devices()
            if final or now - self.t_bpf_stats >= BPF_STATS_S:
                # cumulative counters (ring-full drops, skipped handler runs): read once a
                # second and at the end; every drop is counted, its record <= 1 s late
                self.t_bpf_stats = now
                self._bpf_drops()
        if self.api is not None:
            self.api.scan()  # every tick: a new ring is enabled without delay
        if self.api is not None and (final or flush or self.api.due(now, RING_WATERMARK,
                                                                     RING_MAX_AGE_S)):
            recs, dropped = self.api.drain(now)
            self._append("api", recs, DropSource.API)
            self.drop(DropSource.API, dropped)
        hz = self.opts.counters_hz
        if hz > 0 and self.counters and (self.counters_due is None
                                         or now >= self.counters_due - 0.5 / hz):
            self.sample_counters(now)
        if self.opts.clock_hz > 0 and now - self.t_clock >= 1.0 / self.opts.clock_hz:
            self.t_clock = now
            self.clock_sample()
        if self.clockx is not None:
            self._append("net_clock", self.clockx.poll(now, final), DropSource.CLOCK)
        if flush:
            self.t_flush = now
            self.writer.flush()

    def sample_counters(self, now: float) -> None:
        """One sample per function.  Samples are due on a 1/counters_hz grid (a tick up to
        half a period early takes the next one); grid slots that passed without a sample
        (the loop ran a whole period late) are counted as ``counters`` drops."""
        hz = self.opts.counters_hz
        if hz > 0:
            period = 1.0 / hz
            if self.counters_due is None:
                self.counters_due = now + period
            else:
                missed = int((now - self.counters_due) / period) \
                    if now > self.counters_due else 0
                if missed > 0:
                    self.drop(DropSource.COUNTERS, missed)
                self.counters_due += (missed + 1) * period
        self.t_counters = now
        self._read_counters()

    def _read_counters(self) -> None:
        """One sample of every taccd-sampled function, now (outside the grid)."""
        for fid, c in list(self.counters.items()):
            try:
                self._append("counters", c.sample(), DropSource.COUNTERS)
            except (OSError, ValueError):
                self.drop(DropSource.COUNTERS, 1, fid)

    _bpf_seen = (0, 0)

    def _bpf_drops(self) -> None:
        st = self.program.stats() if self.program is not None else None
        if st is None:
            return
        # ring-buffer-full drops plus handler runs the kernel skipped (recursion misses)
        drv, host = st.dropped + st.driver_missed, st.host_dropped + st.host_missed
        d, h = drv - self._bpf_seen[0], host - self._bpf_seen[1]
        self._bpf_seen = (drv, host)
        self.drop(DropSource.DRIVER, d)
        self.drop(DropSource.HOST, h)

    def status(self) -> dict[str, Any]:
        drops: dict[str, int] = {}
        for (src, _fid), n in self.drops.items():  # summed over functions
            name = DropSource(src).name.lower()
            drops[name] = drops.get(name, 0) + n
        return {"path": str(self.path), "records": dict(self.counts),
                "bytes": self.bytes_written,
                "drops": drops,
                "warnings": list(self.warnings), "devices": len(self.functions)}

    def close(self, complete: bool = True) -> dict[str, Any]:
        now = time.monotonic()
        self.counters_due = None  # the final sample: no late-sample accounting
        self.opts.flush_s = 3600.0
        self.tick(now, final=True)
        if self.opts.counters_hz > 0 and self.counters and self.t_counters != now:
            self.sample_counters(now)
        for fid, sr in list(self.sample_rings.items()):  # the last sample, read now
            try:
                self._append("counters", sr.bracket(), DropSource.COUNTERS)
            except (OSError, ValueError):
                self.drop(DropSource.COUNTERS, 1, fid)
        if self.t_clock != now:
            self.clock_sample()
        self._close_rings()
        if self.api is not None:
            self.warnings.extend(self.api.errors)
            self.api.close()
        if self.clockx is not None:
            self.clockx.close()
        summary = self.status()
        # device events are the device_events stream; the marker keeps the full description
        # of functions added mid-capture (meta.json is written once)
        extra = {"tool_summary": summary, "devices_added": self.added}
        self.writer.close(complete=complete, extra=extra)
        release_memory()
        return summary
