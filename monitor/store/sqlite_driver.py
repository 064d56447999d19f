"""aiosqlite connections whose statements each cost one trip to the connection's thread.

SQLAlchemy's aiosqlite adapter makes a cursor, executes, fetches the rows and closes the cursor for every
statement, and aiosqlite runs each of the four on its worker thread: four trips for a SELECT, three for
an INSERT, each a queue put, a thread wake-up, a wake-up of the event loop (a write to its self-pipe) and a
future resolved there. The daemon runs thousands of statements a minute (detection alone about six per
series and tick), and the trips were a large share of its CPU per probe (bench/daemon.py). Here `cursor()`
costs no trip, and `execute` runs the statement, reads every row and closes the sqlite3 cursor in one:
what the adapter did anyway (it reads every row of a result at once), in the same order, on the same
thread, so nothing else about a statement changes (its transaction, its errors, a progress handler's
interruption, `rowcount` and `lastrowid`).

Relies on two private members of aiosqlite's `Connection`, as SQLAlchemy's adapter does on others:
`_execute` (run a call on the thread) and `_conn` (the sqlite3 connection, used only on the thread).
tests/integration/test_store_sqlite_driver.py pins them.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import aiosqlite

# sqlite3's cursor.description: one 7-tuple per column.
Description = tuple[tuple[Any, ...], ...] | None


def _run(
    connection: sqlite3.Connection, sql: str, parameters: Any, many: bool
) -> tuple[list[Any], Description, int, int | None]:
    """On the connection's thread: the statement's rows (all of them), description, rowcount, lastrowid."""
    cursor = connection.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description is not None else []
        return rows, description, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneTripCursor:
    """The part of aiosqlite's `Cursor` SQLAlchemy's adapter uses; each statement one trip to the thread."""

    __slots__ = ("_connection", "_rows", "arraysize", "description", "lastrowid", "rowcount")

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._connection = connection
        self._rows: deque[Any] = deque()
        self.description: Description = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _statement(self, sql: str, parameters: Any, *, many: bool) -> OneTripCursor:
        connection = self._connection
        rows, self.description, self.rowcount, self.lastrowid = await connection._execute(  # type: ignore[no-untyped-call]
            lambda: _run(connection._conn, sql, parameters, many)
        )
        self._rows = deque(rows)
        return self

    async def execute(self, sql: str, parameters: Any = None) -> OneTripCursor:
        return await self._statement(sql, () if parameters is None else parameters, many=False)

    async def executemany(self, sql: str, parameters: Iterable[Any]) -> OneTripCursor:
        return await self._statement(sql, parameters, many=True)

    async def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        count = min(len(self._rows), self.arraysize if size is None else size)
        return [self._rows.popleft() for _ in range(count)]

    async def fetchall(self) -> Sequence[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    async def close(self) -> None:
        """The sqlite3 cursor was closed with its statement; only the rows not read are let go."""
        self._rows.clear()


class OneTripConnection(aiosqlite.Connection):
    """aiosqlite's connection whose cursors are `OneTripCursor`s; everything else is aiosqlite's."""

    def cursor(self) -> OneTripCursor:  # type: ignore[override]
        return OneTripCursor(self)


def connect(database: str, **options: Any) -> OneTripConnection:
    """Like `aiosqlite.connect(database, **options)` (not yet awaited: the thread starts when it is)."""

    def connector() -> sqlite3.Connection:
        connection: sqlite3.Connection = sqlite3.connect(database, **options)
        return connection

    return OneTripConnection(connector, iter_chunk_size=64)
