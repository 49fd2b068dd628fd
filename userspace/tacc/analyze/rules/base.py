"""What every rule shares: the finding, the registry, the common thresholds and helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tacc.analyze.data import Data

if TYPE_CHECKING:
    from tacc.analyze.rules import Thresholds


@dataclass
class CommonThresholds:
    severity_high: float = 0.10  # time lost / the finding's active span
    severity_medium: float = 0.03
    max_ranges: int = 50

    def update(self, kv: dict[str, Any]) -> None:
        for k, v in kv.items():
            if k not in self.__dataclass_fields__:
                raise KeyError(k)
            typ = type(getattr(self, k))
            setattr(self, k, typ(v))


@dataclass
class Finding:
    rule: str
    title: str
    time_ranges: list[list[int]]
    evidence: dict[str, Any]
    time_lost_ns: int
    suggestion: str
    functions: list[str] = field(default_factory=list)
    severity: str = "low"
    id: str = ""
    node: str = ""
    # set by the engine: the finding's active span (first to last device or API activity
    # of its functions, widened to its own time ranges), time lost over it (share, what
    # the severity is judged on, at most 1) and over the whole capture (capture_share)
    active_range: list[int] = field(default_factory=list)
    active_span_ns: int = 0
    share: float = 0.0
    capture_share: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Rule = Callable[[Data, "Thresholds"], list["Finding"]]


def clip_ranges(d: Data, starts: np.ndarray, ends: np.ndarray, th: Thresholds) -> list[list[int]]:
    s = np.clip(starts, d.t0, d.t1)
    e = np.clip(ends, d.t0, d.t1)
    o = np.argsort(-(e - s), kind="stable")[: th.max_ranges]
    o = np.sort(o)
    return [[int(a), int(b)] for a, b in zip(s[o], e[o], strict=True) if b >= a]


def links_of(d: Data) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in d.functions:
        out.setdefault(f.pf, []).append(f.fid)
    return out


def top_tags(d: Data, tags: np.ndarray, weight: np.ndarray, n: int = 5) -> list[str]:
    tags = tags[tags != 0]
    if len(tags) == 0:
        return []
    u, inv = np.unique(tags, return_inverse=True)
    w = np.bincount(inv, weights=weight[: len(inv)] if len(weight) == len(tags) else None)
    o = np.argsort(-w)[:n]
    return [f"0x{int(t):x}" for t in u[o]]


def window_edges(d: Data, th: Thresholds) -> np.ndarray:
    n = int(np.ceil(d.span / th.window_ns))
    return d.t0 + np.arange(n + 1, dtype=np.int64) * th.window_ns


def direction_mask(d: Data, fids: list[int], op: int) -> np.ndarray:
    c = d.cmds
    return np.isin(c.fid, fids) & (c.opcode == op)
