"""``tacc analyze``: findings about memory access and PCIe use in a capture."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tacc.cli import CommandError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("analyze", help="find inefficiencies in a capture",
                       description="Run the analysis rules (docs/analysis.md) over a capture.")
    p.add_argument("capture", metavar="CAPTURE")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write versioned findings.json to FILE (or stdout)")
    p.add_argument("--config", help="thresholds file (JSON or TOML, table 'thresholds')")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one threshold (repeatable)")
    p.add_argument("--rule", action="append", help="run only these rules (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tacc.capture import open_capture

    from .engine import analyze, load_thresholds, to_json, write_table
    from .rules import RULES

    try:
        th = load_thresholds(args.config, args.set)
    except KeyError as exc:
        raise CommandError(f"analyze: unknown threshold {exc}") from None
    except (OSError, ValueError) as exc:
        raise CommandError(f"analyze: bad thresholds: {exc}") from None
    for r in args.rule or []:
        if r not in RULES:
            raise CommandError(f"analyze: unknown rule {r!r} (known: {', '.join(RULES)})")
    cap = open_capture(args.capture)
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
    write_table(sys.stdout, findings, t1 - t0)
    return 0
