"""What probing costs, for the pages: each target and prompt's tokens and cost a month at its schedule
(monitor/config/cost.py's projection), from the tokens its probes actually spent over the last day.

Read at most every REFRESH_S and kept: the overview is reloaded every minute by every open page, and
the spend query scans a day of samples, which must not weigh on the probes' database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.config.cost import MonthlyCost, monthly_by_series, project
from monitor.config.models import Config
from monitor.logging import error_text
from monitor.store.repository import Repository

REFRESH_S = 600.0
HISTORY = timedelta(days=1)


class CostBook:
    """The month's projected cost per (target, prompt); an empty book when the database cannot say."""

    def __init__(self, config: Config, engine: AsyncEngine, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._repository = Repository(engine)
        self._clock = clock
        self._book: Mapping[tuple[str, str], MonthlyCost] | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> Mapping[tuple[str, str], MonthlyCost]:
        async with self._lock:
            if self._book is None or self._clock() - self._read_at >= REFRESH_S:
                self._book = await self._read()
                self._read_at = self._clock()
            return self._book

    async def _read(self) -> Mapping[tuple[str, str], MonthlyCost]:
        try:
            seen = await self._repository.tokens_seen(self._config.location, datetime.now(UTC) - HISTORY)
        except Exception as exc:  # the schedule's upper bound still says something
            structlog.get_logger().warning("cost_history_failed", error=error_text(exc))
            seen = {}
        return monthly_by_series(project(self._config, seen))


def cost_fields(book: Mapping[tuple[str, str], MonthlyCost], target: str, prompt: str) -> dict[str, object]:
    """The row's `cost` object, or None for a series no job of the config probes (any more)."""
    found = book.get((target, prompt))
    return {"cost": found.to_json() if found is not None else None}
