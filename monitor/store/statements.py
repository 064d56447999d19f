"""Statements that differ by dialect or that several writers share, defined once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Table, bindparam, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store.direct import DirectStatement
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


# Built once: asked once a series by each of the repository and detection, 500 of each on a new daemon's first tick.
_FIND_SERIES = DirectStatement(
    select(SERIES.c.id).where(*(SERIES.c[name] == bindparam(f"series_{name}") for name in SERIES_COLUMNS))
)


async def find_series_id(connection: AsyncConnection, series: SeriesKey) -> int | None:
    """The stored id of `series`, or None when it has never been written."""
    rows = await _FIND_SERIES.rows(connection, {f"series_{name}": getattr(series, name) for name in SERIES_COLUMNS})
    return int(rows[0][0]) if rows else None
