"""The one interpolated quantile: probe summaries, stored runs, the status pages and the benchmarks
all read their percentiles here. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """The q-quantile (0..1) of `values`, interpolating linearly between order statistics (PostgreSQL's
    `percentile_cont`, numpy's default). None when there are no values: a summary of nothing is missing,
    not zero. ValueError when q is outside 0..1."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, got {q}")
    if not values:
        return None
    data = values if presorted else sorted(values)
    rank = (len(data) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (rank - low))
