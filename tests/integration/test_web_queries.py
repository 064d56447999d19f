"""The web views' queries on both databases, and their pure statistics."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from monitor.detect.detector import Detector, Rules, RunPoint, point_from_run
from monitor.probe.result import ErrorClass
from monitor.quantile import quantile
from monitor.schedule.maintenance import next_pass_in
from monitor.store import overview_summary
from monitor.store.models import (
    AlertDeliveryRow,
    AlertOutboxRow,
    IncidentRow,
    OverviewSummaryRow,
    OverviewSummaryStateRow,
    RunRow,
    SeriesRow,
    table_of,
)
from monitor.store.overview_summary import OverviewHours, RolledHours
from monitor.store.records import SeriesKey, floor_hour, runs_from_samples
from monitor.store.repository import Repository
from monitor.timefmt import iso
from monitor.web import queries, report, stats
from tests.support.store_fixtures import PROVIDERS, T0, Backend, make_batch, make_samples

pytest_plugins = ("tests.support.store_fixtures",)


# ---------------------------------------------------------------- pure parts


def median_of(values: list[float]) -> float:
    """The median of a sample known not to be empty (quantile's None means no values)."""
    median = quantile(values, 0.5)
    assert median is not None
    return median


def interval_of(sorted_values: list[float]) -> tuple[float, float]:
    """The median's interval of a sample known not to be empty (None means no values)."""
    interval = stats.median_interval(sorted_values)
    assert interval is not None
    return interval


def test_the_median_interval_contains_the_median_and_narrows_with_more_data() -> None:
    rng = random.Random(1)
    small = sorted(rng.gauss(500, 50) for _ in range(20))
    large = sorted(rng.gauss(500, 50) for _ in range(2000))
    low_s, high_s = interval_of(small)
    low_l, high_l = interval_of(large)
    assert low_s <= median_of(small) <= high_s
    assert low_l <= median_of(large) <= high_l
    assert high_l - low_l < (high_s - low_s) / 3


@pytest.mark.parametrize("n", [15, 31, 200])
def test_the_exact_bootstrap_agrees_with_resampling(n: int) -> None:
    rng = random.Random(n)
    values = sorted(rng.lognormvariate(6, 0.4) for _ in range(n))
    medians = sorted(median_of(sorted(rng.choices(values, k=n))) for _ in range(4000))
    mean = sum(medians) / len(medians)
    resampled_variance = sum((m - mean) ** 2 for m in medians) / len(medians)
    assert stats.median_variance(values) == pytest.approx(resampled_variance, rel=0.25)
    low, high = interval_of(values)
    assert low == pytest.approx(medians[100], rel=0.05) and high == pytest.approx(medians[3899], rel=0.05)


def test_a_clear_difference_is_significant_and_noise_is_not() -> None:
    rng = random.Random(2)
    fast = sorted(rng.gauss(300, 30) for _ in range(200))
    slow = sorted(rng.gauss(400, 30) for _ in range(200))
    same = sorted(rng.gauss(300, 30) for _ in range(200))
    clear = stats.median_difference(slow, fast)
    assert clear is not None and clear.significant and 80 < clear.difference_ms < 120
    assert clear.low_ms < clear.difference_ms < clear.high_ms
    noise = stats.median_difference(same, fast)
    assert noise is not None and not noise.significant
    assert stats.median_difference(slow, fast) == clear  # fixed seed: the same numbers every time


def test_the_prefill_slope_recovers_ms_per_1k_tokens() -> None:
    points = [(tokens, 100 + 0.25 * tokens) for tokens in (2000, 16000, 32000) for _ in range(3)]
    fit = stats.prefill_slope(points)
    assert fit.ms_per_1k_tokens == pytest.approx(250) and fit.intercept_ms == pytest.approx(100)
    assert fit.ranked and fit.sizes == 3 and fit.reason is None
    assert not stats.prefill_slope([(2000, 1.0), (2000, 2.0)]).ranked


def _one_size(rng: random.Random) -> list[tuple[float, float]]:
    # A cache-busting prefix moves a 256-token prompt by a token or two: one size, however it jitters.
    return [(rng.choice((254, 255, 256, 257, 258)), rng.gauss(200, 40)) for _ in range(30)]


@pytest.mark.parametrize(
    ("points", "reason"),
    [
        ([], "no prompt token counts"),
        (_one_size(random.Random(5)), "measured at one prompt size (254 tokens); a slope needs two or more"),
        ([(256, 200.0), (2048, 600.0)], "not significant (95% interval unbounded)"),
        (
            [(tokens, random.Random(tokens * 31 + i).gauss(300, 80)) for tokens in (256, 2048) for i in range(6)],
            "not significant (95% interval ",
        ),
    ],
)
def test_a_slope_needs_two_prompt_sizes_and_a_significant_fit(points: list[tuple[float, float]], reason: str) -> None:
    fit = stats.prefill_slope(points)
    assert fit.ms_per_1k_tokens is None and fit.intercept_ms is None and not fit.ranked
    assert fit.reason is not None and fit.reason.startswith(reason), fit


def test_a_target_measured_at_one_prompt_size_is_listed_unranked_with_the_reason() -> None:
    rng = random.Random(9)
    rows: list[tuple[str, str, str, float, float | None]]
    rows = [(t, t, f"p{n}", 80 + slope * n + rng.gauss(0, 5), n) for t, slope in (("a", 0.05), ("b", 0.1))
            for n in (256, 2048, 8192) for _ in range(5)]  # fmt: skip
    rows += [("c", "c", "short", ttft, tokens) for tokens, ttft in _one_size(rng)]
    slopes = queries.compare_values(rows)["slopes"]
    assert [(s["target"], s["rank"]) for s in slopes] == [("a", 1), ("b", 2), ("c", None)]
    c = slopes[2]
    assert (c["ms_per_1k_tokens"], c["intercept_ms"], c["prompt_sizes"]) == (None, None, 1)
    assert c["reason"].startswith("measured at one prompt size")
    assert slopes[0]["ci_low"] < slopes[0]["ms_per_1k_tokens"] < slopes[0]["ci_high"]
    # Rendering reads no filters or available names, so the document leaves them out (hence the cast).
    document = cast(queries.CompareDocument, {"start": "s", "end": "e", "cells": [], "pairs": [], "slopes": slopes})
    text = report.render_markdown(document, title="t")
    assert "| – | c | c | n/a: measured at one prompt size (254 tokens); a slope needs two or more |" in text
    assert "| 1 | a | a | " in text and "| 2 | b | b | " in text


@pytest.mark.parametrize(
    ("opened", "runs", "failed", "expected"),
    [
        ([], 10, False, "ok"),
        ([], 0, False, "no data"),
        ([("regression", "ticket")], 10, False, "ticket"),
        ([("regression", "page")], 10, False, "page"),
        ([("availability", "page")], 10, False, "down"),
        ([], 10, True, "down"),
    ],
)
def test_series_status(opened: list[tuple[str, str]], runs: int, failed: bool, expected: str) -> None:
    assert queries.series_status(open_severities=opened, runs_24h=runs, last_run_failed=failed) == expected


def test_bucket_width_keeps_points_under_the_cap() -> None:
    assert queries.bucket_seconds(6 * 3600) == 30
    assert queries.bucket_seconds(90 * 86400) == 7200
    assert 90 * 86400 / queries.bucket_seconds(90 * 86400) <= queries.MAX_POINTS


def test_compare_ranks_and_pairs() -> None:
    rng = random.Random(3)
    rows = []
    for target, slope in (("a", 0.05), ("b", 0.10), ("c", 0.20)):
        for tokens in (2000, 16000, 32000):
            rows += [(target, target.upper(), f"p{tokens}", 80 + slope * tokens + rng.gauss(0, 5), tokens)] * 1
            rows += [(target, target.upper(), f"p{tokens}", 80 + slope * tokens + rng.gauss(0, 5), tokens)
                     for _ in range(9)]  # fmt: skip
    result = queries.compare_values(rows)
    assert [s["target"] for s in result["slopes"]] == ["a", "b", "c"]
    assert result["slopes"][2]["ms_per_1k_tokens"] == pytest.approx(200, rel=0.05)
    assert len(result["cells"]) == 9 and all(c["n"] == 10 for c in result["cells"])
    big = [p for p in result["pairs"] if p["prompt"] == "p32000"]
    assert [(p["faster"], p["slower"]) for p in big] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert all(p["significant"] and p["difference_ms"] > 0 for p in big)


# ---------------------------------------------------------------- on the databases


async def _store(backend: Backend, hours: int = 3) -> Repository:
    repository = Repository(backend.engine())
    for step in range(hours * 12):
        await repository.save_runs(make_batch(T0 + timedelta(minutes=5 * step)))
    return repository


async def test_overview_lists_every_series_with_status_and_availability(backend: Backend) -> None:
    repository = await _store(backend)
    now = T0 + timedelta(hours=3)
    async with repository.engine.begin() as connection:
        series_id = await connection.scalar(
            sa.text("SELECT id FROM series WHERE target='gpt-4o-mini' AND prompt='long'")
        )
        await connection.execute(
            sa.insert(table_of(IncidentRow)).values(
                id=uuid.uuid4(), series_id=series_id, kind="regression", severity="page", opened_at=now,
                baseline_ms=100.0, observed_ms=250.0, ratio=2.5, updated_at=now, details={"peak_ratio": 3.1},
            )
        )  # fmt: skip
    rows = await queries.overview(repository.engine, now=now)
    await repository.engine.dispose()
    assert len(rows) == 4
    first = rows[0]
    assert (first["target"], first["prompt"], first["status"]) == ("gpt-4o-mini", "long", "page")
    assert first["baseline_ms"] == 100.0 and first["ratio"] == pytest.approx(first["p50_last_hour_ms"] / 100, abs=1e-3)
    others = rows[1:]
    assert {r["status"] for r in others} == {"ok"}
    for row in others:
        assert row["availability_24h"] == 1.0 and row["p50_last_hour_ms"] > 0
        assert row["baseline_note"] is None
        assert row["baseline_ms"] > 0 and row["ratio"] == pytest.approx(
            row["p50_last_hour_ms"] / row["baseline_ms"], abs=1e-2
        )
        assert len(row["sparkline_ms"]) == 24 and sum(v is not None for v in row["sparkline_ms"]) == 3


async def test_the_overview_cache_answers_as_the_database_until_a_late_run_or_a_rollup_changes_it(
    backend: Backend,
) -> None:
    repository = await _store(backend, hours=3)
    now = T0 + timedelta(hours=3, minutes=10)
    await repository.rollup(now)
    cache = queries.OverviewCache()
    first = await queries.overview(repository.engine, now=now, cache=cache)
    assert await queries.overview(repository.engine, now=now, cache=cache) == first and cache.hits == 1
    # A late run (a spool replayed) for a past, rolled-up hour: every measured request failed.
    failed = {index: ErrorClass.SERVER_ERROR for index in range(2, 7)}
    await repository.save_runs(make_batch(T0 + timedelta(minutes=31), job="late", errors=failed))
    late = await queries.overview(repository.engine, now=now, cache=cache)
    assert late == await queries.overview(repository.engine, now=now)
    assert all(row["availability_24h"] < 1 for row in late) and cache.hits == 1
    await repository.rollup(now)  # the pending hour rolled up again: the cache must not keep the old reading
    rolled = await queries.overview(repository.engine, now=now, cache=cache)
    assert rolled == await queries.overview(repository.engine, now=now)
    assert [row["availability_24h"] for row in rolled] == [row["availability_24h"] for row in late]
    clock = [0.0]
    aged = queries.OverviewCache(max_age_s=60, clock=lambda: clock[0])
    await queries.overview(repository.engine, now=now, cache=aged)
    clock[0] = 61.0
    await queries.overview(repository.engine, now=now, cache=aged)
    assert aged.hits == 0
    await repository.engine.dispose()


async def _overview_without_summary(repository: Repository, now: datetime) -> list[dict[str, object]]:
    async with repository.engine.begin() as connection:
        await connection.execute(sa.delete(table_of(OverviewSummaryStateRow)))
    return await queries.overview(repository.engine, now=now)


async def _reading(repository: Repository, now: datetime) -> tuple[RolledHours | None, RolledHours]:
    """The stored summary as the overview would load it at `now` (without its last runs), and a fresh
    scan of the rollups."""
    hours = OverviewHours.at(now)
    async with repository.engine.connect() as connection:
        pending = await overview_summary.pending_hours(
            connection, since=floor_hour(min(hours.windows)), until=hours.current
        )
        stored = await overview_summary.load(connection, hours, pending)
        scanned = await overview_summary.read_rollups(connection, hours, pending)
    if stored is not None:
        assert stored.last_runs is not None and scanned.last_runs is None
        stored = dataclasses.replace(stored, last_runs=None)
    return stored, scanned


async def test_the_overview_summary_reads_as_a_scan_of_the_rollups_through_late_runs_and_rollups(
    backend: Backend,
) -> None:
    repository = await _store(backend, hours=3)
    now = T0 + timedelta(hours=3, minutes=10)
    await repository.rollup(now)
    # Housekeeping at the start of the hour; the overview later in it.
    assert await repository.refresh_overview_summary(now - timedelta(minutes=9)) == 4
    stored, scanned = await _reading(repository, now)
    assert stored is not None and stored == scanned
    assert any(stored.sparks.values()) and all(sum(c) > 0 for c in stored.counts.values())
    with_summary = await queries.overview(repository.engine, now=now)
    # The overview reads the stored rows: emptied sparklines show.
    async with repository.engine.begin() as connection:
        await connection.execute(sa.update(table_of(OverviewSummaryRow)).values(sparkline=[]))
    emptied = await queries.overview(repository.engine, now=now)
    drawn = [sum(v is not None for v in row["sparkline_ms"]) for row in (*with_summary, *emptied)]
    assert min(drawn[:4]) >= 2 and max(drawn[4:]) == 0
    await repository.refresh_overview_summary(now - timedelta(minutes=9))
    # A late run (a spool replayed) for a past, rolled-up hour: its hour is pending now, counted from runs.
    failed = {index: ErrorClass.SERVER_ERROR for index in range(2, 7)}
    await repository.save_runs(make_batch(T0 + timedelta(minutes=31), job="late", errors=failed))
    stored, scanned = await _reading(repository, now)
    assert stored == scanned
    late = await queries.overview(repository.engine, now=now)
    assert all(row["availability_24h"] < 1 for row in late) and late != with_summary
    assert late == await _overview_without_summary(repository, now)
    # The pending hour rolled up again: the summary read the old rollup, so the rollup forgot it, and
    # the overview scans until housekeeping makes the next one.
    await repository.refresh_overview_summary(now)
    await repository.save_runs(make_batch(T0 + timedelta(minutes=32), job="later", errors=failed))
    await repository.rollup(now)
    assert (await _reading(repository, now))[0] is None
    rolled = await queries.overview(repository.engine, now=now)
    assert all(a["availability_24h"] < b["availability_24h"] for a, b in zip(rolled, late, strict=True))
    await repository.refresh_overview_summary(now)
    stored, scanned = await _reading(repository, now)
    assert stored is not None and stored == scanned
    assert await queries.overview(repository.engine, now=now) == rolled
    # A summary of another hour is not used.
    assert (await _reading(repository, now + timedelta(hours=1)))[0] is None
    await repository.engine.dispose()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_the_fresh_runs_summed_in_postgresql_add_up_as_the_runs_one_by_one(backend: Backend) -> None:
    """The overview's runs that no rollup holds, summed per series in the database, against the same
    runs read one by one and summed here: through part hours at the windows' starts, the last hour, the
    current hour and pending hours (late runs into rolled-up hours, one of them within the last hour)."""
    repository = Repository(backend.engine())
    for step in range(26 * 12):  # 26 hours of 5-minute runs, so the day window starts inside them
        at = T0 + timedelta(minutes=5 * step)
        await repository.save_runs(
            make_batch(at, targets=("qwen3-8b",), errors={3: ErrorClass.TIMEOUT_FIRST_TOKEN} if step % 5 == 0 else {})
        )
    now = T0 + timedelta(hours=25, minutes=17)
    await repository.rollup(now)
    # A run of nothing but errors in the current hour (no p50; its series' latest run has 0 ok samples).
    every_round = {index: ErrorClass.SERVER_ERROR for index in range(2, 7)}
    await repository.save_runs(
        make_batch(now - timedelta(minutes=1), targets=("qwen3-8b",), prompts=("short",), errors=every_round)
    )
    # Late runs: one into a morning hour rolled up long ago, one into the last hour's rolled-up part.
    for late in (T0 + timedelta(hours=2, minutes=1), now - timedelta(minutes=50)):
        await repository.save_runs(
            make_batch(late, targets=("qwen3-8b",), job="late", errors={0: ErrorClass.SERVER_ERROR})
        )
    hours = OverviewHours.at(now)
    async with repository.engine.connect() as connection:
        pending = await overview_summary.pending_hours(
            connection, since=floor_hour(min(hours.windows)), until=hours.current
        )
        assert len(pending) == 4  # 2 series x 2 hours
        one_by_one = await queries._fresh_runs(connection, now=now, windows=hours.windows, pending=pending)
        summed = await queries._fresh_runs(connection, now=now, windows=hours.windows, pending=pending, grouped=True)
    assert not one_by_one.series and one_by_one.runs
    in_pending = [run for run in one_by_one.runs if (run[0], floor_hour(run[1])) in pending]
    assert in_pending and sorted(summed.runs) == sorted(in_pending)
    rest = [run for run in one_by_one.runs if (run[0], floor_hour(run[1])) not in pending]
    hour_ago = now - timedelta(hours=1)
    expected = {}
    for series_id in {run[0] for run in rest}:
        runs = sorted((run for run in rest if run[0] == series_id), key=lambda run: run[1])
        windows = []
        for since in hours.windows:
            counted = [r for r in runs if r[1] >= since and (floor_hour(r[1]) < since or r[1] >= hours.current)]
            windows.append((sum(r[3] for r in counted), sum(r[4] for r in counted)))
        expected[series_id] = (
            windows,
            sorted(r[2] for r in runs if r[1] >= hour_ago and r[2] is not None),
            sorted(r[2] for r in runs if r[1] >= hours.current and r[2] is not None),
            runs[-1][1],
            runs[-1][3],
        )
    got = {
        one.series_id: (one.windows, sorted(one.last_hour_p50s), sorted(one.current_p50s), one.last_at, one.last_ok)
        for one in summed.series
    }
    assert got == expected
    # The day window starts inside the runs: its part hour counts beside the current hour, errors too.
    assert all(windows[0][0] > windows[2][0] > 0 and windows[0][1] > 0 for windows, *_ in got.values()), got
    assert sorted(last_ok for *_, last_ok in got.values()) == [0, 5]  # the failed run is one series' latest
    await repository.engine.dispose()


async def test_two_daemons_replacing_the_summary_at_once_both_succeed(backend: Backend) -> None:
    repository = await _store(backend, hours=3)
    now = T0 + timedelta(hours=3, minutes=1)
    await repository.rollup(now)
    for _ in range(5):
        assert await asyncio.gather(*(repository.refresh_overview_summary(now) for _ in range(2))) == [4, 4]
    stored, scanned = await _reading(repository, now)
    assert stored is not None and stored == scanned
    await repository.engine.dispose()


async def test_housekeeping_passes_run_just_after_each_whole_interval() -> None:
    hour = 3600.0
    at = datetime(2026, 12, 6, 4, 40, tzinfo=UTC).timestamp()
    assert next_pass_in(at, hour) == pytest.approx(20 * 60 + 30)
    assert next_pass_in(at - 40 * 60 + 29, hour) == pytest.approx(hour + 1)  # 1 s before: the next hour's
    assert next_pass_in(at - 40 * 60 + 31, hour) == pytest.approx(hour - 1)
    assert 0.005 <= next_pass_in(at, 0.05) <= 0.055  # the tests' short intervals


async def test_the_last_run_is_found_for_series_quiet_in_the_last_hour_and_those_that_ran(backend: Backend) -> None:
    repository = await _store(backend, hours=2)
    recent = T0 + timedelta(hours=4, minutes=40)
    await repository.save_runs(make_batch(recent, targets=("qwen3-8b",), prompts=("short",)))
    rows = await queries.overview(repository.engine, now=T0 + timedelta(hours=5))
    last = {(row["target"], row["prompt"]): row["last_run_at"] for row in rows}
    async with repository.engine.connect() as connection:
        starts = await connection.execute(
            sa.select(SeriesRow.target, SeriesRow.prompt, sa.func.max(RunRow.started_at))
            .join(RunRow, RunRow.series_id == SeriesRow.id)
            .group_by(SeriesRow.target, SeriesRow.prompt)
        )
        expected = {(target, prompt): iso(at) for target, prompt, at in starts}
    assert last == expected and len(last) == 4
    assert last[("qwen3-8b", "short")].startswith(recent.strftime("%Y-%m-%dT%H:%M"))
    # The same from housekeeping's summary (each series' last run when it was made, and the runs since).
    await repository.rollup(T0 + timedelta(hours=5))
    await repository.refresh_overview_summary(T0 + timedelta(hours=4, minutes=30))
    assert await queries.overview(repository.engine, now=T0 + timedelta(hours=4, minutes=50)) == (
        await _overview_without_summary(repository, T0 + timedelta(hours=4, minutes=50))
    )
    await repository.refresh_overview_summary(T0 + timedelta(hours=5, seconds=30))  # as housekeeping does
    with_summary = await queries.overview(repository.engine, now=T0 + timedelta(hours=5, minutes=10))
    before = {(w["target"], w["prompt"]): w["last_run_at"] for w in with_summary}
    assert before == last
    # A run saved after the summary was made, and one in an hour rolled up before it (a spool replayed).
    await repository.save_runs(make_batch(T0 + timedelta(hours=5, minutes=5), targets=("qwen3-8b",), prompts=("long",)))
    await repository.save_runs(make_batch(T0 + timedelta(hours=3), targets=("gpt-4o-mini",), prompts=("short",)))
    assert (await _reading(repository, T0 + timedelta(hours=5, minutes=10)))[0] is not None  # still in use
    after = await queries.overview(repository.engine, now=T0 + timedelta(hours=5, minutes=10))
    assert after == await _overview_without_summary(repository, T0 + timedelta(hours=5, minutes=10))
    moved = {(r["target"], r["prompt"]) for r in after if r["last_run_at"] != before[(r["target"], r["prompt"])]}
    assert moved == {("qwen3-8b", "long"), ("gpt-4o-mini", "short")}
    await repository.engine.dispose()


async def test_points_are_raw_samples_for_short_ranges_and_buckets_beyond_the_cap(backend: Backend) -> None:
    repository = await _store(backend, hours=2)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series WHERE target='qwen3-8b' AND prompt='short'"))
    end = T0 + timedelta(hours=2)
    raw = await queries.series_points(repository.engine, series_id, start=T0, end=end)
    assert raw["resolution"] == "sample" and len(raw["points"]) == 24 * 5  # warm-ups left out
    assert all(p["request_id"].startswith("req-") and p["run_id"] for p in raw["points"])
    folded = await queries.series_points(repository.engine, series_id, start=T0, end=end, max_points=50)
    assert folded["resolution"] == "bucket" and 0 < len(folded["points"]) <= 50
    assert sum(p["n"] for p in folded["points"]) == 120
    assert all(p["ttft_p10_ms"] <= p["ttft_p50_ms"] <= p["ttft_p90_ms"] for p in folded["points"])
    await repository.rollup(end + timedelta(hours=2))
    long = await queries.series_points(repository.engine, series_id, start=end - timedelta(days=30), end=end)
    assert long["resolution"] == "hour" and sum(p["n"] for p in long["points"]) == 120 and len(long["points"]) == 2
    with pytest.raises(queries.NotFound):
        await queries.series_points(repository.engine, 9999, start=T0, end=end)
    await repository.engine.dispose()


async def test_points_say_how_late_the_monitor_was_and_which_samples_were_disturbed(backend: Backend) -> None:
    repository = Repository(backend.engine())
    batch = make_batch(T0, targets=("qwen3-8b",), prompts=("short",))
    measured = [s for s in batch[0][1] if not s.warmup]
    measured[1].self_delay_ms, measured[1].disturbed = 61.25, True
    await repository.save_runs(batch)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series WHERE target='qwen3-8b' AND prompt='short'"))
    end = T0 + timedelta(hours=1)
    raw = await queries.series_points(repository.engine, series_id, start=T0, end=end)
    expected = []
    for s in measured:
        assert s.self_delay_ms is not None  # make_batch stamps how late each sample was sent
        expected.append((round(s.self_delay_ms, 2), s.disturbed))
    assert [(p["self_delay_ms"], p["disturbed"]) for p in raw["points"]] == expected
    folded = await queries.series_points(repository.engine, series_id, start=T0, end=end, max_points=1)
    assert [p["disturbed"] for p in folded["points"]] == [1]
    await repository.engine.dispose()


async def _store_with_server_metrics(backend: Backend, hours: int) -> tuple[Repository, int]:
    """qwen3-8b/short every 5 minutes, each run with the server's own numbers (as a vLLM scrape gives)."""
    repository = Repository(backend.engine())
    for step in range(hours * 12):
        batch = make_batch(T0 + timedelta(minutes=5 * step), targets=("qwen3-8b",), prompts=("short",))
        batch = [
            (
                dataclasses.replace(
                    run, server_ttft_ms=150.0 + step, server_queue_ms=10.0, server_prefill_ms=120.0,
                    server_waiting=float(step % 3), server_running=1.0, server_kv_cache_usage=0.25,
                    server_prefix_hit_rate=0.5,
                ),
                members,
            )
            for run, members in batch
        ]  # fmt: skip
        await repository.save_runs(batch)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series WHERE target='qwen3-8b' AND prompt='short'"))
    return repository, series_id


async def test_long_ranges_show_the_band_phases_tokens_and_server_metrics_as_short_ones(backend: Backend) -> None:
    repository, series_id = await _store_with_server_metrics(backend, hours=3)
    end = T0 + timedelta(hours=3)
    await repository.rollup(end + timedelta(hours=1))
    short = await queries.series_points(repository.engine, series_id, start=T0, end=end, max_points=10)
    long = await queries.series_points(repository.engine, series_id, start=end - timedelta(days=30), end=end)
    assert short["resolution"] == "bucket" and long["resolution"] == "hour" and len(long["points"]) == 3
    # DNS, connect and TLS are null here: the measured samples reuse the warm-up's connection.
    phases = [name for name in queries.PHASES if name not in ("dns_ms", "connect_ms", "tls_ms")]
    shown = ("ttft_p10_ms", "ttft_p90_ms", *phases, "prompt_tokens", "decode_tps", *queries.SERVER_FIELDS)
    for point in [*long["points"], *short["points"]]:
        assert all(point[name] is not None for name in shown), point
        assert point["ttft_p10_ms"] < point["ttft_p50_ms"] < point["ttft_p90_ms"]
    # The server's numbers are medians of the runs (each run once), per hour from the rollups.
    assert [p["server_ttft_ms"] for p in long["points"]] == [155.5, 167.5, 179.5]
    assert [p["server_waiting"] for p in long["points"]] == [1.0, 1.0, 1.0]
    assert short["points"][0]["server_ttft_ms"] == 152.5  # 30-minute buckets: runs 0-5
    assert sum(p["n"] for p in long["points"]) == sum(p["n"] for p in short["points"])
    await repository.engine.dispose()


async def test_each_point_carries_the_baseline_the_detector_compared_its_run_with(backend: Backend) -> None:
    repository, series_id = await _store_with_server_metrics(backend, hours=4)
    end = T0 + timedelta(hours=4)
    start = end - timedelta(hours=2)
    view = await queries.series_points(repository.engine, series_id, start=start, end=end)
    assert view["resolution"] == "sample"
    # The detector's own replay of every run, independently of the view's code.
    runs = sorted(
        [run for run in await repository.runs_between(SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short",
                                                                 "test-lab"), T0, end)],
        key=lambda run: run.started_at,
    )  # fmt: skip
    replayer = Detector().replayer()
    expected: dict[str, float | None] = {}
    for run in runs:
        replayer.feed(point_from_run(run))
        expected[str(run.run_id)] = replayer.baseline_ms
    assert len(expected) == 48 and list(expected.values())[-1] is not None
    for point in view["points"]:
        wanted = expected[point["run_id"]]
        assert point["baseline_ms"] == (pytest.approx(wanted, abs=0.01) if wanted is not None else None)
    assert view["baseline_ms"] == pytest.approx(list(expected.values())[-1], abs=0.01)
    # A stricter detector (a longer history before its first verdict) has no baseline yet.
    strict = Detector(Rules(min_history_runs=60))
    none = await queries.series_points(repository.engine, series_id, start=start, end=end, detector=strict)
    assert all(point["baseline_ms"] is None for point in none["points"])
    await repository.engine.dispose()


async def test_frequent_runs_over_days_replay_the_detector_over_the_hours(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, series_id = await _store_with_server_metrics(backend, hours=16)
    end = T0 + timedelta(hours=16)
    await repository.rollup(end)
    detector = Detector(Rules(min_history_runs=12, trailing_runs=12))
    monkeypatch.setattr(queries, "MAX_REPLAYED_RUNS", 10)
    view = await queries.series_points(repository.engine, series_id, start=end - timedelta(hours=2), end=end,
                                       detector=detector)  # fmt: skip
    hours = await repository.rollups_between(
        SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab"), T0, end
    )
    replayer = detector.replayer()
    by_hour = {}
    for hour in hours:
        replayer.feed(
            RunPoint(at=hour.hour, ttft_ms=hour.ttft_p50_ms, ok=hour.samples - hour.errors, errors=hour.errors)
        )
        by_hour[hour.hour] = replayer.baseline_ms
    for point in view["points"]:
        at = datetime.fromisoformat(point["t"].replace("Z", "+00:00"))
        assert point["baseline_ms"] == pytest.approx(by_hour[floor_hour(at)], abs=0.01)
    await repository.engine.dispose()


@pytest.mark.parametrize(
    ("server_slower", "said"),
    [
        (True, "client TTFT 600 ms (baseline 2"),
        (False, "server TTFT unchanged: network or gateway"),
    ],
)
async def test_the_series_view_says_where_the_time_went(backend: Backend, server_slower: bool, said: str) -> None:
    repository = Repository(backend.engine())
    for step in range(4 * 12):
        late = step >= 3 * 12  # the last hour: the client sees 600 ms
        batch = make_batch(T0 + timedelta(minutes=5 * step), targets=("qwen3-8b",), prompts=("short",))
        batch = [
            (
                dataclasses.replace(
                    run, ttft_p50_ms=600.0 if late else 240.0 + step % 5,
                    server_ttft_ms=550.0 if late and server_slower else 200.0,
                    server_waiting=12.0 if late and server_slower else 0.0,
                    server_queue_ms=340.0 if late and server_slower else 5.0, server_prefill_ms=190.0,
                ),
                members,
            )
            for run, members in batch
        ]  # fmt: skip
        await repository.save_runs(batch)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series"))
    end = T0 + timedelta(hours=4)
    view = await queries.series_points(repository.engine, series_id, start=end - timedelta(hours=6), end=end)
    split = view["split"]
    assert split["client_ttft_ms"] == 600.0 and split["since"] == iso(end - timedelta(hours=1))
    assert said in split["text"]
    if server_slower:
        assert split["cause"] == "server_queue" and split["text"].endswith(
            "server TTFT 550 ms (baseline 200); 12 requests waiting (baseline 0): queueing on the server"
        )
    else:
        assert split["cause"] == "outside_server"
    # With a regression incident in the range: its span, against the baseline the daemon opened it with.
    opened = T0 + timedelta(hours=3, minutes=10)
    async with repository.engine.begin() as connection:
        await connection.execute(
            sa.insert(table_of(IncidentRow)).values(
                id=uuid.uuid4(), series_id=series_id, kind="regression", severity="page", opened_at=opened,
                baseline_ms=231.0, observed_ms=600.0, ratio=2.6, updated_at=opened,
                details={"since": iso(T0 + timedelta(hours=3))},
            )
        )  # fmt: skip
    during = (await queries.series_points(repository.engine, series_id, start=end - timedelta(hours=6), end=end))[
        "split"
    ]
    assert during["incident_id"] is not None and during["since"] == iso(T0 + timedelta(hours=3))
    assert during["client_baseline_ms"] == 231.0 and "(baseline 231)" in during["text"]
    await repository.engine.dispose()


async def test_a_series_without_server_metrics_has_no_split(backend: Backend) -> None:
    repository = await _store(backend, hours=1)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT min(id) FROM series"))
    view = await queries.series_points(repository.engine, series_id, start=T0, end=T0 + timedelta(hours=1))
    assert view["split"] is None
    await repository.engine.dispose()


async def test_incidents_carry_their_notifications_and_deliveries(backend: Backend) -> None:
    repository = await _store(backend, hours=1)
    incident_id, outbox_id = uuid.uuid4(), uuid.uuid4()
    at = T0 + timedelta(minutes=30)
    async with repository.engine.begin() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series WHERE target='qwen3-8b' AND prompt='long'"))
        await connection.execute(
            sa.insert(table_of(IncidentRow)).values(
                id=incident_id, series_id=series_id, kind="regression", severity="ticket", opened_at=at,
                resolved_at=at + timedelta(minutes=20), baseline_ms=200.0, observed_ms=500.0, ratio=2.5,
                updated_at=at,
            )
        )  # fmt: skip
        await connection.execute(
            sa.insert(table_of(AlertOutboxRow)).values(
                id=outbox_id, dedup_key="k1", incident_id=incident_id, receiver="oncall", event="firing",
                payload={"secret": "x"}, status="sent", attempts=2, next_attempt_at=at, created_at=at, sent_at=at,
            )
        )  # fmt: skip
        for outcome in ("retry", "sent"):
            await connection.execute(
                sa.insert(table_of(AlertDeliveryRow)).values(
                    outbox_id=outbox_id, attempted_at=at, outcome=outcome, http_status=200, duration_ms=12.5
                )
            )
    items = await queries.incidents(repository.engine, start=T0, end=T0 + timedelta(hours=2))
    await repository.engine.dispose()
    assert len(items) == 1
    item = items[0]
    assert (item["target"], item["prompt"], item["duration_s"], item["open"]) == ("qwen3-8b", "long", 1200, False)
    [note] = item["notifications"]
    assert note["receiver"] == "oncall" and [d["outcome"] for d in note["deliveries"]] == ["retry", "sent"]
    assert "payload" not in note


async def test_compare_on_the_database_matches_the_pure_function(backend: Backend) -> None:
    repository = await _store(backend, hours=1)
    result = await queries.compare(repository.engine, start=T0, end=T0 + timedelta(hours=1), prompts=["short"])
    await repository.engine.dispose()
    assert {c["target"] for c in result["cells"]} == {"qwen3-8b", "gpt-4o-mini"}
    assert all(c["n"] == 60 and c["prompt"] == "short" for c in result["cells"])
    assert result["available"]["prompts"] == ["long", "short"]
    assert len(result["pairs"]) == 1


async def test_a_compare_over_more_runs_than_one_request_may_read_uses_the_hours_or_is_refused_naming_the_fix(
    backend: Backend,
) -> None:
    repository = await _store(backend, hours=1)
    start, end = T0, T0 + timedelta(hours=1)
    try:
        async with repository.engine.connect() as connection:
            runs = await connection.scalar(sa.select(sa.func.count()).select_from(RunRow.__table__))
        assert runs is not None  # count(*) always answers one row
        answered = await queries.compare(repository.engine, start=start, end=end, max_runs=runs)
        assert answered["cells"] and answered["resolution"] == "sample"
        hourly = await queries.compare(repository.engine, start=start, end=end, max_runs=5)
        assert hourly["resolution"] == "hour"
        assert [c["n"] for c in hourly["cells"]] == [c["n"] for c in answered["cells"]]
        with pytest.raises(queries.TooBroad, match=r"4 series-hours, more than the 3 one request may read; narrow it"):
            await queries.compare(repository.engine, start=start, end=end, max_runs=5, max_hours=3)
    finally:
        await repository.engine.dispose()


async def test_a_compare_past_raw_retention_reads_the_hourly_rollups_close_to_what_the_samples_gave(
    backend: Backend,
) -> None:
    """Six hours of 4 series; the raw numbers first, then the first three hours' raw runs pruned (their
    rollups kept): the same compare now reads the hours (`resolution` "hour"), counts every sample,
    and its medians and p90s land within a few percent of the samples' (docs/api.md)."""
    repository = await _store(backend, hours=6)
    start, end = T0, T0 + timedelta(hours=6)
    try:
        raw = await queries.compare(repository.engine, start=start, end=end)
        assert raw["resolution"] == "sample"
        await repository.rollup(end + timedelta(hours=1))
        days = 40
        pruned = await repository.prune(T0 + timedelta(hours=3, days=days), raw_days=days, rollup_days=400)
        assert pruned.runs > 0
        hourly = await queries.compare(repository.engine, start=start, end=end)
        assert hourly["resolution"] == "hour"
        by_cell = {(c["target"], c["prompt"]): c for c in raw["cells"]}
        assert {(c["target"], c["prompt"]) for c in hourly["cells"]} == set(by_cell)
        for cell in hourly["cells"]:
            exact = by_cell[(cell["target"], cell["prompt"])]
            assert cell["n"] == exact["n"]
            assert cell["median_ms"] == pytest.approx(exact["median_ms"], rel=0.03)
            assert cell["p90_ms"] == pytest.approx(exact["p90_ms"], rel=0.05)
            assert cell["ci_low_ms"] <= cell["median_ms"] <= cell["ci_high_ms"]
        assert [(p["faster"], p["slower"], p["significant"]) for p in hourly["pairs"]] == [
            (p["faster"], p["slower"], p["significant"]) for p in raw["pairs"]
        ]
        # A window that retention has not touched still reads the samples.
        recent = await queries.compare(repository.engine, start=T0 + timedelta(hours=4), end=end)
        assert recent["resolution"] == "sample"
    finally:
        await repository.engine.dispose()


async def test_a_series_whose_last_run_failed_entirely_is_down(backend: Backend) -> None:
    from monitor.probe.result import ErrorClass
    from monitor.store.records import runs_from_samples
    from tests.support.store_fixtures import PROVIDERS, make_samples

    repository = await _store(backend, hours=1)
    at = T0 + timedelta(hours=1)
    failed = make_samples("qwen3-8b", "short", at=at, errors={i: ErrorClass.SERVER_ERROR for i in range(1, 7)})
    await repository.save_runs(runs_from_samples(failed, job="every-5m", location="test-lab", provider_of=PROVIDERS))
    rows = await queries.overview(repository.engine, now=at + timedelta(minutes=5))
    await repository.engine.dispose()
    assert (rows[0]["target"], rows[0]["prompt"], rows[0]["status"]) == ("qwen3-8b", "short", "down")
    assert {r["status"] for r in rows[1:]} == {"ok"}
    assert rows[0]["availability_24h"] == pytest.approx(60 / 65, abs=1e-5)


async def _availability_from_runs(repository: Repository, now: datetime) -> dict[tuple[str, str], list[float | None]]:
    """What availability means: ok over ok plus errors of the runs started in each window."""
    out: dict[tuple[str, str], list[float | None]] = {}
    async with repository.engine.connect() as connection:
        for index, days in enumerate((1, 7, 30)):
            rows = await connection.execute(
                sa.select(SeriesRow.target, SeriesRow.prompt, sa.func.sum(RunRow.ok), sa.func.sum(RunRow.errors))
                .join(RunRow, RunRow.series_id == SeriesRow.id)
                .where(RunRow.started_at >= now - timedelta(days=days), RunRow.started_at < now)
                .group_by(SeriesRow.target, SeriesRow.prompt)
            )
            for target, prompt, ok, errors in rows:
                out.setdefault((target, prompt), [None, None, None])[index] = round(ok / (ok + errors), 5)
    return out


async def test_availability_from_rollups_counts_every_run_once(backend: Backend) -> None:
    """Whole hours come from the rollups; the part hour at each window's start, the current hour and
    hours with a pending rollup (a late run into an hour already rolled up) come from the runs."""
    repository = Repository(backend.engine())
    begin = T0 - timedelta(hours=30)
    for step in range(31 * 3):
        errors = {2: ErrorClass.SERVER_ERROR} if step % 7 == 0 else None
        await repository.save_runs(make_batch(begin + timedelta(minutes=20 * step, seconds=7), errors=errors))
    await repository.rollup(T0 - timedelta(hours=5))
    late = make_samples(
        "qwen3-8b", "short", at=T0 - timedelta(hours=20, minutes=-13), errors={3: ErrorClass.SERVER_ERROR}
    )
    await repository.save_runs(runs_from_samples(late, job="late", location="test-lab", provider_of=PROVIDERS))
    now = T0 + timedelta(minutes=40)  # the day window starts at 09:40 yesterday: a part hour
    expected = await _availability_from_runs(repository, now)
    rows = await queries.overview(repository.engine, now=now)
    await repository.engine.dispose()
    found = {
        (r["target"], r["prompt"]): [r["availability_24h"], r["availability_7d"], r["availability_30d"]] for r in rows
    }
    assert found == expected
    assert found[("qwen3-8b", "short")][0] < found[("gpt-4o-mini", "short")][0] < 1.0  # the late error counts


async def test_availability_keeps_hours_whose_raw_runs_retention_deleted(backend: Backend) -> None:
    """30-day availability counts rolled-up hours after their raw runs are pruned (7 days by default)."""
    repository = Repository(backend.engine())
    for step in range(6):
        errors = {2: ErrorClass.SERVER_ERROR} if step == 0 else None
        await repository.save_runs(make_batch(T0 + timedelta(minutes=10 * step), errors=errors))
    now = T0 + timedelta(days=10)
    before = await _availability_from_runs(repository, now)
    await repository.rollup(T0 + timedelta(hours=2))
    await repository.prune(now, raw_days=7, rollup_days=90)
    async with repository.engine.connect() as connection:
        assert await connection.scalar(sa.select(sa.func.count()).select_from(RunRow)) == 0
    rows = await queries.overview(repository.engine, now=now)
    await repository.engine.dispose()
    for row in rows:
        assert row["availability_30d"] == before[(row["target"], row["prompt"])][2] == pytest.approx(29 / 30, abs=1e-5)
        assert row["availability_7d"] is None and row["status"] == "no data"


async def test_a_targets_slo_row_reads_as_the_target_across_prompts_not_as_a_series_without_data(
    backend: Backend,
) -> None:
    """SLO burn incidents are recorded on a row with the prompt `*` that has no runs of its own: the
    overview marks it as the target's (scope), ok while its prompts run, paging while its burn does."""
    repository = await _store(backend)
    now = T0 + timedelta(hours=3)
    series = table_of(SeriesRow)
    async with repository.engine.begin() as connection:
        for target, provider, model in (("qwen3-8b", "vllm", "Qwen/Qwen3-8B"), ("gpt-4o-mini", "openai", "gpt")):
            await connection.execute(
                sa.insert(series).values(target=target, provider=provider, model=model, prompt="*", location="test-lab")
            )
        burning = await connection.scalar(
            sa.select(series.c.id).where(series.c.target == "qwen3-8b", series.c.prompt == "*")
        )
        await connection.execute(
            sa.insert(table_of(IncidentRow)).values(
                id=uuid.uuid4(), series_id=burning, kind="slo_burn", severity="page", opened_at=now,
                baseline_ms=300.0, ratio=20.0, updated_at=now, details={},
            )
        )  # fmt: skip
    rows = await queries.overview(repository.engine, now=now)
    await repository.engine.dispose()
    whole = {r["target"]: r for r in rows if r["prompt"] == "*"}
    assert {r["scope"] for r in rows if r["prompt"] != "*"} == {"series"}
    assert whole["qwen3-8b"]["scope"] == "target" and whole["qwen3-8b"]["status"] == "page"
    assert whole["qwen3-8b"]["open_incidents"] == [{"kind": "slo_burn", "severity": "page"}]
    # Quiet: ok (its prompts ran in the last 24 h), not "no data"; no latency figures of its own.
    assert whole["gpt-4o-mini"]["status"] == "ok" and whole["gpt-4o-mini"]["last_run_at"] is not None
    assert whole["gpt-4o-mini"]["p50_last_hour_ms"] is None and whole["gpt-4o-mini"]["ratio"] is None


async def test_a_grouped_member_says_it_was_notified_as_part_of_its_group(backend: Backend) -> None:
    # One model slow on two prompts: two incidents, one group, one page sent under the lead's id.
    from monitor.alert.dispatcher import Dispatcher
    from monitor.alert.transport import Transport
    from tests.support.detection import config, outage, run_ticks, service_on

    engine = backend.engine()
    settings = config()
    try:
        await run_ticks(engine, service_on(engine, settings), outage({"a1": 3.0}), targets=("a1",))
        async with Transport() as transport:
            dispatcher = Dispatcher(engine, settings.alerts, transport, rng=random.Random(7), poll_interval_s=0.05)
            await dispatcher.dispatch_due()
        items = await queries.incidents(engine, start=T0, end=T0 + timedelta(days=1))
    finally:
        await engine.dispose()
    assert len(items) == 2 and items[0]["group_id"] == items[1]["group_id"] is not None
    lead = next(i for i in items if i["notifications"])
    member = next(i for i in items if i is not lead)
    assert member["notifications"] == []
    assert member["group"]["lead"] is False and lead["group"]["lead"] is True
    assert member["group"]["lead_incident_id"] == lead["id"] and member["group"]["members"] == 2
    # Dispatched after the resolve: the page it replaced is superseded, the resolve sent.
    assert [(n["event"], n["status"]) for n in member["group"]["notifications"]] == [
        ("firing", "superseded"),
        ("resolved", "sent"),
    ]


@pytest.mark.parametrize(
    ("runs", "first_minutes_ago", "expected"),
    [
        (0, None, "no runs yet"),
        (12, 5, "learning, 12 of 24 runs"),
        (30, 40, "first hour: from 11:20 UTC"),
        (30, 90, "no runs in the day before the last hour"),
    ],
)
def test_a_series_without_a_baseline_says_why(runs: int, first_minutes_ago: int | None, expected: str) -> None:
    now = datetime(2026, 3, 2, 11, 0, tzinfo=UTC)
    first = now - timedelta(minutes=first_minutes_ago) if first_minutes_ago is not None else None
    assert queries.baseline_note(runs=runs, first_run_at=first, min_history_runs=24, now=now) == expected


async def test_the_overview_of_young_series_says_the_detector_is_learning(backend: Backend) -> None:
    # Runs every minute for a few minutes: no baseline anywhere yet, and the reason instead of a dash.
    repository = Repository(backend.engine())
    for minute in range(5):
        await repository.save_runs(make_batch(T0 + timedelta(minutes=minute)))
    rows = await queries.overview(repository.engine, now=T0 + timedelta(minutes=5), min_history_runs=24)
    default = await queries.overview(repository.engine, now=T0 + timedelta(minutes=5))
    await repository.engine.dispose()
    assert len(rows) == 4
    assert {(r["baseline_ms"], r["baseline_note"]) for r in rows} == {(None, "learning, 5 of 24 runs")}
    assert {r["baseline_note"] for r in default} == {f"learning, 5 of {Rules().min_history_runs} runs"}


async def test_a_compare_of_one_hour_from_the_rollups_has_no_interval_rather_than_a_false_one(backend: Backend) -> None:
    repository = await _store(backend, hours=1)
    try:
        hourly = await queries.compare(repository.engine, start=T0, end=T0 + timedelta(hours=1), max_runs=0)
        assert hourly["resolution"] == "hour" and hourly["cells"]
        assert {(c["ci_low_ms"], c["ci_high_ms"]) for c in hourly["cells"]} == {(None, None)}
        assert hourly["pairs"] and not any(p["significant"] for p in hourly["pairs"])
        assert {(p["ci_low_ms"], p["ci_high_ms"]) for p in hourly["pairs"]} == {(None, None)}
    finally:
        await repository.engine.dispose()


async def test_a_series_view_reads_without_parallel_workers_and_leaves_the_pool_as_it_was(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL started two workers for a day of one series' samples over many day partitions, 8-15 ms of a
    # 0.6 ms statement: the series view's transaction asks for none; the compares, sharing the pool, keep them.
    repository = await _store(backend, hours=2)
    async with repository.engine.connect() as connection:
        series_id = await connection.scalar(sa.text("SELECT id FROM series WHERE target='qwen3-8b' AND prompt='short'"))
    seen: list[str] = []
    series_of = queries._series

    async def series_and_setting(connection: AsyncConnection, ids: list[int]) -> object:
        if connection.dialect.name == "postgresql":
            seen.append(await connection.scalar(sa.text("SHOW max_parallel_workers_per_gather")))
        return await series_of(connection, ids)

    monkeypatch.setattr(queries, "_series", series_and_setting)
    view = await queries.series_points(repository.engine, series_id, start=T0, end=T0 + timedelta(hours=2))
    assert len(view["points"]) == 24 * 5
    if backend.name == "postgres":
        assert seen == ["0"]
        async with repository.engine.connect() as connection:  # the pool's connection, given back
            assert await connection.scalar(sa.text("SHOW max_parallel_workers_per_gather")) != "0"
    await repository.engine.dispose()
