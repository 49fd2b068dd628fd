"""``tacc export``: captures -> Parquet datasets (one per stream), hive-partitioned by node
and capture.  Layout and columns: docs/export.md.

Generic over what a capture declares: every stream file it holds becomes a dataset whose
columns are the fields of the stream's dtype (:mod:`tacc.fleet.arrowmap`); device-tick
fields the format lists (``schema.DEVICE_TICK_FIELDS``) get a ``<field>_ns`` column,
converted through the record's function's clock pairs.  Chunk by chunk, vectorised.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tacc import __version__
from tacc.capture import Capture
from tacc.capture.schema import DEVICE_TICK_FIELDS, DropSource

from . import arrowmap
from .deps import require

EXPORT_FORMAT = "tacc-export"
EXPORT_VERSION = 1  # major: tacc query refuses another one
EXPORT_MINOR = 0
MANIFEST = "_tacc_export.json"
META_KEY = "tacc.export"
# datasets the export adds beside the capture's streams (one row per capture / function)
TABLES = ("captures", "functions")
ROW_GROUP_ROWS = 1 << 20
# Parquet codecs (DuckDB, Arrow, Spark read all of them) -> compression level.  Dictionary
# encoding only for string columns: tried on every u64 column it doubled the write time
# (tools/bench/bench_fleet.py) for files ~1.5x smaller.
CODECS: dict[str, int | None] = {"zstd": 1, "lz4": None, "snappy": None, "none": None}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def partition_value(text: str) -> str:
    """A hive partition value: letters, digits, ``. _ -`` kept, anything else ``_``."""
    v = _SAFE.sub("_", text) or "_"
    return "_" + v if v.startswith(".") else v


@dataclass
class CaptureExport:
    """What one capture's export wrote (an entry of ``_tacc_export.json``)."""

    node: str
    capture: str
    path: str
    format_version: str
    complete: bool
    problems: list[str]
    streams: dict[str, int] = field(default_factory=dict)  # stream -> rows
    dropped: dict[str, int] = field(default_factory=dict)  # drops.source name -> count
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(self.streams.values())


class Exporter:
    """Exports captures into ``out`` (a dataset directory, created or added to)."""

    def __init__(self, out: Path, row_group_rows: int = ROW_GROUP_ROWS,
                 compression: str = "zstd",
                 progress: Callable[[int, int], None] | None = None) -> None:
        """``progress(rows, total)``: called as each chunk is converted (rows of the
        export so far; ``total``, the rows :attr:`total` says are coming, 0: unknown)."""
        self.out = out
        self.progress = progress
        self.total = 0
        self.done = 0
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.pa = require("pyarrow")
        self.pq = require("pyarrow.parquet")

    # ------------------------------------------------------------ per capture --
    def export(self, cap: Capture, capture_id: str) -> CaptureExport:
        t = time.perf_counter()
        node = partition_value(cap.node)
        major, minor = cap.format_version
        res = CaptureExport(node=node, capture=capture_id, path=str(cap.path.resolve()),
                            format_version=f"{major}.{minor}", complete=cap.complete,
                            problems=[])
        clocks = self._clocks(cap)
        skipped = []
        for name in [*cap.streams, *cap.other_streams]:
            st = cap.info(name) or cap.other_info(name)
            try:
                if name in TABLES:
                    raise arrowmap.UnsupportedDtype("its name is an export table's")
                arrowmap.schema(st.dtype)
            except arrowmap.UnsupportedDtype as exc:
                if name in cap.streams and name not in TABLES:
                    raise
                skipped.append(f"stream {name!r} not exported: {exc}")
                continue
            res.streams[name] = self._stream(cap, name, node, capture_id, clocks)
        res.dropped = self._drops(cap)
        res.problems = list(cap.problems) + skipped  # after reading: damage found too
        self._table("functions", node, capture_id, self._functions(cap, clocks))
        self._table("captures", node, capture_id, [self._capture_row(cap, res)])
        res.seconds = round(time.perf_counter() - t, 3)
        return res

    def _partition(self, dataset: str, node: str, capture: str) -> Path:
        d = self.out / dataset / f"node={node}" / f"capture={capture}"
        if d.exists():  # a re-export replaces the capture's old files
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def _meta(self, name: str, extra: dict[str, Any]) -> dict[str, str]:
        return {META_KEY: json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                                      "minor": EXPORT_MINOR, "dataset": name, **extra})}

    def _stream(self, cap: Capture, name: str, node: str, capture: str,
                clocks: dict[int, Any]) -> int:
        pa = self.pa
        st = cap.info(name) or cap.other_info(name)
        assert st is not None
        names = set(st.dtype.names or ())
        ticks = [f for f in DEVICE_TICK_FIELDS.get(name, ()) if f in names and "fid" in names]
        base = arrowmap.schema(st.dtype)
        fields = list(base)
        for f in ticks:
            fields.append(pa.field(f"{f}_ns", pa.int64(),
                                   metadata={"unit": "ns", "clock": "CLOCK_MONOTONIC",
                                             "from": f}))
        fields = [pa.field(f.name, f.type, metadata={"unit": "device ticks"})
                  if f.name in ticks else f for f in fields]
        major, minor = cap.format_version
        sch = pa.schema(fields, metadata=self._meta(name, {
            "stream": name, "stream_schema": st.schema, "capture_format": f"{major}.{minor}",
            "node": node, "capture": capture, "complete": cap.complete}))
        d = self._partition(name, node, capture)
        tmp = d / "part-0.parquet.tmp"
        rows = 0
        pending: list[Any] = []
        npending = 0
        strings = [f.name for f in sch if pa.types.is_string(f.type)]
        with self.pq.ParquetWriter(tmp, sch, compression=self.compression,
                                   compression_level=CODECS[self.compression],
                                   use_dictionary=strings) as w:
            for ch in cap.chunks(name):
                extra = {f"{f}_ns": self._ticks_ns(ch, f, clocks) for f in ticks}
                pending.append(arrowmap.to_batch(ch, sch, extra))
                npending += len(ch)
                self.done += len(ch)
                if self.progress is not None:
                    self.progress(self.done, self.total)
                if npending >= self.row_group_rows:
                    w.write_table(pa.Table.from_batches(pending, schema=sch))
                    rows += npending
                    pending, npending = [], 0
            if pending or rows == 0:
                w.write_table(pa.Table.from_batches(pending, schema=sch))
                rows += npending
        os.replace(tmp, d / "part-0.parquet")
        return rows

    def _ticks_ns(self, ch: np.ndarray, f: str, clocks: dict[int, Any]) -> Any:
        """``<f>_ns``: CLOCK_MONOTONIC ns of raw ticks, through each record's function's
        fit; null where the function has no clock pairs or the raw value is 0 (unset)."""
        raw = ch[f]
        fid = ch["fid"]
        ns = np.zeros(len(ch), np.int64)
        ok = np.zeros(len(ch), bool)
        for v in np.unique(fid).tolist():
            clk = clocks.get(int(v))
            if clk is None:
                continue
            m = fid == v
            ns[m] = clk.convert(raw[m])
            ok |= m
        ok &= raw != 0
        return self.pa.array(ns, type=self.pa.int64(), mask=~ok)

    @staticmethod
    def _clocks(cap: Capture) -> dict[int, Any]:
        """Fitted device clocks of the functions that have clock pairs."""
        have = set(np.unique(cap.read("clock_sync", ["fid"])["fid"]).tolist())
        return {fn.fid: cap.device_clock(fn.fid) for fn in cap.functions if fn.fid in have}

    @staticmethod
    def _drops(cap: Capture) -> dict[str, int]:
        d = cap.read("drops", ["source", "count"])
        out: dict[str, int] = {}
        for s in np.unique(d["source"]).tolist():
            try:
                key = DropSource(s).name.lower()
            except ValueError:
                key = f"source_{s}"
            out[key] = int(d["count"][d["source"] == s].sum())
        return out

    @staticmethod
    def _functions(cap: Capture, clocks: dict[int, Any]) -> list[dict[str, Any]]:
        rows = []
        for fn in cap.functions:
            r: dict[str, Any] = dataclasses.asdict(fn)
            clk = clocks.get(fn.fid)
            r["clock_pairs"] = clk.npairs if clk else 0
            r["clock_drift_ns_per_tick"] = clk.drift if clk else None
            r["clock_bound_ns"] = clk.bound_ns if clk else None
            rows.append(r)
        return rows

    @staticmethod
    def _capture_row(cap: Capture, res: CaptureExport) -> dict[str, Any]:
        t0, t1 = cap.time_range
        return {"path": res.path, "format_version": res.format_version,
                "complete": res.complete, "problems": "; ".join(res.problems),
                "t_start_ns": t0, "t_end_ns": t1, "rows": res.rows,
                "dropped": sum(res.dropped.values()),
                "dropped_by_source": json.dumps(res.dropped, sort_keys=True),
                "tacc": __version__}

    def _table(self, name: str, node: str, capture: str, rows: list[dict[str, Any]]) -> None:
        pa = self.pa
        cols = {}
        for k in rows[0] if rows else ["fid"]:
            arr = pa.array([r[k] for r in rows])
            # all-null columns (no clock fit) as float64, not Arrow's null type
            cols[k] = pa.array([r[k] for r in rows], pa.float64()) if pa.types.is_null(
                arr.type) else arr
        tab = pa.table(cols).replace_schema_metadata(
            self._meta(name, {"node": node, "capture": capture}))
        d = self._partition(name, node, capture)
        self.pq.write_table(tab, d / "part-0.parquet.tmp")
        os.replace(d / "part-0.parquet.tmp", d / "part-0.parquet")

    # -------------------------------------------------------------- manifest --
    def write_manifest(self, done: list[CaptureExport]) -> dict[str, Any]:
        """``_tacc_export.json``: this export's captures added to (or replacing, by node
        and capture) those already in the directory."""
        path = self.out / MANIFEST
        old: dict[str, Any] = {}
        if path.exists():
            old = json.loads(path.read_text())
        keep = [c for c in old.get("captures", [])
                if (c["node"], c["capture"]) not in {(d.node, d.capture) for d in done}]
        caps = keep + [dataclasses.asdict(d) for d in done]
        datasets = sorted(p.name for p in self.out.iterdir()
                          if p.is_dir() and any(p.glob("node=*/capture=*/*.parquet")))
        doc = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "minor": EXPORT_MINOR,
               "generator": f"tacc {__version__}", "updated_unix": time.time(),
               "partitioning": ["node", "capture"], "datasets": datasets,
               "captures": sorted(caps, key=lambda c: (c["node"], c["capture"]))}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
        return doc


def capture_ids(caps: list[Capture]) -> list[str]:
    """Partition value of each capture: its directory name, made unique per node by a
    ``-2``, ``-3`` ... suffix when two captures of one node share a name."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for cap in caps:
        base = partition_value(cap.path.resolve().name)
        key = (partition_value(cap.node), base)
        seen[key] = seen.get(key, 0) + 1
        out.append(base if seen[key] == 1 else f"{base}-{seen[key]}")
    return out
