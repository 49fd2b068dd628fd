"""``tacc vfio list|bind|unbind|selftest|nop|migrate``: move tacc functions between tacc.ko
and vfio-pci (or tacc_vfio_pci, the variant driver with live migration), and drive them."""

from __future__ import annotations

import argparse
import json

from tacc.vfio import bind as vb

EPILOG = """examples:
  tacc vfio list                    every tacc function: driver, IOMMU group, node, openers
  tacc vfio bind 0000:01:00.1       give VF 1 to vfio-pci (/dev/vfio/<group>)
  tacc vfio unbind 0000:01:00.1     back to tacc.ko (/dev/accel/accelN)
  tacc vfio list --json
  tacc vfio selftest 0000:01:00.2   user-space driver: copies and a GEMM against numpy
  tacc vfio selftest --bind 0000:01:00.2   the same, binding first and unbinding after
  tacc vfio nop 0000:01:00.2 -n 200   NOP submit-to-completion through tacc.vfio
  tacc vfio bind --migration 0000:01:00.1   give VF 1 to tacc_vfio_pci (VFIO live migration)
  tacc vfio migrate --bind 0000:01:00.1     a migration with jobs in flight, timed

refused (one line, exit status 1): a function whose accel node or VFIO group is open,
the PF while VFs are enabled, a function without an IOMMU group (IOMMU off)."""


def _print(fs: list[vb.Function], as_json: bool) -> None:
    if as_json:
        print(json.dumps([f.as_dict() for f in fs], indent=1))
        return
    print(f"{'BDF':<14}{'KIND':<5}{'DRIVER':<14}{'GROUP':<6}{'NODE':<20}OPENERS")
    for f in fs:
        node = f.accel or f.vfio or "-"
        grp = "-" if f.group is None else str(f.group)
        print(f"{f.bdf:<14}{f.kind:<5}{f.driver or '-':<14}{grp:<6}{node:<20}"
              f"{', '.join(f.openers) or '-'}")


def cmd_list(args: argparse.Namespace) -> int:
    _print(vb.functions(), args.json)
    return 0


def cmd_bind(args: argparse.Namespace) -> int:
    _print([vb.bind(args.bdf, driver=vb.VARIANT_DRIVER if args.migration else vb.VFIO_DRIVER)],
           args.json)
    return 0


def cmd_unbind(args: argparse.Namespace) -> int:
    _print([vb.unbind(args.bdf)], args.json)
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from tacc.vfio import workload
    from tacc.vfio.driver import TaccVfio

    bound = args.bind and vb.describe(args.bdf).driver != vb.VFIO_DRIVER
    if bound:
        vb.bind(args.bdf)
    try:
        with TaccVfio(args.bdf) as t:
            res = {"bdf": t.bdf, "func": t.func, "devmem_bytes": t.devmem_size,
                   "copy_bytes": workload.copies(t, huge=args.huge),
                   "gemm_max_rel_err": workload.gemm(t)}
    finally:
        if bound:
            vb.unbind(args.bdf)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{res['bdf']}: function {res['func']}: copy of {res['copy_bytes']} B equal")
        print(f"{res['bdf']}: GEMM 64x48x32 equal to numpy (rtol 1e-5)")
    return 0


def cmd_nop(args: argparse.Namespace) -> int:
    import statistics

    from tacc.vfio import workload
    from tacc.vfio.driver import TaccVfio

    with TaccVfio(args.bdf, irq=not args.poll) as t:
        ns = workload.nop_latency(t, args.count)
    med = statistics.median(ns)
    print(json.dumps({"bdf": vb.normalize(args.bdf), "count": args.count, "median_ns": med,
                      "ns": ns}) if args.json else
          f"{vb.normalize(args.bdf)}: {args.count} NOPs, median {med / 1000:.1f} us")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from tacc.vfio.driver import TaccVfio
    from tacc.vfio.migration import Migration
    from tacc.vfio.workload import migrate_in_flight

    bound = args.bind and vb.describe(args.bdf).driver != vb.VARIANT_DRIVER
    if bound:
        vb.bind(args.bdf, driver=vb.VARIANT_DRIVER)
    try:
        with TaccVfio(args.bdf) as t:
            fig = migrate_in_flight(t, Migration(t.dev))
    finally:
        if bound:
            vb.unbind(args.bdf)
    res = {"bdf": vb.normalize(args.bdf), **fig}
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{res['bdf']}: two jobs in flight migrated, their data equal; state "
          f"{fig['state_bytes']} B ({fig['regs_bytes']} registers, {fig['devmem_bytes']} "
          "device memory)")
    print(f"{res['bdf']}: stop {fig['stop_ms']:.2f} ms, stop-copy {fig['stop_copy_ms']:.2f} ms, "
          f"read {fig['read_ms']:.2f} ms, load {fig['load_ms']:.2f} ms, resume "
          f"{fig['resume_ms']:.2f} ms: downtime {fig['downtime_ms']:.2f} ms")
    dirty = ("not reportable (the kernel has no DMA_LOGGING_REPORT)" if fig["dirty"] is None
             else f"{len(fig['dirty'])} pages, the written ones: {fig['dirty'] == fig['written']}")
    print(f"{res['bdf']}: dirty pages {dirty}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vfio", help="bind tacc functions to vfio-pci and back",
                       description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    from tacc.cli import options

    vs = p.add_subparsers(dest="vfio_cmd", metavar="ACTION", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    for name, func, help_, desc in (
            ("list", cmd_list, "list tacc functions and their drivers",
             "Where each function is: tacc.ko, vfio-pci or none."),
            ("bind", cmd_bind, "give a function to vfio-pci",
             "Move a VF from tacc.ko to vfio-pci."),
            ("unbind", cmd_unbind, "give a function back to tacc.ko",
             "Give a VF back to tacc.ko.")):
        q = vs.add_parser(name, help=help_, description=desc, epilog=EPILOG,
                          formatter_class=raw,
                          parents=[options.json_flag("print the functions as JSON")])
        if name != "list":
            q.add_argument("bdf", metavar="BDF", help="PCI function, e.g. 0000:01:00.1")
        if name == "bind":
            q.add_argument("--migration", action="store_true",
                           help="to tacc_vfio_pci (vfio-pci with live migration) instead")
        q.set_defaults(func=func)
    q = vs.add_parser("selftest", help="run copies and a GEMM through tacc.vfio",
                      description="Copies and a GEMM through tacc.vfio, checked against numpy.",
                      epilog=EPILOG, formatter_class=raw, parents=[options.json_flag()])
    q.add_argument("bdf", metavar="BDF", help="function bound to vfio-pci")
    q.add_argument("--huge", action="store_true", help="copy through 2 MiB hugetlb buffers")
    q.add_argument("--bind", action="store_true",
                   help="bind to vfio-pci first, give back to tacc.ko after")
    q.set_defaults(func=cmd_selftest)
    q = vs.add_parser("nop", help="NOP submit-to-completion latency through tacc.vfio",
                      description="NOP submit-to-completion latency through tacc.vfio.",
                      epilog=EPILOG, formatter_class=raw, parents=[options.json_flag()])
    q.add_argument("bdf", metavar="BDF", help="function bound to vfio-pci")
    q.add_argument("-n", "--count", type=int, default=100, help="NOP jobs (default 100)")
    q.add_argument("--poll", action="store_true", help="poll CQ_TAIL instead of MSI-X")
    q.set_defaults(func=cmd_nop)
    q = vs.add_parser("migrate", help="a VF's live migration through VFIO, jobs in flight",
                      description="RUNNING -> STOP (two jobs in flight) -> STOP_COPY -> reset -> "
                      "RESUMING -> RUNNING through tacc_vfio_pci; the jobs' data checked "
                      "against numpy, each phase timed (docs/vfio.md).",
                      epilog=EPILOG, formatter_class=raw, parents=[options.json_flag()])
    q.add_argument("bdf", metavar="BDF", help="VF bound to tacc_vfio_pci")
    q.add_argument("--bind", action="store_true",
                   help="bind to tacc_vfio_pci first, give back to tacc.ko after")
    q.set_defaults(func=cmd_migrate)
