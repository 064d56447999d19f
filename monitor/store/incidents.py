"""The detector's tables behind one small repository: its per-series state (written under a version
check) and the incidents it records. Every statement runs on the caller's connection, so the state,
the incidents and their notifications commit or roll back together."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from monitor.store.direct import DirectStatement
from monitor.store.models import (
    GROUPS,
    INCIDENTS,
    SCOPES,
    SERIES,
    DetectorStateRow,
    IncidentGroupRow,
    IncidentRow,
    SeriesRow,
)
from monitor.store.records import SeriesKey, record_from_row
from monitor.store.statements import find_series_id, upsert_insert

# Detection reads and writes one state row a series and tick: built once, so SQLAlchemy reuses their compiled
# form without building and keying a new statement each time (the names differ from the columns' on purpose:
# an UPDATE's SET reserves those).
_READ_STATE = select(DetectorStateRow.state, DetectorStateRow.version).where(
    DetectorStateRow.series_id == bindparam("state_series")
)
_WRITE_STATE = (
    update(DetectorStateRow)
    .where(
        DetectorStateRow.series_id == bindparam("state_series"), DetectorStateRow.version == bindparam("read_version")
    )
    .values(
        state=bindparam("new_state"),
        version=bindparam("new_version"),
        updated_at=bindparam("written_at"),
        reads_from=bindparam("reads_from"),
    )
)
# A series' first state (500 on a new daemon's first tick).
_FIRST_STATE = insert(DetectorStateRow).values(
    series_id=bindparam("state_series"),
    state=bindparam("new_state"),
    version=1,
    updated_at=bindparam("written_at"),
    reads_from=bindparam("reads_from"),
)
# On SQLite, without SQLAlchemy's execution around them (store/direct.py).
READ_STATE = DirectStatement(_READ_STATE)
WRITE_STATE = DirectStatement(_WRITE_STATE)
FIRST_STATE = DirectStatement(_FIRST_STATE)


@dataclass(frozen=True, slots=True)
class StoredState:
    """A series' detector state as read, with the version a write must still find."""

    state: dict[str, Any]
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentChange:
    """What an incident event writes: the values every event sets, plus the opening and resolve times."""

    kind: str
    severity: str
    opened_at: datetime
    resolved_at: datetime | None
    values: dict[str, Any]  # baseline_ms, observed_ms, ratio, error, details, peak_*, opened_* ...


class IncidentStore:
    """Reads and writes `detector_state` and `incidents`; no other module touches them for writing."""

    def __init__(self) -> None:
        # A series' id never changes once written (no series row is deleted): found once, kept.
        self._series_ids: dict[SeriesKey, int] = {}

    async def series_id(self, connection: AsyncConnection, series: SeriesKey) -> int | None:
        known = self._series_ids.get(series)
        if known is None:
            known = await find_series_id(connection, series)
            if known is not None:
                self._series_ids[series] = known
        return known

    async def read_state(self, connection: AsyncConnection, series_id: int) -> StoredState | None:
        rows = await READ_STATE.rows(connection, {"state_series": series_id})
        return StoredState(state=rows[0][0], version=rows[0][1]) if rows else None

    async def write_state(
        self,
        connection: AsyncConnection,
        series_id: int,
        state: dict[str, Any],
        *,
        read: StoredState | None,
        now: datetime,
        reads_from: datetime | None = None,
    ) -> bool:
        """Write `state` if the row is still as `read` found it (no row: insert, which a concurrent first
        insert makes fail with IntegrityError). False: another writer changed it meanwhile. `reads_from`: where
        the evaluation read the series' history from."""
        if read is None:
            await FIRST_STATE.rowcount(
                connection,
                {"state_series": series_id, "new_state": state, "written_at": now, "reads_from": reads_from},
            )
            return True
        written = await WRITE_STATE.rowcount(
            connection,
            {
                "state_series": series_id,
                "read_version": read.version,
                "new_state": state,
                "new_version": read.version + 1,
                "written_at": now,
                "reads_from": reads_from,
            },
        )
        return written == 1

    async def open_incident(self, connection: AsyncConnection, series_id: int, kind: str) -> uuid.UUID | None:
        """The id of the series' open incident of `kind`, if any."""
        return (
            await connection.execute(
                select(IncidentRow.id).where(
                    IncidentRow.series_id == series_id,
                    IncidentRow.kind == kind,
                    IncidentRow.resolved_at.is_(None),
                )
            )
        ).scalar()

    async def insert_incident(self, connection: AsyncConnection, series_id: int, change: IncidentChange) -> uuid.UUID:
        incident_id = uuid.uuid4()
        await connection.execute(
            insert(IncidentRow).values(
                id=incident_id,
                series_id=series_id,
                kind=change.kind,
                severity=change.severity,
                opened_at=change.opened_at,
                resolved_at=change.resolved_at,
                **change.values,
            )
        )
        return incident_id

    async def update_incident(
        self, connection: AsyncConnection, incident_id: uuid.UUID, change: IncidentChange
    ) -> None:
        values = dict(change.values, severity=change.severity)
        # The opening is written once: an escalation re-baselines the detector's incident, and a resolve
        # would otherwise carry the escalation's figures as the opening's.
        for name in ("opened_baseline_ms", "opened_observed_ms"):
            if name in values:
                values[name] = func.coalesce(getattr(IncidentRow, name), values[name])
        if change.resolved_at is not None:
            values["resolved_at"] = change.resolved_at
        await connection.execute(update(IncidentRow).where(IncidentRow.id == incident_id).values(**values))


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A stored incident group."""

    id: uuid.UUID
    scope: str
    kind: str
    provider: str  # or the location, for a group by location
    lead_incident_id: uuid.UUID
    opened_at: datetime
    resolved_at: datetime | None
    notified_members: int
    notified_severity: str | None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member incident of a group, with its series."""

    id: uuid.UUID
    series: SeriesKey
    severity: str
    opened_at: datetime
    resolved_at: datetime | None
    baseline_ms: float | None
    observed_ms: float | None
    ratio: float | None
    peak_ratio: float | None
    peak_at: datetime | None
    error: str | None
    details: dict[str, Any]
    opened_baseline_ms: float | None = None
    opened_observed_ms: float | None = None


class GroupStore:
    """Reads and writes `incident_groups` and `incident_group_scopes`; every change is claimed by one
    statement whose effect says whether this writer won, so several daemons notify a group once."""

    async def join(
        self,
        connection: AsyncConnection,
        *,
        scope: str,
        kind: str,
        provider: str,
        incident_id: uuid.UUID,
        now: datetime,
        cutoff: datetime,
    ) -> uuid.UUID:
        """Put the incident in the scope's current group, or in a new one (with it as the lead) when the
        scope's last member joined before `cutoff`. One upsert decides, whoever races."""
        candidate = uuid.uuid4()
        base = upsert_insert(connection, SCOPES).values(scope=scope, group_id=candidate, last_joined_at=now)
        statement = base.on_conflict_do_update(
            index_elements=["scope"],
            set_={
                "group_id": case((SCOPES.c.last_joined_at < cutoff, base.excluded.group_id), else_=SCOPES.c.group_id),
                "last_joined_at": base.excluded.last_joined_at,
            },
        ).returning(SCOPES.c.group_id)
        group_id: uuid.UUID = (await connection.execute(statement)).scalar_one()
        if group_id == candidate:
            await connection.execute(
                insert(IncidentGroupRow).values(
                    id=group_id,
                    scope=scope,
                    kind=kind,
                    provider=provider,
                    lead_incident_id=incident_id,
                    opened_at=now,
                    resolved_at=None,
                    notified_members=0,
                    notified_severity=None,
                )
            )
        await connection.execute(update(IncidentRow).where(IncidentRow.id == incident_id).values(group_id=group_id))
        return group_id

    async def group_of(self, connection: AsyncConnection, incident_id: uuid.UUID) -> uuid.UUID | None:
        return await connection.scalar(select(IncidentRow.group_id).where(IncidentRow.id == incident_id))

    async def read(self, connection: AsyncConnection, group_id: uuid.UUID) -> GroupRecord | None:
        g = GROUPS.c
        row = (await connection.execute(select(GROUPS).where(g.id == group_id))).first()
        if row is None:
            return None
        return record_from_row(GroupRecord, row)

    async def members(self, connection: AsyncConnection, group_id: uuid.UUID) -> list[MemberRecord]:
        i, s = INCIDENTS.c, SERIES.c
        rows = (
            await connection.execute(
                select(INCIDENTS, s.target, s.provider, s.model, s.prompt, s.location)
                .join(SERIES, s.id == i.series_id)
                .where(i.group_id == group_id)
                .order_by(i.opened_at, i.id)
            )
        ).all()
        return [
            record_from_row(MemberRecord, row, series=record_from_row(SeriesKey, row), details=row.details or {})
            for row in rows
        ]

    async def provider_locations(self, connection: AsyncConnection, provider: str) -> set[str]:
        """Every location the provider's series are watched from."""
        rows = await connection.execute(select(SeriesRow.location).where(SeriesRow.provider == provider).distinct())
        return set(rows.scalars().all())

    async def unnotified(self, connection: AsyncConnection) -> list[uuid.UUID]:
        """Open groups whose first notification is still held, or with no open member left (their
        last member was closed by something that did not resolve the group: a person, before
        `incidents resolve` did; a statement by hand)."""
        open_member = (
            select(INCIDENTS.c.id)
            .where(INCIDENTS.c.group_id == GROUPS.c.id, INCIDENTS.c.resolved_at.is_(None))
            .exists()
        )
        query = select(GROUPS.c.id).where(
            GROUPS.c.resolved_at.is_(None), (GROUPS.c.notified_members == 0) | ~open_member
        )
        return list((await connection.execute(query)).scalars().all())

    async def streaking(self, connection: AsyncConnection, name: str, kind: str, *, by: str = "provider") -> int:
        """Series of the provider (or location: `by`) without an open incident of `kind` whose detector has
        begun a confirming streak: they may join the group within a run or two."""
        open_incident = (
            select(INCIDENTS.c.id)
            .where(INCIDENTS.c.series_id == SERIES.c.id, INCIDENTS.c.kind == kind, INCIDENTS.c.resolved_at.is_(None))
            .exists()
        )
        query = (
            select(DetectorStateRow.state)
            .join(SERIES, SERIES.c.id == DetectorStateRow.series_id)
            .where(SERIES.c[by] == name, ~open_incident)
        )
        states = (await connection.execute(query)).scalars().all()
        return sum(1 for state in states if state.get("page_streak", 0) or state.get("ticket_streak", 0))

    async def claim_notice(
        self, connection: AsyncConnection, group: GroupRecord, *, members: int, severity: str
    ) -> bool:
        """Record that the group is notified with `members` and `severity`, if nobody did since `group`
        was read. True: this writer sends it."""
        severity_was = (
            IncidentGroupRow.notified_severity.is_(None)
            if group.notified_severity is None
            else IncidentGroupRow.notified_severity == group.notified_severity
        )
        written = await connection.execute(
            update(IncidentGroupRow)
            .where(
                IncidentGroupRow.id == group.id,
                IncidentGroupRow.resolved_at.is_(None),
                IncidentGroupRow.notified_members == group.notified_members,
                severity_was,
            )
            .values(notified_members=members, notified_severity=severity)
        )
        return written.rowcount == 1

    async def claim_resolve(self, connection: AsyncConnection, group_id: uuid.UUID, at: datetime) -> bool:
        """Resolve the group if it is open; its scope's next regression then starts a new group."""
        written = await connection.execute(
            update(IncidentGroupRow)
            .where(IncidentGroupRow.id == group_id, IncidentGroupRow.resolved_at.is_(None))
            .values(resolved_at=at)
        )
        if written.rowcount != 1:
            return False
        await connection.execute(delete(SCOPES).where(SCOPES.c.group_id == group_id))
        return True
