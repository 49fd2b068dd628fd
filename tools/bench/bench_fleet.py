#!/usr/bin/env python3
"""Benchmark: fleet analysis on existing engines.

1. ``tacc export`` of a synthetic N-event capture (default 10 million events, written by
   the real capture writer through tacc.capture.synth.generate_events): events/s;
2. DuckDB aggregates over that export (embedded, the views of ``tacc query``);
3. the analysis of 8 captures: serial in this process, and on a Dask LocalCluster with
   1 and 2 workers (cluster start included and also given separately).

One run, side by side; JSON (--json) and a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tacc.analyze.rules import Thresholds
from tacc.capture import open_capture
from tacc.capture.synth import generate_events
from tacc.fleet.dist import analyze_many
from tacc.fleet.export import Exporter
from tacc.fleet.query import connect

AGGREGATES = {
    "all_streams": "SELECT 'device_trace' AS s, count(*), sum(t_end - t_start) FROM device_trace "
                   "UNION ALL SELECT 'driver', count(*), sum(dur_ns) FROM driver "
                   "UNION ALL SELECT 'api', count(*), sum(t_end - t_start) FROM api "
                   "UNION ALL SELECT 'counters', count(*), max(h2d_bytes) FROM counters "
                   "UNION ALL SELECT 'host', count(*), sum(dur_ns) FROM host",
    "busy_per_engine": "SELECT node, fid, engine, count(*) AS n, "
                       "sum(t_end_ns - t_start_ns) AS busy_ns FROM device_trace "
                       "GROUP BY ALL ORDER BY ALL",
    "driver_kinds": "SELECT kind, count(*), sum(dur_ns), max(size) FROM driver GROUP BY kind",
    "api_to_device": "SELECT count(*), median(d.t_start_ns - a.t_start) FROM api a "
                     "JOIN device_trace d USING (node, capture, tag) WHERE a.tag <> 0",
}


def _events(cap: Any) -> int:
    return sum(cap.count(s) for s in cap.streams)


def bench_export(work: Path, events: int) -> dict[str, Any]:
    cap_path = work / "capture"
    if not cap_path.exists():
        t = time.perf_counter()
        generate_events(cap_path, events)
        print(f"generated {cap_path} in {time.perf_counter() - t:.1f} s")
    cap = open_capture(cap_path)
    n = _events(cap)
    out = work / "export"
    r: dict[str, Any] = {}
    for codec in ("lz4", "zstd"):  # lz4 first (its files are dropped), zstd is the default
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        ex = Exporter(out, compression=codec)
        res = ex.export(cap, "capture")
        ex.write_manifest([res])
        dt = time.perf_counter() - t
        size = sum(f.stat().st_size for f in out.rglob("*.parquet"))
        r[f"export_{codec}_s"] = round(dt, 2)
        r[f"events_per_s_{codec}"] = round(n / dt)
        r[f"parquet_{codec}_mb"] = round(size / 1e6, 1)
    cap_bytes = sum(f.stat().st_size for f in (cap_path / "streams").iterdir())
    r.update({"events": n, "capture_mb": round(cap_bytes / 1e6, 1), "rows": res.streams})
    con = connect(out)
    q: dict[str, float] = {}
    for name, sql in AGGREGATES.items():
        con.execute(sql).fetchall()  # warm (file metadata, page cache)
        t = time.perf_counter()
        con.execute(sql).fetchall()
        q[name] = round(time.perf_counter() - t, 3)
    rows = sum(x[1] for x in con.execute(AGGREGATES["all_streams"]).fetchall())
    con.close()
    r["duckdb_s"] = q
    r["duckdb_all_streams_rows"] = rows
    r["duckdb_all_streams_rows_per_s"] = round(rows / max(q["all_streams"], 1e-6))
    return r


def bench_dask(work: Path, n_caps: int, events: int) -> dict[str, Any]:
    paths = []
    for i in range(n_caps):
        p = work / f"fleet{i}"
        if not p.exists():
            generate_events(p, events, seed=i)
        paths.append(p)
    n = sum(_events(open_capture(p)) for p in paths)
    th = dict(Thresholds().__dict__)
    r: dict[str, Any] = {"captures": n_caps, "events": n}
    ref = None
    for spec, workers in (("serial", 0), ("local", 1), ("local", 2)):
        t = time.perf_counter()
        docs = analyze_many(paths, th, None, spec, workers)
        dt = time.perf_counter() - t
        key = spec if spec == "serial" else f"dask_{workers}w"
        r[f"{key}_s"] = round(dt, 2)
        if ref is None:
            ref = docs
        r[f"{key}_same_findings"] = docs == ref
    r["speedup_2w_over_1w"] = round(r["dask_1w_s"] / r["dask_2w_s"], 2)
    r["speedup_2w_over_serial"] = round(r["serial_s"] / r["dask_2w_s"], 2)
    import logging

    from distributed import Client, LocalCluster

    t = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as c, Client(c):
        r["cluster_start_2w_s"] = round(time.perf_counter() - t, 2)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=10_000_000, help="export capture size")
    ap.add_argument("--fleet-events", type=int, default=300_000, help="each of the 8")
    ap.add_argument("--captures", type=int, default=8)
    ap.add_argument("--dir", help="work directory (reuses its captures)")
    ap.add_argument("--json", help="write results here")
    a = ap.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench-fleet-"))
    r = {"export": bench_export(work, a.events),
         "dask": bench_dask(work, a.captures, a.fleet_events)}
    for part, vals in r.items():
        print(f"---- {part}")
        for k, v in vals.items():
            print(f"{k:<34} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n")
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
