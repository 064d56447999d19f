"""Statements that differ by dialect or that several writers share, defined once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Table, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store.models import SERIES
from monitor.store.records import SeriesKey

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql

# The columns that name a series, in the unique key's order.
SERIES_COLUMNS = ("target", "provider", "model", "prompt", "location")


def upsert_insert(bind: AsyncEngine | AsyncConnection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that supports ON CONFLICT (both dialects spell it the same, but each has its own class).
    The PostgreSQL dialect is imported here, not with the module: a process on SQLite never loads it."""
    if bind.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)
    return sqlite.insert(table)


async def find_series_id(connection: AsyncConnection, series: SeriesKey) -> int | None:
    """The stored id of `series`, or None when it has never been written."""
    return await connection.scalar(
        select(SERIES.c.id).where(*(SERIES.c[name] == getattr(series, name) for name in SERIES_COLUMNS))
    )
