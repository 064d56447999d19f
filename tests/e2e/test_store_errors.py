"""Database errors in one line each: where, what happened, what to do; never the password."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from monitor.store.engine import (
    DatabaseUnavailable,
    create_engine,
    describe_db_error,
    display_url,
    is_bad_data,
    is_connection_error,
)
from tests.conftest import cli_result

PG = "postgresql+asyncpg://ttft:pa55word-x@db.internal:6432/ttft"


def wrapped(orig: BaseException) -> OperationalError:
    """What SQLAlchemy raises around a driver error."""
    return OperationalError("SELECT 1", {}, orig)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            ConnectionRefusedError(111, "Connection refused"),
            "cannot connect to PostgreSQL at db.internal:6432: connection refused; check that the server is "
            "running and listening there, and the host and port in database.url",
        ),
        (
            socket.gaierror(-2, "Name or service not known"),
            "cannot resolve the database host 'db.internal': check the host name in database.url",
        ),
        (
            TimeoutError(),
            "PostgreSQL at db.internal:6432 did not answer in time; check that the host is reachable "
            "(network, firewall) and the server is not overloaded",
        ),
        (
            asyncpg.exceptions.InvalidPasswordError('password authentication failed for user "ttft"'),
            "PostgreSQL at db.internal:6432 rejected the login of user 'ttft': check the user and password in "
            "database.url (put the password in ${VAR}) and the server's pg_hba.conf",
        ),
        (
            wrapped(asyncpg.exceptions.InvalidCatalogNameError('database "ttft" does not exist')),
            "database 'ttft' does not exist on PostgreSQL at db.internal:6432: create it "
            "(createdb -h db.internal -p 6432 -U ttft ttft) or fix database.url",
        ),
        (
            asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
            "PostgreSQL at db.internal:6432 is starting up or shutting down: try again shortly",
        ),
    ],
)
def test_postgres_errors_name_the_server_and_the_fix(error: BaseException, message: str) -> None:
    assert describe_db_error(error, PG) == message
    assert is_connection_error(error)
    assert not is_bad_data(error)


def test_a_refused_write_on_a_read_only_database_names_the_likely_cause() -> None:
    error = wrapped(asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"))
    assert describe_db_error(error, PG) == (
        "the database is read-only: a standby or a failover? PostgreSQL at db.internal:6432 refused a write "
        "(ReadOnlySQLTransactionError: cannot execute INSERT in a read-only transaction); point database.url at "
        "the primary, or turn off default_transaction_read_only"
    )
    assert not is_bad_data(error)  # spooled and replayed later, never rejected as bad data


def test_an_unknown_error_is_one_line_without_the_password() -> None:
    error = RuntimeError("boom with pa55word-x inside\nand a second line")
    assert (
        describe_db_error(error, PG)
        == "database error on PostgreSQL at db.internal:6432: RuntimeError: boom with *** inside"
    )
    assert display_url(PG) == "postgresql+asyncpg://ttft:***@db.internal:6432/ttft"


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            wrapped(sqlite3.OperationalError("database is locked")),
            "SQLite database /srv/ttft.db is locked by another process for longer than the busy timeout; "
            "check for a stuck process holding it, or use PostgreSQL for several writers",
        ),
        (
            wrapped(sqlite3.OperationalError("unable to open database file")),
            "cannot open SQLite database /srv/ttft.db: check that its directory exists and is writable by this user",
        ),
        (
            wrapped(sqlite3.OperationalError("attempt to write a readonly database")),
            "SQLite database /srv/ttft.db is read-only: check the file's and directory's permissions",
        ),
    ],
)
def test_sqlite_errors_name_the_file_and_the_fix(error: BaseException, message: str) -> None:
    assert describe_db_error(error, "sqlite+aiosqlite:////srv/ttft.db") == message
    assert is_connection_error(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("naive datetime"),
        OverflowError("value out of int32 range"),
        asyncpg.exceptions.NumericValueOutOfRangeError("integer out of range"),
        IntegrityError("INSERT", {}, sqlite3.IntegrityError("NOT NULL constraint failed: samples.round")),
    ],
)
def test_refused_values_are_told_apart_from_an_unreachable_database(error: BaseException) -> None:
    assert is_bad_data(error)
    assert not is_connection_error(error)


def test_a_sqlite_directory_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(
        DatabaseUnavailable, match=r"directory .*a-file for the SQLite database: a file of that name exists"
    ):
        create_engine(f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'ttft.db'}")


def test_a_sqlite_file_that_cannot_be_opened_leaves_no_worker_thread_behind(tmp_path: Path) -> None:
    # aiosqlite stops the thread of a failed open without waiting; when the loop closed first, the
    # thread printed a traceback (Event loop is closed) after the command's one-line error.
    async def attempt() -> list[str]:
        engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}")  # a directory, not a file
        try:
            with pytest.raises(OperationalError, match="unable to open database file"):
                async with engine.connect():
                    pass
        finally:
            await engine.dispose()
        return [thread.name for thread in threading.enumerate() if "_connection_worker_thread" in thread.name]

    assert asyncio.run(attempt()) == []


def cli_config(tmp_path: Path, db_url: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""
database:
  url: "{db_url}"
  state_dir: "{tmp_path}/state"
  connect_retry_s: 1
metrics:
  listen: "127.0.0.1:9"
providers:
  p: {{base_url: "http://127.0.0.1:9/v1", api: openai-chat}}
targets:
  t: {{provider: p, model: m}}
prompts:
  s: {{tokens: 256}}
jobs:
  - {{name: j, schedule: "* * * * *", targets: [t], prompts: [s]}}
"""
    )
    return path


STORE_COMMANDS = [
    ["once"],
    ["run"],
    ["probe", "--store", "-n", "1", "--warmup", "0"],
    ["serve", "--listen", "127.0.0.1:9"],
    ["incidents", "ack", "abcd"],
    ["report"],
]


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda command: command[0])
def test_a_sqlite_directory_that_cannot_be_created_exits_3_in_one_line(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "a-file").write_text("")
    config = cli_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'ttft.db'}")
    result = cli_result(*command, "--config", str(config))
    assert result.code == 3, str(result)
    assert "a-file" in result.stderr and "Traceback" not in result.stdout + result.stderr, str(result)


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=lambda command: command[0])
def test_a_sqlite_path_that_is_a_directory_exits_3_without_a_traceback(tmp_path: Path, command: list[str]) -> None:
    config = cli_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path}")
    result = cli_result(*command, "--config", str(config))
    assert result.code == 3, str(result)
    assert f"cannot open SQLite database {tmp_path}" in result.stderr, str(result)
    assert "Traceback" not in result.stdout + result.stderr, str(result)


READER_COMMANDS = [
    ["report"],
    ["replay", "--export", "-"],
    ["serve", "--listen", "127.0.0.1:9"],  # refused before it listens
    ["incidents"],
    ["once"],
]


@pytest.mark.parametrize("command", READER_COMMANDS, ids=lambda command: command[0])
def test_a_database_never_upgraded_names_db_upgrade_for_every_reader(tmp_path: Path, command: list[str]) -> None:
    # report, replay --export and serve answered "no such table: series" (serve even said ready).
    config = cli_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'ttft.db'}")
    result = cli_result(*command, "--config", str(config))
    assert result.code == 3, str(result)
    assert "the database schema is empty" in result.stderr and "run `ttft-monitor db upgrade`" in result.stderr, str(
        result
    )
    assert "no such table" not in result.stdout + result.stderr and "Traceback" not in result.stderr, str(result)


@pytest.mark.parametrize("command", [["report"], ["once"], ["incidents"]], ids=lambda command: command[0])
def test_a_file_that_is_not_a_sqlite_database_is_named_with_the_fix(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "ttft.db").write_bytes(bytes(range(256)) * 64)
    config = cli_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'ttft.db'}")
    result = cli_result(*command, "--config", str(config))
    assert result.code == 3, str(result)
    assert f"SQLite database {tmp_path / 'ttft.db'} is not a SQLite database" in result.stderr, str(result)
    assert "Traceback" not in result.stdout + result.stderr, str(result)
