"""Registry hook: tacc.cli imports ``tacc.daemon.cli`` for ``tacc trace``."""

from tacc.cli_trace import add_parser

__all__ = ["add_parser"]
