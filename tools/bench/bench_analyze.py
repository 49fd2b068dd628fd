#!/usr/bin/env python3
"""Benchmark: tacc analyze on a synthetic N-event capture, one core (numpy only)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tacc.analyze.data import load
from tacc.analyze.engine import analyze
from tacc.analyze.rules import RULES, Thresholds
from tacc.capture import open_capture
from tacc.capture.synth import generate_events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--dir", help="work directory (reuses its capture)")
    ap.add_argument("--json", help="write results here")
    a = ap.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench-analyze-"))
    cap_path = work / "capture"
    if not cap_path.exists():
        generate_events(cap_path, a.events)
    cap = open_capture(cap_path)
    n = sum(cap.count(s) for s in ("api", "driver", "device_trace", "host", "counters"))
    t = time.perf_counter()
    d = load(cap)
    load_s = time.perf_counter() - t
    th = Thresholds()
    per_rule = {}
    for name, fn in RULES.items():
        t = time.perf_counter()
        fn(d, th)
        per_rule[name] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    found = analyze(open_capture(cap_path), th)
    total_s = time.perf_counter() - t
    r = {"events": n, "load_s": round(load_s, 2), "rules_s": per_rule,
         "analyze_total_s": round(total_s, 2), "events_per_s": round(n / total_s),
         "findings": sorted({f.rule for f in found})}
    for k, v in r.items():
        print(f"{k:<16} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
