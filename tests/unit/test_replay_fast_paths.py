"""The detector's fast paths (issue 26: a year's replay in under 2 s) compute the very floats the plain
readings do: the golden file of test_detect_default_unchanged.py needs the same bits, not nearly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.detect import noise
from monitor.detect.stats import mad_sigma, mad_sigma_sorted, median

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
