"""The ``tacc`` command: a small dispatcher over subcommand modules.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; that
function adds one or more subparsers and sets ``func=<callable(args) -> int>`` on them
(``parser.set_defaults(func=...)``).  To add a subcommand, add its module to
``SUBCOMMAND_MODULES`` and its command names to ``COMMANDS`` (or ship a
``tacc.subcommands`` entry point).

A command line naming a built-in command imports that command's module only (``tacc trace
start`` does not import numpy for ``tacc stat``): a Python start in the test VM costs seconds
per module tree.  ``tacc --help``, an unknown word and ``build_parser()`` import them all.

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


# Each built-in command name -> the module that adds it (tests/host/test_cli_conventions.py
# checks this equals what the modules add).
COMMANDS: dict[str, str] = {
    "run": "tacc.cli.run", "stat": "tacc.cli.counters", "top": "tacc.cli.counters",
    "counters": "tacc.cli.counters", "trace": "tacc.cli.trace", "profile": "tacc.cli.profile",
    "timeline": "tacc.cli.timeline", "analyze": "tacc.cli.analyze", "export": "tacc.cli.fleet",
    "query": "tacc.cli.fleet", "cluster": "tacc.cli.cluster", "cdi": "tacc.cli.cdi",
    "devices": "tacc.cli.devices", "vfio": "tacc.cli.vfio", "pcie": "tacc.cli.pcie",
    "onnx": "tacc.cli.onnx",
}


class CommandError(TaccError):
    """A subcommand's runtime failure (nothing found, a refusal, a failed step): one
    line, exit status 1 (as every :class:`tacc.errors.TaccError` but a usage error)."""


__all__ = ["CommandError", "UsageError", "build_parser", "main"]


def command_module(argv: Sequence[str]) -> str | None:
    """The module of the built-in command ``argv`` names (its first word that is not an
    option), or None (no command, ``--help``, an unknown word: every module is needed)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return COMMANDS.get(word)
        if word in ("-h", "--help", "--version"):
            return None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``tacc`` parser: every subcommand, or only the one ``argv`` names."""
    # tacc.cli.conventions imported here, not above: `python -m tacc.cli.conventions`
    # (scripts/setup.sh) imports this package first
    from .conventions import Parser, finish

    only = command_module(argv) if argv is not None else None
    # `tacc --version` needs no command: the parser's own --version answers it
    bare_version = argv is not None and list(argv) == ["--version"]

    parser = Parser(
        prog="tacc", description="tacc accelerator tools: captures, counters, timeline, analysis",
        epilog="examples:\n  tacc devices\n  tacc profile -o /tmp/cap -- tacc run mlp\n"
               "  tacc timeline /tmp/cap -o /tmp/cap.pftrace\n\n"
               "exit status: 0 done, 1 a runtime failure (device, capture file, nothing "
               "found),\n2 a usage error (docs/cli.md)")
    parser.add_argument("--version", action="version", version=f"tacc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in (only,) if only else () if bare_version else SUBCOMMAND_MODULES:
        importlib.import_module(modname).add_parser(sub)
    if not only and not bare_version:
        from importlib.metadata import entry_points  # (15 ms: only for the whole parser)

        for ep in entry_points(group="tacc.subcommands"):
            ep.load()(sub)
    return finish(parser, "tacc")


def main(argv: Sequence[str] | None = None) -> int:
    from .conventions import EXIT_USAGE, error_status

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
