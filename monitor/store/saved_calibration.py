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
from pathlib import Path
from typing import Any

Fits = dict[tuple[str, str], tuple[float, float]]

_QUERY = "SELECT target, prompt, chars_per_token, overhead_tokens FROM calibration"
_SQLITE = "sqlite+aiosqlite:///"
_POSTGRES = "postgresql+asyncpg://"


async def read_saved_calibration(url: str, *, timeout_s: float) -> Fits | None:
    """Every stored fit, (target, prompt) -> (chars_per_token, overhead_tokens); None: open the store to know."""
    try:
        if url.startswith(_SQLITE):
            return _read_sqlite(url.removeprefix(_SQLITE), timeout_s)
        if url.startswith(_POSTGRES):
            async with asyncio.timeout(timeout_s):
                return await _read_postgres("postgresql://" + url.removeprefix(_POSTGRES), timeout_s)
    except Exception:  # the store's own opening says what is wrong, and retries
        return None
    return None


def _read_sqlite(database: str, timeout_s: float) -> Fits | None:
    # Plain file paths only (no `file:` URIs, options or memory databases: the engine's reading of those rules).
    if not database or "?" in database or database.startswith(("file:", ":memory:")):
        return None
    path = Path(database)
    if not path.is_file():
        return None
    connection = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=timeout_s)
    try:
        return _fits(connection.execute(_QUERY).fetchall())
    finally:
        connection.close()


async def _read_postgres(dsn: str, timeout_s: float) -> Fits:
    import asyncpg

    connection = await asyncpg.connect(
        dsn, timeout=timeout_s, command_timeout=timeout_s, server_settings={"application_name": "ttft-monitor"}
    )
    try:
        return _fits(await connection.fetch(_QUERY))
    finally:
        await connection.close(timeout=timeout_s)


def _fits(rows: list[Any]) -> Fits:
    return {(str(target), str(prompt)): (float(cpt), float(overhead)) for target, prompt, cpt, overhead in rows}
