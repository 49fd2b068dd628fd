#!/usr/bin/env python3
"""In-guest: why "nothing" varied and "always-on" read faster than it.

Runs "nothing" NOP-flood phases (taccd SIGSTOPped) in the contexts the old
vm_tracing.py put them in, and records per phase what could differ: the benchmark
process's own garbage collections (count, seconds, by generation), the device's runtime-
PM resumes, and the phase before.  Contexts:

  back-to-back   nothing after nothing
  after-mlp      nothing right after an ``mlp`` run (as in every old round)
  after-mlp-gc   the same, with gc.collect() before the phase and gc off during it
  after-idle     nothing after 2.5 s idle (autosuspend is 1 s: the device suspends)
  always-on      taccd running (1 Hz sysfs sampling), right after an mlp run

    diag_baseline.py [--seconds 2] [--reps 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm_tracing import Mlp, Taccd, discover, measure  # noqa: E402


class GcWatch:
    def __init__(self) -> None:
        self.t0 = 0.0
        self.n = [0, 0, 0]
        self.secs = 0.0
        gc.callbacks.append(self.cb)

    def cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.t0 = time.perf_counter()
        else:
            self.n[info["generation"]] += 1
            self.secs += time.perf_counter() - self.t0

    def reset(self) -> None:
        self.n = [0, 0, 0]
        self.secs = 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    fn = [f for f in discover() if f.accel][0]
    pm = fn.sysfs / "tacc" / "pm_resumes"
    tmp = Path(tempfile.mkdtemp(prefix="diag-"))
    d = Taccd(tmp)
    mlp = Mlp(args.seconds)
    w = GcWatch()
    rows: list[dict[str, Any]] = []

    def phase(ctx: str, nogc: bool = False, running: bool = False) -> None:
        if not running:
            d.pause()
        if nogc:
            gc.collect()
            gc.disable()
        w.reset()
        r0 = int(pm.read_text()) if pm.exists() else -1
        rate, n = measure(fn.accel, args.seconds, 64)
        r1 = int(pm.read_text()) if pm.exists() else -1
        gc.enable()
        if not running:
            d.resume()
        row = {"context": ctx, "jobs_per_s": rate, "gc": list(w.n), "gc_s": w.secs,
               "pm_resumes": r1 - r0, "gc_objects": len(gc.get_objects())}
        rows.append(row)
        print(f"  {ctx:<14} {rate:9.0f} jobs/s  gc {w.n} {w.secs * 1e3:7.1f} ms"
              f"  pm_resumes {r1 - r0}  objects {row['gc_objects']}", flush=True)

    try:
        for _ in range(args.reps):
            phase("back-to-back")
            phase("back-to-back")
            mlp.run()
            phase("after-mlp")
            mlp.run()
            phase("after-mlp-gc", nogc=True)
            time.sleep(2.5)
            phase("after-idle", nogc=True)
            mlp.run()
            phase("always-on", running=True)
            mlp.run()
            phase("always-on-gc", nogc=True, running=True)
    finally:
        d.close()
        mlp.close()
    print("\nmedians:")
    import statistics
    for ctx in dict.fromkeys(r["context"] for r in rows):
        v = [r["jobs_per_s"] for r in rows if r["context"] == ctx]
        print(f"  {ctx:<14} {statistics.median(v):9.0f}  {[round(x) for x in v]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "diag_baseline", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
