"""Order statistics for summaries. Pure; medians and percentiles, never means of latencies."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        return None
    data = values if presorted else sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    frac = rank - low
    return float(data[low] + (data[high] - data[low]) * frac)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)
