"""Alembic environment (async). The application passes an open connection in
`config.attributes["connection"]` (see monitor/store/migrate.py); pytest-alembic passes an engine
there, async or not (tests/integration/test_store_alembic_checks.py); the alembic command line gives the database
with `-x url=...` (see migrations/alembic.ini)."""

from __future__ import annotations

import asyncio
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.store.engine import create_engine
from monitor.store.migrate import include_name
from monitor.store.models import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database: alembic -c migrations/alembic.ini -x url=sqlite+aiosqlite:///PATH ...")
    return url


def _options(dialect_name: str) -> dict[str, Any]:
    # Batch mode: SQLite cannot ALTER most things, so alembic recreates the table instead.
    return {
        "target_metadata": metadata,
        "render_as_batch": dialect_name == "sqlite",
        "compare_type": True,
        "include_name": include_name,  # not the partitions of runs and samples (PostgreSQL)
    }


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, **_options(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations(engine: AsyncEngine) -> None:
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_offline() -> None:
    url = _url()
    context.configure(url=url, literal_binds=True, **_options(url.split("+", 1)[0].split(":", 1)[0]))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        asyncio.run(run_async_migrations(create_engine(_url())))
    elif isinstance(connectable, AsyncEngine):
        asyncio.run(run_async_migrations(connectable))
    elif isinstance(connectable, Engine):
        with connectable.begin() as connection:
            do_run_migrations(connection)
    else:
        do_run_migrations(connectable)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
