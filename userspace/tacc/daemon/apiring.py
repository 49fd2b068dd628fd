"""Runtime API rings (``/dev/shm/tacc-api.<pid>``, written by tacc.runtime.apitrace).

The ring layout belongs to the runtime; this adapter only uses the reader that module
provides.  Until it exists (or if its API differs) API capture is reported unavailable.
Expected reader API (documented in the report to the runtime engineer):
``apitrace.open_reader(path) -> R`` with ``R.drain() -> np.ndarray`` (records with
``t_start, t_end, tag, bytes, pid, tid, name, args, fid/device, status``), ``R.dropped``
(int, the header's drop count) and ``R.close()``.
"""

from __future__ import annotations

import glob
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tacc.capture.schema import API_DTYPE, NO_FID

PATTERN = "/dev/shm/tacc-api.*"


def _module() -> Any | None:
    try:
        return importlib.import_module("tacc.runtime.apitrace")
    except ImportError:
        return None


def available() -> tuple[bool, str]:
    mod = _module()
    if mod is None:
        return False, "tacc.runtime.apitrace not installed"
    if not hasattr(mod, "open_reader"):
        return False, "tacc.runtime.apitrace has no open_reader()"
    return True, ""


class ApiRings:
    """Discovers and drains every API ring; converts records to API_DTYPE."""

    def __init__(self, string_id: Callable[[str], int], fid_of_pci: dict[str, int],
                 pids: set[int] | None = None) -> None:
        self.mod = _module()
        self.string_id = string_id
        self.fid_of_pci = fid_of_pci
        self.pids = pids
        self.readers: dict[str, Any] = {}
        self.dropped_seen: dict[str, int] = {}
        self.errors: list[str] = []

    def scan(self) -> None:
        if self.mod is None or not hasattr(self.mod, "open_reader"):
            return
        for path in glob.glob(PATTERN):
            if path in self.readers:
                continue
            try:
                pid = int(path.rsplit(".", 1)[-1].split("-")[0])
            except ValueError:
                pid = -1
            if self.pids and pid not in self.pids:
                continue
            try:
                self.readers[path] = self.mod.open_reader(path)
                self.dropped_seen[path] = 0
            except Exception as exc:  # noqa: BLE001 - a foreign ring must not kill taccd
                self.errors.append(f"{path}: {exc}")

    def drain(self) -> tuple[np.ndarray, int]:
        """(API_DTYPE records, newly dropped count)."""
        parts, drops = [], 0
        for path, r in list(self.readers.items()):
            try:
                recs = r.drain()
                d = int(getattr(r, "dropped", 0))
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"{path}: {exc}")
                del self.readers[path]
                continue
            drops += max(d - self.dropped_seen[path], 0)
            self.dropped_seen[path] = d
            if len(recs):
                parts.append(self._convert(recs))
        out = np.concatenate(parts) if parts else np.zeros(0, API_DTYPE)
        return out, drops

    def _convert(self, recs: np.ndarray) -> np.ndarray:
        if recs.dtype == API_DTYPE:
            return recs
        out = np.zeros(len(recs), API_DTYPE)
        names = recs.dtype.names or ()
        for f in ("t_start", "t_end", "tag", "bytes", "pid", "tid", "status"):
            if f in names:
                out[f] = recs[f]
        if "name" in names:
            out["name_id"] = [self.string_id(_s(x)) for x in recs["name"]]
        if "args" in names:
            out["args_id"] = [self.string_id(_s(x)) for x in recs["args"]]
        if "fid" in names:
            out["fid"] = recs["fid"]
        elif "device" in names:
            out["fid"] = [self.fid_of_pci.get(_s(x), NO_FID) for x in recs["device"]]
        else:
            out["fid"] = NO_FID
        return out

    def close(self) -> None:
        for r in self.readers.values():
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass
        self.readers.clear()


def _s(x: object) -> str:
    return x.decode(errors="replace").rstrip("\0") if isinstance(x, bytes) else str(x)
