"""``tacc timeline --summary``: per-track busy time and top slices, accumulated in streaming.

Busy time is the time a track's slices cover, less its ``sleeping`` slices (a thread off
the CPU is not busy); counters carry their unit (bytes as KiB/MiB/GiB); times are relative
to the capture's first event; each device function gets the engines' busy time as HTA's
temporal breakdown counts it (docs/timeline.md)."""

from __future__ import annotations

from typing import TextIO

import numpy as np

from .chrome_json import HTA_MEMORY_NAMES
from .model import Batch, CounterBatch, Names, Track

IDLE_NAMES = ("sleeping",)  # slices that are a track's idle time, not its busy time


def fmt_bytes(v: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= div:
            return f"{v / div:.2f} {unit}"
    return f"{v:.0f} B"


def fmt_value(v: float, unit: str) -> str:
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "%":
        return f"{v:.1f} %"
    return f"{v:.3f} {unit}".rstrip()


def union_ns(ts: np.ndarray, end: np.ndarray) -> int:
    """The time the intervals [ts, end) cover together."""
    if not len(ts):
        return 0
    o = np.argsort(ts, kind="stable")
    ts, end = ts[o], np.maximum.accumulate(end[o])
    # an interval starts a new run where it begins after every earlier one ended
    start = np.r_[True, ts[1:] > end[:-1]]
    run = np.cumsum(start) - 1
    lo = ts[start]
    hi = np.zeros(len(lo), np.int64)
    np.maximum.at(hi, run, end)
    return int((hi - lo).sum())


class SummarySink:
    def __init__(self, topn: int = 10, names: Names | None = None) -> None:
        self.count: dict[int, int] = {}
        self.busy: dict[int, int] = {}
        self.sleep: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.by_name: dict[int, list[int]] = {}  # name -> [count, total]
        self.top: list[tuple[int, int, int, int]] = []  # (dur, ts, track, name)
        self.cstats: dict[int, list[float]] = {}  # track -> [n, sum, min, max]
        self.topn = topn
        self.events = 0
        self.names = names
        # device queue commands (a "kernel" track's slices), per track: (ts, end, name)
        self.kernels: dict[int, list[np.ndarray]] = {}

    def _idle_iids(self) -> list[int]:
        if self.names is None:
            return []
        return [self.names.ids[n] for n in IDLE_NAMES if n in self.names.ids]

    def slices(self, b: Batch, tracks: list[Track] | None = None) -> None:
        n = len(b)
        if n == 0:
            return
        self.events += n
        dur = b.dur if b.dur is not None else np.zeros(n, np.int64)
        work = np.where(np.isin(b.name, self._idle_iids()), 0, dur)
        tr, inv = np.unique(b.track, return_inverse=True)
        cnt = np.bincount(inv)
        bus = np.bincount(inv, weights=work)
        slp = np.bincount(inv, weights=dur - work)
        lo = np.full(len(tr), np.iinfo(np.int64).max)
        hi = np.full(len(tr), np.iinfo(np.int64).min)
        np.minimum.at(lo, inv, b.ts)
        np.maximum.at(hi, inv, b.ts + dur)
        for t, c, s, q, a, z in zip(tr.tolist(), cnt.tolist(), bus.tolist(), slp.tolist(),
                                    lo.tolist(), hi.tolist(), strict=True):
            self.count[t] = self.count.get(t, 0) + c
            self.busy[t] = self.busy.get(t, 0) + int(s)
            self.sleep[t] = self.sleep.get(t, 0) + int(q)
            self.first[t] = min(self.first.get(t, a), a)
            self.last[t] = max(self.last.get(t, z), z)
            if tracks is not None and tracks[t].cat == "kernel" and b.dur is not None:
                m = b.track == t
                self.kernels.setdefault(t, []).append(
                    np.stack([b.ts[m], b.ts[m] + dur[m], b.name[m]]))
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

    def device_busy(self, tracks: list[Track], names: list[str]) -> dict[int, dict[str, int]]:
        """Per device group (its track idx): the engines' span (first command's start to
        the last one's end), busy (their union), compute (the union of the commands that
        are not copies or fills: HTA's compute kernels), in ns."""
        groups: dict[int, list[np.ndarray]] = {}
        for t, parts in self.kernels.items():
            g = tracks[t].parent
            groups.setdefault(g if g is not None else t, []).extend(parts)
        out = {}
        mem = {i for i, n in enumerate(names) if n in HTA_MEMORY_NAMES}
        for g, parts in groups.items():
            a = np.concatenate(parts, axis=1)
            comp = ~np.isin(a[2], list(mem))
            out[g] = {"span": int(a[1].max() - a[0].min()), "busy": union_ns(a[0], a[1]),
                      "compute": union_ns(a[0][comp], a[1][comp])}
        return out

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
                  f"span {span / 1e6:.3f} ms (times below: ms from the first event)\n")
        for p in problems:
            out.write(f"warning: {p}\n")
        rows = sorted(self.count, key=lambda k: tracks[k].idx)
        w = max([len("track"), *(len(path(tracks[t])) for t in rows)])
        out.write(f"\n{'track':<{w}} {'slices':>9} {'busy ms':>11} {'busy %':>7} "
                  f"{'sleeping ms':>12}\n")
        for t in rows:
            out.write(f"{path(tracks[t]):<{w}} {self.count[t]:>9} "
                      f"{self.busy[t] / 1e6:>11.3f} {100.0 * self.busy[t] / span:>7.1f} "
                      f"{self.sleep[t] / 1e6:>12.3f}\n")
        dev = self.device_busy(tracks, names)
        if dev:
            out.write("\ndevice engines (union of every queue's commands; compute: all but "
                      "copies and fills):\n")
            for g, d in sorted(dev.items()):
                sp = max(d["span"], 1)
                out.write(f"{path(tracks[g])}: span {d['span'] / 1e6:.3f} ms, busy "
                          f"{d['busy'] / 1e6:.3f} ms ({100.0 * d['busy'] / sp:.2f} %), compute "
                          f"{d['compute'] / 1e6:.3f} ms ({100.0 * d['compute'] / sp:.2f} %), "
                          f"idle {100.0 * (sp - d['busy']) / sp:.2f} %\n")
        if self.cstats:
            cw = max([len("counter"), *(len(path(tracks[t])) for t in self.cstats)])
            out.write(f"\n{'counter':<{cw}} {'samples':>9} {'mean':>14} {'max':>14}\n")
            for t, (n, s, _mn, mx) in sorted(self.cstats.items()):
                u = tracks[t].unit
                out.write(f"{path(tracks[t]):<{cw}} {int(n):>9} "
                          f"{fmt_value(s / max(n, 1), u):>14} {fmt_value(mx, u):>14}\n")
        nw = max([len("slice name"), *(len(names[k]) for k in self.by_name)])
        out.write(f"\n{'slice name':<{nw}} {'count':>9} {'total ms':>11}\n")
        for k, (c, s) in sorted(self.by_name.items(), key=lambda kv: -kv[1][1])[:15]:
            out.write(f"{names[k]:<{nw}} {c:>9} {s / 1e6:>11.3f}\n")
        out.write(f"\ntop {len(self.top)} slices:\n")
        for d, ts, t, k in self.top:
            out.write(f"  {d / 1e3:>12.1f} us  at {(ts - lo) / 1e6:>10.3f} ms  {names[k]:<16} "
                      f"{path(tracks[t])}\n")
