"""The numbers of the compare view, as pure functions: the median's bootstrap interval,
the bootstrap interval of a difference of medians, and the prefill slope.

The bootstrap distribution of a sample median is known exactly (Efron 1982): the resampled median
is at or below the j-th order statistic when at least `m` of the `n` draws are, a binomial tail. So
the interval needs no resampling loop (a page over 7 days of samples stays fast), and it is the
same on every call. A difference of two medians gets the normal interval from their exact bootstrap
variances. The compare page, the API and the report give identical numbers.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from monitor.quantile import quantile

CONFIDENCE = 0.95
Z_95 = 1.959963984540054
_EXACT_BINOMIAL_UP_TO = 80


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
    if n <= _EXACT_BINOMIAL_UP_TO:
        return [_binomial_at_least(n, j / n, m) for j in range(1, n + 1)]
    # Beyond 10 standard deviations (sqrt(n)/2 order statistics each) the tail is below 1e-23.
    reach = math.ceil(5 * math.sqrt(n))
    low, high = max(1, m - reach), min(n, m + reach)
    middle = [_binomial_at_least(n, j / n, m) for j in range(low, high + 1)]
    return [0.0] * (low - 1) + middle + [1.0] * (n - high)


def _pick(sorted_values: Sequence[float], cdf: Sequence[float], u: float) -> float:
    """The value at cumulative probability `u`."""
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


def median_variance(sorted_values: Sequence[float], cdf: Sequence[float] | None = None) -> float:
    """The exact bootstrap variance of the median: the variance of its bootstrap distribution."""
    cdf = cdf if cdf is not None else median_bootstrap_cdf(len(sorted_values))
    if len(cdf) != len(sorted_values):
        raise ValueError(f"{len(sorted_values)} values but a cdf of {len(cdf)}")
    # Only order statistics with a weight count (the cdf is 0 below them and 1 above): the same sums.
    low = max(0, bisect.bisect_right(cdf, 0.0) - 1)
    high = min(len(cdf), bisect.bisect_left(cdf, 1.0) + 1)
    mean = square = 0.0
    previous = cdf[low - 1] if low else 0.0
    for value, cumulative in zip(sorted_values[low:high], cdf[low:high], strict=True):
        weight = cumulative - previous
        previous = cumulative
        mean += weight * value
        square += weight * value * value
    return max(0.0, square - mean * mean)


def median_difference(
    a: Sequence[float], b: Sequence[float], *, a_variance: float | None = None, b_variance: float | None = None
) -> Difference | None:
    """median(a) - median(b), both sorted, with a 95% interval from the two medians' exact bootstrap
    variances (normal approximation of the difference)."""
    if not a or not b:
        return None
    a_variance = a_variance if a_variance is not None else median_variance(a)
    b_variance = b_variance if b_variance is not None else median_variance(b)
    point = (quantile(a, 0.5, presorted=True) or 0.0) - (quantile(b, 0.5, presorted=True) or 0.0)
    half = Z_95 * math.sqrt(a_variance + b_variance)
    return Difference(point, point - half, point + half)


# Token counts within this factor of each other are one prompt size: cache-busting prefixes and chat
# templates move a prompt by a few tokens, which is no second size to fit a slope through.
SIZE_FACTOR = 1.25


@dataclass(frozen=True, slots=True)
class Slope:
    """TTFT against prompt tokens, least squares: ms per 1,000 prompt tokens with its 95% interval, and
    the intercept in ms. Without a fit worth ranking (one prompt size, or a slope not significantly
    different from zero) the slope and intercept are None and `reason` says why."""

    ms_per_1k_tokens: float | None
    intercept_ms: float | None
    points: int
    sizes: int  # distinct prompt sizes measured (see SIZE_FACTOR)
    ci_low: float | None = None  # the slope's 95% interval, ms per 1,000 tokens
    ci_high: float | None = None
    reason: str | None = None

    @property
    def ranked(self) -> bool:
        return self.ms_per_1k_tokens is not None


def prompt_sizes(tokens: Sequence[float]) -> list[float]:
    """The distinct prompt sizes among token counts: each the smallest count of its cluster."""
    sizes: list[float] = []
    for value in sorted(tokens):
        if not sizes or value > sizes[-1] * SIZE_FACTOR:
            sizes.append(value)
    return sizes


def prefill_slope(points: Sequence[tuple[float, float]]) -> Slope:
    """`points` are (prompt tokens, TTFT ms). A slope needs two prompt sizes and must differ from zero
    at 95% (its standard error from the residuals); otherwise it is None, with the reason."""
    n = len(points)
    xs = [x for x, _ in points]
    sizes = prompt_sizes(xs)
    if len(sizes) < 2:
        reason = (
            "no prompt token counts"
            if not sizes
            else f"measured at one prompt size ({sizes[0]:,.0f} tokens); a slope needs two or more"
        )
        return Slope(None, None, n, len(sizes), reason=reason)
    ys = [y for _, y in points]
    mean_x, mean_y = math.fsum(xs) / n, math.fsum(ys) / n
    dx = [x - mean_x for x in xs]
    sxx = math.fsum(map(operator.mul, dx, dx))
    slope = math.fsum(map(operator.mul, dx, ys)) / sxx
    intercept = mean_y - slope * mean_x
    residual = math.fsum((y - intercept - slope * x) ** 2 for x, y in points)
    half = Z_95 * math.sqrt(residual / (n - 2) / sxx) * 1000 if n > 2 else math.inf
    low, high = slope * 1000 - half, slope * 1000 + half
    if not (low > 0 or high < 0):
        interval = "unbounded" if math.isinf(half) else f"{low:,.0f} to {high:,.0f} ms / 1K tokens"
        return Slope(None, None, n, len(sizes), reason=f"not significant (95% interval {interval})")
    return Slope(slope * 1000, intercept, n, len(sizes), ci_low=low, ci_high=high)
