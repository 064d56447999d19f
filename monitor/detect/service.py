"""The detector at the I/O edge: after each stored run, read the series' history and state, evaluate,
and write the new state, the incidents and their notifications in one transaction."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import structlog
from sqlalchemy import and_, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.attribution import ServerSplit, classify, server_split, split_text
from monitor.alert.model import Notification, series_link
from monitor.config.models import Config
from monitor.detect.burn_service import BurnService
from monitor.detect.detector import Detector, Event, SeriesState, point_from_run
from monitor.metrics.definitions import Metrics
from monitor.probe.result import Sample
from monitor.store.engine import write_transaction
from monitor.store.models import DetectorStateRow, IncidentRow, SeriesRow
from monitor.store.records import RunRecord, SeriesKey

SEVERITY_LEVEL = {"ticket": 1, "page": 2}
NOTIFICATION_STATE: dict[str, Literal["firing", "resolved", "info"]] = {
    "open": "firing",
    "update": "firing",
    "resolve": "resolved",
    "info": "info",
}


def _where(event: Event, split: ServerSplit | None) -> dict[str, str] | None:
    """For a TTFT regression of a run with server metrics: the cause and the sentence saying it."""
    if event.kind != "regression" or event.action == "resolve" or split is None:
        return None
    cause = classify(event.observed_ms, event.baseline_ms, split)
    text = split_text(event.observed_ms, event.baseline_ms, split)
    return {"cause": cause, "attribution": text} if cause is not None and text is not None else None


def job_interval(config: Config, job: str) -> timedelta:
    """How often the job runs (from its schedule), so the detector knows how far back to read."""
    for candidate in config.jobs:
        if candidate.name == job:
            trigger = candidate.trigger()
            now = datetime.now(UTC)
            first = trigger.get_next_fire_time(None, now)
            second = trigger.get_next_fire_time(first, first + timedelta(microseconds=1)) if first else None
            if first and second:
                return max(second - first, timedelta(seconds=1))
    return timedelta(minutes=5)


STATE_WRITE_ATTEMPTS = 8


class StateConflict(Exception):
    """Another writer (a replica, a concurrent evaluation) changed the series' detector state first."""


class DetectionService:
    def __init__(
        self, engine: AsyncEngine, repository: Any, config: Config, *, outbox: Any | None, metrics: Metrics | None
    ) -> None:
        self._engine = engine
        self._repository = repository
        self._outbox = outbox
        self._metrics = metrics
        self._log = structlog.get_logger()
        self._burn = BurnService(engine, config, outbox=outbox)
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        self._config = config
        self._detectors: dict[str, Detector] = {}
        self._burn.update_config(config)

    def _detector(self, target: str) -> Detector:
        detector = self._detectors.get(target)
        if detector is None:
            spec = self._config.targets.get(target)
            slo = spec.slo.ttft_p50_ms if spec is not None else None
            detector = self._detectors[target] = Detector(self._config.detection, slo_ms=slo)
        return detector

    async def after_store(self, job: str, batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> None:
        """Evaluate every run of the batch. Never raises: detection trouble must not stop probing."""
        interval = job_interval(self._config, job) if job != "adhoc" else timedelta(minutes=5)
        for run, samples in batch:
            try:
                await self._evaluate(job, run, samples, interval)
            except Exception as exc:
                self._log.warning(
                    "detection_failed",
                    job=job,
                    target=run.series.target,
                    prompt=run.series.prompt,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
        # Per target rather than per series: after every run of the batch is stored and evaluated.
        await self._burn.after_store(job, batch)

    async def _evaluate(self, job: str, run: RunRecord, samples: Sequence[Sample], interval: timedelta) -> None:
        """Evaluate one run; the state is written only if nobody else wrote it meanwhile (compare-and-set
        on `version`), else everything is read again and evaluated afresh."""
        for _attempt in range(STATE_WRITE_ATTEMPTS):
            try:
                outcome = await self._evaluate_once(job, run, samples, interval)
            except StateConflict:
                continue
            except IntegrityError:  # another writer created the series' first state row meanwhile
                continue
            if outcome is not None:
                new_state, events, baseline_ms = outcome
                for event in events:
                    self._log.warning(
                        "incident_" + event.action,
                        job=job,
                        target=run.series.target,
                        prompt=run.series.prompt,
                        kind=event.kind,
                        severity=event.severity,
                        baseline_ms=event.baseline_ms,
                        observed_ms=event.observed_ms,
                        ratio=event.ratio,
                        error_class=event.error,
                    )
                self._observe(run.series, new_state, events)
                if self._metrics is not None:
                    rule = self._config.detection.ticket
                    self._metrics.observe_baseline(
                        (run.series.target, run.series.prompt, run.series.location),
                        baseline_ms=baseline_ms,
                        run_median_ms=run.ttft_p50_ms,
                        ticket_ratio=rule.ratio,
                        ticket_min_delta_ms=rule.min_delta_ms,
                    )
            return
        raise StateConflict(f"the detector state changed under {STATE_WRITE_ATTEMPTS} attempts in a row")

    async def _evaluate_once(
        self, job: str, run: RunRecord, samples: Sequence[Sample], interval: timedelta
    ) -> tuple[SeriesState, list[Event], float | None] | None:
        series = run.series
        detector = self._detector(series.target)
        since = detector.history_since(run.started_at, interval=interval)
        records = await self._repository.runs_between(series, since, run.started_at)
        history = [point_from_run(r) for r in records if r.run_id != run.run_id and r.started_at < run.started_at]
        served = Counter(s.served_model for s in samples if s.served_model and not s.warmup).most_common(1)
        point = point_from_run(run, served_model=served[0][0] if served else None)
        async with write_transaction(self._engine) as connection:
            series_id = await self._series_id(connection, series)
            if series_id is None:
                return None
            row = (
                await connection.execute(
                    select(DetectorStateRow.state, DetectorStateRow.version).where(
                        DetectorStateRow.series_id == series_id
                    )
                )
            ).first()
            state = SeriesState.from_json(row.state) if row is not None else SeriesState()
            new_state, events, baseline_ms = detector.evaluate_with_baseline(history, state, point)
            now = datetime.now(UTC)
            if row is None:
                await connection.execute(
                    insert(DetectorStateRow).values(
                        series_id=series_id, state=new_state.to_json(), version=1, updated_at=now
                    )
                )
            else:
                written = await connection.execute(
                    update(DetectorStateRow)
                    .where(DetectorStateRow.series_id == series_id, DetectorStateRow.version == row.version)
                    .values(state=new_state.to_json(), version=row.version + 1, updated_at=now)
                )
                if written.rowcount != 1:
                    raise StateConflict("the detector state changed since it was read")  # rolls back
            split = server_split(run, records)
            for event in events:
                where = _where(event, split)
                incident_id = await self._record_incident(connection, series_id, event, now, where)
                if self._outbox is not None:
                    await self._outbox.notify(
                        self._notification(job, series, event, incident_id, where), connection=connection
                    )
        return new_state, events, baseline_ms

    async def _series_id(self, connection: AsyncConnection, series: SeriesKey) -> int | None:
        return (
            await connection.execute(
                select(SeriesRow.id).where(
                    and_(
                        SeriesRow.target == series.target,
                        SeriesRow.provider == series.provider,
                        SeriesRow.model == series.model,
                        SeriesRow.prompt == series.prompt,
                        SeriesRow.location == series.location,
                    )
                )
            )
        ).scalar()

    async def _record_incident(
        self,
        connection: AsyncConnection,
        series_id: int,
        event: Event,
        now: datetime,
        where: dict[str, str] | None = None,
    ) -> uuid.UUID:
        open_row = (
            await connection.execute(
                select(IncidentRow.id).where(
                    IncidentRow.series_id == series_id,
                    IncidentRow.kind == event.kind,
                    IncidentRow.resolved_at.is_(None),
                )
            )
        ).scalar()
        values = {
            "severity": event.severity,
            "baseline_ms": event.baseline_ms,
            "observed_ms": event.observed_ms,
            "ratio": event.ratio,
            "error": event.error,
            "updated_at": now,
            "details": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in event.detail.items()}
            | (where or {}),
            "peak_ratio": event.peak_ratio,
            "peak_at": event.peak_at,
        }
        if event.action == "open":
            values["opened_baseline_ms"] = event.baseline_ms
            values["opened_observed_ms"] = event.observed_ms
        elif event.action == "resolve" and "opened_baseline_ms" in event.detail:
            values["opened_baseline_ms"] = event.detail["opened_baseline_ms"]
            values["opened_observed_ms"] = event.detail.get("opened_observed_ms")
        if event.action == "info" or (open_row is None and event.action == "open"):
            incident_id = uuid.uuid4()
            await connection.execute(
                insert(IncidentRow).values(
                    id=incident_id,
                    series_id=series_id,
                    kind=event.kind,
                    opened_at=event.opened_at,
                    resolved_at=event.opened_at if event.action == "info" else None,
                    **values,
                )
            )
            return incident_id
        if open_row is None:  # an update or resolve for an incident this database never saw opened
            incident_id = uuid.uuid4()
            await connection.execute(
                insert(IncidentRow).values(
                    id=incident_id,
                    series_id=series_id,
                    kind=event.kind,
                    opened_at=event.opened_at,
                    resolved_at=event.resolved_at,
                    **values,
                )
            )
            return incident_id
        if event.action == "resolve":
            values["resolved_at"] = event.resolved_at or event.at
        await connection.execute(update(IncidentRow).where(IncidentRow.id == open_row).values(**values))
        return open_row

    def _notification(
        self, job: str, series: SeriesKey, event: Event, incident_id: uuid.UUID, where: dict[str, str] | None = None
    ) -> Notification:
        state = NOTIFICATION_STATE[event.action]
        since = event.detail.get("since")
        if isinstance(since, str):
            since = datetime.fromisoformat(since)
        return Notification(
            incident_id=incident_id,
            state=state,
            kind=event.kind,
            severity=event.severity,
            job=job,
            target=series.target,
            model=series.model,
            provider=series.provider,
            prompt=series.prompt,
            location=series.location,
            since=since if isinstance(since, datetime) else event.opened_at,
            resolved_at=(event.resolved_at or event.at) if state == "resolved" else None,
            baseline_ms=event.baseline_ms,
            observed_ms=event.observed_ms,
            ratio=event.ratio,
            error_class=event.error,
            peak_ratio=event.peak_ratio,
            peak_at=event.peak_at,
            cause=where["cause"] if where else None,
            attribution=where["attribution"] if where else "",
            link=series_link(
                self._config.alerts.base_url,
                target=series.target,
                prompt=series.prompt,
                location=series.location,
                job=job,
                at=event.opened_at,
            ),
        )

    def _observe(self, series: SeriesKey, state: SeriesState, events: list[Event]) -> None:
        if self._metrics is None:
            return
        labels = (series.target, series.prompt, series.location)
        level = 0
        for incident in getattr(state, "incidents", {}).values():
            if getattr(incident, "kind", None) == "regression":
                level = max(level, SEVERITY_LEVEL.get(incident.severity, 0))
        self._metrics.regression_state.labels(*labels).set(level)
