#!/usr/bin/env python3
"""Runtime API-call overhead: tracing off, on, and on with a reader draining the rings.

One run, interleaved rounds (off, on, on+reader, repeated), medians per mode, ratios to
"off".  Two calls are measured: ``query`` (``Stream.query()`` on an idle stream: pure
runtime bookkeeping, the worst case for relative overhead) and ``nop`` (``Stream.nop()``:
a real submit ioctl; the stream is synchronized every 64 calls).  The reader is a separate
process that drains every ring of this process in bulk every millisecond, as taccd does.

    vm_api_overhead.py [--calls 5000] [--rounds 5] [--sim] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "userspace"))
# big enough that "on" never measures the ring-full (drop) path; set before the import
os.environ.setdefault("TACC_API_RING_RECORDS", str(1 << 17))

from tacc.runtime import Context, Stream, apitrace  # noqa: E402

READER = """
import os, sys, time
from tacc.runtime import apitrace
pid = int(sys.argv[1]); n = 0
print("ready", flush=True)
readers = {}
i = 0
try:
    while True:
        if i % 100 == 0:  # new threads' rings: rescan every 100 ms
            for p in apitrace.list_rings(pid=pid):
                if p not in readers:
                    readers[p] = apitrace.RingReader(p)
        for r in readers.values():
            n += len(r.drain())
        i += 1
        time.sleep(0.001)
except KeyboardInterrupt:
    pass
drops = sum(r.dropped for r in readers.values())
print(n, drops, flush=True)
"""


def _measure(kind: str, s: Stream, calls: int) -> float:
    if kind == "query":
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            s.query()
        return (time.perf_counter_ns() - t0) / calls
    t0 = time.perf_counter_ns()
    for i in range(calls):
        s.nop()
        if i % 64 == 63:
            s.synchronize()
    s.synchronize()
    return (time.perf_counter_ns() - t0) / calls


def _drain_own() -> None:
    for p in apitrace.list_rings(pid=os.getpid()):
        r = apitrace.RingReader(p)
        r.drain()
        r.close()


def _start_reader() -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "userspace"))
    p = subprocess.Popen([sys.executable, "-c", READER, str(os.getpid())], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        raise RuntimeError("reader did not start")
    return p


def _stop_reader(p: subprocess.Popen[str]) -> tuple[int, int]:
    import signal

    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    n, drops = out.split()[-2:]
    return int(n), int(drops)


def run(calls: int, rounds: int, sim: bool) -> dict[str, Any]:
    res: dict[str, dict[str, list[float]]] = {k: {"off": [], "on": [], "reader": []}
                                              for k in ("query", "nop")}
    drained = drops = 0
    with Context(sim=True if sim else None) as ctx:
        s = ctx.stream()
        for kind in res:  # warm-up (creates the ring)
            _measure(kind, s, min(calls, 200))
        for _ in range(rounds):
            for mode in ("off", "on", "reader"):
                apitrace.set_process_enabled(mode != "off")
                reader = _start_reader() if mode == "reader" else None
                try:
                    for kind in res:
                        res[kind][mode].append(_measure(kind, s, calls))
                        if mode == "on":
                            _drain_own()  # untimed: keep the ring from filling up
                finally:
                    if reader is not None:
                        n, d = _stop_reader(reader)
                        drained += n
                        drops += d
        apitrace.set_process_enabled(False)
        _drain_own()  # nothing left pending: the rings are removed at exit
        device = ctx.device.pci + (" (sim)" if ctx.device.sim else "")
    out: dict[str, Any] = {"benchmark": "api_overhead", "device": device, "calls": calls,
                           "rounds": rounds, "reader_records": drained,
                           "ring_drops_total": drops, "ns_per_call": {}, "ratio_to_off": {}}
    for kind, modes in res.items():
        med = {m: statistics.median(v) for m, v in modes.items()}
        out["ns_per_call"][kind] = {m: round(v, 1) for m, v in med.items()}
        out["ratio_to_off"][kind] = {m: round(v / med["off"], 3) for m, v in med.items()}
    return out


def table(r: dict[str, Any]) -> str:
    lines = [f"API-call overhead on {r['device']}: {r['calls']} calls x {r['rounds']} rounds "
             "(median ns/call, ratio to tracing off)",
             f"{'call':8} {'off':>10} {'on':>16} {'on + reader':>18}"]
    for k, v in r["ns_per_call"].items():
        q = r["ratio_to_off"][k]
        lines.append(f"{k:8} {v['off']:>10.0f} {v['on']:>9.0f} ({q['on']:.2f}x)"
                     f" {v['reader']:>10.0f} ({q['reader']:.2f}x)")
    lines.append(f"records drained by the reader: {r['reader_records']}, "
                 f"ring drops: {r['ring_drops_total']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sim", action="store_true", help="simulator backend (no device)")
    ap.add_argument("--json", metavar="OUT", help="also write the JSON result here ('-': stdout)")
    a = ap.parse_args(argv)
    r = run(a.calls, a.rounds, a.sim)
    print(table(r))
    if a.json == "-":
        print(json.dumps(r, indent=2))
    elif a.json:
        Path(a.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
