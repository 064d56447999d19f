"""`ttft-monitor run` and `ttft-monitor once`: one lifecycle around the one job pipeline.

`run` is the `Daemon` scheduling its jobs until a signal; `once` is the same `Daemon` in burst mode (arq's
`Worker(burst=True)`): the same `start` and `stop`, with the jobs run once, now, in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from monitor.app import (
    CALIBRATION_LOAD_TIMEOUT_S,
    InfrastructureError,
    Store,
    TelemetryError,
    alert_metrics_for,
    attach_detection,
    attach_detection_service,
    build_context,
    close_telemetry,
    collect_rarely,
    freeze_heap,
    job_context,
    open_process_resources,
    open_store,
    open_telemetry,
    return_large_blocks,
    secrets_of,
    share_thread_heaps,
    start_background_store,
    telemetry_endpoints,
)
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config, Job
from monitor.exitcodes import EXIT_FAILED, EXIT_INFRA, EXIT_INTERRUPTED, EXIT_OK, EXIT_PUSH, EXIT_USAGE
from monitor.logging import Redactor, error_text
from monitor.metrics.definitions import Metrics, MonitorRegistry, job_interval_seconds
from monitor.probe.result import Sample
from monitor.schedule.background import ONCE_AFTERCARE_TIMEOUT_S
from monitor.schedule.pipeline import JobOutcome, execute, plan_for_job
from monitor.service_loop import ServiceLoop, favour_waiting_threads
from monitor.tasks import finish_tasks

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine
    from structlog.typing import FilteringBoundLogger

    from monitor.alert.metrics import AlertMetrics
    from monitor.detect.budget_service import Hold
    from monitor.detect.service import DetectionService
    from monitor.otel.export import OtelTelemetry
    from monitor.schedule.background import BackgroundStore
    from monitor.served import Served
    from monitor.systemd_notify import Notifier

LOOP_LAG_INTERVAL_S = 0.5
# After the grace, the rest of shutdown (receivers, housekeeping, closing connections) gets this much
# more, whatever the database does: the unit and manifests allow the grace plus 10 s.
STOP_EXTRA_S = 3.0
# How long the heap's freezing after a job's first tick waits for that tick's detection (`Daemon._after_first_tick`).
WARM_SETTLE_S = 60.0
DISPOSE_TIMEOUT_S = 2.0

# `once` makes the coming days' partitions after storing (PostgreSQL); a database slower than this is left
# to the next run.
PARTITIONS_TIMEOUT_S = 10.0


async def dispose_engine(engine: AsyncEngine) -> None:
    """Close the pool's connections; a hung server must not hold up the exit."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(engine.dispose(), timeout=DISPOSE_TIMEOUT_S)


def shutdown_grace(config: Config) -> float:
    return config.shutdown_grace_s


def _notifier() -> Notifier | None:
    try:
        from monitor.systemd_notify import Notifier

        return Notifier.from_environ(os.environ)
    except ImportError:  # pragma: no cover - packaging without the systemd module
        return None


def _watchdog_interval() -> float | None:
    try:
        from monitor.systemd_notify import watchdog_interval

        return watchdog_interval(os.environ)
    except ImportError:  # pragma: no cover
        return None


def raise_descriptor_limit() -> None:
    """Raise the soft limit on open descriptors to the hard one: the listener holds up to its cap of
    connections, and the probes, the database and the spool need theirs beside them (the shipped
    unit sets LimitNOFILE too; this covers a shell or a container that did not)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX, or not allowed
        pass


class StartupFailed(Exception):
    """The daemon cannot start; `event` and `fields` go to the log, the message to stderr."""

    def __init__(self, code: int, event: str, message: str, **fields: object) -> None:
        super().__init__(message)
        self.code = code
        self.event = event
        self.fields = fields


async def _loop_lag_monitor(
    metrics: Metrics,
    notifier: Notifier | None,
    watchdog_s: float | None,
    stop: asyncio.Event,
    on_beat: Callable[[float], None] = lambda _now: None,
) -> None:
    """Measures how late the loop wakes a timer; pets the systemd watchdog only while it keeps turning,
    and tells `on_beat` (readiness, on the service loop) that it turned."""
    loop = asyncio.get_running_loop()
    last_pet = 0.0
    while not stop.is_set():
        expected = loop.time() + LOOP_LAG_INTERVAL_S
        await asyncio.sleep(LOOP_LAG_INTERVAL_S)
        lag = max(0.0, loop.time() - expected)
        metrics.loop_lag.observe(lag)
        now = time.monotonic()
        on_beat(now)
        if notifier is not None and watchdog_s is not None and now - last_pet >= watchdog_s:
            notifier.watchdog()
            last_pet = now


@dataclass(frozen=True, slots=True)
class Stopped:
    """What `Daemon.stop` left: the background store's closing counts, and where the runs went."""

    closed: dict[str, int]
    stored_runs: int
    spooled: int
    lost_runs: int
    lost_at_exit: int


class Daemon:
    """`ttft-monitor run`: `start` opens everything and schedules the jobs, `reload` re-reads the
    config (SIGHUP), `stop` shuts down within the grace. Signals are the caller's (`run_daemon`).

    What lives as long as the process (the store, HTTP sessions, calibration, detection, the
    background store, the metrics server) is opened once in `start` and closed in `stop`; a reload
    only rebuilds what the config decides (`app.job_context`).

    In burst mode (`ttft-monitor once`, `burst=True`) `start` opens the store, detection and the background
    store but schedules nothing and serves nothing (metrics are pushed); `run_burst` runs the jobs once and
    stores what they measured; `stop` is the same: in-flight probes get the grace, then are stored or spooled.
    """

    def __init__(
        self,
        config_path: str,
        *,
        redactor: Redactor | None = None,
        notifier: Notifier | None = None,
        burst: bool = False,
        job_names: Sequence[str] = (),
    ) -> None:
        self.config_path = config_path
        self.burst = burst
        self.job_names = list(job_names)
        self.command = "ttft-monitor once" if burst else "ttft-monitor run"
        # Burst mode: the jobs' runs (stop gives them the grace), what they measured, and how far it got.
        self.in_flight: set[asyncio.Task[JobOutcome]] = set()
        self.samples: list[Sample] = []
        self.phase = "connecting"
        self._redactor = redactor
        self._notifier = notifier
        self._stack = AsyncExitStack()
        self._stopping = asyncio.Event()  # ends the daemon's own loops (dispatcher, housekeeping, lag)
        self._tasks: list[asyncio.Task[Any]] = []
        # Claim bookkeeping after a run, off the job's task (so it never delays the next tick).
        self._bookkeeping: set[asyncio.Task[None]] = set()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._started = False
        self._background_started: BackgroundStore | None = None  # to close if start fails after it
        self.service = ServiceLoop()
        self.served: Served | None = None
        self.probe_loop_beat = time.monotonic()
        self.telemetry: OtelTelemetry | None = None
        # Burst mode with the saved calibration read without SQLAlchemy: the store opens after probing, in one
        # task (`_store_opening`: a signal meanwhile must not leave it half open); `_store_failed`: it could not.
        self._store_retry_s: float | None = None
        self._store_after_probing = False
        self._opening: asyncio.Task[None] | None = None
        self._store_failed: StartupFailed | None = None
        self._spooled_without_store = 0
        self._burst_holds: dict[str, Hold] = {}  # the budget holds read before probing, without the store
        self.paused_by_budget: list[Hold] = []  # `once`: the jobs a crossed budget held back from this run
        self.reloads = 0  # reloads taken: a run that spans one records series the reload had forgotten
        # `run`: the jobs whose first tick has been probed, and the heap's freezing after it (`_after_first_tick`).
        self._warm_jobs: set[str] = set()
        self._warming: asyncio.Task[None] | None = None
        self._freeze_again = False

    async def start(self) -> None:
        """Load the config, open the store and every resource, serve /metrics, schedule the jobs.

        Raises StartupFailed (with the exit code) after closing whatever it had opened.
        """
        try:
            await self._start()
        except BaseException:
            if self._background_started is not None:
                await self._background_started.close(1.0)
            await self._stack.aclose()
            raise
        self._started = True

    async def _start(self) -> None:
        log = structlog.get_logger()
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            raise StartupFailed(EXIT_USAGE, "config_invalid", str(exc), errors=[str(e) for e in exc.errors]) from None
        if self.burst:
            self.jobs = self._selected_jobs(config)
        else:
            share_thread_heaps()  # before the database's and the service loop's threads start
            from monitor.config.check import unprotected_listen

            # Before the database: a config that would serve the pages to anyone is refused as a config error.
            problem = unprotected_listen(config)
            if problem:
                raise StartupFailed(EXIT_USAGE, "web_config_invalid", f"ttft-monitor run: {problem}", error=problem)
        if self._redactor is not None:
            self._redactor.secrets = tuple(secrets_of(config))
        self.config = config
        registry = MonitorRegistry()
        try:
            telemetry = self.telemetry = open_telemetry(config, registry)
        except TelemetryError as exc:
            raise StartupFailed(EXIT_USAGE, "otel_config_invalid", f"{self.command}: {exc}", error=str(exc)) from None
        self._stack.push_async_callback(close_telemetry, telemetry)  # first in, so closed last: after the runs
        metrics = self.metrics = Metrics(
            registry,
            location=config.location,
            ttft_buckets=config.metrics.ttft_buckets_s,
            telemetry=telemetry,
            per_series=config.metrics.per_series,
        )
        stack = self._stack
        # A CronJob's run is short: it waits less for a database that is not there yet.
        retry_s = min(config.database.connect_retry_s, 10) if self.burst else None
        if self.burst and await self._start_burst_before_store(config, metrics, retry_s):
            return
        try:
            store = self.store = await open_store(config, metrics=metrics, retry_s=retry_s)
        except InfrastructureError as exc:  # unreachable, or a schema behind: the message names the fix
            raise StartupFailed(EXIT_INFRA, "startup_failed", f"{self.command}: {exc}", reason=str(exc)) from None
        stack.callback(store.spool.close)  # last: the writer may spool until the very end
        stack.push_async_callback(dispose_engine, store.engine)
        if self.burst:
            await self._start_burst(config, store, metrics)
            return
        metrics.database_up.set(1)
        self.resources = await open_process_resources(
            stack, store=store, tracing=telemetry.tracing if telemetry is not None else None
        )
        context = job_context(config, self.resources, store=store, metrics=metrics)
        from monitor.alert.outbox import Outbox

        alert_metrics = alert_metrics_for(context, metrics)
        # Detection enqueues here, on the probes' loop; delivery runs on the service loop and is woken from here.
        self.outbox = Outbox(store.engine, config.alerts, metrics=alert_metrics, on_enqueue=self._wake_dispatcher)
        self.detection = attach_detection_service(context, store, outbox=self.outbox, metrics=metrics)
        await self.detection.budget.restore()  # a crossed budget's stored holds, before the first tick
        self.background = self._background_started = start_background_store(context, store)
        self.context = context
        from monitor.schedule.claims import TickClaims  # `run`'s alone: `once` starts without it

        self.claims = TickClaims(store.engine)
        freeze_heap()
        collect_rarely()
        return_large_blocks()
        from monitor.schedule.scheduler import JobScheduler
        from monitor.store.engine import display_url

        self.scheduler = JobScheduler(self._run_tick, metrics=metrics)
        await self._serve(config, alert_metrics)
        raise_descriptor_limit()
        stopping = self._stopping
        self._lag = asyncio.create_task(
            _loop_lag_monitor(metrics, self._notifier, _watchdog_interval(), stopping, on_beat=self._beat)
        )
        self._tasks = [asyncio.create_task(store.writer.run_drainer(stopping, 5.0)), self._lag]

        self.scheduler.set_jobs(list(config.jobs))
        self.scheduler.start()
        if self._notifier is not None:
            self._notifier.ready()
            self._notifier.status(f"{len(config.jobs)} jobs scheduled")
        log.info(
            "daemon_started",
            jobs=[j.name for j in config.jobs],
            metrics=f"http://{config.metrics.listen}/metrics",
            ui=f"http://{config.metrics.listen}/" if config.web.enabled else None,
            database=display_url(config.database.url),
            location=config.location,
            next_runs={k: v.isoformat() if v else None for k, v in self.scheduler.next_run_times().items()},
        )

    def _selected_jobs(self, config: Config) -> list[Job]:
        unknown = [n for n in self.job_names if n not in {j.name for j in config.jobs}]
        if unknown:
            known = ", ".join(j.name for j in config.jobs) or "none"
            raise StartupFailed(
                EXIT_USAGE,
                "unknown_job",
                f"ttft-monitor once: --job: unknown job {', '.join(unknown)} (known: {known})",
                jobs=unknown,
                known=known,
            )
        return [j for j in config.jobs if not self.job_names or j.name in self.job_names]

    async def _start_burst(self, config: Config, store: Store, metrics: Metrics) -> None:
        """Burst mode's resources: no scheduler, claims, listener or service loop; alerts delivered in-process."""
        telemetry = self.telemetry
        context = await build_context(
            config, self._stack, store=store, metrics=metrics, tracing=telemetry.tracing if telemetry else None
        )
        self.dispatcher, self.detection = await attach_detection(context, store, self._stack, metrics=metrics)
        self.background = self._background_started = start_background_store(
            context, store, aftercare_timeout_s=ONCE_AFTERCARE_TIMEOUT_S
        )
        self.context = context
        # Earlier outages may have left samples in the spool: they are replayed meanwhile, and new
        # runs queue behind them in the spool, so the order holds.
        self._earlier = asyncio.create_task(store.writer.drain())
        self._tasks = [self._earlier]
        freeze_heap(collect=False)  # a burst is short: its start-up garbage may stay

    async def _start_burst_before_store(self, config: Config, metrics: Metrics, retry_s: float | None) -> bool:
        """Burst mode without the store: all a burst needs of the database before its first request is the
        saved calibration, read here without SQLAlchemy (monitor.store.saved_calibration), so the store's
        imports (about a third of a second) are neither on the path to the first request nor, opened after
        probing, in any probe's way. False: it cannot be read so; the store is opened first, as before."""
        from monitor.detect.budget_service import Hold, in_force
        from monitor.schedule.background import BackgroundStore
        from monitor.store.saved_calibration import read_before_probing

        read = await read_before_probing(
            config.database.url, location=config.location, timeout_s=CALIBRATION_LOAD_TIMEOUT_S
        )
        if read is None:
            return False
        fits, now = read.fits, datetime.now(UTC)
        # A crossed budget's holds apply to this run too (detection, which keeps them, opens after probing).
        self._burst_holds = {hold.job: hold for hold in map(Hold.of, read.holds) if in_force(config, hold, now)}
        telemetry = self.telemetry
        context = await build_context(
            config,
            self._stack,
            store=None,
            metrics=metrics,
            tracing=telemetry.tracing if telemetry else None,
            saved_fits=fits,
        )
        # Finished runs wait in its queue until the store is open and it starts.
        context.background = self.background = BackgroundStore(
            None, saved_fits=context.saved_fits, aftercare_timeout_s=ONCE_AFTERCARE_TIMEOUT_S
        )
        self.context = context
        self._store_retry_s, self._store_after_probing = retry_s, True
        self._tasks = []
        freeze_heap(collect=False)  # a burst is short: its start-up garbage may stay
        return True

    def _store_opening(self) -> asyncio.Task[None]:
        if self._opening is None:
            self._opening = asyncio.create_task(self._open_store_after_probing())
        return self._opening

    async def _open_store_after_probing(self) -> None:
        """Open the store, detection and the background store's writer once probing is over; when the
        database cannot be opened, spool what was measured (the next run replays it) and raise the error
        `start` would have raised, exit code included."""
        config, metrics, context, background = self.config, self.metrics, self.context, self.background
        try:
            store = self.store = await open_store(config, metrics=metrics, retry_s=self._store_retry_s)
        except InfrastructureError as exc:
            from monitor.store.engine import StoreError
            from monitor.store.spool import Spool

            try:
                spool = Spool.in_state_dir(config.database.state_dir, max_mb=config.database.spool_max_mb)
            except StoreError as spool_error:
                structlog.get_logger().warning("results_lost", error=str(spool_error))
            else:
                before = spool.depth
                background.spool_held(spool)
                self._spooled_without_store = spool.depth
                spool.close()
                structlog.get_logger().warning("results_spooled_without_database", runs=spool.depth - before)
            failed = self._store_failed = StartupFailed(
                EXIT_INFRA, "startup_failed", f"{self.command}: {exc}", reason=str(exc)
            )
            raise failed from None
        self._stack.callback(store.spool.close)  # last: the writer may spool until the very end
        self._stack.push_async_callback(dispose_engine, store.engine)
        context.writer, context.repository = store.writer, store.repository
        self.dispatcher, self.detection = await attach_detection(context, store, self._stack, metrics=metrics)
        # Earlier outages may have left samples in the spool: replayed first, and this run's queue behind them.
        self._earlier = asyncio.create_task(store.writer.drain())
        self._tasks = [self._earlier]
        background.attach(
            store.writer, after_store=context.after_store, save_calibration=store.repository.save_calibrations
        )
        background.start()
        self._background_started = background

    async def run_burst(self) -> list[JobOutcome]:
        """Burst mode: run the selected jobs once, now, and store what they measured (detection included).

        Cancelling it leaves the jobs' runs going: `stop` gives them the grace."""
        context = self.context
        intended = datetime.now(UTC)
        self.phase = "probing"
        runs = []
        for job in self.jobs:
            plan = plan_for_job(context, job)
            hold = self._burst_hold(job.name, intended)
            log = structlog.get_logger().bind(job=job.name)
            if hold is not None and hold.action == "pause":  # never silently: logged and counted, as `run` does
                log.warning("tick_paused_by_budget", scheduled=intended.isoformat(), budget=hold.budget,
                            until=hold.until.isoformat())  # fmt: skip
                self.metrics.job_runs.labels(job.name, "skipped_budget").inc()
                self.paused_by_budget.append(hold)
                continue
            if hold is not None and hold.action == "reduce":
                log.info("run_reduced_by_budget", budget=hold.budget, rounds=1, warmup=0, until=hold.until.isoformat())
                plan = replace(plan, rounds=1, warmup=0)
            runs.append(
                asyncio.create_task(
                    execute(
                        context,
                        job=job.name,
                        plan=plan,
                        connection=job.connection,
                        intended_at=intended,
                        on_sample=self.samples.append,
                    )
                )
            )
        self.in_flight.update(runs)
        for task in runs:
            task.add_done_callback(self.in_flight.discard)
        if runs:
            await asyncio.wait(runs)  # not gather: cancelling this must not cancel them
        outcomes = [task.result() for task in runs]
        self.phase = "storing"
        if self._store_after_probing:
            await asyncio.shield(self._store_opening())
        await self.background.flush(3600)
        await self._earlier
        await self.store.writer.drain()
        await self.background.settle(ONCE_AFTERCARE_TIMEOUT_S)
        await self._partitions_ahead()
        self.phase = "done"
        return outcomes

    async def _partitions_ahead(self) -> None:
        """Burst mode: make the coming days' partitions of runs and samples (PostgreSQL) as the daemon's
        housekeeping does, so that a CronJob's runs keep landing in their own day, not in the default
        partition. Never fails the run: the database's trouble is logged and the next run tries again."""
        log = structlog.get_logger()
        try:
            created = await asyncio.wait_for(
                self.store.repository.ensure_partitions(datetime.now(UTC)), timeout=PARTITIONS_TIMEOUT_S
            )
        except Exception as exc:
            log.warning("partitions_not_made", error=error_text(exc))
        else:
            if created:
                log.info("partitions_created", partitions=created)

    async def deliver_due(self) -> None:
        """Burst mode: send the notifications due now; undelivered ones stay in the outbox for the next run."""
        log = structlog.get_logger()
        try:
            await self.dispatcher.renotify_due()
            await asyncio.wait_for(self.dispatcher.dispatch_due(), timeout=60)
        except Exception as exc:
            log.warning("alerts_not_dispatched", error=error_text(exc))

    def _beat(self, now: float) -> None:
        self.probe_loop_beat = now
        self.scheduler.check_clock()

    def _wake_dispatcher(self) -> None:
        served = self.served
        if served is not None:
            self.service.call_soon(served.dispatcher.wake)

    async def _serve(self, config: Config, alert_metrics: AlertMetrics | None) -> None:
        """Start the service loop and open on it what the daemon serves (monitor.served)."""
        from monitor.served import ProbeSide, open_served
        from monitor.web.serve import WebConfigError

        favour_waiting_threads()
        self.service.start()
        self._stack.callback(self.service.close)
        scheduler = self.scheduler
        writer = self.store.writer
        side = ProbeSide(
            scheduler_running=lambda: scheduler.running,
            last_beat=lambda: self.probe_loop_beat,
            last_write=lambda: writer.last_write,
            budget_holds=lambda: self.detection.budget.holds() if getattr(self, "detection", None) else [],
        )
        try:
            self.served = await self.service.run(
                open_served(config, metrics=self.metrics, alert_metrics=alert_metrics, probe_side=side)
            )
        except WebConfigError as exc:
            raise StartupFailed(EXIT_USAGE, "web_config_invalid", f"ttft-monitor run: {exc}", error=str(exc)) from None
        except OSError as exc:
            raise StartupFailed(
                EXIT_INFRA,
                "metrics_listen_failed",
                f"ttft-monitor run: cannot listen on {config.metrics.listen} for /metrics: {exc.strerror}; "
                "change metrics.listen or stop what uses that port",
                listen=config.metrics.listen,
                error=exc.strerror,
            ) from None
        served = self.served

        async def close_served() -> None:
            await self.service.run(served.close(STOP_EXTRA_S), timeout=STOP_EXTRA_S + 6)

        self._stack.push_async_callback(close_served)

    async def reload(self) -> None:
        """Re-read the config file and reschedule; a broken file keeps the running config."""
        log = structlog.get_logger()
        asked = datetime.now(UTC)  # a job re-timed by this file ticks from here, not from after the reload
        current = self.config
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            log.error("reload_rejected", errors=[str(e) for e in exc.errors], keeping=[j.name for j in current.jobs])
            return
        if config.database.url != current.database.url or config.metrics.listen != current.metrics.listen:
            log.warning("reload_partial", reason="database.url and metrics.listen change only on restart")
        if config.otel != current.otel:
            log.warning("reload_partial", reason="otel changes only on restart")
        if config.location != current.location:
            # The metrics, telemetry and claims were made for the running location: runs stored under a new
            # one beside them would split every series in two, the old half's gauges kept at their last values.
            log.warning("reload_partial", reason="location changes only on restart", keeping=current.location)
            config = config.model_copy(update={"location": current.location})
        if self.telemetry is not None:
            self.telemetry.configure(telemetry_endpoints(config))
        if self._redactor is not None:
            self._redactor.secrets = tuple(secrets_of(config))
        self.context = job_context(
            config,
            self.resources,
            store=self.store,
            metrics=self.metrics,
            after_store=self.context.after_store,
            background=self.background,
        )
        self.detection.update_config(config)
        self.outbox.update_config(config.alerts)
        if self.served is not None:
            self.service.call_soon(self.served.update_alerts, config.alerts)
            self.service.call_soon(self.served.update_housekeeping, config.database, config.cold_policy())
        self.config = config
        self.scheduler.set_jobs(list(config.jobs), since=asked)
        forgotten = self.metrics.forget_unconfigured(config)
        self.reloads += 1
        log.info("config_reloaded", jobs=[j.name for j in config.jobs], metric_series_removed=forgotten)

    async def stop(self) -> Stopped | None:
        """Stop scheduling, let in-flight probes finish within the grace, write or spool what they
        measured; everything else gets STOP_EXTRA_S more, whatever the database does. None if not started."""
        if not self._started:
            return None
        self._started = False
        log = structlog.get_logger()
        loop = asyncio.get_running_loop()
        if self._warming is not None:
            self._warming.cancel()
        # Runs in flight finish the requests they have out and start no more rounds (once each series has
        # measured one, so the tick is stored for every series): the stop waits for about one request per
        # series, not for the rest of every run (which the grace would then cut off).
        self.context.draining.set()
        if self.burst:
            pending: set[asyncio.Task[JobOutcome]] | set[asyncio.Task[None]] = set(self.in_flight)
        else:
            self._lag.cancel()  # stopping: the loop's lag is no longer worth watching, nor the watchdog petted
            self.scheduler.pause()
            pending = set(self.scheduler.tasks)
        grace = shutdown_grace(self.config)
        deadline = loop.time() + grace
        log.info("daemon_stopping", in_flight_jobs=len(pending), grace_s=grace)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=2)
                log.warning("jobs_cancelled_at_shutdown", jobs=len(still))
        if not self.burst:
            self.scheduler.shutdown()
        if self.burst and self._store_after_probing:
            # Stopped before the store opened: it opens now, to store what was measured (or spools it).
            with contextlib.suppress(StartupFailed):
                await self._store_opening()
            if self._store_failed is not None:
                log.error(self._store_failed.event, **self._store_failed.fields)
                return await self._stop_without_store(log)
        closed = await self.background.close(max(1.0, deadline - loop.time()))
        self._stopping.set()
        if self.burst:
            self._earlier.cancel()  # replaying an earlier outage's spool: the next run goes on with it
        await finish_tasks([*self._tasks, *self._bookkeeping], STOP_EXTRA_S)
        if not self.burst:
            await self.claims.close()
        writer = self.store.writer
        lost_at_exit = await writer.close_held()
        stopped = Stopped(
            closed=closed,
            stored_runs=writer.stored_runs,
            spooled=self.store.spool.depth,
            lost_runs=writer.lost_runs,
            lost_at_exit=lost_at_exit,
        )
        log.info("daemon_stopped", spooled=stopped.spooled, **closed)
        await self._stack.aclose()
        return stopped

    async def _stop_without_store(self, log: FilteringBoundLogger) -> Stopped:
        """`stop` when the store never opened: what was measured is in the spool (or logged as lost)."""
        self._stopping.set()
        await self._stack.aclose()
        stopped = Stopped(
            closed={"spooled_at_close": 0, "aftercare_skipped": 0},
            stored_runs=0,
            spooled=self._spooled_without_store,
            lost_runs=0,
            lost_at_exit=0,
        )
        log.info("daemon_stopped", spooled=stopped.spooled, **stopped.closed)
        return stopped

    def _burst_hold(self, job: str, now: datetime) -> Hold | None:
        """The budget hold on `job` for `once`: detection's when it opened before probing, else the one read
        with the calibration (monitor.store.saved_calibration)."""
        detection: DetectionService | None = getattr(self, "detection", None)  # set once the store is open
        if detection is not None:
            return detection.budget.hold_for(job, now)
        return self._burst_holds.get(job)

    def _paused_by_budget(self, job: Job, intended: datetime, log: FilteringBoundLogger) -> bool:
        """Whether a crossed budget with `action: pause` holds the job: its tick is then skipped, counted and
        logged, never silently (monitor/detect/budget_service.py)."""
        hold = self.detection.budget.hold_for(job.name) if self.detection is not None else None
        if hold is None or hold.action != "pause":
            return False
        log.info(
            "tick_paused_by_budget", scheduled=intended.isoformat(), budget=hold.budget, until=hold.until.isoformat()
        )
        self.metrics.job_runs.labels(job.name, "skipped_budget").inc()
        return True

    def _forget_after_reload(self, reloads: int) -> None:
        """A run went on through a reload (it lets running instances finish): what it recorded after the
        reload forgot its job, target or prompt (samples, last run, result) is forgotten again, or it would
        stay for good, and the job's last run would page `TTFTMonitorJobStale` three intervals later."""
        if self.reloads != reloads:
            self.metrics.forget_unconfigured(self.config)

    async def _run_tick(self, job: Job, intended: datetime) -> None:
        log = structlog.get_logger().bind(job=job.name)
        if self._paused_by_budget(job, intended, log):
            return
        if job.shards > 1:
            await self._run_shared_tick(job, intended, log)
            self._after_first_tick(job.name)
            return
        location = self.config.location
        claims = self.claims
        was_resting = claims.resting
        claimed = await claims.try_claim(job=job.name, scheduled_at=intended, location=location, owner=self.owner)
        if claimed is None and not was_resting:
            # The database is down or hung: probe anyway (results go to the spool); the store keeps
            # one run per tick, so a replica probing the same tick is reconciled there.
            log.warning("tick_claim_failed", scheduled=intended.isoformat(), action="probing unclaimed")
        if claimed is False:
            log.info("tick_claimed_elsewhere", scheduled=intended.isoformat())
            self.metrics.job_runs.labels(job.name, "skipped_claimed").inc()
            return
        await self._probe(job, intended, log, claim_keys=[job.name])
        self._after_first_tick(job.name)

    def _after_first_tick(self, job: str) -> None:
        """Once a job's first tick is probed, stored and evaluated, freeze the heap again (`app.freeze_heap`).

        That tick made what lives as long as the daemon: each series' metric children, detection's
        histories and states, the statement caches. Left in the collector's oldest generation, every
        full collection walked them again: 21-37 ms of the probes' loop about every 30 s at 500 series
        (docs/benchmarks.md). Frozen, they are not walked. Once per job name, after its aftercare, so
        that what the tick had in flight is done with."""
        if job in self._warm_jobs:
            return
        self._warm_jobs.add(job)
        self._freeze_again = True  # a freezing under way may have settled before this tick's batch came
        if self._warming is None or self._warming.done():
            self._warming = asyncio.create_task(self._freeze_when_settled(), name="freeze-heap")

    async def _freeze_when_settled(self) -> None:
        # Without a collection first: it would walk everything made since start-up (20-25 ms of the probes'
        # loop, the next tick's probes in flight), and finds nothing to free there (docs/benchmarks.md). What is
        # garbage at this moment, a few dozen objects, stays for the life of the process.
        while self._freeze_again:
            self._freeze_again = False
            # What came before (the first tick's batch) written and detected; not both stages idle (`settle`),
            # which a job that ticks faster than each tick settles never reaches.
            if not await self.background.caught_up(WARM_SETTLE_S) or not self._started:
                return
            freeze_heap(collect=False)

    async def _run_shared_tick(self, job: Job, intended: datetime, log: FilteringBoundLogger) -> None:
        """A job split into shards (`jobs[].shards`): probe this replica's share of its series, then
        the shards nobody claimed once the others had their turn, then those whose replica stopped
        renewing its claim (it died mid-tick), until half an interval after the tick (schedule/claims.py)."""
        from monitor.schedule.claims import TAKE_OVER_DELAY_S, lease_s
        from monitor.schedule.shards import shard_key

        location, claims, shards = self.config.location, self.claims, job.shards
        was_resting = claims.resting
        share = await claims.try_claim_share(
            job=job.name, shards=shards, scheduled_at=intended, location=location, owner=self.owner
        )
        if share is None:
            if not was_resting:
                log.warning("tick_claim_failed", scheduled=intended.isoformat(), action="probing every shard unclaimed")
            await self._probe(job, intended, log, claim_keys=[])
            return
        mine, replicas = share
        log.info("shards_claimed", scheduled=intended.isoformat(), shards=mine, of=shards, replicas=len(replicas))
        interval = job_interval_seconds(self.config, job.name) or TAKE_OVER_DELAY_S * 4
        lease = lease_s(interval)
        # The last moment a take-over may start: later, its probes would be recorded far from their tick.
        until = intended + timedelta(seconds=interval / 2)
        keys = [shard_key(job.name, shard, shards) for shard in range(shards)]
        took: list[int] = []

        async def take_over(group: asyncio.TaskGroup) -> None:
            await asyncio.sleep(min(job.jitter_s + TAKE_OVER_DELAY_S, interval / 2))
            won = await claims.try_take_over(
                job=job.name,
                shards=shards,
                scheduled_at=intended,
                location=location,
                owner=self.owner,
                replicas=replicas,
            )
            if won:
                took.extend(won)
                log.info("shards_taken_over", scheduled=intended.isoformat(), shards=won, of=shards, reason="unclaimed")
                group.create_task(self._probe_shards(job, intended, log, won, lease=lease))
            seen: dict[str, tuple[str, datetime]] = {}
            while datetime.now(UTC) < until:
                running = await claims.try_running(keys=keys, scheduled_at=intended, location=location)
                if running is None:
                    return
                others = {key: was for key, was in running.items() if was[0] != self.owner}
                if not others:
                    return  # every shard of the tick finished, or is this replica's
                for key, was in others.items():
                    if seen.get(key) != was:
                        continue
                    if await claims.try_take_over_stale(
                        key=key, scheduled_at=intended, location=location, owner=self.owner, was=was
                    ):
                        shard = keys.index(key)
                        took.append(shard)
                        log.info(
                            "shards_taken_over",
                            scheduled=intended.isoformat(),
                            shards=[shard],
                            of=shards,
                            reason="not renewed",
                            was=was[0],
                        )
                        group.create_task(self._probe_shards(job, intended, log, [shard], lease=lease))
                seen = others
                await asyncio.sleep(lease)

        async with asyncio.TaskGroup() as group:
            if mine:
                group.create_task(self._probe_shards(job, intended, log, mine, lease=lease))
            group.create_task(take_over(group))
        if not mine and not took:
            log.info("tick_claimed_elsewhere", scheduled=intended.isoformat(), shards=shards)
            self.metrics.job_runs.labels(job.name, "skipped_claimed").inc()

    async def _probe_shards(
        self, job: Job, intended: datetime, log: FilteringBoundLogger, shards: list[int], *, lease: float
    ) -> None:
        """Probe these shards' series, renewing their claims until they are finished."""
        from monitor.schedule.shards import shard_key, shard_series

        claims, location = self.claims, self.config.location
        series = frozenset().union(*(shard_series(job.targets, job.prompts, s, job.shards) for s in shards))
        keys = [shard_key(job.name, s, job.shards) for s in shards]

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                await claims.try_renew(keys=keys, scheduled_at=intended, location=location, owner=self.owner)

        renewing = asyncio.create_task(renew())
        try:
            with structlog.contextvars.bound_contextvars(scheduled=intended.isoformat(), shards=shards):
                await self._probe(job, intended, log, claim_keys=keys, series=series, finish_now=True)
        finally:
            renewing.cancel()

    async def _probe(
        self,
        job: Job,
        intended: datetime,
        log: FilteringBoundLogger,
        *,
        claim_keys: list[str],
        series: frozenset[tuple[str, str]] | None = None,
        finish_now: bool = False,
    ) -> None:
        """Run the job (or `series` of it) for the tick, then record how it ended on the claims it holds
        (off the tick's task, or before returning with `finish_now`)."""
        context, metrics, claims = self.context, self.metrics, self.claims
        plan = plan_for_job(context, job, series=series)
        hold = self.detection.budget.hold_for(job.name) if self.detection is not None else None
        if hold is not None and hold.action == "reduce":  # the least that still measures, until the period ends
            log.info("run_reduced_by_budget", budget=hold.budget, rounds=1, warmup=0, until=hold.until.isoformat())
            plan = replace(plan, rounds=1, warmup=0)
        reloads = self.reloads
        try:
            outcome = await execute(
                context,
                job=job.name,
                plan=plan,
                connection=job.connection,
                intended_at=intended,
            )
        except Exception:
            log.exception("job_error")
            metrics.job_runs.labels(job.name, "error").inc()
            self._forget_after_reload(reloads)
            return
        result = "ok" if outcome.ok else "failed"
        metrics.job_runs.labels(job.name, result).inc()
        self._forget_after_reload(reloads)
        if finish_now:  # while its lease is still renewed, so no other replica takes it over meanwhile
            for key in claim_keys:
                await claims.try_finish(job=key, scheduled_at=intended, location=self.config.location, status=result)
            return
        for key in claim_keys:
            if claims.resting:
                break
            task = asyncio.create_task(
                claims.try_finish(job=key, scheduled_at=intended, location=self.config.location, status=result)
            )
            self._bookkeeping.add(task)
            task.add_done_callback(self._bookkeeping.discard)


async def run_daemon(config_path: str, *, redactor: Redactor | None = None) -> int:
    """`ttft-monitor run`: a `Daemon` driven by signals. SIGHUP reloads; SIGTERM or SIGINT stops, exit 0."""
    notifier = _notifier()
    daemon = Daemon(config_path, redactor=redactor, notifier=notifier)
    stop = asyncio.Event()
    reload_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_requested.set)
    try:
        await daemon.start()
    except StartupFailed as exc:
        structlog.get_logger().error(exc.event, **exc.fields)
        print(str(exc), file=sys.stderr, flush=True)
        return exc.code
    try:
        while not stop.is_set():
            waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(reload_requested.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if reload_requested.is_set() and not stop.is_set():
                reload_requested.clear()
                if notifier is not None:
                    notifier.reloading()
                await daemon.reload()
                if notifier is not None:
                    notifier.ready()
    finally:
        if notifier is not None:
            notifier.stopping()
        await daemon.stop()
    return EXIT_OK


async def run_once(config_path: str, *, job_names: list[str], redactor: Redactor | None = None) -> int:
    """`ttft-monitor once`: a `Daemon` in burst mode: start, run the job(s) once, store, deliver, stop, push
    metrics, exit 0/1/2/3/5 (5: the Pushgateway refused).

    SIGTERM or SIGINT (a Kubernetes deadline, eviction or drain): stop as `run` does (in-flight probes get
    `shutdown_grace_s`; what they measured is written or spooled), log `once_interrupted`, exit 4
    (EXIT_INTERRUPTED).
    """
    log = structlog.get_logger()
    daemon = Daemon(config_path, redactor=redactor, burst=True, job_names=job_names)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            signals.append(sig.name)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        try:
            started = await _until(stop, daemon.start())
        except StartupFailed as exc:
            log.error(exc.event, **exc.fields)
            print(str(exc), file=sys.stderr, flush=True)
            return exc.code
        if not started:
            log.warning("once_interrupted", signal=signals[0], phase="connecting", samples=0)
            print(
                f"ttft-monitor once: stopped by {signals[0]} before probing; nothing measured",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_INTERRUPTED
        burst = asyncio.create_task(daemon.run_burst())
        try:
            finished = await _until(stop, asyncio.shield(burst))
        except StartupFailed as exc:  # the store, opened after probing, could not be: as at start, exit 3
            stopped = await daemon.stop()  # logs the error, as start would have
            print(str(exc), file=sys.stderr, flush=True)
            if stopped is not None and stopped.spooled:
                print(
                    f"ttft-monitor once: {stopped.spooled} runs wait in the spool at "
                    f"{Path(daemon.config.database.state_dir) / 'spool'} and are written on the next run",
                    file=sys.stderr,
                    flush=True,
                )
            return exc.code
        except BaseException:
            await daemon.stop()
            raise
        if not finished:
            phase = daemon.phase
            burst.cancel()  # the jobs' runs go on: stop gives them the grace
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await burst
            return _interrupted(daemon, await daemon.stop(), signals[0], phase)
        outcomes = burst.result()
        await daemon.deliver_due()
        stopped = await daemon.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    assert stopped is not None
    config = daemon.config
    from monitor.metrics.push import push_once_metrics
    from monitor.probe.proxy import ProxyEnvironment

    # The same proxy policy as the probes' (the ignored variables were logged when they started).
    proxies = ProxyEnvironment.from_environ(os.environ)
    pushed = await push_once_metrics(config, daemon.metrics.registry, [j.name for j in daemon.jobs], proxies=proxies)
    ok = sum(o.ok for o in outcomes)
    failed = sum(o.failed for o in outcomes)
    spooled = stopped.spooled
    log.info("once_finished", jobs=len(outcomes), ok=ok, failed=failed, spooled=spooled)
    lost = any(o.saved is not None and o.saved.done() and o.saved.result() == "lost" for o in outcomes)
    if stopped.lost_at_exit or lost:
        print(
            "ttft-monitor once: some samples could be stored neither in the database nor in the spool; "
            "see the results_lost log line",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INFRA
    if spooled:
        log.warning("once_left_in_spool", runs=spooled)
        print(
            f"ttft-monitor once: the database did not take {spooled} runs; they wait in the spool at "
            f"{Path(config.database.state_dir) / 'spool'} and are written on the next run",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INFRA
    if not pushed:
        print(
            "ttft-monitor once: the Pushgateway did not take the metrics; its answer is in the "
            "pushgateway_rejected or pushgateway_unreachable log line",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PUSH
    if not outcomes and daemon.paused_by_budget:  # nothing failed: the budget held every job back, as configured
        holds = ", ".join(
            f"{h.job} by budget.{h.budget} until {h.until:%Y-%m-%d %H:%M} UTC" for h in daemon.paused_by_budget
        )
        print(f"ttft-monitor once: nothing probed, paused: {holds}", file=sys.stderr, flush=True)
        return EXIT_OK
    return EXIT_OK if ok else EXIT_FAILED


async def _until(stop: asyncio.Event, awaitable: Awaitable[object]) -> bool:
    """True when `awaitable` finished (its exception raised); False when `stop` was set first (it is cancelled)."""
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return False


def _interrupted(daemon: Daemon, stopped: Stopped | None, signal_name: str, phase: str) -> int:
    """`once` stopped by a signal after it started: one log line and one line on stderr, EXIT_INTERRUPTED."""
    measured = [x for x in daemon.samples if not x.warmup]
    spooled = stopped.spooled if stopped is not None else 0
    lost = stopped.lost_runs if stopped is not None else 0
    structlog.get_logger().warning(
        "once_interrupted",
        signal=signal_name,
        phase=phase,
        samples=len(measured),
        ok=sum(1 for x in measured if x.ok),
        stored_runs=stopped.stored_runs if stopped is not None else 0,
        spooled=spooled,
        lost_runs=lost,
        **(stopped.closed if stopped is not None else {}),
    )
    print(
        f"ttft-monitor once: stopped by {signal_name} while {phase}; {len(measured)} samples measured, "
        f"{spooled} runs wait in the spool, {lost} lost",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_INTERRUPTED
