"""One-line, non-zero-exit failures of the tracing tools."""

from __future__ import annotations

from tacc.errors import TaccError


class ToolError(TaccError):
    """Printed as ``<prog>: <message>`` (one line); the process exits with ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(" ".join(message.split()))
        self.status = status
