"""Robust statistics for the detector. Pure; medians and MADs, never means.

Latency is compared in log space: a regression multiplies TTFT, lognormal noise becomes normal, and
"20% slower" is the same distance whether the baseline is 80 ms or 8 s.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from operator import mul, sub

# MAD x this estimates the standard deviation of normal data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.482602218505602


def median(values: Sequence[float], *, presorted: bool = False) -> float:
    """The median. ValueError when empty."""
    if not values:
        raise ValueError("median of no values")
    data = values if presorted else sorted(values)
    half = len(data) // 2
    if len(data) % 2:
        return float(data[half])
    return (data[half - 1] + data[half]) / 2.0


def mad_sigma(values: Sequence[float], *, center: float | None = None) -> float:
    """Median absolute deviation from `center` (default: the median), scaled to estimate sigma."""
    mid = median(values) if center is None else center
    return MAD_TO_SIGMA * median([abs(v - mid) for v in values])


def mad_sigma_sorted(data: Sequence[float], *, center: float, near: list[int] | None = None) -> float:
    """`mad_sigma(data, center=center)` for `data` sorted ascending (no nan), in O(log n) instead of a
    list and a sort: the detector asks it of a day of reference runs after most runs.

    The deviations |v - center| of the values below `center` fall as v rises and those of the rest rise,
    so the deviations are two sorted runs and their median a selection from them. Each deviation is
    computed as mad_sigma computes it, so the result is the same float.

    `near`: a one-item list holding how many of the smallest deviations came from below `center` last time (the
    detector's reference slides a run at a time, so it is mostly the same or one off): tried first, and set to
    this time's. The result does not depend on it."""
    count = len(data)
    if not count:
        raise ValueError("median of no values")
    split = bisect_left(data, center)
    below, above = split, count - split  # deviations: abs(data[split - 1 - i] - center), data[split + j] - center

    def smallest(k: int) -> tuple[int, int]:
        # How many of the k + 1 smallest deviations come from those below (i) and above (k + 1 - i): binary
        # search on i, taking from below while its next deviation is smaller than the next one above.
        low = k + 1 - above if k + 1 - above > 0 else 0  # max(0, k + 1 - above), min(k + 1, below) spelt out
        high = below if below < k + 1 else k + 1
        if near is not None and low < high:
            # The search's test at the hint and beside it: its answer is the first i where the test fails.
            i = near[0]
            i = low if i < low else high - 1 if i >= high else i
            if abs(data[split - 1 - i] - center) < data[split + k - i] - center:
                low = i + 1
                if low < high and not abs(data[split - 1 - low] - center) < data[split + k - low] - center:
                    high = low
            else:
                high = i
                if i > low and abs(data[split - i] - center) < data[split + k - i + 1] - center:
                    low = i
        while low < high:
            i = (low + high) // 2
            if abs(data[split - 1 - i] - center) < data[split + k - i] - center:
                low = i + 1
            else:
                high = i
        return low, k + 1 - low

    half = count // 2
    i, j = smallest(half if count % 2 else half - 1)
    if near is not None:
        near[0] = i
    # The largest of those smallest deviations: the last taken from either side.
    if i == 0:
        mad = data[split + j - 1] - center
    elif j == 0:
        mad = abs(data[split - i] - center)
    else:
        lower, upper = abs(data[split - i] - center), data[split + j - 1] - center
        mad = upper if upper > lower else lower  # max(lower, upper)
    if not count % 2:
        # The next smallest, for the mean of the middle two: the smaller of the next on either side.
        if i == below:
            following = data[split + j] - center
        elif j == above:
            following = abs(data[split - 1 - i] - center)
        else:
            lower, upper = abs(data[split - 1 - i] - center), data[split + j] - center
            following = upper if upper < lower else lower  # min(lower, upper)
        mad = (mad + following) / 2.0
    return MAD_TO_SIGMA * mad


def median_and_sigma(values: Sequence[float]) -> tuple[float, float]:
    """(median, MAD-sigma) with one sort: the MAD is a selection from the sorted values (mad_sigma_sorted)."""
    data = sorted(values)
    mid = median(data, presorted=True)
    return mid, mad_sigma_sorted(data, center=mid)


def median_se_factor(n: int) -> float:
    """Standard error of the median of n independent values, in units of their sigma.

    The large-sample value sqrt(pi / 2n); it slightly overstates the error for small n, which errs
    towards fewer alerts.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    return 1.0 if n == 1 else math.sqrt(math.pi / (2.0 * n))


def log_ms(ms: float) -> float:
    """A positive duration in ms, in log space. ValueError for zero, negative or non-finite values."""
    if not (ms > 0.0 and math.isfinite(ms)):
        raise ValueError(f"a duration must be positive and finite, got {ms!r}")
    return math.log(ms)


def clipped_profile(
    values: Sequence[float], *, center: float, sigma: float, bound: float, block: int
) -> tuple[float, float]:
    """(mean, long-run factor) of the values standardised as (v - center) / sigma and clipped to
    +-bound, in time order.

    The mean is what a CUSUM of such values must subtract to drift down on healthy data: spikes make it
    larger than the median. The factor is how much more a sum of consecutive values varies than if
    they were independent: the standard deviation of the sums of every `block` consecutive values over
    sqrt(block) times that of the values. About 1 for independent noise, larger when load comes and
    goes; never below 1, and 1 with fewer than two blocks of values.
    """
    count = len(values)
    if count == 0 or sigma <= 0:
        return 0.0, 1.0
    low, high = center - bound * sigma, center + bound * sigma
    clipped = [((v if v < high else high) if v > low else low) for v in values]
    prefix = [0.0, *accumulate(clipped)]
    mean = prefix[-1] / count
    if block < 2 or count < 2 * block:
        return (mean - center) / sigma, 1.0
    # map() over operator's functions rather than generators: the same values summed in the same order,
    # at a fraction of the cost (the window rules ask this of a day of residuals on many runs).
    variance = (sum(map(mul, clipped, clipped)) - count * mean * mean) / (count - 1)
    if variance <= 0:
        return (mean - center) / sigma, 1.0
    sums = list(map(sub, prefix[block:], prefix))  # prefix[i + block] - prefix[i]: each block's sum
    sums_mean = sum(sums) / len(sums)
    sums_variance = (sum(map(mul, sums, sums)) - len(sums) * sums_mean * sums_mean) / (len(sums) - 1) / block
    return (mean - center) / sigma, max(1.0, math.sqrt(max(sums_variance, 0.0) / variance))


def cusum_step(total: float, value: float, *, allowance: float) -> float:
    """One step of a one-sided (upward) CUSUM: add `value` minus the `allowance`, never going below 0."""
    return max(0.0, total + value - allowance)


def pooled_factor(values: Sequence[float], *, span: int, sigma: float, bound: float, block: int) -> float:
    """The long-run factor of `values` (in time order) within consecutive windows of `span` values, the last
    ending at the end: each window's values less its own median, clipped to +-bound x sigma, then the
    variance of the sums of every `block` consecutive values over `block` times the values' variance,
    pooled over the windows; its square root, never below 1, and 1 with fewer than two blocks in a window.

    Each window's own level is left out, so a daily cycle or drift between windows does not count as
    wander, while load that comes and goes within a window does; pooled over a day of windows it is a
    steadier estimate than any one window's (`clipped_profile`)."""
    if sigma <= 0 or block < 2 or span < 2 * block:
        return 1.0
    limit = bound * sigma
    squares = sums_squares = 0.0
    count = sums_count = 0
    end = len(values)
    while end - span >= 0:
        window = values[end - span : end]
        end -= span
        center = sorted(window)[span // 2]
        clipped = [min(limit, max(-limit, v - center)) for v in window]
        mean = sum(clipped) / span
        deviations = [v - mean for v in clipped]
        squares += sum(d * d for d in deviations)
        count += span - 1
        prefix = [0.0, *accumulate(deviations)]
        sums = [prefix[i + block] - prefix[i] for i in range(span - block + 1)]
        sums_squares += sum(s * s for s in sums)
        sums_count += len(sums) - 1
    if count == 0 or sums_count <= 0 or squares <= 0:
        return 1.0
    return max(1.0, math.sqrt((sums_squares / sums_count / block) / (squares / count)))
