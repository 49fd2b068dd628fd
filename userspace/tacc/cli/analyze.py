"""``tacc analyze``: findings about memory access and PCIe use in a capture."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tacc.cli import CommandError, UsageError, options


class JsonTarget(argparse.Action):
    """``--json [FILE]``: JSON to FILE, or to stdout with no FILE.  A directory is never
    the file (a capture is a directory): ``tacc analyze --json CAPTURE`` is CAPTURE's
    JSON on stdout, the directory one of the captures (``captures_dest``)."""

    def __init__(self, *a: Any, captures_dest: str = "capture", **kw: Any) -> None:
        self.captures_dest = captures_dest
        super().__init__(*a, nargs="?", const="-", metavar="FILE", **kw)

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from pathlib import Path

        if values not in (None, "-") and Path(values).is_dir():
            ns.json_captures = [*getattr(ns, "json_captures", []), values]
            values = "-"
        setattr(ns, self.dest, values)


def json_captures(args: argparse.Namespace, dest: str, what: str) -> list[str]:
    """The positional captures, with a capture directory ``--json`` was given first."""
    caps = [*getattr(args, "json_captures", []), *getattr(args, dest)]
    if not caps:
        raise UsageError(f"{what}: give at least one CAPTURE")
    return caps


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "analyze", help="find inefficiencies in a capture (or a fleet of captures)",
        description="Run the analysis rules (docs/analysis.md) over a capture.  Given several "
        "captures, each is analysed as a task on a Dask distributed cluster (a local one by "
        "default), then the cross-capture rules run over all of them (docs/export.md).",
        epilog="examples:\n  tacc analyze /tmp/cap\n"
        "  tacc analyze node0/cap node1/cap              # LocalCluster, one worker each\n"
        "  tacc analyze --scheduler tcp://10.0.0.1:8786 caps/*   # a running scheduler\n"
        "  tacc analyze --scheduler serial caps/* --json fleet.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[options.captures(nargs="*", dest="capture")])
    p.add_argument("--json", action=JsonTarget,
                   help="write versioned findings.json to FILE (or stdout: no FILE, or a "
                   "directory, which is a CAPTURE); several captures: a tacc-fleet-findings "
                   "document holding one findings.json each")
    p.add_argument("--scheduler", metavar="SPEC",
                   help="where the per-capture analyses run: local (Dask LocalCluster, the "
                   "default for several captures), tcp://HOST:PORT (a Dask scheduler), or "
                   "serial (this process)")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="LocalCluster workers (default: one per capture, at most one per CPU)")
    p.add_argument("--config", help="thresholds file (JSON or TOML, table 'thresholds')")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one threshold (repeatable)")
    p.add_argument("--rule", action="append", help="run only these rules (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tacc.analyze.engine import analyze, load_thresholds, to_json, write_table
    from tacc.analyze.rules import RULES
    from tacc.capture import open_capture

    args.capture = json_captures(args, "capture", "analyze")

    try:  # a bad file: a runtime failure; a bad --set: a usage error
        th = load_thresholds(args.config, [])
    except KeyError as exc:
        raise CommandError(f"analyze: {args.config}: unknown threshold {exc}") from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"analyze: bad thresholds file: {exc}") from None
    try:
        th.update({k.strip(): v.strip() for k, _, v in (o.partition("=") for o in args.set)})
    except KeyError as exc:
        raise UsageError(f"analyze: --set: unknown threshold {exc}") from None
    except ValueError as exc:
        raise UsageError(f"analyze: --set: {exc}") from None
    from tacc.analyze.cross import CROSS_RULES

    known = [*RULES, *CROSS_RULES]
    for r in args.rule or []:
        if r not in known:
            raise UsageError(f"analyze: unknown rule {r!r} (known: {', '.join(known)})")
    if len(args.capture) > 1 or args.scheduler:
        return run_fleet(args, th)
    cap = open_capture(args.capture[0])
    findings = analyze(cap, th, args.rule)
    for p in cap.problems:
        print(f"tacc: warning: {cap.path}: {p}", file=sys.stderr)
    if args.json:
        doc = json.dumps(to_json(cap, findings, th), indent=1, default=str)
        if args.json == "-":
            print(doc)
            return 0
        with open(args.json, "w") as f:
            f.write(doc + "\n")
    t0, t1 = cap.time_range
    write_table(sys.stdout, findings, t1 - t0, t0)
    return 0


def run_fleet(args: argparse.Namespace, th: Any) -> int:
    """Several captures (or an explicit scheduler): per-capture tasks, then cross rules."""
    from pathlib import Path

    from tacc.analyze.engine import write_table
    from tacc.analyze.rules import Finding
    from tacc.fleet.dist import analyze_many, check_scheduler, fleet_doc

    spec = check_scheduler(args.scheduler or "local")
    if args.workers < 0:
        raise UsageError(f"analyze: --workers {args.workers}: not a number of workers")
    paths = [Path(p) for p in args.capture]
    thd = dict(th.__dict__)
    docs = analyze_many(paths, thd, args.rule, spec, args.workers)
    doc = fleet_doc(paths, docs, thd, args.rule, spec)
    for d in docs:
        for p in d["capture"]["problems"]:
            print(f"tacc: warning: {d['capture']['path']}: {p}", file=sys.stderr)
    if args.json:
        out = docs[0] if len(docs) == 1 and not doc["cross"]["findings"] else doc
        text = json.dumps(out, indent=1, default=str)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for d in docs:
        c = d["capture"]
        sys.stdout.write(f"== {c['node']}: {c['path']}\n")
        write_table(sys.stdout, [Finding(**f) for f in d["findings"]], c["span_ns"],
                    c["t_start_ns"])
    cross = doc["cross"]
    if len(docs) > 1:
        sys.stdout.write(f"== across {len(docs)} captures: "
                         f"{', '.join(cross['rules']) or 'no cross-capture rules'}\n")
        if cross["rules"]:
            spans = [d["capture"]["span_ns"] for d in docs]
            write_table(sys.stdout, [Finding(**f) for f in cross["findings"]], max(spans))
    return 0
