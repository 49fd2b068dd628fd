"""Exceptions raised by capture readers and writers.

Every problem with a capture on disk is reported as a :class:`CaptureError` (or a
subclass) whose message is one line; the ``tacc`` CLI prints it as
``tacc: error: <message>`` and exits non-zero without a traceback.
"""

from __future__ import annotations

from tacc.errors import TaccError


class CaptureError(TaccError):
    """A capture cannot be read or written; the message is one clear line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class CaptureNotFoundError(CaptureError):
    """The path is not a capture directory."""


class CaptureVersionError(CaptureError):
    """The capture (or one of its streams) has a format version this reader does not know."""


class CaptureEmptyError(CaptureError):
    """The capture holds no records at all."""


class CaptureTruncatedError(CaptureError):
    """The capture was marked complete but a stream ends early or is damaged."""


class FramingError(CaptureError):
    """A stream's chunk framing is damaged (raised by strict parsing only)."""
