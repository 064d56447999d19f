"""Triage in the database: acknowledgements, labels, manual resolves (`incident_triage`) and change
markers (`annotations`). Statements only; monitor.triage decides what they mean."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.store import cold
from monitor.store.engine import write_transaction
from monitor.store.models import (
    ANNOTATIONS,
    COLD_CHUNKS,
    DETECTOR_STATE,
    GROUPS,
    INCIDENTS,
    OUTBOX,
    RUNS,
    SERIES,
    TRIAGE,
)
from monitor.store.records import record_from_row
from monitor.store.statements import upsert_insert

# The shortest id prefix accepted: `incidents` shows 8 characters.
MIN_PREFIX = 4
# How long before an incident began a change marker still counts as a likely cause worth naming.
ANNOTATION_WINDOW = timedelta(hours=1)
# `created_by` of the markers the detector adds itself (a model change), not a person's `annotate`.
AUTOMATIC_MARKER = "ttft-monitor"


class IncidentLookupError(Exception):
    """No incident, or several, match the id given."""


@dataclass(frozen=True, slots=True)
class IncidentFacts:
    """An incident, its series and what people said about it."""

    id: uuid.UUID
    series_id: int
    kind: str
    severity: str
    opened_at: datetime
    resolved_at: datetime | None
    baseline_ms: float | None
    observed_ms: float | None
    ratio: float | None
    error: str | None
    peak_ratio: float | None
    peak_at: datetime | None
    details: dict[str, Any] | None
    target: str
    model: str
    provider: str
    prompt: str
    location: str
    acked_at: datetime | None
    acked_by: str | None
    label: str | None
    group_id: uuid.UUID | None = None  # the outage it was notified in (one page for the group)


@dataclass(frozen=True, slots=True)
class Annotation:
    id: uuid.UUID
    at: datetime
    text: str
    target: str | None
    created_by: str | None


@dataclass(frozen=True, slots=True)
class TriageRecord:
    acked_at: datetime | None = None
    acked_by: str | None = None
    label: str | None = None
    labelled_at: datetime | None = None
    labelled_by: str | None = None
    resolved_at: datetime | None = None
    resolved_by: str | None = None
    note: str | None = None


def related_annotations(
    marks: Sequence[Annotation], *, target: str, began: datetime, until: datetime
) -> list[Annotation]:
    """The markers of `target` (or of every target) from ANNOTATION_WINDOW before `began` to `until`."""
    start = began - ANNOTATION_WINDOW
    return [m for m in marks if start <= m.at <= until and (m.target is None or m.target == target)]


def _annotation(row: Any) -> Annotation:
    return Annotation(row.id, row.at, row.text, row.target, row.created_by)


def prefix_bounds(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The smallest and largest UUID starting with the hex `prefix` (dashes ignored); ValueError when it
    is not hex or too short. A range, not LIKE: UUID columns are native on PostgreSQL."""
    digits = prefix.strip().lower().replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) > 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(
            f"'{prefix}' is not an incident id: give the id or its first {MIN_PREFIX}+ hex characters "
            "as `ttft-monitor incidents` shows them"
        )
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


_TICK = timedelta(microseconds=1)


def _aware(moment: datetime | str) -> datetime:
    # min() and max() of a timestamp may come back from SQLite as text.
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class TriageStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return write_transaction(self._engine)

    # ------------------------------------------------------------ incidents

    async def find(self, connection: AsyncConnection, given: str) -> IncidentFacts:
        """The incident whose id is `given` or starts with it; IncidentLookupError when none or several do."""
        low, high = prefix_bounds(given)
        query = (
            sa.select(
                INCIDENTS,
                SERIES.c.target,
                SERIES.c.model,
                SERIES.c.provider,
                SERIES.c.prompt,
                SERIES.c.location,
                TRIAGE.c.acked_at,
                TRIAGE.c.acked_by,
                TRIAGE.c.label,
            )
            .join(SERIES, SERIES.c.id == INCIDENTS.c.series_id)
            .outerjoin(TRIAGE, TRIAGE.c.incident_id == INCIDENTS.c.id)
            .where(INCIDENTS.c.id.between(low, high))
            .limit(2)
        )
        rows = (await connection.execute(query)).all()
        if not rows:
            raise IncidentLookupError(f"no incident with id '{given}'; `ttft-monitor incidents` lists them")
        if len(rows) > 1:
            raise IncidentLookupError(f"'{given}' matches several incidents; give more of the id")
        row = rows[0]
        return record_from_row(IncidentFacts, row)

    @staticmethod
    async def _upsert(connection: AsyncConnection, incident_id: uuid.UUID, values: dict[str, Any]) -> None:
        insert = upsert_insert(connection, TRIAGE).values(incident_id=incident_id, **values)
        await connection.execute(insert.on_conflict_do_update(index_elements=["incident_id"], set_=values))

    async def ack(self, connection: AsyncConnection, incident_id: uuid.UUID, *, by: str, now: datetime) -> None:
        await self._upsert(connection, incident_id, {"acked_at": now, "acked_by": by})

    async def label(
        self, connection: AsyncConnection, incident_id: uuid.UUID, label: str, *, by: str, now: datetime
    ) -> None:
        await self._upsert(connection, incident_id, {"label": label, "labelled_at": now, "labelled_by": by})

    async def resolve(
        self, connection: AsyncConnection, incident_id: uuid.UUID, *, by: str, note: str | None, now: datetime
    ) -> bool:
        """Close the incident if it is still open and record who did and why; False when it was not open
        (anyone, the detector included, may have resolved it a moment ago)."""
        closed = await connection.execute(
            sa.update(INCIDENTS)
            .where(INCIDENTS.c.id == incident_id, INCIDENTS.c.resolved_at.is_(None))
            .values(resolved_at=now, updated_at=now)
        )
        if closed.rowcount != 1:
            return False
        await self._upsert(connection, incident_id, {"resolved_at": now, "resolved_by": by, "note": note})
        return True

    @staticmethod
    async def forget_in_detector_state(connection: AsyncConnection, series_id: int, kind: str) -> None:
        """Drop the open incident of `kind` from the series' detector memory, bumping its version so an
        evaluation that read the old state retries. Without this the detector would go on updating an
        incident the database says is closed. Streaks are kept: a regression that persists opens anew."""
        row = (
            await connection.execute(
                sa.select(DETECTOR_STATE.c.state, DETECTOR_STATE.c.version).where(
                    DETECTOR_STATE.c.series_id == series_id
                )
            )
        ).first()
        if row is None or kind not in (row.state or {}).get("incidents", {}):
            return
        state = dict(row.state)
        state["incidents"] = {k: v for k, v in state["incidents"].items() if k != kind}
        await connection.execute(
            sa.update(DETECTOR_STATE)
            .where(DETECTOR_STATE.c.series_id == series_id)
            .values(state=state, version=row.version + 1)
        )

    @staticmethod
    async def group_targets(connection: AsyncConnection, group_id: uuid.UUID) -> list[str]:
        """The targets of the group's member incidents."""
        query = (
            sa.select(SERIES.c.target)
            .join(INCIDENTS, INCIDENTS.c.series_id == SERIES.c.id)
            .where(INCIDENTS.c.group_id == group_id)
            .distinct()
        )
        return sorted((await connection.execute(query)).scalars().all())

    @staticmethod
    async def first_firing_payload(connection: AsyncConnection, incident_id: uuid.UUID) -> dict[str, Any] | None:
        """The notification the incident opened with, as the outbox stored it, if it was sent anywhere."""
        return await connection.scalar(
            sa.select(OUTBOX.c.payload)
            .where(OUTBOX.c.incident_id == incident_id, OUTBOX.c.event == "firing")
            .order_by(OUTBOX.c.created_at)
            .limit(1)
        )

    @staticmethod
    async def acknowledged(connection: AsyncConnection, incident_id: uuid.UUID) -> tuple[str | None, datetime] | None:
        """(by, at) of the first acknowledgement of the incident, or of any member of its group (the
        group's page goes out under its lead's id, and whoever acknowledged a member is on that page),
        else None."""
        group = (
            sa.select(INCIDENTS.c.group_id)
            .where(INCIDENTS.c.id == incident_id, INCIDENTS.c.group_id.is_not(None))
            .scalar_subquery()
        )
        members = sa.select(INCIDENTS.c.id).where(INCIDENTS.c.group_id == group)
        row = (
            await connection.execute(
                sa.select(TRIAGE.c.acked_by, TRIAGE.c.acked_at)
                .where(
                    sa.or_(TRIAGE.c.incident_id == incident_id, TRIAGE.c.incident_id.in_(members)),
                    TRIAGE.c.acked_at.is_not(None),
                )
                .order_by(TRIAGE.c.acked_at)
                .limit(1)
            )
        ).first()
        return (row.acked_by, row.acked_at) if row is not None else None

    @staticmethod
    async def records(connection: AsyncConnection, incident_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, TriageRecord]:
        out: dict[uuid.UUID, TriageRecord] = {}
        ids = list(incident_ids)
        for offset in range(0, len(ids), 500):
            rows = await connection.execute(
                sa.select(TRIAGE).where(TRIAGE.c.incident_id.in_(ids[offset : offset + 500]))
            )
            for row in rows:
                out[row.incident_id] = record_from_row(TriageRecord, row)
        return out

    async def labels(self, *, since: datetime | None) -> list[tuple[Any, ...]]:
        """(id, kind, severity, label or None, group id, the group's lead id) of every incident opened
        since `since` (all when None)."""
        groups = GROUPS
        query = sa.select(
            INCIDENTS.c.id,
            INCIDENTS.c.kind,
            INCIDENTS.c.severity,
            TRIAGE.c.label,
            INCIDENTS.c.group_id,
            groups.c.lead_incident_id,
        ).select_from(
            INCIDENTS.outerjoin(TRIAGE, TRIAGE.c.incident_id == INCIDENTS.c.id).outerjoin(
                groups, groups.c.id == INCIDENTS.c.group_id
            )
        )
        if since is not None:
            query = query.where(INCIDENTS.c.opened_at >= since)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [tuple(row) for row in rows]

    async def watched(self, *, since: datetime | None) -> list[tuple[datetime, datetime]]:
        """(first, last) run start of every series with runs since `since` (all when None): how long the
        detector watched each, for the alert rate per series-week."""
        query = sa.select(RUNS.c.series_id, sa.func.min(RUNS.c.started_at), sa.func.max(RUNS.c.started_at)).group_by(
            RUNS.c.series_id
        )
        chunks = sa.select(COLD_CHUNKS.c.series_id, COLD_CHUNKS.c.first_started_at, COLD_CHUNKS.c.last_started_at)
        if since is not None:
            query = query.where(RUNS.c.started_at >= since)
            chunks = chunks.where(COLD_CHUNKS.c.last_started_at >= since)
        async with self._engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                connection = await connection.execution_options(isolation_level="REPEATABLE READ")
            spans = {sid: (first, last) for sid, first, last in await connection.execute(query) if first is not None}
            # Runs kept in the cold tier (monitor/store/cold.py) count as rows do: a chunk by its first and last
            # start, decoded only where `since` cuts it.
            for sid, first, last in (await connection.execute(chunks)).all():
                if since is not None and first < since:
                    read = await cold.read_runs(connection, [sid], since, last + _TICK, samples=False, run_keys=())
                    if not read.runs:
                        continue
                    first = read.runs[0]["started_at"]
                low, high = spans.get(sid, (first, last))
                spans[sid] = (min(_aware(low), first), max(_aware(high), last))
        return [(first, last) for first, last in spans.values() if first is not None and last is not None]

    # ------------------------------------------------------------ annotations

    async def annotate(self, text: str, *, target: str | None, by: str | None, now: datetime) -> Annotation:
        item = Annotation(uuid.uuid4(), now, text, target, by)
        async with write_transaction(self._engine) as connection:
            await connection.execute(
                sa.insert(ANNOTATIONS).values(id=item.id, at=item.at, text=text, target=target, created_by=by)
            )
        return item

    @staticmethod
    async def mark_change(
        connection: AsyncConnection,
        text: str,
        *,
        target: str,
        at: datetime,
        within: timedelta = timedelta(hours=1),
        same: str | None = None,
    ) -> bool:
        """An automatic change marker (the detector saw another model answer), once: a target's several
        series see the same change, so a marker with the same text for the target within `within` of
        `at` stands for all; with `same`, any marker whose text starts with it (the series' figures
        differ: each prompt's tokens jump by its own). True when this call added it."""
        match = ANNOTATIONS.c.text == text if same is None else ANNOTATIONS.c.text.startswith(same, autoescape=True)
        existing = await connection.execute(
            sa.select(ANNOTATIONS.c.id)
            .where(
                ANNOTATIONS.c.target == target,
                match,
                ANNOTATIONS.c.at >= at - within,
                ANNOTATIONS.c.at <= at + within,
            )
            .limit(1)
        )
        if existing.first() is not None:
            return False
        await connection.execute(
            sa.insert(ANNOTATIONS).values(id=uuid.uuid4(), at=at, text=text, target=target, created_by=AUTOMATIC_MARKER)
        )
        return True

    @staticmethod
    async def annotations_between(
        connection: AsyncConnection,
        start: datetime,
        end: datetime,
        *,
        target: str | None = None,
        targets: Sequence[str] = (),
        limit: int = 1000,
    ) -> list[Annotation]:
        """Annotations in [start, end], oldest first; with `target` (or several: `targets`), those for
        them and those for every target."""
        query = sa.select(ANNOTATIONS).where(ANNOTATIONS.c.at >= start, ANNOTATIONS.c.at <= end)
        wanted = sorted({*targets, *([target] if target is not None else [])})
        if wanted:
            query = query.where(sa.or_(ANNOTATIONS.c.target.is_(None), ANNOTATIONS.c.target.in_(wanted)))
        rows = await connection.execute(query.order_by(ANNOTATIONS.c.at.desc()).limit(limit))
        return sorted((_annotation(row) for row in rows), key=lambda item: item.at)
