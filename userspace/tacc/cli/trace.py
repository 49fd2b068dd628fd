"""``tacc trace start|stop|status``: control taccd over its UNIX socket."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tacc.daemon import protocol


def _fail(msg: str) -> Exception:
    from tacc.cli import CommandError

    return CommandError(msg)


def _call(args: argparse.Namespace, req: dict[str, Any]) -> dict[str, Any]:
    try:
        # the first capture compiles taccd's BPF program: tens of seconds under TCG
        rep = protocol.request(req, args.socket, timeout=300.0)
    except protocol.ProtocolError as exc:
        raise _fail(str(exc)) from None
    if not rep.get("ok"):
        raise _fail(str(rep.get("error", "taccd refused the request")))
    return rep


def cmd_start(args: argparse.Namespace) -> int:
    opts: dict[str, Any] = {}
    if args.pid:
        opts["pids"] = args.pid
    if args.device:
        opts["device"] = args.device
    if args.comm:
        opts["comm"] = args.comm
    if args.no_host:
        opts["host_events"] = False
    if args.counters_hz is not None:
        opts["counters_hz"] = args.counters_hz
    if args.no_ioctls:
        opts["ioctl_events"] = False
    if args.counters_source is not None:
        opts["counters_source"] = args.counters_source
    if args.duration:
        opts["duration"] = args.duration
    if args.max_bytes:
        opts["max_bytes"] = args.max_bytes
    if args.trace_entries is not None:
        opts["trace_entries"] = args.trace_entries
    if args.tlp:
        opts["tlp"] = True
    if args.tlp_entries is not None:
        opts["tlp_entries"] = args.tlp_entries
    addr: tuple[int, int] | None = None
    if args.tlp_addr:  # tacc.cli.pcie imports numpy: only for an address filter
        from tacc.cli.pcie import _addr  # `tacc pcie capture --addr`'s syntax

        addr = _addr(args.tlp_addr)
    filters = {"tlp_funcs": _funcs(args.tlp_funcs),
               "tlp_kinds": [k.lower() for k in _split(args.tlp_kinds)],
               "tlp_addr": list(addr or ()),
               "tlp_no_ctrl": bool(args.tlp_no_ctrl)}
    filters = {k: v for k, v in filters.items() if v}
    if filters:  # a filter asks for the TLP stream
        opts.update(filters, tlp=True)
    if args.peers:
        opts["peers"] = [p for p in args.peers.split(",") if p]
    from tacc.cli import UsageError
    from tacc.daemon.options import Options

    try:  # taccd refuses the same; here it is a usage error, before taccd is asked
        Options(**{k: v for k, v in opts.items() if k != "duration"})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"trace start: {exc}") from None
    rep = _call(args, {"cmd": "start", "output": args.output, "options": opts})
    print(json.dumps(rep) if args.json else f"capturing to {rep['path']}")
    for w in rep.get("warnings", []):  # stdout is the result (JSON with --json)
        print(f"tacc: warning: {w}", file=sys.stderr)
    return 0


def _split(spec: str | None) -> list[str]:
    return [x.strip() for x in (spec or "").split(",") if x.strip()]


def _funcs(spec: str | None) -> list[int]:
    try:
        return [int(x, 0) for x in _split(spec)]
    except ValueError:
        from tacc.cli import UsageError

        raise UsageError(f"bad --tlp-funcs {spec!r} (want function numbers: 0 = PF, "
                         "n = VF n)") from None


def cmd_stop(args: argparse.Namespace) -> int:
    rep = _call(args, {"cmd": "stop"})
    s = rep["summary"]
    if args.json:
        print(json.dumps(rep))
    else:
        recs = ", ".join(f"{k} {v}" for k, v in sorted(s["records"].items()))
        drops = sum(s["drops"].values())
        print(f"capture {s['path']}: {recs}; {drops} dropped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rep = _call(args, {"cmd": "status"})
    if args.json:
        print(json.dumps(rep, indent=1))
        return 0
    kinds = rep.get("kinds") or {}  # a VF or virtio-tacc function is named with its kind
    devs = [p if kinds.get(p, "pf") == "pf" else f"{p} ({kinds[p]})" for p in rep["devices"]]
    print(f"taccd pid {rep['pid']}: {rep['mode']}, devices {', '.join(devs) or '-'}")
    cap = rep.get("capture")
    if cap:
        print(f"capture {cap['path']}: {cap['bytes']} bytes, records {cap['records']}, "
              f"drops {cap['drops']}")
    for pci, s in (rep.get("always_on") or {}).items():
        r = s.get("rates", {})
        print(f"  {pci}: {r.get('jobs_completed_per_s', 0):.1f} jobs/s, "
              f"{r.get('h2d_bytes_per_s', 0):.0f} B/s h2d, "
              f"{r.get('d2h_bytes_per_s', 0):.0f} B/s d2h")
    for w in rep.get("warnings", []):
        print(f"  warning: {w}")
    return 0


def add_parser(sub: Any) -> None:
    from tacc.cli import options

    p = sub.add_parser(
        "trace", help="taccd capture control (start|stop|status)",
        description="Control taccd's captures over its UNIX socket (docs/taccd.md).",
        epilog="examples:\n  tacc trace start -o /tmp/cap\n  tacc trace stop\n"
               "  tacc trace status --json", parents=[options.socket()])
    ts = p.add_subparsers(dest="trace_cmd", metavar="ACTION", required=True)
    s = ts.add_parser(
        "start", help="start a capture",
        description="Start a capture: taccd records the runtime's API calls, the driver's "
                    "tracepoints, the device's trace ring, counters and clock pairs into a "
                    "capture directory.",
        epilog="examples:\n  tacc trace start -o /tmp/cap\n"
               "  tacc trace start -o /tmp/cap -p 1234 --no-host\n"
               "  tacc trace start -o /tmp/cap --tlp --tlp-kinds mrd,cpld",
        parents=[options.output("capture directory (default: taccd's --capture-root)",
                                metavar="DIR"),
                 options.device("only this function (PCI address)", repeat=False),
                 options.json_flag("print taccd's reply as JSON")])
    s.add_argument("-p", "--pid", type=int, action="append", default=[],
                   help="only this process (repeatable)")
    s.add_argument("-c", "--comm", default="", help="only processes with this name")
    s.add_argument("--duration", type=float, default=None,
                   help="stop the capture after this many seconds")
    s.add_argument("--no-host", action="store_true", help="no sched/block/net events")
    s.add_argument("--no-ioctls", action="store_true",
                   help="no IOCTL records (one per tacc ioctl): the per-job facts only, "
                        "the ioctl tracepoints not attached (cheaper)")
    s.add_argument("--counters-hz", type=float, default=None,
                   help="counter sampling rate, Hz")
    s.add_argument("--counters-source", default=None, metavar="SOURCE",
                   help="who samples the counters: taccd's loop (host, default) or the "
                        "device into its sample ring (no late sample is lost, but the "
                        "device stays in D0 and its link out of L1 for the capture; falls "
                        "back to host when the ring is taken)")
    s.add_argument("--max-bytes", type=int, default=None,
                   help="stop when the capture reaches this size")
    s.add_argument("--trace-entries", type=int, default=None, metavar="N",
                   help="device trace ring records per function, a power of two 64..32768 "
                        "(default: the driver's, 4096); more absorbs longer bursts")
    s.add_argument("--tlp", action="store_true",
                   help="add the TLP stream: every TLP of each PF's link from its TLP capture "
                        "ring (docs/capture-format.md \"TLP stream\"); needs CAP_PERFMON "
                        "(root): it shows every function's and context's traffic")
    s.add_argument("--tlp-entries", type=int, default=None, metavar="N",
                   help="TLP ring records, a power of two 64..262144 (default: the "
                        "driver's, 16384)")
    s.add_argument("--tlp-funcs", metavar="F,...",
                   help="TLP stream filter (in the device): only these functions' TLPs, "
                        "0 = PF, n = VF n (implies --tlp)")
    s.add_argument("--tlp-kinds", metavar="K,...",
                   help="TLP stream filter: only these kinds, of mrd, mwr, cpld (implies --tlp)")
    s.add_argument("--tlp-addr", metavar="LO-HI",
                   help="TLP stream filter: only TLPs addressing host bus addresses [LO, HI) "
                        "(implies --tlp)")
    s.add_argument("--tlp-no-ctrl", action="store_true",
                   help="TLP stream filter: leave out the device's own control traffic "
                        "(descriptor fetches, CQEs, MSI-X, trace records; implies --tlp)")
    s.add_argument("--peers", default="", metavar="ADDR[:PORT],...",
                   help="other nodes' taccd (--clock-exchange) to exchange clock "
                        "timestamps with during the capture (docs/cluster.md)")
    s.set_defaults(func=cmd_start)
    st = ts.add_parser(
        "stop", help="stop the capture and close it",
        description="Stop the capture and close its directory; prints what it holds.",
        epilog="examples:\n  tacc trace stop\n  tacc trace stop --json",
        parents=[options.json_flag("print taccd's reply as JSON")])
    st.set_defaults(func=cmd_stop)
    ss = ts.add_parser(
        "status", help="taccd mode, devices, always-on figures",
        description="taccd's mode, devices, capture and always-on figures.",
        epilog="examples:\n  tacc trace status\n  tacc trace status --json",
        parents=[options.json_flag("print taccd's status as JSON")])
    ss.set_defaults(func=cmd_status)
