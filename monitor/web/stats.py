"""The numbers of the compare view, as pure functions: quantiles, the median's bootstrap interval,
the bootstrap interval of a difference of medians, and the prefill slope.

The bootstrap distribution of a sample median is known exactly (Efron 1982): the resampled median
is at or below the j-th order statistic when at least `m` of the `n` draws are, a binomial tail. So
the interval needs no resampling loop (a page over 7 days of samples stays fast), and it is the
same on every call. For a difference, medians are drawn from the two exact distributions with a
fixed seed, so the compare page, the API and the report give identical numbers.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
DIFFERENCE_DRAWS = 4000
_EXACT_BINOMIAL_UP_TO = 80


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics (PostgreSQL's percentile_cont)."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _binomial_at_least(n: int, p: float, m: int) -> float:
    """P(Binomial(n, p) >= m)."""
    if p <= 0:
        return 0.0 if m > 0 else 1.0
    if p >= 1:
        return 1.0
    if n <= _EXACT_BINOMIAL_UP_TO:
        return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(m, n + 1))
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return 0.5 * math.erfc((m - 0.5 - mean) / (sd * math.sqrt(2)))


def median_bootstrap_cdf(n: int) -> list[float]:
    """cdf[j-1] = P(bootstrap median <= x_(j)) for a sample of n sorted values (lower middle for even n)."""
    m = (n + 1) // 2
    return [_binomial_at_least(n, j / n, m) for j in range(1, n + 1)]


def _pick(sorted_values: Sequence[float], cdf: Sequence[float], u: float) -> float:
    return sorted_values[min(bisect.bisect_left(cdf, u), len(sorted_values) - 1)]


def median_interval(sorted_values: Sequence[float], cdf: Sequence[float] | None = None) -> tuple[float, float] | None:
    """The 95% bootstrap (percentile) interval of the median."""
    if not sorted_values:
        return None
    cdf = cdf if cdf is not None else median_bootstrap_cdf(len(sorted_values))
    tail = (1 - CONFIDENCE) / 2
    return _pick(sorted_values, cdf, tail), _pick(sorted_values, cdf, 1 - tail)


@dataclass(frozen=True, slots=True)
class Difference:
    """median(a) - median(b), its 95% bootstrap interval, and whether the interval excludes zero."""

    difference_ms: float
    low_ms: float
    high_ms: float

    @property
    def significant(self) -> bool:
        return self.low_ms > 0 or self.high_ms < 0


def median_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    a_cdf: Sequence[float] | None = None,
    b_cdf: Sequence[float] | None = None,
    seed: int = 0,
) -> Difference | None:
    """Both inputs sorted. Draws from the exact bootstrap distributions of both medians (fixed seed)."""
    if not a or not b:
        return None
    a_cdf = a_cdf if a_cdf is not None else median_bootstrap_cdf(len(a))
    b_cdf = b_cdf if b_cdf is not None else median_bootstrap_cdf(len(b))
    rng = random.Random(seed)
    draws = sorted(_pick(a, a_cdf, rng.random()) - _pick(b, b_cdf, rng.random()) for _ in range(DIFFERENCE_DRAWS))
    tail = (1 - CONFIDENCE) / 2
    point = (quantile(a, 0.5) or 0.0) - (quantile(b, 0.5) or 0.0)
    return Difference(point, draws[int(tail * (DIFFERENCE_DRAWS - 1))], draws[int((1 - tail) * (DIFFERENCE_DRAWS - 1))])


@dataclass(frozen=True, slots=True)
class Slope:
    """TTFT against prompt tokens, least squares: ms per 1,000 prompt tokens and the intercept in ms."""

    ms_per_1k_tokens: float
    intercept_ms: float
    points: int


def prefill_slope(points: Sequence[tuple[float, float]]) -> Slope | None:
    """`points` are (prompt tokens, TTFT ms); None without two distinct prompt sizes."""
    n = len(points)
    if n < 2:
        return None
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return Slope(slope * 1000, mean_y - slope * mean_x, n)
