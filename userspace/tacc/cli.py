"""The ``tacc`` command: a small dispatcher over subcommand modules.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; that
function adds one or more subparsers and sets ``func=<callable(args) -> int>`` on them
(``parser.set_defaults(func=...)``).  To add a subcommand, add its module to
``SUBCOMMAND_MODULES`` (or ship a ``tacc.subcommands`` entry point).  Reserved names
whose module is not installed yet get a stub that says so.

Errors: a :class:`tacc.capture.CaptureError` (or any :class:`CommandError`) becomes
``tacc: error: <one line>`` on stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from tacc import __version__

# module, owner. Modules that do not exist yet are skipped.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "tacc.runtime.cli",  # run: workloads (runtime issue)
    "tacc.counters.cli",  # stat, top: counters (device/driver issues)
    "tacc.daemon.cli",  # trace start|stop|status (tracing issue)
    "tacc.timeline.cli",  # timeline
    "tacc.analyze.cli",  # analyze
    "tacc.fleet.cli",  # export, query (issue 17)
    "tacc.timeline.cluster_cli",  # cluster offsets|analyze (issue 17)
    "tacc.cli_cdi",  # cdi generate|list: container device specs (issue 15)
    "tacc.cli_devices",  # devices: PF, VF and virtio-tacc functions (issue 16)
    "tacc.vfio.cli",  # vfio list|bind|unbind (issue 15)
    "tacc.cli_pcie",  # pcie capture|summary|timeline (PCIe analyzer, issue 19)
)

# Reserved subcommands and the module expected to provide them.
RESERVED: dict[str, tuple[str, str]] = {
    "run": ("tacc.runtime.cli", "run a workload (tacc run NAME)"),
    "stat": ("tacc.counters.cli", "device counters over a command or interval"),
    "top": ("tacc.counters.cli", "live hardware view per function"),
    "trace": ("tacc.daemon.cli", "taccd capture control (start|stop|status)"),
}


class CommandError(Exception):
    """A user-facing failure of a subcommand: printed as one line, exit status 2."""


def _known_errors() -> tuple[type[BaseException], ...]:
    from tacc.capture.errors import CaptureError

    return (CommandError, CaptureError)


def _stub(name: str, module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise CommandError(f"'{name}' is not available in this build (needs {module})")

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tacc", description="tacc accelerator tools: captures, counters, timeline, analysis"
    )
    parser.add_argument("--version", action="version", version=f"tacc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue  # not written yet
            raise
        mod.add_parser(sub)
    for ep in entry_points(group="tacc.subcommands"):
        ep.load()(sub)
    for name, (module, help_) in RESERVED.items():
        if name not in sub.choices:
            p = sub.add_parser(name, help=f"{help_} [not installed]")
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            p.set_defaults(func=_stub(name, module))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except _known_errors() as exc:
        print(f"tacc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as exc:  # a file the user named: missing, unwritable, a directory
        if exc.filename is None:
            raise
        print(f"tacc: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
