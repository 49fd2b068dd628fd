#!/usr/bin/env python3
"""In-guest: where a taccd capture's cost on ``mlp`` goes, one source off at a time
(issue 18 item 3).

The ``mlp`` workload of vm_tracing.py (batches/s) under, in turn:

  nothing       taccd SIGSTOPped, no capture
  capture       a taccd capture with its defaults
  no-api        the same without the runtime API rings (``api: false``)
  no-host       without the traced process's sched/host events (``host_events: false``)
  no-devtrace   without the device trace ring consumer (``device_trace: false``)
  driver-only   all three off: driver events, counters and clock pairs only
  driver-paused driver-only with taccd SIGSTOPped for the workload (its BPF ring holds
                the phase's events; drained after): the kernel side alone, in the
                traced process and its interrupts; driver-only minus it is taccd's
  capture-b1    a default capture with the runtime publishing each API record on its own
                (batch 1, as before issue 18's batching): the batching's before/after
  api-local     no capture; this process's API rings enabled and drained by the
                benchmark after the phase: the producer's cost alone (batch 32)
  bpf-stats     a default capture with ``kernel.bpf_stats_enabled`` on: the kernel's
                run_time_ns / run_cnt of every program taccd attached (bpftool), as ns
                per run and µs per batch of the run (its set-up and output check
                included); its rate is not compared (the stats cost too)

Modes rotate per round (as vm_tracing.py); per mode the median batches/s over rounds with
its 95 % interval, the ratio to nothing (paired bootstrap, benchstats.py), the cost per
batch (median over rounds of 1e6/rate(mode) - 1e6/rate(nothing), µs: a source's share is
capture's minus the mode without it), taccd's CPU share and the records the capture kept
per batch (warm-up batches included).

    vm_mlp_stages.py [--seconds 1] [--rounds 3] [--modes ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# api-local holds a whole phase's records (~20 per batch) without a consumer
os.environ.setdefault("TACC_API_RING_RECORDS", str(1 << 15))
sys.path.insert(0, str(ROOT / "userspace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from benchstats import median_ci, ratio_ci  # noqa: E402
from tacc.devices import discover  # noqa: E402
from vm_stages import prog_stats  # noqa: E402  (bpftool run-time stats)
from vm_tracing import MlpWork, Taccd, cpu_s  # noqa: E402

OPTIONS: dict[str, dict[str, Any]] = {
    "capture": {},
    "no-api": {"api": False},
    "no-host": {"host_events": False},
    "no-devtrace": {"device_trace": False},
    "driver-only": {"api": False, "host_events": False, "device_trace": False},
    "driver-paused": {"api": False, "host_events": False, "device_trace": False},
    "capture-b1": {},
    "api-local": {},
    "bpf-stats": {},
}
MODES = ("nothing", *OPTIONS)
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def set_batch(n: int) -> None:
    from tacc.runtime import apitrace

    apitrace._tracer.batch = n
    r = apitrace.current_ring()
    if r is not None:
        r.publish()
        r.batch = n


def phase(d: Taccd, mode: str, work: MlpWork) -> dict[str, Any]:
    from tacc.runtime import apitrace

    if mode == "capture-b1":
        set_batch(1)
    if mode in ("nothing", "api-local"):
        d.pause()
        if mode == "api-local":
            apitrace.set_process_enabled(True)
    else:
        out = str(d.tmp / f"cap{d.ncap + 1}")
        d.ncap += 1
        if mode == "bpf-stats":
            STATS.write_text("1")
        d.req({"cmd": "start", "output": out, "options": OPTIONS[mode]})
    gc.collect()
    gc.disable()
    if mode == "driver-paused":
        d.pause()
    work.warm()
    s0 = prog_stats() if mode == "bpf-stats" else {}
    c0, t0 = cpu_s(d.p.pid), time.monotonic()
    rate = work.run()
    dt = time.monotonic() - t0
    cpu = (cpu_s(d.p.pid) - c0) / dt if mode not in ("nothing", "api-local") else 0.0
    s1 = prog_stats() if mode == "bpf-stats" else {}
    if mode == "driver-paused":
        d.resume()
    gc.enable()
    res: dict[str, Any] = {"mode": mode, "rate": rate, "cpu": cpu, "drops": 0}
    set_batch(apitrace.batch_size())
    if mode in ("nothing", "api-local"):
        if mode == "api-local":
            apitrace.set_process_enabled(False)
            for r in apitrace._tracer.rings:
                r.publish()
                res["records"] = {"api": int(r.head - r._tail.value),
                                  "api_dropped": int(r._dropped.value)}
                r._tail.value = r.head
        d.resume()
        return res
    if mode == "bpf-stats":
        STATS.write_text("0")
        # per batch of the run: the stats cover the whole run (its set-up, the measured
        # batches, the output check), ``rate * dt`` would count the set-up's and check's
        # wall as batches (session 9's per-batch handler figures were ~3.3x too low)
        nb = work.m.batches
        res["handlers"] = {
            k: {"ns_per_run": (t1 - s0.get(k, (0, 0))[0]) / (c1 - s0.get(k, (0, 0))[1]),
                "runs_per_batch": (c1 - s0.get(k, (0, 0))[1]) / nb,
                "us_per_batch": (t1 - s0.get(k, (0, 0))[0]) / nb / 1e3}
            for k, (t1, c1) in s1.items() if c1 > s0.get(k, (0, 0))[1]}
    s = d.stop()
    res["records"] = s.get("records", {})
    res["drops"] = peers.drops_total(s.get("drops", {}))
    subprocess.run(["rm", "-rf", out], check=False)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="per phase (guest time)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("vm_mlp_stages: must run as root inside the VM", file=sys.stderr)
        return 1
    modes = [m for m in a.modes.split(",") if m]
    if "nothing" not in modes or any(m not in MODES for m in modes):
        print(f"vm_mlp_stages: --modes from {','.join(MODES)}, with nothing",
              file=sys.stderr)
        return 2
    if not [f for f in discover() if f.accel]:
        print("vm_mlp_stages: no tacc device", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="vm-mlp-stages-"))
    d = Taccd(tmp)
    work = MlpWork(a.seconds)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    try:
        d.start()  # compile the capture program outside any measured phase
        d.stop()
        for r in range(a.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                res = phase(d, mode, work)
                runs[mode].append(res)
                rec = res.get("records", {})
                print(f"  round {r + 1} mlp {mode:<12} {res['rate']:8.1f}/s cpu "
                      f"{res['cpu'] * 100:5.1f}% drops {res['drops']} "
                      f"records {json.dumps(rec, sort_keys=True)}", flush=True)
    finally:
        d.close()
        work.m.close()
        if STATS.exists():
            STATS.write_text("0")
    rows = summarize(runs, work.m.batches)
    print(f"\nmlp, one capture source off at a time ({a.rounds} rounds, {a.seconds:g} s, "
          f"{work.m.batches} batches per phase)")
    print(f"{'mode':<12} {'batches/s':>9} {'95% CI':>17} {'x nothing':>9} {'95% CI':>15} "
          f"{'us/batch':>8} {'taccd CPU':>9}  records per batch")
    for row in rows:
        per = " ".join(f"{k}={v:.1f}" for k, v in sorted(row["records_per_batch"].items()))
        print(f"{row['mode']:<12} {row['median']:9.1f} [{row['ci'][0]:7.1f},"
              f"{row['ci'][1]:7.1f}] {row['ratio']:9.3f} [{row['ratio_ci'][0]:.3f},"
              f"{row['ratio_ci'][1]:.3f}] {row['us_per_batch']:8.1f} "
              f"{row['cpu'] * 100:8.1f}%  {per}")
        for k, v in sorted(row.get("handlers", {}).items()):
            print(f"    {k:<28} {v['ns_per_run']:8.0f} ns/run {v['runs_per_batch']:6.2f} "
                  f"runs/batch {v['us_per_batch']:7.2f} us/batch")
    if a.json:
        Path(a.json).write_text(json.dumps({"bench": "mlp_stages", "rounds": a.rounds,
                                            "seconds": a.seconds, "results": rows,
                                            "runs": runs}, indent=1))
    return 0


def summarize(runs: dict[str, list[dict[str, Any]]], batches: int) -> list[dict[str, Any]]:
    base = [r["rate"] for r in runs["nothing"]]
    rows = []
    for mode, rs in runs.items():
        rates = [r["rate"] for r in rs]
        med, lo, hi = median_ci(rates)
        rat, rlo, rhi = ratio_ci(rates, base)
        us = sorted(1e6 / x - 1e6 / b for x, b in zip(rates, base, strict=True))
        cpu = sorted(r["cpu"] for r in rs)
        recs: dict[str, float] = {}
        for r in rs:
            for k, v in r.get("records", {}).items():
                recs[k] = recs.get(k, 0.0) + v / batches / len(rs)
        row: dict[str, Any] = {"mode": mode, "median": med, "ci": [lo, hi], "ratio": rat,
                               "ratio_ci": [rlo, rhi], "runs": rates,
                               "us_per_batch": us[len(us) // 2], "cpu": cpu[len(cpu) // 2],
                               "records_per_batch": recs,
                               "drops": sum(r["drops"] for r in rs)}
        hs = [r["handlers"] for r in rs if "handlers" in r]
        if hs:
            row["handlers"] = {k: {f: sorted(h[k][f] for h in hs if k in h)[
                len([h for h in hs if k in h]) // 2] for f in hs[0][k]}
                for k in hs[0]}
        rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
