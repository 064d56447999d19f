"""Tick claims: several daemons (HA replicas of one location) share a database; one probes each tick.

A claim is a row keyed by (job, scheduled time, location); the insert that creates it wins, the
others see a conflict and stand down. Inserting rather than locking means no lock is held while
probing, and a crashed daemon's claim simply stays as the record that the tick was taken.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.store.models import JobTickRow


class TickClaims:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        self._insert = dialect.insert(JobTickRow.__table__)

    async def claim(self, *, job: str, scheduled_at: datetime, location: str, owner: str) -> bool:
        """True when this process won the tick; False when another daemon already has it."""
        statement = self._insert.values(
            job=job,
            scheduled_at=scheduled_at,
            location=location,
            claimed_by=owner,
            claimed_at=datetime.now(UTC),
            status="running",
        ).on_conflict_do_nothing(index_elements=["job", "scheduled_at", "location"])
        async with self._engine.begin() as connection:
            result = await connection.execute(statement)
        return result.rowcount == 1

    async def finish(self, *, job: str, scheduled_at: datetime, location: str, status: str) -> None:
        statement = (
            update(JobTickRow)
            .where(JobTickRow.job == job, JobTickRow.scheduled_at == scheduled_at, JobTickRow.location == location)
            .values(finished_at=datetime.now(UTC), status=status)
        )
        async with self._engine.begin() as connection:
            await connection.execute(statement)
