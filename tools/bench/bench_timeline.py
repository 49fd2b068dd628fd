#!/usr/bin/env python3
"""Benchmark: capture -> Perfetto conversion on a synthetic N-event capture.

Reports events/s of the streaming numpy encoder against a per-event protobuf-object
baseline (one TracePacket object per event, SerializeToString), measured in the same
run on the same batches.  Prints a table and writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from tacc.capture import open_capture
from tacc.capture.synth import generate_events
from tacc.timeline.convert import convert
from tacc.timeline.model import Batch, Extractor, make_sources
from tacc.timeline.perfetto import baseline_packets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--baseline-events", type=int, default=200_000)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--json", help="write results here")
    a = ap.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench-timeline-"))
    cap_path = work / "capture"
    t = time.perf_counter()
    if not cap_path.exists():
        generate_events(cap_path, a.events)
    gen_s = time.perf_counter() - t
    cap = open_capture(cap_path)
    n_events = sum(cap.count(s) for s in ("api", "driver", "device_trace", "host", "counters"))
    out = work / "out.pftrace"
    t = time.perf_counter()
    res = convert([cap_path], out)
    conv_s = time.perf_counter() - t
    hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")][0]
    # baseline on the first batches, same process
    ex = Extractor(make_sources([open_capture(cap_path)]))
    done, base_s, names = 0, 0.0, None
    for b in ex.all():
        if not isinstance(b, Batch):
            continue
        names = ex.names.lookup()
        uuids = np.array([tr.uuid for tr in ex.tracks.tracks], np.uint64)
        t = time.perf_counter()
        baseline_packets(b, uuids, names)
        base_s += time.perf_counter() - t
        done += len(b)
        if done >= a.baseline_events:
            break
    r = {
        "events_in_capture": n_events,
        "events_written": res.events,
        "capture_bytes": sum(f.stat().st_size for f in (cap_path / "streams").iterdir()),
        "trace_bytes": out.stat().st_size,
        "generate_s": round(gen_s, 2),
        "convert_s": round(conv_s, 2),
        "events_per_s": round(res.events / conv_s),
        "baseline_events": done,
        "baseline_s": round(base_s, 3),
        "baseline_events_per_s": round(done / base_s) if base_s else None,
        "speedup": round((res.events / conv_s) / (done / base_s), 1) if base_s else None,
        "peak_rss_mib": round(hwm / 1024, 1),
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu": os.cpu_count(),
    }
    for k, v in r.items():
        print(f"{k:<24} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
