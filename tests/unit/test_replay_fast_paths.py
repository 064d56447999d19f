"""The detector's fast paths (issue 26: a year's replay in under 2 s) compute the very floats the plain
readings do: the golden file of test_detect_default_unchanged.py needs the same bits, not nearly."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.detect import noise
from monitor.detect.core import _Core
from monitor.detect.detector import Detector
from monitor.detect.rules import Rules
from monitor.detect.settings import Detection
from monitor.detect.stats import mad_sigma, mad_sigma_sorted, median
from monitor.detect.window_sums import WindowSums, decide
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


@given(_VALUES, st.one_of(st.none(), st.integers(0, 59)), st.integers(-5, 70))
def test_mad_sigma_of_sorted_values_is_the_same_float_from_any_hint(
    values: list[float], where: int | None, hint: int
) -> None:
    # The hint: where the selection ended last time (the baseline a run earlier), here anything, in range or not.
    data = sorted(values)
    center = median(data) if where is None else data[where % len(data)]
    near = [hint]
    assert mad_sigma_sorted(data, center=center, near=near) == mad_sigma(data, center=center)
    settled = near[0]
    assert mad_sigma_sorted(data, center=center, near=near) == mad_sigma(data, center=center)
    assert near == [settled]


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


def _plain_factor_squared(values: list[float], *, low: float, high: float, block: int) -> float:
    """clipped_profile's long-run factor squared, before its floor of 1 (what WindowSums stands in for)."""
    clipped = [min(max(v, low), high) for v in values]
    count = len(clipped)
    mean = sum(clipped) / count
    variance = sum((v - mean) ** 2 for v in clipped) / (count - 1)
    sums = [sum(clipped[i : i + block]) for i in range(count - block + 1)]
    sums_mean = sum(sums) / len(sums)
    return sum((s - sums_mean) ** 2 for s in sums) / (len(sums) - 1) / block / variance


@given(
    st.lists(st.floats(min_value=-3.0, max_value=3.0), min_size=40, max_size=160, unique=True),
    st.integers(0, 30),
    st.integers(2, 12),
    st.floats(min_value=0.3, max_value=2.5),
    st.one_of(st.none(), st.integers(0, 159)),
)
def test_window_sums_give_the_clipped_long_run_factor(
    values: list[float], skip: int, block: int, bound: float, hole: int | None
) -> None:
    # Values come in a few at a time from index 5; the window is any stretch of them; a nan somewhere.
    series = list(values)
    if hole is not None:
        series.insert(min(hole, len(series)), math.nan)
    sums = WindowSums(block, start=5)
    for low in range(0, len(series), 7):
        sums.extend(series[low : low + 7])
    window = series[skip:]
    low, end = 5 + skip, 5 + len(series)
    ordered = sorted(v for v in window if v == v)
    below, above = [v for v in ordered if v <= -bound], [v for v in ordered if v >= bound]
    got = sums.factor_squared(low, end, low_clip=-bound, high_clip=bound, below=below, above=above)
    if any(math.isnan(v) for v in window) or len(window) < 2 * block:
        assert got is None
    elif got is not None:  # None: too many clipped values, or a cancellation; the plain reading decides
        assert got == pytest.approx(_plain_factor_squared(window, low=-bound, high=bound, block=block), rel=1e-9)


def test_window_sums_step_aside_for_a_clipped_value_seen_twice() -> None:
    sums = WindowSums(2, start=0)
    sums.extend([0.1, 5.0, 0.2, -0.1])
    sums.extend([5.0, 0.3, 0.0, 0.15, -0.2, 0.05])
    assert sums.factor_squared(0, 10, low_clip=-1.0, high_clip=1.0, below=[], above=[5.0, 5.0]) is None
    assert sums.factor_squared(0, 10, low_clip=-1.0, high_clip=6.0, below=[], above=[]) is not None


@pytest.mark.parametrize(
    ("factor_squared", "limit", "decided"),
    [(None, 2.0, None), (3.9, 2.0, True), (4.1, 2.0, False), (4.0, 2.0, None), (4.0 * (1 + 1e-9), 2.0, None)],
)
def test_the_window_sums_decide_only_far_from_the_limit(
    factor_squared: float | None, limit: float, decided: bool | None
) -> None:
    assert decide(factor_squared, limit) is decided


def test_a_replayer_decides_the_long_run_factor_as_the_plain_reading_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each time the window rules ask on a seeded AR(1) series of 30 days: the running sums' answer, when
    # they give one, is the plain reading's (clipped_profile's factor against the same limit).
    fast = _Core._profile_decides
    answered = []

    def checked(core: _Core, baseline: Any, bound: float, block: int, limit: float) -> bool | None:
        got = fast(core, baseline, bound, block, limit)
        if got is not None:
            _mean, factor = core._profile(baseline.end, baseline, bound, block)
            assert got == (factor <= limit)
            answered.append(got)
        return got

    monkeypatch.setattr(_Core, "_profile_decides", checked)
    replayer = Detector(Detection(noise_model=False).rules()).replayer()
    for point in make_series(2, days=30, probes=3, phi=0.9):
        replayer.feed(point)
    assert len(answered) > 500 and True in answered and False in answered


def _plain_day_difference(times: list[float], logs: list[float], index: int, tolerance: float) -> float | None:
    """`_Core._day_difference` as first written: each day's partner found by a search of every run before."""
    partners = []
    for days in range(1, 6):
        then = times[index] - days * 86400.0
        found = [k for k in range(index) if times[k] >= then - tolerance]
        if found and times[found[0]] <= then + tolerance:
            partners.append(logs[found[0]])
    if not partners:
        return None
    scale = math.sqrt({1: 2.0, 2: 1.5, 3: 1.449, 4: 1.343, 5: 1.287}[len(partners)])
    return (logs[index] - median(partners)) / scale


@given(
    st.lists(st.sampled_from([300.0, 300.0, 300.0, 299.5, 301.0, 60.0, 3600.0, 86400.0]), min_size=1, max_size=2500),
    st.lists(st.integers(0, 2499), min_size=1, max_size=40),
    st.sampled_from([150.0, 30.0, 600.0]),
)
def test_a_runs_partners_on_the_days_before_are_found_from_the_last_ones_asked_for(
    spacings: list[float], asked: list[int], tolerance: float
) -> None:
    # Runs mostly every 5 minutes, with jitter and gaps; asked about in any order (forward mostly, as the noise
    # model learns, but also back and far ahead), twice in a row too.
    core = _Core(Rules(noise_model=True), None)
    moment = 1.7e9
    for number, spacing in enumerate(spacings):
        moment += spacing
        core.times.append(moment)
        core.logs.append(math.log(400.0 + number % 7))
    middle = len(spacings) // 2
    in_turn = range(middle, min(len(spacings), middle + 30))
    for index in [*(a % len(spacings) for a in asked), *in_turn, len(spacings) - 1, len(spacings) - 1]:
        expected = _plain_day_difference(core.times, core.logs, index, tolerance)
        assert core._day_difference(index, tolerance) == expected


def _varied(points: list[Any]) -> list[Any]:
    """The runs with request counts that vary (1-4 measured, some failed, some left to RunPoint's defaults), so
    the page window stretches to hold its min_probes and the availability counts move."""
    varied = []
    for number, point in enumerate(points):
        if number % 11 == 0:
            varied.append(replace(point, ok=None, errors=None))
        elif point.ttft_ms is not None:
            varied.append(replace(point, ok=1 + number % 4, errors=number % 3 // 2))
        else:
            varied.append(point)
    return varied


@pytest.mark.parametrize("noise_model", [False, True])
def test_what_a_stepped_core_carries_from_one_run_to_the_next_is_what_a_search_finds(
    monkeypatch: pytest.MonkeyPatch, noise_model: bool
) -> None:
    # Over 30 days with incidents, CUSUM excursions, a model change (a new core) and trims: each run's request
    # counts, the page window's probes held, the level's first run, the CUSUM excursion's first run and the last
    # resolve's time, as each run leaves them, against the plain readings.
    checked: Counter[str] = Counter()
    window, seasonal = _Core._window, _Core._seasonal

    def window_checked(core: _Core, rule: Any, count: int) -> int:
        got = window(core, rule, count)
        runs = rule.window_runs
        if rule.min_probes > 0 and runs <= count:
            while sum(core.probes[count - runs : count]) < rule.min_probes and runs < min(rule.longest_window, count):
                runs += 1
            checked["window"] += 1
        assert got == runs
        checked["stretched"] += runs > rule.window_runs
        return got

    def seasonal_checked(core: _Core, slot: Any, end: int) -> Any:
        got = seasonal(core, slot, end)
        if end > 0:
            end_s = core.times[min(end, len(core.times) - 1)]
            assert core._level_low == bisect_left(core.times, end_s - core._level_s)
            checked["level"] += 1
        return got

    monkeypatch.setattr(_Core, "_window", window_checked)
    monkeypatch.setattr(_Core, "_seasonal", seasonal_checked)
    replayer = Detector(Detection(noise_model=noise_model).rules()).replayer()
    for point in _varied(make_series(2, days=30, probes=3, phi=0.9)):
        replayer.feed(point)
        core, state = replayer._core, replayer.state
        assert core._recent[-1][:2] == point.counts()
        if core._cusum_start is not None and core._cusum_start[0] is state.cusum_since:
            assert core._cusum_start[1] == bisect_left(core.times, state.cusum_since.timestamp())
            checked["cusum"] += 1
        if core._resolved_s is not None and core._resolved_s[0] is state.resolved_at:
            assert core._resolved_s[1] == state.resolved_at.timestamp()
            checked["resolved"] += 1
    assert min(checked.values()) > 100 and len(checked) == 5, checked


def _plain_slot(core: _Core, slot: int) -> tuple[float, int, int] | None:
    """A seasonal slot read afresh: on each of the days before, the median of the runs within an hour of the slot's
    centre, then the median of those; (centre, runs, days), None with too few days (default rules)."""
    days, count = [], 0
    for day in range(1, core.rules.seasonal_days + 1):
        centre = (slot - day * 144 + 0.5) * 600.0
        near = core.logs[bisect_left(core.times, centre - 3600.0) : bisect_left(core.times, centre + 3600.0)]
        if near:
            days.append(median(near))
            count += len(near)
    return (median(days), count, len(days)) if len(days) >= 3 else None


def test_a_seasonal_slot_worked_out_from_the_day_befores_is_the_plain_median_of_daily_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every slot a replayer works out over 12 days with failed runs and gaps (some days miss some hours, so a
    # day drops out of a slot and comes back), and a trim.
    slot_of = _Core._slot
    checked = []

    def slot_checked(core: _Core, slot: int) -> Any:
        got = slot_of(core, slot)
        plain = _plain_slot(core, slot)
        assert (got.center, got.count, got.days) == plain if got is not None else plain is None
        checked.append(got is not None)
        return got

    monkeypatch.setattr(_Core, "_slot", slot_checked)
    monkeypatch.setattr("monitor.detect.core.TRIM_EVERY_RUNS", 1024)
    points = [p for n, p in enumerate(make_series(3, days=12, probes=3, phi=0.9)) if not 30 <= n % 700 < 60]
    replayer = Detector(Rules()).replayer()
    for point in points:
        replayer.feed(point)
    assert len(checked) > 1500 and checked.count(True) > 1000


@pytest.mark.parametrize("multiplier", [None, 1.7])
def test_a_cusum_threshold_derived_only_when_a_run_needs_it_gives_the_same_replay(
    monkeypatch: pytest.MonkeyPatch, multiplier: float | None
) -> None:
    # The CUSUM's derived threshold is worked out only where a comparison can go either way (`_Core._cusum`): the
    # same events, state and thresholds as a replay that reads it after every run (so derives every run's), over 60
    # days, with the tail multiplier the series' own sum gives (noise.tail_multiplier), and raised throughout.
    derivations = Counter[str]()
    derive = noise.cusum_threshold

    def counted(**inputs: Any) -> float:
        derivations[counted.mode] += 1  # type: ignore[attr-defined]
        return derive(**inputs)

    monkeypatch.setattr(noise, "cusum_threshold", counted)
    if multiplier is not None:
        monkeypatch.setattr(noise, "fresh_tail", lambda: [0.0] * (noise.TAIL_FIELDS - 1) + [multiplier])
        monkeypatch.setattr(noise, "tail_multiplier", lambda model, per_week: multiplier)
    points = make_series(2, days=60, probes=3, phi=0.9)
    replays = {}
    raised = 0  # runs whose threshold was left to be derived while raised by the multiplier
    for mode in ("lazy", "every run"):
        counted.mode = mode  # type: ignore[attr-defined]
        replayer = Detector(Detection().rules()).replayer()
        events, cusums = [], []
        for point in points:
            events += replayer.feed(point)
            cusums.append(replayer.state.cusum)
            pending = replayer._core._threshold_pending
            raised += pending is not None and pending[1] != 1.0
            if mode == "every run":
                replayer._core.threshold  # noqa: B018  # read: derived now if it was left to be
        replays[mode] = (events, replayer.state.to_json(), cusums, replayer._core.threshold)
    assert replays["lazy"] == replays["every run"]
    assert replays["lazy"][0] and max(replays["lazy"][2]) > 0
    assert 0 < derivations["lazy"] < derivations["every run"] / 2, derivations
    assert multiplier is None or raised > 1000


@pytest.mark.parametrize("rules", [Detection().rules(), Detection(noise_model=False).rules(), Rules(seasonal_days=0)])
def test_the_ticket_windows_median_kept_sorted_from_run_to_run_is_the_plain_median(
    monkeypatch: pytest.MonkeyPatch, rules: Rules
) -> None:
    # Every run's ticket distance (the window kept sorted, one run out and one in) against the median of the window
    # taken afresh, over 20 days with failed runs, gaps in the seasonal residuals, incidents and a trim.
    parts = _Core._verdict_parts
    checked = Counter[str]()

    def verdict_checked(core: _Core, *args: Any) -> Any:
        got = parts(core, *args)
        if got is not None and got[2] is not None:
            baseline, ticket_w = got[0], got[6]
            assert got[2] == median(got[3][-ticket_w:]) - baseline.level
            checked["seasonal" if baseline.seasonal else "trailing"] += 1
        return got

    monkeypatch.setattr(_Core, "_verdict_parts", verdict_checked)
    replayer = Detector(rules).replayer()
    for point in _varied(make_series(2, days=20, probes=3, phi=0.9)):
        replayer.feed(point)
    assert sum(checked.values()) > 3000, checked


@pytest.mark.parametrize("noise_model", [False, True])
def test_the_slot_and_cusum_period_carried_from_the_run_before_are_those_looked_up(noise_model: bool) -> None:
    # Each run's seasonal slot, and the CUSUM reference of the period its excursion began in, are carried from the
    # run before while the run is in the same slot or period: the very objects their caches hold for the number
    # the plain floor division gives, over 30 days with failed runs, a model change (a new core) and trims.
    from monitor.detect.core import CUSUM_REFERENCE_S, SLOT_S

    checked: Counter[str] = Counter()
    replayer = Detector(Detection(noise_model=noise_model).rules()).replayer()
    for point in _varied(make_series(2, days=30, probes=3, phi=0.9)):
        replayer.feed(point)
        core = replayer._core
        number = int(core.times[-1] // SLOT_S) if core.times else None
        if point.ttft_ms is not None and number in core._slots:  # not in a new core, its runs appended
            assert core.times[-1] == point.at.timestamp() and core._run_slot is core._slots[number]
            checked["slot"] += 1
        low, high, reference = core._cusum_period
        if low < high:
            period = int(low // CUSUM_REFERENCE_S)
            assert (low, high) == (period * CUSUM_REFERENCE_S, (period + 1) * CUSUM_REFERENCE_S)
            assert reference is core._cusum_references.get(period, reference)
            checked["period"] += 1
    assert min(checked.values()) > 1000 and len(checked) == 2, checked
