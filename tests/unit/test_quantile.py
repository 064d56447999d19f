"""The one interpolated quantile (monitor/quantile.py) that probe summaries, stored runs, the status
pages and the benchmarks share: its table of cases, its one empty-input behaviour, and that it gives
what each of the three copies it replaced gave."""

from __future__ import annotations

import math
import random

import pytest

from monitor.quantile import quantile


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.0, 10.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.5, 30.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 1.0, 50.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 0.25, 20.0),
        ([50.0, 10.0, 40.0, 20.0, 30.0], 0.25, 20.0),  # sorts unless told the values are sorted
        ([10.0, 20.0], 0.75, 17.5),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([7.0], 0.9, 7.0),
        ([3, 1, 2], 0.5, 2.0),
    ],
)
def test_quantiles_interpolate_between_order_statistics(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == pytest.approx(expected)
    assert isinstance(quantile(values, q), float)


def test_no_values_have_no_quantile() -> None:
    assert quantile([], 0.5) is None
    assert quantile([], 0.9, presorted=True) is None


@pytest.mark.parametrize("q", [-0.01, 1.5, 90.0, math.nan])
def test_a_quantile_outside_zero_to_one_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        quantile([1.0, 2.0], q)


def _percent_rank(values: list[float], percent: float) -> float:
    """The probe's former `percentile(values, percent)` (rank from a percentage)."""
    data = sorted(values)
    rank = (len(data) - 1) * percent / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def _fraction_rank(values: list[float], q: float) -> float:
    """The detector's and the pages' former `quantile(values, q)` (rank from a fraction)."""
    data = sorted(values)
    position = q * (len(data) - 1)
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 101, 1000])
@pytest.mark.parametrize("percent", [10, 50, 90, 95, 99])
def test_it_gives_what_the_three_copies_gave(n: int, percent: int) -> None:
    rng = random.Random(n * 100 + percent)
    values = [rng.lognormvariate(6, 0.5) for _ in range(n)]
    got = quantile(values, percent / 100)
    assert got == _fraction_rank(values, percent / 100)
    # The percentage form picks the same order statistics; the fraction 0.9 is not exactly 90/100,
    # so the interpolation may differ in the last bits.
    assert got == pytest.approx(_percent_rank(values, percent), rel=1e-12)
