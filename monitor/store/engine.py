"""Async engines for both backends, and one-line descriptions of database errors."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import await_only

from monitor.config.urls import mask_password

# Option set on a connection before `begin()`: take SQLite's write lock at BEGIN, so a writer waits
# for the lock (busy_timeout) instead of failing when a read-then-write transaction meets another writer.
WRITE_OPTION = "ttft_write"
DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 5000
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# The daemon's engines bound every statement too, so a hung server (TCP accepts, nothing answers)
# costs a bounded wait, never a stuck task; one-off tools (migrations) leave it unbounded.
DAEMON_COMMAND_TIMEOUT_S = 10.0
DAEMON_CONNECT_TIMEOUT_S = 5.0
DAEMON_POOL_TIMEOUT_S = 10.0


class StoreError(Exception):
    """A storage problem; `str()` is one line naming the cause and what to do."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached or refused us (network, server down, login, missing database)."""


def sqlite_path(url: str | URL) -> Path | None:
    """The file of a SQLite URL; None for in-memory databases."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return Path(database.removeprefix("file:").split("?", 1)[0])


def create_engine(
    url: str | URL,
    *,
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    command_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """An engine for `postgresql+asyncpg://` or `sqlite+aiosqlite://` URLs.

    SQLite: the file's directory is created; WAL (readers never block the writer), foreign keys on,
    a busy timeout, `synchronous=FULL` (a committed run survives power loss: the spool forgets it on
    commit), and real transactions (SQLAlchemy emits BEGIN, so DDL in migrations is transactional).
    PostgreSQL: a bounded connect timeout, sessions in UTC, and pre-ping so connections broken by a
    server restart are replaced instead of failing the next write. `command_timeout_s` bounds each
    statement (asyncpg's `command_timeout`) on PostgreSQL; SQLite's bound is the busy timeout.
    `statement_timeout_s` makes the database itself abandon a statement that runs longer (PostgreSQL's
    `statement_timeout`; on SQLite a progress handler interrupts it): the UI's engine uses it, so a
    heavy view whose client gave up does not keep a connection and a core busy after the cancel.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError as exc:
                raise DatabaseUnavailable(
                    f"cannot create the directory {path.parent} for the SQLite database: a file of that name "
                    "exists; change database.url"
                ) from exc
            except OSError as exc:
                raise DatabaseUnavailable(
                    f"cannot create the directory {path.parent} for the SQLite database: {exc.strerror}; "
                    "make its parent writable or change database.url"
                ) from exc
        args, options = parsed.get_dialect()().create_connect_args(parsed)
        engine = create_async_engine(parsed, async_creator=lambda: _open_sqlite(*args, **options), **kwargs)
        _configure_sqlite(engine, busy_timeout_ms=sqlite_busy_timeout_ms)
        if statement_timeout_s:
            _limit_sqlite_statements(engine, statement_timeout_s)
        return engine
    server_settings = {
        "timezone": "UTC",
        "application_name": "ttft-monitor",
        # asyncpg prepares every statement, and after five runs PostgreSQL may switch a prepared
        # statement to a generic plan, one made without its parameters' values: over day partitions
        # and time ranges that plan cannot leave days out nor estimate rows, and the overview at 20M
        # samples went from 0.17-0.3 s to 1.2-1.5 s from its eleventh call on (two pooled
        # connections). A custom plan costs a few milliseconds of planning per statement.
        "plan_cache_mode": "force_custom_plan",
    }
    if statement_timeout_s:
        server_settings["statement_timeout"] = str(max(1, int(statement_timeout_s * 1000)))
    connect_args = {
        "timeout": connect_timeout_s,
        "server_settings": server_settings,
        **({"command_timeout": command_timeout_s} if command_timeout_s else {}),
        **kwargs.pop("connect_args", {}),
    }
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(parsed, connect_args=connect_args, **kwargs)


async def _open_sqlite(*args: Any, **options: Any) -> Any:
    """aiosqlite's connect, its statements one trip each to its thread (store/sqlite_driver.py), except that a
    file that cannot be opened (a directory, a directory not writable) leaves no thread behind: aiosqlite stops
    the worker thread of a failed open without waiting for it, and when the event loop closes first (a
    command's one-line error, then the end of `asyncio.run`), that thread prints a traceback (RuntimeError:
    Event loop is closed)."""
    from monitor.store import sqlite_driver

    connection = sqlite_driver.connect(*args, **options)
    connection._thread.daemon = True  # as SQLAlchemy's own connect: never hold up the exit
    try:
        return await connection
    except Exception:
        await asyncio.to_thread(connection._thread.join, 5)
        raise


def _configure_sqlite(engine: AsyncEngine, *, busy_timeout_ms: int) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy emit BEGIN itself: the sqlite3 driver's legacy mode skips it for SELECT and DDL.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _limit_sqlite_statements(engine: AsyncEngine, timeout_s: float) -> None:
    """Interrupt a statement once it has run `timeout_s`, or once the task that awaits it is cancelled
    (sqlite3 raises OperationalError 'interrupted').

    The deadline and the awaiting task are noted when SQLAlchemy starts a statement and checked by a
    progress handler that SQLite calls every few thousand virtual-machine steps, in the connection's
    own thread. Cancelling the task (a UI client that went away, the handler's own timeout) does not
    stop aiosqlite's thread by itself: without the check, an abandoned compare would keep a core
    busy until its deadline."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        deadline = record.info.setdefault("statement_deadline", [0.0])
        awaited_by: list[asyncio.Task[Any] | None] = record.info.setdefault("statement_task", [None])

        def past_deadline() -> int:
            if deadline[0] and time.monotonic() > deadline[0]:
                return 1
            task = awaited_by[0]
            # Read from SQLite's thread: a task's state is plain attributes, and a stale read only
            # delays the interruption to the next check.
            return 1 if task is not None and (task.done() or task.cancelling()) else 0

        await_only(dbapi_connection.driver_connection.set_progress_handler(past_deadline, 20_000))

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _before(connection: Any, *_args: Any) -> None:
        info = connection.connection.info
        deadline = info.get("statement_deadline")
        if deadline is not None:
            deadline[0] = time.monotonic() + timeout_s
        awaited_by = info.get("statement_task")
        if awaited_by is not None:
            try:
                awaited_by[0] = asyncio.current_task()
            except RuntimeError:  # no running loop: a synchronous caller, nothing to cancel
                awaited_by[0] = None


def display_url(url: str | URL) -> str:
    """The URL with any password masked, safe for logs and errors."""
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    return mask_password(text)


# ---------------------------------------------------------------- describing errors


def error_chain(exc: BaseException) -> list[BaseException]:
    """`exc`, its causes and contexts, and the driver exceptions SQLAlchemy wraps in `.orig`."""
    seen: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending:
        item = pending.pop(0)
        if any(item is known for known in seen):
            continue
        seen.append(item)
        orig = getattr(item, "orig", None)
        for nxt in (orig, item.__cause__, item.__context__):
            if isinstance(nxt, BaseException):
                pending.append(nxt)
    return seen


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


_CONNECTION_ERRORS = frozenset(
    {
        "PostgresConnectionError",  # SQLSTATE class 08
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "InvalidPasswordError",
        "InvalidAuthorizationSpecificationError",
        "InvalidCatalogNameError",
        "TooManyConnectionsError",
        "AdminShutdownError",
        "CrashShutdownError",
        # asyncpg's "cannot switch to state 12": a statement on a connection whose protocol broke
        # under it (killed by pg_terminate_backend, a failover); the database, not the data.
        "InternalClientError",
    }
)
# A connection that broke under a statement (it was killed, the server restarted, the network reset
# it): the statement did not run to completion and the transaction is gone, so a transaction that
# had not yet sent COMMIT can be run again on a new connection.
_BROKEN_CONNECTION_ERRORS = frozenset(
    {"InternalClientError", "ConnectionDoesNotExistError", "AdminShutdownError", "CrashShutdownError"}
)


def is_broken_connection(exc: BaseException) -> bool:
    """True when `exc` is a connection that broke under a statement, not a refused statement or value."""
    for item in error_chain(exc):
        if isinstance(item, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
            return True
        if _names(item) & _BROKEN_CONNECTION_ERRORS or getattr(item, "connection_invalidated", False):
            return True
        message = str(item).lower()
        if "InterfaceError" in _names(item) and "connection" in message and ("closed" in message or "lost" in message):
            return True
    return False


def is_connection_error(exc: BaseException) -> bool:
    """True when `exc` means the database is unreachable, as opposed to a bad statement or value."""
    for item in error_chain(exc):
        if isinstance(item, OSError | TimeoutError):
            return True
        if _names(item) & _CONNECTION_ERRORS or getattr(item, "connection_invalidated", False):
            return True
        message = str(item).lower()
        if "InterfaceError" in _names(item) and "connection" in message and "closed" in message:
            return True
        if any(
            text in message
            for text in ("unable to open database file", "database is locked", "disk i/o error", "readonly database")
        ):
            return True
    return False


def is_bad_data(exc: BaseException) -> bool:
    """True when the database (or the conversion to its types) refused the values themselves:
    retrying the same data will never succeed."""
    if is_connection_error(exc):
        return False
    for item in error_chain(exc):
        if isinstance(item, ValueError | TypeError | ArithmeticError):
            return True  # includes asyncpg's client-side DataError and integer overflow
        # SQLAlchemy's DataError/IntegrityError and asyncpg's SQLSTATE 22 / 23 classes.
        if _names(item) & {"DataError", "IntegrityError", "IntegrityConstraintViolationError"}:
            return True
    return False


def describe_db_error(exc: BaseException, url: str | URL) -> str:
    """One line for a human: where, what happened, what to check. Never the password."""
    parsed = make_url(url)
    password = parsed.password
    if parsed.get_backend_name() == "sqlite":
        return _scrub(_describe_sqlite(exc, parsed), password)
    host = parsed.host or "localhost"
    port = parsed.port or 5432
    where = f"PostgreSQL at {host}:{port}"
    user = parsed.username or "(default user)"
    database = parsed.database or "(default database)"
    for item in error_chain(exc):
        names = _names(item)
        if isinstance(item, socket.gaierror):
            return f"cannot resolve the database host '{host}': check the host name in database.url"
        if isinstance(item, ConnectionRefusedError) or getattr(item, "errno", None) == errno.ECONNREFUSED:
            return (
                f"cannot connect to {where}: connection refused; check that the server is running and "
                "listening there, and the host and port in database.url"
            )
        if isinstance(item, TimeoutError):
            return (
                f"{where} did not answer in time; check that the host is reachable "
                "(network, firewall) and the server is not overloaded"
            )
        if names & {"InvalidPasswordError", "InvalidAuthorizationSpecificationError"}:
            return (
                f"{where} rejected the login of user '{user}': check the user and password in database.url "
                "(put the password in ${VAR}) and the server's pg_hba.conf"
            )
        if "InvalidCatalogNameError" in names:
            return (
                f"database '{database}' does not exist on {where}: create it "
                f"(createdb -h {host} -p {port} -U {user} {database}) or fix database.url"
            )
        if "ReadOnlySQLTransactionError" in names or getattr(item, "sqlstate", None) == "25006":
            return (
                f"the database is read-only: a standby or a failover? {where} refused a write "
                f"({_first_line(item)}); point database.url at the primary, or turn off "
                "default_transaction_read_only"
            )
        if "CannotConnectNowError" in names or names & {"AdminShutdownError", "CrashShutdownError"}:
            return f"{where} is starting up or shutting down: try again shortly"
        if "TooManyConnectionsError" in names:
            return f"{where} has no free connections: raise max_connections or close idle clients"
        if isinstance(item, OSError) and item.strerror:
            return f"cannot connect to {where}: {item.strerror}; check the host and port in database.url"
        if "ConnectionDoesNotExistError" in names or getattr(item, "connection_invalidated", False):
            return f"lost the connection to {where}: the server restarted or the network dropped; will retry"
    return _scrub(f"database error on {where}: {_first_line(exc)}", password)


def _describe_sqlite(exc: BaseException, url: URL) -> str:
    path = sqlite_path(url)
    where = f"SQLite database {path}" if path else "in-memory SQLite database"
    for item in error_chain(exc):
        message = str(item).lower()
        if "unable to open database file" in message:
            return f"cannot open {where}: check that its directory exists and is writable by this user"
        if "database is locked" in message:
            return (
                f"{where} is locked by another process for longer than the busy timeout; "
                "check for a stuck process holding it, or use PostgreSQL for several writers"
            )
        if "readonly database" in message:
            return f"{where} is read-only: check the file's and directory's permissions"
        if "file is not a database" in message:
            return (
                f"{where} is not a SQLite database (another kind of file, or damaged): point database.url at "
                "a new file and run `ttft-monitor db upgrade`, or restore the database from a backup"
            )
        if "disk i/o error" in message or "database or disk is full" in message:
            return f"{where} cannot be written ({_first_line(item)}): check the disk"
        if isinstance(item, OSError) and item.strerror:
            return f"cannot use {where}: {item.strerror}"
    return f"database error on {where}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    name = type(orig if orig is not None else exc).__name__
    return f"{name}: {text[0]}" if text else name


def _scrub(text: str, password: str | None) -> str:
    return text.replace(password, "***") if password and len(password) >= 3 else text


@contextlib.asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A write transaction. SQLite takes its write lock at BEGIN (IMMEDIATE), so concurrent writers
    queue on the busy timeout instead of failing when a read turns into a write."""
    async with engine.connect() as connection:
        await connection.execution_options(**{WRITE_OPTION: True})
        async with connection.begin():
            yield connection
