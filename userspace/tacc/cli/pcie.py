"""``tacc pcie``: the software PCIe analyzer (the device's TLP capture).

    tacc pcie capture -o copy.pcapng -- tacc run copy      # every TLP while CMD runs
    tacc pcie capture -o f.pcapng -t 0.5 --kinds mrd,cpld --no-ctrl
    tacc pcie capture -o f.pcapng --funcs 1 --addr 0x100000-0x200000 -- CMD
    tacc pcie summary f.pcapng [--json]                    # TLPs, bytes per direction
    tacc pcie timeline f.pcapng -o tlps.json               # Chrome JSON: tracks, read flows
    tshark -X lua_script:tools/tacc-tlp.lua -r f.pcapng    # Wireshark decodes it

The capture needs CAP_PERFMON (root): it shows every function and context.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import time
from pathlib import Path

from tacc.pcie import KINDS, pcapng, perfetto, summary


def _fail(msg: str) -> Exception:
    from tacc.cli import CommandError

    return CommandError(msg)


def _usage(msg: str) -> Exception:
    from tacc.cli import UsageError

    return UsageError(msg)


def _node(dev: str | None) -> tuple[str, str]:
    """(accel node, PCI address) of ``-d`` (a node path or a PCI address; default: the
    first tacc PF)."""
    if dev and dev.startswith("/dev/"):
        return dev, os.path.basename(os.path.realpath(f"/sys/class/accel/{Path(dev).name}/device"))
    cands = sorted(glob.glob(f"/sys/bus/pci/devices/{dev or '*'}/accel/accel*"))
    for c in cands:
        pci = Path(c).parent.parent.name
        if Path(f"/sys/bus/pci/devices/{pci}/sriov_totalvfs").exists() or dev:
            return f"/dev/accel/{Path(c).name}", pci
    raise _fail(f"no tacc PF found{' at ' + dev if dev else ''}")


def _mask(spec: str | None, names: dict[str, int] | None, what: str) -> int:
    if not spec:
        return 0
    m = 0
    for part in spec.split(","):
        part = part.strip().lower()
        try:
            m |= 1 << (names[part] if names else int(part, 0))
        except (KeyError, ValueError):
            raise _usage(f"bad {what} {part!r}") from None
    return m


def _addr(spec: str | None) -> tuple[int, int] | None:
    if not spec:
        return None
    try:
        lo, hi = (int(x, 0) for x in spec.split("-"))
    except ValueError:
        raise _usage(f"bad --addr {spec!r} (want LO-HI, e.g. 0x1000-0x2000)") from None
    if hi <= lo:
        raise _usage(f"bad --addr {spec!r}: HI must be above LO")
    return lo, hi


def cmd_capture(args: argparse.Namespace) -> int:
    from tacc.pcie.ring import TlpCaptureError, TlpRing

    funcs = _mask(args.funcs, None, "function")  # usage errors before the device is touched
    kinds = _mask(args.kinds, KINDS, "TLP kind")
    addr = _addr(args.addr)
    node, pci = _node(args.device)
    cmd = [c for c in args.cmd if c != "--"]
    chunks = []
    try:
        ring = TlpRing(node, args.entries, funcs, kinds, addr, args.no_ctrl)
    except TlpCaptureError as exc:
        raise _fail(str(exc)) from None
    rc = 0
    with ring:
        if cmd:
            p = subprocess.Popen(cmd)
            while p.poll() is None:
                chunks.append(ring.drain())
                time.sleep(0.01)
            rc = p.returncode
        else:
            end = time.monotonic() + args.duration
            while time.monotonic() < end:
                chunks.append(ring.drain())
                time.sleep(0.01)
        chunks.append(ring.drain())
        dropped = ring.dropped
    import numpy as np

    recs = np.concatenate(chunks) if chunks else np.zeros(0, pcapng.TLP_DTYPE)
    pcapng.write(Path(args.output), recs, if_name=pci)
    s = {"output": args.output, "records": len(recs), "dropped": dropped, "device": pci,
         "summary": summary(recs), "command_status": rc}
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{len(recs)} TLPs ({dropped} dropped) from {pci} -> {args.output}")
    return rc


def cmd_summary(args: argparse.Namespace) -> int:
    try:
        recs = pcapng.read(Path(args.file))
    except (OSError, ValueError) as exc:
        raise _fail(f"{args.file}: {exc}") from None
    s = summary(recs)
    if args.json:
        print(json.dumps({"records": len(recs), "summary": s}))
        return 0
    print(f"{'direction':<10} {'class':<5} {'TLPs':>8} {'MRd':>7} {'MWr':>7} {'CplD':>7} "
          f"{'payload':>10} {'link bytes':>11}")
    for k, r in s.items():
        d, c = k.split("_")
        print(f"{d:<10} {c:<5} {r['tlps']:>8} {r['MRd']:>7} {r['MWr']:>7} {r['CplD']:>7} "
              f"{r['payload']:>10} {r['link_bytes']:>11}")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    try:
        recs = pcapng.read(Path(args.file))
    except (OSError, ValueError) as exc:
        raise _fail(f"{args.file}: {exc}") from None
    n = perfetto.write(Path(args.output), recs, args.gen, args.width)
    flows = len(perfetto.read_flows(recs))
    if args.json:
        print(json.dumps({"output": args.output, "records": len(recs), "events": n,
                          "read_flows": flows}))
    else:
        print(f"{n} trace events ({flows} read flows) -> {args.output}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tacc.cli import options

    p = sub.add_parser("pcie", help="software PCIe analyzer: TLP capture, pcapng, timeline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  tacc pcie capture -o /tmp/tlp.tcs -- tacc run mlp\n"
                              "  tacc pcie summary /tmp/tlp.tcs\n"
                              "  tacc pcie timeline /tmp/tlp.tcs -o /tmp/tlp.json")
    ps = p.add_subparsers(dest="pcie_cmd", metavar="SUBCOMMAND", required=True)
    c = ps.add_parser(
        "capture", help="capture TLPs to a pcapng file",
        description="Record every TLP of the PF's link (the device's TLP capture ring) while "
                    "a command runs.",
        epilog="examples:\n  tacc pcie capture -o /tmp/tlp.tcs -- tacc run mlp\n"
               "  tacc pcie capture -o /tmp/f.pcapng -t 0.5 --kinds mrd,cpld --no-ctrl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[options.output("pcapng file to write", required=True),
                 options.device("PF: PCI address or /dev/accel/accelN (default: the first "
                                "tacc PF)", repeat=False, metavar="PF"),
                 options.json_flag("print the capture's summary as JSON")])
    c.add_argument("-t", "--duration", type=float, default=1.0,
                   help="seconds to capture when no command is given (default 1)")
    c.add_argument("--entries", type=int, default=0, help="ring records (power of two)")
    c.add_argument("--funcs", help="functions to capture: 0 = PF, n = VF n (e.g. 0,2)")
    c.add_argument("--kinds", help="TLP kinds: mrd, mwr, cpld (comma separated)")
    c.add_argument("--addr", help="bus address range LO-HI (exclusive HI)")
    c.add_argument("--no-ctrl", action="store_true",
                   help="leave out control traffic (descriptor fetches, CQEs, MSI-X, ...)")
    c.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...: capture while it runs")
    c.set_defaults(func=cmd_capture)
    tlp_file = "a TLP capture (tacc pcie capture -o FILE)"
    s = ps.add_parser(
        "summary", help="TLP counts and bytes per direction of a capture",
        description="Per-kind TLP counts, bytes and link efficiency of a TLP capture.",
        epilog="examples:\n  tacc pcie summary /tmp/tlp.tcs\n"
               "  tacc pcie summary --json /tmp/tlp.tcs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[options.json_flag("print the summary as JSON")])
    s.add_argument("file", metavar="FILE", help=tlp_file)
    s.set_defaults(func=cmd_summary)
    t = ps.add_parser(
        "timeline", help="Chrome trace JSON of a capture",
        description="A TLP capture as Chrome trace JSON (chrome://tracing, ui.perfetto.dev): "
                    "one slice per TLP, read requests flowing to their completions.",
        epilog="examples:\n  tacc pcie timeline /tmp/tlp.tcs -o /tmp/tlp.json\n"
               "  tacc pcie timeline /tmp/tlp.tcs -o /tmp/tlp.json --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[options.output("Chrome trace JSON file to write", required=True),
                 options.json_flag("print what was written (events, read flows) as JSON")])
    t.add_argument("file", metavar="FILE", help=tlp_file)
    t.add_argument("--gen", type=int, default=4, help="link generation for slice lengths")
    t.add_argument("--width", type=int, default=16, help="link width for slice lengths")
    t.set_defaults(func=cmd_timeline)
