"""The ``tacc run`` subcommand for the ``tacc`` dispatcher (implemented in tacc.cli_run)."""

from tacc.cli_run import add_parser, main

__all__ = ["add_parser", "main"]
