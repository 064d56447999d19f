"""A group's notifications at the I/O edge: read the group and its members, decide (monitor/detect/
grouping.py) and enqueue the one notification for the whole outage, on the caller's connection.

The detection service calls it for the groups a batch changed; `incidents resolve` calls it for the
group of the incident resolved by hand, so the last member closed by a person still resolves the
group and sends its one resolve (under the lead's id, the page's dedup key)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from monitor.alert.model import Notification, series_fields
from monitor.config.models import Config
from monitor.detect.figures import figures_of
from monitor.detect.grouping import Member, Summary, decide, summarise
from monitor.store.incidents import GroupStore, MemberRecord

if TYPE_CHECKING:
    from monitor.alert.outbox import Enqueued, Outbox


def member_since(record: MemberRecord) -> datetime:
    """The first run of the member's confirming streak, else its opening."""
    since = record.details.get("since")
    return datetime.fromisoformat(since) if isinstance(since, str) else record.opened_at


def as_member(record: MemberRecord) -> Member:
    return Member(
        target=record.series.target,
        prompt=record.series.prompt,
        location=record.series.location,
        severity=record.severity,
        since=member_since(record),
        ratio=record.ratio,
        open=record.resolved_at is None,
        peak_ratio=record.peak_ratio,
    )


class GroupNotifier:
    def __init__(self, config: Config, *, outbox: Outbox | None) -> None:
        self._groups = GroupStore()
        self._outbox = outbox
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        self._config = config

    async def sync(
        self,
        connection: AsyncConnection,
        job: str,
        group_id: uuid.UUID,
        at: datetime,
        *,
        resolve_summary: str = "",
    ) -> tuple[Literal["firing", "resolved"] | None, list[Enqueued]]:
        """Notify the group if it grew, rose in severity or resolved since its last notification (held
        while other series of its provider are about to join; `at`: the latest run seen).
        `resolve_summary`: a line for its resolve notice (who resolved the last member by hand).
        Returns the notification's state (None when nothing was claimed) and its outbox rows."""
        group = await self._groups.read(connection, group_id)
        if group is None or group.resolved_at is not None:
            return None, []
        records = await self._groups.members(connection, group_id)
        members = [as_member(record) for record in records]
        settings = self._config.alerts.grouping
        pending = 0
        if settings.enabled and group.notified_members == 0 and settings.hold_minutes > 0:
            pending = await self._groups.streaking(connection, group.provider, group.kind, by=settings.by)
        decision = decide(
            members,
            notified_members=group.notified_members,
            notified_severity=group.notified_severity,
            resolved=False,
            pending=pending,
            age=at - group.opened_at,
            hold=timedelta(minutes=settings.hold_minutes),
        )
        if decision is None:
            return None, []
        state, count, severity = decision
        resolved_at = None
        if state == "resolved":
            resolved_at = max(r.resolved_at for r in records if r.resolved_at is not None)
            claimed = await self._groups.claim_resolve(connection, group_id, resolved_at)
            if not claimed or not group.notified_members:
                return None, []  # another writer resolved it, or nothing was ever sent for it
        elif not await self._groups.claim_notice(connection, group, members=count, severity=severity):
            return None, []
        if self._outbox is None:
            return state, []
        by = "location" if group.scope.split("/")[1] == "location" else "provider"
        locations = await self._groups.provider_locations(connection, group.provider) if by == "provider" else set()
        summary = summarise(group.provider, members, provider_locations=locations, by=by)
        lead = next((r for r in records if r.id == group.lead_incident_id), records[0])
        notification = self._notification(job, group.kind, group_id, lead, summary, state, resolved_at)
        if state == "resolved" and resolve_summary:
            notification = notification.with_changes(summary=resolve_summary)
        return state, await self._outbox.notify(notification, connection=connection)

    def _notification(
        self,
        job: str,
        kind: str,
        group_id: uuid.UUID,
        lead: MemberRecord,
        summary: Summary,
        state: Literal["firing", "resolved"],
        resolved_at: datetime | None,
    ) -> Notification:
        """The group's notification: its lead incident's, with the group's summary when it has several
        members (a group of one reads like any single series' notification)."""
        several = summary.series > 1
        figures = figures_of(lead)
        return Notification(
            incident_id=lead.id,
            state=state,
            kind=kind,
            severity=summary.severity if state == "firing" else lead.severity,
            **series_fields(lead.series, job=job, opened_at=lead.opened_at, base_url=self._config.alerts.base_url),
            since=summary.since if several else member_since(lead),
            resolved_at=resolved_at,
            baseline_ms=figures.baseline_ms,
            observed_ms=figures.observed_ms,
            ratio=summary.ratio if several else figures.ratio,
            error_class=lead.error,
            peak_ratio=figures.peak_ratio,
            peak_at=figures.peak_at,
            opened_baseline_ms=figures.opened_baseline_ms,
            opened_observed_ms=figures.opened_observed_ms,
            cause=lead.details.get("cause"),
            attribution=lead.details.get("attribution", ""),
            group_id=group_id,
            group=summary.text(resolved=state == "resolved") if several else "",
            members=summary.names if several else (),
            summary=_evidence(lead, several=several) if state == "firing" else "",
        )


def _evidence(lead: MemberRecord, *, several: bool) -> str:
    """Why the lead regressed, in the detector's words ("+38% over 14 runs (noise: ...)"), named by its
    series when the group has several."""
    evidence = lead.details.get("evidence")
    if not isinstance(evidence, str) or not evidence:
        return ""
    return f"{lead.series.target} / {lead.series.prompt}: {evidence}" if several else evidence
