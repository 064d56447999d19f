"""Alembic, driven from code: upgrade, downgrade, current, check, and the start-up schema gate.

The alembic configuration lives here, not in a top-level alembic.ini: the scripts are in migrations/
and the database comes from the ttft-monitor config. Every function takes an engine or a URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store.engine import (
    WRITE_OPTION,
    DatabaseUnavailable,
    StoreError,
    create_engine,
    describe_db_error,
    is_connection_error,
)
from monitor.store.models import metadata
from monitor.store.partitions import is_partition


def _migrations_dir() -> Path:
    # A source checkout (and an editable install) has them at the top of the tree; a wheel ships
    # them inside the package as monitor._migrations (see pyproject.toml).
    checkout = Path(__file__).resolve().parents[2] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    return Path(__file__).resolve().parents[1] / "_migrations"


MIGRATIONS_DIR = _migrations_dir()
UPGRADE_COMMAND = "ttft-monitor db upgrade"
MIGRATION_LOCK_KEY = 0x7474_6674  # "ttft": the advisory lock held while migrating
T = TypeVar("T")


class MigrationError(StoreError):
    """Alembic could not do what was asked (unknown revision, missing scripts)."""


class SchemaBehind(StoreError):
    """The database schema is not the one this version needs: older or empty (`ttft-monitor db upgrade`
    fixes it) or, when `newer` is true, migrated by a newer ttft-monitor. The message says which."""

    def __init__(self, message: str, *, current: str | None, head: str, newer: bool = False) -> None:
        super().__init__(message)
        self.current = current
        self.head = head
        self.newer = newer


def alembic_config() -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise MigrationError(
            f"the database migrations are not at {MIGRATIONS_DIR}; install ttft-monitor from a source "
            "checkout (pip install -e .) or ship the migrations/ directory beside the monitor package"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    return config


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def heads() -> list[str]:
    """Every head revision of the migration scripts; exactly one unless two branches were merged badly."""
    return list(_scripts().get_heads())


def head() -> str:
    """The revision this version of ttft-monitor needs."""
    found = heads()
    if len(found) != 1:
        raise MigrationError(
            f"the migrations have {len(found)} heads ({', '.join(found) or 'none'}); "
            "merge them with `alembic merge` before releasing"
        )
    return found[0]


@asynccontextmanager
async def _connect(engine_or_url: AsyncEngine | str | URL, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
    engine = engine_or_url if isinstance(engine_or_url, AsyncEngine) else create_engine(engine_or_url)
    try:
        async with engine.connect() as connection:
            if write:
                await connection.execution_options(**{WRITE_OPTION: True})
                if connection.dialect.name == "postgresql":
                    # Two processes upgrading at once: the second waits, then finds the work done.
                    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            yield connection
    except StoreError:
        raise
    except Exception as exc:
        if is_connection_error(exc):
            raise DatabaseUnavailable(describe_db_error(exc, engine.url)) from exc
        raise
    finally:
        if engine is not engine_or_url:
            await engine.dispose()


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _alembic(action: Callable[..., Any], revision: str) -> Callable[[Connection], None]:
    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        try:
            action(config, revision)
        except CommandError as exc:
            raise MigrationError(f"{exc}; `ttft-monitor db current` shows where the database is") from None

    return run


async def upgrade(engine_or_url: AsyncEngine | str | URL, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate up to `revision` in one transaction; returns (revision before, revision after)."""
    return await _move(engine_or_url, command.upgrade, revision)


async def downgrade(engine_or_url: AsyncEngine | str | URL, revision: str) -> tuple[str | None, str | None]:
    """Migrate down to `revision` (`base` drops every table); returns (before, after)."""
    return await _move(engine_or_url, command.downgrade, revision)


async def _move(
    engine_or_url: AsyncEngine | str | URL, step: Callable[..., Any], revision: str
) -> tuple[str | None, str | None]:
    async with _connect(engine_or_url, write=True) as connection:
        before = await connection.run_sync(_current)
        await connection.run_sync(_alembic(step, revision))
        after = await connection.run_sync(_current)
        await connection.commit()
    return before, after


async def current(engine_or_url: AsyncEngine | str | URL) -> str | None:
    """The database's revision; None for an empty database."""
    async with _connect(engine_or_url) as connection:
        return await connection.run_sync(_current)


def _known(revision: str) -> bool:
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:
        return False


def schema_problem(current_revision: str | None) -> SchemaBehind | None:
    """Why a database at `current_revision` cannot be used by this version, or None when it can."""
    wanted = head()
    if current_revision == wanted:
        return None
    if current_revision is None:
        return SchemaBehind(
            f"the database schema is empty, this version needs {wanted}; run `{UPGRADE_COMMAND}`",
            current=None,
            head=wanted,
        )
    if _known(current_revision):
        return SchemaBehind(
            f"database schema is at {current_revision}, this version needs {wanted}; run `{UPGRADE_COMMAND}`",
            current=current_revision,
            head=wanted,
        )
    return SchemaBehind(
        f"database schema is at {current_revision}, which this version does not know (it needs {wanted}); "
        "the database was migrated by a newer ttft-monitor: upgrade ttft-monitor, or downgrade the "
        "database with the newer version",
        current=current_revision,
        head=wanted,
        newer=True,
    )


async def ensure_current(engine: AsyncEngine) -> str:
    """The schema revision if it is the one this version needs; SchemaBehind otherwise.

    Raises DatabaseUnavailable (one line: which host, what to check) when the database cannot be reached.
    """
    revision = await current(engine)
    problem = schema_problem(revision)
    if problem is not None:
        raise problem
    return head()


# `check`'s one difference for a database not at head: the fix is `db upgrade`, not a new migration.
NOT_AT_HEAD = "cannot compare"


async def check(engine_or_url: AsyncEngine | str | URL) -> list[str]:
    """Differences between the models and the migrations, one line each; empty when they match.

    Compares the models with a database at head (as `alembic check` does): run it on a database
    that `db upgrade` has just migrated. A database not at head is reported as the one difference.
    """
    async with _connect(engine_or_url) as connection:
        revision = await connection.run_sync(_current)
        problem = schema_problem(revision)
        if problem is not None:
            return [f"{NOT_AT_HEAD}: {problem}, then check again"]
        diffs = await connection.run_sync(_compare)
    return [describe_diff(diff) for diff in diffs]


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Autogenerate's filter: the day partitions of `runs` and `samples` (PostgreSQL) are made by
    housekeeping from their parents, which the models describe; they are not tables of their own."""
    return not (type_ == "table" and name is not None and is_partition(name))


def _compare(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "target_metadata": metadata, "include_name": include_name}
    )
    return list(compare_metadata(context, metadata))


def describe_diff(diff: Any) -> str:
    """One alembic autogenerate difference in words."""
    if isinstance(diff, list):
        return "; ".join(describe_diff(item) for item in diff)
    op = diff[0]
    if op in ("add_table", "remove_table"):
        where = "in the models but no migration creates it" if op == "add_table" else "in the database only"
        return f"table {diff[1].name}: {where}"
    if op in ("add_column", "remove_column"):
        where = "in the models but no migration adds it" if op == "add_column" else "in the database only"
        return f"column {diff[2]}.{diff[3].name}: {where}"
    if op in ("add_index", "remove_index", "add_constraint", "remove_constraint", "add_fk", "remove_fk"):
        item = diff[1]
        table = getattr(getattr(item, "table", None), "name", None) or getattr(item, "parent", None)
        side = "in the models only" if op.startswith("add") else "in the database only"
        kind = op.split("_", 1)[1]
        return f"{kind} {item.name} on {table}: {side}"
    if op.startswith("modify_"):
        _, _schema, table, column, _existing, old, new = diff
        return f"column {table}.{column}: {op[7:]} is {old!r} in the database, {new!r} in the models"
    return repr(diff)
