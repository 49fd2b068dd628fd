"""tacc.capture: the one module that reads and writes tacc captures (docs/capture-format.md)."""

from .clock import LinearClock, fit_pairs
from .devinfo import Function, link_max_payload_bw
from .errors import (
    CaptureEmptyError,
    CaptureError,
    CaptureNotFoundError,
    CaptureTruncatedError,
    CaptureVersionError,
    FramingError,
)
from .reader import Capture, open_capture
from .schema import FORMAT_VERSION, STREAMS
from .writer import CaptureWriter

__all__ = [
    "Capture", "CaptureEmptyError", "CaptureError", "CaptureNotFoundError",
    "CaptureTruncatedError", "CaptureVersionError", "CaptureWriter", "FORMAT_VERSION",
    "FramingError", "Function", "LinearClock", "STREAMS", "fit_pairs", "link_max_payload_bw",
    "open_capture",
]
