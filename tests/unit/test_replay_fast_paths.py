"""The detector's fast paths (issue 26: a year's replay in under 2 s) compute the very floats the plain
readings do: the golden file of test_detect_default_unchanged.py needs the same bits, not nearly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.detect import noise
from monitor.detect.core import _Core
from monitor.detect.rules import Rules
from monitor.detect.stats import mad_sigma, mad_sigma_sorted, median
from tests.support.series import make_series

# Few distinct values as well as many, so ties and deviations of zero come up.
_VALUES = st.lists(
    st.one_of(st.sampled_from([-0.5, 0.0, 0.1, 0.2, 1.0]), st.floats(min_value=-1e3, max_value=1e3)),
    min_size=1,
    max_size=60,
)


@given(_VALUES, st.one_of(st.none(), st.floats(min_value=-2e3, max_value=2e3), st.integers(0, 59)))
def test_mad_sigma_of_sorted_values_is_the_same_float_as_mad_sigma(values: list[float], where: float | None) -> None:
    # The centre: the median (as the baselines use it), any number, or one of the values.
    data = sorted(values)
    if where is None:
        center = median(data)
    elif isinstance(where, int):
        center = data[where % len(data)]
    else:
        center = where
    assert mad_sigma_sorted(data, center=center) == mad_sigma(data, center=center)


def test_mad_sigma_of_no_values_is_refused() -> None:
    with pytest.raises(ValueError):
        mad_sigma_sorted([], center=0.0)


@given(
    st.lists(st.floats(min_value=-3.0, max_value=3.0), max_size=120),
    st.lists(st.integers(0, 119), max_size=4),
    st.integers(1, 8),
)
def test_the_jump_spread_is_every_pair_of_neighbouring_windows_medians(
    values: list[float], holes: list[int], window: int
) -> None:
    for hole in holes:  # runs without a value
        if hole < len(values):
            values[hole] = math.nan
    # The plain reading: each pair sliced, searched for nan, its two medians taken.
    jumps = []
    for start in range(len(values) - 2 * window + 1):
        pair = values[start : start + 2 * window]
        if not any(math.isnan(value) for value in pair):
            jumps.append(median(pair[window:]) - median(pair[:window]))
    expected = mad_sigma(jumps) if len(jumps) >= noise.JUMP_PAIRS_PER_RUN * window else None
    assert noise.jump_spread(values, window) == expected


def test_the_jump_tests_kept_window_medians_are_those_of_the_history_asked_for() -> None:
    # A core loaded with four days of a series with failed runs (nan residuals), asked as the jump test
    # asks: the day before a run, sliding by one run or more, backwards, with another window, seasonal
    # residuals or log TTFTs.
    core = _Core(Rules(noise_model=True), None)
    for point in make_series(2, days=4, probes=3, phi=0.9):
        core.append(point)
    count = len(core.logs)
    asked = [(end, 5, True) for end in range(count - 60, count)]
    asked += [(count - 200, 5, True), (count - 3, 5, True), (count - 2, 6, True), (count - 1, 5, False)]
    asked += [(end, 5, False) for end in range(count - 40, count, 3)]
    for end, window, seasonal in asked:
        low = max(0, end - noise.JUMP_HISTORY_RUNS)
        history = core._residuals_between(low, end) if seasonal else core.logs[low:end]
        kept = core._jump_medians(history, low, window, seasonal)
        expected = noise.window_medians(history, window)
        assert len(kept) == len(expected)
        assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(kept, expected, strict=True))
        assert noise.jump_spread(history, window, kept) == noise.jump_spread(history, window)
