"""``tacc export`` (captures -> Parquet) and ``tacc query`` (DuckDB SQL over an export)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tacc.cli import CommandError, options
from tacc.cli.progress import progress_bar

EXPORT_EPILOG = """\
examples:
  tacc export /tmp/cap -o /tmp/fleet
  tacc export node0/cap node1/cap -o fleet      # one dataset per stream, both captures
  tacc query fleet 'SELECT node, count(*) FROM device_trace GROUP BY node'

layout (docs/export.md):
  DIR/_tacc_export.json
  DIR/<stream>/node=<node>/capture=<capture>/part-0.parquet
"""

QUERY_EPILOG = """\
examples:
  tacc query fleet 'SELECT * FROM captures'
  tacc query fleet --csv 'SELECT engine, sum(t_end_ns - t_start_ns) AS busy_ns
                          FROM device_trace GROUP BY engine ORDER BY engine'
  tacc query fleet --json 'SELECT a.node, a.tag, d.t_start_ns - a.t_start AS api_to_dev_ns
        FROM api a JOIN device_trace d USING (node, capture, tag) LIMIT 10'

views: one per dataset (the capture's streams, plus captures and functions), each with
the partition columns node and capture.  SQL is DuckDB's; DuckDB runs in this process.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="write captures as Parquet datasets (pyarrow)",
                       description="Export captures to Parquet: one dataset per stream, "
                       "hive-partitioned by node and capture, for DuckDB, pandas, Spark...",
                       epilog=EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[options.captures(dest="capture"), options.output(
                           "dataset directory (created, or added to: a capture exported again "
                           "replaces its old partition)", required=True, metavar="DIR"),
                           options.json_flag("print what was written as JSON"),
                           options.quiet()])
    p.add_argument("--compression", default="zstd", choices=["zstd", "lz4", "snappy", "none"],
                   help="Parquet codec (default zstd, level 1)")
    p.set_defaults(func=run_export)
    q = sub.add_parser("query", help="run SQL over an export (DuckDB, embedded)",
                       description="Run one SQL statement with DuckDB over a tacc export.",
                       epilog=QUERY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("dir", metavar="DIR", help="the export directory (tacc export -o DIR)")
    q.add_argument("sql", metavar="SQL", help="the SQL query (DuckDB)")
    fmt = q.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="fmt", action="store_const", const="json",
                     help="rows as a JSON array of objects")
    fmt.add_argument("--csv", dest="fmt", action="store_const", const="csv",
                     help="rows as CSV with a header line")
    q.set_defaults(func=run_query, fmt="table")


def run_export(args: argparse.Namespace) -> int:
    import json

    from tacc.capture import open_capture
    from tacc.fleet.export import Exporter, capture_ids

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CommandError(f"export: {out}: not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "_tacc_export.json").exists():
        raise CommandError(f"export: {out}: not empty and not a tacc export")
    caps = [open_capture(p) for p in args.capture]  # every capture valid before writing
    done = []
    with progress_bar("tacc export", args.quiet, "rows") as tick:
        ex = Exporter(out, compression=args.compression, progress=tick)
        out.mkdir(parents=True, exist_ok=True)
        ex.total = sum(c.count(s) for c in caps for s in c.streams)
        for cap, cid in zip(caps, capture_ids(caps), strict=True):
            done.append(ex.export(cap, cid))
    for cap, res in zip(caps, done, strict=True):
        if not cap.complete:
            print(f"tacc: warning: {cap.path}: incomplete capture (no 'complete' marker): "
                  f"exported up to the last whole chunk of each stream", file=sys.stderr)
        for p in res.problems[0 if cap.complete else 1:]:
            print(f"tacc: warning: {cap.path}: {p}", file=sys.stderr)
    ex.write_manifest(done)
    if args.json:
        print(json.dumps([r.__dict__ for r in done], indent=1))
        return 0
    for r in done:
        drops = sum(r.dropped.values())
        print(f"{r.node}/{r.capture}: {r.rows} rows in {len(r.streams)} streams"
              f"{'' if r.complete else ' (incomplete capture)'}"
              f"{f', {drops} records dropped while capturing' if drops else ''}"
              f", {r.seconds:.2f} s")
    print(f"export: {out}")
    return 0


def run_query(args: argparse.Namespace) -> int:
    from tacc.fleet.query import main

    return main(Path(args.dir), args.sql, args.fmt)
