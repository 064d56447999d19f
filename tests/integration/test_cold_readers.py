"""Every reader of older runs and samples gives the same answer once their days are in the cold tier
(monitor/store/cold.py), on both databases: two databases get the same runs, one of them is compacted, and each
view, export and statistic is read from both and compared, through late runs in compacted days too."""

from __future__ import annotations

import io
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from monitor.config.series import warm_twin
from monitor.detect.export import export_samples
from monitor.probe.result import ErrorClass
from monitor.store import cold
from monitor.store.models import RUNS
from monitor.store.records import ADHOC_JOB
from monitor.store.repository import Repository
from monitor.store.triage import TriageStore
from monitor.web import queries
from tests.support.store_fixtures import T0, Backend, PostgresServer, count_decodes, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
# Each test fills two databases with a month of runs and reads every view of both several times: 20-40 s on a
# quiet machine, past the default 60 s when the machine is loaded.
pytestmark = pytest.mark.timeout(240)

# Runs every 4 hours (at 50 past) for 31 days; `NOW` puts each overview window's start 10 minutes before a run,
# so the part hour at the month's start (a compacted day) holds one.
NOW = T0 + timedelta(days=30, hours=4, minutes=40)
COLD_AFTER_DAYS = 9
WARM = warm_twin("short")


def history() -> list[Any]:
    batch = []
    for tick in range(31 * 6):
        at = T0 + timedelta(hours=4 * tick, minutes=50)
        if at >= NOW:
            break
        errors = {3: ErrorClass.TIMEOUT_TOTAL} if tick % 9 == 0 else None
        if tick % 19 == 5:  # a run whose every round failed
            errors = dict.fromkeys(range(1, 7), ErrorClass.SERVER_ERROR)
        batch += make_batch(at, targets=("qwen3-8b",), prompts=("short", WARM), errors=errors)
        batch += make_batch(at, targets=("gpt-4o-mini",), prompts=("long",), rounds=3)
        if tick < 6:  # a series that stopped running 29 days ago: its last run is in a compacted day
            batch += make_batch(at, targets=("gpt-4o-mini",), prompts=("short",), location="retired")
        if tick < 48:  # one that stopped 22 days ago after more runs than a baseline needs, all compacted
            batch += make_batch(at, targets=("gpt-4o-mini",), prompts=("short",), location="retired-long")
        if tick % 25 == 0:
            batch += make_batch(at + timedelta(minutes=3), targets=("qwen3-8b",), prompts=("short",),
                                job=ADHOC_JOB, location="adhoc-lab", rounds=2, warmup=0)  # fmt: skip
    return batch


@pytest.fixture
async def twins(
    backend: Backend, tmp_path: Path, postgres_server: PostgresServer | None
) -> AsyncIterator[tuple[Repository, Repository]]:
    """Two databases with the same history, rolled up; the first is compacted by the test, the second never."""
    if backend.name == "sqlite":
        path = Path(sa.engine.make_url(backend.url).database or "")
        shutil.copyfile(path, tmp_path / "twin.db")
        other = Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'twin.db'}")
    else:
        assert postgres_server is not None
        other = Backend("postgres", await postgres_server.create())
    engines = [backend.engine(), other.engine()]
    try:
        repositories = (Repository(engines[0]), Repository(engines[1]))
        batch = history()
        for repository in repositories:
            for offset in range(0, len(batch), 400):
                await repository.save_runs(batch[offset : offset + 400])
            await repository.rollup(NOW)
            await repository.refresh_overview_summary(NOW)
        yield repositories
    finally:
        for engine in engines:
            await engine.dispose()
        if other.name == "postgres" and postgres_server is not None:
            await postgres_server.drop(other.url)


async def views(repository: Repository, *, every_series: bool = True) -> dict[str, Any]:
    """What each reader of runs and samples shows of the history (the series view of the `short` prompt's
    series only unless `every_series`)."""
    engine = repository.engine
    out: dict[str, Any] = {}
    out["overview"] = await queries.overview(engine, now=NOW)
    async with engine.connect() as connection:
        ids = {
            row.prompt + "/" + row.location: row.id for row in await connection.execute(sa.text("SELECT * FROM series"))
        }
    for name, series_id in sorted(ids.items()):
        if not every_series and not name.startswith("short"):
            continue
        for start, end in (
            (T0, T0 + timedelta(days=2)),  # a compacted range: every sample
            (NOW - timedelta(days=12), NOW - timedelta(days=5)),  # across the cutoff: buckets
            (T0 + timedelta(hours=5), T0 + timedelta(hours=9)),  # part of one compacted day
            (NOW - timedelta(days=30), NOW),  # hours, and the runs of the hours no rollup holds
        ):
            out[f"series {name} {start}"] = await queries.series_points(engine, series_id, start=start, end=end)
    for start, end in (
        (T0, NOW),
        (T0 + timedelta(days=3, hours=1), T0 + timedelta(days=4, hours=5)),
        (NOW - timedelta(days=10), NOW),
    ):
        out[f"compare {start}"] = await queries.compare(engine, start=start, end=end)
        out[f"compare hourly {start}"] = await queries.compare(engine, start=start, end=end, max_runs=10)
    stream = io.StringIO()
    out["export count"] = await export_samples(repository, stream)
    out["export"] = stream.getvalue()
    out["watched"] = sorted(await TriageStore(engine).watched(since=None))
    out["watched since"] = sorted(await TriageStore(engine).watched(since=T0 + timedelta(days=2, hours=3)))
    return out


def assert_same(compacted: dict[str, Any], rows: dict[str, Any]) -> None:
    assert compacted.keys() == rows.keys()
    for key in rows:
        assert compacted[key] == rows[key], key


async def test_every_reader_gives_the_same_answer_after_compaction(twins: tuple[Repository, Repository]) -> None:
    compacted, rows = twins
    before = await views(compacted)
    done = await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert done.series_days >= 21 * 3 and done.samples > 0  # 21 days of 3 series, and more
    async with compacted.engine.connect() as connection:
        oldest = await connection.scalar(sa.select(RUNS.c.started_at).order_by(RUNS.c.started_at).limit(1))
    assert oldest is not None and oldest >= cold.day_of(T0 + timedelta(days=21))  # the cold days hold no rows
    after = await views(compacted)
    assert_same(after, before)
    assert_same(after, await views(rows))
    # The overview without housekeeping's summary scans the rollups and reads the runs alike.
    for repository in twins:
        async with repository.engine.begin() as connection:
            await connection.execute(sa.text("DELETE FROM overview_summary_state"))
    assert await queries.overview(compacted.engine, now=NOW) == await queries.overview(rows.engine, now=NOW)


async def test_the_overview_decodes_only_the_newest_chunks_of_a_series_without_a_baseline(
    twins: tuple[Repository, Repository], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The month starts at the top of an hour (a rollup holds it whole: no chunk is read for its first hour, of
    every series, on every call), and a retired series' note needs its runs counted only up to the baseline's
    minimum: `retired-long`'s 9 days of chunks are read newest first until 24 runs with a TTFT (its last day's 2
    runs and 4 days of 6), `retired`'s 2 days whole. Before, the same overview decoded 16 chunks."""
    compacted, rows = twins
    await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    await compacted.refresh_overview_summary(NOW)  # as housekeeping keeps it: the quiet series' last runs
    decoded = count_decodes(monkeypatch)
    shown = await queries.overview(compacted.engine, now=NOW)
    assert shown == await queries.overview(rows.engine, now=NOW)
    notes = {row["location"]: row["baseline_note"] for row in shown if row["location"].startswith("retired")}
    assert notes == {"retired": "learning, 5 of 24 runs", "retired-long": "no runs in the day before the last hour"}
    assert 0 < len(decoded) <= 2 + 5, len(decoded)


async def test_counts_and_first_starts_from_the_chunks_figures_match_a_full_read(
    twins: tuple[Repository, Repository],
) -> None:
    """What the compare chooses its resolution by: runs counted from the chunks' stored figures (decoded only
    where a window cuts a chunk) and the first start, against every run read."""
    compacted, _ = twins
    await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    async with compacted.engine.connect() as connection:
        ids = list(await connection.scalars(sa.text("SELECT id FROM series")))
        for start, end in (
            (T0, NOW),  # every chunk whole, and rows
            (T0 + timedelta(hours=5), T0 + timedelta(days=3, hours=2)),  # cuts the first and the last day's chunk
            (T0 + timedelta(hours=20), T0 + timedelta(hours=21)),  # inside one chunk, cut at both ends
            (NOW - timedelta(days=3), NOW),  # rows only
        ):
            read = await cold.read_runs(connection, ids, start, end, samples=False, run_keys=())
            assert sum(await cold.count_runs(connection, ids, start, end)) == len(read.runs), (start, end)
            first = read.runs[0]["started_at"] if read.runs else None
            assert await cold.first_start(connection, ids, start, end) == first, (start, end)
            for one in ids:
                single = await cold.read_runs(connection, [one], start, end, samples=False, run_keys=())
                assert sum(await cold.count_runs(connection, [one], start, end)) == len(single.runs)


async def test_a_compare_over_compacted_days_reads_hours_sooner_than_one_over_rows(
    twins: tuple[Repository, Repository],
) -> None:
    """A compacted run costs a compare by samples COLD_RUN_COST rows' worth: the same window of 60-odd runs is
    read by samples from rows and by hours from chunks under a limit of 150 runs."""
    compacted, rows = twins
    await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    start, end = T0, T0 + timedelta(days=2)
    assert (await queries.compare(rows.engine, start=start, end=end, max_runs=150))["resolution"] == "sample"
    assert (await queries.compare(compacted.engine, start=start, end=end, max_runs=150))["resolution"] == "hour"
    assert (await queries.compare(compacted.engine, start=start, end=end))["resolution"] == "sample"


async def test_late_runs_of_compacted_days_are_read_beside_their_chunks_by_every_reader(
    twins: tuple[Repository, Repository],
) -> None:
    compacted, rows = twins
    await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    # A spool drained after an outage: runs of ticks no run had, in compacted days (one in the part hour at the
    # month window's start), and a replica's second run of a tick the chunk holds (skipped by the rows' twin).
    late = make_batch(T0 + timedelta(days=1, hours=3, minutes=10), targets=("qwen3-8b",), prompts=("short",))
    late += make_batch(NOW - timedelta(days=30, minutes=5), targets=("gpt-4o-mini",), prompts=("long",), rounds=3)
    late += make_batch(T0 + timedelta(days=2, minutes=50), targets=("qwen3-8b",), prompts=("short",))
    stored = [await repository.save_runs(late) for repository in twins]
    assert len(stored[0]) == 3 and len(stored[1]) == 2  # the chunk's tick is not seen by the rows' key
    # Pending hours: the overview reads their runs one by one until the rollup.
    assert_same(await views(compacted, every_series=False), await views(rows, every_series=False))
    for repository in twins:
        await repository.rollup(NOW)
        await repository.refresh_overview_summary(NOW)
    assert_same(await views(compacted, every_series=False), await views(rows, every_series=False))
    # The next compaction folds the late runs in and deletes the second run of the held tick.
    folded = await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert (folded.runs, folded.duplicates) == (2, 1)
    assert_same(await views(compacted), await views(rows))


async def test_a_reader_racing_a_compaction_sees_the_day_once(twins: tuple[Repository, Repository]) -> None:
    compacted, rows = twins
    [key] = [
        k
        for k in await compacted.series_list()
        if (k.target, k.prompt, k.location) == ("qwen3-8b", "short", "test-lab")
    ]
    span = (T0, T0 + timedelta(days=2))
    wanted = await compacted.load_runs(key, *span)
    async with compacted.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection = await connection.execution_options(isolation_level="REPEATABLE READ")
        series_id = await connection.scalar(  # the snapshot is taken
            sa.text("SELECT id FROM series WHERE target = 'qwen3-8b' AND prompt = 'short' AND location = 'test-lab'")
        )
        first = await cold.read_runs(connection, [series_id], *span)
        if compacted.engine.dialect.name == "postgresql":
            # Another session compacts meanwhile; this snapshot still sees the rows, once.
            await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
            second = await cold.read_runs(connection, [series_id], *span)
            assert [r["id"] for r in second.runs] == [r["id"] for r in first.runs]
    assert [run.run_id for run, _ in wanted] == [r["id"] for r in first.runs]
    await compacted.compact(NOW, cold_after_days=COLD_AFTER_DAYS)
    assert await compacted.load_runs(key, *span) == wanted == await rows.load_runs(key, *span)
