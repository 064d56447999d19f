"""The detector at the I/O edge: after each stored run, read the series' history and state, evaluate,
and write the new state, the incidents and their notifications in one transaction."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.model import Notification, series_fields
from monitor.config.models import Config
from monitor.config.series import job_series
from monitor.detect import identity
from monitor.detect.attribution import ServerSplit, classify, server_split, split_text
from monitor.detect.budget_service import BudgetService
from monitor.detect.burn_service import BurnService
from monitor.detect.cache_service import CacheService
from monitor.detect.detector import Detector, Event, RunPoint, SeriesState, point_from_run
from monitor.detect.figures import figures_of
from monitor.detect.group_notify import GroupNotifier
from monitor.detect.grouping import GROUPED_KINDS, scope
from monitor.detect.history import HistoryCache, SeriesHistory, Span, micros
from monitor.detect.state import HistoryColumns, is_evidence
from monitor.logging import error_text
from monitor.metrics.definitions import Metrics
from monitor.otel.incident import IncidentReading
from monitor.probe.result import Sample
from monitor.store.engine import is_broken_connection, write_transaction
from monitor.store.incidents import GroupStore, IncidentChange, IncidentStore, StoredState
from monitor.store.records import RunRecord, SeriesKey
from monitor.store.triage import TriageStore

if TYPE_CHECKING:
    from monitor.alert.outbox import Outbox
    from monitor.store.repository import Repository

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
                gap: timedelta = max(second - first, timedelta(seconds=1))
                return gap
    return timedelta(minutes=5)


STATE_WRITE_ATTEMPTS = 8
# A connection killed under the evaluation (pg_terminate_backend, a failover) is retried on a new one
# this many times, after these pauses; a database that stays away fails the evaluation as before.
BROKEN_CONNECTION_PAUSES_S = (0.05, 0.25, 1.0)


@dataclass
class _Attempt:
    """How far one evaluation got, so a broken connection can be told safe to retry or not."""

    read: StoredState | None = None
    state: dict[str, Any] | None = None
    committing: bool = False  # every statement ran: only COMMIT was left, whose outcome may be unknown
    outcome: tuple[SeriesState, list[Event], float | None] | None = None


def incident_change(event: Event, now: datetime, where: dict[str, str] | None = None) -> IncidentChange:
    """The incident row values an event writes."""
    values: dict[str, Any] = {
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
    if event.action == "info":
        resolved_at: datetime | None = event.opened_at
    elif event.action == "resolve":
        resolved_at = event.resolved_at or event.at
    else:
        resolved_at = None
    return IncidentChange(
        kind=event.kind, severity=event.severity, opened_at=event.opened_at, resolved_at=resolved_at, values=values
    )


# Events that also leave a change marker on the target's charts, once per target (`_mark_change`).
MARKED_KINDS = frozenset({"model_changed", "tokens_jump"})


def _marker_text(event: Event, model: str) -> str:
    if event.kind == "tokens_jump":
        return identity.describe_tokens(event.detail, model)
    return identity.describe(event.detail, model)


# SQLite: runs of a batch evaluated in one write transaction (`_SharedWrites`). Each transaction of its own cost
# a connection from the pool, BEGIN IMMEDIATE and COMMIT (a sync of the file) a series and tick; SQLite's lock is
# held this many runs at a time (about 1 ms each), while the writer and housekeeping wait on the busy timeout.
SHARED_WRITES_RUNS = 25


class _SharedWrites:
    """A write transaction opened on first use and committed (or rolled back) on demand, with the evaluations
    made in it: (run, samples, latency evidence), the groups each touched, its outcome."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._stack: contextlib.AsyncExitStack | None = None
        self._connection: AsyncConnection | None = None
        self.pending: list[tuple[tuple[RunRecord, Sequence[Sample], bool], set[uuid.UUID], Any]] = []

    async def connection(self) -> AsyncConnection:
        if self._connection is None:
            stack = contextlib.AsyncExitStack()
            self._connection = await stack.enter_async_context(write_transaction(self._engine))
            self._stack = stack
        return self._connection

    def _take(self) -> tuple[contextlib.AsyncExitStack | None, list[Any]]:
        stack, pending = self._stack, self.pending
        self._stack, self._connection, self.pending = None, None, []
        return stack, pending

    async def commit(self) -> list[Any]:
        """Commit; the evaluations it held. On failure they are kept for `abandon`."""
        stack, pending = self._stack, self.pending
        if stack is not None:
            await stack.aclose()  # leaving write_transaction commits
        self._take()
        return pending

    async def abandon(self) -> list[tuple[RunRecord, Sequence[Sample], bool]]:
        """Roll back (the transaction, if still open); the runs it held, to evaluate again."""
        stack, pending = self._take()
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.__aexit__(RuntimeError, RuntimeError("rolled back"), None)
        return [item for item, _touched, _outcome in pending]


class StateConflict(Exception):
    """Another writer (a replica, a concurrent evaluation) changed the series' detector state first."""


class DetectionService:
    def __init__(
        self,
        engine: AsyncEngine,
        repository: Repository,
        config: Config,
        *,
        outbox: Outbox | None,
        metrics: Metrics | None,
        clock: Callable[[], float] = time.monotonic,
        keep_histories: bool = True,
    ) -> None:
        """`keep_histories`: keep each series' history between evaluations (within
        `detection.history_memory_mb`); False where a process evaluates each series once (`once`)."""
        self._engine = engine
        self._clock = clock  # for the batch's budget
        self._repository = repository
        self._outbox = outbox
        self._metrics = metrics
        self._store = IncidentStore()
        self._groups = GroupStore()
        self._log = structlog.get_logger()
        self._burn = BurnService(engine, config, outbox=outbox)
        self._budget = BudgetService(repository, config, outbox=outbox, metrics=metrics)
        self._cache = CacheService(engine, repository, config, outbox=outbox, metrics=metrics)
        self._notifier = GroupNotifier(config, outbox=outbox)
        self._histories: HistoryCache[SeriesKey] = HistoryCache(0)
        self._keep_histories = keep_histories
        self._settings_generation = 0  # moves when the histories kept are dropped for new settings
        self._history_locks: defaultdict[SeriesKey, asyncio.Lock] = defaultdict(asyncio.Lock)
        # When each series was last evaluated (a count), and the jobs whose last batch its budget cut.
        self._turns: dict[SeriesKey, int] = {}
        self._turn = itertools.count()
        self._cut_jobs: set[str] = set()
        self.update_config(config)

    def update_config(self, config: Config) -> None:
        previous: Config | None = getattr(self, "_config", None)
        self._config = config
        # Whether a reload has happened: only then can a batch hold a run of a series no longer configured.
        self._reloaded = previous is not None
        # (job, target, prompt) of every series the config's jobs measure.
        self._measured = {
            (job, target, prompt)
            for job, series in job_series(config, [job.name for job in config.jobs]).items()
            for target, prompt in series
        }
        # What a reload removed leaves with it: a daemon reloaded for months as targets come and go kept a
        # lock and a turn for every series it ever evaluated. `adhoc` series come back when probed again.
        measured_pairs = {(target, prompt) for _job, target, prompt in self._measured}
        for series in [key for key in self._history_locks if (key.target, key.prompt) not in measured_pairs]:
            if not self._history_locks[series].locked():  # held: an evaluation under way still reads it
                del self._history_locks[series]
        self._turns = {key: turn for key, turn in self._turns.items() if (key.target, key.prompt) in measured_pairs}
        self._detectors: dict[str, Detector] = {}
        # The histories kept stay valid across a reload (they are the database's runs); a smaller budget
        # starts them over.
        budget = int(config.detection.history_memory_mb * 1024 * 1024) if self._keep_histories else 0
        # Other detection settings: the residuals kept were computed under the old ones.
        if budget < self._histories.nbytes() or (previous is not None and previous.detection != config.detection):
            self._histories.clear()
            # An evaluation under way under the old settings keeps nothing it read or computed.
            self._settings_generation += 1
        self._histories.budget_bytes = budget
        self._history_budget_warned = False
        self._burn.update_config(config)
        self._budget.update_config(config)
        self._cache.update_config(config)
        self._notifier.update_config(config)

    @property
    def budget(self) -> BudgetService:
        """The budgets at run time: what a crossed one holds each job to (`hold_for`, `holds`)."""
        return self._budget

    def _detector(self, target: str) -> Detector:
        detector = self._detectors.get(target)
        if detector is None:
            spec = self._config.targets.get(target)
            slo = spec.slo.ttft_p50_ms if spec is not None else None
            detector = self._detectors[target] = Detector(self._config.detection.rules(), slo_ms=slo)
        return detector

    def _run_log(self, job: str, run: RunRecord) -> Any:
        """The log, its lines naming the run's job, target and prompt."""
        return self._log.bind(job=job, target=run.series.target, prompt=run.series.prompt)

    async def after_store(
        self, job: str, batch: Sequence[tuple[RunRecord, Sequence[Sample]]], *, budget_s: float | None = None
    ) -> None:
        """Evaluate the batch's runs, then notify the groups they changed. Never raises: detection
        trouble must not stop probing. `budget_s`: how long evaluating may take; the runs left when it
        is spent (at least one is evaluated) are stored and not evaluated, counted and logged, and the
        groups the evaluated ones opened are notified all the same (before, a cut batch notified none)."""
        interval = job_interval(self._config, job) if job != "adhoc" else timedelta(minutes=5)
        deadline = None if budget_s is None else self._clock() + budget_s
        groups: set[uuid.UUID] = set()
        # First the prompt cache's pairs: a warm run that found no cache is the cache's incident, not
        # evidence of a TTFT regression of the warm path (one cause, one incident).
        cacheless = await self._cache.after_store(job, batch, interval=interval)
        # After a batch of the job was cut by its budget, the next goes least recently evaluated series
        # first (a series' runs keep their order), so an overloaded job evaluates every series in turn
        # instead of the same first ones every time and never the last.
        ordered: Sequence[tuple[RunRecord, Sequence[Sample]]] = batch
        if job in self._cut_jobs:
            turns = self._turns
            ordered = sorted(batch, key=lambda item: turns.get(item[0].series, -1))
        self._cut_jobs.discard(job)
        shared = _SharedWrites(self._engine) if self._engine.dialect.name == "sqlite" else None
        try:
            await self._evaluate_batch(job, ordered, interval, groups, shared, cacheless, deadline, budget_s)
        finally:
            if shared is not None:  # cancelled with runs evaluated and not committed: let SQLite's lock go
                await shared.abandon()
        # Per target rather than per series: after every run of the batch is stored and evaluated.
        await self._burn.after_store(job, batch)
        await self._budget.after_store(job)
        # A run that went on through a reload (it lets running ones finish) may be of a series the reload
        # removed: evaluating it set that series' gauges again, which the reload had forgotten.
        if (
            self._metrics is not None
            and self._reloaded
            and job != "adhoc"
            and any((job, run.series.target, run.series.prompt) not in self._measured for run, _samples in batch)
        ):
            self._metrics.forget_unconfigured(self._config)
        # The groups this batch changed are notified once it is all in: series of one provider probed
        # in one run open together, and go out as one notification.
        if not batch:
            return
        at = max(run.started_at for run, _samples in batch)
        try:
            async with self._engine.connect() as connection:
                groups.update(await self._groups.unnotified(connection))  # held ones may be due now
        except Exception as exc:
            self._log.warning("group_notify_failed", job=job, error=error_text(exc))
        for group_id in sorted(groups):
            try:
                await self._sync_group(job, group_id, at)
            except Exception as exc:
                self._log.warning("group_notify_failed", job=job, error=error_text(exc))

    async def _evaluate_batch(
        self,
        job: str,
        ordered: Sequence[tuple[RunRecord, Sequence[Sample]]],
        interval: timedelta,
        groups: set[uuid.UUID],
        shared: _SharedWrites | None,
        cacheless: Collection[SeriesKey],
        deadline: float | None,
        budget_s: float | None,
    ) -> None:
        """Evaluate `ordered` until the budget's `deadline`; on SQLite in `shared` write transactions."""
        evaluated = 0
        for index, (run, samples) in enumerate(ordered):
            if deadline is not None and evaluated and self._clock() > deadline:
                self._skipped(job, runs=len(ordered) - index, evaluated=evaluated, budget_s=budget_s)
                self._cut_jobs.add(job)
                break
            self._turns[run.series] = next(self._turn)
            latency = run.series not in cacheless
            if not latency:
                self._run_log(job, run).info(
                    "detection_skipped_cacheless",
                    run_id=str(run.run_id),
                    reason="the warm probes found no prompt cache: the cache's incident (cache_stopped), not "
                    "evidence of a TTFT regression (which model answered and availability are still judged)",
                )
            if not self._evidence(job, run, samples):
                continue
            evaluated += 1
            if shared is not None:
                await self._evaluate_shared(job, (run, samples, latency), interval, groups, shared)
                continue
            try:
                await self._evaluate(job, run, samples, interval, groups, latency=latency)
            except Exception as exc:
                self._run_log(job, run).warning("detection_failed", error=error_text(exc))
        if shared is not None:
            await self._commit_shared(job, interval, groups, shared)

    def _skipped(self, job: str, *, runs: int, evaluated: int, budget_s: float | None) -> None:
        self._log.warning(
            "detection_skipped",
            job=job,
            runs=runs,
            evaluated=evaluated,
            budget_s=budget_s,
            reason="the batch's detection budget was spent: these runs are stored and not evaluated; the "
            "groups the evaluated ones changed are notified, and each series' next run is evaluated",
        )
        if self._metrics is not None:
            self._metrics.detection_skipped_runs.labels(job).inc(runs)

    def _evidence(self, job: str, run: RunRecord, samples: Sequence[Sample]) -> bool:
        """Whether the run is evaluated; says so when disturbed samples were left out of it (the run's
        summary already leaves them out, `records.summarize_run`), or when nothing of it was left."""
        measured = [s for s in samples if not s.warmup]
        disturbed = [s for s in measured if s.disturbed]
        if not disturbed:
            return True
        evaluated = is_evidence(run)
        delays = [s.self_delay_ms for s in disturbed if s.self_delay_ms is not None]
        # A warning only when the run could not be evaluated at all; a sample or two left out is routine
        # on a busy machine and would drown the log (and the demo's screen).
        (self._log.warning if not evaluated else self._log.info)(
            "detection_skipped_disturbed",
            job=job,
            target=run.series.target,
            prompt=run.series.prompt,
            run_id=str(run.run_id),
            samples=len(measured),
            disturbed=len(disturbed),
            self_delay_max_ms=round(max(delays), 1) if delays else None,
            run_evaluated=evaluated,
            reason="the monitor itself was late around these samples' stamps; they are stored, not evidence",
        )
        return evaluated

    async def _evaluate(
        self,
        job: str,
        run: RunRecord,
        samples: Sequence[Sample],
        interval: timedelta,
        groups: set[uuid.UUID],
        *,
        latency: bool = True,
    ) -> None:
        """Evaluate one run; the state is written only if nobody else wrote it meanwhile (compare-and-set
        on `version`), else everything is read again and evaluated afresh."""
        pauses = list(BROKEN_CONNECTION_PAUSES_S)
        conflicts = 0
        while conflicts < STATE_WRITE_ATTEMPTS:
            attempt = _Attempt()
            try:
                touched: set[uuid.UUID] = set()
                outcome = await self._evaluate_once(job, run, samples, interval, touched, attempt, latency=latency)
            except StateConflict:
                conflicts += 1
                continue
            except IntegrityError:  # another writer created the series' first state row meanwhile
                conflicts += 1
                continue
            except Exception as exc:
                if not is_broken_connection(exc) or not pauses:
                    raise
                # Reads are safe to repeat, and so is a transaction that never got to COMMIT: it rolled
                # back with its connection. One whose COMMIT was cut may have landed: look first.
                if attempt.committing and await self._state_landed(run.series, attempt):
                    self._log.info("detection_commit_confirmed", job=job, target=run.series.target)
                    outcome = attempt.outcome
                else:
                    self._run_log(job, run).info(
                        "detection_retried", error=error_text(exc), committing=attempt.committing
                    )
                    await asyncio.sleep(pauses.pop(0))
                    continue
            groups.update(touched)
            self._evaluated(job, run, outcome)
            return
        raise StateConflict(f"the detector state changed under {STATE_WRITE_ATTEMPTS} attempts in a row")

    async def _evaluate_shared(
        self,
        job: str,
        item: tuple[RunRecord, Sequence[Sample], bool],
        interval: timedelta,
        groups: set[uuid.UUID],
        shared: _SharedWrites,
    ) -> None:
        """SQLite: evaluate the run in the batch's open write transaction (`_SharedWrites`), committed every
        `SHARED_WRITES_RUNS` runs. Nothing else can write while it holds SQLite's lock, so no compare-and-set
        can fail in it; any failure rolls the transaction back and its runs are evaluated again, each in a
        transaction of its own as on PostgreSQL, so it costs only its own run."""
        run, samples, latency = item
        touched: set[uuid.UUID] = set()
        try:
            connection = await shared.connection()
            outcome = await self._evaluate_once(
                job, run, samples, interval, touched, latency=latency, connection=connection
            )
        except Exception as exc:
            self._log.debug(
                "detection_shared_rolled_back", job=job, runs=len(shared.pending) + 1, error=error_text(exc)
            )
            await self._evaluate_apart(job, [*(await shared.abandon()), item], interval, groups)
            return
        shared.pending.append((item, touched, outcome))
        if len(shared.pending) >= SHARED_WRITES_RUNS:
            await self._commit_shared(job, interval, groups, shared)

    async def _commit_shared(
        self, job: str, interval: timedelta, groups: set[uuid.UUID], shared: _SharedWrites
    ) -> None:
        """Commit the runs evaluated in the shared transaction, then do what follows each evaluation (logs,
        metrics, the groups to notify); if the commit fails, evaluate them again one by one."""
        try:
            done = await shared.commit()
        except Exception as exc:
            self._log.debug("detection_shared_rolled_back", job=job, runs=len(shared.pending), error=error_text(exc))
            await self._evaluate_apart(job, await shared.abandon(), interval, groups)
            return
        for (run, _samples, _latency), touched, outcome in done:
            groups.update(touched)
            self._evaluated(job, run, outcome)

    async def _evaluate_apart(
        self,
        job: str,
        items: Sequence[tuple[RunRecord, Sequence[Sample], bool]],
        interval: timedelta,
        groups: set[uuid.UUID],
    ) -> None:
        for run, samples, latency in items:
            try:
                await self._evaluate(job, run, samples, interval, groups, latency=latency)
            except Exception as exc:
                self._run_log(job, run).warning("detection_failed", error=error_text(exc))

    def _evaluated(
        self, job: str, run: RunRecord, outcome: tuple[SeriesState, list[Event], float | None] | None
    ) -> None:
        """What follows an evaluation once its transaction committed: its events logged, the metrics."""
        if outcome is None:
            return
        new_state, events, baseline_ms = outcome
        for event in events:
            reading = IncidentReading(
                event.action,
                series=(run.series.target, run.series.prompt, run.series.location),
                kind=event.kind,
                severity=event.severity,
                baseline_ms=event.baseline_ms,
                observed_ms=event.observed_ms,
                ratio=event.ratio,
                error_class=event.error,
            )
            self._run_log(job, run).warning("incident_" + event.action, **reading.facts())
            if self._metrics is not None:
                self._metrics.observe_incident(reading)
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

    async def _state_landed(self, series: SeriesKey, attempt: _Attempt) -> bool:
        """Whether the cut COMMIT landed: the state row holds what the attempt wrote, one version on."""
        try:
            async with self._engine.connect() as connection:
                series_id = await self._store.series_id(connection, series)
                stored = await self._store.read_state(connection, series_id) if series_id is not None else None
        except Exception:
            return False  # unknown still: the retry's compare-and-set decides
        expected = attempt.read.version + 1 if attempt.read is not None else 1
        return stored is not None and stored.version == expected and stored.state == attempt.state

    async def _evaluate_once(
        self,
        job: str,
        run: RunRecord,
        samples: Sequence[Sample],
        interval: timedelta,
        groups: set[uuid.UUID],
        attempt: _Attempt | None = None,
        *,
        latency: bool = True,
        connection: AsyncConnection | None = None,
    ) -> tuple[SeriesState, list[Event], float | None] | None:
        """One evaluation in a write transaction of its own, or in the caller's (`connection`)."""
        attempt = attempt if attempt is not None else _Attempt()
        series = run.series
        detector = self._detector(series.target)
        since = detector.history_since(run.started_at, interval=interval)
        generation = self._settings_generation
        measured = [s for s in samples if not s.warmup and not s.disturbed]
        served = Counter(s.served_model for s in measured if s.served_model).most_common(1)
        fingerprint = Counter(s.fingerprint for s in measured if s.fingerprint).most_common(1)
        point = point_from_run(
            run,
            served_model=served[0][0] if served else None,
            fingerprint=fingerprint[0][0] if fingerprint else None,
        )
        if not latency:
            point = replace(point, latency_evidence=False)
        answered = [s for s in measured if s.ok and s.completion_tokens is not None]
        if answered:
            point = replace(
                point,
                output_tokens=statistics.median(float(s.completion_tokens or 0) for s in answered),
                reasoning_tokens=statistics.median(float(s.reasoning_tokens or 0) for s in answered),
            )
        transaction = contextlib.nullcontext(connection) if connection is not None else write_transaction(self._engine)
        async with transaction as connection:
            # The history is read in the transaction that writes the state: one connection and one BEGIN and
            # COMMIT a series, not two (on SQLite each is a trip to the connection's thread, and detection runs
            # once a series and tick).
            kept = await self._history(series, since, run.started_at, generation, connection)
            history: list[RunPoint] | HistoryColumns = kept.columns(since, run.started_at)
            if self._cache.is_warm(series.prompt):
                points = kept.points(since, run.started_at)
                history = await self._cache.without_cacheless(series, points, run.started_at)
            series_id = await self._store.series_id(connection, series)
            if series_id is None:
                return None
            read = attempt.read = await self._store.read_state(connection, series_id)
            state = SeriesState.from_json(read.state) if read is not None else SeriesState()
            new_state, events, baseline_ms = detector.evaluate_with_baseline(history, state, point)
            if isinstance(history, HistoryColumns) and generation == self._settings_generation:
                kept.keep_residuals(history)  # the next evaluation need not compute them again
            if new_state.canary_unstable and not state.canary_unstable:
                self._log.warning(
                    "canary_not_deterministic",
                    target=series.target,
                    prompt=series.prompt,
                    hint="the canary's answer differs from run to run, so it cannot tell a model change; it is "
                    "ignored until its answers agree again (a shorter prompt with one right answer, or a seed, helps)",
                )
            now = datetime.now(UTC)
            attempt.state = new_state.to_json()
            if not await self._store.write_state(
                connection, series_id, attempt.state, read=read, now=now, reads_from=since
            ):
                raise StateConflict("the detector state changed since it was read")  # rolls back
            split = await self._server_split(connection, run, since, events)
            for event in events:
                where = _where(event, split)
                # A target's series all see its model change: one marker and one notification stand for all.
                fresh = event.kind not in MARKED_KINDS or await self._mark_change(connection, series, event)
                incident_id = await self._record_incident(connection, series_id, event, now, where)
                group_id = await self._group(connection, series, series_id, event, incident_id)
                if group_id is not None:
                    groups.add(group_id)  # notified as a group once the batch is in (`_sync_group`)
                    continue
                if self._outbox is not None and fresh:
                    await self._outbox.notify(
                        self._notification(job, series, event, incident_id, where), connection=connection
                    )
            attempt.outcome = (new_state, events, baseline_ms)
            attempt.committing = True
        return new_state, events, baseline_ms

    async def _history(
        self, series: SeriesKey, since: datetime, end: datetime, generation: int, connection: AsyncConnection
    ) -> SeriesHistory:
        """The runs of `series` started in [since, end), as the detector reads them on `connection`. From the
        history kept (detect/history.py) when the database still holds exactly its runs over their span, reading
        only the runs stored after them; else read whole, and kept if the budget allows."""
        lock = self._history_locks[series]
        # One reader of a series' kept history at a time: two evaluations of it at once (a replayed spool's
        # runs beside a tick's) would both append the runs stored since its last.
        async with lock:
            try:
                return await self._history_locked(series, since, end, generation, connection)
            except BaseException:
                self._histories.forget(series)  # half extended, perhaps: read whole next time
                raise

    async def _history_locked(
        self, series: SeriesKey, since: datetime, end: datetime, generation: int, connection: AsyncConnection
    ) -> SeriesHistory:
        kept = self._histories.get(series) if generation == self._settings_generation else None
        last = kept.last if kept is not None else None
        if kept is not None and last is not None and kept.complete_from <= micros(since):
            # Both read on one connection; the new rows are used only if the span still holds.
            span, rows = await self._repository.history_since_span(series, since, last, end, connection=connection)
            if Span(span.rows, span.first, span.last) == kept.span(since, last) and kept.chunks_still_hold(
                since, oldest_run=span.oldest_chunk_run, newest_run=span.newest_chunk_run
            ):
                kept.extend(rows)
                kept.forget_before(since)
                self._histories.resized(series)
                return kept
            # A run stored late among the kept ones (a spool's replay, another replica's run), or some gone (to a
            # chunk, or retention), or a chunk holding runs after the last kept.
            self._log.debug("detection_history_reread", target=series.target, prompt=series.prompt)
            self._histories.forget(series)
        fresh = SeriesHistory(since)
        read = await self._repository.history_rows(series, since, end, connection=connection)
        fresh.extend(read.rows, read.from_chunks)
        if generation != self._settings_generation:
            return fresh  # the settings changed while it was read: used once, not kept
        if not self._histories.keep(series, fresh) and self._histories.budget_bytes and not self._history_budget_warned:
            self._history_budget_warned = True
            self._log.warning(
                "detection_history_budget_full",
                series_kept=len(self._histories),
                kept_mb=round(self._histories.nbytes() / 1e6, 1),
                budget_mb=self._config.detection.history_memory_mb,
                reason="the series beyond it read their whole history for every run (the same verdicts, more CPU); "
                "raise detection.history_memory_mb to keep them too",
            )
        return fresh

    async def _server_split(
        self, connection: AsyncConnection, run: RunRecord, since: datetime, events: Sequence[Event]
    ) -> ServerSplit | None:
        """The server's side of a regression the run opened or updated, against its history's medians; read
        only then (the history kept holds no server metrics)."""
        if run.server_ttft_ms is None and run.server_waiting is None:
            return None
        if not any(event.kind == "regression" and event.action != "resolve" for event in events):
            return None
        records = await self._repository.runs_between(run.series, since, run.started_at, connection=connection)
        return server_split(run, records)

    async def _mark_change(self, connection: AsyncConnection, series: SeriesKey, event: Event) -> bool:
        """A change marker on the target's charts where the new model's epoch begins, once per target;
        True when this series' event added it (and so is the one notified)."""
        since = event.detail.get("epoch_since")
        at = datetime.fromisoformat(since) if isinstance(since, str) else event.at
        text = _marker_text(event, series.model)
        # Each prompt's series jumps by its own figures; the target's first marker stands for them all.
        same = identity.tokens_jump_prefix(series.model) if event.kind == "tokens_jump" else None
        if not await TriageStore.mark_change(connection, text, target=series.target, at=at, same=same):
            return False
        self._log.info("model_change_marked", target=series.target, at=at.isoformat(), text=text)
        return True

    async def _record_incident(
        self,
        connection: AsyncConnection,
        series_id: int,
        event: Event,
        now: datetime,
        where: dict[str, str] | None = None,
    ) -> uuid.UUID:
        change = incident_change(event, now, where)
        open_id = await self._store.open_incident(connection, series_id, event.kind)
        if event.action == "info" or open_id is None:
            # A new incident; or an update or resolve for one this database never saw opened.
            return await self._store.insert_incident(connection, series_id, change)
        await self._store.update_incident(connection, open_id, change)
        return open_id

    async def _group(
        self, connection: AsyncConnection, series: SeriesKey, series_id: int, event: Event, incident_id: uuid.UUID
    ) -> uuid.UUID | None:
        """The group the incident belongs to (joined when it opens), or None: notified on its own."""
        if event.kind not in GROUPED_KINDS or event.action == "info":
            return None
        if event.action != "open":
            return await self._groups.group_of(connection, incident_id)
        settings = self._config.alerts.grouping
        name = series.location if settings.by == "location" else series.provider
        key = scope(event.kind, name, by=settings.by, series=None if settings.enabled else str(series_id))
        window = timedelta(minutes=settings.window_minutes)
        return await self._groups.join(
            connection,
            scope=key,
            kind=event.kind,
            provider=name,
            incident_id=incident_id,
            now=event.opened_at,
            cutoff=event.opened_at - window,
        )

    async def _sync_group(self, job: str, group_id: uuid.UUID, at: datetime) -> None:
        async with write_transaction(self._engine) as connection:
            await self._notifier.sync(connection, job, group_id, at)

    def _notification(
        self, job: str, series: SeriesKey, event: Event, incident_id: uuid.UUID, where: dict[str, str] | None = None
    ) -> Notification:
        state = NOTIFICATION_STATE[event.action]
        since = event.detail.get("since")
        if isinstance(since, str):
            since = datetime.fromisoformat(since)
        # The figures the incident row gets (incident_change), so the notification says what the row does.
        figures = figures_of(incident_change(event, event.at, where).values)
        return Notification(
            incident_id=incident_id,
            state=state,
            kind=event.kind,
            severity=event.severity,
            **series_fields(series, job=job, opened_at=event.opened_at, base_url=self._config.alerts.base_url),
            since=since if isinstance(since, datetime) else event.opened_at,
            resolved_at=(event.resolved_at or event.at) if state == "resolved" else None,
            baseline_ms=figures.baseline_ms,
            observed_ms=figures.observed_ms,
            ratio=figures.ratio,
            error_class=event.error,
            peak_ratio=figures.peak_ratio,
            peak_at=figures.peak_at,
            opened_baseline_ms=figures.opened_baseline_ms,
            opened_observed_ms=figures.opened_observed_ms,
            summary=_marker_text(event, series.model) if event.kind in MARKED_KINDS else _evidence_text(event),
            cause=where["cause"] if where else None,
            attribution=where["attribution"] if where else "",
        )

    def _observe(self, series: SeriesKey, state: SeriesState, events: list[Event]) -> None:
        if self._metrics is None:
            return
        labels = (series.target, series.prompt, series.location)
        level = 0
        for incident in getattr(state, "incidents", {}).values():
            if getattr(incident, "kind", None) == "regression":
                level = max(level, SEVERITY_LEVEL.get(incident.severity, 0))
        self._metrics.observe_regression_state(labels, level)


def _evidence_text(event: Event) -> str:
    """Why a regression opened or escalated, for its notice: "+38% over 14 runs (noise: ...)"."""
    evidence = event.detail.get("evidence") if event.kind == "regression" and event.action != "resolve" else None
    return evidence if isinstance(evidence, str) else ""
