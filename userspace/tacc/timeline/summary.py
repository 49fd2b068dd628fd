"""``tacc timeline --summary``: per-track busy time and top slices, accumulated in streaming.

Busy time is the time a track's slices cover, less its ``sleeping`` slices (a thread off
the CPU is not busy); counters carry their unit (bytes as KiB/MiB/GiB); times are relative
to the capture's first event; each device function gets the engines' busy time as HTA's
temporal breakdown counts it (docs/timeline.md)."""

from __future__ import annotations

from typing import Any, TextIO

import numpy as np

from .chrome_json import HTA_MEMORY_NAMES
from .model import Batch, CounterBatch, Names, Track

SUMMARY_SCHEMA = "tacc-timeline-summary"
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

    def to_json(self, tracks: list[Track], names: list[str], problems: list[str]
                ) -> dict[str, Any]:
        """The summary as the JSON of ``tacc timeline --summary --json`` (docs/cli.md);
        :meth:`write` prints this very document as text."""
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
        rows = sorted(self.count, key=lambda k: tracks[k].idx)
        dev = self.device_busy(tracks, names)
        return {
            "schema": SUMMARY_SCHEMA, "version": 1, "events": self.events,
            "tracks": len(tracks), "t0_ns": lo, "span_ns": span, "problems": list(problems),
            "track_busy": [{"track": path(tracks[t]), "slices": self.count[t],
                            "busy_ns": self.busy[t], "busy_share": self.busy[t] / span,
                            "sleeping_ns": self.sleep[t]} for t in rows],
            "device_engines": [
                {"track": path(tracks[g]), "span_ns": d["span"], "busy_ns": d["busy"],
                 "compute_ns": d["compute"], "busy_share": d["busy"] / max(d["span"], 1),
                 "compute_share": d["compute"] / max(d["span"], 1),
                 "idle_share": (max(d["span"], 1) - d["busy"]) / max(d["span"], 1)}
                for g, d in sorted(dev.items())],
            "counters": [{"track": path(tracks[t]), "unit": tracks[t].unit, "samples": int(n),
                          "mean": s / max(n, 1), "min": mn, "max": mx}
                         for t, (n, s, mn, mx) in sorted(self.cstats.items())],
            "slice_names": [{"name": names[k], "count": c, "total_ns": s} for k, (c, s) in
                            sorted(self.by_name.items(), key=lambda kv: -kv[1][1])],
            "top_slices": [{"dur_ns": d, "t_ns": ts - lo, "name": names[k],
                            "track": path(tracks[t])} for d, ts, t, k in self.top],
        }

    def write(self, out: TextIO, tracks: list[Track], names: list[str], problems: list[str]
              ) -> None:
        write_text(out, self.to_json(tracks, names, problems))


def write_text(out: TextIO, doc: dict[str, Any]) -> None:
    """The summary document (:meth:`SummarySink.to_json`) as the text of ``tacc timeline
    --summary``."""
    span = doc["span_ns"]
    out.write(f"timeline: {doc['events']} events, {doc['tracks']} tracks, "
              f"span {span / 1e6:.3f} ms (times below: ms from the first event)\n")
    for p in doc["problems"]:
        out.write(f"warning: {p}\n")
    rows = doc["track_busy"]
    w = max([len("track"), *(len(r["track"]) for r in rows)])
    out.write(f"\n{'track':<{w}} {'slices':>9} {'busy ms':>11} {'busy %':>7} "
              f"{'sleeping ms':>12}\n")
    for r in rows:
        out.write(f"{r['track']:<{w}} {r['slices']:>9} {r['busy_ns'] / 1e6:>11.3f} "
                  f"{100.0 * r['busy_share']:>7.1f} {r['sleeping_ns'] / 1e6:>12.3f}\n")
    if doc["device_engines"]:
        out.write("\ndevice engines (union of every queue's commands; compute: all but "
                  "copies and fills):\n")
        for d in doc["device_engines"]:
            out.write(f"{d['track']}: span {d['span_ns'] / 1e6:.3f} ms, busy "
                      f"{d['busy_ns'] / 1e6:.3f} ms ({100.0 * d['busy_share']:.2f} %), compute "
                      f"{d['compute_ns'] / 1e6:.3f} ms ({100.0 * d['compute_share']:.2f} %), "
                      f"idle {100.0 * d['idle_share']:.2f} %\n")
    if doc["counters"]:
        cw = max([len("counter"), *(len(c["track"]) for c in doc["counters"])])
        out.write(f"\n{'counter':<{cw}} {'samples':>9} {'mean':>14} {'max':>14}\n")
        for c in doc["counters"]:
            out.write(f"{c['track']:<{cw}} {c['samples']:>9} "
                      f"{fmt_value(c['mean'], c['unit']):>14} "
                      f"{fmt_value(c['max'], c['unit']):>14}\n")
    sn = doc["slice_names"][:15]
    nw = max([len("slice name"), *(len(r["name"]) for r in doc["slice_names"])])
    out.write(f"\n{'slice name':<{nw}} {'count':>9} {'total ms':>11}\n")
    for r in sn:
        out.write(f"{r['name']:<{nw}} {r['count']:>9} {r['total_ns'] / 1e6:>11.3f}\n")
    out.write(f"\ntop {len(doc['top_slices'])} slices:\n")
    for r in doc["top_slices"]:
        out.write(f"  {r['dur_ns'] / 1e3:>12.1f} us  at {r['t_ns'] / 1e6:>10.3f} ms  "
                  f"{r['name']:<16} {r['track']}\n")
    ev = doc.get("device_events")
    if ev is not None:
        kinds = ", ".join(f"{k} {v}" for k, v in ev["by_kind"].items())
        out.write(f"\ndevice events: {ev['total']}" + (f" ({kinds})" if kinds else "") + "\n")
