"""TLP records as a Perfetto timeline (Chrome JSON trace events, opens in ui.perfetto.dev).

One process per capture ("PCIe link <pci>") with two tracks: "TLPs down (H2D)" and
"TLPs up (D2H)"; each TLP is a slice as long as its link time (docs/hardware.md
section 9: ``t_link(link_bytes)`` at the link's generation and width).  Every read
request starts a flow to its completions (matched by function and tag: the
completions that follow the request until the one whose byte count equals its own
length), so the timeline shows each read's latency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tacc.model.link import t_link_ps

from . import CPLD, F_CTRL, F_UP, KIND_NAMES, MRD

DOWN, UP = 1, 2  # thread ids of the two tracks


class ReadFlows:
    """Matches read requests to their completions by function and tag, across batches
    of records (a capture's chunks): the completions that follow a request until the one
    whose byte count equals its own length."""

    def __init__(self) -> None:
        self.open: dict[tuple[int, int], int] = {}
        self.n = 0

    def feed(self, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flow number per record, 0 = none; True on the last completion of a read)."""
        flow = np.zeros(len(recs), np.int64)
        last = np.zeros(len(recs), bool)
        kind, func, tag = recs["kind"], recs["func"], recs["tag"]
        done = recs["byte_count"] == recs["payload"]
        for i in np.flatnonzero((kind == MRD) | (kind == CPLD)).tolist():
            key = (int(func[i]), int(tag[i]))
            if kind[i] == MRD:
                self.n += 1
                self.open[key] = flow[i] = self.n
                continue
            f = self.open.get(key)
            if f is None:
                continue  # its request was filtered out or dropped
            flow[i] = f
            if done[i]:
                last[i] = True
                del self.open[key]
        return flow, last


def read_flows(recs: np.ndarray) -> list[tuple[int, list[int]]]:
    """(index of a read request, indices of its completions) for every request whose
    completions are in ``recs``."""
    flow, last = ReadFlows().feed(recs)
    by: dict[int, list[int]] = {}
    for i in np.flatnonzero(flow).tolist():
        by.setdefault(int(flow[i]), []).append(i)
    return [(ix[0], ix[1:]) for f, ix in by.items() if last[ix[-1]] and f]


def slices(recs: np.ndarray, gen: int, width: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Each TLP as a slice: (up: on the D2H track, duration ps = its link time
    ``t_link(link_bytes)`` at the link's generation and width, name "KIND N B")."""
    lb, inv = np.unique(recs["link_bytes"], return_inverse=True)
    dur = np.array([t_link_ps(int(b), gen, width) for b in lb.tolist()], np.int64)[inv]
    names = [f"{KIND_NAMES.get(int(k), '?')} {int(n)} B"
             for k, n in zip(recs["kind"].tolist(), recs["payload"].tolist(), strict=True)]
    return (recs["flags"] & F_UP) != 0, dur.reshape(len(recs)), names


def events(recs: np.ndarray, gen: int = 4, width: int = 16, name: str = "tacc") -> list[dict]:
    pid = 1
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"PCIe link {name}"}},
        {"ph": "M", "pid": pid, "tid": DOWN, "name": "thread_name",
         "args": {"name": "TLPs down (H2D)"}},
        {"ph": "M", "pid": pid, "tid": UP, "name": "thread_name",
         "args": {"name": "TLPs up (D2H)"}},
    ]
    up, dur, names = slices(recs, gen, width)
    tid = np.where(up, UP, DOWN)
    ts_us = recs["t_ps"] / 1e6
    for i, r in enumerate(recs):
        ev.append({
            "ph": "X", "pid": pid, "tid": int(tid[i]), "ts": float(ts_us[i]),
            "dur": int(dur[i]) / 1e6, "name": names[i],
            "cat": "ctrl" if r["flags"] & F_CTRL else "cmd",
            "args": {"addr": hex(int(r["addr"])), "tag": int(r["tag"]),
                     "func": int(r["func"]), "seq": int(r["seq"]),
                     "cmd_tag": hex(int(r["cmd_tag"])), "job": int(r["job"]),
                     "link_bytes": int(r["link_bytes"])},
        })
    for n, (req, cpls) in enumerate(read_flows(recs)):
        ev.append({"ph": "s", "id": n, "pid": pid, "tid": int(tid[req]), "ts": float(ts_us[req]),
                   "name": "read", "cat": "read_latency"})
        for j, c in enumerate(cpls):
            ev.append({"ph": "f" if j == len(cpls) - 1 else "t", "bp": "e", "id": n, "pid": pid,
                       "tid": int(tid[c]), "ts": float(ts_us[c]), "name": "read",
                       "cat": "read_latency"})
    return ev


def write(path: Path, recs: np.ndarray, gen: int = 4, width: int = 16, name: str = "tacc") -> int:
    ev = events(recs, gen, width, name)
    Path(path).write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ns"}))
    return len(ev)
