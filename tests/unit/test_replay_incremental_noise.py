"""The noise model kept incrementally for a year's replay (issue 26) is the very model the plain reading
gives: `noise.extend` is `update` run by run, `noise.fit` its plain grid search, and a core's seed model for a
regression notice is `estimate` of the seed residuals, however the history and its trims went."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect import noise
from monitor.detect.core import _Core
from monitor.detect.detector import RunPoint, SeriesState
from monitor.detect.settings import Detection

_RESIDUALS = st.lists(
    st.one_of(st.floats(min_value=-3.0, max_value=3.0), st.sampled_from([0.0, 0.5, -0.5])), max_size=400
)


@given(_RESIDUALS, _RESIDUALS)
def test_extend_is_update_run_by_run_from_any_model(before: list[float], residuals: list[float]) -> None:
    plain = noise.NoiseModel()
    for value in before + residuals:
        noise.update(plain, value)
    extended = noise.NoiseModel()
    for value in before:
        noise.update(extended, value)
    noise.extend(extended, residuals)
    assert extended.to_json() == plain.to_json()
    assert noise.estimate(before + residuals).to_json() == plain.to_json()


def _plain_fit(ratio_short: float, ratio_long: float) -> tuple[float, float]:
    """noise.fit as first written: every variance ratio from variance_ratio and ar_ratio."""
    if ratio_long <= 1.0:
        return 0.0, 0.0
    short, long_ = noise.BLOCKS
    log_short, log_long = math.log(ratio_short), math.log(ratio_long)

    def error(phi: float) -> tuple[float, float, float]:
        share = min(1.0, (ratio_long - 1.0) / (noise.ar_ratio(phi, long_) - 1.0))
        miss = (math.log(noise.variance_ratio(share, phi, short)) - log_short) ** 2 + (
            math.log(noise.variance_ratio(share, phi, long_)) - log_long
        ) ** 2
        return miss, share, phi

    coarse = min(error(phi) for phi in noise._PHI_COARSE)
    fine = [min(noise._PHI_MAX, max(0.005, coarse[2] + step / 400.0)) for step in range(-10, 11)]
    best = min([coarse, *(error(phi) for phi in fine)])
    return best[1], best[2]


@given(st.floats(min_value=1.0, max_value=noise.G_MAX), st.floats(min_value=0.5, max_value=noise.G_MAX))
def test_fit_from_the_cached_grid_is_the_plain_fit(ratio_short: float, ratio_long: float) -> None:
    assert noise.fit(ratio_short, ratio_long) == _plain_fit(ratio_short, ratio_long)


@given(
    st.floats(min_value=1.0, max_value=noise.G_MAX),
    st.floats(min_value=0.5, max_value=noise.G_MAX),
    st.floats(min_value=-1.0, max_value=2.0),
)
def test_fit_is_the_plain_fit_from_any_point_worked_out_first(
    ratio_short: float, ratio_long: float, near: float
) -> None:
    # `near` (the model's last phi) only says which grid point's miss bounds the others first: any phi, in range or not.
    assert noise.fit(ratio_short, ratio_long, near=near) == _plain_fit(ratio_short, ratio_long)


@pytest.mark.parametrize("near", [0.0, 0.5, 0.9, 0.995])
def test_fit_is_the_plain_fit_where_the_measured_ratios_are_a_grid_points_own(near: float) -> None:
    # A measured pair that is exactly some grid point's pair has a miss of 0 there (the bound of every other point is
    # then its margin alone), and pairs about as far from two points can tie: each against the plain search.
    pairs = [
        (noise.variance_ratio(share, phi, noise.BLOCKS[0]), noise.variance_ratio(share, phi, noise.BLOCKS[1]))
        for phi in (*noise._PHI_COARSE[::3], 0.9025, 0.5 + 1 / 800)
        for share in (0.1, 0.5, 0.999, 1.0)
    ]
    pairs += [
        (short, long_) for short in (1.0, 1.2, 2.0, 50.0, noise.G_MAX) for long_ in (1.0001, 1.5, 4.0, noise.G_MAX)
    ]
    for ratio_short, ratio_long in pairs:
        assert noise.fit(ratio_short, ratio_long, near=near) == _plain_fit(ratio_short, ratio_long)


def _runs(seed: int, *, days: int, gaps: list[tuple[int, int]], failed_share: float) -> list[RunPoint]:
    """5-minute runs of a daily cycle with lognormal noise, without the runs in `gaps` (first run, runs)
    and with a share of failed runs."""
    rng = random.Random(seed)
    start = datetime(2025, 3, 3, tzinfo=UTC)
    missing = {i for first, length in gaps for i in range(first, first + length)}
    points = []
    for i in range(days * 288):
        if i in missing:
            continue
        at = start + timedelta(minutes=5 * i)
        if rng.random() < failed_share:
            points.append(RunPoint(at, None, error="timeout", ok=0, errors=3))
            continue
        level = 400.0 * (1 + 0.2 * math.sin(2 * math.pi * i / 288)) * math.exp(rng.gauss(0, 0.2))
        points.append(RunPoint(at, level, ok=3, errors=0))
    return points


@settings(max_examples=4, deadline=None)
@given(
    st.integers(0, 1000),
    st.lists(st.tuples(st.integers(0, 30 * 288), st.integers(1, 600)), max_size=4),
    st.sampled_from([0.0, 0.01, 0.2]),
    st.lists(st.integers(0, 400), min_size=1, max_size=6),
)
def test_a_cores_seed_noise_model_is_the_estimate_of_its_seed_residuals(
    seed: int, gaps: list[tuple[int, int]], failed_share: float, back: list[int]
) -> None:
    # Asked now and then over 30 days (across trims, which move the first run the days count from), and
    # at several ends each time, as regression notices of different lengths ask: each answer is the plain one.
    core = _Core(Detection(noise_model=False).rules(), None)
    state = SeriesState()
    asked = 0
    for number, point in enumerate(_runs(seed, days=30, gaps=gaps, failed_share=failed_share)):
        core.step(state, point)
        if number % 397 != 0:
            continue
        for runs in back:
            end = max(0, len(core.times) - runs)
            kept = core._seed_noise(end)
            residuals = core._seed_residuals(end)
            if not residuals:
                assert kept is None
                continue
            assert kept is not None
            assert kept.to_json() == noise.estimate(residuals).to_json()
            asked += 1
    assert asked > 0
