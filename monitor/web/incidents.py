"""The incidents as `ttft-monitor incidents` lists them, read-only like web/queries.py: open ones, then those
resolved recently, each with its triage (acknowledgement, label, manual resolve), the change markers around it
and the size of its group; `to_json` is the API's shape (web/payloads.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from monitor.detect.figures import IncidentFigures, figures_of
from monitor.timefmt import iso

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from monitor.store.triage import Annotation, TriageRecord


@dataclass(frozen=True, slots=True)
class IncidentView:
    id: uuid.UUID
    kind: str
    severity: str
    target: str
    model: str
    provider: str
    prompt: str
    location: str
    job: str | None
    opened_at: datetime
    resolved_at: datetime | None
    baseline_ms: float | None
    observed_ms: float | None
    ratio: float | None
    error: str | None
    opened_baseline_ms: float | None = None
    opened_observed_ms: float | None = None
    peak_ratio: float | None = None
    peak_at: datetime | None = None
    # Where the time went (monitor.detect.attribution), for regressions of runs with server metrics.
    cause: str | None = None
    attribution: str | None = None
    # Triage (monitor.triage): who acknowledged, the label, a manual resolve's author and note, and the
    # change markers from an hour before it began until it ended.
    triage: TriageRecord | None = None
    annotations: tuple[Annotation, ...] = ()
    # One page per outage: the group it was notified in, and how many incidents that group holds.
    group_id: uuid.UUID | None = None
    group_size: int = 0
    # What an slo_burn incident measured: bad share, windows, burn rate (monitor.detect.burn.describe).
    summary: str | None = None
    # Why a regression opened, in words and with the series' noise (monitor.detect.noise.describe).
    evidence: str | None = None

    @property
    def state(self) -> str:
        return "open" if self.resolved_at is None else "resolved"

    @property
    def figures(self) -> IncidentFigures:
        return figures_of(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "state": self.state,
            "kind": self.kind,
            "severity": self.severity,
            "target": self.target,
            "model": self.model,
            "provider": self.provider,
            "prompt": self.prompt,
            "location": self.location,
            "job": self.job,
            "opened_at": iso(self.opened_at, whole_seconds=True),
            "resolved_at": None if self.resolved_at is None else iso(self.resolved_at, whole_seconds=True),
            **self.figures.to_json(),
            "error_class": self.error,
            "group_id": None if self.group_id is None else str(self.group_id),
            "group_size": self.group_size,
            "cause": self.cause,
            "attribution": self.attribution,
            "summary": self.summary,
        } | _triage_json(self.triage, self.annotations)


async def list_incidents(engine: AsyncEngine, *, now: datetime, recent_days: float) -> list[IncidentView]:
    """Open incidents (newest first), then those resolved since `now - recent_days` (newest first)."""
    import sqlalchemy as sa

    from monitor.store.models import IncidentRow, SeriesRow
    from monitor.store.records import record_from_row
    from monitor.store.triage import ANNOTATION_WINDOW, TriageStore

    i = IncidentRow.__table__.c
    s = SeriesRow.__table__.c
    since = now - timedelta(days=recent_days)
    query = (
        sa.select(
            i.id,
            i.kind,
            i.severity,
            i.opened_at,
            i.resolved_at,
            i.baseline_ms,
            i.observed_ms,
            i.ratio,
            i.error,
            i.details,
            i.opened_baseline_ms,
            i.opened_observed_ms,
            i.peak_ratio,
            i.peak_at,
            i.group_id,
            s.target,
            s.model,
            s.provider,
            s.prompt,
            s.location,
        )
        .join(SeriesRow.__table__, s.id == i.series_id)
        .where(sa.or_(i.resolved_at.is_(None), i.resolved_at >= since))
        .order_by(i.resolved_at.is_not(None), i.opened_at.desc())
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
        triage = await TriageStore.records(connection, [row.id for row in rows])
        starts = {row.id: _began(row.details, row.opened_at) for row in rows}
        earliest = min(starts.values(), default=now) - ANNOTATION_WINDOW
        marks = await TriageStore.annotations_between(connection, earliest, now)
        groups = {row.group_id for row in rows if row.group_id is not None}
        sizes: dict[uuid.UUID, int] = {}
        if groups:
            count = sa.select(i.group_id, sa.func.count()).where(i.group_id.in_(groups)).group_by(i.group_id)
            sizes = {group: size for group, size in (await connection.execute(count)).all()}
    views = [
        record_from_row(
            IncidentView,
            row,
            **{name: _detail(row.details, name) for name in ("job", "cause", "attribution", "summary", "evidence")},
            group_size=sizes.get(row.group_id, 0) if row.group_id is not None else 0,
        )
        for row in rows
    ]
    return [_with_triage(view, triage.get(view.id), marks, starts[view.id], now) for view in views]


def _began(details: Any, opened_at: datetime) -> datetime:
    since = _detail(details, "since")
    try:
        return datetime.fromisoformat(since) if isinstance(since, str) else opened_at
    except ValueError:
        return opened_at


def _with_triage(
    view: IncidentView, record: TriageRecord | None, marks: list[Annotation], start: datetime, now: datetime
) -> IncidentView:
    from monitor.store.triage import related_annotations

    end = view.resolved_at or now
    related = tuple(related_annotations(marks, target=view.target, began=start, until=end))
    return replace(view, triage=record, annotations=related)


def _triage_json(record: TriageRecord | None, annotations: Sequence[Annotation]) -> dict[str, Any]:
    from monitor.web.payloads import triage_json

    return triage_json(record, annotations)


async def list_annotations(engine: AsyncEngine, *, now: datetime, recent_days: float) -> list[Annotation]:
    """Change markers of the last `recent_days` days, oldest first."""
    from monitor.store.triage import TriageStore

    async with engine.connect() as connection:
        return await TriageStore.annotations_between(connection, now - timedelta(days=recent_days), now)


def _detail(details: Any, name: str) -> Any:
    return details.get(name) if isinstance(details, dict) else None
