"""``tacc cdi generate|list``: Container Device Interface specs (docs/containers.md)."""

from __future__ import annotations

import argparse
import json

from tacc import cdi
from tacc.cli import CommandError

EPILOG = """examples:
  tacc cdi generate                      # /etc/cdi/tacc.yaml and /etc/cdi/tacc-vfio.yaml
  tacc cdi generate -o /tmp/cdi/tacc.yaml -d 0000:01:00.1 --json
  tacc cdi list                          # tacc.dev/accel=0000:01:00.0 /dev/accel/accel0 ...
  tacc cdi list tacc.dev/accel=0000:01:00.1 --json
  podman run --device tacc.dev/accel=0000:01:00.1 ...   (docs/containers.md)
"""


def _generate(args: argparse.Namespace) -> int:
    paths = cdi.generate(args.output, only=args.device or ())
    specs = [{"kind": kind, "path": str(path),
              "devices": [f"{kind}={d['name']}" for d in cdi.load(path)["devices"]]}
             for kind, path in paths.items()]
    if args.json:
        print(json.dumps(specs, indent=2))
        return 0
    for sp in specs:
        n = len(sp["devices"])
        print(f"{sp['path']}: {sp['kind']}, {n} device{'s' if n != 1 else ''}")
    return 0


def _nodes(edits: dict) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


def _list(args: argparse.Namespace) -> int:
    if args.names:
        rows = [(n, cdi.resolve(n, args.output)) for n in args.names]
    else:
        rows = cdi.qualified_names(args.output)
    if args.json:
        print(json.dumps([{"name": n, "containerEdits": e} for n, e in rows], indent=2))
        return 0
    if not rows and not any(p.exists() for p in cdi.spec_paths(args.output).values()):
        raise CommandError(f"{args.output}: no spec (run 'tacc cdi generate' first)")
    for name, edits in rows:
        print(f"{name} {' '.join(_nodes(edits))}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tacc.cli import options

    p = sub.add_parser("cdi", help="Container Device Interface specs for containers",
                       description="CDI specs naming each tacc function: "
                                   "tacc.dev/accel=<PCI> and tacc.dev/vfio=<PCI>",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cs = p.add_subparsers(dest="cdi_command", metavar="SUBCOMMAND", required=True)
    spec = options.output(f"accel spec file; the vfio spec goes beside it (default "
                          f"{cdi.DEFAULT_SPEC})", default=cdi.DEFAULT_SPEC)
    g = cs.add_parser("generate", help="write the specs from sysfs",
                      description="Write the CDI spec (one device per function) for "
                                  "container engines.", epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      parents=[spec, options.device("only this function (repeatable; "
                                                    "default every tacc function)"),
                               options.json_flag("print each spec written (kind, path, "
                                                 "device names) as JSON")])
    g.set_defaults(func=_generate)
    ls = cs.add_parser("list", help="the CDI device names in the specs",
                       description="The CDI device names and their container edits.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[spec, options.json_flag("names and container edits as JSON")])
    ls.add_argument("names", nargs="*", metavar="NAME",
                    help="only these fully qualified names (an unknown one is an error)")
    ls.set_defaults(func=_list)
