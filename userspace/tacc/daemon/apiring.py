"""Runtime API rings (``/dev/shm/tacc-api.<pid>[.<tid>]``, written by tacc.runtime.apitrace).

The ring layout belongs to the runtime (docs/runtime-api-ring.md); this adapter only uses
its reader: ``apitrace.open_reader(path)`` (``drain()`` -> records with ``t_start, t_end,
tag, bytes, pid, tid, status, name, args, device``; ``dropped``; ``set_enabled()``;
``close()``), ``apitrace.list_rings()`` and ``apitrace.ring_pid()``.  Rings are created
disabled: a capture enables the rings it drains and disables them again when it ends.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tacc.capture.schema import API_DTYPE, NO_FID

SETTLE_NS = 2_000_000_000


def _module() -> Any | None:
    try:
        return importlib.import_module("tacc.runtime.apitrace")
    except ImportError:
        return None


def available() -> tuple[bool, str]:
    mod = _module()
    if mod is None:
        return False, "tacc.runtime.apitrace not installed"
    for name in ("open_reader", "list_rings", "ring_pid"):
        if not hasattr(mod, name):
            return False, f"tacc.runtime.apitrace has no {name}()"
    return True, ""


HASHED_MIN = 512  # records from which the args are told apart by hash (measured natively)
# odd 64-bit multipliers (golden-ratio based) for the args hash of ApiRings._intern_unique
_HASH_MUL = np.array([(0x9E3779B97F4A7C15 * (2 * i + 1)) & (2**64 - 1) for i in range(9)],
                     np.uint64)


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
        self.bad: set[str] = set()
        self._dir_mtime: int | None = None
        self._sid_cache: dict[object, int] = {}  # raw column value -> string id
        self._fid_cache: dict[object, int] = {}  # raw device value -> fid
        self.t_drain = 0.0  # time.monotonic() of the last drain

    def scan(self) -> None:
        """Open the rings that appeared since the last scan.  The directory is listed only
        when its mtime changed, or changed less than ``SETTLE_NS`` ago (timestamps are
        coarse: a ring created in the same clock tick as the last listing)."""
        if self.mod is None or not hasattr(self.mod, "list_rings"):
            return
        ring_dir = getattr(self.mod, "ring_dir", None)
        if ring_dir is not None:
            try:
                mtime = os.stat(ring_dir()).st_mtime_ns
            except OSError:
                mtime = None
            if mtime is not None and mtime == self._dir_mtime \
                    and time.time_ns() - mtime > SETTLE_NS:
                return
            self._dir_mtime = mtime
        for p in self.mod.list_rings():
            path = str(p)
            if path in self.readers or path in self.bad:
                continue
            try:
                pid = int(self.mod.ring_pid(path))
            except (ValueError, IndexError):
                continue
            if self.pids and pid not in self.pids:
                continue
            try:
                r = self._open(path)
                if hasattr(r, "set_enabled"):
                    r.set_enabled(True)
                self.readers[path] = r
                self.dropped_seen[path] = int(getattr(r, "dropped", 0))
            except Exception as exc:  # noqa: BLE001 - a foreign ring must not kill taccd
                self.bad.add(path)
                self.errors.append(f"{path}: {exc}")

    def _open(self, path: str) -> Any:
        """The runtime's raw reader when it has one (records as the ring holds them,
        converted here by whole-array operations), else its ``open_reader``."""
        raw = getattr(self.mod, "RingReader", None)
        if raw is not None and hasattr(self.mod, "RECORD_DTYPE") and \
                hasattr(self.mod, "pci_name"):
            return _RawRing(raw(path), self.string_id)
        return self.mod.open_reader(path)

    def due(self, now: float, watermark: int, max_age_s: float) -> bool:
        """A drain is due: ``max_age_s`` since the last, or a ring 1/``watermark`` full
        (its head and tail words; a reader without ``pending()`` is always due)."""
        if now - self.t_drain >= max_age_s:
            return True
        for r in self.readers.values():
            pending = getattr(r, "pending", None)
            if pending is None:
                return True
            try:
                if pending() * watermark >= r.capacity:
                    return True
            except (ValueError, OSError):
                return True
        return False

    def drain(self, now: float | None = None) -> tuple[np.ndarray, int]:
        """(API_DTYPE records, newly dropped count); ``now``: the caller's clock."""
        parts, drops = [], 0
        self.t_drain = time.monotonic() if now is None else now
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
                parts.append(self._raw(r, recs) if isinstance(r, _RawRing)
                             else self._convert(recs))
        out = np.concatenate(parts) if parts else np.zeros(0, API_DTYPE)
        return out, drops

    def _raw(self, r: _RawRing, recs: np.ndarray) -> np.ndarray:
        """Ring records (apitrace.RECORD_DTYPE) -> API_DTYPE by whole-array operations:
        names through the ring's name table (string ids looked up once per ring), the
        argument strings and devices through their distinct values in this drain (a few
        per drain: the string table and the fid map are asked once per distinct value)."""
        out = np.zeros(len(recs), API_DTYPE)
        for f in ("t_start", "t_end", "tag", "bytes", "pid", "tid", "status"):
            out[f] = recs[f]
        ids = recs["name_id"]
        out["name_id"] = r.name_sids[np.minimum(ids, len(r.name_sids) - 1)]
        out["args_id"] = self._intern_unique(recs["args"])
        u, inv = np.unique(recs["dev"], return_inverse=True)
        fids = self._fid_cache
        mod = self.mod
        assert mod is not None
        fu = [fids[d] if d in fids else fids.setdefault(
            d, self.fid_of_pci.get(mod.pci_name(d), NO_FID)) for d in u.tolist()]
        out["fid"] = np.array(fu, np.uint16)[inv.reshape(-1)]
        return out

    def _intern_unique(self, col: np.ndarray) -> np.ndarray:
        """String ids of a column through its distinct values.

        The distinct values come from a 64-bit hash of each record's bytes (a sort of u64,
        not of 72-byte strings: ~2x cheaper per record at a drain's ~1000 records); every
        record is then compared with its hash's first record, and a collision (never
        seen) falls back to sorting the strings themselves."""
        if col.dtype.itemsize % 8 or len(col) < HASHED_MIN:
            return self._intern_sorted(col)  # a small drain: the sort's fixed cost is less
        w = np.ascontiguousarray(col).view(np.uint64).reshape(len(col), -1)
        h = w[:, 0] * _HASH_MUL[0]
        for i in range(1, w.shape[1]):
            h ^= w[:, i] * _HASH_MUL[i % len(_HASH_MUL)]
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        rep = col[first]
        if not np.array_equal(rep[inv], col):
            return self._intern_sorted(col)
        return self._ids(rep)[inv]

    def _intern_sorted(self, col: np.ndarray) -> np.ndarray:
        u, inv = np.unique(col, return_inverse=True)
        return self._ids(u)[inv.reshape(-1)]

    def _ids(self, values: np.ndarray) -> np.ndarray:
        """String ids of distinct values (the string table asked once per new one)."""
        sids = self._sid_cache
        return np.array([sids[v] if v in sids else sids.setdefault(v, self.string_id(_s(v)))
                         for v in values.tolist()], np.uint32)

    def _convert(self, recs: np.ndarray) -> np.ndarray:
        if recs.dtype == API_DTYPE:
            return recs
        out = np.zeros(len(recs), API_DTYPE)
        names = recs.dtype.names or ()
        for f in ("t_start", "t_end", "tag", "bytes", "pid", "tid", "status"):
            if f in names:
                out[f] = recs[f]
        for src, dst in (("name", "name_id"), ("args", "args_id")):
            if src in names:
                out[dst] = self._intern(recs[src])
        if "fid" in names:
            out["fid"] = recs["fid"]
        elif "device" in names:
            fids = self._fid_cache
            out["fid"] = [fids[d] if d in fids else fids.setdefault(
                d, self.fid_of_pci.get(_s(d), NO_FID)) for d in recs["device"].tolist()]
        else:
            out["fid"] = NO_FID
        return out

    def _intern(self, col: np.ndarray) -> np.ndarray:
        """String ids of a column: a dict lookup per record, the string table only for a
        value not seen before (cheaper than sorting the column for its unique values)."""
        sids = self._sid_cache
        return np.array([sids[v] if v in sids else sids.setdefault(v, self.string_id(_s(v)))
                         for v in col.tolist()], np.uint32)

    def close(self) -> None:
        for r in self.readers.values():
            try:
                if hasattr(r, "set_enabled"):
                    r.set_enabled(False)
                r.close()
            except Exception:  # noqa: BLE001
                pass
        self.readers.clear()


def _s(x: object) -> str:
    return x.decode(errors="replace").rstrip("\0") if isinstance(x, bytes) else str(x)


class _RawRing:
    """A runtime ring read raw (``apitrace.RingReader``) with its names' string ids."""

    def __init__(self, ring: Any, string_id: Callable[[str], int]) -> None:
        self.ring = ring
        names = list(ring.names) + ["?"]
        self.name_sids = np.array([string_id(n[:32]) for n in names], np.uint32)

    @property
    def dropped(self) -> int:
        return int(self.ring.dropped)

    def set_enabled(self, on: bool) -> None:
        self.ring.set_enabled(on)

    @property
    def capacity(self) -> int:
        return int(self.ring.capacity)

    def pending(self) -> int:
        return int(self.ring.pending())

    def drain(self) -> np.ndarray:
        return self.ring.drain()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.ring.close()
