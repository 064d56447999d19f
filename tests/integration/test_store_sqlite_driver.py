"""SQLite statements through store/sqlite_driver.py: one trip to the connection's thread each, with the results,
counts, errors and transactions SQLAlchemy's aiosqlite adapter gives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.store.engine import create_engine, write_transaction
from tests.support.store_fixtures import counted_trips


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/driver.db")
    async with engine.begin() as connection:
        await connection.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE, n INTEGER)")
    yield engine
    await engine.dispose()


async def trips(engine: AsyncEngine, statement: Any, parameters: Any = None) -> tuple[Any, int]:
    """The statement's result (rows, else rowcount) and the trips its execution took to the thread."""
    async with engine.connect() as connection:
        await connection.begin()
        async with counted_trips(connection) as count:
            result = await connection.execute(statement, parameters)
            out = result.all() if result.returns_rows else result.rowcount
        await connection.commit()
    return out, count[0]


async def test_each_statement_is_one_trip_to_the_thread(engine: AsyncEngine) -> None:
    rows = [{"name": f"n{i}", "n": i} for i in range(5)]
    assert await trips(engine, sa.text("INSERT INTO t (name, n) VALUES (:name, :n)"), rows) == (5, 1)
    selected, count = await trips(engine, sa.text("SELECT name, n FROM t WHERE n >= :low ORDER BY n"), {"low": 3})
    assert [tuple(row) for row in selected] == [("n3", 3), ("n4", 4)] and count == 1
    assert await trips(engine, sa.text("UPDATE t SET n = n + 10 WHERE n < 2")) == (2, 1)
    assert await trips(engine, sa.text("SELECT name FROM t WHERE n > 100")) == ([], 1)


async def test_insert_returning_many_rows_returns_each_inserted_row(engine: AsyncEngine) -> None:
    table = sa.table("t", sa.column("id"), sa.column("name"), sa.column("n"))
    from sqlalchemy.dialects import sqlite

    statement = sqlite.insert(table).on_conflict_do_nothing().returning(table.c.name)
    async with engine.begin() as connection:
        first = set(await connection.scalars(statement, [{"name": "a", "n": 1}, {"name": "b", "n": 2}]))
        again = set(await connection.scalars(statement, [{"name": "a", "n": 1}, {"name": "c", "n": 3}]))
    assert (first, again) == ({"a", "b"}, {"c"})


async def test_errors_and_rollback_are_the_adapters(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(sa.text("INSERT INTO t (name, n) VALUES ('x', 1)"))
    with pytest.raises(IntegrityError):
        async with write_transaction(engine) as connection:
            await connection.execute(sa.text("INSERT INTO t (name, n) VALUES ('y', 2)"))
            await connection.execute(sa.text("INSERT INTO t (name, n) VALUES ('x', 3)"))
    with pytest.raises(OperationalError, match="no such table"):
        async with engine.connect() as connection:
            await connection.execute(sa.text("SELECT * FROM missing"))
    async with engine.connect() as connection:
        names = (await connection.execute(sa.text("SELECT name FROM t ORDER BY name"))).scalars().all()
    assert names == ["x"]  # the failed transaction's first insert rolled back with it


async def test_a_result_read_in_parts_gives_every_row_once(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            sa.text("INSERT INTO t (name, n) VALUES (:name, :n)"), [{"name": f"n{i}", "n": i} for i in range(7)]
        )
        result = await connection.execute(sa.text("SELECT n FROM t ORDER BY n"))
        assert result.fetchone() == (0,)
        assert result.fetchmany(2) == [(1,), (2,)]
        assert result.fetchall() == [(3,), (4,), (5,), (6,)]
