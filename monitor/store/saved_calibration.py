"""The saved prompt calibration, read without SQLAlchemy (issue 26, `once` start-up).

`once` sizes its prompts with the calibration before its first request, and SQLAlchemy's imports are
about a third of a second of its start: with the fits read here (the stdlib's sqlite3, or asyncpg
alone), it probes first and opens the store after. None whenever this reading cannot be trusted (a
URL it does not know, no such table, the database away, anything unexpected): the caller then opens
the store first, as before, with its retries and its error messages.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from monitor.store.records import BudgetHoldRecord

Fits = dict[tuple[str, str], tuple[float, float]]

_QUERY = "SELECT target, prompt, chars_per_token, overhead_tokens FROM calibration"
_HOLDS = "SELECT job, action, budget, per, since, until FROM budget_holds WHERE location = "
_HOLDS_SQLITE, _HOLDS_POSTGRES = _HOLDS + "?", _HOLDS + "$1"
_SQLITE = "sqlite+aiosqlite:///"
_POSTGRES = "postgresql+asyncpg://"


@dataclass(frozen=True, slots=True)
class BeforeProbing:
    """What `once` reads of the database before its first request."""

    fits: Fits
    holds: list[BudgetHoldRecord]  # the location's budget holds (table budget_holds), expired ones too


async def read_saved_calibration(url: str, *, timeout_s: float) -> Fits | None:
    """Every stored fit, (target, prompt) -> (chars_per_token, overhead_tokens); None: open the store to know."""
    read = await read_before_probing(url, location=None, timeout_s=timeout_s)
    return None if read is None else read.fits


async def read_before_probing(url: str, *, location: str | None, timeout_s: float) -> BeforeProbing | None:
    """The saved calibration and, with `location`, its budget holds, in one connection; None: open the
    store to know (a schema without budget_holds included: the store's check then names the upgrade)."""
    try:
        if url.startswith(_SQLITE):
            return _read_sqlite(url.removeprefix(_SQLITE), location, timeout_s)
        if url.startswith(_POSTGRES):
            async with asyncio.timeout(timeout_s):
                return await _read_postgres("postgresql://" + url.removeprefix(_POSTGRES), location, timeout_s)
    except Exception:  # the store's own opening says what is wrong, and retries
        return None
    return None


def _read_sqlite(database: str, location: str | None, timeout_s: float) -> BeforeProbing | None:
    # Plain file paths only (no `file:` URIs, options or memory databases: the engine's reading of those rules).
    if not database or "?" in database or database.startswith(("file:", ":memory:")):
        return None
    path = Path(database)
    if not path.is_file():
        return None
    connection = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=timeout_s)
    try:
        fits = _fits(connection.execute(_QUERY).fetchall())
        holds = [] if location is None else _holds(connection.execute(_HOLDS_SQLITE, (location,)).fetchall())
        return BeforeProbing(fits, holds)
    finally:
        connection.close()


async def _read_postgres(dsn: str, location: str | None, timeout_s: float) -> BeforeProbing:
    import asyncpg

    connection = await asyncpg.connect(
        dsn, timeout=timeout_s, command_timeout=timeout_s, server_settings={"application_name": "ttft-monitor"}
    )
    try:
        fits = _fits(await connection.fetch(_QUERY))
        holds = [] if location is None else _holds(await connection.fetch(_HOLDS_POSTGRES, location))
        return BeforeProbing(fits, holds)
    finally:
        await connection.close(timeout=timeout_s)


def _fits(rows: list[Any]) -> Fits:
    return {(str(target), str(prompt)): (float(cpt), float(overhead)) for target, prompt, cpt, overhead in rows}


def _holds(rows: list[Any]) -> list[BudgetHoldRecord]:
    return [
        BudgetHoldRecord(str(job), str(action), str(budget), str(per), _utc(since), _utc(until))
        for job, action, budget, per, since, until in rows
    ]


def _utc(value: Any) -> datetime:
    # SQLite keeps the store's UTC times as text without a zone (monitor.store.types.UtcDateTime).
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
