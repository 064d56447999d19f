"""Tick claims in the database: the `job_ticks` table, touched only here.

A claim is a row keyed by (job, scheduled time, location); the insert that creates it wins, the
others see a conflict and stand down. The policy around it (a bounded wait, resting while the
database is away) is the scheduler's: monitor/schedule/claims.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.store.models import JobTickRow, table_of
from monitor.store.statements import upsert_insert

RUNNING = "running"
PRESENT = "present"  # a replica's row for a tick of a sharded job (schedule/shards.py)


class TickClaimRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._insert = upsert_insert(engine, table_of(JobTickRow))

    def _claim(
        self, job: str, scheduled_at: datetime, location: str, owner: str, now: datetime | None, status: str
    ) -> Any:
        """The insert of one claim row, which does nothing when that job, tick and location has one."""
        return self._insert.values(
            job=job,
            scheduled_at=scheduled_at,
            location=location,
            claimed_by=owner,
            claimed_at=now or datetime.now(UTC),
            status=status,
        ).on_conflict_do_nothing(index_elements=["job", "scheduled_at", "location"])

    async def claim(
        self, *, job: str, scheduled_at: datetime, location: str, owner: str, now: datetime | None = None
    ) -> bool:
        """True when `owner` won the tick; False when a claim for it already exists (whoever made it)."""
        statement = self._claim(job, scheduled_at, location, owner, now, RUNNING)
        async with self._engine.begin() as connection:
            result = await connection.execute(statement)
        return result.rowcount == 1

    async def announce(
        self,
        *,
        key: str,
        prefix: str,
        scheduled_at: datetime,
        location: str,
        owner: str,
        now: datetime | None = None,
    ) -> set[str]:
        """Record `owner` as present at this tick (`key`), then return every replica present at this
        tick or the one before it (rows under `prefix`), itself included.

        The tick before counts so that a replica that died is still expected for one more tick (its
        shards are then taken over) and one that joined is counted by replicas firing a little earlier.
        """
        statement = self._claim(key, scheduled_at, location, owner, now, PRESENT)
        ours = (JobTickRow.job.startswith(prefix, autoescape=True), JobTickRow.location == location)
        before = select(func.max(JobTickRow.scheduled_at)).where(*ours, JobTickRow.scheduled_at < scheduled_at)
        present = select(JobTickRow.claimed_by).where(
            *ours, (JobTickRow.scheduled_at == scheduled_at) | (JobTickRow.scheduled_at == before.scalar_subquery())
        )
        async with self._engine.begin() as connection:
            await connection.execute(statement)
            owners = (await connection.execute(present)).scalars().all()
        return {*owners, owner}

    async def claimed(self, *, keys: list[str], scheduled_at: datetime, location: str) -> set[str]:
        """Which of these ticks' keys are claimed already (by anyone)."""
        statement = select(JobTickRow.job).where(
            JobTickRow.job.in_(keys), JobTickRow.scheduled_at == scheduled_at, JobTickRow.location == location
        )
        async with self._engine.connect() as connection:
            return set((await connection.execute(statement)).scalars().all())

    async def renew(
        self, *, keys: list[str], scheduled_at: datetime, location: str, owner: str, now: datetime | None = None
    ) -> int:
        """Stamp `owner`'s running claims of these keys anew (its lease); how many it still holds."""
        statement = (
            update(JobTickRow)
            .where(
                JobTickRow.job.in_(keys),
                JobTickRow.scheduled_at == scheduled_at,
                JobTickRow.location == location,
                JobTickRow.claimed_by == owner,
                JobTickRow.status == RUNNING,
            )
            .values(claimed_at=now or datetime.now(UTC))
        )
        async with self._engine.begin() as connection:
            result = await connection.execute(statement)
        return result.rowcount

    async def running(
        self, *, keys: list[str], scheduled_at: datetime, location: str
    ) -> dict[str, tuple[str, datetime]]:
        """The claims of these keys still running: key -> (owner, its last stamp)."""
        statement = select(JobTickRow.job, JobTickRow.claimed_by, JobTickRow.claimed_at).where(
            JobTickRow.job.in_(keys),
            JobTickRow.scheduled_at == scheduled_at,
            JobTickRow.location == location,
            JobTickRow.status == RUNNING,
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(statement)).all()
        return {key: (owner, stamp) for key, owner, stamp in rows}

    async def take_over(
        self,
        *,
        key: str,
        scheduled_at: datetime,
        location: str,
        owner: str,
        was: tuple[str, datetime],
        now: datetime | None = None,
    ) -> bool:
        """Take a running claim whose owner and stamp are still `was` (its owner stopped renewing it);
        True for the one taker that changed it, whatever the clocks of the machines say."""
        was_owner, was_stamp = was
        statement = (
            update(JobTickRow)
            .where(
                JobTickRow.job == key,
                JobTickRow.scheduled_at == scheduled_at,
                JobTickRow.location == location,
                JobTickRow.claimed_by == was_owner,
                JobTickRow.claimed_at == was_stamp,
                JobTickRow.status == RUNNING,
            )
            .values(claimed_by=owner, claimed_at=now or datetime.now(UTC))
        )
        async with self._engine.begin() as connection:
            result = await connection.execute(statement)
        return result.rowcount == 1

    async def finish(
        self, *, job: str, scheduled_at: datetime, location: str, status: str, now: datetime | None = None
    ) -> bool:
        """Record how the tick's run ended; False when there is no claim for that tick."""
        statement = (
            update(JobTickRow)
            .where(JobTickRow.job == job, JobTickRow.scheduled_at == scheduled_at, JobTickRow.location == location)
            .values(finished_at=now or datetime.now(UTC), status=status)
        )
        async with self._engine.begin() as connection:
            result = await connection.execute(statement)
        return result.rowcount == 1
