"""Options several subcommands share, each defined once as an argparse parent parser
(``sub.add_parser(NAME, parents=[options.json_flag(), ...])``): one spelling, one
metavar and one help line wherever they appear (docs/cli.md).  Each function returns a
new parent, so a subcommand may say what the option means there."""

from __future__ import annotations

import argparse

JSON_HELP = "print the result as one JSON document on stdout (shapes: docs/cli.md)"


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


def json_flag(help: str = JSON_HELP) -> argparse.ArgumentParser:
    """``--json``: the report as JSON on stdout, warnings on stderr."""
    p = _parent()
    p.add_argument("--json", action="store_true", help=help)
    return p


def output(help: str, required: bool = False, metavar: str = "FILE",
           default: str | None = None) -> argparse.ArgumentParser:
    """``-o/--output``: the file or directory a command writes."""
    p = _parent()
    p.add_argument("-o", "--output", required=required, metavar=metavar, default=default,
                   help=help)
    return p


def device(help: str = "PCI function (0000:01:00.0), PF or VFn; repeatable; default all",
           repeat: bool = True, metavar: str = "PCI") -> argparse.ArgumentParser:
    """``-d/--device``: which tacc function(s) a command looks at."""
    p = _parent()
    if repeat:
        p.add_argument("-d", "--device", action="append", metavar=metavar, help=help)
    else:
        p.add_argument("-d", "--device", metavar=metavar, help=help)
    return p


def captures(help: str = "capture directories", nargs: str = "+",
             dest: str = "captures") -> argparse.ArgumentParser:
    """The positional ``CAPTURE...``: capture directories (docs/capture-format.md)."""
    p = _parent()
    p.add_argument(dest, nargs=nargs, metavar="CAPTURE", help=help)
    return p


def socket() -> argparse.ArgumentParser:
    """``--socket``: taccd's control socket."""
    from tacc.daemon import protocol

    p = _parent()
    p.add_argument("--socket", default=None, metavar="PATH",
                   help=f"taccd control socket (default $TACCD_SOCKET, else "
                        f"{protocol.DEFAULT_SOCKET})")
    return p


def quiet() -> argparse.ArgumentParser:
    """``-q/--quiet``: no progress bar (none either when stderr is not a terminal)."""
    p = _parent()
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (there is none either when stderr is not a terminal)")
    return p


def backend(choices: tuple[str, ...], default: str,
            help: str = "how the counters are read") -> argparse.ArgumentParser:
    """``-b/--backend``: how the counters are read (docs/counters.md)."""
    p = _parent()
    p.add_argument("-b", "--backend", choices=choices, default=default,
                   help=f"{help} (default {default})")
    return p
