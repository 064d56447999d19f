"""Metric definitions. Names follow Prometheus conventions: base units, `_seconds`, `_total`.

Label sets are bounded: target, model, provider, prompt profile name, location, probe job, error class
(a fixed set). Never a prompt text, a request id or a server message.

The probe job's label is `probe_job`, not `job`: every Prometheus scrape sets `job` itself, and a
Pushgateway sets it from the push URL, so a `job` label of ours would arrive renamed or overwritten.

docs/metrics.md is generated from these definitions (`python -m monitor.metrics.docs --write
docs/metrics.md`) and a test fails when it is stale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor import __version__
from monitor.config.cost import cost_of
from monitor.config.cron import build_trigger
from monitor.config.models import DEFAULT_TTFT_BUCKETS_S, Config
from monitor.config.series import job_series
from monitor.metrics.lean import LeanCounter, LeanGauge, LeanHistogram, LeanSummary
from monitor.otel.incident import IncidentReading
from monitor.probe.result import Sample
from monitor.probe.self_delay import SELF_DELAY_BUCKETS_S
from monitor.probe.settings import Prices
from monitor.probe.spend import sample_tokens

SERIES_LABELS = ("target", "model", "provider", "prompt", "location")
PROBE_LABELS = (*SERIES_LABELS, "probe_job")
# A detector series: the database keys it by target (which fixes model and provider), prompt and location.
DETECTOR_LABELS = ("target", "prompt", "location")
TTFT_BUCKETS = DEFAULT_TTFT_BUCKETS_S
# The values of `result` and `reason`, created at zero for each job so rate() and increase() see the
# first run that fails or is missed (a series born at 1 shows no increase).
JOB_RESULTS = ("ok", "failed", "error", "skipped_claimed", "skipped_budget")
# Kinds of `ttft_monitor_tokens_total`; they do not overlap, so their sum is every token spent.
TOKEN_KINDS = ("input", "cached", "output", "reasoning")
MISSED_REASONS = ("misfired", "coalesced", "still_running")
# `metrics.per_series`: how much each probe series (target x prompt x location x job) exposes.
PerSeries = Literal["full", "summary", "off"]
PER_SERIES_MODES: tuple[PerSeries, ...] = ("full", "summary", "off")


class MonitorRegistry(CollectorRegistry):
    """A registry whose exposition leaves out the `_created` series of counters and histograms.

    They would double the number of families and no rule or dashboard reads them. prometheus_client
    offers only a process-wide switch (`disable_created_metrics()`); filtering here keeps the choice
    with the registry, so other registries in the same process are untouched.
    """

    def __init__(self) -> None:
        super().__init__()
        # In registration order, which is the order collect() yields them in.
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self._collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self._collectors.remove(collector)

    def collectors(self) -> list[Collector]:
        """What was registered, for monitor.metrics.exposition's renderer."""
        return list(self._collectors)

    @staticmethod
    def without_created(families: Iterable[Metric]) -> Iterator[Metric]:
        for family in families:
            if any(sample.name.endswith("_created") for sample in family.samples):
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family

    def collect(self) -> Iterator[Metric]:
        return self.without_created(super().collect())


class Telemetry(Protocol):
    """Another destination for what `Metrics` records (OpenTelemetry export, monitor.otel)."""

    def observe_sample(self, sample: Sample, *, provider: str, probe_job: str) -> None: ...

    def observe_run(self, *, probe_job: str, intended_at: datetime, samples: Sequence[Sample]) -> None:
        """A run's samples are all in (after its last probe, off the probes' path; also when cancelled)."""
        ...

    def observe_baseline(
        self, series: Sequence[str], *, baseline_ms: float | None, run_median_ms: float | None
    ) -> None: ...

    def observe_regression_state(self, series: Sequence[str], level: int) -> None: ...

    def observe_incident(self, reading: IncidentReading) -> None: ...


class Metrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        location: str = "local",
        ttft_buckets: Sequence[float] = TTFT_BUCKETS,
        telemetry: Telemetry | None = None,
        per_series: PerSeries = "full",
    ) -> None:
        self.registry = registry if registry is not None else MonitorRegistry()
        self.location = location
        # Recorded alongside the registry, from the same calls, so both say the same of every probe.
        self.telemetry = telemetry
        self.per_series: PerSeries = per_series
        # `off`: the metrics labelled by target are not registered and not fed (telemetry still is).
        r = self.registry
        series_registry = r if per_series != "off" else None
        buckets = tuple(ttft_buckets)
        self.info = Info("ttft_monitor", "ttft-monitor build and placement.", registry=r)
        self.info.info({"version": __version__, "location": location})
        self.ttft = self._distribution(
            "ttft_monitor_ttft_seconds",
            "Time to first generated token (content, reasoning or tool call).",
            buckets,
            series_registry,
        )
        self.ttft_last = LeanGauge(
            "ttft_monitor_ttft_last_seconds",
            "TTFT of the most recent successful probe.",
            PROBE_LABELS,
            registry=series_registry,
        )
        self.ttfa = self._distribution(
            "ttft_monitor_ttfa_seconds",
            "Time to the first visible answer token (after any reasoning).",
            buckets,
            series_registry,
        )
        self.ttfb = LeanGauge(
            "ttft_monitor_ttfb_last_seconds",
            "Time to the response head (status and headers) of the most recent successful probe.",
            PROBE_LABELS,
            registry=series_registry,
        )
        self.setup = LeanGauge(
            "ttft_monitor_setup_last_seconds",
            "Connection set-up (DNS, TCP, TLS) of the most recent successful probe; 0 on a reused connection.",
            PROBE_LABELS,
            registry=series_registry,
        )
        self.decode_rate = LeanGauge(
            "ttft_monitor_decode_tokens_per_second",
            "Decode rate of the most recent successful probe.",
            PROBE_LABELS,
            registry=series_registry,
        )
        self.probes = LeanCounter(
            "ttft_monitor_probes_total",
            "Probes by outcome (ok, error) and error class (none when ok).",
            ("target", "prompt", "location", "probe_job", "outcome", "error_class"),
            registry=series_registry,
        )
        self.disturbed = LeanCounter(
            "ttft_monitor_disturbed_samples_total",
            "Probes during which the monitor itself was late beyond `probe_self_delay_bound_ms` (a blocked "
            "event loop, a starved CPU): counted here instead of in the TTFT, probe and SLO metrics, as "
            "detection leaves them out too. Labels as `ttft_monitor_probes_total`.",
            ("target", "prompt", "location", "probe_job", "outcome", "error_class"),
            registry=series_registry,
        )
        self.self_delay = Histogram(
            "ttft_monitor_probe_self_delay_seconds",
            "How late the monitor itself was around each probe's stamps (its event loop's worst lateness "
            "between sending the request and the last stamp).",
            ("probe_job",),
            buckets=SELF_DELAY_BUCKETS_S,
            registry=r,
        )
        self.tokens = LeanCounter(
            "ttft_monitor_tokens_total",
            "Tokens the probes spent, warm-ups included, as the servers reported them, by kind: `input` (prompt "
            "tokens not served from the cache), `cached` (prompt tokens from the cache), `output` (visible "
            "answer), `reasoning` (hidden thinking, estimated from the stream where the API does not count it). "
            "The kinds do not overlap.",
            ("target", "location", "probe_job", "kind"),
            registry=series_registry,
        )
        self.cost = LeanCounter(
            "ttft_monitor_estimated_cost_total",
            "What the probes cost, warm-ups included, at the target's `prices` (per million tokens of each "
            "kind), in `currency`; targets without prices are not counted.",
            ("target", "location", "probe_job", "currency"),
            registry=series_registry,
        )
        self.job_budget_action = Gauge(
            "ttft_monitor_job_budget_action",
            "What a crossed budget holds the probe job to (its `action`): 0 nothing, 1 reduced (1 round, no "
            "warm-up), 2 paused; until the budget's period ends.",
            ("probe_job",),
            registry=r,
        )
        self.budget_course = Gauge(
            "ttft_monitor_budget_course_ratio",
            "Where each `budget` is heading at the rate the last hour spent: the period's projected tokens or "
            "cost over the limit (the larger); above 1 it is on course to exceed, and one notification goes out "
            "per budget and period. `budget` is its key under `budget:` (`total`, `jobs.NAME`, `providers.NAME`).",
            ("budget", "per"),
            registry=r,
        )
        self.slo_probes = LeanCounter(
            "ttft_monitor_slo_probes_total",
            "Probes of targets with a per-probe TTFT objective (`slo.ttft_ms`), failed ones included.",
            ("target", "prompt", "location", "probe_job"),
            registry=series_registry,
        )
        self.slo_good = LeanCounter(
            "ttft_monitor_slo_good_probes_total",
            "Probes that succeeded within their target's `slo.ttft_ms`.",
            ("target", "prompt", "location", "probe_job"),
            registry=series_registry,
        )
        self.slo_objective = LeanGauge(
            "ttft_monitor_slo_objective_ratio",
            "Share of probes that should be good (`slo.objective`); 1 minus it is the error budget.",
            ("target",),
            registry=series_registry,
        )
        self.slo_threshold = LeanGauge(
            "ttft_monitor_slo_ttft_threshold_seconds",
            "The per-probe TTFT objective (`slo.ttft_ms`).",
            ("target",),
            registry=series_registry,
        )
        self.job_last_run = Gauge(
            "ttft_monitor_job_last_run_timestamp_seconds",
            "Unix time the probe job last finished.",
            ("probe_job",),
            registry=r,
        )
        self.job_interval = Gauge(
            "ttft_monitor_job_interval_seconds",
            "Seconds between the probe job's scheduled runs, for staleness alerts.",
            ("probe_job",),
            registry=r,
        )
        self.job_duration = Gauge(
            "ttft_monitor_job_duration_seconds", "How long the probe job's last run took.", ("probe_job",), registry=r
        )
        self.job_runs = Counter(
            "ttft_monitor_job_runs_total",
            "Probe job runs by result (ok, failed, error, skipped_claimed, skipped_budget: a budget with "
            "`action: pause` holds the job).",
            ("probe_job", "result"),
            registry=r,
        )
        self.scheduler_missed = Counter(
            "ttft_monitor_scheduler_missed_runs_total",
            "Probe job ticks the scheduler did not start: misfired past the grace time, coalesced into a later "
            "run after a stall, or skipped while the previous run was still running.",
            ("probe_job", "reason"),
            registry=r,
        )
        self.detection_skipped_runs = Counter(
            "ttft_monitor_detection_skipped_runs_total",
            "Stored runs the detector did not evaluate because their batch's detection budget was spent "
            "(a job of thousands of series on a slow database); each series' next run is evaluated.",
            ("probe_job",),
            registry=r,
        )
        self.clock_steps = Counter(
            "ttft_monitor_clock_steps_total",
            "Steps of the wall clock against the monotonic clock (2 s or more), by direction; the schedule "
            "is re-armed from the new time at each.",
            ("direction",),
            registry=r,
        )
        for direction in ("forward", "backward"):
            self.clock_steps.labels(direction)
        self.loop_lag = Histogram(
            "ttft_monitor_event_loop_lag_seconds",
            "How late the event loop runs a timer: probe stamps lag too.",
            buckets=SELF_DELAY_BUCKETS_S,
            registry=r,
        )
        self.spool_records = Gauge(
            "ttft_monitor_spool_records",
            "Runs (with their samples) waiting in the local spool for the database.",
            registry=r,
        )
        self.spool_bytes = Gauge("ttft_monitor_spool_bytes", "Size of the local spool.", registry=r)
        self.baseline = LeanGauge(
            "ttft_monitor_baseline_ttft_seconds",
            "The detector's TTFT baseline for the series, as of its last evaluated run.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.baseline_low = LeanGauge(
            "ttft_monitor_baseline_band_low_seconds",
            "Lower edge of the baseline's normal band: baseline / ticket.ratio.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.baseline_high = LeanGauge(
            "ttft_monitor_baseline_band_high_seconds",
            "Upper edge of the normal band: above max(baseline x ticket.ratio, baseline + ticket.min_delta_ms) "
            "a run counts towards a ticket.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.run_median = LeanGauge(
            "ttft_monitor_run_ttft_median_seconds",
            "Median TTFT of the series' last evaluated run.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.run_ratio = LeanGauge(
            "ttft_monitor_run_ttft_ratio",
            "The last evaluated run's median TTFT divided by the baseline.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.cache_speedup = LeanGauge(
            "ttft_monitor_cache_speedup_ratio",
            "For a `cache: both` prompt: the last run's median cold (busted) TTFT over its median warm TTFT; "
            "`prompt` is the busted prompt's name.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.cache_cached_share = LeanGauge(
            "ttft_monitor_cache_cached_share_ratio",
            "For a `cache: both` prompt: the share of the warm probes' prompt tokens the server reported "
            "served from its prefix cache in the last run (absent when the API reports no cached tokens).",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.cache_state = LeanGauge(
            "ttft_monitor_cache_stopped_state",
            "For a `cache: both` prompt: 1 while a `cache_stopped` incident is open, else 0.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.regression_state = LeanGauge(
            "ttft_monitor_regression_state",
            "Open regression per series: 0 none, 1 ticket, 2 page.",
            DETECTOR_LABELS,
            registry=series_registry,
        )
        self.database_up = Gauge(
            "ttft_monitor_database_up", "1 when the last database operation succeeded.", registry=r
        )

    def _distribution(
        self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry | None
    ) -> Histogram | Summary:
        """A histogram with `buckets`, or (`per_series: summary`) a summary without quantiles: the same
        `_sum` and `_count` under the same names, in 2 series instead of len(buckets) + 3."""
        if self.per_series == "summary":
            return LeanSummary(name, documentation, PROBE_LABELS, registry=registry)
        return LeanHistogram(name, documentation, PROBE_LABELS, buckets=buckets, registry=registry)

    def shift_job_last_run(self, step_s: float, *, now: float) -> None:
        """Move the last-run times by a wall-clock step, never past `now`: after a step back, a time
        taken before it would lie in the future and keep a staleness alert quiet for the step's length."""
        for family in self.job_last_run.collect():
            for sample in family.samples:
                self.job_last_run.labels(**sample.labels).set(min(sample.value + step_s, now))

    def start_job_series(self, probe_job: str) -> None:
        """Create the job's counters at zero."""
        for result in JOB_RESULTS:
            self.job_runs.labels(probe_job, result)
        self.job_budget_action.labels(probe_job)  # at 0 until a budget holds the job; never reset here
        for reason in MISSED_REASONS:
            self.scheduler_missed.labels(probe_job, reason)

    def observe_run(self, *, probe_job: str, intended_at: datetime, samples: Sequence[Sample]) -> None:
        """A run has ended: every sample it took is in `samples` (warm-ups included). Prometheus keeps
        nothing per run here (job_* gauges are set by the pipeline); telemetry may (a run's span)."""
        if self.telemetry is not None:
            self.telemetry.observe_run(probe_job=probe_job, intended_at=intended_at, samples=samples)

    def observe_sample(
        self,
        sample: Sample,
        *,
        provider: str,
        probe_job: str = "adhoc",
        slo_ttft_ms: float | None = None,
        slo_objective: float | None = None,
        prices: Prices | None = None,
    ) -> None:
        self._count_spend(sample, probe_job, prices)
        if sample.warmup:
            return
        if self.telemetry is not None:
            self.telemetry.observe_sample(sample, provider=provider, probe_job=probe_job)
        if sample.self_delay_ms is not None:
            self.self_delay.labels(probe_job).observe(sample.self_delay_ms / 1000)
        if self.per_series == "off":
            return
        labels = (sample.target, sample.model, provider, sample.prompt, self.location, probe_job)
        short = (sample.target, sample.prompt, self.location, probe_job)
        ok = sample.ok and sample.ttft_ms is not None
        disturbed = self.disturbed.labels(*short, "ok", "none")  # exists at zero from the first probe
        if sample.disturbed:
            # No evidence about the target: kept out of what dashboards and alert rules read.
            if not ok:
                error = sample.error.value if sample.error is not None else "unknown"
                disturbed = self.disturbed.labels(*short, "error", error)
            disturbed.inc()
            return
        if ok and sample.ttft_ms is not None:
            seconds = sample.ttft_ms / 1000
            self.ttft.labels(*labels).observe(seconds)
            self.ttft_last.labels(*labels).set(seconds)
            if sample.ttfa_ms is not None:
                self.ttfa.labels(*labels).observe(sample.ttfa_ms / 1000)
            if sample.ttfb_ms is not None:
                self.ttfb.labels(*labels).set(sample.ttfb_ms / 1000)
            if sample.setup_ms is not None:
                self.setup.labels(*labels).set(sample.setup_ms / 1000)
            if sample.decode_tps is not None:
                self.decode_rate.labels(*labels).set(sample.decode_tps)
            self.probes.labels(*short, "ok", "none").inc()
        else:
            error = sample.error.value if sample.error is not None else "unknown"
            self.probes.labels(*short, "error", error).inc()
        if slo_ttft_ms is not None:
            self.slo_threshold.labels(sample.target).set(slo_ttft_ms / 1000)
            if slo_objective is not None:
                self.slo_objective.labels(sample.target).set(slo_objective)
            self.slo_probes.labels(*short).inc()
            good = self.slo_good.labels(*short)
            if ok and sample.ttft_ms is not None and sample.ttft_ms <= slo_ttft_ms:
                good.inc()
            else:
                good.inc(0)  # the series exists from the first probe, so the ratio is defined

    def _count_spend(self, sample: Sample, probe_job: str, prices: Prices | None) -> None:
        # Every request is paid for: warm-ups, disturbed and failed ones too.
        if self.per_series == "off":  # labelled by target: not registered in that mode
            return
        tokens = sample_tokens(sample)
        counts = (tokens.input - tokens.cached, tokens.cached, tokens.output, tokens.reasoning)
        tokens_of = self.tokens.labels  # four look-ups a sample, every sample: no dict made for them
        for kind, count in zip(TOKEN_KINDS, counts, strict=True):
            tokens_of(sample.target, self.location, probe_job, kind).inc(max(count, 0.0))
        if prices is not None:
            self.cost.labels(sample.target, self.location, probe_job, prices.currency).inc(cost_of(tokens, prices))

    def observe_regression_state(self, series: Sequence[str], level: int) -> None:
        """Open regression per series (0 none, 1 ticket, 2 page)."""
        if self.per_series != "off":
            self.regression_state.labels(*series).set(level)
        if self.telemetry is not None:
            self.telemetry.observe_regression_state(series, level)

    def observe_incident(self, reading: IncidentReading) -> None:
        """An incident opened, resolved, ...: no Prometheus series (the gauges above carry the state), but a
        log record for telemetry that takes them."""
        if self.telemetry is not None:
            self.telemetry.observe_incident(reading)

    def observe_baseline(
        self,
        series: Sequence[str],
        *,
        baseline_ms: float | None,
        run_median_ms: float | None,
        ticket_ratio: float,
        ticket_min_delta_ms: float,
    ) -> None:
        """The detector's view of one series after an evaluated run (`series`: target, prompt, location).

        Without a baseline (too little history) the baseline, band and ratio series are removed rather
        than left at an old value a dashboard would draw as current.
        """
        if self.telemetry is not None:
            self.telemetry.observe_baseline(series, baseline_ms=baseline_ms, run_median_ms=run_median_ms)
        if self.per_series == "off":
            return
        if run_median_ms is not None:
            self.run_median.labels(*series).set(run_median_ms / 1000)
        derived = (self.baseline, self.baseline_low, self.baseline_high, self.run_ratio)
        if baseline_ms is None:
            for gauge in derived:
                with contextlib.suppress(KeyError):
                    gauge.remove(*series)
            return
        low, high = baseline_band_ms(baseline_ms, ticket_ratio=ticket_ratio, ticket_min_delta_ms=ticket_min_delta_ms)
        self.baseline.labels(*series).set(baseline_ms / 1000)
        self.baseline_low.labels(*series).set(low / 1000)
        self.baseline_high.labels(*series).set(high / 1000)
        if run_median_ms is not None:
            self.run_ratio.labels(*series).set(run_median_ms / baseline_ms)
        else:
            with contextlib.suppress(KeyError):
                self.run_ratio.remove(*series)

    def observe_cache(
        self, series: Sequence[str], *, speedup: float | None, cached_share: float | None, stopped: bool
    ) -> None:
        """A `cache: both` pair after its latest run (`series`: target, busted prompt, location); a figure
        the run did not give is removed, not left at an old value."""
        if self.per_series == "off":
            return
        for gauge, value in ((self.cache_speedup, speedup), (self.cache_cached_share, cached_share)):
            if value is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(*series)
            else:
                gauge.labels(*series).set(value)
        self.cache_state.labels(*series).set(1 if stopped else 0)

    def forget_unconfigured(self, config: Config) -> int:
        """After a reload: remove every series of a job, target, model or prompt the config no longer has,
        and return how many. Left in place they would be exported at their last values for as long as the
        process runs, and the shipped alerts read them: a removed or renamed job's last run grows old
        (`TTFTMonitorJobStale` pages three intervals later, for good), a removed target's regression state
        stays at 2 (`TTFTRegressionPage` never resolves). `probe --store`'s `adhoc` series are left alone."""
        jobs = job_series(config, [job.name for job in config.jobs])
        pairs = set().union(*jobs.values())
        scopes = {name: _Scope(series, {target for target, _ in series}) for name, series in jobs.items()}
        scope = _Scope(pairs, {target for target, _ in pairs})
        targets = {name: (spec.model, spec.provider) for name, spec in config.targets.items()}
        removed = 0
        # Each family's children are judged by the labels that decide, and each distinct set of them once:
        # at 6,000 probe series the families hold 150,000 children, judged one by one in 0.3 s of the loop.
        decided: dict[tuple[tuple[str, str], ...], bool] = {}
        for family in metric_objects([self]):
            names: tuple[str, ...] = getattr(family, "_labelnames", ())
            deciding = [(index, name) for index, name in enumerate(names) if name in _DECIDING_LABELS]
            if not any(name in ("probe_job", "target") for _, name in deciding):
                continue
            for values in _label_values(family):
                key = tuple((name, values[index]) for index, name in deciding)
                keep = decided.get(key)
                if keep is None:
                    keep = decided[key] = _configured(dict(key), scopes, scope, targets)
                if not keep:
                    removed += _remove(family, values)
        # A budget removed, or its period changed: its course would stay at its last ratio.
        budgets = {("total", config.budget.total.per)} if config.budget.total is not None else set()
        budgets.update((f"providers.{name}", limit.per) for name, limit in config.budget.providers.items())
        budgets.update((f"jobs.{name}", limit.per) for name, limit in config.budget.jobs.items())
        for values in _label_values(self.budget_course):
            if tuple(values) not in budgets:
                removed += _remove(self.budget_course, values)
        # A target kept without its per-probe SLO: its objective, threshold and counts are no longer kept.
        without_slo = {name for name, spec in config.targets.items() if spec.slo.ttft_ms is None}
        for slo_family in (self.slo_threshold, self.slo_objective, self.slo_probes, self.slo_good):
            at = slo_family._labelnames.index("target")
            for values in _label_values(slo_family):
                if values[at] in without_slo:
                    removed += _remove(slo_family, values)
        return removed

    def forget_cache(self, series: Sequence[str]) -> None:
        """A pair no longer probed (its prompt's `cache: both` was reloaded away): its gauges go, not left
        at their last value."""
        for gauge in (self.cache_speedup, self.cache_cached_share, self.cache_state):
            with contextlib.suppress(KeyError):
                gauge.remove(*series)


def _remove(family: object, values: tuple[str, ...]) -> int:
    """Remove a metric's child: 1, or 0 when it was removed meanwhile."""
    try:
        family.remove(*values)  # type: ignore[attr-defined]
    except KeyError:
        return 0
    return 1


def _label_values(family: object) -> list[tuple[str, ...]]:
    """The label values of each child of a prometheus_client metric (kept in `_metrics`, with no public
    accessor: monitor.metrics.exposition reads them the same way)."""
    lock = getattr(family, "_lock", None)
    children = getattr(family, "_metrics", None)
    if lock is None or children is None:
        return []
    with lock:
        return list(children)


# The labels `_configured` reads.
_DECIDING_LABELS = frozenset({"probe_job", "target", "model", "provider", "prompt"})


@dataclass(frozen=True, slots=True)
class _Scope:
    """The (target, prompt) series of a job, or of every job, and their targets."""

    series: set[tuple[str, str]]
    targets: set[str]


def _configured(
    labels: dict[str, str], jobs: dict[str, _Scope], every_job: _Scope, targets: dict[str, tuple[str, str]]
) -> bool:
    """Whether a series with these labels is one the config still measures."""
    job = labels.get("probe_job")
    if job == "adhoc":
        return True
    if job is not None and job not in jobs:
        return False
    target = labels.get("target")
    if target is None:
        return True  # the job's own series
    if target not in targets:
        return False
    model, provider = targets[target]
    if labels.get("model", model) != model or labels.get("provider", provider) != provider:
        return False
    scope = jobs[job] if job is not None else every_job
    prompt = labels.get("prompt")
    return (target, prompt) in scope.series if prompt is not None else target in scope.targets


def baseline_band_ms(baseline_ms: float, *, ticket_ratio: float, ticket_min_delta_ms: float) -> tuple[float, float]:
    """(low, high): symmetric in log space below, the ticket rule's ratio and minimum delta above."""
    return baseline_ms / ticket_ratio, max(baseline_ms * ticket_ratio, baseline_ms + ticket_min_delta_ms)


def job_interval_seconds(config: Config, job_name: str) -> float | None:
    """Seconds between the job's next two scheduled runs (None for an ad-hoc run or an unknown job)."""
    job = next((j for j in config.jobs if j.name == job_name), None)
    if job is None:
        return None
    trigger = build_trigger(job.schedule, job.timezone)  # without jitter: the nominal interval
    now = datetime.now(UTC)
    first = trigger.get_next_fire_time(None, now)
    second = trigger.get_next_fire_time(first, first + timedelta(microseconds=1)) if first else None
    return max((second - first).total_seconds(), 1.0) if first and second else None


def metric_objects(owners: Iterable[object]) -> list[object]:
    """The prometheus_client metric objects held as attributes of `owners` (Metrics, AlertMetrics)."""
    from prometheus_client.metrics import MetricWrapperBase

    return [value for owner in owners for value in vars(owner).values() if isinstance(value, MetricWrapperBase)]
