"""Always-on mode: what costs nothing per event, sampled at a low rate.

Per function: counters and per-queue job statistics from sysfs (the driver serves its
suspend snapshot, so sampling never wakes the device).  No BPF program runs.  Memory
is bounded: the last ``history`` samples per function.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from tacc.devices import TaccFunction, read_counters_sysfs

RATE_KEYS = ("jobs_completed", "cmds_completed", "h2d_bytes", "d2h_bytes", "irqs",
             "mmu_faults", "trace_dropped")


def read_queue_stats(fn: TaccFunction) -> list[dict[str, int]]:
    try:
        text = (fn.sysfs / "tacc" / "queue_stats").read_text()
    except OSError:
        return []
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if not parts or ln.startswith("#") or not all(p.isdigit() for p in parts):
            continue
        keys = ("queue", "jobs_done", "jobs_failed", "resets", "bad_cqes", "irqs")
        out.append(dict(zip(keys, map(int, parts), strict=False)))
    return out


class AlwaysOn:
    def __init__(self, interval: float = 1.0, history: int = 60) -> None:
        self.interval = interval
        self.history = history
        self.samples: dict[str, deque[tuple[float, dict[str, int]]]] = {}
        self.queues: dict[str, list[dict[str, int]]] = {}
        self.t_last = 0.0
        self.ticks = 0

    def tick(self, functions: list[TaccFunction], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self.t_last < self.interval:
            return
        self.t_last = now
        self.ticks += 1
        seen = set()
        for fn in functions:
            seen.add(fn.pci)
            dq = self.samples.setdefault(fn.pci, deque(maxlen=self.history))
            dq.append((now, read_counters_sysfs(fn)))
            self.queues[fn.pci] = read_queue_stats(fn)
        for gone in set(self.samples) - seen:
            del self.samples[gone]
            self.queues.pop(gone, None)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for pci, dq in self.samples.items():
            last = dq[-1][1] if dq else {}
            rates = {}
            if len(dq) >= 2:
                (t0, a), (t1, b) = dq[0], dq[-1]
                dt = max(t1 - t0, 1e-9)
                rates = {k + "_per_s": (b.get(k, 0) - a.get(k, 0)) / dt for k in RATE_KEYS}
            out[pci] = {"counters": last, "rates": rates, "queues": self.queues.get(pci, []),
                        "samples": len(dq)}
        return out
