"""Detection's hot statements on SQLite, each one trip to the connection's thread and nothing around it.

Detection reads and writes a few rows a series and tick (its history since the last run, the span that checks
it, its state and the state's compare-and-set): at 500 series, about 1,700 statements a tick on the probes'
loop. Through SQLAlchemy's asyncio adapter each cost about 160 us of that loop's CPU (a greenlet switch
each way, the adapted cursor, the execution context and its result object), against about 40 us for the
trip itself (bench/daemon.py: about a fifth of the daemon's CPU per probe). A `DirectStatement` is the
same statement compiled once by the connection's dialect, its parameters and columns converted by the same
type processors SQLAlchemy applies, run on the sqlite3 connection in the transaction the caller opened,
with the engine's `before_cursor_execute` listeners told first (the statement deadline of
`engine._limit_sqlite_statements`; they are called outside SQLAlchemy's greenlet, so one that waits for I/O
would not work here); a driver error is raised as SQLAlchemy would raise it
(`sqlalchemy.exc.OperationalError`, ...). tests/integration/test_store_direct.py compares every statement
that goes this way with SQLAlchemy's own execution of it.

The stored batch's samples and the hours it marks for roll-up go the same way (`executemany`): 500 rows a
tick, each through SQLAlchemy's per-row parameter handling before.

Only where it is safe to skip SQLAlchemy: SQLite, and a connection already in a transaction (SQLAlchemy
emitted its BEGIN); elsewhere `rows` and `rowcount` execute through SQLAlchemy as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

if TYPE_CHECKING:
    from monitor.store.sqlite_driver import OneTripCursor

Processor = Callable[[Any], Any] | None


class _Compiled:
    """The statement's SQL for one dialect, its parameters' names in order with their processors, and its
    columns' processors."""

    __slots__ = ("binds", "columns", "fixed", "sql")

    def __init__(self, statement: Any, dialect: Dialect, column_keys: tuple[str, ...] | None = None) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)
        if compiled.insert_prefetch or compiled.update_prefetch:
            # Values SQLAlchemy would make in Python at execution (a column's `default=`): not done here.
            raise ValueError(f"{self.__class__.__name__}: {compiled.string!r} has defaults made at execution")
        self.sql: str = compiled.string
        names = compiled.positiontup or []
        self.binds: tuple[tuple[str, Processor], ...] = tuple(
            (name, compiled.binds[name].type._cached_bind_processor(dialect)) for name in names
        )
        # Values given in the statement itself (`.values(version=1)`), used when the call does not name them.
        self.fixed: dict[str, Any] = {
            name: compiled.binds[name].effective_value for name in names if not compiled.binds[name].required
        }
        selected = getattr(statement, "selected_columns", ())
        self.columns: tuple[Processor, ...] = tuple(
            column.type._cached_result_processor(dialect, None) for column in selected
        )

    def parameters(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        if self.fixed:
            values = {**self.fixed, **values}
        # A loop rather than a generator: 49 values a probe's rows, each a generator step otherwise.
        out = []
        for name, process in self.binds:
            value = values[name]
            out.append(value if process is None or value is None else process(value))
        return tuple(out)

    def row(self, raw: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            value if process is None else process(value) for process, value in zip(self.columns, raw, strict=True)
        )


class DirectStatement:
    """`statement` (a Core SELECT, UPDATE or INSERT with named bind parameters) run directly on SQLite (see the
    module)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        # By the id of the dialect instance (one per engine) and the columns an INSERT is given.
        self._compiled: dict[tuple[int, tuple[str, ...] | None], _Compiled] = {}

    def _for(self, dialect: Dialect, column_keys: tuple[str, ...] | None = None) -> _Compiled:
        key = (id(dialect), column_keys)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = _Compiled(self.statement, dialect, column_keys)
        return compiled

    async def rows(self, connection: AsyncConnection, values: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row the statement reads, each a tuple of its columns as SQLAlchemy would give them."""
        if not _direct(connection):
            return [tuple(row) for row in (await connection.execute(self.statement, dict(values))).all()]
        compiled = self._for(connection.dialect)
        cursor = await self._run(connection, compiled, compiled.parameters(values))
        return [compiled.row(raw) for raw in await cursor.fetchall()]

    async def rowcount(self, connection: AsyncConnection, values: Mapping[str, Any]) -> int:
        """The rows the statement (an UPDATE) changed."""
        if not _direct(connection):
            return int((await connection.execute(self.statement, dict(values))).rowcount)
        compiled = self._for(connection.dialect)
        cursor = await self._run(connection, compiled, compiled.parameters(values))
        return cursor.rowcount

    async def executemany(self, connection: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
        """The statement (an INSERT) once for each of `rows`, which all name the same columns, in one trip."""
        if not rows:
            return
        if not _direct(connection):
            await connection.execute(self.statement, [dict(row) for row in rows])
            return
        compiled = self._for(connection.dialect, tuple(rows[0]))
        await self._run(connection, compiled, [compiled.parameters(row) for row in rows], many=True)

    @staticmethod
    async def _run(
        connection: AsyncConnection, compiled: _Compiled, parameters: Any, *, many: bool = False
    ) -> OneTripCursor:
        sync = connection.sync_connection
        assert sync is not None
        # What SQLAlchemy tells its listeners before every statement (the SQLite statement deadline).
        from monitor.store.sqlite_driver import OneTripConnection, OneTripCursor  # SQLite's alone (aiosqlite)

        sync.dispatch.before_cursor_execute(sync, None, compiled.sql, parameters, None, many)
        driver = sync.connection.driver_connection
        assert isinstance(driver, OneTripConnection)
        cursor = OneTripCursor(driver)
        driver_error = connection.dialect.loaded_dbapi.Error  # sqlite3.Error
        try:
            if many:
                return await cursor.executemany(compiled.sql, parameters)
            return await cursor.execute(compiled.sql, parameters)
        except driver_error as error:
            raise sa_exc.DBAPIError.instance(
                compiled.sql, parameters, error, driver_error, dialect=connection.dialect
            ) from error


def _direct(connection: AsyncConnection) -> bool:
    return connection.dialect.name == "sqlite" and connection.in_transaction()
