"""The one interpolated quantile (monitor/quantile.py) that probe summaries, stored runs, the status
pages and the benchmarks share: its table of cases, its one empty-input behaviour, and that it gives
what each of the three copies it replaced gave."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.quantile import mixture_quantile, quantile


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


# ---------------------------------------------------------------- hours merged: mixture_quantile


def _knots(values: list[float]) -> list[tuple[float, float]]:
    data = sorted(values)
    return [(p, quantile(data, p, presorted=True) or 0.0) for p in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)]


def test_one_part_gives_back_its_own_quantiles() -> None:
    knots = [(0.0, 100.0), (0.1, 120.0), (0.5, 200.0), (0.9, 300.0), (0.99, 450.0), (1.0, 500.0)]
    for p, value in knots:
        assert mixture_quantile([(30, knots)], p) == pytest.approx(value)
    assert mixture_quantile([(30, knots)], 0.3) == pytest.approx(160.0)  # linear between p10 and p50


def test_parts_mix_by_their_weight() -> None:
    low, high = [(0.0, 0.0), (1.0, 10.0)], [(0.0, 10.0), (1.0, 20.0)]
    assert mixture_quantile([(1, low), (1, high)], 0.5) == pytest.approx(10.0)
    assert mixture_quantile([(1, low), (3, high)], 0.25) == pytest.approx(10.0)
    assert mixture_quantile([(1, low), (3, high)], 0.625) == pytest.approx(15.0)
    assert mixture_quantile([(0, low), (3, high)], 0.5) == pytest.approx(15.0)  # no weight, no say


def test_an_hour_of_one_value_is_a_point_mass() -> None:
    single = [(0.0, 42.0), (0.5, 42.0), (1.0, 42.0)]
    assert mixture_quantile([(5, single)], 0.0) == 42.0
    assert mixture_quantile([(5, single)], 0.7) == 42.0
    spread = [(0.0, 0.0), (1.0, 100.0)]
    assert mixture_quantile([(1, single), (1, spread)], 0.5) == pytest.approx(42.0)


def test_nothing_to_merge_is_none_and_a_bad_q_is_refused() -> None:
    assert mixture_quantile([], 0.5) is None
    assert mixture_quantile([(0, [(0.0, 1.0), (1.0, 2.0)])], 0.5) is None
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        mixture_quantile([(1, [(0.0, 1.0), (1.0, 2.0)])], 1.5)


@given(
    hours=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=60),
            st.lists(st.floats(min_value=1.0, max_value=1e5), min_size=1, max_size=40),
        ),
        min_size=1,
        max_size=30,
    ),
    q=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_merged_quantile_is_monotone_and_within_the_hours(hours: list[tuple[int, list[float]]], q: float) -> None:
    parts = [(weight, _knots(values)) for weight, values in hours]
    found = mixture_quantile(parts, q)
    assert found is not None
    lowest = min(min(values) for _, values in hours)
    highest = max(max(values) for _, values in hours)
    assert lowest - 1e-6 <= found <= highest + 1e-6
    above = mixture_quantile(parts, min(1.0, q + 0.05))
    assert above is not None and above >= found - 1e-6 * max(1.0, abs(found))


def test_hours_of_lognormal_samples_merge_within_two_percent_of_the_pooled_median_and_p90() -> None:
    """200 hours of 30 samples each, hours wandering (sigma 0.1) around a common level: the merged
    median and p90 against the quantiles of all 6,000 samples pooled (the error the compare view's
    long ranges carry; docs/api.md)."""
    rng = random.Random(3)
    parts, pooled = [], []
    for _hour in range(200):
        level = rng.gauss(0.0, 0.1)
        values = [300.0 * rng.lognormvariate(level, 0.3) for _ in range(30)]
        pooled += values
        parts.append((30, _knots(values)))
    for q in (0.5, 0.9):
        merged, exact = mixture_quantile(parts, q), quantile(pooled, q)
        assert merged is not None and exact is not None
        assert merged == pytest.approx(exact, rel=0.02)
