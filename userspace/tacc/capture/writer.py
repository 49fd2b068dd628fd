"""Streaming, crash-safe capture writer.

Each stream is an append-only file; records are buffered per stream up to
``chunk_bytes`` and written as one framed chunk with a single ``writev(2)`` (header
and slices of the buffered arrays, nothing copied), so a ``kill -9`` leaves every
chunk written before it whole (the last one may be cut; readers stop before it).
``close()`` writes the ``complete`` marker; a capture without it is read as incomplete.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from . import framing
from .errors import CaptureError
from .schema import (
    FORMAT_MINOR,
    FORMAT_NAME,
    FORMAT_VERSION,
    STREAMS,
    STRING_MAX,
    STRINGS_DTYPE,
    dtype_to_json,
)

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_PIECES = 64  # arrays gathered by one writev(2) before they are concatenated


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_all(fd: int, data: bytes) -> None:
    """``data`` whole, write(2) after write(2) (one may write less than asked)."""
    rest = memoryview(data)
    while rest:
        rest = rest[os.write(fd, rest):]


class _Stream:
    def __init__(self, path: Path, name: str, version: int, dtype: np.dtype) -> None:
        self.name = name
        self.dtype = dtype
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        hdr = {"stream": name, "schema": version, "dtype": dtype_to_json(dtype)}
        _write_all(self.fd, framing.encode_file_header(hdr))
        self.pending: list[np.ndarray] = []
        self.pending_bytes = 0
        self.seq = 0
        self.records = 0

    def write_chunk(self, data: np.ndarray | list[np.ndarray]) -> None:
        """One chunk of ``data`` (records, or consecutive pieces of records) with one
        ``writev(2)``: the payload is not copied (crc32 taken piece by piece)."""
        pieces = data if isinstance(data, list) else [data]
        if len(pieces) > MAX_PIECES:  # many tiny appends (strings, drops): one small copy
            pieces = [np.concatenate(pieces)]
        bufs = [np.ascontiguousarray(p).view(np.uint8) for p in pieces]
        crc = 0
        for b in bufs:
            crc = framing.crc32(b, crc)
        nrec = sum(len(p) for p in pieces)
        nbytes = sum(b.nbytes for b in bufs)
        head = framing.encode_chunk_header(self.seq, nrec, nbytes, crc)
        total = len(head) + nbytes
        n = os.writev(self.fd, [head, *bufs])
        if n < total:  # short write (signal, disk nearly full): write the rest in turn
            _write_all(self.fd, b"".join([head, *(b.tobytes() for b in bufs)])[n:])
        self.seq += 1
        self.records += nrec


class CaptureWriter:
    """Write a capture directory.

    >>> with CaptureWriter(path, meta) as w:
    ...     w.append("driver", records)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: dict[str, Any],
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        streams: tuple[str, ...] | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and any(self.path.iterdir()):
            raise CaptureError(f"{self.path}: exists and is not empty")
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "streams").mkdir()
        self.chunk_bytes = max(int(chunk_bytes), 1)
        full = dict(meta)
        full["format"] = FORMAT_NAME
        full["version"] = FORMAT_VERSION
        full["minor"] = FORMAT_MINOR
        full.setdefault("created_unix", time.time())
        full["streams"] = {n: {"schema": v} for n, (v, _) in STREAMS.items()}
        _atomic_write(self.path / "meta.json", json.dumps(full, indent=1).encode())
        self.meta = full
        self._streams: dict[str, _Stream] = {}
        for name in streams or tuple(STREAMS):
            self._open(name)
        self._strings: dict[str, int] = {}
        self.closed = False

    def _open(self, name: str) -> _Stream:
        st = self._streams.get(name)
        if st is None:
            if name not in STREAMS:
                raise CaptureError(f"unknown stream {name!r}")
            version, dtype = STREAMS[name]
            st = _Stream(self.path / "streams" / f"{name}.tcs", name, version, dtype)
            self._streams[name] = st
        return st

    def append(self, name: str, records: np.ndarray) -> None:
        """Queue records (an array of the stream's dtype) for writing."""
        if self.closed:
            raise CaptureError(f"{self.path}: capture writer is closed")
        st = self._open(name)
        if records.dtype != st.dtype:
            raise CaptureError(
                f"stream {name}: records have dtype {records.dtype}, expected {st.dtype}"
            )
        if len(records) == 0:
            return
        st.pending.append(records)
        st.pending_bytes += records.nbytes
        if st.pending_bytes >= self.chunk_bytes:
            self._drain(st, final=False)

    def _drain(self, st: _Stream, final: bool) -> None:
        """Write whole chunks (every record if ``final``) from the pending arrays, as
        slices of them (no concatenation); what is left stays pending as views."""
        if not st.pending:
            return
        per = max(self.chunk_bytes // st.dtype.itemsize, 1)
        total = sum(len(p) for p in st.pending)
        whole = total if final else (total // per) * per
        pending = deque(st.pending)
        done = 0
        while done < whole:
            need = min(per, whole - done)
            pieces: list[np.ndarray] = []
            got = 0
            while got < need:
                p = pending[0]
                take = min(len(p), need - got)
                pieces.append(p[:take])
                got += take
                if take == len(p):
                    pending.popleft()
                else:
                    pending[0] = p[take:]
            st.write_chunk(pieces)
            done += got
        st.pending = list(pending)
        st.pending_bytes = sum(p.nbytes for p in st.pending)

    def string_id(self, text: str) -> int:
        """Intern a string into the strings stream; returns its id (0 is reserved for '')."""
        sid = self._strings.get(text)
        if sid is None:
            sid = len(self._strings) + 1
            self._strings[text] = sid
            raw = text.encode("utf-8", "replace")[:STRING_MAX]
            rec = np.zeros(1, STRINGS_DTYPE)
            rec["id"] = sid
            rec["len"] = len(raw)
            rec["text"] = raw
            self.append("strings", rec)
        return sid

    def flush(self) -> None:
        """Write every buffered record as chunks now."""
        for st in self._streams.values():
            self._drain(st, final=True)

    def close(self, complete: bool = True, extra: dict[str, Any] | None = None) -> None:
        if self.closed:
            return
        self.flush()
        summary: dict[str, Any] = {}
        for st in self._streams.values():
            os.fsync(st.fd)
            os.close(st.fd)
            summary[st.name] = {"chunks": st.seq, "records": st.records}
        self.closed = True
        if complete:
            marker = {"streams": summary, "closed_unix": time.time(), **(extra or {})}
            _atomic_write(self.path / "complete", json.dumps(marker, indent=1).encode())

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(complete=exc_type is None)
