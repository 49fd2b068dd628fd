"""``tacc devices``: the tacc functions taccd sees (PFs, VFs, virtio-tacc), by PCI address."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from tacc.devices import TaccFunction, discover

EPILOG = """examples:
  tacc devices                 PCI  KIND  PF  NODE  DRIVER, one function a line
  tacc devices --json          the same, and each function's capture description (meta)
  tacc devices --kind virtio   only virtio-tacc functions (docs/virtio.md)
"""
KINDS = ("pf", "vf", "virtio")


def _driver(fn: TaccFunction) -> str:
    """The bound driver: tacc (or vfio-pci) on the PCI function; for a virtio-tacc
    function, the virtio device's (tacc-virtio)."""
    dirs = sorted(fn.sysfs.glob("virtio*")) if fn.kind == "virtio" else [fn.sysfs]
    for d in dirs:
        try:
            return os.path.basename(os.readlink(d / "driver"))
        except OSError:
            continue
    return ""


def describe(fn: TaccFunction) -> dict[str, Any]:
    return {"pci": fn.pci, "kind": fn.kind, "pf": fn.pf, "accel": fn.accel,
            "driver": _driver(fn), "meta": fn.meta()}


def _run(args: argparse.Namespace) -> int:
    rows = [describe(f) for f in discover(args.sysroot)
            if not args.kind or f.kind == args.kind]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'PCI':<14}{'KIND':<8}{'PF':<14}{'NODE':<20}DRIVER")
    for r in rows:
        print(f"{r['pci']:<14}{r['kind']:<8}{r['pf']:<14}{r['accel'] or '-':<20}"
              f"{r['driver'] or '-'}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tacc.cli import options

    p = sub.add_parser("devices", help="list tacc functions (PF, VF, virtio) by PCI address",
                       description="The tacc functions in sysfs, as taccd discovers them: "
                                   "PFs, VFs, then virtio-tacc functions",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       parents=[options.json_flag("a JSON array, one object per function")])
    p.add_argument("--kind", choices=KINDS, help="only functions of this kind")
    p.add_argument("--sysroot", default="/", help=argparse.SUPPRESS)
    p.set_defaults(func=_run)
