"""The one job pipeline: probe -> store -> (detect). `run`, `once` and `probe --store` all call `execute`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import structlog

from monitor.config.cost import prices_for
from monitor.config.models import Config, Job
from monitor.config.series import cache_pairs, series_prompts, warm_twin
from monitor.metrics.definitions import Metrics, job_interval_seconds
from monitor.probe.client import ProbeClient
from monitor.probe.plan import Endpoints, prompt_spec
from monitor.probe.prompts import Calibration, PromptFactory
from monitor.probe.proxy import ProxyEnvironment, route_for
from monitor.probe.result import Sample
from monitor.probe.run import RunKey, current_run
from monitor.probe.runner import ProbeTarget, ProviderLimits, RunPlan, run_plan
from monitor.probe.self_delay import LoopDelayMeter
from monitor.probe.server_metrics import (
    AFTER_SCRAPE_TIMEOUT_S,
    SCRAPE_TIMEOUT_S,
    InfoRequest,
    ServerMetrics,
    Snapshot,
    read_json,
    scrape,
    server_build,
    server_metrics,
)
from monitor.probe.spend import PerProbe, per_probe, token_jumps
from monitor.schedule.background import (
    AFTERCARE_TIMEOUT_S,
    AfterStore,
    aftercare_deadline_s,
    detection_budget_s,
)

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from monitor.schedule.background import BackgroundStore
    from monitor.store.records import Batch, RunRecord
    from monitor.store.repository import Repository
    from monitor.store.writer import ResultWriter

SAMPLE_LOG_FIELDS = (
    "round",
    "warmup",
    "ttft_ms",
    "ttfa_ms",
    "first_event_ms",
    "ttfb_ms",
    "total_ms",
    "setup_ms",
    "decode_tps",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "reasoning_tokens_estimated",
    "served_model",
    "fingerprint",
    "request_id",
    "http_status",
    "error",
    "error_message",
    "connection_reused",
    "self_delay_ms",
    "disturbed",
    "via_proxy",
    "connection_retried",
)


@dataclass
class JobContext:
    """Everything a job run needs, built once per process (and rebuilt on reload) by `app.py`."""

    config: Config
    endpoints: Endpoints
    limits: ProviderLimits
    calibration: Calibration
    clients: dict[str, ProbeClient]  # by connection mode: "reuse", "fresh"
    writer: ResultWriter | None = None  # None: do not store
    repository: Repository | None = None
    metrics: Metrics | None = None
    after_store: AfterStore | None = None  # detection hook, once it exists
    # The daemon and `once` hand finished runs to a BackgroundStore (monitor.schedule.background) so
    # no probe ever waits on the database; without one (`probe --store`) runs are stored inline.
    background: BackgroundStore | None = None
    # Calibration as last written to the database, so unchanged fits are not written every run.
    saved_fits: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # For providers' `server_metrics_url`: one per process (`app.ProcessResources`), kept across runs and
    # reloads so its connections are reused; a context built without one opens a session per run.
    scrape_session: aiohttp.ClientSession | None = None
    # The probing loop's lateness (`app.ProcessResources`); None: samples leave `self_delay_ms` unset.
    meter: LoopDelayMeter | None = None
    # The environment's proxy settings, for the scrapes (the endpoints carry their own route already).
    proxies: ProxyEnvironment = field(default_factory=ProxyEnvironment)
    # Tokens per probe in each series' last run, to log a jump ("the model now reasons", monitor.probe.spend).
    tokens_per_probe: dict[tuple[str, str], PerProbe] = field(default_factory=dict)
    # Set when the process starts stopping (`app.ProcessResources`): runs start no more rounds
    # (each series once it has measured one: monitor.probe.runner).
    draining: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class JobOutcome:
    job: str
    intended_at: datetime
    started_at: datetime
    finished_at: datetime | None = None
    samples: list[Sample] = field(default_factory=list)
    stored: bool = False
    cancelled: bool = False
    # The process started stopping during the run: the rounds not yet begun were not probed.
    drained: bool = False
    # Handed to the background store: resolves to the writer's outcome ("stored", "spooled", "lost").
    saved: asyncio.Future[str] | None = None
    # By target: what its server's own metrics said over the run (providers with server_metrics_url).
    server: dict[str, ServerMetrics] = field(default_factory=dict)
    # By target: the hash of its canary's answer after the run (targets with `canary`; None: it failed).
    canary: dict[str, str | None] = field(default_factory=dict)
    # By target: what its self-hosted server says it runs (providers with server_metrics_url).
    server_build: dict[str, str] = field(default_factory=dict)

    @property
    def measured(self) -> list[Sample]:
        return [s for s in self.samples if not s.warmup]

    @property
    def ok(self) -> int:
        return sum(1 for s in self.measured if s.ok)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.measured if not s.ok)


def plan_for_job(ctx: JobContext, job: Job, *, series: frozenset[tuple[str, str]] | None = None) -> RunPlan:
    """The job's run; with `series` (a replica's shards of it) only those, and only their targets
    (whose servers' metrics are then scraped)."""
    config = ctx.config
    targets = job.targets if series is None else [t for t in job.targets if any(t == s[0] for s in series)]
    measured = series_prompts(config.prompts, job.prompts)
    twins = cache_pairs(config.prompts)
    if series is not None:  # a shard holding a `cache: both` prompt probes its warm twin too, in the same run
        series = series | {(target, warm_twin(prompt)) for target, prompt in series}
    return RunPlan(
        series=series,
        targets=ctx.endpoints.targets(targets),
        prompts=tuple(prompt_spec(name, profile, primed=name in twins) for name, profile in measured),
        rounds=job.rounds,
        warmup=job.warmup,
        pause_s=job.pause_s,
        # Per-provider max_concurrency is the cap; the job itself does not add another.
        concurrency=max(1, len(job.targets) * len(measured)),
    )


def _sample_event(sample: Sample) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in SAMPLE_LOG_FIELDS:
        value = getattr(sample, name)
        if value is not None:
            out[name] = value.value if name == "error" else value
    return out


async def execute(
    ctx: JobContext,
    *,
    job: str,
    plan: RunPlan,
    connection: str = "reuse",
    intended_at: datetime | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> JobOutcome:
    """Probe the plan, then store what was measured. Samples already taken are stored even if cancelled."""
    started = datetime.now(UTC)
    outcome = JobOutcome(job=job, intended_at=intended_at or started, started_at=started)
    log = structlog.get_logger().bind(job=job)
    provider_of = {t.name: t.provider for t in plan.targets}
    slo_of = {name: spec.slo for name, spec in ctx.config.targets.items()}
    prices_of = {name: prices_for(ctx.config, name) for name in ctx.config.targets}
    clock_start = time.perf_counter()
    if ctx.metrics is not None:
        ctx.metrics.start_job_series(job)

    def record(sample: Sample) -> None:
        outcome.samples.append(sample)
        if ctx.metrics is not None:
            slo = slo_of.get(sample.target)
            ctx.metrics.observe_sample(
                sample,
                provider=provider_of.get(sample.target, ""),
                probe_job=job,
                slo_ttft_ms=slo.ttft_ms if slo is not None else None,
                slo_objective=slo.objective if slo is not None else None,
                prices=prices_of.get(sample.target),
            )
        log.info("probe_sample", target=sample.target, prompt=sample.prompt, **_sample_event(sample))
        if on_sample is not None:
            on_sample(sample)

    run_over = False
    try:
        async with _ServerReadings(ctx, plan, log) as readings:
            # The run's probes name it in their traces (monitor.probe.run), inherited by each probe's task.
            run_token = current_run.set(RunKey(job, outcome.intended_at))
            try:
                await run_plan(
                    plan,
                    client=ctx.clients[connection],
                    limits=ctx.limits,
                    prompts=PromptFactory(ctx.calibration),
                    intended_at=outcome.intended_at,
                    on_sample=record,
                    meter=ctx.meter,
                    self_delay_bound_ms=ctx.config.probe_self_delay_bound_ms,
                    draining=ctx.draining,
                )
            finally:
                current_run.reset(run_token)
            run_over = True
            outcome.drained = ctx.draining.is_set()
            _run_ended(ctx, outcome)
            _watch_tokens(ctx, outcome, log)
            outcome.server, outcome.server_build = await readings.over_the_run()
            if not outcome.drained:  # stopping: the canary's question would only hold the stop up
                outcome.canary = await _ask_canaries(ctx, plan, connection, log)
    except asyncio.CancelledError:
        outcome.cancelled = True
        if not run_over:  # cancelled while probing: its run still ends, with what it took
            _run_ended(ctx, outcome)
        log.warning("job_cancelled", samples_taken=len(outcome.samples))
        if ctx.background is not None:
            _hand_over(ctx, outcome, provider_of)  # synchronous: nothing to wait for while cancelled
        else:
            await asyncio.shield(_store(ctx, outcome, provider_of, log))
        raise
    await _store(ctx, outcome, provider_of, log)
    duration = time.perf_counter() - clock_start
    if ctx.metrics is not None:
        ctx.metrics.job_last_run.labels(job).set(time.time())
        ctx.metrics.job_duration.labels(job).set(duration)
        interval = job_interval_seconds(ctx.config, job)
        if interval is not None:
            ctx.metrics.job_interval.labels(job).set(interval)
    log.info(
        "job_finished",
        ok=outcome.ok,
        failed=outcome.failed,
        duration_s=round(duration, 3),
        lag_ms=round((started - outcome.intended_at).total_seconds() * 1000, 1),
        **({"drained": True, "rounds_not_probed": _not_probed(plan, outcome)} if outcome.drained else {}),
    )
    return outcome


def _not_probed(plan: RunPlan, outcome: JobOutcome) -> int:
    """Measured rounds the plan asked for that a stop left unprobed."""
    series = len(plan.series) if plan.series is not None else len(plan.targets) * len(plan.prompts)
    return max(0, series * plan.rounds - len(outcome.measured))


async def _ask_canaries(
    ctx: JobContext, plan: RunPlan, connection: str, log: FilteringBoundLogger
) -> dict[str, str | None]:
    """Each canary target's answer hash, asked after the run's probes (so none queues ahead of one),
    within its provider's concurrency cap. A failed canary is None: no evidence either way."""
    from monitor.probe.canary import CanaryAnswer, ask

    targets = [t for t in plan.targets if t.canary is not None]
    if not targets:
        return {}

    async def one(target: ProbeTarget) -> tuple[str, str | None]:
        assert target.canary is not None
        try:
            async with asyncio.timeout(target.canary.timeout_s), ctx.limits.get(target.provider):
                answer = await ask(ctx.clients[connection], target)
        except TimeoutError:
            answer = CanaryAnswer(
                target.name, None, f"no answer within canary.timeout_s ({target.canary.timeout_s:g} s)"
            )
        if answer.digest is None:
            log.warning(
                "canary_failed",
                target=target.name,
                error=answer.error or "empty answer",
                hint="no answer to compare this run; an empty one is usually a reasoning model that spent "
                "canary.max_tokens thinking: set params.reasoning: least or raise canary.max_tokens",
            )
        return target.name, answer.digest

    return dict(await asyncio.gather(*(one(t) for t in targets)))


def _watch_tokens(ctx: JobContext, outcome: JobOutcome, log: FilteringBoundLogger) -> None:
    """Log, once per jump, a series whose tokens per probe jumped since its last run: a model that started
    reasoning costs many times what it did, and its TTFT now includes the thinking."""
    now = per_probe(outcome.samples)
    for (target, prompt), was, grown in token_jumps(ctx.tokens_per_probe, now):
        log.warning(
            "model_now_reasons",
            target=target,
            prompt=prompt,
            completion_tokens_before=was.completion,
            completion_tokens_after=grown.completion,
            reasoning_tokens_before=was.reasoning,
            reasoning_tokens_after=grown.reasoning,
        )
    ctx.tokens_per_probe.update(now)


def _run_ended(ctx: JobContext, outcome: JobOutcome) -> None:
    """Every sample of the run is in: tell the metrics (a trace's run span), once per run."""
    if ctx.metrics is not None:
        ctx.metrics.observe_run(probe_job=outcome.job, intended_at=outcome.intended_at, samples=outcome.samples)


def _batch(ctx: JobContext, outcome: JobOutcome, provider_of: dict[str, str], runs: Batch | None = None) -> Batch:
    from monitor.store.records import StorableBatch, runs_from_samples

    batch = runs
    if batch is None:
        batch = runs_from_samples(
            outcome.samples, job=outcome.job, location=ctx.config.location, provider_of=provider_of
        )
    if outcome.canary:
        batch = [(replace(run, canary=outcome.canary.get(run.series.target)), samples) for run, samples in batch]
    if outcome.server_build:
        builds = outcome.server_build
        batch = [(replace(run, server_build=builds.get(run.series.target)), samples) for run, samples in batch]
    if outcome.server:
        batch = [
            (replace(run, **_as_kwargs(outcome.server[run.series.target].run_fields())), samples)
            if run.series.target in outcome.server
            else (run, samples)
            for run, samples in batch
        ]
    # Made by iter_runs_from_samples; what was added since (canaries, server readings) is not what
    # storable_batch checks.
    return StorableBatch(batch)


def _as_kwargs(fields: dict[str, float | None]) -> dict[str, Any]:
    # The `server_*` fields are all optional floats; mypy cannot see that through `**`.
    return fields


class _ServerReadings:
    """Scrapes the servers' own metrics endpoints of a plan's targets right before and after its run.

    Each scrape is bounded (SCRAPE_TIMEOUT_S before, AFTER_SCRAPE_TIMEOUT_S after, when no probe
    waits on it) and never raises: a dead or hung endpoint delays the
    first probe by at most that, and only leaves the run's `server_*` fields empty.
    """

    def __init__(self, ctx: JobContext, plan: RunPlan, log: FilteringBoundLogger) -> None:
        providers = ctx.config.providers
        self._url_of = {
            t.name: url
            for t in plan.targets
            if t.provider in providers and (url := providers[t.provider].server_metrics_url) is not None
        }
        # A provider's scrape goes the way its probes go: its `proxy:` settings, for its metrics URL.
        self._proxy_of = {
            url: route_for(url, providers[t.provider].proxy, ctx.proxies)
            for t in plan.targets
            if t.name in self._url_of and (url := self._url_of[t.name])
        }
        self._model_of = {t.name: t.params.model for t in plan.targets}
        # Where each server says what it runs: vLLM's /version beside its metrics, and the OpenAI-compatible
        # model list under the provider's base_url (vLLM and SGLang both serve it).
        self._version_url = {t: urljoin(url, "/version") for t, url in self._url_of.items()}
        # SGLang says which weights it serves, and their version, at /get_model_info (vLLM answers 404).
        self._model_info_url = {t: urljoin(url, "/get_model_info") for t, url in self._url_of.items()}
        self._models_url = {
            t.name: t.endpoint.base_url.rstrip("/") + "/models" for t in plan.targets if t.name in self._url_of
        }
        # The model list is under the API: it goes the probes' way, with their credentials and TLS settings.
        self._info_request: dict[str, InfoRequest] = {}
        for t in plan.targets:
            if t.name not in self._url_of:
                continue
            metrics_url = self._url_of[t.name]
            self._info_request[self._version_url[t.name]] = InfoRequest(proxy=self._proxy_of[metrics_url])
            self._info_request[self._model_info_url[t.name]] = InfoRequest(proxy=self._proxy_of[metrics_url])
            endpoint = t.endpoint
            headers = {**endpoint.headers, **endpoint.flavor.auth_headers(endpoint.api_key)}
            self._info_request[self._models_url[t.name]] = InfoRequest(endpoint.proxy, headers, endpoint.ssl)
        self._provider_of = {t.name: t.provider for t in plan.targets}
        self._session = ctx.scrape_session
        self._own_session: aiohttp.ClientSession | None = None
        self._before: dict[str, Snapshot] = {}
        self._log = log

    async def __aenter__(self) -> _ServerReadings:
        if self._url_of:
            if self._session is None:
                self._session = self._own_session = aiohttp.ClientSession()
            self._before = await self._read_all()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._own_session is not None:
            await self._own_session.close()

    async def over_the_run(self) -> tuple[dict[str, ServerMetrics], dict[str, str]]:
        """What each server's metrics said over the run, and what each says it runs (its build)."""
        if not self._url_of:
            return {}, {}
        after, documents = await asyncio.gather(self._read_all(timeout_s=AFTER_SCRAPE_TIMEOUT_S), self._read_info())
        out: dict[str, ServerMetrics] = {}
        builds: dict[str, str] = {}
        for target, url in self._url_of.items():
            metrics = server_metrics(self._before.get(url), after.get(url), self._model_of[target])
            if metrics is not None:
                out[target] = metrics
            version, models = documents.get(self._version_url[target]), documents.get(self._models_url[target])
            build = server_build(
                version=version,
                models=models,
                model=self._model_of[target],
                snapshot=after.get(url),
                model_info=documents.get(self._model_info_url[target]),
            )
            if build is not None:
                builds[target] = build
        return out, builds

    async def _read_info(self) -> dict[str, Any]:
        """The servers' /version, /get_model_info and model lists, each URL once, bounded like the after-run
        scrape."""
        session = self._session
        assert session is not None
        # One after the other per server, on one kept-alive connection: a server is asked for its documents
        # beside its after-run scrape, not with a burst of connections of its own.
        by_host: dict[str, list[str]] = {}
        for url in sorted(self._info_request):
            by_host.setdefault(urlsplit(url).netloc, []).append(url)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + AFTER_SCRAPE_TIMEOUT_S  # all of a server's documents within the one bound

        async def documents_of(urls: list[str]) -> list[tuple[str, Any]]:
            out: list[tuple[str, Any]] = []
            for u in urls:
                left = deadline - loop.time()
                found = await read_json(session, u, timeout_s=left, request=self._info_request[u]) if left > 0 else None
                out.append((u, found))
            return out

        found = await asyncio.gather(*(documents_of(urls) for urls in by_host.values()))
        return dict(pair for pairs in found for pair in pairs)

    async def _read_all(self, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> dict[str, Snapshot]:
        assert self._session is not None
        urls = sorted(set(self._url_of.values()))
        readings = await asyncio.gather(
            *(scrape(self._session, url, timeout_s=timeout_s, proxy=self._proxy_of[url]) for url in urls)
        )
        out: dict[str, Snapshot] = {}
        for url, reading in zip(urls, readings, strict=True):
            if isinstance(reading, str):
                # The URL may carry credentials: name the provider, never the address.
                providers = sorted({self._provider_of[t] for t, u in self._url_of.items() if u == url})
                self._log.warning("server_metrics_unread", providers=providers, error=reading)
            else:
                out[url] = reading
        return out


def _hand_over(ctx: JobContext, outcome: JobOutcome, provider_of: dict[str, str], runs: Batch | None = None) -> None:
    """Queue the run for the background store and return at once: the next tick never waits on it.
    `runs`: the samples already made into runs (`_runs_in_steps`)."""
    if outcome.finished_at is None:
        outcome.finished_at = datetime.now(UTC)
    if ctx.background is None or not outcome.samples:
        return
    batch = _batch(ctx, outcome, provider_of, runs)
    outcome.saved = ctx.background.submit(outcome.job, batch, _moved_fits(ctx, outcome))
    outcome.stored = True  # handed over; `saved` says how it ended ("lost" is logged loudly)


# Series summarised per step of the probes' loop when a run is handed over: all 500 of a job at once held
# the loop for about 9 ms of CPU (bench/daemon.py), a stall in every probe then in flight; 50 a step, with the
# run's end (its metrics, the tokens watched) in the first, still took 11-16 ms (loop lag p99 target: 5 ms).
HAND_OVER_STEP = 25


async def _runs_in_steps(ctx: JobContext, outcome: JobOutcome, provider_of: dict[str, str]) -> Batch:
    from monitor.store.records import iter_runs_from_samples

    runs: list[tuple[RunRecord, list[Sample]]] = []
    await asyncio.sleep(0)  # the run's end, just done in this step, and its first runs are two steps
    made = iter_runs_from_samples(
        outcome.samples, job=outcome.job, location=ctx.config.location, provider_of=provider_of
    )
    for run in made:
        runs.append(run)
        if len(runs) % HAND_OVER_STEP == 0:
            await asyncio.sleep(0)
    return runs


async def _store(ctx: JobContext, outcome: JobOutcome, provider_of: dict[str, str], log: FilteringBoundLogger) -> None:
    if ctx.background is not None:
        outcome.finished_at = datetime.now(UTC)
        if not outcome.samples:
            return
        try:
            runs = await _runs_in_steps(ctx, outcome, provider_of)
        except asyncio.CancelledError:  # cancelled between steps: handed over whole, as a cancelled run is
            _hand_over(ctx, outcome, provider_of)
            raise
        _hand_over(ctx, outcome, provider_of, runs)
        return
    outcome.finished_at = datetime.now(UTC)
    if ctx.writer is None or not outcome.samples:
        return
    batch = _batch(ctx, outcome, provider_of)
    saved = await ctx.writer.save(batch)
    # "lost": neither the database nor the spool took it; the writer has logged it loudly.
    outcome.stored = str(saved) != "lost"
    if ctx.repository is not None:
        await _save_calibration(ctx, outcome, log)
    if ctx.after_store is not None and str(saved) == "stored":
        budget_s = detection_budget_s(len(batch), AFTERCARE_TIMEOUT_S)
        try:
            async with asyncio.timeout(aftercare_deadline_s(budget_s)):
                await ctx.after_store(outcome.job, batch, budget_s=budget_s)
        except TimeoutError:
            log.warning("detection_stopped", batch_runs=len(batch), budget_s=round(budget_s, 1), error="TimeoutError")


def _moved_fits(ctx: JobContext, outcome: JobOutcome) -> dict[tuple[str, str], tuple[float, float]]:
    """The calibration fits of this run's series that moved since they were last saved."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for key in {(s.target, s.prompt) for s in outcome.samples}:
        fit = ctx.calibration.fit(key)
        if fit is not None and _moved(ctx.saved_fits.get(key), fit):
            out[key] = fit
    return out


def _moved(old: tuple[float, float] | None, new: tuple[float, float]) -> bool:
    # The fit wobbles by a fraction of a percent run to run; only a real move is worth a write.
    return old is None or abs(new[0] - old[0]) > 0.01 * old[0] or abs(new[1] - old[1]) > 2


async def _save_calibration(ctx: JobContext, outcome: JobOutcome, log: FilteringBoundLogger) -> None:
    assert ctx.repository is not None
    try:
        async with asyncio.timeout(AFTERCARE_TIMEOUT_S):
            moved = _moved_fits(ctx, outcome)
            await ctx.repository.save_calibrations(moved)
            ctx.saved_fits.update(moved)
    except Exception as exc:  # calibration is an optimisation; a failed save must not fail the job
        log.warning("calibration_not_saved", error=type(exc).__name__)
