#!/usr/bin/env python3
"""Where taccd's CPU goes in capture mode (docs/taccd.md, "Cost").

``vm`` (inside the test VM, as root): a real taccd ``Daemon`` (socket, netlink, udev,
always-on, the BPF program of ``taccd``) runs a capture with default options while a
workload runs in another process (``nop``: one process submitting 1-NOP jobs at the
maximum rate, as vm_tracing.py; ``mlp``: tacc.workloads ``mlp`` in a loop).  The daemon's
loop (``Daemon.loop_once``, what ``taccd`` runs) is driven from here for ``--seconds``;
every stage of ``CaptureSession.tick`` is timed with the thread's CPU clock
(``time.thread_time_ns``: preemption by the workload is not counted), and the whole phase
can also run under cProfile (``--cprofile``: adds its own per-call overhead, so the
stage table comes from a run without it).  Costs are reported in µs of guest CPU per
driver event (guest time is virtual under -icount: 1 instruction = 1 ns).

``host``: the same stages on synthetic data on this machine (RingReader over a bytearray,
to_driver/to_host on an event mix like the NOP flood's, the device-ring parser on a fake
ring, the chunk writer), ns per event: the relative sizes, fast to iterate on.

    prof_capture.py vm [--workload nop|mlp] [--seconds 6] [--cprofile] [--json OUT]
    prof_capture.py host [--events 5000] [--json OUT]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))

import numpy as np  # noqa: E402
from tacc.bpftrace import events as evmod  # noqa: E402
from tacc.bpftrace.events import EV_DTYPE, HOST_BASE, to_driver, to_host  # noqa: E402
from tacc.bpftrace.ringbuf import RingReader, stride_of  # noqa: E402
from tacc.capture import CaptureWriter  # noqa: E402
from tacc.capture.schema import TRACE_REC_DTYPE, DriverKind, HostKind  # noqa: E402
from tacc.daemon.devring import RingView  # noqa: E402
from tacc.runtime import uapi  # noqa: E402

NOP_CHILD = """
import os, sys, time
from tacc.runtime import uapi
node, seconds = sys.argv[1], float(sys.argv[2])
fd = uapi.open_node(node)
uapi.submit_nops(fd, 8)
print("ready", flush=True)
sys.stdin.readline()
n = 0
t0 = time.monotonic()
end = t0 + seconds
while time.monotonic() < end:
    uapi.submit_nops(fd, 64, ncmds=1, tag_base=0x7B000000 + n)
    n += 64
print(n, n / (time.monotonic() - t0), flush=True)
"""

MLP_CHILD = """
import sys, time
from tacc.runtime import Context
from tacc.workloads import run
seconds = float(sys.argv[2])
with Context() as ctx:
    run("mlp", ctx, False, batches=4, check=False)  # warm: first-call costs
    print("ready", flush=True)
    sys.stdin.readline()
    nb, wall = 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r = run("mlp", ctx, False, batches=16, check=False)
        nb += 16
        wall += r.wall_ns
print(nb, nb / (wall / 1e9), flush=True)
"""


# ------------------------------------------------------------------ stage timing ---
class Stages:
    """Thread-CPU time per wrapped function (nested stages are counted in both)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        orig = getattr(obj, attr)
        clock = time.thread_time_ns

        def timed(*a: Any, **kw: Any) -> Any:
            t = clock()
            try:
                return orig(*a, **kw)
            finally:
                self.ns[name] += clock() - t
                self.calls[name] += 1

        setattr(obj, attr, timed)
        had = attr in getattr(obj, "__dict__", {})
        self._undo.append(lambda: setattr(obj, attr, orig) if had else delattr(obj, attr))

    def undo(self) -> None:
        for u in reversed(self._undo):
            u()
        self._undo.clear()


def _instrument(st: Stages, d: Any) -> None:
    from tacc.capture import writer as wmod
    from tacc.daemon import session as smod

    s = d.session
    st.wrap(s, "tick", "tick (all)")
    if s.program is not None:
        if hasattr(s, "_drain_program"):  # the session drains the reader in slices
            st.wrap(s.program.reader, "drain", "bpf ring -> numpy (RingReader.drain)")
        else:
            st.wrap(s.program, "drain", "bpf ring -> numpy (RingReader.drain)")
        st.wrap(s, "_bpf_drops", "bpf drop stats (Program.stats)")
    st.wrap(evmod, "to_driver", "to_driver")
    st.wrap(evmod, "to_host", "to_host")
    st.wrap(s, "_write_ring", "device trace ring (drain+append)")
    if s.api is not None:
        st.wrap(s.api, "scan", "api rings: scan")
        st.wrap(s.api, "drain", "api rings: drain")
    st.wrap(s, "sample_counters", "counters")
    st.wrap(s, "clock_sample", "clock pairs (sysfs)")
    st.wrap(s.writer, "flush", "writer flush (1 Hz)")
    st.wrap(wmod._Stream, "write_chunk", "chunk write (crc + write)")
    st.wrap(smod.CaptureSession, "drop", "drop records")
    if d.always_on is not None:
        st.wrap(d.always_on, "tick", "always-on tick")


# -------------------------------------------------------------------------- vm ---
def vm(args: argparse.Namespace) -> dict[str, Any]:
    from tacc.daemon.main import Daemon
    from tacc.devices import discover

    if os.geteuid() != 0:
        raise SystemExit("prof_capture: vm mode must run as root inside the VM")
    fns = [f for f in discover() if f.accel]
    if not fns:
        raise SystemExit("prof_capture: no tacc device")
    tmp = Path(tempfile.mkdtemp(prefix="prof-capture-"))
    d = Daemon(str(tmp / "taccd.sock"), tmp)
    t = time.monotonic()
    d.start_capture(str(tmp / "warm"), {})  # compiles the BPF program
    d.stop_capture()
    compile_s = time.monotonic() - t
    results: dict[str, Any] = {"compile_s": compile_s, "phases": []}
    for cprof in ([False, True] if args.cprofile else [False]):
        results["phases"].append(_phase(d, fns[0], tmp, args, cprof))
    d.close()
    return results


def _phase(d: Any, fn: Any, tmp: Path, args: argparse.Namespace, cprof: bool
           ) -> dict[str, Any]:
    child = NOP_CHILD if args.workload == "nop" else MLP_CHILD
    env = {**os.environ, "PYTHONPATH": str(ROOT / "userspace")}
    w = subprocess.Popen([sys.executable, "-c", child, str(fn.accel), str(args.seconds)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert w.stdout is not None and w.stdin is not None
    if w.stdout.readline().strip() != "ready":
        raise SystemExit("prof_capture: workload failed")
    out = str(tmp / f"cap-{args.workload}-{int(cprof)}")
    d.start_capture(out, {})
    st = Stages()
    _instrument(st, d)
    prof = cProfile.Profile() if cprof else None
    ticks: list[tuple[float, int, int]] = []  # (loop start, device records, driver recs)
    sess = d.session
    w.stdin.write("go\n")
    w.stdin.flush()
    r0 = os.times()
    t0 = time.monotonic()
    c_loop = 0
    if prof:
        prof.enable()
    while w.poll() is None:
        n_dev = sess.counts.get("device_trace", 0)
        n_drv = sess.counts.get("driver", 0)
        due = getattr(d, "next_tick", None)
        c = time.thread_time_ns()
        d.loop_once()
        c_loop += time.thread_time_ns() - c
        if due is None or d.next_tick != due:  # a tick ran (not only a request/event)
            ticks.append((time.monotonic(), sess.counts.get("device_trace", 0) - n_dev,
                          sess.counts.get("driver", 0) - n_drv))
    if prof:
        prof.disable()
    wall = time.monotonic() - t0
    r1 = os.times()
    st.undo()
    summary = d.stop_capture()["summary"]
    line = w.stdout.read().split()
    w.wait()
    n_work, rate = int(line[0]), float(line[1])
    cpu = (r1.user - r0.user) + (r1.system - r0.system)
    recs = summary["records"]
    n_driver = recs.get("driver", 0)
    n_all = sum(v for k, v in recs.items() if k in ("driver", "host", "device_trace", "api"))
    gaps = np.diff([t for t, _, _ in ticks]) if len(ticks) > 1 else np.zeros(1)
    per_tick_dev = np.array([n for _, n, _ in ticks] or [0])
    res: dict[str, Any] = {
        "workload": args.workload, "cprofile": cprof, "seconds": wall,
        "work": n_work, "rate": rate, "taccd_cpu_s": cpu, "taccd_cpu_share": cpu / wall,
        "loop_thread_cpu_s": c_loop / 1e9,
        "records": recs, "drops": summary["drops"], "ticks": len(ticks),
        "tick_gap_ms": {"median": float(np.median(gaps) * 1e3),
                        "p90": float(np.percentile(gaps, 90) * 1e3),
                        "max": float(gaps.max() * 1e3)},
        "device_recs_per_tick_max": int(per_tick_dev.max()),
        "us_per_driver_event": cpu / max(n_driver, 1) * 1e6,
        "us_per_record": cpu / max(n_all, 1) * 1e6,
        "stages": {k: {"ms": st.ns[k] / 1e6, "calls": st.calls[k],
                       "us_per_driver_event": st.ns[k] / 1e3 / max(n_driver, 1)}
                   for k in sorted(st.ns, key=lambda k: -st.ns[k])},
    }
    kinds = open_kinds(out)
    if kinds:
        res["driver_kinds"] = kinds
    if prof:
        s = io.StringIO()
        ps = pstats.Stats(prof, stream=s)
        ps.sort_stats("tottime").print_stats(30)
        ps.sort_stats("cumulative").print_stats(30)
        res["cprofile_text"] = s.getvalue()
    _print_phase(res)
    return res


def open_kinds(path: str) -> dict[str, int]:
    try:
        from tacc.capture import open_capture

        drv = open_capture(path).read("driver")
    except Exception:  # noqa: BLE001 - informative only
        return {}
    k, n = np.unique(drv["kind"], return_counts=True)
    return {DriverKind(int(a)).name.lower(): int(b) for a, b in zip(k, n, strict=True)}


def _print_phase(r: dict[str, Any]) -> None:
    unit = "jobs/s" if r["workload"] == "nop" else "batches/s"
    print(f"\n== {r['workload']} {'(cProfile on)' if r['cprofile'] else ''}: "
          f"{r['seconds']:.2f} s, {r['rate']:.0f} {unit}, taccd CPU {r['taccd_cpu_s']:.3f} s"
          f" = {r['taccd_cpu_share'] * 100:.1f} % (loop thread {r['loop_thread_cpu_s']:.3f}"
          f" s), {r['ticks']} ticks (gap median {r['tick_gap_ms']['median']:.0f} ms, p90 "
          f"{r['tick_gap_ms']['p90']:.0f}, max {r['tick_gap_ms']['max']:.0f}), device recs/"
          f"tick max {r['device_recs_per_tick_max']}")
    print(f"   records {r['records']}")
    print(f"   drops {r['drops']}")
    if "driver_kinds" in r:
        print(f"   driver kinds {r['driver_kinds']}")
    print(f"   {r['us_per_driver_event']:.2f} µs CPU per driver event, "
          f"{r['us_per_record']:.2f} µs per record (driver+host+device_trace+api)")
    print(f"   {'stage':<40} {'ms':>9} {'calls':>7} {'µs/drv ev':>10}")
    for k, v in r["stages"].items():
        print(f"   {k:<40} {v['ms']:9.1f} {v['calls']:7d} {v['us_per_driver_event']:10.3f}")
    if "cprofile_text" in r:
        print(r["cprofile_text"])


# ------------------------------------------------------------------------ host ---
def nop_mix(n: int) -> np.ndarray:
    """Driver events in the proportions of the NOP flood (per job: submit ioctl, submit,
    doorbell, job start, job done, an irq; a wait ioctl per 64 jobs) + sched events."""
    per_job = [DriverKind.IOCTL, DriverKind.SUBMIT, DriverKind.DOORBELL,
               DriverKind.JOB_START, DriverKind.JOB_DONE, DriverKind.IRQ]
    k = np.array([int(x) for x in per_job], np.uint8)
    e = np.zeros(n, EV_DTYPE)
    e["kind"] = k[np.arange(n) % len(k)]
    e["kind"][::97] = HOST_BASE + int(HostKind.SCHED_SWITCH)
    e["ts"] = 10**9 + np.arange(n) * 5000
    e["dev"] = 0x100
    e["tag"] = np.arange(n)
    e["a"] = np.arange(n) // 6
    e["d"] = 1000
    return e


def _per(fn: Callable[[], Any], n: int, reps: int) -> float:
    fn()
    t = time.perf_counter_ns()
    for _ in range(reps):
        fn()
    return (time.perf_counter_ns() - t) / reps / n


def host(args: argparse.Namespace) -> dict[str, Any]:
    try:  # the allocator as a capture sets it (else every call page-faults its arrays)
        from tacc.daemon.session import tune_malloc

        tune_malloc()
    except ImportError:
        pass
    n, reps = args.events, args.reps
    ev = nop_mix(n)
    out: dict[str, float] = {}
    # BPF ring: n records framed in a bytearray ring, drained (consumer reset each time)
    size = 1 << max(12, (n * stride_of(EV_DTYPE.itemsize) * 2 - 1).bit_length())
    page = 4096
    cons, prod = bytearray(page), bytearray(page + 2 * size)
    stride = stride_of(EV_DTYPE.itemsize)
    fr = np.zeros(n, np.dtype({"names": ["len", "pg", "rec"], "formats": ["<u4", "<u4",
                                                                          EV_DTYPE],
                               "offsets": [0, 4, 8], "itemsize": stride}))
    fr["len"], fr["rec"] = EV_DTYPE.itemsize, ev
    raw = fr.tobytes()
    prod[page:page + len(raw)] = raw
    struct.pack_into("<Q", prod, 0, len(raw))
    rr = RingReader(cons, prod, size, EV_DTYPE, page)

    def drain() -> None:
        struct.pack_into("<Q", cons, 0, 0)
        assert len(rr.drain()) == n

    out["RingReader.drain"] = _per(drain, n, reps)
    fids = {0x100: 0}
    out["to_driver"] = _per(lambda: to_driver(ev, fids), n, reps)
    out["to_host"] = _per(lambda: to_host(ev), n, reps)
    drv = to_driver(ev, fids)
    with tempfile.TemporaryDirectory() as tmp:
        w = CaptureWriter(Path(tmp) / "c", {"node": "x", "devices": []}, chunk_bytes=256 << 10)

        def write() -> None:
            w.append("driver", drv)
            w.flush()

        out["writer append+flush (driver)"] = _per(write, n, max(reps // 4, 1))
        w.close()
    # device trace ring: 4096 entries, n records (at most the ring) per drain
    ents = 4096
    m = min(n, ents)
    buf = bytearray(4096 + ents * 64)
    recs = np.zeros(ents, TRACE_REC_DTYPE)
    recs["seq"] = np.arange(ents)
    buf[4096:] = recs.tobytes()
    state = {"prod": 0}

    def hdr(prod_: int) -> None:
        h = uapi.drm_tacc_trace_header(version=1, rec_size=64, entries=ents, rec_version=1,
                             data_offset=4096, prod=prod_, dropped=0, epoch=1)
        buf[:ctypes.sizeof(h)] = bytes(h)

    hdr(0)
    view = RingView(buf, 0, lambda cons: (state["prod"], 0))

    def ring() -> None:
        state["prod"] += m
        # rewrite the seqs the next drain expects (no gaps)
        first = state["prod"] - m
        idx = (np.arange(first, first + m)) % ents
        arr = np.frombuffer(buf, TRACE_REC_DTYPE, count=ents, offset=4096)
        arr.setflags(write=True)
        arr["seq"][idx] = np.arange(first, first + m)
        hdr(state["prod"])
        r = view.drain()
        assert len(r.records) == m and r.dropped == 0

    arr0 = np.frombuffer(buf, TRACE_REC_DTYPE, count=ents, offset=4096)
    del arr0
    out[f"RingView.drain ({m} records)"] = _per(ring, m, reps)
    print(f"host, synthetic, {n} events per call (NOP-flood mix), ns per event:")
    for k, v in out.items():
        print(f"  {k:<36} {v:8.1f}")
    return {"events": n, "ns_per_event": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    v = sub.add_parser("vm")
    v.add_argument("--workload", choices=("nop", "mlp"), default="nop")
    v.add_argument("--seconds", type=float, default=6.0)
    v.add_argument("--cprofile", action="store_true")
    v.add_argument("--json", default=None)
    h = sub.add_parser("host")
    h.add_argument("--events", type=int, default=5000)
    h.add_argument("--reps", type=int, default=100)
    h.add_argument("--json", default=None)
    args = ap.parse_args()
    res = vm(args) if args.mode == "vm" else host(args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
