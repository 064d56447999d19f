"""Robust statistics for the detector: tables of cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.detect.stats import MAD_TO_SIGMA, log_ms, mad_sigma, median, median_se_factor
from monitor.quantile import quantile


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([5.0], 5.0),
        ([1.0, 3.0], 2.0),
        ([3.0, 1.0, 2.0], 2.0),
        ([4.0, 1.0, 3.0, 2.0], 2.5),
        ([1.0, 1.0, 1.0, 1000.0], 1.0),  # one spike does not move it
        ([-2.0, 0.0, 7.0], 0.0),
    ],
)
def test_the_median_is_the_middle_value_or_the_mean_of_the_middle_two(values: list[float], expected: float) -> None:
    assert median(values) == expected


@pytest.mark.parametrize(
    ("values", "center", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], None, MAD_TO_SIGMA * 1.0),
        ([1.0, 1.0, 1.0, 1.0], None, 0.0),
        ([1.0, 2.0, 3.0, 4.0, 100.0], None, MAD_TO_SIGMA * 1.0),  # the outlier changes nothing
        ([0.0, 2.0], 0.0, MAD_TO_SIGMA * 1.0),
    ],
)
def test_mad_sigma_scales_the_median_absolute_deviation(
    values: list[float], center: float | None, expected: float
) -> None:
    assert mad_sigma(values, center=center) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 1.0), (2, math.sqrt(math.pi / 4)), (24, math.sqrt(math.pi / 48)), (288, math.sqrt(math.pi / 576))],
)
def test_the_median_standard_error_shrinks_with_the_square_root_of_n(n: int, expected: float) -> None:
    assert median_se_factor(n) == pytest.approx(expected)


@pytest.mark.parametrize(
    "call",
    [
        lambda: median([]),
        lambda: mad_sigma([]),
        lambda: median_se_factor(0),
        lambda: log_ms(0.0),
        lambda: log_ms(-3.0),
        lambda: log_ms(math.inf),
        lambda: log_ms(math.nan),
    ],
)
def test_meaningless_input_is_refused(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_log_space_turns_ratios_into_distances() -> None:
    assert log_ms(240.0) - log_ms(200.0) == pytest.approx(log_ms(2400.0) - log_ms(2000.0))


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50))
def test_the_median_lies_between_the_extremes_and_ignores_order(values: list[float]) -> None:
    mid = median(values)
    assert min(values) <= mid <= max(values)
    assert median(list(reversed(values))) == mid
    assert quantile(values, 0.5) == pytest.approx(mid, abs=1e-6)
