"""Clock models: device ticks -> CLOCK_MONOTONIC, and capture -> capture alignment.

The driver pairs the device clock with CLOCK_MONOTONIC by bracketed reads
(mono_before, devclk, mono_after).  We fit ``mono = offset + drift * ticks`` by least
squares on the bracket midpoints; the stated error bound is half the widest bracket
plus the largest fit residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CaptureError


@dataclass(frozen=True)
class LinearClock:
    """y = y0 + drift * (x - x0), vectorised; x and y are integers (ticks or ns)."""

    x0: int
    y0: int
    drift: float
    residual_rms_ns: float = 0.0
    residual_max_ns: float = 0.0
    bracket_ns: float = 0.0  # half the widest bracket
    npairs: int = 0

    @property
    def bound_ns(self) -> float:
        return self.bracket_ns + self.residual_max_ns

    def convert(self, x: np.ndarray | int) -> np.ndarray:
        dx = (np.asarray(x, dtype=np.uint64).astype(np.int64) - np.int64(self.x0)).astype(
            np.float64
        )
        return np.int64(self.y0) + np.rint(dx * self.drift).astype(np.int64)

    def invert(self, y: np.ndarray | int) -> np.ndarray:
        dy = (np.asarray(y, dtype=np.int64) - np.int64(self.y0)).astype(np.float64)
        return np.int64(self.x0) + np.rint(dy / self.drift).astype(np.int64)

    def to_json(self) -> dict[str, float | int]:
        return {
            "x0": int(self.x0), "y0": int(self.y0), "drift": self.drift,
            "residual_rms_ns": self.residual_rms_ns, "residual_max_ns": self.residual_max_ns,
            "bracket_ns": self.bracket_ns, "bound_ns": self.bound_ns, "pairs": self.npairs,
        }


def fit_pairs(
    x: np.ndarray, before: np.ndarray, after: np.ndarray, nominal_drift: float, what: str
) -> LinearClock:
    """Least-squares fit of bracket midpoints against x (raw ticks)."""
    x = np.asarray(x, dtype=np.uint64)
    before = np.asarray(before, dtype=np.int64)
    after = np.asarray(after, dtype=np.int64)
    ok = after >= before
    x, before, after = x[ok], before[ok], after[ok]
    if len(x) == 0:
        raise CaptureError(f"{what}: no clock-sync pairs to convert device time")
    mid2 = before + after  # 2 * midpoint, exact in int64
    x0 = int(x[0])
    y0 = int(mid2[0] // 2)
    dx = (x.astype(np.int64) - np.int64(x0)).astype(np.float64)
    dy = (mid2 - 2 * np.int64(y0)).astype(np.float64) / 2.0
    half = (after - before).astype(np.float64) / 2.0
    if len(x) == 1 or np.ptp(dx) == 0:
        drift = nominal_drift
        off = float(np.mean(dy - drift * dx))
    else:
        # weight by bracket tightness (narrow brackets are better measurements)
        w = 1.0 / np.maximum(half, 1.0)
        mx = np.average(dx, weights=w)
        my = np.average(dy, weights=w)
        var = np.average((dx - mx) ** 2, weights=w)
        drift = float(np.average((dx - mx) * (dy - my), weights=w) / var)
        off = float(my - drift * mx)
    res = dy - (off + drift * dx)
    return LinearClock(
        x0=x0,
        y0=y0 + int(round(off)),
        drift=drift,
        residual_rms_ns=float(np.sqrt(np.mean(res**2))),
        residual_max_ns=float(np.max(np.abs(res))),
        bracket_ns=float(np.max(half)),
        npairs=int(len(x)),
    )


def compose(outer: LinearClock, inner: LinearClock) -> LinearClock:
    """outer(inner(x)) as one linear clock."""
    y0 = int(outer.convert(np.array([inner.y0], dtype=np.int64).view(np.uint64))[0])
    return LinearClock(
        x0=inner.x0, y0=y0, drift=outer.drift * inner.drift,
        residual_rms_ns=float(np.hypot(outer.residual_rms_ns, inner.residual_rms_ns)),
        residual_max_ns=outer.residual_max_ns + inner.residual_max_ns,
        bracket_ns=outer.bracket_ns + inner.bracket_ns,
        npairs=min(outer.npairs, inner.npairs),
    )


IDENTITY = LinearClock(x0=0, y0=0, drift=1.0)
