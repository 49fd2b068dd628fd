"""``tacc vfio list|bind|unbind``: move tacc functions between tacc.ko and vfio-pci."""

from __future__ import annotations

import argparse
import json

from tacc.vfio import bind as vb

EPILOG = """examples:
  tacc vfio list                    every tacc function: driver, IOMMU group, node, openers
  tacc vfio bind 0000:01:00.1       give VF 1 to vfio-pci (/dev/vfio/<group>)
  tacc vfio unbind 0000:01:00.1     back to tacc.ko (/dev/accel/accelN)
  tacc vfio list --json

refused (one line, exit status 2): a function whose accel node or VFIO group is open,
the PF while VFs are enabled, a function without an IOMMU group (IOMMU off)."""


def _print(fs: list[vb.Function], as_json: bool) -> None:
    if as_json:
        print(json.dumps([f.as_dict() for f in fs], indent=1))
        return
    print(f"{'BDF':<14}{'KIND':<5}{'DRIVER':<10}{'GROUP':<6}{'NODE':<20}OPENERS")
    for f in fs:
        node = f.accel or f.vfio or "-"
        grp = "-" if f.group is None else str(f.group)
        print(f"{f.bdf:<14}{f.kind:<5}{f.driver or '-':<10}{grp:<6}{node:<20}"
              f"{', '.join(f.openers) or '-'}")


def cmd_list(args: argparse.Namespace) -> int:
    _print(vb.functions(), args.json)
    return 0


def cmd_bind(args: argparse.Namespace) -> int:
    _print([vb.bind(args.bdf)], args.json)
    return 0


def cmd_unbind(args: argparse.Namespace) -> int:
    _print([vb.unbind(args.bdf)], args.json)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vfio", help="bind tacc functions to vfio-pci and back",
                       description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    vs = p.add_subparsers(dest="vfio_cmd", metavar="ACTION", required=True)
    for name, func, help_ in (("list", cmd_list, "list tacc functions and their drivers"),
                              ("bind", cmd_bind, "give a function to vfio-pci"),
                              ("unbind", cmd_unbind, "give a function back to tacc.ko")):
        q = vs.add_parser(name, help=help_, epilog=EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
        if name != "list":
            q.add_argument("bdf", metavar="BDF", help="PCI function, e.g. 0000:01:00.1")
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=func)
