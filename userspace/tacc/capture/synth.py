"""Synthetic captures for the good/bad twin workloads (tests and benchmarks).

Captures of the same format as taccd's, written from each twin's plan (tacc.plans: the
sizes and commands the real twin runs) with a vectorised model: the device's times are
tacc.model's (serial queues, a shared link, page walks, the roofline), the host's are
the constants below (API call costs, ioctls, interrupts, scheduling).  ``truth`` returns
what the model knows (device time, expected findings, clock parameters) for the tests
to compare against.

    python -m tacc.capture.synth OUT --workload tiny_transfers --variant bad
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tacc import model, plans
from tacc.model.link import (
    D2H,
    H2D,
    LINK_CPL_OVERHEAD,
    TLP_OVERHEAD_BYTES,
    copy_tlps,
)

from .schema import (
    API_DTYPE,
    CLOCK_DTYPE,
    COUNTERS_DTYPE,
    DEVICE_EVENTS_DTYPE,
    DEVICE_TRACE_DTYPE,
    DRIVER_DTYPE,
    DROPS_DTYPE,
    FUNC_COUNTERS,
    HOST_DTYPE,
    NO_CTX,
    NO_FID,
    NO_QUEUE,
    BlockOp,
    DeviceEventKind,
    DmaDir,
    DriverFlag,
    DriverKind,
    DropSource,
    Engine,
    HostKind,
    Opcode,
)
from .writer import CaptureWriter

KiB = 1024
MiB = 1024 * 1024

# --- the host's model (documented in docs/capture-format.md, "Synthetic"); the device's
# times are tacc.model's (the QEMU device's defaults): nothing here computes device time ---
DEV = model.DEFAULT  # the synthetic device's parameters
IRQ_NS = 4000  # completion -> interrupt handled
WAKE_NS = 6000  # interrupt -> waiting thread runs
API_NS = 2000  # runtime bookkeeping of one call
IOCTL_NS = 5000  # submit ioctl
MAP_NS = 25_000  # dma map of a userptr buffer (pin + IOMMU map)
MAP_PER_PAGE_NS = 20
UNMAP_NS = 15_000
SAMPLE_NS = 100_000
CLOCK_PERIOD_NS = 5_000_000


def xfer_ns(nbytes: int, share: float = 1.0, kind: str = H2D) -> int:
    """Device time of an aligned copy at ``share`` of the link (tacc.model.copy_ns)."""
    return model.copy_ns(kind, int(nbytes), share=share)


def gemm_ns(st: plans.Step, misses: int = 0, page_size: int = 4096) -> int:
    """Device time of a plan's fp32 GEMM (beta 0) with ``misses`` TLB misses."""
    return model.gemm_ns(st.m, st.n, st.k, beta=False) + model.walk_ns(misses, page_size)


def gemm_flops(st: plans.Step) -> int:
    return model.gemm_flops(st.m, st.n, st.k)


def serial_schedule(ready: np.ndarray, dur: np.ndarray, floor: int = 0) -> tuple[np.ndarray, ...]:
    """start_i = max(ready_i, end_{i-1}), end_i = start_i + dur_i, vectorised."""
    ready = np.maximum(np.asarray(ready, np.int64), floor)
    dur = np.asarray(dur, np.int64)
    s = np.cumsum(dur)
    s_prev = s - dur
    end = s + np.maximum.accumulate(ready - s_prev)
    return end - dur, end


@dataclass
class FuncSpec:
    pci: str
    vf: int


@dataclass
class Sim:
    """Accumulates the events of a synthetic run (all times CLOCK_MONOTONIC ns)."""

    seed: int = 0
    node: str = "node0"
    nvfs: int = 2
    dev_offset: int = 5_000_000_000_000  # device ticks at mono 0
    drift_ppm: float = 37.0
    host_offset: int = 1_700_000_000_000_000_000  # host realtime at mono 0
    rng: np.random.Generator = field(init=False)
    cmds: list[dict[str, np.ndarray]] = field(default_factory=list)
    api: list[np.ndarray] = field(default_factory=list)
    driver: list[np.ndarray] = field(default_factory=list)
    host: list[np.ndarray] = field(default_factory=list)
    strings: dict[str, int] = field(default_factory=dict)
    tag_seq: dict[int, int] = field(default_factory=dict)
    job_seq: dict[int, int] = field(default_factory=dict)
    queue_end: dict[tuple[int, int], int] = field(default_factory=dict)
    segments: list[dict[str, Any]] = field(default_factory=list)
    dev_events: list[np.ndarray] = field(default_factory=list)
    device_events: bool = True  # write() adds a PM resume, an MMU fault and a PM suspend
    net_clock: list[np.ndarray] = field(default_factory=list)  # clock exchanges
    host_clock: bool = True  # clock_sync pairs carry the host clock (False: hostclk 0)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.funcs = [FuncSpec("0000:01:00.0", 0)] + [
            FuncSpec(f"0000:01:00.{i + 1}", i + 1) for i in range(self.nvfs)
        ]

    # ------------------------------------------------------------- helpers --
    def sid(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
        return self.strings[text]

    def tags(self, pid: int, n: int) -> np.ndarray:
        s = self.tag_seq.get(pid, 0)
        self.tag_seq[pid] = s + n
        return (np.uint64(pid) << np.uint64(32)) | (np.arange(s + 1, s + n + 1, dtype=np.uint64))

    def jobs(self, fid: int, n: int) -> np.ndarray:
        s = self.job_seq.get(fid, 0)
        self.job_seq[fid] = s + n
        return np.arange(s + 1, s + n + 1, dtype=np.uint32)

    def dev_ticks(self, mono: np.ndarray) -> np.ndarray:
        m = np.asarray(mono, np.int64).astype(np.float64)
        return (self.dev_offset + np.rint(m * (1.0 + self.drift_ppm * 1e-6))).astype(np.uint64)

    def add_api(self, pid: int, tid: int, name: str, t0: np.ndarray, t1: np.ndarray,
                tag: np.ndarray | int = 0, nbytes: np.ndarray | int = 0, fid: int = NO_FID,
                args: str = "") -> None:
        t0 = np.atleast_1d(np.asarray(t0, np.int64))
        a = np.zeros(len(t0), API_DTYPE)
        a["t_start"], a["t_end"] = t0, t1
        a["tag"], a["bytes"], a["pid"], a["tid"] = tag, nbytes, pid, tid
        a["name_id"], a["args_id"], a["fid"] = self.sid(name), self.sid(args) if args else 0, fid
        self.api.append(a)

    def add_driver(self, kind: DriverKind, t: np.ndarray, **cols: Any) -> None:
        t = np.atleast_1d(np.asarray(t, np.int64))
        d = np.zeros(len(t), DRIVER_DTYPE)
        d["t_ns"], d["kind"] = t, int(kind)
        for k, v in cols.items():
            d[k] = v
        self.driver.append(d)

    def add_host(self, kind: HostKind, t: np.ndarray, **cols: Any) -> None:
        t = np.atleast_1d(np.asarray(t, np.int64))
        h = np.zeros(len(t), HOST_DTYPE)
        h["t_ns"], h["kind"] = t, int(kind)
        for k, v in cols.items():
            h[k] = v
        self.host.append(h)

    def add_device_event(self, kind: DeviceEventKind, t: int, fid: int = 0,
                         detail: str = "", **cols: Any) -> None:
        d = np.zeros(1, DEVICE_EVENTS_DTYPE)
        d["t_ns"], d["kind"], d["fid"] = t, int(kind), fid
        d["ctx"], d["queue"] = NO_CTX, NO_QUEUE
        d["name_id"] = self.sid(detail) if detail else 0
        for k, v in cols.items():
            d[k] = v
        self.dev_events.append(d)

    def default_device_events(self) -> None:
        """What a real capture of the workload would see: the PF resumes before the first
        call, one MMU fault (a stray VA, no job of the workload) mid-run, and the PF
        suspends after the last call.  They are not in the driver stream (the analysis
        does not look at them)."""
        lo = min(int(a["t_start"].min()) for a in self.api)
        hi = max(int(a["t_end"].max()) for a in self.api)
        pf = self.funcs[0].pci
        self.add_device_event(DeviceEventKind.PM, lo, arg=0, detail=f"pm {pf} D0 (resumed)")
        info = (1 << 31) | (1 << 24) | (0 << 16) | 1  # valid, unmapped, queue 0, ctx 1
        self.add_device_event(DeviceEventKind.MMU_FAULT, (lo + hi) // 2, ctx=1, queue=0,
                              tag=(PID << 32) | 0xFFFFFF, addr=0xDEAD_0000, arg=info,
                              status=1, pid=PID,
                              detail=f"mmu_fault {pf} unmapped read")
        self.add_device_event(DeviceEventKind.PM, hi, arg=3, detail=f"pm {pf} D3 (suspended)")

    # ------------------------------------------------------------- submit ---
    def submit(
        self, *, fid: int, queue: int, pid: int, tid: int, api_t0: np.ndarray, name: str,
        opcode: int, nbytes: np.ndarray, dur: np.ndarray, ready: np.ndarray | None = None,
        tlps: np.ndarray | None = None, tlb_misses: np.ndarray | int = 0, ctx: int = 1,
        flops: np.ndarray | int = 0, tag: np.ndarray | None = None, args: str = "",
    ) -> dict[str, np.ndarray]:
        """One API call = one job = one command per element; returns device start/end.
        ``tag``: the calls' tags (a tag carried from another node), else new ones."""
        api_t0 = np.asarray(api_t0, np.int64)
        n = len(api_t0)
        tag = self.tags(pid, n) if tag is None else np.asarray(tag, np.uint64)
        job = self.jobs(fid, n)
        t_sub = api_t0 + API_NS
        t_bell = t_sub + IOCTL_NS - 500
        dev_ready = t_bell  # the device fetches at the doorbell (tacc-sched.c)
        if ready is not None:
            dev_ready = np.maximum(dev_ready, ready)
        start, end = serial_schedule(dev_ready, dur, self.queue_end.get((fid, queue), 0))
        self.queue_end[(fid, queue)] = int(end[-1]) if n else self.queue_end.get((fid, queue), 0)
        nbytes = np.broadcast_to(np.asarray(nbytes, np.int64), (n,))
        if tlps is None:  # aligned buffers (devinfo, section 9)
            tlps = copy_tlps(nbytes, Opcode(opcode) == Opcode.COPY_H2D, DEV.mps)
        engine = {Opcode.COPY_H2D: Engine.DMA_H2D, Opcode.COPY_D2H: Engine.DMA_D2H}.get(
            Opcode(opcode), Engine.COMPUTE0 + queue % 4)
        self.cmds.append(dict(
            fid=np.full(n, fid), queue=np.full(n, queue), ctx=np.full(n, ctx), tag=tag, job=job,
            opcode=np.full(n, opcode), engine=np.full(n, int(engine)), bytes=nbytes,
            tlps=np.broadcast_to(tlps, (n,)), tlb=np.broadcast_to(tlb_misses, (n,)),
            t_fetch=np.minimum(t_bell, start), t_start=start, t_end=end,
            flops=np.broadcast_to(flops, (n,)),
        ))
        self.add_api(pid, tid, name, api_t0, t_sub + IOCTL_NS + 300, tag, nbytes, fid,
                     args=args or f"q={queue}")
        self.add_driver(DriverKind.IOCTL, t_sub, dur_ns=IOCTL_NS, pid=pid, tid=tid, fid=fid,
                        ctx=ctx, queue=queue, tag=tag, job=job, arg=0x40, ncmds=1)
        self.add_driver(DriverKind.SUBMIT, t_sub + 1000, pid=pid, tid=tid, fid=fid, ctx=ctx,
                        queue=queue, tag=tag, job=job, ncmds=1, size=nbytes)
        self.add_driver(DriverKind.DOORBELL, t_bell, pid=pid, tid=tid, fid=fid, ctx=ctx,
                        queue=queue, tag=tag, job=job)
        t_irq = end + IRQ_NS
        self.add_driver(DriverKind.IRQ, t_irq, fid=fid, queue=queue, arg=queue)
        self.add_driver(DriverKind.JOB_DONE, t_irq + 500, pid=pid, fid=fid, ctx=ctx, queue=queue,
                        tag=tag, job=job, ncmds=1, size=nbytes, dev_start=self.dev_ticks(start),
                        dev_end=self.dev_ticks(end))
        return {"start": start, "end": end, "api_end": t_sub + IOCTL_NS + 300, "tag": tag}

    def synchronize(self, pid: int, tid: int, t0: int, done: int) -> int:
        """A blocking wait: API call, the thread sleeps until the completion wakes it."""
        t_wake = max(t0 + API_NS, done + IRQ_NS + WAKE_NS)
        self.add_api(pid, tid, "synchronize", np.array([t0]), np.array([t_wake]))
        if t_wake - t0 > 20_000:
            self.add_host(HostKind.SCHED_SWITCH, t0 + 1000, pid=pid, tid=tid, next_pid=0,
                          prev_state=1, comm=b"tacc-run", next_comm=b"swapper/0")
            self.add_host(HostKind.SCHED_WAKEUP, done + IRQ_NS + 1000, pid=pid, tid=tid,
                          comm=b"tacc-run")
            self.add_host(HostKind.SCHED_SWITCH, t_wake - 500, pid=0, tid=0, next_pid=tid,
                          comm=b"swapper/0", next_comm=b"tacc-run")
        return t_wake

    def buffers(self, pid: int, tid: int, t: int, fid: int, sizes: list[int],
                page_size: int = 2 * MiB, userptr: bool = False, align: int = 0) -> int:
        """Allocate, map and bind buffers once (setup); returns the time after it."""
        for i, size in enumerate(sizes):
            va = 0x1_0000_0000 * (i + 1)
            flags = int(DriverFlag.USERPTR if userptr else DriverFlag.DEVMEM)
            addr = (0x7F00_0000_0000 + i * 0x1000_0000 + align) if userptr else 0
            self.add_driver(DriverKind.BO_CREATE, t, pid=pid, tid=tid, fid=fid, size=size,
                            addr=addr, arg=100 + i, flags=flags, dur_ns=3000)
            t += 4000
            if userptr:
                d = MAP_NS + MAP_PER_PAGE_NS * (size // 4096)
                self.add_driver(DriverKind.DMA_MAP, t, pid=pid, tid=tid, fid=fid, size=size,
                                addr=0xF000_0000 + i * 0x1000_0000,
                                nsegs=max(size // (64 * KiB), 1),
                                dir=int(DmaDir.BIDIRECTIONAL), dur_ns=d, arg=100 + i,
                                flags=int(DriverFlag.USERPTR | DriverFlag.PINNED))
                t += d + 1000
            self.add_driver(DriverKind.VM_BIND, t, pid=pid, tid=tid, fid=fid, ctx=1, addr=va,
                            size=size, page_size=page_size, arg=100 + i, dur_ns=8000)
            t += 9000
        self.add_api(pid, tid, "alloc", np.array([t - 2000]), np.array([t]))
        return t

    # ------------------------------------------------------------- output ---
    def write(self, path: str | Path, extra_meta: dict[str, Any] | None = None,
              chunk_bytes: int = 1 << 20, drops: int = 0) -> dict[str, int]:
        cmds = {k: np.concatenate([c[k] for c in self.cmds]) for k in self.cmds[0]}
        order = np.lexsort((cmds["t_end"], cmds["fid"]))
        cmds = {k: v[order] for k, v in cmds.items()}
        n = len(order)
        t_lo = int(min(int(np.min(a["t_start"])) for a in self.api)) - 1_000_000
        t_hi = int(max(int(cmds["t_end"].max()), max(int(a["t_end"].max()) for a in self.api)))
        t_hi += 1_000_000
        meta = {
            "node": self.node,
            "devices": [
                {"pci": f.pci, "pf": self.funcs[0].pci, "vf": f.vf,
                 "link": {"gen": DEV.link_gen, "width": DEV.link_width, "mps": DEV.mps,
                          "mrrs": DEV.mrrs},
                 "devmem": 1 << 30, "clock_hz": 1e9, "time_scale": 1.0,
                 "tlb_entries": DEV.tlb_entries}
                for f in self.funcs
            ],
            "kernel": "6.12.0-synthetic", "qemu": "10.0.2-synthetic",
            "icount": {"shift": 0, "sleep": False}, "time_scale": 1.0,
            "options": {"synthetic": True, "seed": self.seed},
            "clock_pairs": [],
            "segments": self.segments,
        }
        meta.update(extra_meta or {})
        counts: dict[str, int] = {}
        if self.device_events and not self.dev_events and self.api:
            self.default_device_events()
        with CaptureWriter(path, meta, chunk_bytes=chunk_bytes) as w:
            for text, sid in self.strings.items():
                assert w.string_id(text) == sid
            # device trace: per function in sequence order
            rec = np.zeros(n, DEVICE_TRACE_DTYPE)
            rec["version"] = 1
            for k in ("opcode", "engine", "queue", "fid", "ctx", "job", "tag"):
                rec[k] = cmds[k]
            rec["func"] = np.array([f.vf for f in self.funcs])[cmds["fid"]]
            first = np.r_[True, cmds["fid"][1:] != cmds["fid"][:-1]]
            idx = np.arange(n)
            rec["seq"] = idx - np.maximum.accumulate(np.where(first, idx, 0))
            rec["t_fetch"] = self.dev_ticks(cmds["t_fetch"])
            rec["t_start"] = self.dev_ticks(cmds["t_start"])
            rec["t_end"] = self.dev_ticks(cmds["t_end"])
            rec["bytes"], rec["tlps"] = cmds["bytes"], cmds["tlps"]
            rec["tlb_misses"] = np.minimum(cmds["tlb"], 0xFFFF)
            w.append("device_trace", rec)
            counts["device_trace"] = n
            for name, parts, key in (("api", self.api, "t_start"), ("driver", self.driver, "t_ns"),
                                     ("host", self.host, "t_ns"),
                                     ("device_events", self.dev_events, "t_ns")):
                if parts:
                    arr = np.concatenate(parts)
                    arr = arr[np.argsort(arr[key], kind="stable")]
                    w.append(name, arr)
                    counts[name] = len(arr)
            if self.net_clock:
                w.append("net_clock", np.concatenate(self.net_clock))
                counts["net_clock"] = sum(len(x) for x in self.net_clock)
            counts["counters"] = self._write_counters(w, cmds, t_lo, t_hi)
            counts["clock_sync"] = self._write_clock(w, t_lo, t_hi)
            if drops:
                d = np.zeros(1, DROPS_DTYPE)
                d["t_ns"], d["count"], d["fid"] = t_hi - 1, drops, NO_FID
                d["source"] = int(DropSource.API)
                w.append("drops", d)
                counts["drops"] = 1
        return counts

    def _write_counters(self, w: CaptureWriter, cmds: dict[str, np.ndarray], t_lo: int,
                        t_hi: int) -> int:
        times = np.arange(t_lo, t_hi, SAMPLE_NS, dtype=np.int64)
        total = 0
        ends = cmds["t_end"]
        is_h2d = cmds["opcode"] == Opcode.COPY_H2D
        is_d2h = cmds["opcode"] == Opcode.COPY_D2H
        allbytes = {}
        for fn_i in range(len(self.funcs)):
            sel = cmds["fid"] == fn_i
            e = ends[sel]
            o = np.argsort(e)
            e = e[o]
            pos = np.searchsorted(e, times, side="right")

            def cum(v: np.ndarray, _o: np.ndarray = o, _pos: np.ndarray = pos) -> np.ndarray:
                c = np.r_[0, np.cumsum(np.asarray(v, np.int64)[_o])]
                return c[_pos]

            c = np.zeros(len(times), COUNTERS_DTYPE)
            c["devclk"] = self.dev_ticks(times)
            c["seq"] = np.arange(len(times))
            c["fid"] = fn_i
            b, t = cmds["bytes"][sel], cmds["tlps"][sel]
            h, d = is_h2d[sel], is_d2h[sel]
            dur = cmds["t_end"][sel] - cmds["t_start"][sel]
            c["h2d_bytes"] = cum(np.where(h, b, 0))
            c["d2h_bytes"] = cum(np.where(d, b, 0))
            c["h2d_tlps"] = cum(np.where(h, t, 0))
            c["d2h_tlps"] = cum(np.where(d, t, 0))
            c["h2d_link_bytes"] = c["h2d_bytes"] + LINK_CPL_OVERHEAD * c["h2d_tlps"]
            c["d2h_link_bytes"] = c["d2h_bytes"] + TLP_OVERHEAD_BYTES * c["d2h_tlps"]
            tlb = cmds["tlb"][sel].astype(np.int64)
            c["tlb_misses"] = cum(tlb)
            c["tlb_hits"] = cum(np.maximum(b // 64 - tlb, 0) + np.where(h | d, 0, 1000))
            c["tlb_walk_reads"] = model.walk_reads(4096) * c["tlb_misses"]
            c["irqs"] = cum(np.ones_like(b))
            c["trace_records"] = c["irqs"]
            c["jobs_completed"] = c["irqs"]
            c["cmds_completed"] = c["irqs"]
            c["flops"] = cum(cmds["flops"][sel])
            eng = cmds["engine"][sel]
            names = [n for n, _ in FUNC_COUNTERS]
            for e_i, nm in enumerate(("dma_h2d", "dma_d2h", "compute0", "compute1", "compute2",
                                      "compute3")):
                if f"busy_{nm}" in names:
                    c[f"busy_{nm}"] = cum(np.where(eng == e_i, dur, 0))
                    c[f"cmds_{nm}"] = cum((eng == e_i).astype(np.int64))
            allbytes[fn_i] = c
        pf = allbytes[0]
        g = {k: sum(allbytes[i][k].astype(np.int64) for i in allbytes) for k in
             ("h2d_bytes", "d2h_bytes", "h2d_link_bytes", "d2h_link_bytes", "busy_dma_h2d",
              "busy_dma_d2h")}
        pf["g_link_h2d_payload"], pf["g_link_d2h_payload"] = g["h2d_bytes"], g["d2h_bytes"]
        pf["g_link_h2d_bytes"], pf["g_link_d2h_bytes"] = g["h2d_link_bytes"], g["d2h_link_bytes"]
        pf["g_link_h2d_busy_ticks"] = g["busy_dma_h2d"]
        pf["g_link_d2h_busy_ticks"] = g["busy_dma_d2h"]
        pf["g_uptime_ticks"] = pf["devclk"]
        merged = np.concatenate(list(allbytes.values()))
        merged = merged[np.argsort(merged["devclk"], kind="stable")]
        w.append("counters", merged)
        total += len(merged)
        return total

    def _write_clock(self, w: CaptureWriter, t_lo: int, t_hi: int) -> int:
        t = np.arange(t_lo, t_hi + CLOCK_PERIOD_NS, CLOCK_PERIOD_NS, dtype=np.int64)
        out = []
        for fn_i in range(len(self.funcs)):
            width = self.rng.integers(800, 3000, len(t))
            frac = self.rng.random(len(t))
            c = np.zeros(len(t), CLOCK_DTYPE)
            c["mono_before"] = t + fn_i * 10_000
            c["mono_after"] = c["mono_before"] + width
            true = c["mono_before"] + np.rint(frac * width).astype(np.int64)
            c["devclk"] = self.dev_ticks(true)
            c["hostclk"] = (self.host_offset + true).astype(np.uint64) if self.host_clock \
                else 0
            c["fid"] = fn_i
            out.append(c)
        arr = np.concatenate(out)
        arr = arr[np.argsort(arr["mono_before"], kind="stable")]
        w.append("clock_sync", arr)
        return len(arr)


# ------------------------------------------------------------------ workloads --
PID = 4242
TID = 4243


def _async_stream(sim: Sim, t: int, n: int, *, fid: int = 0, queue: int = 0, pid: int = PID,
                  tid: int = TID, name: str, opcode: int, nbytes: int, dur: np.ndarray,
                  host_ns: int = API_NS + IOCTL_NS + 1000, **kw: Any) -> tuple[int, dict]:
    api_t0 = t + np.arange(n, dtype=np.int64) * host_ns
    r = sim.submit(fid=fid, queue=queue, pid=pid, tid=tid, api_t0=api_t0, name=name,
                   opcode=opcode, nbytes=np.full(n, nbytes), dur=dur, **kw)
    t_end = sim.synchronize(pid, tid, int(r["api_end"][-1]), int(r["end"][-1]))
    return t_end, r


# Each workload's sizes and commands are its plan's (tacc.plans, what the real twin runs),
# at this many times the plan's scale: enough work for the analysis's thresholds on the
# model's device (a synthetic run at scale 1 is the real twin at these scales).
PLAN_SCALE = {"tiny_transfers": 32, "unaligned_userptr": 8, "map_churn": 3,
              "serialized_copies": 2, "tlb_thrash": 10, "link_saturation": 1, "host_bound": 7,
              "noisy_neighbour": 5}


def _plan(name: str, scale: int, good: bool, **kw: int) -> plans.Plan:
    return plans.PLANS[name](not good, PLAN_SCALE[name] * scale, **kw)


def w_tiny_transfers(sim: Sim, t: int, scale: int, good: bool) -> int:
    p = _plan("tiny_transfers", scale, good)
    total, size, n = p.params["total"], p.params["chunk"], p.count("copy_h2d")
    t = sim.buffers(PID, TID, t, 0, [total])
    t, _ = _async_stream(sim, t, n, name="copy_h2d", opcode=Opcode.COPY_H2D, nbytes=size,
                         dur=np.full(n, xfer_ns(size)))
    return t


# the bad twin's host offset: 64 B as the runtime's workload (on the root port's RCB, off
# MPS and the 4 KiB read boundary: its H2D completions are those of an aligned copy)
UNALIGNED_OFFSET = plans.unaligned_userptr(True).params["misalign"]


def _extra_pages(n: int, host_off: int) -> int:
    """The 4 KiB pages a copy of ``n`` bytes whose host side starts ``host_off`` bytes into
    a page spans beyond the aligned copy's (one TLB miss each)."""
    return -(-(host_off % 4096 + n) // 4096) - -(-n // 4096)


def w_unaligned_userptr(sim: Sim, t: int, scale: int, good: bool) -> int:
    p = _plan("unaligned_userptr", scale, good)
    up, down = p.steps[0].nbytes, p.steps[1].nbytes
    n = p.iters
    align = UNALIGNED_OFFSET if p.params["misalign"] else 0
    t = sim.buffers(PID, TID, t, 0, [up, down], userptr=True, align=align)
    # docs/hardware.md section 9: the host side at offset `align`, the device side
    # aligned: the copies cost what the device's link model and page walks give
    u = f"+{align}" if align else ""
    for kind, op, q, nb, name, args in (
            (H2D, Opcode.COPY_H2D, 0, up, "copy_h2d", f"u1{u}->d3 {up}"),
            (D2H, Opcode.COPY_D2H, 1, down, "copy_d2h", f"d3->u2{u} {down}")):
        walks = _extra_pages(nb, align)
        tlps = copy_tlps(nb, kind == H2D, DEV.mps, host_off=align)
        dur = model.copy_ns(kind, nb, host_off=align, walks=walks * model.walk_reads(4096))
        t, _ = _async_stream(sim, t, n, queue=q, name=name, opcode=op, nbytes=nb,
                             dur=np.full(n, dur), tlps=np.full(n, tlps),
                             tlb_misses=-(-nb // 4096) + walks, args=args)
    return t


def w_map_churn(sim: Sim, t: int, scale: int, good: bool) -> int:
    p = _plan("map_churn", scale, good)
    size, n = p.steps[0].nbytes, p.iters
    if good:
        t = sim.buffers(PID, TID, t, 0, [size], userptr=True)
        t, _ = _async_stream(sim, t, n, name="copy_h2d", opcode=Opcode.COPY_H2D, nbytes=size,
                             dur=np.full(n, xfer_ns(size)), host_ns=API_NS + IOCTL_NS + 1000)
        return t
    # every call: register userptr (pin + map + bind), copy, wait, unbind + unmap + unpin
    dmap = MAP_NS + MAP_PER_PAGE_NS * (size // 4096)
    per = API_NS + 4000 + dmap + 9000 + IOCTL_NS + 1000 + xfer_ns(size) + IRQ_NS + WAKE_NS \
        + 9000 + UNMAP_NS + 4000 + 3000
    t0 = t + np.arange(n, dtype=np.int64) * int(per)
    ua = 0x7F00_0000_0000
    sim.add_driver(DriverKind.BO_CREATE, t0 + API_NS, pid=PID, tid=TID, fid=0, size=size,
                   addr=ua, arg=200 + np.arange(n), flags=int(DriverFlag.USERPTR), dur_ns=3000)
    tm = t0 + API_NS + 4000
    sim.add_driver(DriverKind.DMA_MAP, tm, pid=PID, tid=TID, fid=0, size=size,
                   addr=0xF000_0000, nsegs=16, dir=int(DmaDir.TO_DEVICE), dur_ns=dmap,
                   arg=200 + np.arange(n), flags=int(DriverFlag.USERPTR))
    tb = tm + dmap
    sim.add_driver(DriverKind.VM_BIND, tb, pid=PID, tid=TID, fid=0, ctx=1, addr=0x1_0000_0000,
                   size=size, page_size=4096, dur_ns=8000)
    sim.add_api(PID, TID, "register_userptr", t0, tb + 9000, nbytes=size, fid=0)
    r = sim.submit(fid=0, queue=0, pid=PID, tid=TID, api_t0=tb + 9000, name="copy_h2d",
                   opcode=Opcode.COPY_H2D, nbytes=np.full(n, size), dur=np.full(n, xfer_ns(size)))
    tw = r["end"] + IRQ_NS + WAKE_NS
    sim.add_api(PID, TID, "synchronize", r["api_end"], tw)
    sim.add_driver(DriverKind.VM_UNBIND, tw + 500, pid=PID, tid=TID, fid=0, ctx=1,
                   addr=0x1_0000_0000, size=size, page_size=4096, dur_ns=8000)
    sim.add_driver(DriverKind.DMA_UNMAP, tw + 9000, pid=PID, tid=TID, fid=0, size=size,
                   addr=0xF000_0000, nsegs=16, dir=int(DmaDir.TO_DEVICE), dur_ns=UNMAP_NS,
                   arg=200 + np.arange(n), flags=int(DriverFlag.USERPTR))
    sim.add_driver(DriverKind.BO_DESTROY, tw + 9000 + UNMAP_NS + 500, pid=PID, tid=TID, fid=0,
                   size=size, arg=200 + np.arange(n), flags=int(DriverFlag.USERPTR))
    sim.add_api(PID, TID, "unregister_userptr", tw + 300, tw + 9000 + UNMAP_NS + 4000)
    return int(t0[-1] + per)


def w_serialized_copies(sim: Sim, t: int, scale: int, good: bool) -> int:
    p = _plan("serialized_copies", scale, good)
    n = p.iters
    h, g, d = p.steps[0].nbytes, p.steps[1], p.steps[2].nbytes
    t = sim.buffers(PID, TID, t, 0, [2 * h, 2 * d, 4 * g.k * g.n])
    host = API_NS + IOCTL_NS + 1000
    api0 = t + np.arange(3 * n, dtype=np.int64) * host
    a_h, a_c, a_d = api0[0::3], api0[1::3], api0[2::3]
    hd, cd, dd = np.full(n, xfer_ns(h)), np.full(n, gemm_ns(g)), np.full(n, xfer_ns(d, kind=D2H))
    if not good:
        # everything on queue 0 in order: the submit helper serialises per queue, and the
        # API order interleaves h2d, gemm, d2h
        api = np.stack([a_h, a_c, a_d], 1).ravel()
        op = np.stack([np.full(n, 1), np.full(n, 4), np.full(n, 2)], 1).ravel()
        by = np.stack([np.full(n, h), np.zeros(n, np.int64), np.full(n, d)], 1).ravel()
        du = np.stack([hd, cd, dd], 1).ravel()
        ends = []
        for o, name in ((1, "copy_h2d"), (4, "gemm"), (2, "copy_d2h")):
            sel = op == o
            ends.append((sel, name))
        # one serial queue: schedule all at once, then emit per opcode
        start, end = serial_schedule(api + API_NS + IOCTL_NS - 500, du)
        last = 0
        for sel, name in ends:
            oc = int(op[sel][0])
            r = sim.submit(fid=0, queue=0, pid=PID, tid=TID, api_t0=api[sel], name=name,
                           opcode=oc, nbytes=by[sel], dur=du[sel], ready=start[sel],
                           flops=gemm_flops(g) if oc == 4 else 0)
            sim.queue_end[(0, 0)] = 0
            last = max(last, int(r["end"][-1]))
        return sim.synchronize(PID, TID, int(api[-1] + host), last)
    rh = sim.submit(fid=0, queue=1, pid=PID, tid=TID, api_t0=a_h, name="copy_h2d",
                    opcode=Opcode.COPY_H2D, nbytes=np.full(n, h), dur=hd)
    rc = sim.submit(fid=0, queue=0, pid=PID, tid=TID, api_t0=a_c, name="gemm", opcode=Opcode.GEMM,
                    nbytes=np.zeros(n, np.int64), dur=cd, ready=rh["end"], flops=gemm_flops(g))
    rd = sim.submit(fid=0, queue=2, pid=PID, tid=TID, api_t0=a_d, name="copy_d2h",
                    opcode=Opcode.COPY_D2H, nbytes=np.full(n, d), dur=dd, ready=rc["end"])
    return sim.synchronize(PID, TID, int(api0[-1] + host), int(rd["end"][-1]))


def w_tlb_thrash(sim: Sim, t: int, scale: int, good: bool) -> int:
    p = _plan("tlb_thrash", scale, good)
    n, g, page = p.iters, p.steps[0], p.params["page_size"]
    touched = 3 * g.m * g.m * 4  # A, B, C in fp32
    misses = touched // page * 2  # each page walked about twice (more pages than TLB entries)
    t = sim.buffers(PID, TID, t, 0, [g.m * g.m * 4] * 3, page_size=page)
    dur = np.full(n, gemm_ns(g, misses, page))
    t, _ = _async_stream(sim, t, n, name="gemm", opcode=Opcode.GEMM, nbytes=0, dur=dur,
                         tlb_misses=misses, flops=gemm_flops(g))
    return t


def w_link_saturation(sim: Sim, t: int, scale: int, good: bool) -> int:
    # bad: 4 queues stream fresh inputs concurrently; good: inputs staged once and reused
    p = _plan("link_saturation", scale, good)
    nq, n, size = p.params["queues"], p.iters, p.steps[0].nbytes
    ups = p.count("copy_h2d") // nq
    t = sim.buffers(PID, TID, t, 0, [size * nq])
    share = 1.0 / nq
    scale_ns = model.eltwise_ns(size // 4)
    last = t
    for q in range(nq):
        tid = TID + q
        api0 = t + q * 2000 + np.arange(n, dtype=np.int64) * 10_000
        r = sim.submit(fid=0, queue=q, pid=PID, tid=tid, api_t0=api0[:ups], name="copy_h2d",
                       opcode=Opcode.COPY_H2D, nbytes=np.full(ups, size),
                       dur=np.full(ups, xfer_ns(size, share)))
        ready = r["end"] if ups == n else np.full(n, r["end"][-1])
        r2 = sim.submit(fid=0, queue=q, pid=PID, tid=tid, api_t0=api0 + 5000, name="scale",
                        opcode=Opcode.ELTWISE, nbytes=np.full(n, size),
                        dur=np.full(n, scale_ns), ready=ready, flops=size // 4)
        # the twin's check: each queue's result read back after the measured section
        r3 = sim.submit(fid=0, queue=q, pid=PID, tid=tid, api_t0=api0[-1:] + 8000,
                        name="copy_d2h", opcode=Opcode.COPY_D2H, nbytes=np.full(1, size),
                        dur=np.full(1, xfer_ns(size, kind=D2H)), ready=r2["end"][-1:])
        last = max(last, int(r3["end"][-1]))
    return sim.synchronize(PID, TID, t + 10_000 * (n + 1), last)


def w_host_bound(sim: Sim, t: int, scale: int, good: bool) -> int:
    # the plan at sizes whose device work per batch outlasts the host's preprocessing
    p = _plan("host_bound", scale, good, m=1024, k=1024, n_out=4096)
    n, size, g = p.iters, p.steps[0].nbytes, p.steps[1]
    pre = 1_000_000  # CPU preprocessing + disk read per batch (shorter than the device's)
    t = sim.buffers(PID, TID, t, 0, [2 * size])
    it = xfer_ns(size) + gemm_ns(g) + 2 * (API_NS + IOCTL_NS + 1000) + IRQ_NS + WAKE_NS
    # good: a loader thread prepares batch i+1 while the device runs batch i
    period = pre + it if not good else max(it, pre) + 20_000
    t0 = t + np.arange(n, dtype=np.int64) * period
    if not good:
        sim.add_host(HostKind.BLOCK_ISSUE, t0 + 10_000, pid=PID, tid=TID, dev=0x800010,
                     sector=np.arange(n) * 8192, size=size, comm=b"tacc-run")
        sim.add_host(HostKind.BLOCK_COMPLETE, t0 + 900_000, pid=PID, tid=TID, dev=0x800010,
                     sector=np.arange(n) * 8192, size=size, dur_ns=890_000, comm=b"tacc-run")
        sim.add_host(HostKind.NET_RX, t0 + 1_000_000, pid=PID, tid=TID, dev=2, size=64 * KiB)
        sim.add_api(PID, TID, "host_preprocess", t0, t0 + pre - 1000)
        start = t0 + pre
    else:
        # preprocessing runs in a loader thread ahead of the device
        sim.add_host(HostKind.BLOCK_ISSUE, t0 + 10_000, pid=PID, tid=TID + 9, dev=0x800010,
                     sector=np.arange(n) * 8192, size=size, comm=b"loader")
        sim.add_api(PID, TID + 9, "host_preprocess", t0, t0 + pre - 1000)
        start = t0 + pre
    r = sim.submit(fid=0, queue=0, pid=PID, tid=TID, api_t0=start, name="copy_h2d",
                   opcode=Opcode.COPY_H2D, nbytes=np.full(n, size), dur=np.full(n, xfer_ns(size)))
    rc = sim.submit(fid=0, queue=1, pid=PID, tid=TID, api_t0=start + 8000, name="gemm",
                    opcode=Opcode.GEMM, nbytes=np.zeros(n, np.int64),
                    dur=np.full(n, gemm_ns(g)), ready=r["end"], flops=gemm_flops(g))
    return sim.synchronize(PID, TID, int(start[-1] + 20_000), int(rc["end"][-1]))


def w_noisy_neighbour(sim: Sim, t: int, scale: int, good: bool) -> int:
    # VF1 streams paced copies (about 60% of the link); VF2 bursts (bad twin only)
    p = _plan("noisy_neighbour", scale, good)
    n, size = p.iters, p.steps[0].nbytes
    solo = int(xfer_ns(size))
    period = int(solo / 0.6)
    t = sim.buffers(PID, TID, t, 1, [size * 2])
    api0 = t + np.arange(n, dtype=np.int64) * period
    burst = np.zeros(n, bool)
    if not good:
        burst = np.arange(n) < n // 2  # the neighbour streams during the first half
    dur = np.where(burst, xfer_ns(size, 0.5), solo)
    r = sim.submit(fid=1, queue=0, pid=PID, tid=TID, api_t0=api0, name="copy_h2d",
                   opcode=Opcode.COPY_H2D, nbytes=np.full(n, size), dur=dur)
    last = int(r["end"][-1])
    if not good:
        pid2 = PID + 100
        big = size  # the neighbour's uploads are the victim's size
        for b in (0,):
            tb0 = int(api0[b])
            tb1 = int(api0[n // 2 - 1] + period)
            k = max(int((tb1 - tb0) // int(xfer_ns(big, 0.5))), 1)
            a = tb0 + np.arange(k, dtype=np.int64) * 1000
            r2 = sim.submit(fid=2, queue=0, pid=pid2, tid=pid2, api_t0=a, name="copy_h2d",
                            opcode=Opcode.COPY_H2D, nbytes=np.full(k, big),
                            dur=np.full(k, xfer_ns(big, 0.5)), ready=np.full(k, tb0))
            last = max(last, int(r2["end"][-1]))
    return sim.synchronize(PID, TID, int(api0[-1] + 10_000), last)


LOAD_TENSOR = 512 * KiB  # tacc.workloads.load: 8 tensors of 512 KiB a scale unit
LOAD_CHUNK = 128 * KiB  # its O_DIRECT read requests
LOAD_READ_NS = 400_000  # a 128 KiB read request on the model's disk (~330 MB/s)
LOAD_SYSCALL_NS = 30_000  # between two requests of one tensor
LOAD_COPY_NS = 300_000  # the host copy of a tensor into pinned staging memory
NVME_DEV = (259 << 20) | 0  # dev_t of nvme0n1


def _load_reads(sim: Sim, t: int, i: int, tid: int, comm: bytes) -> int:
    """The read requests of tensor ``i`` from ``t``; returns the time after the last."""
    n = LOAD_TENSOR // LOAD_CHUNK
    t0 = t + np.arange(n, dtype=np.int64) * (LOAD_READ_NS + LOAD_SYSCALL_NS)
    sector = (4096 + i * LOAD_TENSOR + np.arange(n) * LOAD_CHUNK) // 512
    for kind, at in ((HostKind.BLOCK_ISSUE, t0), (HostKind.BLOCK_COMPLETE, t0 + LOAD_READ_NS)):
        sim.add_host(kind, at, pid=PID, tid=tid, dev=NVME_DEV, sector=sector,
                     size=LOAD_CHUNK, prev_state=int(BlockOp.READ), comm=comm,
                     dur_ns=LOAD_READ_NS if kind == HostKind.BLOCK_COMPLETE else 0)
    end = int(t0[-1] + LOAD_READ_NS + LOAD_SYSCALL_NS)
    sim.add_api(PID, tid, "range", np.array([t - 5000]), np.array([end - 5000]),
                args=f"tensor {_load_name(i)}: read")
    return end


def _load_name(i: int) -> str:
    return f"h.{i // 4}." + ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")[i % 4]


def _load_upload(sim: Sim, t: int, i: int) -> dict[str, np.ndarray]:
    """Tensor ``i``'s host copy from ``t`` and its upload, each in its range."""
    name = _load_name(i)
    sim.add_api(PID, TID, "range", np.array([t]), np.array([t + LOAD_COPY_NS - 1000]),
                args=f"tensor {name}: copy")
    t += LOAD_COPY_NS
    r = sim.submit(fid=0, queue=0, pid=PID, tid=TID, api_t0=np.array([t]), name="copy_h2d",
                   opcode=Opcode.COPY_H2D, nbytes=np.array([LOAD_TENSOR]),
                   dur=np.array([xfer_ns(LOAD_TENSOR)]))
    sim.add_api(PID, TID, "range", np.array([t - 500]), r["api_end"] + 500,
                args=f"tensor {name}: upload")
    return r


def w_load(sim: Sim, t: int, scale: int, good: bool) -> int:
    """tacc run load: tensors read from an NVMe disk, copied and uploaded; bad: in turn,
    good: a reader thread ahead of the uploads (two staging buffers)."""
    n = 8 * scale
    t = sim.buffers(PID, TID, t, 0, [LOAD_TENSOR] * n)
    # the header, read before the load
    sim.add_host(HostKind.BLOCK_COMPLETE, t + 50_000, pid=PID, tid=TID, dev=NVME_DEV, sector=0,
                 size=4096, prev_state=int(BlockOp.READ), dur_ns=40_000, comm=b"tacc-run")
    t += 100_000
    if not good:
        for i in range(n):
            r = _load_upload(sim, _load_reads(sim, t, i, TID, b"tacc-run"), i)
            t = sim.synchronize(PID, TID, int(r["api_end"][-1]) + 1000, int(r["end"][-1]))
        return t
    # a reader thread reads tensor i+1 while the loader copies tensor i and uploads it
    reader, rt, api_t, done = TID + 9, t, t, [0] * n
    copied = [0] * n
    for i in range(n):
        rt = max(rt, copied[i - 2] if i >= 2 else 0)  # its bounce buffer was copied out
        rt = _load_reads(sim, rt, i, reader, b"tacc-load-reade")
        t_copy = max(rt, api_t, done[i - 2] if i >= 2 else 0)  # staging buffer free
        copied[i] = t_copy + LOAD_COPY_NS
        r = _load_upload(sim, t_copy, i)
        done[i] = int(r["end"][-1]) + IRQ_NS + WAKE_NS
        api_t = int(r["api_end"][-1]) + 1000
    return sim.synchronize(PID, TID, api_t, done[-1] - IRQ_NS - WAKE_NS)


def w_mlp(sim: Sim, t: int, scale: int, good: bool) -> int:
    """The good reference: double-buffered inputs, copies overlap compute."""
    return w_serialized_copies(sim, t, scale, True)


WORKLOADS: dict[str, Callable[[Sim, int, int, bool], int]] = {
    "tiny_transfers": w_tiny_transfers,
    "unaligned_userptr": w_unaligned_userptr,
    "map_churn": w_map_churn,
    "serialized_copies": w_serialized_copies,
    "tlb_thrash": w_tlb_thrash,
    "link_saturation": w_link_saturation,
    "host_bound": w_host_bound,
    "noisy_neighbour": w_noisy_neighbour,
    "load": w_load,
    "mlp": w_mlp,
}

# The findings each bad twin must produce (good twins: none). docs/analysis.md has the table.
EXPECTED: dict[str, set[str]] = {
    "tiny_transfers": {"small_transfers"},
    "unaligned_userptr": {"host_memory"},
    "map_churn": {"iommu_churn"},
    "serialized_copies": {"serialized_copies"},
    "tlb_thrash": {"tlb_thrash"},
    "link_saturation": {"link_saturation"},
    "host_bound": {"idle_gaps"},
    "noisy_neighbour": {"link_saturation", "vf_contention", "h2d_d2h_imbalance"},
    "load": {"load_serialised"},
    "mlp": set(),
}


def run(sim: Sim, plan: list[tuple[str, bool]], scale: int = 1, gap_ns: int = 5_000_000,
        t_start: int = 10_000_000) -> int:
    """Run workloads one after the other; records each segment's time range in meta."""
    t = t_start
    for name, bad in plan:
        t0 = t
        sim.queue_end.clear()
        t = WORKLOADS[name](sim, t, scale, not bad)
        sim.segments.append({"workload": name, "variant": "bad" if bad else "good",
                             "t_start": t0, "t_end": t})
        t += gap_ns
    return t


def generate(path: str | Path, workload: str | list[tuple[str, bool]], variant: str = "bad",
             scale: int = 1, seed: int = 0, node: str = "node0", **sim_kw: Any) -> dict[str, Any]:
    """Write a synthetic capture; returns the ground truth of the run."""
    sim = Sim(seed=seed, node=node, **sim_kw)
    plan = workload if isinstance(workload, list) else [(workload, variant == "bad")]
    run(sim, plan, scale)
    counts = sim.write(path)
    return truth(sim, counts)


def truth(sim: Sim, counts: dict[str, int]) -> dict[str, Any]:
    cmds = {k: np.concatenate([c[k] for c in sim.cmds]) for k in sim.cmds[0]}
    expected: set[str] = set()
    for seg in sim.segments:
        if seg["variant"] == "bad":
            expected |= EXPECTED[seg["workload"]]
    return {
        "counts": counts,
        "segments": sim.segments,
        "expected_findings": sorted(expected),
        "wall_ns": int(sim.segments[-1]["t_end"] - sim.segments[0]["t_start"]),
        "device_busy_ns": int(np.sum(cmds["t_end"] - cmds["t_start"])),
        "cmds": cmds,
        "dev_offset": sim.dev_offset,
        "drift_ppm": sim.drift_ppm,
    }


def generate_events(path: str | Path, events: int, seed: int = 0,
                    chunk_bytes: int = 4 << 20) -> dict[str, int]:
    """A capture with about ``events`` events in total (benchmarks): mixed workloads
    repeated until the count is reached."""
    sim = Sim(seed=seed)
    plan = [(w, True) for w in ("tiny_transfers", "serialized_copies", "map_churn",
                                "tlb_thrash", "host_bound", "noisy_neighbour")]
    # events per scale unit of this plan, measured on a scale-1 dry run (about 170k)
    probe = Sim(seed=seed)
    run(probe, plan, 1)
    per = sum(len(a) for a in probe.api) + sum(len(a) for a in probe.driver) + sum(
        len(c["tag"]) for c in probe.cmds) + sum(len(a) for a in probe.host)
    scale = max(int(round(events / per)), 1)
    run(sim, plan, scale)
    return sim.write(path, chunk_bytes=chunk_bytes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tacc.capture.synth", description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS) + ["mixed"])
    ap.add_argument("--variant", default="bad", choices=["bad", "good"])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--events", type=int, default=0, help="benchmark capture of ~N events")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--node", default="node0")
    a = ap.parse_args(argv)
    if a.events:
        print(json.dumps(generate_events(a.out, a.events, a.seed)))
        return 0
    wl: str | list[tuple[str, bool]] = a.workload
    if a.workload == "mixed":
        wl = MIXED
    t = generate(a.out, wl, a.variant, a.scale, a.seed, a.node)
    print(json.dumps({"counts": t["counts"], "expected_findings": t["expected_findings"]}))
    return 0


MIXED: list[tuple[str, bool]] = [
    ("mlp", False), ("tiny_transfers", True), ("map_churn", True), ("tlb_thrash", True),
    ("serialized_copies", True), ("mlp", False),
]

if __name__ == "__main__":
    raise SystemExit(main())
