"""``tacc timeline``: capture(s) -> Perfetto trace, Chrome JSON, offline HTML, text summary."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from tacc.cli import CommandError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("timeline", help="correlated timeline of one or more captures",
                       description="Convert captures into a Perfetto trace (.pftrace), Chrome "
                       "trace JSON or a self-contained offline HTML view.")
    p.add_argument("captures", nargs="+", metavar="CAPTURE",
                   help="capture directories (several: merged, one node each)")
    p.add_argument("-o", "--output", help="output file (default: none with --summary)")
    p.add_argument("--format", choices=["perfetto", "json", "hta", "html"],
                   help="output format (default: from the extension, else perfetto); json: "
                        "Chrome trace JSON (chrome://tracing, Perfetto, HTA); hta: OUTPUT is "
                        "a directory of one Chrome JSON per node/function rank, HTA's "
                        "trace_dir")
    p.add_argument("--summary", action="store_true", help="print a text overview")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (there is none either when stderr is not a "
                        "terminal)")
    p.add_argument("--findings", help="findings.json of tacc analyze to overlay")
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


@contextlib.contextmanager
def progress_bar(what: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr for a long step (events done of about ``total``),
    none with -q or when stderr is not a terminal (a pipe, a log, CI)."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:,.0f} events"), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done) or None)

        yield tick


def run(args: argparse.Namespace) -> int:
    from tacc.timeline.convert import convert, load_findings

    if not args.output and not args.summary:
        raise CommandError("timeline: give -o OUTPUT and/or --summary")
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
    if args.summary:
        sys.stdout.write(res.summary)
    if args.output:
        print(f"wrote {args.output}: {res.events} events on {res.tracks} tracks", file=sys.stderr)
    return 0
