"""``tacc timeline --summary``: per-track busy time and top slices, accumulated in streaming."""

from __future__ import annotations

from typing import TextIO

import numpy as np

from .model import Batch, CounterBatch, Track


class SummarySink:
    def __init__(self, topn: int = 10) -> None:
        self.count: dict[int, int] = {}
        self.busy: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.by_name: dict[int, list[int]] = {}  # name -> [count, total]
        self.top: list[tuple[int, int, int, int]] = []  # (dur, ts, track, name)
        self.cstats: dict[int, list[float]] = {}  # track -> [n, sum, min, max]
        self.topn = topn
        self.events = 0

    def slices(self, b: Batch) -> None:
        n = len(b)
        if n == 0:
            return
        self.events += n
        dur = b.dur if b.dur is not None else np.zeros(n, np.int64)
        tr, inv = np.unique(b.track, return_inverse=True)
        cnt = np.bincount(inv)
        bus = np.bincount(inv, weights=dur)
        lo = np.full(len(tr), np.iinfo(np.int64).max)
        hi = np.full(len(tr), np.iinfo(np.int64).min)
        np.minimum.at(lo, inv, b.ts)
        np.maximum.at(hi, inv, b.ts + dur)
        for t, c, s, a, z in zip(tr.tolist(), cnt.tolist(), bus.tolist(), lo.tolist(),
                                 hi.tolist(), strict=True):
            self.count[t] = self.count.get(t, 0) + c
            self.busy[t] = self.busy.get(t, 0) + int(s)
            self.first[t] = min(self.first.get(t, a), a)
            self.last[t] = max(self.last.get(t, z), z)
        nm, ninv = np.unique(b.name, return_inverse=True)
        ncnt = np.bincount(ninv)
        ndur = np.bincount(ninv, weights=dur)
        for k, c, s in zip(nm.tolist(), ncnt.tolist(), ndur.tolist(), strict=True):
            e = self.by_name.setdefault(k, [0, 0])
            e[0] += c
            e[1] += int(s)
        if b.dur is not None:
            k = min(self.topn, n)
            idx = np.argpartition(-dur, k - 1)[:k]
            self.top.extend(zip(dur[idx].tolist(), b.ts[idx].tolist(), b.track[idx].tolist(),
                                b.name[idx].tolist(), strict=True))
            self.top = sorted(self.top, reverse=True)[: self.topn]

    def counters(self, c: CounterBatch) -> None:
        if len(c) == 0:
            return
        self.events += len(c)
        for t in np.unique(c.track).tolist():
            v = c.value[c.track == t]
            e = self.cstats.setdefault(t, [0, 0.0, float("inf"), float("-inf")])
            e[0] += len(v)
            e[1] += float(v.sum())
            e[2] = min(e[2], float(v.min()))
            e[3] = max(e[3], float(v.max()))

    def write(self, out: TextIO, tracks: list[Track], names: list[str], problems: list[str]
              ) -> None:
        def path(t: Track) -> str:
            parts = [t.name]
            p = t.parent
            while p is not None:
                parts.append(tracks[p].name)
                p = tracks[p].parent
            return " / ".join(reversed(parts))

        lo = min(self.first.values(), default=0)
        hi = max(self.last.values(), default=0)
        span = max(hi - lo, 1)
        out.write(f"timeline: {self.events} events, {len(tracks)} tracks, "
                  f"span {span / 1e6:.3f} ms\n")
        for p in problems:
            out.write(f"warning: {p}\n")
        out.write(f"\n{'track':<64} {'slices':>9} {'busy ms':>11} {'busy %':>7}\n")
        for t in sorted(self.count, key=lambda k: tracks[k].idx):
            out.write(f"{path(tracks[t])[:64]:<64} {self.count[t]:>9} "
                      f"{self.busy[t] / 1e6:>11.3f} {100.0 * self.busy[t] / span:>7.1f}\n")
        if self.cstats:
            out.write(f"\n{'counter':<64} {'samples':>9} {'mean':>11} {'max':>11}\n")
            for t, (n, s, _mn, mx) in sorted(self.cstats.items()):
                out.write(f"{path(tracks[t])[:64]:<64} {int(n):>9} {s / max(n, 1):>11.3f} "
                          f"{mx:>11.3f}\n")
        out.write(f"\n{'slice name':<32} {'count':>9} {'total ms':>11}\n")
        for k, (c, s) in sorted(self.by_name.items(), key=lambda kv: -kv[1][1])[:15]:
            out.write(f"{names[k][:32]:<32} {c:>9} {s / 1e6:>11.3f}\n")
        out.write(f"\ntop {len(self.top)} slices:\n")
        for d, ts, t, k in self.top:
            out.write(f"  {d / 1e3:>12.1f} us  at {(ts - lo) / 1e6:>10.3f} ms  {names[k]:<16} "
                      f"{path(tracks[t])}\n")
