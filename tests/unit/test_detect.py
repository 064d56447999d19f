"""The detector: synthetic series with known regressions, outages and model changes, fed run by run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from monitor.detect.detector import Detector, Event, Rules, RunPoint, SeriesState, Threshold
from monitor.detect.rules import CUSUM_BOUNDS, RULES_BOUNDS, THRESHOLD_BOUNDS, Bound
from monitor.detect.settings import Detection
from tests.support.series import EVERY, RUNS_PER_DAY, T0, Step, at_day, series


def replay(points: Sequence[RunPoint], detector: Detector | None = None) -> list[Event]:
    replayer = (detector or Detector()).replayer()
    return [event for point in points for event in replayer.feed(point)]


# ---------------------------------------------------------------- regressions


def test_a_healthy_series_with_a_daily_cycle_and_spikes_raises_nothing() -> None:
    points = series(10, sigma=0.2, seed=1, spikes=0.02)
    assert replay(points) == []


@pytest.mark.parametrize(("probes", "pages"), [(5, True), (1, False)])
def test_single_probe_runs_page_on_a_window_of_ten_runs(probes: int, pages: bool) -> None:
    # Four runs in a row 3x slower: a 5-run median of 5-probe runs (25 requests) is slow twice in a
    # row and pages; with one probe per run the window stretches to 10 runs, whose median is not.
    points = series(5, sigma=0.1, seed=4, probes=probes)
    burst = round(4.5 * RUNS_PER_DAY)
    for i in range(burst, burst + 4):
        ttft_ms = points[i].ttft_ms
        assert ttft_ms is not None  # these generated runs all succeed
        points[i] = dataclasses.replace(points[i], ttft_ms=ttft_ms * 3)
    assert Rules().page.min_probes == 10
    events = replay(points)
    assert [(e.kind, e.severity) for e in events if e.action == "open"] == ([("regression", "page")] if pages else [])


def test_spikes_on_single_probe_runs_do_not_page() -> None:
    points = series(10, sigma=0.1, seed=2, probes=1, spikes=0.02)
    assert [e for e in replay(points) if e.severity == "page"] == []


def test_a_step_opens_an_incident_and_recovery_resolves_it() -> None:
    step = Step(start_day=8.5, hours=4, factor=1.5)
    events = replay(series(9.5, sigma=0.2, seed=3, steps=[step]))
    opened, resolved = events[0], events[-1]
    assert [e.action for e in events if e.action != "update"] == ["open", "resolve"], events
    assert opened.kind == "regression"
    start, end = at_day(step.start_day), at_day(step.start_day + step.hours / 24)
    assert start < opened.opened_at <= start + timedelta(minutes=90)
    assert opened.ratio is not None and opened.baseline_ms is not None and opened.observed_ms is not None
    assert opened.ratio > 1.3
    assert opened.observed_ms == pytest.approx(opened.baseline_ms * opened.ratio)
    assert resolved.resolved_at is not None and end <= resolved.resolved_at <= end + timedelta(hours=1)


@pytest.mark.parametrize(
    ("factor", "base_ms", "expected"),
    [
        (1.05, 400.0, None),
        (1.1, 400.0, "ticket"),  # under ticket.ratio (1.12), but the CUSUM adds it up
        (1.3, 400.0, "ticket"),
        (1.3, 50.0, None),  # 15 ms: under ticket.min_delta_ms and cusum.min_delta_ms
        (2.0, 400.0, "page"),
        (2.0, 80.0, "ticket"),  # 80 ms: under page.min_delta_ms, a ticket's worth
    ],
)
def test_the_severity_follows_the_size_of_the_shift(factor: float, base_ms: float, expected: str | None) -> None:
    step = Step(start_day=8.5, hours=4, factor=factor)
    events = replay(series(9, sigma=0.05, seed=4, base_ms=base_ms, steps=[step]))
    severities = [e.severity for e in events if e.action in ("open", "update")]
    assert (severities[-1] if severities else None) == expected, events


def test_a_large_jump_pages_within_half_an_hour() -> None:
    step = Step(start_day=8.5, hours=2, factor=2.0)
    events = replay(series(9, sigma=0.3, seed=5, steps=[step]))
    page = next(e for e in events if e.severity == "page")
    assert page.at - at_day(step.start_day) <= timedelta(minutes=30)


def test_an_incident_stays_open_between_the_clear_and_the_open_ratio() -> None:
    # +60% for three hours, then +11% (above clear_ratio 1.08, below ticket.ratio 1.12), then healthy.
    steps = [Step(8.5, 3, 1.6), Step(8.5 + 3 / 24, 3, 1.11)]
    events = replay(series(9, sigma=0.02, seed=6, steps=steps))
    assert [e.action for e in events] == ["open", "resolve"], events
    assert events[1].at > at_day(8.5 + 6 / 24)


def test_no_verdict_before_the_minimum_history() -> None:
    # 20 runs at 100 ms, then 1000 ms: a page, once the history is long enough to judge it by.
    points = [RunPoint(T0 + i * EVERY, 100.0 if i < 20 else 1000.0) for i in range(26)]
    strict = Detector(dataclasses.replace(Rules(), min_history_runs=26))
    assert replay(points, strict) == []
    lenient = Detector(dataclasses.replace(Rules(), min_history_runs=20))
    assert [(e.kind, e.severity) for e in replay(points, lenient)] == [("regression", "page")]


def test_a_regression_does_not_become_its_own_baseline_in_the_first_days() -> None:
    # Day 2: no seasonal baseline yet, the trailing window stands in, frozen when the incident opens.
    # So the incident lasts as long as the doubling, and (the daily cycle unknown yet) resolves once
    # TTFT is back to its level before the incident.
    step = Step(start_day=2.0, hours=5, factor=2.0)
    events = replay(series(2.75, sigma=0.1, seed=7, steps=[step]))
    assert [e.action for e in events] == ["open", "resolve"], events
    assert events[0].detail["baseline"] == "trailing"
    assert events[0].at <= at_day(2.0) + timedelta(minutes=15)
    assert at_day(2 + 5 / 24) <= events[1].at <= at_day(2.75)


JITTER = [1.00, 1.06, 0.95, 1.03, 0.97, 1.08, 0.93, 1.02, 0.99, 1.05, 0.96, 1.01]  # deterministic noise


def slowed_after(clean: int, slowed: int, factor: float = 2.5, base_ms: float = 200.0) -> list[RunPoint]:
    """Runs 5 s apart of 3 requests each (as in the demo): `clean` runs at base_ms, then `slowed` at
    factor x base_ms."""
    return [
        RunPoint(
            T0 + timedelta(seconds=5 * i), base_ms * JITTER[i % 12] * (factor if i >= clean else 1.0), ok=3, errors=0
        )
        for i in range(clean + slowed)
    ]


def pages(points: Sequence[RunPoint], **detection: Any) -> bool:
    detector = Detector(Detection.model_validate({"min_history_runs": 6, "trailing_runs": 12, **detection}).rules())
    return any(e.kind == "regression" and e.severity == "page" and e.action == "open" for e in replay(points, detector))


@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 7])
def test_a_small_page_window_pages_once_the_baseline_has_its_runs(window: int) -> None:
    # 12 runs of trailing baseline, the page window and two confirmations, all before the slowdown.
    assert pages(slowed_after(12 + window + 2, 15), page={"window_runs": window})


@pytest.mark.parametrize("window", [3, 5])
def test_runs_confirming_a_page_do_not_enter_its_baseline(window: int) -> None:
    # The slowdown starts at run 7, before the first verdict (run 12 + window): its 12-run reference
    # already holds slowed runs. Were each confirming run to enter the reference it is tested
    # against, the median would jump halfway by the second confirmation and no page would open.
    assert pages(slowed_after(7, 15), page={"window_runs": window})


# ---------------------------------------------------------------- availability, SLO, model


def runs(*specs: tuple[int, int, str | None]) -> list[RunPoint]:
    """Runs from (ok, errors, error class): ok runs take 100 ms."""
    return [
        RunPoint(T0 + i * EVERY, 100.0 if ok else None, error, ok=ok, errors=errors)
        for i, (ok, errors, error) in enumerate(specs)
    ]


DOWN = (0, 5, "timeout_first_token")
CLEAN = (5, 0, None)
FLAKY = (2, 3, "rate_limited")


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (
            [DOWN] * 3 + [CLEAN] * 3,
            [(2, "open", "page", "timeout_first_token"), (5, "resolve", "page", "timeout_first_token")],
        ),
        ([DOWN, DOWN, CLEAN, DOWN, DOWN, CLEAN], []),
        ([CLEAN] * 4 + [DOWN] * 2 + [(1, 4, "server_error")] * 3, []),  # a partial run is no outage
        (
            [FLAKY] * 12 + [CLEAN] * 3,
            [(11, "open", "ticket", "rate_limited"), (14, "resolve", "ticket", "rate_limited")],
        ),
        (
            [FLAKY] * 12 + [(0, 5, "server_error")] * 3,
            [(11, "open", "ticket", "rate_limited"), (14, "update", "page", "server_error")],
        ),
    ],
    ids=["outage", "not-consecutive", "partial-failures", "error-rate", "escalation"],
)
def test_availability_incidents_name_the_error_class(
    specs: list[tuple[int, int, str | None]], expected: list[tuple[int, str, str, str]]
) -> None:
    replayer = Detector().replayer()
    seen = [
        (i, e.action, e.severity, e.error)
        for i, point in enumerate(runs(*specs))
        for e in replayer.feed(point)
        if e.kind == "availability"
    ]
    assert seen == expected


def test_an_slo_breach_opens_a_ticket_and_clears_under_the_objective() -> None:
    points = [RunPoint(T0 + i * EVERY, 500.0 if i < 40 else 300.0) for i in range(80)]
    events = replay(points, Detector(slo_ms=400.0))
    assert [(e.kind, e.action, e.severity) for e in events] == [("slo", "open", "ticket"), ("slo", "resolve", "ticket")]
    opened, resolved = events
    # The window (24 runs) is full at run 23, and six breaching runs in a row confirm it.
    assert opened.at == T0 + 28 * EVERY
    assert (opened.baseline_ms, opened.observed_ms, opened.ratio) == pytest.approx((400.0, 500.0, 1.25))
    assert resolved.at > T0 + 40 * EVERY


def test_a_burst_of_slow_runs_that_recovers_is_no_page_and_a_doubling_still_pages_within_20_minutes() -> None:
    # Three runs (15 minutes) 2.5x slower: a window of 5 runs holds them for three runs after they began,
    # so its median alone confirms a burst as a page; the runs after it are back to normal.
    bursts = [Step(3.0 + day / 3, 0.24, 2.5) for day in range(6)]  # 3 runs each (0.24 h: no rounding into a 4th)
    points = series(6, sigma=0.2, seed=23, probes=5, steps=bursts)
    assert [e for e in replay(points) if e.severity == "page"] == []
    doubled = series(4, sigma=0.2, seed=23, probes=5, steps=[Step(3.0, 24, 2.0)])
    opened = [e for e in replay(doubled) if (e.kind, e.action) == ("regression", "open")]
    assert opened and opened[0].severity == "page"
    assert opened[0].at - at_day(3.0) <= timedelta(minutes=20)


def test_a_change_of_the_served_model_is_an_info_event() -> None:
    models = ["qwen3-8b", "qwen3-8b", None, "qwen3-8b-awq", "qwen3-8b-awq"]
    points = [RunPoint(T0 + i * EVERY, 100.0, served_model=m) for i, m in enumerate(models)]
    events = replay(points)
    assert [(e.kind, e.action, e.severity, e.at, e.detail) for e in events] == [
        (
            "model_changed",
            "info",
            "info",
            T0 + 3 * EVERY,
            {"from": "qwen3-8b", "to": "qwen3-8b-awq", "epoch_since": (T0 + 3 * EVERY).isoformat()},
        )
    ]


def with_fingerprints(points: Sequence[RunPoint], fingerprint_at: Any) -> list[RunPoint]:
    return [dataclasses.replace(p, fingerprint=fingerprint_at(i)) for i, p in enumerate(points)]


def test_fingerprints_that_alternate_are_no_change_and_one_seen_twice_in_a_row_is() -> None:
    flat = [RunPoint(T0 + i * EVERY, 100.0) for i in range(12)]
    alternating = with_fingerprints(flat, lambda i: "fp_a" if i % 2 else "fp_b")
    assert replay(alternating) == []
    once = with_fingerprints(flat, lambda i: "fp_b" if i == 5 else "fp_a")  # one backend answered once
    assert replay(once) == []
    changed = with_fingerprints(flat, lambda i: "fp_a" if i < 6 else "fp_b")
    events = replay(changed)
    assert [(e.kind, e.action, e.at, e.detail) for e in events] == [
        (
            "model_changed",
            "info",
            T0 + 7 * EVERY,  # confirmed on its second run
            {"fingerprint_from": "fp_a", "fingerprint_to": "fp_b", "epoch_since": (T0 + 6 * EVERY).isoformat()},
        )
    ]


def test_a_slowdown_that_comes_with_another_model_is_a_change_and_a_new_baseline_not_a_regression() -> None:
    steps = [Step(4.0, 48, 2.0)]  # doubles on day 4 and stays so
    points = series(6, sigma=0.2, seed=21, steps=steps)
    # Without a word from the server, a doubling is a regression (paged).
    assert ("regression", "open", "page") in [(e.kind, e.action, e.severity) for e in replay(points)]
    swapped = with_fingerprints(points, lambda i: "fp_a" if i < 4 * RUNS_PER_DAY else "fp_b")
    events = replay(swapped)
    assert [(e.kind, e.action) for e in events] == [("model_changed", "info")]
    assert events[0].at == at_day(4) + EVERY and events[0].detail["epoch_since"] == at_day(4).isoformat()
    # The service's path (evaluate on a history window) agrees with the replayer, run by run.
    detector, state, seen = Detector(), SeriesState(), []
    for index in range(4 * RUNS_PER_DAY - 3, 5 * RUNS_PER_DAY):
        run = swapped[index]
        history = [p for p in swapped[:index] if p.at >= detector.history_since(run.at)]
        state, new = detector.evaluate(history, state, run)
        seen.extend(new)
    assert [(e.kind, e.action, e.at) for e in seen] == [(e.kind, e.action, e.at) for e in events]
    assert state.epoch_since == at_day(4) and state.fingerprint == "fp_b"
    # The new model's own slowdown is still a regression, against the new model's baseline.
    later = series(8, sigma=0.2, seed=21, steps=[Step(4.0, 96, 2.0), Step(6.5, 24, 1.8)])
    relapsed = with_fingerprints(later, lambda i: "fp_a" if i < 4 * RUNS_PER_DAY else "fp_b")
    after = replay(relapsed)
    assert (after[0].kind, after[0].action) == ("model_changed", "info")
    opened = [e for e in after if (e.kind, e.action) == ("regression", "open")]
    assert opened and all(at_day(6.5) <= e.at < at_day(7) for e in opened), opened


def test_a_regression_open_when_the_model_changes_resolves_with_the_change_as_its_reason() -> None:
    points = series(5, sigma=0.2, seed=22, steps=[Step(3.0, 48, 2.5)])
    change = 3 * RUNS_PER_DAY + 36  # three hours into the slowdown: paged by then
    swapped = [dataclasses.replace(p, served_model="m-1" if i < change else "m-2") for i, p in enumerate(points)]
    events = replay(swapped)
    actions = [(e.kind, e.action) for e in events]
    assert actions[:1] == [("regression", "open")] and ("model_changed", "info") in actions
    closing = events[actions.index(("model_changed", "info")) + 1]
    assert (closing.kind, closing.action, closing.detail["reason"]) == ("regression", "resolve", "model_changed")
    assert closing.at == swapped[change].at
    assert not any(e.kind == "regression" and e.at > closing.at for e in events)


def test_the_identity_state_survives_its_json() -> None:
    flat = [RunPoint(T0 + i * EVERY, 100.0, fingerprint="fp_a" if i < 3 else "fp_b") for i in range(4)]
    replayer = Detector().replayer()
    for point in flat:
        replayer.feed(point)
    assert replayer.state.fingerprint_pending == ("fp_b", T0 + 3 * EVERY)
    restored = SeriesState.from_json(json.loads(json.dumps(replayer.state.to_json())))
    assert restored == replayer.state
    assert restored.copy() == restored


# ---------------------------------------------------------------- state and restarts


def test_a_restart_mid_incident_gives_the_same_events() -> None:
    points = series(9, sigma=0.2, seed=8, steps=[Step(8.4, 3, 2.0)])
    detector = Detector()
    whole = detector.replayer()
    events_by_run = [whole.feed(point) for point in points]
    opened = next(i for i, events in enumerate(events_by_run) if any(e.action == "open" for e in events))
    split = opened + 3

    first = detector.replayer()
    for point in points[:split]:
        first.feed(point)
    saved = json.loads(json.dumps(first.state.to_json()))
    assert saved["incidents"]["regression"]["severity"] == "page"
    restarted = detector.replayer(SeriesState.from_json(saved), history=points[:split])
    assert [restarted.feed(point) for point in points[split:]] == events_by_run[split:]

    # The daemon's way: evaluate() on the history since history_since(), with the stored state.
    state = SeriesState.from_json(saved)
    for index in range(split, split + 40):
        since = detector.history_since(points[index].at)
        history = [p for p in points[:index] if p.at >= since]
        state, events = detector.evaluate(history, state, points[index])
        state = SeriesState.from_json(json.loads(json.dumps(state.to_json())))
        assert events == events_by_run[index], index


def test_evaluate_leaves_the_state_it_was_given_alone() -> None:
    points = runs(*[DOWN] * 3)
    state = SeriesState()
    new_state, events = Detector().evaluate(points[:2], state, points[2])
    assert [e.action for e in events] == ["open"]
    assert state == SeriesState()
    assert "availability" in new_state.incidents


def test_state_from_a_newer_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version 99"):
        SeriesState.from_json({"version": 99})


# ---------------------------------------------------------------- inputs and rules


def test_the_config_section_turns_into_rules() -> None:
    rules = Rules.from_config(Detection.model_validate({"page": {"ratio": 2.0}, "availability": {"window_runs": 6}}))
    assert rules.page.ratio == 2.0
    assert rules.error_window_runs == 6
    assert rules.ticket.window_runs == Rules().ticket.window_runs


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clear_ratio": 1.2}, "clear_ratio"),
        ({"trailing_runs": 0}, "trailing_runs"),
        ({"trailing_runs": 11}, "trailing_runs must be at least 12"),
        ({"ticket": Threshold(ratio=1.0, min_delta_ms=0, confirmations=1, window_runs=1, z_threshold=1)}, "ticket"),
        ({"error_rate": 0.0}, "error_rate"),
    ],
)
def test_inconsistent_rules_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(Rules(), **change)


def _outside(bound: Bound) -> float:
    """A value the bound refuses."""
    if bound.ge is not None:
        return bound.ge - 1
    if bound.gt is not None:
        return bound.gt
    assert bound.le is not None
    return bound.le + 1


_CONFIG_KEYS = {"consecutive_failures": "availability.consecutive_failures", "error_rate": "availability.error_rate"}
_CONFIG_KEYS["error_window_runs"] = "availability.window_runs"


@pytest.mark.parametrize(
    ("key", "bound"),
    [(_CONFIG_KEYS.get(name, name), bound) for name, bound in RULES_BOUNDS.items()]
    + [(f"{severity}.{name}", bound) for severity in ("page", "ticket") for name, bound in THRESHOLD_BOUNDS.items()]
    + [(f"cusum.{name}", bound) for name, bound in CUSUM_BOUNDS.items()],
)
def test_the_config_and_the_detector_refuse_the_same_values(key: str, bound: Bound) -> None:
    value = _outside(bound)
    section, _, name = key.rpartition(".")
    data: dict[str, Any] = {section: {name: value}} if section else {name: value}
    with pytest.raises(ValidationError):
        Detection.model_validate(data)
    defaults = Detection().rules()
    rule_name = next((rule for rule, config in _CONFIG_KEYS.items() if config == key), name)
    if section in ("page", "ticket", "cusum"):
        change = {section: dataclasses.replace(getattr(defaults, section), **{name: value})}
    else:
        change = {rule_name: value}
    expected = f"{section}.{name}" if section in ("page", "ticket", "cusum") else name
    with pytest.raises(ValueError, match=expected):
        dataclasses.replace(defaults, **change)


def test_the_configs_defaults_are_the_detectors_own() -> None:
    assert Detection().rules() == Rules()


def test_a_run_needs_an_aware_time_and_a_positive_ttft() -> None:
    with pytest.raises(ValueError, match="time zone"):
        RunPoint(datetime(2025, 1, 1), 100.0)
    with pytest.raises(ValueError, match="positive"):
        RunPoint(T0, 0.0)


def test_runs_must_come_in_time_order() -> None:
    replayer = Detector().replayer()
    replayer.feed(RunPoint(T0, 100.0))
    with pytest.raises(ValueError, match="time order"):
        replayer.feed(RunPoint(T0 - EVERY, 100.0))


def test_without_a_seasonal_baseline_a_short_history_never_reads_a_negative_slice() -> None:
    # seasonal_days 0 ends the trailing reference before the ticket window; with fewer runs than that
    # window the end was negative, so the slice wrapped round and took in the very runs being tested.
    from monitor.detect.core import _Core

    rules = Detection.model_validate({"seasonal_days": 0, "min_history_runs": 6, "trailing_runs": 12}).rules()
    core = _Core(rules, None)
    state = SeriesState()
    start = datetime(2025, 1, 6, tzinfo=UTC)
    for index in range(30):
        ttft = 100.0 if index < 14 else 300.0
        core.step(state, RunPoint(start + timedelta(minutes=5 * index), ttft))
        count = len(core.logs)
        verdict = core._verdict(None, count, None)
        if verdict is None:
            continue
        tested = max(verdict.page_window, verdict.ticket_window if verdict.ticket is not None else 0)
        assert 0 <= verdict.baseline.end <= count - tested, (count, verdict.baseline.end)


def test_a_canary_answer_that_changes_and_stays_is_a_model_change_and_one_that_varies_is_not() -> None:
    flat = [RunPoint(T0 + i * EVERY, 100.0) for i in range(14)]
    changed = [dataclasses.replace(p, canary="c-1" if i < 7 else "c-2") for i, p in enumerate(flat)]
    events = replay(changed)
    assert [(e.kind, e.at, e.detail) for e in events] == [
        (
            "model_changed",
            T0 + 8 * EVERY,
            {"canary_from": "c-1", "canary_to": "c-2", "epoch_since": (T0 + 7 * EVERY).isoformat()},
        )
    ]
    # An answer that differs on every run (a model that samples anyway): no change, ever; flagged.
    varying = [dataclasses.replace(p, canary=f"v-{i}") for i, p in enumerate(flat)]
    replayer = Detector().replayer()
    assert [e for p in varying for e in replayer.feed(p)] == []
    assert replayer.state.canary_unstable and replayer.state.canary is None
    # Once its answers agree again it is trusted again, from the answer they agree on (no event for that).
    settled = [dataclasses.replace(p, at=T0 + (20 + i) * EVERY, canary="s-1") for i, p in enumerate(flat[:6])]
    assert [e for p in settled for e in replayer.feed(p)] == []
    assert not replayer.state.canary_unstable and replayer.state.canary == "s-1"
    restored = SeriesState.from_json(json.loads(json.dumps(replayer.state.to_json())))
    assert restored == replayer.state


def test_output_tokens_per_probe_that_jump_are_an_event_and_a_drift_is_not() -> None:
    tokens = [12, 12, 14, 13, 950, 950, 40]
    points = [
        RunPoint(T0 + i * EVERY, 100.0, output_tokens=float(n), reasoning_tokens=float(n - 12 if n > 100 else 0))
        for i, n in enumerate(tokens)
    ]
    events = replay(points)
    assert [(e.kind, e.action, e.at, e.detail) for e in events] == [
        (
            "tokens_jump",
            "info",
            T0 + 4 * EVERY,
            {"tokens_from": 13.0, "tokens_to": 950.0, "reasoning_from": 0.0, "reasoning_to": 938.0},
        )
    ]
    from monitor.detect.identity import describe_tokens

    assert describe_tokens(events[0].detail, "qwen3-8b") == (
        "output tokens per probe of qwen3-8b jumped 13 -> 950 (reasoning 0 -> 938): the model now reasons"
    )
