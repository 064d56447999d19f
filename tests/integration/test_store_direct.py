"""Detection's hot statements run directly on SQLite (store/direct.py) read and write exactly what SQLAlchemy's
own execution of them does: the same rows and types, the same stored bytes, the same errors and statement
deadline, and one trip each to the connection's thread."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.probe.result import ErrorClass
from monitor.store.direct import DirectStatement
from monitor.store.engine import create_engine, write_transaction
from monitor.store.incidents import FIRST_STATE, READ_STATE, WRITE_STATE, IncidentStore
from monitor.store.models import DetectorStateRow
from monitor.store.records import SeriesKey
from monitor.store.repository import HISTORY_AFTER, HISTORY_FROM, RUN_SPAN, Repository
from monitor.store.statements import find_series_id
from tests.support.store_fixtures import T0, counted_trips, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

STATE = {"level": 186.83132367138577, "incidents": {"regression": {"since": "2026-12-06T10:00:00+00:00"}}, "n": [1, 2]}


@pytest.fixture
async def engine(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[AsyncEngine]:
    shutil.copyfile(sqlite_template, tmp_path / "store.db")
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
    repository = Repository(engine)
    for tick in range(4):
        # Tick 2 failed whole: its run's error and empty figures read back too.
        errors = dict.fromkeys(range(2, 5), ErrorClass.RATE_LIMITED) if tick == 2 else None
        await repository.save_runs(make_batch(T0 + timedelta(minutes=5 * tick), rounds=3, warmup=1, errors=errors))
    # Three runs of a day three days before, in the cold tier: the span's chunk edges read them.
    for tick in range(3):
        await repository.save_runs(make_batch(T0 - timedelta(days=3, minutes=-5 * tick), rounds=3, warmup=1))
    await repository.rollup(T0)
    assert (await repository.compact(T0, cold_after_days=1)).series_days > 0
    yield engine
    await engine.dispose()


async def _series_id(connection: AsyncConnection) -> int:
    return int((await connection.execute(text("SELECT min(id) FROM series"))).scalar_one())


async def _through_sqlalchemy(connection: AsyncConnection, statement: DirectStatement, values: dict[str, Any]) -> Any:
    return [tuple(row) for row in (await connection.execute(statement.statement, values)).all()]


@pytest.mark.parametrize(
    ("statement", "window"),
    [
        (HISTORY_FROM, {"start": T0 - timedelta(hours=1), "end": T0 + timedelta(hours=1)}),
        (HISTORY_AFTER, {"after": T0 + timedelta(minutes=2), "end": T0 + timedelta(hours=1)}),
        (RUN_SPAN, {"start": T0 - timedelta(hours=1), "end": T0 + timedelta(minutes=12), "recent": T0}),
        # The chunk's first and last runs.
        (
            RUN_SPAN,
            {"start": T0 - timedelta(hours=1), "end": T0 + timedelta(minutes=12), "recent": T0 - timedelta(days=5)},
        ),
        # None: count 0, no times.
        (RUN_SPAN, {"start": T0 + timedelta(days=1), "end": T0 + timedelta(days=2), "recent": T0 + timedelta(days=1)}),
    ],
)
async def test_a_history_read_gives_the_rows_sqlalchemy_gives(
    engine: AsyncEngine, statement: DirectStatement, window: dict[str, datetime]
) -> None:
    async with write_transaction(engine) as connection:
        values = {"series_id": await _series_id(connection), **window}
        direct = await statement.rows(connection, values)
        expected = await _through_sqlalchemy(connection, statement, values)
    assert direct == expected
    assert direct and all(
        type(a) is type(b) for row, same in zip(direct, expected, strict=True) for a, b in zip(row, same, strict=True)
    )
    started = [value for row in direct for value in row if isinstance(value, datetime)]
    assert all(moment.tzinfo is UTC for moment in started)


async def test_the_state_written_directly_is_stored_as_sqlalchemy_stores_it(engine: AsyncEngine) -> None:
    store = IncidentStore()
    now = datetime(2026, 12, 6, 10, 0, 0, 123456, tzinfo=UTC)
    raw: list[Any] = []
    for direct in (True, False):
        async with write_transaction(engine) as connection:
            series_id = await _series_id(connection)
            await connection.execute(text("DELETE FROM detector_state"))
            await store.write_state(connection, series_id, {"first": True}, read=None, now=now)
            read = await store.read_state(connection, series_id)
            assert read is not None and read.state == {"first": True} and read.version == 1
            values = {
                "state_series": series_id,
                "read_version": 1,
                "new_state": STATE,
                "new_version": 2,
                "written_at": now + timedelta(seconds=1),
                "reads_from": now - timedelta(days=8, microseconds=7),
            }
            if direct:
                assert await WRITE_STATE.rowcount(connection, values) == 1
                assert await WRITE_STATE.rowcount(connection, values) == 0  # the version moved: no row matches
            else:
                assert (await connection.execute(WRITE_STATE.statement, values)).rowcount == 1
            raw.append(tuple((await connection.execute(text("SELECT * FROM detector_state"))).one()))
            assert await READ_STATE.rows(connection, {"state_series": series_id}) == [(STATE, 2)]
    assert raw[0] == raw[1]


async def test_outside_a_transaction_sqlalchemy_runs_the_statement(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        assert not connection.in_transaction()
        values = {
            "series_id": await _series_id(connection),
            "start": T0 - timedelta(hours=1),
            "end": T0,
            "recent": T0,
        }
        await connection.rollback()
        [(count, first, last, oldest_chunk_run, newest_chunk_run)] = await RUN_SPAN.rows(connection, values)
        assert (count, first, last, newest_chunk_run) == (0, None, None, None)
        assert oldest_chunk_run is not None and abs(oldest_chunk_run - (T0 - timedelta(days=3))) < timedelta(seconds=2)


async def test_each_statement_is_one_trip_and_a_driver_error_is_sqlalchemy_s(engine: AsyncEngine) -> None:
    async with write_transaction(engine) as connection:
        series_id = await _series_id(connection)
        async with counted_trips(connection) as count:
            await READ_STATE.rows(connection, {"state_series": series_id})
        assert count == [1]
        broken = DirectStatement(text("SELECT missing_column FROM detector_state WHERE series_id = :series_id"))
        with pytest.raises(OperationalError, match="no such column"):
            await broken.rows(connection, {"series_id": series_id})


async def test_a_direct_statement_gets_the_statement_deadline(tmp_path: Path, sqlite_template: Path) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "store.db")
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", statement_timeout_s=0.2)
    endless = DirectStatement(
        text("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n WHERE :x = :x")
    )
    try:
        async with write_transaction(engine) as connection:
            with pytest.raises(OperationalError, match="interrupted"):
                await endless.rows(connection, {"x": 1})
    finally:
        await engine.dispose()


async def _saved(tmp_path: Path, sqlite_template: Path, name: str) -> tuple[list[Any], list[Any]]:
    """Every stored sample and roll-up mark (without its time) of a batch of four series, failures among them."""
    shutil.copyfile(sqlite_template, tmp_path / name)
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / name}")
    try:
        errors = {3: ErrorClass.TIMEOUT_FIRST_TOKEN, 4: ErrorClass.RATE_LIMITED}
        await Repository(engine).save_runs(make_batch(T0, rounds=4, warmup=1, errors=errors))
        async with engine.connect() as connection:
            samples = (
                await connection.exec_driver_sql(
                    "SELECT samples.* FROM samples JOIN runs ON runs.id = samples.run_id"
                    " JOIN series ON series.id = runs.series_id ORDER BY series.target, series.prompt, samples.round"
                )
            ).all()
            marks = (await connection.exec_driver_sql("SELECT series_id, hour FROM rollup_pending ORDER BY 1")).all()
    finally:
        await engine.dispose()
    return [tuple(row) for row in samples], [tuple(row) for row in marks]


async def test_a_batch_s_samples_are_stored_as_sqlalchemy_stores_them(
    tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = await _saved(tmp_path, sqlite_template, "direct.db")
    monkeypatch.setattr("monitor.store.direct._direct", lambda _connection: False)
    through_sqlalchemy = await _saved(tmp_path, sqlite_template, "sqlalchemy.db")
    assert len(direct[0]) == 4 * 5 and direct[1]
    # Run ids are new each save: compare everything else, in the same order.
    assert [row[1:] for row in direct[0]] == [row[1:] for row in through_sqlalchemy[0]]
    assert direct[1] == through_sqlalchemy[1]


async def test_a_first_state_is_stored_as_sqlalchemy_stores_it_and_a_second_one_conflicts(engine: AsyncEngine) -> None:
    now = datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC)  # no microseconds: stored with its six zeros all the same
    async with write_transaction(engine) as connection:
        ids = [row[0] for row in (await connection.exec_driver_sql("SELECT id FROM series ORDER BY id LIMIT 2")).all()]
        await connection.exec_driver_sql("DELETE FROM detector_state")
        reads_from = now - timedelta(days=8)
        first = {"state_series": ids[0], "new_state": STATE, "written_at": now, "reads_from": reads_from}
        await FIRST_STATE.rowcount(connection, first)
        await connection.execute(
            insert(DetectorStateRow).values(
                series_id=ids[1], state=STATE, version=1, updated_at=now, reads_from=reads_from
            )
        )
        rows = (await connection.exec_driver_sql("SELECT * FROM detector_state ORDER BY series_id")).all()
        assert [tuple(row)[1:] for row in rows] == [tuple(rows[1])[1:]] * 2
        with pytest.raises(IntegrityError):
            await FIRST_STATE.rowcount(connection, first)


async def test_a_series_id_is_found_directly_or_not_at_all(engine: AsyncEngine) -> None:
    async with write_transaction(engine) as connection:
        found = await connection.exec_driver_sql("SELECT id, target, provider, model, prompt, location FROM series")
        row: tuple[Any, ...] = tuple(found.first() or ())
        assert row
        series = SeriesKey(target=row[1], provider=row[2], model=row[3], prompt=row[4], location=row[5])
        assert await find_series_id(connection, series) == row[0]
        assert await find_series_id(connection, dataclasses.replace(series, target="absent")) is None
