"""Statements that differ by dialect or that several writers share, defined once."""

from __future__ import annotations

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store.models import SERIES
from monitor.store.records import SeriesKey

# The columns that name a series, in the unique key's order.
SERIES_COLUMNS = ("target", "provider", "model", "prompt", "location")


def upsert_insert(bind: AsyncEngine | AsyncConnection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT that supports ON CONFLICT (both dialects spell it the same, but each has its own class)."""
    dialect = postgresql if bind.dialect.name == "postgresql" else sqlite
    insert: postgresql.Insert | sqlite.Insert = dialect.insert(table)
    return insert


async def find_series_id(connection: AsyncConnection, series: SeriesKey) -> int | None:
    """The stored id of `series`, or None when it has never been written."""
    return await connection.scalar(
        select(SERIES.c.id).where(*(SERIES.c[name] == getattr(series, name) for name in SERIES_COLUMNS))
    )
