"""Prompt-cache health at the I/O edge: after each stored batch, for every `cache: both` pair it holds,
read the pair's recent runs, judge them (monitor/detect/cache_health.py), set the pair's metrics, and
open or resolve its `cache_stopped` incident with its notification in one transaction.

The incident is recorded on the warm series (`NAME.warm`): it is the warm path that broke. What it
was opened against (the reference speed-up and cached share) is kept in the incident's `details`, so
it resolves against the cache that worked, not against the runs of the outage.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.model import Notification, series_fields
from monitor.config.models import Config
from monitor.config.series import WARM_TWIN_SUFFIX, cache_pairs
from monitor.detect.cache_health import (
    DEFAULT_RULES,
    KIND,
    CacheRules,
    PairRun,
    Reference,
    Verdict,
    advance,
    current_reference,
    describe,
    describe_resolved,
    leave_out_cacheless,
    run_is_cacheless,
)
from monitor.detect.state import RunPoint
from monitor.logging import error_text
from monitor.metrics.definitions import Metrics
from monitor.probe.result import Sample
from monitor.store.engine import write_transaction
from monitor.store.models import IncidentRow, SeriesRow
from monitor.store.records import RunRecord, SeriesKey
from monitor.store.statements import find_series_id

if TYPE_CHECKING:
    from monitor.store.repository import Repository

WRITE_ATTEMPTS = 4


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def pair_run(cold: RunRecord | None, warm: tuple[RunRecord, Sequence[Sample]]) -> PairRun:
    """One run of the pair from the stored runs: the TTFT medians, and the warm probes' token counts
    (medians over the measured, undisturbed samples that report them)."""
    run, samples = warm
    measured = [s for s in samples if not s.warmup and not s.disturbed and s.ok]
    cached = [float(s.cached_tokens) for s in measured if s.cached_tokens is not None]
    prompt = [float(s.prompt_tokens) for s in measured if s.prompt_tokens is not None]
    return PairRun(
        at=run.intended_at,
        cold_ms=cold.ttft_p50_ms if cold is not None else None,
        warm_ms=run.ttft_p50_ms,
        warm_cached_tokens=_median(cached),
        warm_prompt_tokens=_median(prompt) or run.prompt_tokens_p50,
    )


class CacheService:
    """Judges every `cache: both` pair a stored batch touched."""

    def __init__(
        self,
        engine: AsyncEngine,
        repository: Repository,
        config: Config,
        *,
        outbox: Any | None,
        metrics: Metrics | None,
        rules: CacheRules = DEFAULT_RULES,
    ) -> None:
        self._engine = engine
        self._repository = repository
        self._outbox = outbox
        self._metrics = metrics
        self._rules = rules
        self._log = structlog.get_logger()
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        self._config = config
        self._pairs = cache_pairs(config.prompts)  # warm twin -> busted prompt
        # After a start or a reload: close what a pair left open once it is no longer configured.
        self._retire_pending = True

    def is_warm(self, prompt: str) -> bool:
        """Whether `prompt` is the warm half of a configured `cache: both` pair."""
        return prompt in self._pairs

    async def without_cacheless(self, warm: SeriesKey, history: list[RunPoint], until: datetime) -> list[RunPoint]:
        """`history` (oldest first) without the runs its `cache_stopped` incidents say measured the uncached
        path: the window that opened each (its `window_runs` runs before the opening one) to its resolution
        (or `until`). The warm series' baseline leaves them out."""
        if not history:
            return history
        async with self._engine.connect() as reading:
            series_id = await find_series_id(reading, warm)
            if series_id is None:
                return history
            rows = (
                await reading.execute(
                    select(IncidentRow.opened_at, IncidentRow.resolved_at).where(
                        IncidentRow.series_id == series_id,
                        IncidentRow.kind == KIND,
                        IncidentRow.opened_at <= until,
                        (IncidentRow.resolved_at.is_(None)) | (IncidentRow.resolved_at >= history[0].at),
                    )
                )
            ).all()
        spans = [(row.opened_at, row.resolved_at or until) for row in rows]
        return leave_out_cacheless(history, spans, window_runs=self._rules.window_runs)

    async def retire_unpaired(self) -> int:
        """Resolve this location's open `cache_stopped` incidents whose warm series is no longer half of a
        configured `cache: both` pair (reloaded to `bust` or removed): no run will judge them again, so
        they would stay open for ever. Returns how many were closed. Raises on a database error."""
        location = self._config.location
        async with self._engine.connect() as reading:
            rows = (
                await reading.execute(
                    select(
                        IncidentRow.id,
                        IncidentRow.opened_at,
                        IncidentRow.details,
                        SeriesRow.target,
                        SeriesRow.provider,
                        SeriesRow.model,
                        SeriesRow.prompt,
                    )
                    .join(SeriesRow, SeriesRow.id == IncidentRow.series_id)
                    .where(
                        IncidentRow.kind == KIND,
                        IncidentRow.resolved_at.is_(None),
                        SeriesRow.location == location,
                    )
                )
            ).all()
        stale = [row for row in rows if row.prompt not in self._pairs]
        for row in stale:
            cold_prompt = row.prompt.removesuffix(WARM_TWIN_SUFFIX)
            text = (
                f"prompt cache of {row.target} ({cold_prompt}): closed without a verdict, the prompt is no longer "
                "probed warm and cold (`cache: both` was reloaded away)"
            )
            now = datetime.now(UTC)
            details = {**(row.details if isinstance(row.details, dict) else {}), "resolved_summary": text}
            async with write_transaction(self._engine) as connection:
                changed = await connection.execute(
                    update(IncidentRow)
                    .where(IncidentRow.id == row.id, IncidentRow.resolved_at.is_(None))
                    .values(resolved_at=now, updated_at=now, details=details)
                )
                if changed.rowcount and self._outbox is not None:  # the firing notice went out: so does its end
                    warm = SeriesKey(row.target, row.provider, row.model, row.prompt, location)
                    job = str(details.get("job") or "")
                    notice = self._notification(
                        row.id, warm, job, row.opened_at, resolved_at=now, ratio=None, text=text
                    )
                    await self._outbox.notify(notice, connection=connection)
            if self._metrics is not None:
                self._metrics.forget_cache((row.target, cold_prompt, location))
            self._log.warning(
                "incident_resolve", target=row.target, prompt=row.prompt, location=location, kind=KIND, summary=text
            )
        return len(stale)

    async def after_store(
        self, job: str, batch: Sequence[tuple[RunRecord, Sequence[Sample]]], *, interval: timedelta
    ) -> set[SeriesKey]:
        """Judge each pair of the batch at its warm run. Returns the warm series whose latest run looks
        uncached against the working cache's reference: no evidence of a TTFT regression of the warm
        path, which is the cache's incident. Never raises."""
        cacheless: set[SeriesKey] = set()
        if self._retire_pending:
            try:
                await self.retire_unpaired()
                self._retire_pending = False
            except Exception as exc:  # tried again after the next batch
                self._log.warning("cache_retire_failed", job=job, error=error_text(exc))
        if not self._pairs:
            return cacheless
        for run, _samples in batch:
            cold_prompt = self._pairs.get(run.series.prompt)
            if cold_prompt is None:
                continue
            try:
                if await self.evaluate(job, run, replace(run.series, prompt=cold_prompt), interval):
                    cacheless.add(run.series)
            except Exception as exc:
                self._log.warning(
                    "cache_check_failed",
                    job=job,
                    target=run.series.target,
                    prompt=cold_prompt,
                    location=run.series.location,
                    error=error_text(exc),
                )
        return cacheless

    async def pair_runs(
        self, warm: SeriesKey, cold: SeriesKey, *, until: datetime, interval: timedelta
    ) -> list[PairRun]:
        """The pair's runs up to `until`, oldest first: enough for the reference and the window."""
        rules = self._rules
        start = until - interval * (rules.baseline_runs + rules.window_runs + 2) * 2
        end = until + timedelta(microseconds=1)
        warm_runs = await self._repository.load_runs(warm, start, end)
        cold_runs = {run.intended_at: run for run in await self._repository.runs_between(cold, start, end)}
        return [pair_run(cold_runs.get(run.intended_at), (run, samples)) for run, samples in warm_runs]

    async def evaluate(self, job: str, warm_run: RunRecord, cold: SeriesKey, interval: timedelta) -> bool:
        """Judge the pair at `warm_run`; whether that run looks uncached. Another writer opening the
        same incident first (the unique open-incident index) makes it read again."""
        runs = await self.pair_runs(warm_run.series, cold, until=warm_run.started_at, interval=interval)
        if not runs:
            return False
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return await self._evaluate_once(job, warm_run.series, cold, runs)
            except IntegrityError:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def _evaluate_once(self, job: str, warm: SeriesKey, cold: SeriesKey, runs: list[PairRun]) -> bool:
        rules = self._rules
        # Read on a plain connection: most runs change nothing, and SQLite's write lock is not taken for them.
        async with self._engine.connect() as reading:
            series_id = await find_series_id(reading, warm)
            if series_id is None:
                return False
            row = (
                await reading.execute(
                    select(IncidentRow.id, IncidentRow.opened_at, IncidentRow.details).where(
                        IncidentRow.series_id == series_id,
                        IncidentRow.kind == KIND,
                        IncidentRow.resolved_at.is_(None),
                    )
                )
            ).first()
        frozen = _frozen(row.details) if row is not None else None
        if row is not None and frozen is None:
            frozen = Reference(None, None, None, 0)  # unreadable: judged healthy at once, so it resolves
        action, verdict = advance(runs, frozen, rules)
        latest = runs[-1]
        cacheless = run_is_cacheless(latest, current_reference(runs, frozen, rules), rules)
        stopped = (row is not None and action != "resolve") or action == "open"
        if self._metrics is not None:
            self._metrics.observe_cache(
                (cold.target, cold.prompt, cold.location),
                speedup=latest.speedup,
                cached_share=latest.cached_share,
                stopped=stopped,
            )
        if action is None or verdict is None:
            return cacheless or stopped
        logged: dict[str, Any] | None = None
        async with write_transaction(self._engine) as connection:
            now = datetime.now(UTC)
            at = latest.at
            if action == "open":
                text = describe(cold.target, cold.prompt, verdict)
                incident_id = uuid.uuid4()
                opened_at = at
                await connection.execute(
                    insert(IncidentRow).values(
                        id=incident_id,
                        series_id=series_id,
                        kind=KIND,
                        severity="ticket",
                        opened_at=at,
                        resolved_at=None,
                        updated_at=now,
                        **_values(verdict, text, job, at),
                    )
                )
            else:
                assert row is not None
                text = describe_resolved(cold.target, cold.prompt, verdict)
                incident_id, opened_at = row.id, row.opened_at
                values = _values(verdict, text, job, opened_at, reference=frozen)
                if isinstance(row.details, dict):  # the incident keeps what it measured when it opened
                    values["details"] = {**values["details"], **row.details}
                values["details"].update(
                    resolved_summary=text, resolved_speedup=verdict.speedup, resolved_cached_share=verdict.cached_share
                )
                changed = await connection.execute(
                    update(IncidentRow)
                    .where(IncidentRow.id == incident_id, IncidentRow.resolved_at.is_(None))
                    .values(resolved_at=at, updated_at=now, **values)
                )
                if changed.rowcount == 0:  # another writer resolved it meanwhile: its notice went out
                    return cacheless
            logged = {
                "job": job,
                "target": cold.target,
                "prompt": warm.prompt,
                "location": cold.location,
                "kind": KIND,
                "severity": "ticket",
                "summary": text,
            }
            if self._outbox is not None:
                notification = self._notification(
                    incident_id,
                    warm,
                    job,
                    opened_at,
                    resolved_at=at if action == "resolve" else None,
                    ratio=verdict.speedup,
                    text=text,
                )
                await self._outbox.notify(notification, connection=connection)
        if logged is not None:  # once committed
            self._log.warning("incident_" + action, **logged)
        return action == "open" or cacheless

    def _notification(
        self,
        incident_id: uuid.UUID,
        warm: SeriesKey,
        job: str,
        opened_at: datetime,
        *,
        resolved_at: datetime | None,
        ratio: float | None,
        text: str,
    ) -> Notification:
        """The incident's notice: firing until `resolved_at`; `ratio` the window's speed-up over cold."""
        return Notification(
            incident_id=incident_id,
            state="firing" if resolved_at is None else "resolved",
            kind=KIND,
            severity="ticket",
            **series_fields(warm, job=job, opened_at=opened_at, base_url=self._config.alerts.base_url),
            since=opened_at,
            resolved_at=resolved_at,
            baseline_ms=None,
            observed_ms=None,
            ratio=ratio,
            summary=text,
        )


def _values(
    verdict: Verdict, text: str, job: str, since: datetime, *, reference: Reference | None = None
) -> dict[str, Any]:
    reference = reference or verdict.reference
    return {
        "baseline_ms": None,
        "observed_ms": None,
        # The speed-up over cold: what a user reads first, the window's against the reference's.
        "ratio": verdict.speedup,
        "error": None,
        "details": {
            "since": since.isoformat(),
            "job": job,
            "summary": text,
            "reason": verdict.reason,
            "speedup": verdict.speedup,
            "cached_share": verdict.cached_share,
            "z": verdict.z,
            "window_runs": verdict.window_runs,
            "reference": reference.to_json(),
        },
    }


def _frozen(details: Any) -> Reference | None:
    stored = details.get("reference") if isinstance(details, dict) else None
    return Reference.from_json(stored) if isinstance(stored, dict) else None
