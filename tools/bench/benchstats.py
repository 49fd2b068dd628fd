"""Medians with 95 % confidence intervals for the interleaved benchmarks.

``median_ci``: the distribution-free order-statistics interval of a median (the ranks
k and n+1-k with Binomial(n, 1/2) coverage >= 95 %; n = 9 gives ranks 2 and 8, 96.1 %).
``ratio_ci``: a paired bootstrap of median(mode) / median(base): rounds are resampled
together (one round = one phase of every mode, run back to back), so round-to-round drift
cancels as it does in the point estimate.  Seeded: the same runs give the same interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence


def median_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high); with fewer than 6 values no order-statistics interval reaches
    95 %, and the range (min, max) is returned."""
    s = sorted(xs)
    n = len(s)
    if not n:
        return (0.0, 0.0, 0.0)
    med = statistics.median(s)
    k = 0  # largest k with P(k <= B < n-k) >= level, B ~ Binomial(n, 1/2)
    for j in range(1, n // 2 + 1):
        cover = sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2 ** n
        if cover >= level:
            k = j
        else:
            break
    if k == 0:
        return (med, s[0], s[-1])
    return (med, s[k - 1], s[n - k])


def ratio_ci(num: Sequence[float], den: Sequence[float], level: float = 0.95,
             resamples: int = 4000, seed: int = 18) -> tuple[float, float, float]:
    """(median(num) / median(den), low, high): paired bootstrap over rounds (the i-th
    value of each list is the same round); lists of unequal length are cut to the shorter."""
    n = min(len(num), len(den))
    if not n:
        return (0.0, 0.0, 0.0)
    a, b = list(num[:n]), list(den[:n])
    point = statistics.median(a) / statistics.median(b)
    rng = random.Random(seed)
    rs = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        rs.append(statistics.median(a[i] for i in idx) / statistics.median(b[i] for i in idx))
    rs.sort()
    lo = rs[int((1 - level) / 2 * resamples)]
    hi = rs[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return (point, lo, hi)
