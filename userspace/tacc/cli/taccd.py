"""taccd's command line: the service itself is :mod:`tacc.daemon.main`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tacc.cli.conventions import EXIT_FAILURE, Parser, finish
from tacc.daemon import protocol
from tacc.daemon.main import Daemon, DaemonError


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="taccd", description="tacc tracing service",
               epilog="examples:\n  taccd\n  taccd -f -v --socket /tmp/taccd.sock\n"
                      "  taccd --clock-exchange 169.254.0.1 --no-cdi")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground (systemd runs it so)")
    p.add_argument("--socket", default=None, help=f"control socket ({protocol.DEFAULT_SOCKET})")
    p.add_argument("--capture-root", default="/var/lib/taccd",
                   help="where captures go when 'start' names no directory")
    p.add_argument("--interval", type=float, default=1.0, help="always-on sampling period, s")
    p.add_argument("--no-always-on", action="store_true", help="no always-on sampling")
    p.add_argument("--no-bpf", action="store_true", help="captures without driver events")
    p.add_argument("--max-bytes", type=int, default=1 << 30, help="disk bound per capture")
    p.add_argument("--clock-exchange", default="", metavar="ADDR[:PORT]",
                   help="answer peer nodes' clock exchange requests on this UDP address "
                        "(port 7475; docs/cluster.md); off by default")
    p.add_argument("--cdi-spec", default="/etc/cdi/tacc.yaml", metavar="PATH",
                   help="CDI spec kept up to date as functions come and go (tacc cdi "
                        "generate; docs/containers.md)")
    p.add_argument("--no-cdi", action="store_true", help="do not write CDI specs")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log every request and capture event to stderr")
    return finish(p, "taccd")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="taccd: %(message)s", stream=sys.stderr)
    if os.geteuid() != 0 and not args.no_bpf:
        print("taccd: error: must run as root (or pass --no-bpf)", file=sys.stderr)
        return EXIT_FAILURE
    try:
        d = Daemon(protocol.socket_path(args.socket), Path(args.capture_root),
                   always_on=not args.no_always_on, interval=args.interval,
                   max_bytes=args.max_bytes, bpf=not args.no_bpf,
                   clock_exchange=args.clock_exchange,
                   cdi_spec=None if args.no_cdi else args.cdi_spec)
    except (DaemonError, OSError, ValueError) as exc:
        print(f"taccd: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if not args.foreground:
        if os.fork():
            return 0
        os.setsid()
    return d.run()



if __name__ == "__main__":
    raise SystemExit(main())
