"""``tacc timeline``: capture(s) -> Perfetto trace, Chrome JSON, offline HTML, text summary."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tacc.cli import UsageError, options
from tacc.cli.progress import progress_bar

EPILOG = """examples:
  tacc timeline /tmp/cap -o /tmp/cap.pftrace
  tacc timeline /tmp/cap --summary
  tacc timeline /tmp/cap --summary --json
  tacc timeline /tmp/cap --format hta -o /tmp/hta
  tacc timeline node0/cap node1/cap -o merged.pftrace
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("timeline", help="correlated timeline of one or more captures",
                       description="Convert captures into a Perfetto trace (.pftrace), Chrome "
                       "trace JSON or a self-contained offline HTML view; or summarise them.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[options.captures("capture directories (several: merged, one "
                                                 "node each)"),
                                options.output("output file (default: none with --summary)"),
                                options.quiet()])
    p.add_argument("--format", choices=["perfetto", "json", "hta", "html"],
                   help="output format (default: from the extension, else perfetto); json: "
                        "Chrome trace JSON (chrome://tracing, Perfetto, HTA); hta: OUTPUT is "
                        "a directory of one Chrome JSON per node/function rank, HTA's "
                        "trace_dir")
    p.add_argument("--summary", action="store_true", help="print a text overview")
    p.add_argument("--json", action="store_true",
                   help="print the overview as one JSON object (implies --summary; shape: "
                        "docs/cli.md)")
    p.add_argument("--findings", metavar="FILE",
                   help="findings.json of tacc analyze to overlay")
    p.add_argument("--rename", action="append", default=[], metavar="CAPTURE=NAME",
                   help="node id of CAPTURE in a merge (two captures of one node id are "
                        "refused otherwise); repeatable")
    p.add_argument("--align", choices=["auto", "hostclk", "network"], default="auto",
                   help="how nodes are aligned in a merge: the device host-clock register, "
                        "taccd's network clock exchange, or auto (host clock if both "
                        "captures have it); docs/cluster.md")
    p.add_argument("--manifest", metavar="DIR",
                   help="also write each capture as its own trace plus a perfetto_manifest "
                        "placing them as the merge does (Perfetto's own multi-trace merge)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tacc.timeline.convert import convert, load_findings

    args.summary = args.summary or args.json
    if not args.output and not args.summary:
        raise UsageError("timeline: give -o OUTPUT and/or --summary")
    fmt = args.format
    if fmt is None and args.output:
        fmt = {"json": "json", "html": "html", "htm": "html"}.get(
            args.output.rsplit(".", 1)[-1].lower(), "perfetto")
    findings = load_findings(args.findings) if args.findings else None
    report = None
    if fmt == "html" and len(args.captures) == 1:  # the model view (version-3 records)
        from tacc.analyze.report import report as model_report
        from tacc.capture import open_capture

        report = model_report(open_capture(args.captures[0]))
    with progress_bar("tacc timeline", args.quiet) as tick:
        res = convert(args.captures, args.output, fmt or "perfetto", args.summary, findings,
                      args.rename, args.align, tick, report)
    if args.manifest:
        from tacc.timeline.manifest import write_manifest

        path = write_manifest(args.captures, args.manifest, args.rename, args.align)
        print(f"wrote {path}", file=sys.stderr)
    for p in res.problems:
        print(f"tacc: warning: {p}", file=sys.stderr)
    if args.json:
        json.dump(res.summary_json, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.summary:
        sys.stdout.write(res.summary)
    if args.output:
        print(f"wrote {args.output}: {res.events} events on {res.tracks} tracks", file=sys.stderr)
    return 0
