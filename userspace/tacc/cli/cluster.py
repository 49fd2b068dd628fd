"""``tacc cluster``: captures of several nodes, aligned and analysed together.

    tacc cluster synth /tmp/cl --variant bad            # synthetic node0/node1 captures
    tacc cluster offsets node0-cap node1-cap            # each node's offset, both methods
    tacc cluster analyze node0-cap node1-cap --json f.json   # pipeline_bubble, network_bound
    tacc cluster offsets a b --rename b=node1           # two captures named alike
    tacc timeline node0-cap node1-cap -o merged.pftrace --manifest pernode/

docs/cluster.md documents the alignment, the merged view and the rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tacc.cli import UsageError
from tacc.cli.analyze import JsonTarget, json_captures

FINDINGS_SCHEMA = "tacc-cluster-findings"


def add_parser(sub: Any) -> None:
    from tacc.cli import options

    p = sub.add_parser("cluster", help="align and analyse captures of several nodes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  tacc cluster synth /tmp/c --variant bad\n"
                              "  tacc cluster offsets /tmp/c/node0 /tmp/c/node1\n"
                              "  tacc cluster analyze /tmp/c/node0 /tmp/c/node1 --json")
    cs = p.add_subparsers(dest="cluster_cmd", metavar="ACTION", required=True)
    docs = {"offsets": ("Each node's clock offset to the first (reference) node and its "
                        "bound, by the device host clock or taccd's network exchange.",
                        ["tacc cluster offsets node0/cap node1/cap",
                         "tacc cluster offsets --json node0/cap node1/cap"]),
            "analyze": ("The cross-node rules (pipeline_bubble, network_bound) over captures "
                        "of several nodes.",
                        ["tacc cluster analyze node0/cap node1/cap",
                         "tacc cluster analyze --json f.json node0/cap node1/cap"])}
    for name, fn, what in (("offsets", cmd_offsets, "each node's clock offset and bound"),
                           ("analyze", cmd_analyze, "the cross-node rules")):
        desc, examples = docs[name]
        c = cs.add_parser(name, help=what, description=desc,
                          epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                          parents=[options.captures("one capture per node", nargs="*")])
        c.add_argument("--rename", action="append", default=[], metavar="CAPTURE=NAME",
                       help="node id of CAPTURE (repeatable)")
        c.add_argument("--align", choices=["auto", "hostclk", "network"], default="auto",
                       help="host clock, network exchange, or auto")
        c.add_argument("--json", action=JsonTarget, captures_dest="captures",
                       help="JSON to FILE (or stdout: no FILE, or a directory, which is a "
                            "CAPTURE)")
        if name == "analyze":
            c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="override a cluster threshold (repeatable)")
        c.set_defaults(func=fn)
    c = cs.add_parser("synth", help="synthetic captures of the two-node pipeline (OUT/node0, "
                      "OUT/node1; tests and docs)",
                      description="Write synthetic captures of the two-node pipeline "
                                  "(OUT/node0, OUT/node1), for tests and the docs.",
                      epilog="examples:\n  tacc cluster synth /tmp/c --variant good --seed 3",
                      parents=[options.json_flag("print the capture directories written as "
                                                 "a JSON array")])
    c.add_argument("out", metavar="OUT", help="directory for node0/ and node1/")
    c.add_argument("--variant", choices=["bad", "good"], default="bad",
                   help="the bad (bubbled) or the good twin")
    c.add_argument("--seed", type=int, default=0, help="random seed of the synthetic run")
    c.set_defaults(func=cmd_synth)


def _view(args: argparse.Namespace) -> Any:
    from tacc.timeline.cluster import load_view

    args.captures = json_captures(args, "captures", f"cluster {args.cluster_cmd}")

    return load_view(args.captures, args.rename, args.align)


def _emit(args: argparse.Namespace, doc: dict[str, Any]) -> bool:
    if not args.json:
        return False
    text = json.dumps(doc, indent=1, default=str)
    if args.json == "-":
        print(text)
        return True
    with open(args.json, "w") as f:
        f.write(text + "\n")
    return False


def cmd_synth(args: argparse.Namespace) -> int:
    from tacc.capture import synth_cluster

    paths = synth_cluster.write(synth_cluster.pipeline(args.variant, args.seed), args.out)
    if args.json:
        print(json.dumps([str(p) for p in paths]))
        return 0
    for p in paths:
        print(p)
    return 0


def cmd_offsets(args: argparse.Namespace) -> int:
    view = _view(args)
    if _emit(args, view.metadata()):
        return 0
    print(f"reference {view.names[0]} ({view.caps[0].path})")
    for nc in view.clocks[1:]:
        print(f"{nc.node}: aligned by {nc.used}")
        for o in (nc.hostclk, nc.network):
            if o is None:
                continue
            print(f"  {o.method:8} offset {o.offset_ns / 1e3:+.3f} us +- {o.bound_ns / 1e3:.3f}"
                  f" us ({o.samples} samples, rate {(o.drift - 1) * 1e6:+.2f} ppm)")
    md = view.metadata()
    print(f"messages {md['messages']}, {md['packets_forward_in_time']} of "
          f"{md['messages_with_packets']} with packets forward in time")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from tacc.analyze.cluster_rules import ClusterThresholds, analyze_cluster

    th = ClusterThresholds()
    try:
        th.update(dict(kv.split("=", 1) for kv in args.set))
    except (KeyError, ValueError) as exc:
        raise UsageError(f"cluster analyze: --set: bad threshold {exc}") from None
    view = _view(args)
    found = analyze_cluster(view, th)
    doc = {"schema": FINDINGS_SCHEMA, "version": 1, "cluster": view.metadata(),
           "thresholds": th.__dict__, "findings": [f.to_json() for f in found]}
    if _emit(args, doc):
        return 0
    if not found:
        print("no cross-node findings")
    for f in found:
        print(f"{f.severity:6} {f.rule:16} {f.title}")
    for c in view.caps:
        for p in c.problems:
            print(f"tacc: warning: {c.path}: {p}", file=sys.stderr)
    return 0
