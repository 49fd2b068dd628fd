"""What every workload shares: the result record, device-time spans, aligned host arrays."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tacc.runtime import Context, Event, Stream

PAGE = 4096
MiB = 1 << 20
KiB = 1 << 10


@dataclass
class Result:
    workload: str
    variant: str  # "good" or "bad" (or "ref" for mlp)
    device: str
    device_ns: int  # device time from the first to the last command (timing events)
    wall_ns: int  # host CLOCK_MONOTONIC time of the measured section
    api_calls: int = 0
    jobs: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    checked: bool = False  # results compared with numpy
    max_abs_err: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    expected_findings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Span:
    """Device time across streams: timing events at the start of each stream and one
    after all of them (the last stream waits for the others)."""

    def __init__(self, ctx: Context, streams: list[Stream]) -> None:
        self.ctx = ctx
        self.streams = streams
        self.starts: list[Event] = [s.record(timing=True) for s in streams]
        self.t_wall = time.monotonic_ns()
        self.device_ns = 0
        self.wall_ns = 0

    def stop(self) -> int:
        last = self.streams[-1]
        for s in self.streams[:-1]:
            last.wait_event(s.record())
        end = last.record(timing=True)
        self.ctx.synchronize()
        self.wall_ns = time.monotonic_ns() - self.t_wall
        self.device_ns = end.device_ns - min(e.device_ns for e in self.starts)
        for e in (*self.starts, end):
            e.destroy()
        return self.device_ns


def aligned_empty(shape: int | tuple[int, ...], dtype: Any = np.float32, align: int = PAGE,
                  misalign: int = 0) -> np.ndarray:
    """A numpy array whose data starts ``misalign`` bytes past an ``align`` boundary."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.empty(n * dt.itemsize + align + misalign, np.uint8)
    off = (-raw.ctypes.data) % align + misalign
    return raw[off:off + n * dt.itemsize].view(dt).reshape(shape)


def check_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-4
                ) -> float:
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return err


def jobs_of(streams: list[Stream]) -> int:
    return sum(s.jobs_submitted for s in streams)
