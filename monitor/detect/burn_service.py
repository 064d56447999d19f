"""SLO burn rates at the I/O edge: after each stored batch, count each target's probes per window in
the database, evaluate them (monitor/detect/burn.py), and open, raise or resolve the target's
`slo_burn` incident with its notification in one transaction.

A burn incident belongs to a target at a location, not to one prompt: it is recorded on the target's
series row with the prompt `*` (prompt names cannot contain `*`), so the incidents table, `incidents`
and the status pages show it like any other incident. What it remembers between evaluations (when a
rule last fired, the peak) is in the incident row's `details`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy import and_, case, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.model import Notification, series_fields
from monitor.config.models import Config
from monitor.detect.burn import (
    KIND,
    BurnIncident,
    BurnPolicy,
    BurnSeverity,
    RuleResult,
    Verdict,
    WindowCount,
    advance,
    describe,
    describe_resolved,
    details,
    evaluate,
    policy_for,
    reported,
)
from monitor.logging import error_text
from monitor.probe.result import Sample
from monitor.store.engine import write_transaction
from monitor.store.models import COLD_CHUNKS, SAMPLES_OF_RUN, SERIES, IncidentRow, RunRow, SampleRow, SeriesRow
from monitor.store.records import RunRecord, SeriesKey
from monitor.store.statements import SERIES_COLUMNS, find_series_id, upsert_insert

ALL_PROMPTS = "*"
WRITE_ATTEMPTS = 4


def target_series(series: SeriesKey) -> SeriesKey:
    """The series row a target's burn incidents are recorded on: its prompt is `*`."""
    return SeriesKey(
        target=series.target, provider=series.provider, model=series.model, prompt=ALL_PROMPTS, location=series.location
    )


async def count_windows(
    connection: AsyncConnection, *, target: str, location: str, now: datetime, policy: BurnPolicy
) -> dict[float, WindowCount]:
    """`burn.window_counts` in SQL: per window w, the measured probes of the target at the location
    whose run started in (now - w, now], and how many of them were bad."""
    bad = or_(SampleRow.error.is_not(None), SampleRow.ttft_ms.is_(None), SampleRow.ttft_ms > float(policy.threshold_ms))
    windows = policy.windows()
    columns = []
    for w in windows:
        start = RunRow.started_at > _aware(now.timestamp() - w)
        columns.append(func.coalesce(func.sum(case((start, 1), else_=0)), 0))
        columns.append(func.coalesce(func.sum(case((and_(start, bad), 1), else_=0)), 0))
    query = (
        select(*columns)
        .select_from(SampleRow)
        .join(RunRow, SAMPLES_OF_RUN)
        .join(SeriesRow, SeriesRow.id == RunRow.series_id)
        .where(
            SeriesRow.target == target,
            SeriesRow.location == location,
            SeriesRow.prompt != ALL_PROMPTS,
            SampleRow.warmup.is_(False),
            SampleRow.disturbed.is_(False),  # the monitor's own delay is no evidence of the target's
            RunRow.started_at > _aware(now.timestamp() - windows[0]),
            RunRow.started_at <= now,
        )
    )
    row = (await connection.execute(query)).one()
    return {w: WindowCount(w, int(row[2 * i]), int(row[2 * i + 1])) for i, w in enumerate(windows)}


async def window_in_chunks(
    connection: AsyncConnection, *, target: str, location: str, now: datetime, policy: BurnPolicy
) -> bool:
    """Whether a cold chunk holds a run of the target at the location inside its longest window before `now`:
    the windows are counted in SQL over rows only, so such a window would be counted short. The cold tier
    leaves the longest window and a day as rows (`Config.cold_minimum`); a batch evaluated at its own time
    more than that day late (a spool drained after a long outage) reaches further."""
    found = await connection.scalar(
        select(COLD_CHUNKS.c.series_id)
        .join(SeriesRow, SeriesRow.id == COLD_CHUNKS.c.series_id)
        .where(
            SeriesRow.target == target,
            SeriesRow.location == location,
            COLD_CHUNKS.c.last_started_at > _aware(now.timestamp() - policy.windows()[0]),
            COLD_CHUNKS.c.first_started_at <= now,
        )
        .limit(1)
    )
    return found is not None


def _aware(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, UTC)


class BurnService:
    """Evaluates the burn rates of every target a stored batch touched."""

    def __init__(self, engine: AsyncEngine, config: Config, *, outbox: Any | None) -> None:
        self._engine = engine
        self._outbox = outbox
        self._log = structlog.get_logger()
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        self._config = config

    def policy(self, target: str) -> BurnPolicy | None:
        spec = self._config.targets.get(target)
        return policy_for(spec, self._config.detection.slo_burn) if spec is not None else None

    async def after_store(self, job: str, batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> None:
        """Evaluate each (target, location) of the batch once, at its latest run. Never raises."""
        latest: dict[tuple[str, str], RunRecord] = {}
        for run, _samples in batch:
            key = (run.series.target, run.series.location)
            if key not in latest or run.started_at > latest[key].started_at:
                latest[key] = run
        for (target, _location), run in sorted(latest.items()):
            policy = self.policy(target)
            if policy is None:
                continue
            try:
                await self.evaluate(job, run.series, run.started_at, policy)
            except Exception as exc:
                self._log.warning(
                    "slo_burn_failed",
                    job=job,
                    target=target,
                    location=run.series.location,
                    error=error_text(exc),
                )

    async def evaluate(self, job: str, series: SeriesKey, now: datetime, policy: BurnPolicy) -> Verdict | None:
        """Evaluate the target of `series` at `now`; another writer opening the same incident first
        (the unique open-incident index) makes it read again and evaluate afresh. None: not evaluated (its
        windows reach the cold tier: `window_in_chunks`)."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return await self._evaluate_once(job, series, now, policy)
            except IntegrityError:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def _evaluate_once(self, job: str, series: SeriesKey, now: datetime, policy: BurnPolicy) -> Verdict | None:
        key = target_series(series)
        # Counted before the write transaction, so SQLite's write lock is not held over a 3-day scan.
        async with self._engine.connect() as reading:
            if await window_in_chunks(reading, target=key.target, location=key.location, now=now, policy=policy):
                self._log.warning(
                    "slo_burn_skipped",
                    job=job,
                    target=key.target,
                    location=key.location,
                    at=now.isoformat(),
                    reason="the batch ran long enough ago that its burn windows reach days the cold tier keeps as "
                    "chunks, which burn rates do not count: not evaluated at its own time (the runs stored since "
                    "count its samples in their own windows)",
                )
                return None
            counts = await count_windows(reading, target=key.target, location=key.location, now=now, policy=policy)
        found = evaluate(counts, policy)
        logged: dict[str, Any] | None = None
        async with write_transaction(self._engine) as connection:
            series_id = await find_series_id(connection, key)
            row = None
            if series_id is not None:
                row = (
                    await connection.execute(
                        select(IncidentRow.id, IncidentRow.severity, IncidentRow.opened_at, IncidentRow.details).where(
                            IncidentRow.series_id == series_id,
                            IncidentRow.kind == KIND,
                            IncidentRow.resolved_at.is_(None),
                        )
                    )
                ).first()
            remembered = _remembered(row) if row is not None else None
            last_resolved_at = None
            if row is None and series_id is not None:
                last_resolved_at = await connection.scalar(
                    select(func.max(IncidentRow.resolved_at)).where(
                        IncidentRow.series_id == series_id, IncidentRow.kind == KIND
                    )
                )
            incident, action = advance(remembered, found, now, policy, last_resolved_at=last_resolved_at)
            if incident is None or (row is None and action != "open"):
                return found
            if action is None and incident == remembered:
                return found  # not held, but within keep_firing: nothing it remembers has changed
            if series_id is None:
                series_id = await _create_series(connection, key)
            if action == "resolve":
                result = found.headline_result()
                text = describe_resolved(key.target, result, policy, incident)
            else:
                result = reported(found, incident)
                text = describe(key.target, result, policy)
            values = self._values(job, incident, result, policy, text)
            if action == "resolve" and row is not None and isinstance(row.details, dict) and row.details.get("summary"):
                # The incident keeps what it measured while it fired; the resolve notice says it is over.
                values["details"]["summary"] = row.details["summary"]
            values["updated_at"] = datetime.now(UTC)
            if row is None:
                incident_id = uuid.uuid4()
                await connection.execute(
                    insert(IncidentRow).values(
                        id=incident_id,
                        series_id=series_id,
                        kind=KIND,
                        opened_at=incident.opened_at,
                        resolved_at=None,
                        opened_baseline_ms=policy.threshold_ms,
                        opened_observed_ms=None,
                        **values,
                    )
                )
            else:
                incident_id = row.id
                if action == "resolve":
                    values["resolved_at"] = now
                await connection.execute(update(IncidentRow).where(IncidentRow.id == incident_id).values(**values))
            if action is not None:
                logged = {
                    "job": job,
                    "target": key.target,
                    "location": key.location,
                    "kind": KIND,
                    "severity": incident.severity,
                    "burn_rate": None if values["ratio"] is None else round(values["ratio"], 2),
                    "summary": text,
                }
                if self._outbox is not None:
                    notification = self._notification(
                        job, key, incident, incident_id, action, now, policy, values, text
                    )
                    await self._outbox.notify(notification, connection=connection)
        if logged is not None:  # once committed
            self._log.warning("incident_" + str(action), **logged)
        return found

    def _values(
        self, job: str, incident: BurnIncident, result: RuleResult, policy: BurnPolicy, text: str
    ) -> dict[str, Any]:
        return {
            "severity": incident.severity,
            "baseline_ms": policy.threshold_ms,
            "observed_ms": None,
            "ratio": result.long_burn,
            "error": None,
            "details": {"since": incident.opened_at.isoformat(), "job": job, "summary": text}
            | details(result, policy)
            | {"burn": incident.to_json()},
            "peak_ratio": incident.peak_burn,
            "peak_at": incident.peak_at,
        }

    def _notification(
        self,
        job: str,
        key: SeriesKey,
        incident: BurnIncident,
        incident_id: uuid.UUID,
        action: str,
        now: datetime,
        policy: BurnPolicy,
        values: Mapping[str, Any],
        text: str,
    ) -> Notification:
        return Notification(
            incident_id=incident_id,
            state="resolved" if action == "resolve" else "firing",
            kind=KIND,
            severity=incident.severity,
            **series_fields(key, job=job, opened_at=incident.opened_at, base_url=self._config.alerts.base_url),
            since=incident.opened_at,
            resolved_at=now if action == "resolve" else None,
            baseline_ms=policy.threshold_ms,
            observed_ms=None,
            ratio=values["ratio"],
            peak_ratio=incident.peak_burn,
            peak_at=incident.peak_at,
            summary=text,
        )


def _remembered(row: Any) -> BurnIncident:
    """The open incident's memory from its `details`; when that is missing or unreadable (written by
    hand, or by an older version), what the row itself says, as if it last fired when it opened."""
    stored = row.details.get("burn") if isinstance(row.details, dict) else None
    if isinstance(stored, dict):
        try:
            return BurnIncident.from_json(stored)
        except (KeyError, TypeError, ValueError):
            pass
    severity: BurnSeverity = "ticket" if row.severity == "ticket" else "page"
    return BurnIncident(severity, row.opened_at, row.opened_at, None, None, None)


async def _create_series(connection: AsyncConnection, key: SeriesKey) -> int:
    row = {name: getattr(key, name) for name in SERIES_COLUMNS}
    await connection.execute(
        upsert_insert(connection, SERIES).on_conflict_do_nothing(index_elements=list(SERIES_COLUMNS)), [row]
    )
    series_id = await find_series_id(connection, key)
    if series_id is None:
        raise RuntimeError(f"the series row for {key.target} @ {key.location} could not be created")
    return series_id
