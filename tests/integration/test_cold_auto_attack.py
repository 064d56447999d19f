"""Attacks on the cold tier's `auto` default (database.retention.cold_after_days: auto): what housekeeping compacts
must leave every reader its answer (detection's history, read from chunks and rows alike, whatever its schedule
and rules reach back), and the readers made cheap for it must answer as a full read does. On SQLite and
PostgreSQL, real databases; each test states the defect it pins."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from structlog.testing import capture_logs

from monitor.config.loader import load_config
from monitor.config.models import ColdPolicy, Config, Database
from monitor.daemon import Daemon
from monitor.detect import service as detect_service
from monitor.detect.detector import Detector
from monitor.detect.history import SeriesHistory
from monitor.detect.service import DetectionService
from monitor.detect.state import RunPoint, SeriesState
from monitor.probe.result import ErrorClass
from monitor.schedule import maintenance
from monitor.store import migrate, overview_summary
from monitor.store.models import DETECTOR_STATE
from monitor.store.records import RunRecord, SeriesKey
from monitor.store.repository import Repository
from monitor.web import queries
from tests.support.ports import free_port
from tests.support.store_fixtures import T0, Backend, count_decodes, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
pytestmark = pytest.mark.timeout(240)

SERIES = SeriesKey("qwen3-8b", "vllm", "Qwen/Qwen3-8B", "short", "test-lab")


def config_with(tmp_path: Path, schedule: str, *, detection: dict[str, Any] | None = None, **more: str) -> Config:
    """A config whose job `probe` (and each of `more`, by name) probes qwen3-8b's `short` prompt on `schedule`:
    one series; cold_after_days left at auto."""
    jobs = {"probe": schedule, **more}
    data: dict[str, Any] = {
        "providers": {"vllm": {"base_url": "http://127.0.0.1:8400/v1", "api": "openai-chat"}},
        "targets": {"qwen3-8b": {"provider": "vllm", "model": "Qwen/Qwen3-8B"}},
        "prompts": {"short": {"tokens": 512}},
        "jobs": [{"name": n, "schedule": e, "targets": ["qwen3-8b"], "prompts": ["short"]} for n, e in jobs.items()],
        "detection": detection or {},
    }
    path = tmp_path / f"config-{len(list(tmp_path.glob('config*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_config(path, environ={})


@contextmanager
def clock_at(moment: datetime) -> Iterator[None]:
    """`datetime.now()` in monitor.detect.service reads `moment` (job_interval asks the wall clock for the
    job's next two fires)."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Frozen:  # type: ignore[override]
            return cls.fromtimestamp(moment.timestamp(), tz)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(detect_service, "datetime", Frozen)
        yield


def runs_at(moments: list[datetime], *, job: str = "probe") -> list[tuple[RunRecord, list[Any]]]:
    batch = []
    for at in moments:
        batch += make_batch(at, targets=("qwen3-8b",), prompts=("short",), job=job, rounds=1, warmup=0)
    return batch


async def save(repository: Repository, batch: list[tuple[RunRecord, list[Any]]]) -> None:
    for offset in range(0, len(batch), 500):
        await repository.save_runs(batch[offset : offset + 500])


async def housekeep(repository: Repository, now: datetime, policy: ColdPolicy | None) -> int:
    """What maintain_once does of the cold tier at `now`: roll up, then compact by the config's policy."""
    assert policy is not None
    await repository.rollup(now)
    done = await repository.compact(now, cold_after_days=policy.after_days, keep_runs=policy.keep_runs)
    return done.series_days


def history_since(config: Config, at: datetime, job: str = "probe") -> datetime:
    """Where detection's history of the job's run at `at` starts (DetectionService._evaluate_once: the job's
    interval from its schedule once the run is done, then the detector's `history_since`)."""
    with clock_at(at + timedelta(seconds=10)):
        interval = detect_service.job_interval(config, job)
    return Detector(config.detection.rules()).history_since(at, interval=interval)


async def detection_reads(
    repository: Repository, config: Config, at: datetime, job: str = "probe"
) -> list[tuple[Any, ...]]:
    """The runs detection reads to evaluate the job's run at `at` (`Repository.history_rows`: rows and chunks)."""
    read = await repository.history_rows(SERIES, history_since(config, at, job), at)
    return [tuple(row) for row in read.rows]


async def chunked_share(repository: Repository, config: Config, at: datetime, job: str = "probe") -> float:
    """The share of what detection reads for the run at `at` that comes from cold chunks."""
    read = await repository.history_rows(SERIES, history_since(config, at, job), at)
    return 0.0 if not read.from_chunks else sum(read.from_chunks) / len(read.from_chunks)


def verdict(config: Config, rows: list[tuple[Any, ...]], at: datetime, job: str = "probe") -> tuple[Any, ...]:
    """What the detector makes of a run at `at` after `rows` (from a fresh state): the new state (its noise
    model is learnt from every run of the history), the events and the baseline."""
    since = history_since(config, at, job)
    history = SeriesHistory(since)
    history.extend(rows)  # type: ignore[arg-type]
    detector = Detector(config.detection.rules())
    state, events, baseline = detector.evaluate_with_baseline(
        history.points(since, at), SeriesState(), RunPoint(at=at, ttft_ms=900.0)
    )
    return state.to_json(), [event.kind for event in events], baseline


# ---------------------------------------------------------------- detection's history against auto's cutoff


def business_hours(start: datetime, end: datetime) -> list[datetime]:
    """Every 5 minutes from 9:00 to 17:55 UTC, Monday to Friday: `*/5 9-17 * * 1-5`."""
    out = []
    moment = start
    while moment < end:
        if moment.weekday() < 5 and 9 <= moment.hour <= 17:
            out.append(moment)
        moment += timedelta(minutes=5)
    return out


async def test_auto_leaves_a_business_hours_jobs_detection_every_run_it_reads(backend: Backend, tmp_path: Path) -> None:
    """A job probing `*/5 9-17 * * 1-5`: the detector evaluates the day's 17:50 run with the 15 h (63 h on a
    Friday) to the next fire after 17:55 as its interval, so its history reaches 38 days back (every run the 30
    days of retention keep). Once auto kept each series' newest runs as rows, it lost three weeks of them; then
    it compacted nothing for such a job. Now it compacts all but 3 days, and detection reads them from chunks."""
    config = config_with(tmp_path, "*/5 9-17 * * 1-5")
    engine = backend.engine()
    try:
        repository = Repository(engine)
        friday = T0 + timedelta(days=25)  # T0 is a Monday, 9:00: four weeks of business hours
        assert friday.weekday() == 4
        at = friday.replace(hour=17, minute=50)
        await save(repository, runs_at(business_hours(T0, at)))
        before = await detection_reads(repository, config, at)
        assert before[0][0] < T0 + timedelta(hours=1)  # every run since the first
        assert await housekeep(repository, at + timedelta(minutes=6), config.cold_policy()) >= 15  # business days
        assert await chunked_share(repository, config, at) > 0.8
        after = await detection_reads(repository, config, at)
        assert len(after) == len(before), f"detection read {len(after)} runs, {len(before)} before compaction"
        assert verdict(config, after, at) == verdict(config, before, at)
    finally:
        await engine.dispose()


async def test_auto_leaves_a_slowed_jobs_detection_every_run_it_reads(backend: Backend, tmp_path: Path) -> None:
    """A job slowed from every 5 minutes to hourly: its first hourly run's detection reads 61 hours before the
    lookback (its 61st newest run is 5 hours old). When auto kept each series' newest runs and a day as rows, it
    compacted 31 hours that detection read."""
    hourly = config_with(tmp_path, "0 * * * *")
    engine = backend.engine()
    try:
        repository = Repository(engine)
        switched = T0 + timedelta(days=12, hours=3)  # the config changed at 12:00 on day 12
        moments = [T0 + timedelta(minutes=5 * k) for k in range(int((switched - T0) / timedelta(minutes=5)))]
        await save(repository, runs_at(moments))
        at = switched + timedelta(hours=1)  # the first hourly run
        before = await detection_reads(repository, hourly, at)
        compacted = await housekeep(repository, switched + timedelta(seconds=30), hourly.cold_policy())
        assert compacted >= 8
        assert await chunked_share(repository, hourly, at) > 0.5
        after = await detection_reads(repository, hourly, at)
        assert len(after) == len(before), f"detection read {len(after)} runs, {len(before)} before compaction"
        assert verdict(hourly, after, at) == verdict(hourly, before, at)
    finally:
        await engine.dispose()


async def test_auto_leaves_the_slower_of_two_jobs_on_a_series_every_run_its_detection_reads(
    backend: Backend, tmp_path: Path
) -> None:
    """Two jobs of one config probe the same series (a config accepts it), every 5 minutes and every hour: the
    hourly job's runs are evaluated with an hour as the interval (61 h before the lookback), the series' 61st
    newest run is 5 hours old, for good."""
    config = config_with(tmp_path, "0 * * * *", fast="*/5 * * * *")
    engine = backend.engine()
    try:
        repository = Repository(engine)
        now = T0 + timedelta(days=13, hours=3, seconds=30)
        ticks = [T0 + timedelta(minutes=5 * k) for k in range(int((now - T0) / timedelta(minutes=5)))]
        await save(repository, runs_at(ticks, job="fast") + runs_at([t for t in ticks if t.minute == 0]))
        at = now.replace(second=0) + timedelta(hours=1)  # the hourly job's next run
        before = await detection_reads(repository, config, at)
        assert await housekeep(repository, now, config.cold_policy()) > 0
        assert await chunked_share(repository, config, at) > 0.5
        after = await detection_reads(repository, config, at)
        assert len(after) == len(before), f"detection read {len(after)} runs, {len(before)} before compaction"
        assert verdict(config, after, at) == verdict(config, before, at)
    finally:
        await engine.dispose()


async def test_auto_leaves_another_locations_detection_every_run_it_reads(backend: Backend, tmp_path: Path) -> None:
    """A database shared by several locations, or by replicas whose configs differ: a daemon with the default
    rules (8-day lookback) compacts the series of another whose detection compares with the 14 days before
    (15-day lookback). Compaction once kept where the other's detection last read from as rows
    (`detector_state.reads_from`), and lost the difference for a series whose detection had not written its
    state since; the other's evaluation now reads the same runs and gives the same verdict either way."""
    here = config_with(tmp_path, "*/5 * * * *")
    there = config_with(tmp_path, "*/5 * * * *", detection={"seasonal_days": 14})
    engine = backend.engine()
    try:
        repository = Repository(engine)
        now = T0 + timedelta(days=18, seconds=30)
        moments = [T0 + timedelta(minutes=5 * k) for k in range(18 * 288)]
        await save(repository, runs_at(moments[:-1]))
        last = runs_at(moments[-1:])
        await save(repository, last)
        at = now.replace(second=0)
        before = await detection_reads(repository, there, at)
        assert at - before[0][0] > timedelta(days=15)
        assert await housekeep(repository, now, here.cold_policy()) >= 14
        assert await chunked_share(repository, there, at) > 0.75
        after = await detection_reads(repository, there, at)
        assert after == before
        assert verdict(there, after, at) == verdict(there, before, at)
        with clock_at(at + timedelta(seconds=10)):  # the other location's detection evaluates its last run
            await DetectionService(engine, repository, there, outbox=None, metrics=None).after_store("probe", last)
        async with engine.connect() as connection:
            assert await connection.scalar(sa.select(DETECTOR_STATE.c.reads_from)) is not None
    finally:
        await engine.dispose()


# ---------------------------------------------------------------- the overview's note of a series without a baseline


async def test_a_series_back_with_a_burst_after_its_days_were_compacted_keeps_its_overview_note(
    backend: Backend, twin: Backend
) -> None:
    """A series that ran every 4 hours for 10 days, went quiet (a location down) and came back probing every
    minute: no baseline (nothing in the week before the last hour), 30 runs in the last hour, and its first days
    compacted. Its runs in the month say `no runs in the day before the last hour`, compacted or not; counted
    with `enough` the last hour's 30 rows reached the baseline's minimum and their first start stood for the
    series' first run: `first hour: from 09:31 UTC`, as if the series had just started. One whose every older
    run failed (no TTFT to count) has just started, compacted or not."""
    now = T0 + timedelta(days=25)
    old = [T0 + timedelta(hours=4 * k) for k in range(60)]
    burst = [now - timedelta(minutes=minute) for minute in range(29, -1, -1)]
    batch = runs_at(old) + runs_at(burst)
    failed = {1: ErrorClass.SERVER_ERROR}
    for at in old:
        batch += make_batch(at, targets=("qwen3-8b",), prompts=("short",), location="failing", rounds=1, warmup=0,
                            errors=failed)  # fmt: skip
    for at in burst:
        batch += make_batch(at, targets=("qwen3-8b",), prompts=("short",), location="failing", rounds=1, warmup=0)
    engines = [backend.engine(), twin.engine()]
    try:
        compacted, rows = (Repository(engine) for engine in engines)
        for repository in (compacted, rows):
            await save(repository, batch)
            await repository.rollup(now)
            await repository.refresh_overview_summary(now)
        done = await compacted.compact(now, cold_after_days=9)
        assert done.series_days == 2 * 11
        shown = await queries.overview(compacted.engine, now=now)
        expected = await queries.overview(rows.engine, now=now)
        assert {row["location"]: row["baseline_note"] for row in expected} == {
            "test-lab": "no runs in the day before the last hour",
            "failing": "first hour: from 09:31 UTC",
        }
        assert shown == expected
    finally:
        for engine in engines:
            await engine.dispose()


async def test_the_live_overview_of_a_store_compacted_past_3_days_decodes_no_chunk(
    backend: Backend, twin: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Auto compacts every day past 3: the week's start fell in a compacted day, and the overview read its part
    hour through the chunks, a chunk decoded a series on every call (10 -> 43 ms p50 for 20 series at
    bench/cold.py's scale). The week starts at the top of its first hour, as the month does: its rollup holds it."""
    end = T0 + timedelta(days=10)
    batch = runs_at([T0 + timedelta(minutes=5 * k) for k in range(10 * 288)])
    now = end + timedelta(minutes=20, seconds=17)
    engines = [backend.engine(), twin.engine()]
    try:
        compacted, rows = (Repository(engine) for engine in engines)
        for repository in (compacted, rows):
            await save(repository, batch)
            await repository.rollup(end + timedelta(seconds=30))
            await repository.refresh_overview_summary(end + timedelta(seconds=30))
        assert (await compacted.compact(end, cold_after_days=3, keep_runs=24)).series_days == 7
        decoded = count_decodes(monkeypatch)
        shown = await queries.overview(compacted.engine, now=now)
        assert decoded == []
        assert shown == await queries.overview(rows.engine, now=now)
        assert shown[0]["availability_7d"] is not None
        # Three hours later, the series quiet since: its last run is looked up (overview_summary.last_runs), by
        # housekeeping's summary too. It is a row, newer than every chunk: none is read (each series' newest
        # chunk and the days of rows after it were, on every call).
        later = end + timedelta(hours=3)
        async with compacted.engine.begin() as connection:
            await overview_summary.refresh(connection, later)
        shown = await queries.overview(compacted.engine, now=later + timedelta(minutes=5))
        assert decoded == []
        assert shown == await queries.overview(rows.engine, now=later + timedelta(minutes=5))
        assert shown[0]["last_run_at"] is not None
    finally:
        for engine in engines:
            await engine.dispose()


async def test_a_retired_series_whose_last_days_are_rows_decodes_no_chunk_for_its_note(
    backend: Backend, twin: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix above looks at the chunks before a series' rows only where those rows begin in the last hour: a
    series retired 9 days ago keeps its newest runs as rows under auto (as many as the detector learns from: 24),
    its older days in chunks, and its note reads the same from the rows alone."""
    now = T0 + timedelta(days=29)
    batch = runs_at([T0 + timedelta(hours=4 * k) for k in range(6 * 20)])
    engines = [backend.engine(), twin.engine()]
    try:
        compacted, rows = (Repository(engine) for engine in engines)
        for repository in (compacted, rows):
            await save(repository, batch)
            await repository.rollup(now)
            await repository.refresh_overview_summary(now)
        done = await compacted.compact(now, cold_after_days=3, keep_runs=24)
        assert done.series_days > 0
        decoded = count_decodes(monkeypatch)
        shown = await queries.overview(compacted.engine, now=now)
        assert shown == await queries.overview(rows.engine, now=now)
        assert [row["baseline_note"] for row in shown] == ["no runs in the day before the last hour"]
        assert decoded == []
    finally:
        for engine in engines:
            await engine.dispose()


# ---------------------------------------------------------------- a reload's retention and policy


async def test_housekeeping_follows_the_policy_each_pass_sees(backend: Backend) -> None:
    """Housekeeping reads its retention and cold policy at each pass: set after it started (a reload), the new
    policy is the one its pass compacts by. Given once at its start, a reload to `cold_after_days: off` went on
    compacting until a restart, and one whose detection rules read further back went on compacting what they read."""
    from monitor.schedule.maintenance import Housekeeping  # new with the fix: imported here, so the module loads

    engine = backend.engine()
    try:
        repository = Repository(engine)
        await save(repository, runs_at([T0 + timedelta(hours=4 * k) for k in range(6 * 12)]))
        database = Database(url=backend.url)
        housekeeping = Housekeeping(database, ColdPolicy(after_days=3))
        stop = asyncio.Event()
        task = asyncio.create_task(maintenance.run_maintenance(repository, housekeeping, stop, first_after_s=0.5))
        housekeeping.cold = None  # the reload, before the pass
        with capture_logs() as logs:
            for _ in range(300):
                if any(entry["event"] == "maintenance_finished" for entry in logs):
                    break
                await asyncio.sleep(0.1)
        stop.set()
        await task
        assert [entry["series_days_compacted"] for entry in logs if entry["event"] == "maintenance_finished"] == [0]
    finally:
        await engine.dispose()


async def test_a_reload_hands_housekeeping_the_new_retention_and_cold_policy(tmp_path: Path) -> None:
    """The daemon's reload passes the new config's retention and cold policy to housekeeping, on its loop."""
    config = tmp_path / "config.yaml"
    text = f"""
location: test
shutdown_grace_s: 2
database:
  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"
  state_dir: "{tmp_path}/state"
  retention: {{raw_days: 30}}
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:
  sim: {{base_url: "http://127.0.0.1:9/v1", api: openai-chat}}
targets:
  fast: {{provider: sim, model: gpt-4o-mini}}
prompts:
  short: {{tokens: 128}}
jobs:
  - {{name: often, schedule: "*/5 * * * *", targets: [fast], prompts: [short]}}
"""
    config.write_text(text)
    await migrate.upgrade(f"sqlite+aiosqlite:///{tmp_path}/ttft.db")
    daemon = Daemon(str(config))
    await daemon.start()
    try:
        assert daemon.served is not None
        housekeeping = daemon.served.housekeeping
        assert housekeeping.cold is not None and housekeeping.database.retention.raw_days == 30
        config.write_text(text.replace("{raw_days: 30}", "{raw_days: 40, cold_after_days: 'off'}"))
        await daemon.reload()
        for _ in range(50):
            if housekeeping.cold is None:
                break
            await asyncio.sleep(0.05)
        assert housekeeping.cold is None and housekeeping.database.retention.raw_days == 40
    finally:
        await daemon.stop()
