"""Registry hook: ``tacc.cli`` imports this module; the commands live in tacc.cli_counters."""

from tacc.cli_counters import add_parser

__all__ = ["add_parser"]
