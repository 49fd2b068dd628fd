"""Captures for the host tests that a writer of this version would not make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tacc.capture import CaptureWriter, framing
from tacc.capture.schema import dtype_to_json


def write_older_stream(path: Path, name: str, rec: np.ndarray,
                       meta: dict[str, Any] | None = None) -> Path:
    """A capture at ``path`` whose stream ``name`` holds ``rec`` in its own record layout
    (an earlier minor's, schema 1), in one chunk; no ``complete`` marker (it would count
    no records of the stream)."""
    with CaptureWriter(path, meta or {"node": "h"}):
        pass
    (path / "streams" / f"{name}.tcs").write_bytes(
        framing.encode_file_header({"stream": name, "schema": 1,
                                    "dtype": dtype_to_json(rec.dtype)})
        + framing.encode_chunk(0, len(rec), rec.tobytes()))
    (path / "complete").unlink()
    return path
