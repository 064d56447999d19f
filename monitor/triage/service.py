"""What `incidents ack|resolve|label`, `annotate` and `incidents stats` do, on an engine and a config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.model import Notification, series_fields
from monitor.alert.outbox import Enqueued, Outbox
from monitor.alert.text import fmt_time
from monitor.config.models import Config
from monitor.detect.group_notify import GroupNotifier
from monitor.store.incidents import GroupStore
from monitor.store.triage import Annotation, IncidentFacts, IncidentLookupError, TriageStore
from monitor.triage.stats import AlertRate, Judged, PrecisionRow, alert_rate, per_notification, precision_table

MAX_TEXT = 500


class TriageRefused(Exception):
    """The incident is not in a state that allows this (acknowledging or resolving a resolved one)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def describe(facts: IncidentFacts) -> str:
    """`0e6f1a52 (regression, page) on qwen3-8b / short @ fra-dc1`."""
    return f"{str(facts.id)[:8]} ({facts.kind}, {facts.severity}) on {facts.target} / {facts.prompt} @ {facts.location}"


@dataclass(frozen=True, slots=True)
class Acked:
    facts: IncidentFacts
    already: bool  # acknowledged before: the first acknowledgement is kept


@dataclass(frozen=True, slots=True)
class Resolved:
    facts: IncidentFacts
    enqueued: list[Enqueued]
    # Of a grouped incident: the group's members still open (its one page stays open until they close).
    group_open: int = 0


class Triage:
    def __init__(self, engine: AsyncEngine, config: Config, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._store = TriageStore(engine)
        self._config = config
        self._outbox = Outbox(engine, config.alerts)
        self._groups = GroupNotifier(config, outbox=self._outbox)
        self._clock = clock

    async def ack(self, given: str, *, by: str) -> Acked:
        async with self._store.transaction() as connection:
            facts = await self._find(connection, given)
            if facts.resolved_at is not None and not await self._page_open(connection, facts):
                raise TriageRefused(
                    f"incident {describe(facts)} was resolved at {fmt_time(facts.resolved_at)}; only an open "
                    "incident can be acknowledged (label it instead: `ttft-monitor incidents label ID ...`)"
                )
            if facts.acked_at is not None:
                return Acked(facts, already=True)
            await self._store.ack(connection, facts.id, by=by, now=self._clock())
        return Acked(facts, already=False)

    async def label(self, given: str, label: str, *, by: str) -> IncidentFacts:
        async with self._store.transaction() as connection:
            facts = await self._find(connection, given)
            await self._store.label(connection, facts.id, label, by=by, now=self._clock())
        return facts

    async def resolve(self, given: str, *, by: str, note: str | None) -> Resolved:
        """Close the incident, tell the detector to forget it, and enqueue its resolve notification, in
        one transaction: a resolve nobody hears of, or a notice of a resolve that did not happen, cannot
        be left behind."""
        now = self._clock()
        async with self._store.transaction() as connection:
            facts = await self._find(connection, given)
            if facts.resolved_at is not None or not await self._store.resolve(
                connection, facts.id, by=by, note=note, now=now
            ):
                when = f" at {fmt_time(facts.resolved_at)}" if facts.resolved_at is not None else ""
                hint = ""
                if facts.group_id is not None and await self._page_open(connection, facts):
                    members = await GroupStore().members(connection, facts.group_id)
                    still = [str(m.id)[:8] for m in members if m.resolved_at is None]
                    hint = (
                        f"; its group's page stays open while {len(still)} member(s) are: "
                        f"resolve {', '.join(still[:5])}{' ...' if len(still) > 5 else ''}"
                    )
                raise TriageRefused(f"incident {describe(facts)} is already resolved{when}{hint}")
            await self._store.forget_in_detector_state(connection, facts.series_id, facts.kind)
            summary = f"Resolved by hand by {by}" + (f": {note}" if note else ".")
            if facts.group_id is not None:
                # Its page is the group's: resolved (under the lead's id) once no member is open, by
                # whoever closes the last one; a member's own resolve would close the whole page early.
                job = await self._group_job(connection, facts)
                _state, enqueued = await self._groups.sync(
                    connection, job, facts.group_id, now, resolve_summary=summary
                )
                members = await GroupStore().members(connection, facts.group_id)
                return Resolved(facts, enqueued, group_open=sum(1 for m in members if m.resolved_at is None))
            payload = await self._store.first_firing_payload(connection, facts.id)
            notification = self._resolve_notification(facts, payload, summary=summary, now=now)
            enqueued = await self._outbox.notify(notification, now=now, connection=connection)
        return Resolved(facts, enqueued)

    @staticmethod
    async def _page_open(connection: Any, facts: IncidentFacts) -> bool:
        """Whether the incident's group is still open: its page (the lead's id) still fires, and
        reminds, after the lead itself recovered; acknowledging that id must quiet it."""
        if facts.group_id is None:
            return False
        group = await GroupStore().read(connection, facts.group_id)
        return group is not None and group.resolved_at is None

    async def _group_job(self, connection: Any, facts: IncidentFacts) -> str:
        """The job the group's page named (its lead's first notice), else the incident's own."""
        group = await GroupStore().read(connection, facts.group_id) if facts.group_id is not None else None
        payload = await self._store.first_firing_payload(connection, group.lead_incident_id) if group else None
        job = (payload or {}).get("job") or (facts.details or {}).get("job")
        return str(job or "")

    async def annotate(self, text: str, *, target: str | None, by: str) -> Annotation:
        return await self._store.annotate(text, target=target, by=by, now=self._clock())

    async def stats(self, *, days: float | None) -> list[PrecisionRow]:
        since = None if days is None else self._clock() - timedelta(days=days)
        judged = [Judged(*row) for row in await self._store.labels(since=since)]
        return precision_table(per_notification(judged))

    async def alert_rate(self, *, days: float | None) -> AlertRate:
        """Regression alerts per series-week of runs, and what their labels make of it."""
        since = None if days is None else self._clock() - timedelta(days=days)
        judged = [Judged(*row) for row in await self._store.labels(since=since)]
        watched = await self._store.watched(since=since)
        return alert_rate(judged, watched, target=self._config.detection.false_alerts_per_week)

    async def _find(self, connection: Any, given: str) -> IncidentFacts:
        try:
            return await self._store.find(connection, given)
        except ValueError as exc:
            raise IncidentLookupError(str(exc)) from None

    def _resolve_notification(
        self, facts: IncidentFacts, payload: dict[str, Any] | None, *, summary: str, now: datetime
    ) -> Notification:
        base = _readable(payload)
        details = facts.details or {}
        if base is None:
            since = details.get("since")
            job = str(details.get("job") or "")
            base = Notification(
                incident_id=facts.id,
                state="firing",
                kind=facts.kind,
                severity=facts.severity,
                **series_fields(facts, job=job, opened_at=facts.opened_at, base_url=self._config.alerts.base_url),
                since=datetime.fromisoformat(since) if isinstance(since, str) else facts.opened_at,
            )
        return base.with_changes(
            state="resolved",
            resolved_at=now,
            repeat=0,
            severity=facts.severity,
            baseline_ms=facts.baseline_ms if facts.baseline_ms is not None else base.baseline_ms,
            # Nobody measured it back to normal: no "back to 1.05x" line.
            observed_ms=None,
            ratio=None,
            peak_ratio=facts.peak_ratio if facts.peak_ratio is not None else base.peak_ratio,
            peak_at=facts.peak_at if facts.peak_at is not None else base.peak_at,
            summary=summary,
        )


def _readable(payload: dict[str, Any] | None) -> Notification | None:
    if payload is None:
        return None
    try:
        return Notification.from_json(payload)
    except (KeyError, TypeError, ValueError):
        return None
