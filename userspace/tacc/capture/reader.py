"""Capture reader: validates meta.json and stream framing, streams records chunk by chunk."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from . import framing
from .clock import LinearClock, fit_pairs
from .devinfo import Function, function_from_desc, functions_from_meta
from .errors import (
    CaptureEmptyError,
    CaptureError,
    CaptureNotFoundError,
    CaptureTruncatedError,
    CaptureVersionError,
    FramingError,
)
from .schema import (
    FORMAT_MINOR,
    FORMAT_NAME,
    FORMAT_VERSION,
    STREAMS,
    VM_PAUSE_DTYPE,
    DeviceEventKind,
    dtype_from_json,
)


def _older_layout(old: np.dtype, new: np.dtype) -> bool:
    """``old`` is a record layout of an earlier minor version of ``new``'s stream: every
    named field of it is in ``new`` with the same type (padding aside), and ``new`` has
    more (fields added by a minor version, anywhere in the record)."""
    names = [n for n in old.names or () if not n.startswith("_")]
    return (bool(names) and len(new.names or ()) > len(old.names or ())
            and all(n in (new.fields or {}) and new.fields[n][0] == old.fields[n][0]
                    for n in names))


def _newer_layout(disk: np.dtype, ours: np.dtype) -> bool:
    """``disk`` is a later minor's layout of ``ours``'s stream: every named field of ours
    in it with the same type, and more fields (read: ours picked out of it)."""
    return _older_layout(ours, disk)


def _widen(arr: np.ndarray, dtype: np.dtype, columns: list[str] | None = None
           ) -> np.ndarray:
    """Records of another minor's layout as ``dtype``'s (its ``columns`` only, when
    given): fields the file lacks are zero, fields ``dtype`` lacks are dropped."""
    names = columns or [n for n in dtype.names or () if not n.startswith("_")]
    out = np.zeros(len(arr), dtype=dtype)
    have = arr.dtype.names or ()
    for n in names:
        if n in have:
            out[n] = arr[n]
    return out[columns] if columns else out


@dataclass
class StreamInfo:
    name: str
    path: Path
    schema: int
    dtype: np.dtype
    data_start: int
    chunks: list[framing.ChunkRef] = field(default_factory=list)
    # an older minor's record layout on disk (a subset of ``dtype``'s fields, e.g. the
    # counters stream before hw 1.2's counters): records are widened to ``dtype`` on read,
    # the new fields zero; or a later minor's (a superset): ours picked out of it
    file_dtype: np.dtype | None = None

    @property
    def records(self) -> int:
        return sum(c.nrecords for c in self.chunks)


class Capture:
    """An open capture directory (see :func:`open_capture`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []
        self.meta = self._load_meta()
        self.marker = self._load_marker()
        self.complete = self.marker is not None
        self.functions: list[Function] = functions_from_meta(self.meta)
        self.node = str(self.meta.get("node", "node0"))
        self._streams: dict[str, StreamInfo] = {}
        self._other: dict[str, StreamInfo] = {}
        self._scan_streams()
        if sum(s.records for s in self._streams.values()) == 0:
            raise CaptureEmptyError(f"{path}: capture holds no records")
        self.functions += self._functions_added()
        if not self.complete:
            self.problems.insert(0, "no 'complete' marker (capture was interrupted)")

    # --------------------------------------------------------------- opening --
    def _load_meta(self) -> dict[str, Any]:
        mpath = self.path / "meta.json"
        if not self.path.exists():
            raise CaptureNotFoundError(f"{self.path}: no such capture")
        if not self.path.is_dir():
            raise CaptureNotFoundError(f"{self.path}: not a capture directory")
        if not mpath.exists():
            raise CaptureEmptyError(f"{self.path}: not a tacc capture (no meta.json)")
        raw = mpath.read_bytes()
        if not raw.strip():
            raise CaptureEmptyError(f"{self.path}: meta.json is empty")
        try:
            meta = json.loads(raw)
        except ValueError:
            raise CaptureError(f"{self.path}: meta.json is not valid JSON") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise CaptureError(f"{self.path}: meta.json does not describe a tacc capture")
        version, minor = meta.get("version"), meta.get("minor", 0)
        if (not isinstance(version, int) or isinstance(version, bool)
                or not isinstance(minor, int) or isinstance(minor, bool) or minor < 0):
            raise CaptureVersionError(
                f"{self.path}: capture format version {version!r} minor {minor!r} is not "
                f"a version (this tacc reads version {FORMAT_VERSION}.0-{FORMAT_MINOR})"
            )
        if version > FORMAT_VERSION:
            raise CaptureVersionError(
                f"{self.path}: capture format version {version}.{minor} is newer than this "
                f"tacc reads ({FORMAT_VERSION}.x): upgrade tacc"
            )
        if version != FORMAT_VERSION:
            raise CaptureVersionError(
                f"{self.path}: capture format version {version}.{minor} is not supported "
                f"(this tacc reads version {FORMAT_VERSION}.x)"
            )
        return meta

    @property
    def format_version(self) -> tuple[int, int]:
        """(major, minor) of the capture's format (minor 0 when meta.json has none)."""
        return int(self.meta["version"]), int(self.meta.get("minor", 0))

    def _load_marker(self) -> dict[str, Any] | None:
        p = self.path / "complete"
        if not p.exists():
            return None
        try:
            marker = json.loads(p.read_bytes())
        except ValueError:
            raise CaptureTruncatedError(f"{self.path}: 'complete' marker is damaged") from None
        return marker if isinstance(marker, dict) else {}

    def _functions_added(self) -> list[Function]:
        """Functions that appeared during the capture (VFs enabled), fids after meta.json's.

        A complete capture describes them in its marker (``devices_added``); an
        interrupted one has their hotplug-add device events: PCI address and VF number,
        with the link, clock and time scale of their PF (VFs share the PF's link)."""
        n = len(self.functions)
        out: dict[int, Function] = {}
        for d in (self.marker or {}).get("devices_added") or []:
            if isinstance(d, dict) and isinstance(d.get("fid"), int) and d["fid"] >= n:
                out[int(d["fid"])] = function_from_desc(int(d["fid"]), d, self.meta)
        ev = self.read("device_events", ["fid", "kind", "arg", "name_id"])
        ev = ev[(ev["kind"] == DeviceEventKind.HOTPLUG_ADD) & (ev["fid"] >= n)]
        pfs = [f for f in self.functions if f.vf == 0] or self.functions
        for fid, arg, sid in zip(ev["fid"].tolist(), ev["arg"].tolist(),
                                 ev["name_id"].tolist(), strict=True):
            if fid not in out:
                words = self.strings.get(int(sid), "").split()  # hotplug add <pci> VF <n>
                pci = words[2] if len(words) > 2 else f"func{fid}"
                out[fid] = self._like_pf(pfs, fid, pci, int(arg))
        res = []
        for fid in range(n, max(out, default=n - 1) + 1):
            if fid not in out:
                self.problems.append(f"function {fid} is not described (no marker entry and "
                                     f"no hotplug event): shown as func{fid}")
                out[fid] = self._like_pf(pfs, fid, f"func{fid}", 0)
            res.append(out[fid])
        return res

    @staticmethod
    def _like_pf(pfs: list[Function], fid: int, pci: str, vf: int) -> Function:
        """A function sharing the link, clock and time scale of its PF (same bus)."""
        bus = pci.rsplit(":", 1)[0]
        pf = next((f for f in pfs if f.pci.rsplit(":", 1)[0] == bus), pfs[0] if pfs else None)
        if pf is None:
            return Function(fid, pci, pci, vf, 4, 16, 256, 1e9, 1.0, 0)
        return dataclasses.replace(pf, fid=fid, pci=pci, pf=pf.pci, vf=vf,
                                   kind="vf" if vf else "pf")

    def _scan_streams(self) -> None:
        sdir = self.path / "streams"
        files = sorted(sdir.glob("*.tcs")) if sdir.is_dir() else []
        expected = (self.marker or {}).get("streams", {})
        for p in files:
            name = p.stem
            what = f"{self.path.name}/streams/{p.name}"
            if name not in STREAMS:
                self._scan_unknown(p, name, what)
                continue
            with open(p, "rb") as f:
                try:
                    info, start = framing.read_file_header(f, what)
                except CaptureVersionError:
                    raise
                except FramingError as exc:
                    if self.complete:
                        raise CaptureTruncatedError(f"{exc}") from None
                    self.problems.append(str(exc))
                    continue
                version, dtype = STREAMS[name]
                if info.get("schema") != version:
                    raise CaptureVersionError(
                        f"{what}: stream schema version {info.get('schema')!r} is not "
                        f"supported (this tacc reads version {version})"
                    )
                try:
                    fdt = dtype_from_json(info.get("dtype", []))
                except (TypeError, ValueError):
                    raise CaptureVersionError(f"{what}: unreadable record layout") from None
                older = None
                if fdt != dtype:
                    if not (_older_layout(fdt, dtype) or _newer_layout(fdt, dtype)):
                        raise CaptureVersionError(
                            f"{what}: record layout differs from schema {version}"
                        )
                    older = fdt
                refs, damage = framing.scan_chunks(f, start, fdt.itemsize, verify_payload=False)
            st = StreamInfo(name, p, version, dtype, start, refs, older)
            want = expected.get(name, {}).get("records") if self.complete else None
            if damage is not None:
                msg = f"{what}: {damage.reason}; kept {len(refs)} whole chunks"
                if self.complete:
                    raise CaptureTruncatedError(f"capture marked complete but {msg}")
                self.problems.append(msg)
            if want is not None and st.records != want:
                raise CaptureTruncatedError(
                    f"{what}: holds {st.records} records, the 'complete' marker says {want}"
                )
            self._streams[name] = st

    def _scan_unknown(self, p: Path, name: str, what: str) -> None:
        """A stream this reader does not know (a newer minor version's): not analysed, but
        kept with the record layout its header declares (``other_streams``: tacc export
        writes it like any other), unless that layout is unreadable."""
        self.problems.append(f"unknown stream {name!r} ignored by the analysis")
        with open(p, "rb") as f:
            try:
                info, start = framing.read_file_header(f, what)
                dtype = dtype_from_json(info.get("dtype", []))
                schema = int(info.get("schema", 0))
            except (CaptureError, TypeError, ValueError):
                return
            if dtype.itemsize == 0 or dtype.names is None:
                return
            refs, _ = framing.scan_chunks(f, start, dtype.itemsize, verify_payload=False)
        self._other[name] = StreamInfo(name, p, schema, dtype, start, refs)

    # --------------------------------------------------------------- access --
    @property
    def other_streams(self) -> list[str]:
        """Streams of the capture this reader does not know, readable by :meth:`chunks`
        with their declared layout (whole chunks up to any damage)."""
        return list(self._other)

    @property
    def streams(self) -> list[str]:
        return list(self._streams)

    def info(self, name: str) -> StreamInfo | None:
        return self._streams.get(name)

    def other_info(self, name: str) -> StreamInfo | None:
        return self._other.get(name)

    def count(self, name: str) -> int:
        st = self._streams.get(name)
        return st.records if st else 0

    def chunks(self, name: str, columns: list[str] | None = None) -> Iterator[np.ndarray]:
        """Yield the stream's records, one whole chunk (numpy array) at a time."""
        st = self._streams.get(name) or self._other.get(name)
        if st is None:
            return
        what = f"{self.path.name}/streams/{st.path.name}"
        with open(st.path, "rb") as f:
            for ref in st.chunks:
                try:
                    payload = framing.read_payload(f, ref, what)
                except FramingError as exc:
                    if self.complete:
                        raise CaptureTruncatedError(str(exc)) from None
                    self.problems.append(str(exc))
                    return
                arr = np.frombuffer(payload, dtype=st.file_dtype or st.dtype)
                if st.file_dtype is not None:
                    yield _widen(arr, st.dtype, columns)
                    continue
                yield arr[columns] if columns else arr

    def read(self, name: str, columns: list[str] | None = None) -> np.ndarray:
        """The whole stream as one array (use :meth:`chunks` for large streams)."""
        parts = list(self.chunks(name, columns))
        if not parts:
            dt = STREAMS[name][1]
            return np.zeros(0, dtype=dt)[columns] if columns else np.zeros(0, dtype=dt)
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    @cached_property
    def strings(self) -> dict[int, str]:
        out = {0: ""}
        for ch in self.chunks("strings"):
            for sid, n, text in zip(ch["id"].tolist(), ch["len"].tolist(), ch["text"].tolist(),
                                    strict=True):
                out[int(sid)] = text[:n].decode("utf-8", "replace")
        return out

    @cached_property
    def _clock_pairs(self) -> np.ndarray:
        return self.read("clock_sync")

    def device_clock(self, fid: int) -> LinearClock:
        """Fitted device-ticks -> CLOCK_MONOTONIC conversion for function ``fid``."""
        return self._device_clocks[fid]

    @cached_property
    def _device_clocks(self) -> dict[int, LinearClock]:
        pairs = self._clock_pairs
        out: dict[int, LinearClock] = {}
        for fn in self.functions:
            sel = pairs[pairs["fid"] == fn.fid]
            nominal = 1e9 / fn.clock_hz
            if len(sel) == 0:
                self.problems.append(f"no clock-sync pairs for {fn.pci}: device times unaligned")
                out[fn.fid] = LinearClock(0, 0, nominal)
                continue
            out[fn.fid] = fit_pairs(sel["devclk"], sel["mono_before"], sel["mono_after"],
                                    nominal, f"{self.path.name} {fn.pci}")
        return out

    def host_clock(self) -> LinearClock | None:
        """Fit of CLOCK_MONOTONIC -> host reference clock (for aligning several captures)."""
        pairs = self._clock_pairs
        sel = pairs[pairs["hostclk"] != 0]
        if len(sel) == 0:
            return None
        # x = mono midpoint, y = hostclk less the VM's pauses (while the guest's clock
        # stood still the host's ran on): fit it against mono (bracket ~ exact)
        mid = (sel["mono_before"] + sel["mono_after"]) // 2
        host = sel["hostclk"].astype(np.int64) - sel["vm_paused_ns"].astype(np.int64)
        return fit_pairs(mid.astype(np.uint64), host, host, 1.0, f"{self.path.name} host clock")

    def vm_pauses(self) -> np.ndarray:
        """Where the VM stood still (paused, or stopped to migrate) during the capture:
        one VM_PAUSE_DTYPE record per step of the device's VM_PAUSED_NS between two clock
        pairs of a function (the one with the most pairs; all read one register).  The
        guest's CLOCK_MONOTONIC stood still with the VM, so the pause took no guest time:
        it lies between ``t_lo`` (the earlier pair's mono_after) and ``t_hi`` (the later
        pair's mono_before); ``paused_ns`` is the host time it lasted."""
        pairs = self._clock_pairs
        if not len(pairs) or not pairs["vm_paused_ns"].any():
            return np.zeros(0, VM_PAUSE_DTYPE)
        fids, counts = np.unique(pairs["fid"], return_counts=True)
        sel = pairs[pairs["fid"] == fids[np.argmax(counts)]]
        sel = sel[np.argsort(sel["mono_before"], kind="stable")]
        step = np.diff(sel["vm_paused_ns"].astype(np.int64))
        at = np.flatnonzero(step > 0)
        out = np.zeros(len(at), VM_PAUSE_DTYPE)
        out["t_lo"] = sel["mono_after"][at]
        out["t_hi"] = sel["mono_before"][at + 1]
        out["paused_ns"] = step[at]
        return out

    @cached_property
    def time_range(self) -> tuple[int, int]:
        """(first, last) CLOCK_MONOTONIC ns over every event of the capture."""
        lo, hi = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        for name, cols in (("api", ("t_start", "t_end")), ("driver", ("t_ns",)),
                           ("host", ("t_ns",)), ("drops", ("t_ns",)),
                           ("device_events", ("t_ns",))):
            for ch in self.chunks(name):
                if len(ch):
                    lo = min(lo, int(ch[cols[0]].min()))
                    hi = max(hi, int(ch[cols[-1]].max()))
                    if name == "driver":
                        hi = max(hi, int((ch["t_ns"] + ch["dur_ns"]).max()))
        for ch in self.chunks("device_trace"):
            if not len(ch):
                continue
            for fid in np.unique(ch["fid"]).tolist():
                sel = ch[ch["fid"] == fid]
                clk = self._device_clocks.get(int(fid))
                if clk is None:
                    continue
                lo = min(lo, int(clk.convert(sel["t_fetch"].min())))
                hi = max(hi, int(clk.convert(sel["t_end"].max())))
        if lo > hi:
            lo = hi = 0
        return lo, hi


def open_capture(path: str | os.PathLike[str]) -> Capture:
    """Open and validate a capture.  Raises :class:`CaptureError` subclasses only."""
    try:
        return Capture(Path(path))
    except CaptureError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise CaptureError(f"{path}: {exc.strerror or exc}") from None


