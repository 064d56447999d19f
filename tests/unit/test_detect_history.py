"""The history kept between evaluations (monitor/detect/history.py) gives the detector what reading the runs
afresh gives: the same points, and, loaded as columns (`_Core.load`), the same verdicts bit for bit."""

from __future__ import annotations

import json
import math
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.detect.core import residual_reach_s
from monitor.detect.detector import Detector, RunPoint, SeriesState
from monitor.detect.history import (
    ENTRY_OVERHEAD_BYTES,
    IDLE_S,
    LABEL_BYTES,
    HistoryCache,
    HistoryRow,
    SeriesHistory,
    Span,
)
from monitor.detect.settings import Detection
from monitor.detect.state import point_from_run
from monitor.probe.result import ErrorClass
from monitor.store.records import RunRecord, SeriesKey
from tests.support.series import make_series

T0 = datetime(2025, 3, 3, tzinfo=UTC)
SERIES = SeriesKey("t", "p", "m", "short", "lab")
ERRORS = [None, "timeout_first_token", "rate_limited"]


def _row(
    at: datetime, ttft: float | None, *, ok: int = 3, errors: int = 0, rounds: int = 3, **labels: str | None
) -> HistoryRow:
    return (at, ttft, labels.get("error"), ok, errors, rounds, labels.get("canary"), labels.get("build"))


def _record(row: HistoryRow) -> RunRecord:
    """The stored run a history row was read from, as `Repository.runs_between` gives it."""
    at, ttft, error, ok, errors, rounds, canary, build = row
    return RunRecord(
        run_id=uuid.uuid4(),
        job="j",
        series=SERIES,
        api="openai-chat",
        intended_at=at,
        started_at=at,
        finished_at=at,
        rounds=rounds,
        warmup=0,
        ok=ok,
        errors=errors,
        ttft_p50_ms=ttft,
        ttft_min_ms=ttft,
        ttft_max_ms=ttft,
        ttfa_p50_ms=None,
        decode_tps_p50=None,
        prompt_tokens_p50=None,
        error=ErrorClass(error) if error is not None else None,
        canary=canary,
        server_build=build,
    )


def _rows(seed: int, count: int) -> list[HistoryRow]:
    """Runs every 5 minutes (give or take microseconds), some failed, some partly, some disturbed whole
    (no measured request: not evidence), with a model change among the labels."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        at = T0 + timedelta(minutes=5 * index, microseconds=rng.randrange(1_000_000))
        roll = rng.random()
        if roll < 0.04:
            out.append(_row(at, None, ok=0, errors=3, error=rng.choice(ERRORS[1:])))
        elif roll < 0.06:
            out.append(_row(at, None, ok=0, errors=0))  # every measured sample disturbed
        elif roll < 0.1:
            out.append(_row(at, rng.lognormvariate(6, 0.3), ok=2, errors=1, error="timeout_first_token"))
        else:
            build = "v1" if index < count // 2 else "v2"
            out.append(_row(at, rng.lognormvariate(6, 0.3), build=build, canary="c"))
    return out


def test_the_points_kept_are_the_points_a_fresh_read_makes() -> None:
    rows = _rows(1, 400)
    history = SeriesHistory(T0)
    history.extend(rows)
    start, end = rows[20][0], rows[380][0]
    fresh = [
        point_from_run(_record(row))
        for row in rows
        if start <= row[0] < end and (row[5] == 0 or row[3] + row[4] > 0)  # state.is_evidence
    ]
    assert history.points(start, end) == fresh
    # Times come back exact, microseconds and time zone included.
    assert [p.at for p in history.points(start, end)] == [p.at for p in fresh]
    assert all(p.at.utcoffset() == timedelta(0) for p in fresh)


def test_the_columns_stand_for_the_points() -> None:
    rows = _rows(2, 300)
    history = SeriesHistory(T0)
    history.extend(rows)
    start, end = rows[0][0], rows[-1][0]
    points = history.points(start, end)
    columns = history.columns(start, end)
    assert columns.moments == [p.at.timestamp() for p in points]
    assert [None if v != v else v for v in columns.ttfts] == [p.ttft_ms for p in points]
    assert columns.oks == [p.ok for p in points] and columns.errors == [p.errors for p in points]
    assert columns.error_classes == [p.error for p in points]
    assert len(columns.since(points[100].at.timestamp())) == len(points) - 100


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    days=st.floats(0.2, 9.0),
    noise_model=st.booleans(),
    epoch_at=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_a_core_loaded_from_columns_decides_as_one_appended_run_by_run(
    seed: int, days: float, noise_model: bool, epoch_at: float | None
) -> None:
    rows = _rows(seed, int(days * 288) + 1)
    detector = Detector(Detection(noise_model=noise_model).rules())
    history = SeriesHistory(T0)
    history.extend(rows[:-1])
    run_row = rows[-1]
    run = point_from_run(_record(run_row))
    state = SeriesState()
    if epoch_at is not None:  # a new model's epoch: only its runs are compared among themselves
        state.epoch_since = rows[int(epoch_at * (len(rows) - 1))][0]
    as_points = detector.evaluate_with_baseline(history.points(T0, run.at), state, run)
    as_columns = detector.evaluate_with_baseline(history.columns(T0, run.at), state, run)
    assert as_columns[1] == as_points[1]
    assert as_columns[2] == as_points[2] or (math.isnan(as_columns[2] or 0) and math.isnan(as_points[2] or 0))
    assert json.dumps(as_columns[0].to_json(), sort_keys=True) == json.dumps(as_points[0].to_json(), sort_keys=True)


@pytest.mark.parametrize("noise_model", [False, True])
def test_run_after_run_the_kept_history_with_its_residuals_decides_as_points_read_afresh(noise_model: bool) -> None:
    # As the service goes: the kept history grows by the runs since the last evaluation, forgets what
    # no evaluation reads, hands the detector its columns with the residuals earlier evaluations computed,
    # and keeps those this one computed. The seeded AR(1) series of the golden files, through the ticket
    # its 2-day +20% step opens (day 12.2), and through its model change (day 15.5: a new epoch, under
    # which the residuals kept before do not hold) and its hour of failures (day 16).
    points = make_series(7, days=16.2, probes=3, phi=0.9)
    detector = Detector(Detection(noise_model=noise_model).rules())
    rows = [(p.at, p.ttft_ms, p.error, *p.counts(), 3, p.canary, p.server_build) for p in points]
    carried = evaluations = 0
    epochs: set[datetime | None] = set()
    events: list[str] = []
    for first_day, last_day in ((12.1, 12.4), (15.3, 16.2)):
        first, last = int(first_day * 288), int(last_day * 288)
        replayer = detector.replayer()  # the state the series had reached, as the daemon would hold it
        for point in points[:first]:
            replayer.feed(point)
        state_a = state_b = replayer.state
        kept = SeriesHistory(points[0].at)
        kept.extend(rows[:first])
        for index in range(first, last):
            run = points[index]
            since = detector.history_since(run.at)
            kept.forget_before(since)
            afresh = [p for p in points[:index] if p.at >= since]
            state_a, events_a, baseline_a = detector.evaluate_with_baseline(afresh, state_a, run)
            columns = kept.columns(since, run.at)
            whole_after = columns.complete_from + residual_reach_s(detector.rules)  # what the core takes
            carried += sum(
                1
                for moment, value in zip(columns.moments, columns.residuals or [], strict=True)
                if value is not None and moment >= whole_after
            )
            state_b, events_b, baseline_b = detector.evaluate_with_baseline(columns, state_b, run)
            kept.keep_residuals(columns)
            assert (events_a, baseline_a) == (events_b, baseline_b), index
            assert state_a.to_json() == state_b.to_json(), index
            kept.extend([rows[index]])
            evaluations += 1
            epochs.add(state_a.epoch_since)
            events += [f"{e.kind}/{e.action}" for e in events_a]
    # Residuals were carried (about a day of runs at each evaluation: those whose reach the history holds
    # whole); the ticket opened, the model change began an epoch, the failures were seen.
    assert carried > evaluations * 200, (carried, evaluations)
    assert len(epochs) == 2, epochs
    assert "regression/open" in events and "availability/open" in events, events


def test_span_counts_the_runs_kept_and_forgetting_moves_where_it_is_complete_from() -> None:
    rows = _rows(3, 50)
    history = SeriesHistory(T0)
    history.extend(rows)
    assert history.span(rows[10][0], rows[19][0]) == Span(10, rows[10][0], rows[19][0])
    assert history.span(T0 - timedelta(days=1), T0 - timedelta(hours=1)) == Span(0, None, None)
    history.forget_before(rows[30][0])
    assert len(history) == 20 and history.complete_from == history.span(rows[30][0], rows[30][0]).count * 0 + (
        (rows[30][0] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    )
    assert history.last == rows[-1][0]


def test_span_counts_only_the_runs_read_as_rows_what_the_rows_hold_of_them() -> None:
    # The first 20 runs came from cold chunks, then a late row among them (a spool's replay into a compacted day),
    # then rows: the rows hold 30 + 1 of the kept runs, and the span says so, first and last of those.
    rows = _rows(5, 50)
    history = SeriesHistory(T0)
    from_chunks = [index < 20 and index != 7 for index in range(50)]
    history.extend(rows, from_chunks)
    assert history.span(rows[0][0], rows[-1][0]) == Span(31, rows[7][0], rows[-1][0])
    assert history.span(rows[8][0], rows[-1][0]) == Span(30, rows[20][0], rows[-1][0])
    assert history.span(rows[0][0], rows[6][0]) == Span(0, None, None)  # only chunks' runs there
    assert history.span(rows[10][0], rows[25][0]) == Span(6, rows[20][0], rows[25][0])
    history.forget_before(rows[8][0])  # the flags go with their runs
    assert history.span(rows[0][0], rows[-1][0]) == Span(30, rows[20][0], rows[-1][0])
    history.extend([_row(rows[-1][0] + timedelta(minutes=5), 90.0)])  # a new run: a row
    assert history.span(rows[0][0], rows[-1][0] + timedelta(hours=1)).count == 31
    # What the detector is given does not depend on where a run came from.
    plain = SeriesHistory(T0)
    plain.extend([*rows[8:], _row(rows[-1][0] + timedelta(minutes=5), 90.0)])
    assert history.points(T0, rows[-1][0] + timedelta(hours=1)) == plain.points(T0, rows[-1][0] + timedelta(hours=1))


def test_rows_older_than_the_last_kept_are_refused() -> None:
    history = SeriesHistory(T0)
    history.extend([_row(T0 + timedelta(minutes=5), 100.0)])
    with pytest.raises(ValueError, match="start order"):
        history.extend([_row(T0, 100.0)])


def test_a_run_costs_forty_one_bytes_kept_and_each_distinct_label_is_counted() -> None:
    history = SeriesHistory(T0)
    history.extend(_rows(4, 2400))
    labels = 1 + 2 + 2  # none; the two builds with their canary; the two error classes of failed runs
    per_run = (history.nbytes() - ENTRY_OVERHEAD_BYTES - LABEL_BYTES * labels) / 2400
    assert per_run == 8 + 8 + 8 + 3 * 4 + 4 + 1  # start, TTFT, residual, three counts, labels, from a chunk


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_keeps_what_fits_and_refuses_the_rest_rather_than_evicting() -> None:
    clock = _Clock()

    def entry(runs: int = 1000) -> SeriesHistory:
        made = SeriesHistory(T0)
        made.extend(_rows(5, runs))
        return made

    size = entry().nbytes()
    cache: HistoryCache[str] = HistoryCache(int(size * 2.5), clock=clock)
    assert [cache.keep(key, entry()) for key in ("a", "b", "c")] == [True, True, False]
    assert cache.get("c") is None and cache.get("a") is not None and len(cache) == 2
    assert cache.nbytes() == 2 * size
    # Grown past its size as kept: counted when told; grown past the budget, no longer kept.
    grown = cache.get("a")
    assert grown is not None
    grown.extend([_row(T0 + timedelta(days=30), 100.0)] * 50)
    cache.resized("a")
    assert cache.nbytes() == size + grown.nbytes()
    grown.extend([_row(T0 + timedelta(days=31), 100.0)] * 20_000)
    cache.resized("a")
    assert cache.get("a") is None and cache.nbytes() == size
    # A series not evaluated for an hour makes room; one in use does not.
    assert cache.keep("a", entry())
    clock.now = IDLE_S + 1
    assert cache.get("a") is not None  # in use; "b" was last used at 0
    assert cache.keep("c", entry())
    assert cache.get("b") is None and cache.get("c") is not None and cache.get("a") is not None
    cache.clear()
    assert cache.nbytes() == 0 and len(cache) == 0


def test_a_run_point_with_the_run_times_of_a_fresh_read_compares_equal() -> None:
    # RunPoint equality is what the service's history relies on when it hands points to the cache service.
    at = T0 + timedelta(microseconds=123_457)
    history = SeriesHistory(T0)
    history.extend([_row(at, 250.5)])
    assert history.points(T0, T0 + timedelta(hours=1)) == [RunPoint(at, 250.5, ok=3, errors=0)]


def test_a_canary_answering_differently_every_run_keeps_only_the_labels_of_the_runs_kept() -> None:
    # One label a run: the table must not outgrow the runs kept (nor run out of numbers, 65,536 before).
    history = SeriesHistory(T0)
    runs = 70_000
    rows = [_row(T0 + timedelta(minutes=i), 300.0, canary=f"answer-{i}") for i in range(runs)]
    history.extend(rows)
    assert history.nbytes() > runs * LABEL_BYTES  # counted against the budget
    history.forget_before(rows[runs - 1000][0])
    assert len(history) == 1000
    assert history.nbytes() < 1100 * (LABEL_BYTES + 40) + ENTRY_OVERHEAD_BYTES
    kept = history.points(T0, T0 + timedelta(days=100))
    assert [p.canary for p in kept] == [f"answer-{i}" for i in range(runs - 1000, runs)]


@pytest.mark.parametrize("noise_model", [False, True])
def test_a_week_of_one_minute_runs_loads_as_appended_past_the_cores_trims(noise_model: bool) -> None:
    # Over 4,096 runs a core appended run by run forgets the oldest at every 4,096th; loaded as columns it
    # must forget the same ones (before, it cut once from the last run and kept different first runs:
    # other residuals, another noise model).
    rng = random.Random(3)
    detector = Detector(Detection(noise_model=noise_model).rules())
    at = T0 + timedelta(days=9)
    since = detector.history_since(at, interval=timedelta(minutes=1))
    rows = []
    moment = since
    while moment < at:
        rows.append(_row(moment + timedelta(seconds=rng.uniform(0, 5)), 500 * math.exp(rng.gauss(0, 0.1))))
        moment += timedelta(minutes=1)
    history = SeriesHistory(since)
    history.extend([row for row in rows if row[0] < at])
    assert len(history) > 2 * 4096  # two trims on the way
    run = RunPoint(at, 2000.0, ok=3, errors=0)
    as_points = detector.evaluate_with_baseline(history.points(since, at), SeriesState(), run)
    as_columns = detector.evaluate_with_baseline(history.columns(since, at), SeriesState(), run)
    assert (as_columns[1], as_columns[2]) == (as_points[1], as_points[2])
    assert as_columns[0].to_json() == as_points[0].to_json()
