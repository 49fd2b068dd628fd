"""Chrome trace-event JSON (``--format json``), written incrementally."""

from __future__ import annotations

import json
from typing import Any, TextIO

import numpy as np

from .model import Batch, CounterBatch, Track


class JsonSink:
    def __init__(self, f: TextIO, metadata: dict[str, Any]) -> None:
        self.f = f
        self.first = True
        self.metadata = metadata
        self.events = 0
        f.write('{"displayTimeUnit":"ns","traceEvents":[\n')

    def _emit(self, lines: list[str]) -> None:
        if not lines:
            return
        if not self.first:
            self.f.write(",\n")
        self.first = False
        self.f.write(",\n".join(lines))

    @staticmethod
    def _pid_tid(t: Track, tracks: list[Track]) -> tuple[int, int]:
        # process = the track's group directly under its node, thread = the track
        top = t
        while top.parent is not None and tracks[top.parent].parent is not None:
            top = tracks[top.parent]
        return top.idx + 1, t.idx + 1

    def tracks(self, new: list[Track], all_tracks: list[Track]) -> None:
        lines = []
        for t in new:
            if t.kind == "group":
                if t.parent is not None and all_tracks[t.parent].parent is None:
                    node = all_tracks[t.parent].name
                    lines.append(json.dumps({"ph": "M", "name": "process_name", "pid": t.idx + 1,
                                             "args": {"name": f"{node}: {t.name}"}}))
                continue
            pid, tid = self._pid_tid(t, all_tracks)
            lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                     "args": {"name": t.name}}))
        self._emit(lines)

    def slices(self, b: Batch, tracks: list[Track], names: list[str]) -> None:
        n = len(b)
        if not n:
            return
        self.events += n
        pt = np.array([self._pid_tid(t, tracks) for t in tracks], np.int64)
        pid = pt[b.track, 0].tolist()
        tid = pt[b.track, 1].tolist()
        ts = (b.ts / 1e3).tolist()
        dur = (b.dur / 1e3).tolist() if b.dur is not None else None
        nm = [json.dumps(names[k]) for k in b.name.tolist()]
        keys = list(b.args)
        cols = [b.args[k].tolist() for k in keys]
        flow = b.flow.tolist() if b.flow is not None else None
        term = b.term.tolist() if b.term is not None else None
        lines = []
        for i in range(n):
            args = ",".join(f'"{k}":{c[i]!r}' for k, c in zip(keys, cols, strict=True))
            if dur is not None:
                lines.append(f'{{"ph":"X","pid":{pid[i]},"tid":{tid[i]},"ts":{ts[i]:.3f},'
                             f'"dur":{dur[i]:.3f},"name":{nm[i]},"args":{{{args}}}}}')
            else:
                lines.append(f'{{"ph":"i","s":"t","pid":{pid[i]},"tid":{tid[i]},'
                             f'"ts":{ts[i]:.3f},"name":{nm[i]},"args":{{{args}}}}}')
            if flow and flow[i]:
                ph = "s" if b.flow_origin else ("f" if term and term[i] else "t")
                bp = ',"bp":"e"' if ph != "s" else ""
                lines.append(f'{{"ph":"{ph}","id":{flow[i]},"cat":"tag","name":"tag",'
                             f'"pid":{pid[i]},"tid":{tid[i]},"ts":{ts[i]:.3f}{bp}}}')
        self._emit(lines)

    def counters(self, c: CounterBatch, tracks: list[Track]) -> None:
        if not len(c):
            return
        self.events += len(c)
        pt = np.array([self._pid_tid(t, tracks) for t in tracks], np.int64)
        pid = pt[c.track, 0].tolist()
        nm = [json.dumps(tracks[t].name) for t in c.track.tolist()]
        ts = (c.ts / 1e3).tolist()
        v = c.value.tolist()
        self._emit([f'{{"ph":"C","pid":{pid[i]},"ts":{ts[i]:.3f},"name":{nm[i]},'
                    f'"args":{{"value":{v[i]!r}}}}}' for i in range(len(c))])

    def findings(self, findings: list[dict[str, Any]]) -> None:
        lines = [json.dumps({"ph": "M", "name": "process_name", "pid": 0,
                             "args": {"name": "tacc findings"}})]
        for f in findings:
            for t0, t1 in f.get("time_ranges", []):
                lines.append(json.dumps({
                    "ph": "X", "pid": 0, "tid": 0, "ts": t0 / 1e3, "dur": (t1 - t0) / 1e3,
                    "name": f"{f['severity']}: {f.get('title', f['rule'])}",
                    "args": {"suggestion": f.get("suggestion", ""),
                             "time_lost_ms": (f.get("time_lost_ns") or 0) / 1e6}}))
        self._emit(lines)

    def close(self) -> None:
        self.f.write('\n],"metadata":' + json.dumps({"tacc": self.metadata}, default=str) + "}\n")
