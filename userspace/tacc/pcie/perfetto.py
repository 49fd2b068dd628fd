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

from tacc.capture.devinfo import t_link_ps

from . import CPLD, F_CTRL, F_UP, KIND_NAMES, MRD

DOWN, UP = 1, 2  # thread ids of the two tracks


def read_flows(recs: np.ndarray) -> list[tuple[int, list[int]]]:
    """(index of a read request, indices of its completions) for every request whose
    completions are in ``recs``."""
    open_: dict[tuple[int, int], tuple[int, list[int]]] = {}
    flows: list[tuple[int, list[int]]] = []
    kind, func, tag = recs["kind"], recs["func"], recs["tag"]
    for i in np.flatnonzero((kind == MRD) | (kind == CPLD)):
        key = (int(func[i]), int(tag[i]))
        if kind[i] == MRD:
            open_[key] = (int(i), [])
            continue
        if key not in open_:
            continue  # its request was filtered out or dropped
        req, cpls = open_[key]
        cpls.append(int(i))
        if int(recs["byte_count"][i]) == int(recs["payload"][i]):  # the last one
            flows.append((req, cpls))
            del open_[key]
    return flows


def events(recs: np.ndarray, gen: int = 4, width: int = 16, name: str = "tacc") -> list[dict]:
    pid = 1
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"PCIe link {name}"}},
        {"ph": "M", "pid": pid, "tid": DOWN, "name": "thread_name",
         "args": {"name": "TLPs down (H2D)"}},
        {"ph": "M", "pid": pid, "tid": UP, "name": "thread_name",
         "args": {"name": "TLPs up (D2H)"}},
    ]
    tid = np.where((recs["flags"] & F_UP) != 0, UP, DOWN)
    ts_us = recs["t_ps"] / 1e6
    for i, r in enumerate(recs):
        kind = KIND_NAMES.get(int(r["kind"]), "?")
        ev.append({
            "ph": "X", "pid": pid, "tid": int(tid[i]), "ts": float(ts_us[i]),
            "dur": t_link_ps(int(r["link_bytes"]), gen, width) / 1e6,
            "name": f"{kind} {int(r['payload'])} B",
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
