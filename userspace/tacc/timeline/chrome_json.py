"""Chrome trace-event JSON (``--format json``, and ``--format hta``: a directory of one file
per rank), written incrementally, in the form chrome://tracing, Perfetto and PyTorch's
Holistic Trace Analysis (HTA) read (docs/timeline.md "Chrome JSON and HTA"):

- a ``distributedInfo`` ({"backend": "tacc", "rank", "world_size"}) before the events: one
  rank per node and device function; the single-file export is rank 0 of world_size 1
  when it holds one function, and names every function's rank in ``tacc.ranks``;
- ``cat`` on every event; a device engine's queue is a GPU stream for HTA: its commands are
  ``X`` events with ``args.stream`` (> 0, unique per queue) and ``args.device`` (the
  function's fid), ``cat`` "kernel", or "gpu_memcpy"/"gpu_memset" with HTA's memory-kernel
  names ("Memcpy HtoD (copy_h2d)", "Memset (fill)") for DMA commands;
- flow ids as strings of small integers (a JavaScript number holds an integer exactly up
  to 2**53; tacc's flow ids, node << 56 | tag, do not fit).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from .model import Batch, CounterBatch, Track

# device commands HTA classifies as memory kernels (its names: ^Memcpy, ^Memset)
HTA_MEMORY_NAMES = {"copy_h2d": ("gpu_memcpy", "Memcpy HtoD (copy_h2d)"),
                    "copy_d2h": ("gpu_memcpy", "Memcpy DtoH (copy_d2h)"),
                    "copy_d2d": ("gpu_memcpy", "Memcpy DtoD (copy_d2d)"),
                    "fill": ("gpu_memset", "Memset (fill)")}


class Ranks:
    """(node idx, fid) -> rank, in node then function order; a track outside any function's
    group (host, API, OS) belongs to its node's first function."""

    def __init__(self, functions: list[tuple[int, str, list[str]]]) -> None:
        # functions: (node idx, node name, [function name per fid])
        self.rank: dict[tuple[int, int], int] = {}
        self.names: list[str] = []
        for node, name, fns in functions:
            for fid, fn in enumerate(fns or ["-"]):
                self.rank[(node, fid)] = len(self.names)
                self.names.append(f"{name} {fn}")

    @property
    def world_size(self) -> int:
        return max(len(self.names), 1)

    def of(self, t: Track) -> int:
        return self.rank.get((t.node, t.fid), self.rank.get((t.node, 0), 0))


def header(rank: int, world_size: int, extra: dict[str, Any] | None = None) -> str:
    # json.dumps' ": " separator: HTA finds the rank with the regex '"rank":\s+(\d+)',
    # in the first line that has one
    info = {"backend": "tacc", "rank": rank, "world_size": world_size, **(extra or {})}
    return (f'{{"schemaVersion": 1, "distributedInfo": {json.dumps(info)}, '
            f'"displayTimeUnit": "ns", "traceEvents": [\n')


class JsonSink:
    """One Chrome JSON file (``files(0)``), or one per rank (``split``: ``files(rank)``
    opens rank's file)."""

    def __init__(self, files: Callable[[int], TextIO], metadata: dict[str, Any],
                 ranks: Ranks | None = None, split: bool = False) -> None:
        self.files = files
        self.metadata = metadata
        self.ranks = ranks or Ranks([])
        self.split = split
        self.open: dict[int, TextIO] = {}
        self.first: dict[int, bool] = {}
        self.events = 0
        self.flow_ids: dict[int, int] = {}
        self.track_rank = np.zeros(0, np.int64)
        self.track_cat: list[str] = []
        self.stream = np.zeros(0, np.int64)
        if not split:
            single = self.ranks.world_size == 1
            self._file(0, {} if single else {"note": "every rank's events: tacc.ranks"})

    def _file(self, rank: int, extra: dict[str, Any] | None = None) -> TextIO:
        key = rank if self.split else 0
        f = self.open.get(key)
        if f is None:
            f = self.open[key] = self.files(key)
            name = self.ranks.names[rank] if rank < len(self.ranks.names) else ""
            f.write(header(key, self.ranks.world_size if self.split else 1,
                           {"name": name} if self.split else extra))
            self.first[key] = True
        return f

    def _emit(self, rank: int, lines: list[str]) -> None:
        if not lines:
            return
        f = self._file(rank)
        key = rank if self.split else 0
        if not self.first[key]:
            f.write(",\n")
        self.first[key] = False
        f.write(",\n".join(lines))

    def _emit_ranked(self, ranks: list[int], lines: list[str]) -> None:
        if not self.split:
            self._emit(0, lines)
            return
        by: dict[int, list[str]] = {}
        for r, ln in zip(ranks, lines, strict=True):
            by.setdefault(r, []).append(ln)
        for r, lns in by.items():
            self._emit(r, lns)

    @staticmethod
    def _pid_tid(t: Track, tracks: list[Track]) -> tuple[int, int]:
        # process = the track's group directly under its node, thread = the track
        top = t
        while top.parent is not None and tracks[top.parent].parent is not None:
            top = tracks[top.parent]
        return top.idx + 1, t.idx + 1

    @staticmethod
    def _cat(t: Track, tracks: list[Track]) -> str:
        if t.cat:
            return t.cat
        top = t
        while top.parent is not None and tracks[top.parent].parent is not None:
            top = tracks[top.parent]
        word = top.name.split(" ", 1)[0]
        if word in ("device", "driver", "host"):
            return word
        return "cpu_op" if t.name.endswith(" API") else "os"

    def tracks(self, new: list[Track], all_tracks: list[Track]) -> None:
        n = len(all_tracks)
        self.track_rank = np.array([self.ranks.of(t) for t in all_tracks], np.int64)
        self.track_cat = [self._cat(t, all_tracks) for t in all_tracks]
        # a device queue's stream number: its track's index + 1 (> 0: HTA's GPU events)
        self.stream = np.array([t.idx + 1 if t.cat == "kernel" else -1 for t in all_tracks],
                               np.int64)
        assert len(self.stream) == n
        ranks, lines = [], []
        for t in new:
            r = int(self.track_rank[t.idx])
            if t.kind == "group":
                if t.parent is not None and all_tracks[t.parent].parent is None:
                    node = all_tracks[t.parent].name
                    ranks.append(r)
                    lines.append(json.dumps({"ph": "M", "cat": "__metadata",
                                             "name": "process_name", "pid": t.idx + 1,
                                             "args": {"name": f"{node}: {t.name}"}}))
                continue
            pid, tid = self._pid_tid(t, all_tracks)
            ranks.append(r)
            lines.append(json.dumps({"ph": "M", "cat": "__metadata", "name": "thread_name",
                                     "pid": pid, "tid": tid, "args": {"name": t.name}}))
        self._emit_ranked(ranks, lines)

    def _flow_id(self, fid: int) -> str:
        # a small integer per distinct flow, as a string: exact as a float64 and as a string
        n = self.flow_ids.get(fid)
        if n is None:
            n = self.flow_ids[fid] = len(self.flow_ids) + 1
        return f'"{n}"'

    def slices(self, b: Batch, tracks: list[Track], names: list[str]) -> None:
        n = len(b)
        if not n:
            return
        self.events += n
        pt = np.array([self._pid_tid(t, tracks) for t in tracks], np.int64)
        pid = pt[b.track, 0].tolist()
        tid = pt[b.track, 1].tolist()
        rank = self.track_rank[b.track].tolist()
        stream = self.stream[b.track].tolist()
        cats = [self.track_cat[t] for t in b.track.tolist()]
        ts = (b.ts / 1e3).tolist()
        dur = (b.dur / 1e3).tolist() if b.dur is not None else None
        nm = [json.dumps(names[k]) for k in b.name.tolist()]
        raw = [names[k] for k in b.name.tolist()]
        keys = list(b.args)
        cols = [b.args[k].tolist() for k in keys]
        flow = b.flow.tolist() if b.flow is not None else None
        term = b.term.tolist() if b.term is not None else None
        ranks, lines = [], []
        for i in range(n):
            args = ",".join(f'"{k}":{c[i]!r}' for k, c in zip(keys, cols, strict=True))
            cat, name = cats[i], nm[i]
            if stream[i] > 0:
                args += ("," if args else "") + \
                    f'"stream":{stream[i]},"device":{tracks[b.track[i]].fid}'
                if raw[i] in HTA_MEMORY_NAMES:
                    cat, hta = HTA_MEMORY_NAMES[raw[i]]
                    name = json.dumps(hta)
            if dur is not None:
                lines.append(f'{{"ph":"X","cat":"{cat}","pid":{pid[i]},"tid":{tid[i]},'
                             f'"ts":{ts[i]:.3f},"dur":{dur[i]:.3f},"name":{name},'
                             f'"args":{{{args}}}}}')
            else:
                lines.append(f'{{"ph":"i","s":"t","cat":"{cat}","pid":{pid[i]},'
                             f'"tid":{tid[i]},"ts":{ts[i]:.3f},"name":{name},'
                             f'"args":{{{args}}}}}')
            ranks.append(rank[i])
            if flow and flow[i]:
                ph = "s" if b.flow_origin else ("f" if term and term[i] else "t")
                bp = ',"bp":"e"' if ph != "s" else ""
                lines.append(f'{{"ph":"{ph}","id":{self._flow_id(flow[i])},"cat":"tag",'
                             f'"name":"tag","pid":{pid[i]},"tid":{tid[i]},"ts":{ts[i]:.3f}'
                             f'{bp}}}')
                ranks.append(rank[i])
        self._emit_ranked(ranks, lines)

    def counters(self, c: CounterBatch, tracks: list[Track]) -> None:
        if not len(c):
            return
        self.events += len(c)
        pt = np.array([self._pid_tid(t, tracks) for t in tracks], np.int64)
        pid = pt[c.track, 0].tolist()
        rank = self.track_rank[c.track].tolist()
        nm = [json.dumps(tracks[t].name) for t in c.track.tolist()]
        ts = (c.ts / 1e3).tolist()
        v = c.value.tolist()
        self._emit_ranked(rank, [f'{{"ph":"C","cat":"counter","pid":{pid[i]},"ts":{ts[i]:.3f},'
                                 f'"name":{nm[i]},"args":{{"value":{v[i]!r}}}}}'
                                 for i in range(len(c))])

    def findings(self, findings: list[dict[str, Any]]) -> None:
        lines = [json.dumps({"ph": "M", "cat": "__metadata", "name": "process_name", "pid": 0,
                             "args": {"name": "tacc findings"}})]
        for f in findings:
            for t0, t1 in f.get("time_ranges", []):
                lines.append(json.dumps({
                    "ph": "X", "cat": "finding", "pid": 0, "tid": 0, "ts": t0 / 1e3,
                    "dur": (t1 - t0) / 1e3,
                    "name": f"{f['severity']}: {f.get('title', f['rule'])}",
                    "args": {"suggestion": f.get("suggestion", ""),
                             "time_lost_ms": (f.get("time_lost_ns") or 0) / 1e6}}))
        self._emit(0, lines)

    def close(self) -> None:
        if not self.open:
            self._file(0)
        meta = {"tacc": {**self.metadata, "ranks": self.ranks.names}}
        for f in self.open.values():
            f.write('\n],"metadata":' + json.dumps(meta, default=str) + "}\n")
            if self.split:
                f.close()
