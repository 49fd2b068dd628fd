"""The ``tacc`` command: a small dispatcher over subcommand modules.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; that
function adds one or more subparsers and sets ``func=<callable(args) -> int>`` on them
(``parser.set_defaults(func=...)``).  To add a subcommand, add its module to
``SUBCOMMAND_MODULES`` (or ship a ``tacc.subcommands`` entry point).

Errors (docs/cli.md): a :class:`tacc.errors.TaccError` (the root of every library error,
and of :class:`CommandError`) becomes ``tacc: error: <one line>`` on stderr, without a
traceback, and exit status 1; a :class:`tacc.errors.UsageError` exit status 2, as
argparse's own errors (one line too: :class:`tacc.cli.conventions.Parser`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from tacc import __version__
from tacc.errors import TaccError, UsageError

# The subcommand modules, in the order of `tacc --help`.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "tacc.cli.run",  # run: workloads
    "tacc.cli.counters",  # stat, top: device counters
    "tacc.cli.trace",  # trace start|stop|status: taccd capture control
    "tacc.cli.profile",  # profile -o CAP -- CMD: taccd, capture, findings, timeline
    "tacc.cli.timeline",  # timeline
    "tacc.cli.analyze",  # analyze
    "tacc.cli.fleet",  # export, query
    "tacc.cli.cluster",  # cluster offsets|analyze
    "tacc.cli.cdi",  # cdi generate|list: container device specs
    "tacc.cli.devices",  # devices: PF, VF and virtio-tacc functions
    "tacc.cli.vfio",  # vfio list|bind|unbind
    "tacc.cli.pcie",  # pcie capture|summary|timeline (PCIe analyzer)
    "tacc.cli.onnx",  # onnx run|test: ONNX models
)


class CommandError(TaccError):
    """A subcommand's runtime failure (nothing found, a refusal, a failed step): one
    line, exit status 1 (as every :class:`tacc.errors.TaccError` but a usage error)."""


__all__ = ["CommandError", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    # tacc.cli.conventions imported here, not above: `python -m tacc.cli.conventions`
    # (scripts/setup.sh) imports this package first
    from .conventions import Parser, finish

    parser = Parser(
        prog="tacc", description="tacc accelerator tools: captures, counters, timeline, analysis",
        epilog="examples:\n  tacc devices\n  tacc profile -o /tmp/cap -- tacc run mlp\n"
               "  tacc timeline /tmp/cap -o /tmp/cap.pftrace\n\n"
               "exit status: 0 done, 1 a runtime failure (device, capture file, nothing "
               "found),\n2 a usage error (docs/cli.md)")
    parser.add_argument("--version", action="version", version=f"tacc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in SUBCOMMAND_MODULES:
        importlib.import_module(modname).add_parser(sub)
    for ep in entry_points(group="tacc.subcommands"):
        ep.load()(sub)
    return finish(parser, "tacc")


def main(argv: Sequence[str] | None = None) -> int:
    from .conventions import EXIT_USAGE, error_status

    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except (TaccError, OSError) as exc:  # OSError: a file the user named
        return error_status("tacc", exc)


if __name__ == "__main__":
    raise SystemExit(main())
