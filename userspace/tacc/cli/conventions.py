"""One set of conventions for the three executables (tacc, accel-bpftrace, taccd), as
bcc's tools have them (docs/cli.md): every command and subcommand has a description and
an ``examples:`` epilog, every option a help line (options several commands share come
from tacc.cli.options' parent parsers); a usage error is one line and exit status 2, a
runtime failure one line and 1 (:class:`Parser`, :func:`error_status`); the shell
completions and man pages are generated from these parsers (``python -m
tacc.cli.conventions OUTDIR``, run by scripts/setup.sh).  tests/host/test_cli_conventions.py
walks every parser."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from tacc.errors import TaccError, UsageError

WIDTH = 78

# Exit statuses, as the tools users know (grep, git, bcc): 0 done, 1 a runtime failure
# (a device error, a bad capture file, nothing found), 2 a usage error (argparse's own,
# a bad option value, options that exclude each other).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse with a usage error in one line: ``PROG: error: MESSAGE (see 'PROG
    --help')`` on stderr, exit status 2 (the usage is in ``--help``).  Subparsers are of
    this class too (``add_subparsers`` makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def error_status(prog: str, exc: TaccError | OSError) -> int:
    """The one rule of the three executables' error path: ``PROG: error: <one line>`` on
    stderr; the exit status 2 for a :class:`UsageError`, 1 for any other failure (a
    library :class:`TaccError`, or an ``OSError`` on a file the user named)."""
    if not isinstance(exc, TaccError):
        if exc.filename is None:  # not a file the user named: a defect, with its traceback
            raise exc
        msg = f"{exc.filename}: {exc.strerror}"
    else:
        msg = str(exc)
    print(f"{prog}: error: {one_line(msg)}", file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE

def subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for a in p._actions:  # noqa: SLF001 (argparse has no public walk)
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            yield from a.choices.items()


def walk(p: argparse.ArgumentParser, path: tuple[str, ...]
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``p`` (``p`` first), with its command path."""
    yield path, p
    for name, sp in subparsers(p):
        yield from walk(sp, (*path, name))


def _fill(text: str) -> str:
    return "\n\n".join(textwrap.fill(" ".join(par.split()), WIDTH)
                       for par in text.split("\n\n") if par.strip())


def finish(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """The help's form on every parser under ``parser``: descriptions without RST markup
    (a module docstring as description), filled to the width beside an ``examples:``
    epilog kept as written.  Each module gives its own parsers their description,
    examples epilog and option help (tests/host/test_cli_conventions.py checks them)."""
    for _path, p in walk(parser, (prog,)):
        if p.description:
            p.description = p.description.replace("``", "'")
        if p.epilog and p.formatter_class is argparse.HelpFormatter:
            # keep the examples' lines; the description filled to the width instead
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            if p.description:
                p.description = _fill(p.description)
    return parser


def parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """The three executables' parser builders."""
    from tacc.cli import build_parser as tacc
    from tacc.cli.bpftrace import build_parser as bpftrace
    from tacc.cli.taccd import build_parser as taccd

    return {"tacc": tacc, "accel-bpftrace": bpftrace, "taccd": taccd}


def generate(out: Path) -> list[Path]:
    """Shell completions (bash, zsh: shtab) and man pages (argparse-manpage) of the three
    executables into ``out``/{bash-completion,zsh,man1}."""
    import shtab
    from argparse_manpage.manpage import Manpage

    written = []
    for name, build in parsers().items():
        p = build()
        p.prog = name
        for shell, sub, fname in (("bash", "bash-completion", name), ("zsh", "zsh", f"_{name}")):
            f = out / sub / fname
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(shtab.complete(p, shell=shell))
            written.append(f)
        f = out / "man1" / f"{name}.1"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(str(Manpage(p)))
        written.append(f)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "build/cli-docs")):
        print(path)
