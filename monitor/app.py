"""Builds every resource (engine, HTTP clients, limits, metrics, store) and hands them down."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
import structlog

from monitor.config.models import Config
from monitor.metrics.definitions import Metrics
from monitor.probe.client import ProbeClient, RequestTracing
from monitor.probe.plan import Endpoints
from monitor.probe.prompts import Calibration
from monitor.probe.proxy import ProxyEnvironment
from monitor.probe.runner import ProviderLimits
from monitor.probe.self_delay import LoopDelayMeter
from monitor.schedule.pipeline import JobContext

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from sqlalchemy.ext.asyncio import AsyncEngine

    from monitor.alert.dispatcher import Dispatcher
    from monitor.alert.metrics import AlertMetrics
    from monitor.alert.outbox import Outbox
    from monitor.detect.service import DetectionService
    from monitor.otel.export import OtelTelemetry
    from monitor.otel.semconv import Endpoint as OtelEndpoint
    from monitor.schedule.background import AfterStore, BackgroundStore
    from monitor.store.repository import Repository
    from monitor.store.spool import Spool
    from monitor.store.writer import ResultWriter


class InfrastructureError(Exception):
    """The database or the spool is unusable; the message says what to check."""


@dataclass
class Store:
    engine: AsyncEngine
    repository: Repository
    spool: Spool
    writer: ResultWriter


async def open_store(
    config: Config,
    *,
    metrics: Metrics | None,
    retry_s: float | None = None,
    spool_subdir: str | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Store:
    """Connect (retrying for `database.connect_retry_s`), refuse a schema behind head, open the spool."""
    from monitor.store.engine import (
        DAEMON_COMMAND_TIMEOUT_S,
        DAEMON_CONNECT_TIMEOUT_S,
        DAEMON_POOL_TIMEOUT_S,
        StoreError,
        create_engine,
        describe_db_error,
    )
    from monitor.store.repository import Repository
    from monitor.store.schema import ensure_current
    from monitor.store.spool import Spool
    from monitor.store.writer import ResultWriter

    log = structlog.get_logger()
    try:
        engine = create_engine(
            config.database.url,
            connect_timeout_s=DAEMON_CONNECT_TIMEOUT_S,
            command_timeout_s=DAEMON_COMMAND_TIMEOUT_S,
            pool_timeout=DAEMON_POOL_TIMEOUT_S,
        )
    except StoreError as exc:  # the SQLite file's directory cannot be created: no retry will help
        raise InfrastructureError(str(exc)) from None
    repository = Repository(engine)
    budget = config.database.connect_retry_s if retry_s is None else retry_s
    deadline = asyncio.get_running_loop().time() + budget
    delay = 0.5
    while True:
        try:
            await repository.ping()
            break
        except Exception as exc:
            if asyncio.get_running_loop().time() + delay > deadline:
                await engine.dispose()
                reason = describe_db_error(exc, config.database.url)
                raise InfrastructureError(f"gave up after {budget:g} s: {reason}") from None
            log.warning("database_unreachable", retry_in_s=delay, error=type(exc).__name__)
            await sleep(delay)
            delay = min(delay * 2, 5.0)
    try:
        await ensure_current(engine)
    except StoreError as exc:  # SchemaBehind (names the fix), DatabaseUnavailable
        await engine.dispose()
        raise InfrastructureError(str(exc)) from None
    # An ad-hoc `probe --store` gets its own spool: each spool belongs to one process, and the
    # daemon may be running on the same state directory.
    state_dir = config.database.state_dir / spool_subdir if spool_subdir else config.database.state_dir
    events = _WriterEvents(metrics)
    try:
        spool = Spool.in_state_dir(state_dir, max_mb=config.database.spool_max_mb, on_event=events)
    except StoreError as exc:
        await engine.dispose()
        raise InfrastructureError(str(exc)) from None
    writer = ResultWriter(repository, spool, on_event=events)
    events.spool = spool
    return Store(engine=engine, repository=repository, spool=spool, writer=writer)


class _WriterEvents:
    """Logs the writer's and the spool's events (loud ones as warnings) and keeps the gauges current."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics
        self.spool: Spool | None = None
        self.log = structlog.get_logger()

    def __call__(self, name: str, **fields: object) -> None:
        from monitor.store.spool import LOUD_EVENTS

        loud = name in LOUD_EVENTS or name == "database_write_failed"
        (self.log.warning if loud else self.log.info)(name, **fields)
        if self.metrics is None:
            return
        if self.spool is not None:
            self.metrics.spool_records.set(self.spool.depth)
            self.metrics.spool_bytes.set(self.spool.bytes)
        if name == "database_write_failed":
            self.metrics.database_up.set(0)
        elif name in ("database_write_ok", "spool_drained"):
            self.metrics.database_up.set(1)


class TelemetryError(Exception):
    """OpenTelemetry export is configured but cannot start; the message names the setting and the fix."""


def open_telemetry(
    config: Config, registry: CollectorRegistry, *, environ: Mapping[str, str] | None = None
) -> OtelTelemetry | None:
    """OpenTelemetry export (monitor.otel) when `otel.endpoint` or an `OTEL_EXPORTER_OTLP_*ENDPOINT` is set,
    else None. Hand it to `Metrics` and `close_telemetry` it last; it opens no connection until its first export."""
    from monitor import __version__
    from monitor.otel.settings import OtelSettingsError, read_header_files, resolve

    env = os.environ if environ is None else environ
    try:
        settings = resolve(
            config.otel, env, file_headers=read_header_files(config.otel.header_files), service_version=__version__
        )
    except OtelSettingsError as exc:
        raise TelemetryError(str(exc)) from None
    if settings is None:
        return None
    try:
        from monitor.otel.export import OtelTelemetry
    except ImportError as exc:  # its message names the extra to install
        raise TelemetryError(str(exc)) from None
    telemetry = OtelTelemetry(
        settings,
        registry=registry,
        location=config.location,
        endpoints=telemetry_endpoints(config),
        ttft_buckets_s=config.metrics.ttft_buckets_s,
        # The same policy as every outbound client (unusable variables are reported by proxy_environment).
        proxies=ProxyEnvironment.from_environ(env),
    )
    structlog.get_logger().info(
        "otel_export_on",
        metrics=telemetry.health.where("metrics"),
        traces=telemetry.health.where("traces"),
        logs=telemetry.health.where("logs"),
        interval_s=settings.export_interval_s,
    )
    return telemetry


def telemetry_endpoints(config: Config) -> dict[str, OtelEndpoint]:
    """Each provider's API and URL, which name it (`gen_ai.provider.name`) and its server in telemetry."""
    from monitor.otel.semconv import Endpoint

    return {name: Endpoint(api=p.api, base_url=p.base_url) for name, p in config.providers.items()}


async def close_telemetry(telemetry: OtelTelemetry | None) -> None:
    """Export what is left and stop export's threads, off this loop and within about `otel.timeout_s` per
    signal: a collector that is away delays exit by that bound, never past it."""
    if telemetry is None:
        return
    bound = telemetry.settings.close_bound_s + 1
    try:
        await asyncio.wait_for(asyncio.to_thread(telemetry.close), timeout=bound)
    except TimeoutError:  # its threads are daemons: the process does not wait for them
        structlog.get_logger().warning("otel_close_timed_out", after_s=bound)


CALIBRATION_LOAD_TIMEOUT_S = 5.0


@dataclass
class ProcessResources:
    """What lives as long as the process, opened once and kept across reloads, closed at stop.

    A reload rebuilds only what the config decides (`job_context`); these carry over, so it opens
    no new HTTP session and forgets no calibration.
    """

    clients: dict[str, ProbeClient]  # by connection mode: "reuse", "fresh"
    calibration: Calibration
    # Calibration as last written to the database, so unchanged fits are not written every run.
    saved_fits: dict[tuple[str, str], tuple[float, float]]
    # One session for every scrape of providers' `server_metrics_url`, so its connections are reused.
    scrape_session: aiohttp.ClientSession
    # The probing loop's own lateness, so each sample says how late the monitor was around its stamps.
    meter: LoopDelayMeter | None = None
    # HTTP(S)_PROXY and NO_PROXY as the process started with them: every outbound client routes by them
    # and each destination's `proxy:` settings (monitor.probe.proxy).
    proxies: ProxyEnvironment = field(default_factory=ProxyEnvironment)
    # Set when the process starts stopping: every run, before and after a reload, starts no more rounds.
    draining: asyncio.Event = field(default_factory=asyncio.Event)


def proxy_environment(environ: Mapping[str, str] | None = None) -> ProxyEnvironment:
    """The process's proxy variables; each unusable one is logged once, naming the fix, and ignored."""
    proxies = ProxyEnvironment.from_environ(os.environ if environ is None else environ)
    for name, why in proxies.ignored:
        structlog.get_logger().warning(
            "proxy_environment_ignored", variable=name, reason=why, fix=f"correct or unset {name}"
        )
    return proxies


async def open_process_resources(
    stack: AsyncExitStack,
    *,
    store: Store | None,
    proxies: ProxyEnvironment | None = None,
    tracing: RequestTracing | None = None,
    saved_fits: Mapping[tuple[str, str], tuple[float, float]] | None = None,
) -> ProcessResources:
    """Open the HTTP sessions (closed by `stack`) and load the saved calibration (from the store, or
    `saved_fits` as read without it: `once` opens its store after probing).

    `tracing`: each probe request carries its trace's `traceparent` (OpenTelemetry traces, monitor.otel)."""
    calibration = Calibration()
    saved: dict[tuple[str, str], tuple[float, float]] = {}
    for key, (cpt, overhead) in (saved_fits or {}).items():
        calibration.load(key, cpt, overhead)
        saved[key] = (cpt, overhead)
    if store is not None:
        try:
            async with asyncio.timeout(CALIBRATION_LOAD_TIMEOUT_S):
                fits = await store.repository.load_calibration()
            for key, (cpt, overhead) in fits.items():
                calibration.load(key, cpt, overhead)
                saved[key] = (cpt, overhead)
        except Exception as exc:  # a cold calibration costs one round of accuracy, not correctness
            structlog.get_logger().warning("calibration_not_loaded", error=type(exc).__name__)
    # TTFT_KERNEL_TIMESTAMPS=0 times bytes when the probes' loop reads them, as on a kernel without
    # arrival stamps: for comparing the two (bench/isolation.py --compare-kernel-stamps).
    kernel_stamps = os.environ.get("TTFT_KERNEL_TIMESTAMPS", "1") != "0"
    clients = {
        "reuse": await stack.enter_async_context(
            ProbeClient(fresh=False, kernel_stamps=kernel_stamps, tracing=tracing)
        ),
        "fresh": await stack.enter_async_context(ProbeClient(fresh=True, kernel_stamps=kernel_stamps, tracing=tracing)),
    }
    # No cookie jar: each scrape stands alone, as it did with a session per run.
    scrape_session = await stack.enter_async_context(aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()))
    # Here, not in the daemon: `run`, `once` and `probe` all open these, so all measure self delay alike.
    meter = LoopDelayMeter()
    meter.start()
    stack.callback(meter.stop)
    return ProcessResources(
        clients=clients,
        calibration=calibration,
        saved_fits=saved,
        scrape_session=scrape_session,
        meter=meter,
        proxies=proxies if proxies is not None else proxy_environment(),
    )


def job_context(
    config: Config,
    resources: ProcessResources,
    *,
    store: Store | None,
    metrics: Metrics | None,
    after_store: AfterStore | None = None,
    background: BackgroundStore | None = None,
) -> JobContext:
    """The context jobs run in: what `config` decides, over the process's resources."""
    return JobContext(
        config=config,
        endpoints=Endpoints(config, proxies=resources.proxies),
        limits=ProviderLimits({name: p.max_concurrency for name, p in config.providers.items()}),
        calibration=resources.calibration,
        clients=resources.clients,
        writer=store.writer if store is not None else None,
        repository=store.repository if store is not None else None,
        metrics=metrics,
        after_store=after_store,
        saved_fits=resources.saved_fits,
        background=background,
        scrape_session=resources.scrape_session,
        meter=resources.meter,
        proxies=resources.proxies,
        draining=resources.draining,
    )


async def build_context(
    config: Config,
    stack: AsyncExitStack,
    *,
    store: Store | None,
    metrics: Metrics | None,
    tracing: RequestTracing | None = None,
    saved_fits: Mapping[tuple[str, str], tuple[float, float]] | None = None,
) -> JobContext:
    """For a command that runs its jobs once (`once`, `probe`): the process's resources and the context in one step."""
    resources = await open_process_resources(stack, store=store, tracing=tracing, saved_fits=saved_fits)
    return job_context(config, resources, store=store, metrics=metrics)


def alert_metrics_for(context: JobContext, metrics: Metrics | None) -> AlertMetrics | None:
    """The alert counters on the process's registry, each receiver's at zero, so the first failed
    delivery shows as an increase."""
    from monitor.alert.metrics import OUTCOMES, AlertMetrics

    if metrics is None:
        return None
    alert_metrics = AlertMetrics(metrics.registry)
    for receiver in context.config.alerts.receivers:
        for outcome in OUTCOMES:
            alert_metrics.notifications.labels(receiver=receiver, outcome=outcome)
    return alert_metrics


def attach_detection_service(
    context: JobContext, store: Store, *, outbox: Outbox, metrics: Metrics | None, keep_histories: bool = True
) -> DetectionService:
    """Detection after every stored run, enqueueing its notifications into `outbox`. `keep_histories`: keep
    each series' history between its evaluations (the daemon; `once` evaluates each series once)."""
    from monitor.detect.service import DetectionService

    service = DetectionService(
        store.engine, store.repository, context.config, outbox=outbox, metrics=metrics, keep_histories=keep_histories
    )
    context.after_store = service.after_store
    return service


async def attach_detection(
    context: JobContext, store: Store, stack: AsyncExitStack, *, metrics: Metrics | None
) -> tuple[Dispatcher, DetectionService]:
    """Detection after every stored run, and the alert dispatcher that delivers its notifications, on
    this loop (`once`: the daemon delivers on its service loop, monitor.daemon).

    Returns (dispatcher, detection service); the caller runs `dispatch_due()` once, so a slow
    receiver never holds up probing.
    """
    from monitor.alert.dispatcher import Dispatcher
    from monitor.alert.transport import Transport

    transport = await stack.enter_async_context(Transport(proxies=proxy_environment()))
    dispatcher = Dispatcher(store.engine, context.config.alerts, transport, metrics=alert_metrics_for(context, metrics))
    # `once` evaluates each series once: a history kept would only hold memory until the process exits.
    service = attach_detection_service(context, store, outbox=dispatcher.outbox, metrics=metrics, keep_histories=False)
    await service.budget.restore()  # a crossed budget's stored holds, before the first tick
    return dispatcher, service


def start_background_store(
    context: JobContext, store: Store, *, aftercare_timeout_s: float | None = None
) -> BackgroundStore:
    """Take storing, calibration saves and detection off the probe path (see monitor.schedule.background).

    `aftercare_timeout_s`: how long detection may take per batch (default: the daemon's bound).
    """
    from monitor.schedule.background import AFTERCARE_TIMEOUT_S, BackgroundStore

    background = BackgroundStore(
        store.writer,
        after_store=context.after_store,
        save_calibration=store.repository.save_calibrations,
        saved_fits=context.saved_fits,
        aftercare_timeout_s=AFTERCARE_TIMEOUT_S if aftercare_timeout_s is None else aftercare_timeout_s,
    )
    background.start()
    context.background = background
    return background


def freeze_heap(*, collect: bool = True) -> None:
    """Move everything allocated at start-up out of the garbage collector's sight.

    With SQLAlchemy, pydantic and friends imported, a full collection walks ~100 ms of objects;
    a pause landing inside a probe would add straight to its TTFT. Long-lived start-up objects
    never become garbage, so freezing them keeps collections short. The collector is on afterwards,
    whether or not start-up turned it off (`cli.MEASURING_COMMANDS`).

    `collect=False` freezes without the full collection first (about 50 ms of the start-up of
    `once` and `probe`): the couple of thousand objects start-up leaves as garbage are then kept
    for the life of the process, which for those short runs is a few hundred kB and no pause.
    """
    if collect:
        gc.collect()
    gc.freeze()
    gc.enable()


# The cyclic collector's thresholds in `run`: CPython's defaults for the young generations (700
# allocations, 10 young collections), and a full collection considered after 100 collections of the middle
# generation instead of 10. Measured at 500 series every 10 s (docs/benchmarks.md, "Garbage collection"):
# after the heap's freezing a full collection still walks what later ticks made (10-22 ms of the probes'
# loop, about every 50 s) and finds nothing to free, since a probe makes no cyclic garbage
# (tests/integration/test_probe_garbage.py); with 100 it comes about every 9 minutes at that load (a
# middle-generation collection every 5 s), and walks about 19,000 objects (12-16 ms). A larger first threshold
# (2,000) made fewer young collections but longer ones (11 ms against 5 for the middle generation) for the
# same CPU.
COLLECTOR_THRESHOLDS = (700, 10, 100)


def collect_rarely() -> None:
    """Have the cyclic collector make a full collection 10 times less often (COLLECTOR_THRESHOLDS), for the
    whole process: `run` calls it once, at start-up."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


# glibc's mallopt(3) parameters, and the values `return_large_blocks` (glibc's own initial one) and
# `share_thread_heaps` give them.
_M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 128 * 1024
_M_ARENA_MAX = -8
THREAD_HEAPS = 2


def share_thread_heaps() -> bool:
    """Have glibc keep at most THREAD_HEAPS heaps (arenas), the main thread's and one more, instead of one for
    each thread that allocates (up to eight a core): the database connections' threads and the service loop's
    each kept a heap of their own, partly filled, about 2 MB resident in all at 500 series (95.5-96.0 against
    97.7-97.9 MB, docs/benchmarks.md). Those threads allocate little and mostly one at a time (the GIL), so
    sharing costs no measurable lock waits; one heap for all (M_ARENA_MAX 1) put the probes' thread behind the
    same lock and cost CPU. Only threads that start allocating afterwards are affected: call it before any
    starts. False where there is no glibc to ask (musl, macOS)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_ARENA_MAX, THREAD_HEAPS))
    except (OSError, AttributeError):
        return False


def return_large_blocks() -> bool:
    """Have glibc map each block of 128 kB or more on its own, so that freeing it gives it back to the system.

    By default glibc raises that threshold to the largest block freed so far (up to 32 MB): after the first
    `/metrics` rendering (5 MB at 500 series) the later ones, and a stored batch's rows, were carved from
    the heaps of whichever thread made them, and the heaps kept them: four scrapes took a registry of 500
    series from 64 to 92 MB resident, against 71 MB with the threshold fixed (docs/benchmarks.md). False
    where there is no glibc to ask (musl, macOS): nothing changes there."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
    except (OSError, AttributeError):
        return False


def secrets_of(config: Config) -> list[str]:
    """Every secret the config resolved, for the log redactor: keys, header values, credentials in URLs
    (userinfo, key-like query values) and values `${VAR}` put into a provider's URL or headers."""
    from monitor.redact import url_credentials

    out: list[str | None] = []
    for provider in config.providers.values():
        out += provider.secrets()
    for receiver in config.alerts.receivers.values():
        url = receiver.resolved_url()
        out += [receiver.secret(), url, *receiver.headers.values(), *url_credentials(url or "")]
    out += url_credentials(config.database.url, user_is_secret=False)
    from monitor.otel.settings import header_secrets

    out += header_secrets(config.otel, os.environ)
    return list(dict.fromkeys(s for s in out if s))
