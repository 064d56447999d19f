"""The one interpolated quantile: probe summaries, stored runs, the status pages and the benchmarks
all read their percentiles here. Pure."""

from __future__ import annotations

import itertools
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


def mixture_quantile(sketches: Sequence[tuple[float, Sequence[tuple[float, float]]]], q: float) -> float | None:
    """The q-quantile of a mixture of distributions each known only by a few of its quantiles: how
    hours of hourly rollups (their min, p10, p50, p90, p99 and max) merge into one distribution.

    `sketches`: (weight, knots) per part, weight its sample count, knots (probability, value) pairs in
    increasing order of both. Each part's CDF is taken as linear between its knots (its mass below the
    first knot sits on that knot, above the last on the last), the parts are mixed by weight, and the
    mixture's CDF is inverted. A part whose knots all hold one value is a point mass there. Exact where
    the parts' distributions are linear between their knots; an approximation otherwise, measured
    against raw samples in docs/benchmarks.md. None when there is no weight."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, got {q}")
    # The mixture's CDF is piecewise linear: a sweep over the knots in value order, keeping its slope
    # (the sum of the segments open at that value) and the point masses, finds where it crosses q.
    events: list[tuple[float, float, float]] = []  # (value, slope change, point mass)
    total = 0.0
    for weight, knots in sketches:
        if weight <= 0 or not knots:
            continue
        total += weight
        first_p, first_v = knots[0]
        last_p, last_v = knots[-1]
        events.append((first_v, 0.0, weight * first_p))
        events.append((last_v, 0.0, weight * (1.0 - last_p)))
        for (p0, v0), (p1, v1) in itertools.pairwise(knots):
            mass = weight * (p1 - p0)
            if v1 > v0:
                slope = mass / (v1 - v0)
                events.append((v0, slope, 0.0))
                events.append((v1, -slope, 0.0))
            else:
                events.append((v0, 0.0, mass))
    if total <= 0:
        return None
    events.sort()
    target = q * total
    if target <= 0:
        return events[0][0]  # the smallest value any part holds
    cumulative = slope = 0.0
    previous = events[0][0]
    for value, change, mass in events:
        if value > previous:
            rising = slope * (value - previous)
            if slope > 0 and cumulative + rising >= target and cumulative < target:
                return previous + (target - cumulative) / slope
            cumulative += rising
            previous = value
        if mass > 0 and cumulative < target <= cumulative + mass:
            return value
        cumulative += mass
        slope = max(0.0, slope + change)
    return events[-1][0]
