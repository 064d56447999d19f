"""The outbox's tables (`alert_outbox`, `alert_deliveries`) read and written in one place.

`monitor.alert.outbox` (enqueueing) and `monitor.alert.dispatcher` (claiming, delivering, reminders)
decide what happens; this module only says how it is stored. Calls taking a `connection` run inside
the caller's transaction, so a state change and its notifications commit or fail together.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store.engine import write_transaction
from monitor.store.models import (
    DELIVERIES,
    GROUPS,
    INCIDENTS,
    OUTBOX,
    TRIAGE,
)
from monitor.store.statements import upsert_insert

# Row statuses (the `status` column).
PENDING, SENT, FAILED, SUPPRESSED, SUPERSEDED = "pending", "sent", "failed", "suppressed", "superseded"
FINISHED = (SENT, FAILED, SUPPRESSED, SUPERSEDED)
FIRING_EVENTS = ("firing", "renotify")


def _still_firing() -> sa.ColumnElement[bool]:
    """The outbox row's incident is open, or its group is: a group's page goes out under its lead's id
    and stays open, reminders and all, while any member is (the lead may have recovered first)."""
    group_open = (
        sa.select(GROUPS.c.id).where(GROUPS.c.id == INCIDENTS.c.group_id, GROUPS.c.resolved_at.is_(None)).exists()
    )
    return sa.or_(INCIDENTS.c.resolved_at.is_(None), group_open)


def _acked() -> sa.ColumnElement[bool]:
    """The incident, or any member of its group, was acknowledged."""
    member = INCIDENTS.alias("member")
    members = sa.select(member.c.id).where(member.c.group_id == INCIDENTS.c.group_id)
    return (
        sa.select(TRIAGE.c.incident_id)
        .where(
            sa.or_(TRIAGE.c.incident_id == INCIDENTS.c.id, TRIAGE.c.incident_id.in_(members)),
            TRIAGE.c.acked_at.is_not(None),
        )
        .exists()
    )


# The outbox again, for `due`'s older rows. Made once: an alias copies the table's columns into a web of
# references, cyclic garbage the collector had to find each time the dispatcher looked (every second).
_OLDER = OUTBOX.alias("older")


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """An outbox row this worker claimed, as the dispatcher needs it."""

    id: uuid.UUID
    incident_id: uuid.UUID | None
    receiver: str
    event: str
    payload: dict[str, Any]
    attempts: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt's answer, for `alert_deliveries`: its fields are that table's columns (but the outbox row's id)."""

    attempted_at: datetime
    outcome: str
    http_status: int | None
    error: str | None
    duration_ms: float | None


class OutboxStore:
    """Every statement on the outbox's tables."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with write_transaction(self._engine) as connection:
            yield connection

    # ------------------------------------------------------------ enqueueing

    @staticmethod
    async def receivers_told_firing(connection: AsyncConnection, incident_id: uuid.UUID) -> list[str]:
        """Receivers that were given a firing notice (or reminder) of the incident, by name."""
        told = await connection.scalars(
            sa.select(OUTBOX.c.receiver)
            .where(OUTBOX.c.incident_id == incident_id, OUTBOX.c.event.in_(FIRING_EVENTS))
            .distinct()
            .order_by(OUTBOX.c.receiver)
        )
        return list(told.all())

    @staticmethod
    async def firing_statuses(connection: AsyncConnection, incident_id: uuid.UUID, receiver: str) -> list[str]:
        """The statuses of the incident's firing rows for one receiver."""
        found = await connection.scalars(
            sa.select(OUTBOX.c.status).where(
                OUTBOX.c.incident_id == incident_id,
                OUTBOX.c.receiver == receiver,
                OUTBOX.c.event.in_(FIRING_EVENTS),
            )
        )
        return list(found.all())

    @staticmethod
    async def incident_stored(connection: AsyncConnection, incident_id: uuid.UUID) -> bool:
        found = await connection.scalar(sa.select(INCIDENTS.c.id).where(INCIDENTS.c.id == incident_id))
        return found is not None

    @staticmethod
    async def insert(connection: AsyncConnection, values: dict[str, Any]) -> bool:
        """Insert one row unless its `dedup_key` is there already; True when inserted."""
        insert = upsert_insert(connection, OUTBOX).values(values).on_conflict_do_nothing(index_elements=["dedup_key"])
        result = await connection.execute(insert)
        return bool(result.rowcount == 1)

    @staticmethod
    async def supersede_pending(
        connection: AsyncConnection, *, incident_id: uuid.UUID, receiver: str, keep: uuid.UUID, now: datetime, why: str
    ) -> None:
        """Mark the incident's other unclaimed pending rows for `receiver` superseded."""
        await connection.execute(
            sa.update(OUTBOX)
            .where(
                OUTBOX.c.incident_id == incident_id,
                OUTBOX.c.receiver == receiver,
                OUTBOX.c.status == PENDING,
                OUTBOX.c.id != keep,
                sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
            )
            .values(status=SUPERSEDED, last_error=why)
        )

    # ------------------------------------------------------------ claiming

    async def due(self, now: datetime, limit: int, exclude: set[uuid.UUID]) -> list[tuple[uuid.UUID, str]]:
        """(id, receiver) of pending rows due at `now`, unclaimed, with no older pending row of the same
        incident and receiver; oldest due first."""
        older = _OLDER
        blocked = (
            sa.select(older.c.id)
            .where(
                older.c.incident_id == OUTBOX.c.incident_id,
                older.c.receiver == OUTBOX.c.receiver,
                older.c.status == PENDING,
                older.c.created_at < OUTBOX.c.created_at,
            )
            .exists()
        )
        query = (
            sa.select(OUTBOX.c.id, OUTBOX.c.receiver)
            .where(
                OUTBOX.c.status == PENDING,
                OUTBOX.c.next_attempt_at <= now,
                sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
                ~blocked,
            )
            .order_by(OUTBOX.c.next_attempt_at, OUTBOX.c.created_at, OUTBOX.c.id)
            .limit(limit + len(exclude))
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [(row.id, row.receiver) for row in rows if row.id not in exclude][:limit]

    async def claim(
        self, claims: Iterable[tuple[uuid.UUID, datetime]], *, worker_id: str, now: datetime
    ) -> list[ClaimedRow]:
        """Claim each (row id, claimed until) with one UPDATE that only one process can win; the rows
        won, in the order given."""
        won: list[uuid.UUID] = []
        async with write_transaction(self._engine) as connection:
            for row_id, until in claims:
                result = await connection.execute(
                    sa.update(OUTBOX)
                    .where(
                        OUTBOX.c.id == row_id,
                        OUTBOX.c.status == PENDING,
                        sa.or_(OUTBOX.c.claimed_until.is_(None), OUTBOX.c.claimed_until < now),
                    )
                    .values(claimed_by=worker_id, claimed_until=until)
                )
                if result.rowcount == 1:  # otherwise another dispatcher won it
                    won.append(row_id)
            rows = (await connection.execute(sa.select(OUTBOX).where(OUTBOX.c.id.in_(won)))).all() if won else []
        by_id = {row.id: row for row in rows}
        return [
            ClaimedRow(row.id, row.incident_id, row.receiver, row.event, row.payload, row.attempts, row.created_at)
            for row in (by_id[row_id] for row_id in won)
        ]

    async def release(self, row_ids: list[uuid.UUID], *, worker_id: str) -> None:
        async with write_transaction(self._engine) as connection:
            await connection.execute(
                sa.update(OUTBOX)
                .where(OUTBOX.c.id.in_(row_ids), OUTBOX.c.claimed_by == worker_id)
                .values(claimed_by=None, claimed_until=None)
            )

    # ------------------------------------------------------------ recording

    @staticmethod
    async def has_newer_pending(connection: AsyncConnection, row: ClaimedRow) -> bool:
        if row.incident_id is None:
            return False
        found = await connection.scalar(
            sa.select(OUTBOX.c.id)
            .where(
                OUTBOX.c.incident_id == row.incident_id,
                OUTBOX.c.receiver == row.receiver,
                OUTBOX.c.status == PENDING,
                OUTBOX.c.created_at > row.created_at,
            )
            .limit(1)
        )
        return found is not None

    @staticmethod
    async def record(
        connection: AsyncConnection, row_id: uuid.UUID, *, worker_id: str, values: dict[str, Any], delivery: Delivery
    ) -> bool:
        """Store the row's new `values` if `worker_id` still holds its claim, and the attempt either way;
        True when the row was updated."""
        changed = await connection.execute(
            sa.update(OUTBOX).where(OUTBOX.c.id == row_id, OUTBOX.c.claimed_by == worker_id).values(**values)
        )
        await connection.execute(sa.insert(DELIVERIES).values(outbox_id=row_id, **asdict(delivery)))
        return bool(changed.rowcount == 1)

    async def pending_count(self) -> int:
        async with self._engine.connect() as connection:
            query = sa.select(sa.func.count()).select_from(OUTBOX).where(OUTBOX.c.status == PENDING)
            count = await connection.scalar(query)
        return int(count or 0)

    # ------------------------------------------------------------ reminders and housekeeping

    async def firing_of_open_incidents(self) -> tuple[list[Any], set[tuple[uuid.UUID, str]]]:
        """The first-notice rows of open incidents, oldest first, with the incident's current values and
        whether it (or a member of its group) was acknowledged (`acked`) and whether the incident itself
        is still open (`incident_open`: a group's lead may have recovered while the group has not);
        and the (incident, receiver) pairs that have a row still pending."""
        query = (
            sa.select(
                OUTBOX.c.incident_id,
                OUTBOX.c.receiver,
                OUTBOX.c.payload,
                OUTBOX.c.created_at,
                INCIDENTS.c.baseline_ms,
                INCIDENTS.c.observed_ms,
                INCIDENTS.c.ratio,
                INCIDENTS.c.error,
                _acked().label("acked"),
                INCIDENTS.c.resolved_at.is_(None).label("incident_open"),
            )
            .join(INCIDENTS, INCIDENTS.c.id == OUTBOX.c.incident_id)
            .where(_still_firing(), OUTBOX.c.event == "firing")
            .order_by(OUTBOX.c.created_at)
        )
        busy_query = sa.select(OUTBOX.c.incident_id, OUTBOX.c.receiver).where(
            OUTBOX.c.status == PENDING, OUTBOX.c.incident_id.is_not(None)
        )
        async with self._engine.connect() as connection:
            rows = list((await connection.execute(query)).all())
            busy = {(row.incident_id, row.receiver) for row in (await connection.execute(busy_query)).all()}
        return rows, busy

    async def prune(self, older_than: datetime) -> int:
        """Delete finished rows (and their attempts) created before `older_than`, except the first
        firing notice of an incident (or its group) still open."""
        open_incidents = sa.select(INCIDENTS.c.id).where(_still_firing())
        async with write_transaction(self._engine) as connection:
            result = await connection.execute(
                sa.delete(OUTBOX).where(
                    OUTBOX.c.status.in_(FINISHED),
                    OUTBOX.c.created_at < older_than,
                    sa.not_(sa.and_(OUTBOX.c.event == "firing", OUTBOX.c.incident_id.in_(open_incidents))),
                )
            )
        return int(result.rowcount or 0)
