"""Metric definitions. Names follow Prometheus conventions: base units, `_seconds`, `_total`.

Label sets are bounded: target, model, provider, prompt profile name, location, job, error class
(a fixed set). Never a prompt text, a request id or a server message.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from monitor import __version__
from monitor.probe.result import Sample

SERIES_LABELS = ("target", "model", "provider", "prompt", "location")
# TTFT spans 50 ms (small prompt, local GPU) to a minute (128k prompt on a busy gateway).
TTFT_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 20, 30, 60)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, location: str = "local") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.location = location
        r = self.registry
        self.info = Info("ttft_monitor", "ttft-monitor build and placement.", registry=r)
        self.info.info({"version": __version__, "location": location})
        self.ttft = Histogram(
            "ttft_monitor_ttft_seconds",
            "Time to first generated token (content, reasoning or tool call).",
            SERIES_LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.ttft_last = Gauge(
            "ttft_monitor_ttft_last_seconds", "TTFT of the most recent successful probe.", SERIES_LABELS, registry=r
        )
        self.ttfa = Histogram(
            "ttft_monitor_ttfa_seconds",
            "Time to the first visible answer token (after any reasoning).",
            SERIES_LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.decode_rate = Gauge(
            "ttft_monitor_decode_tokens_per_second",
            "Decode rate of the most recent successful probe.",
            SERIES_LABELS,
            registry=r,
        )
        self.probes = Counter(
            "ttft_monitor_probes_total",
            "Probes by outcome (ok, error) and error class (none when ok).",
            ("target", "prompt", "location", "outcome", "error_class"),
            registry=r,
        )
        self.job_last_run = Gauge(
            "ttft_monitor_job_last_run_timestamp_seconds", "Unix time the job last finished.", ("job",), registry=r
        )
        self.job_duration = Gauge(
            "ttft_monitor_job_duration_seconds", "How long the job's last run took.", ("job",), registry=r
        )
        self.job_runs = Counter(
            "ttft_monitor_job_runs_total",
            "Job runs by result (ok, failed, error, skipped_claimed).",
            ("job", "result"),
            registry=r,
        )
        self.scheduler_missed = Counter(
            "ttft_monitor_scheduler_missed_runs_total",
            "Job runs the scheduler did not start (misfired past the grace time, or still running).",
            ("job", "reason"),
            registry=r,
        )
        self.loop_lag = Histogram(
            "ttft_monitor_event_loop_lag_seconds",
            "How late the event loop runs a timer: probe stamps lag too.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        self.spool_records = Gauge(
            "ttft_monitor_spool_records", "Samples waiting in the local spool for the database.", registry=r
        )
        self.spool_bytes = Gauge("ttft_monitor_spool_bytes", "Size of the local spool.", registry=r)
        self.baseline = Gauge(
            "ttft_monitor_baseline_ttft_seconds",
            "The detector's TTFT baseline at the last incident change.",
            ("target", "prompt", "location"),
            registry=r,
        )
        self.regression_state = Gauge(
            "ttft_monitor_regression_state",
            "Open regression per series: 0 none, 1 ticket, 2 page.",
            ("target", "prompt", "location"),
            registry=r,
        )
        self.database_up = Gauge(
            "ttft_monitor_database_up", "1 when the last database operation succeeded.", registry=r
        )

    def observe_sample(self, sample: Sample, *, provider: str) -> None:
        if sample.warmup:
            return
        labels = (sample.target, sample.model, provider, sample.prompt, self.location)
        if sample.ok and sample.ttft_ms is not None:
            seconds = sample.ttft_ms / 1000
            self.ttft.labels(*labels).observe(seconds)
            self.ttft_last.labels(*labels).set(seconds)
            if sample.ttfa_ms is not None:
                self.ttfa.labels(*labels).observe(sample.ttfa_ms / 1000)
            if sample.decode_tps is not None:
                self.decode_rate.labels(*labels).set(sample.decode_tps)
            self.probes.labels(sample.target, sample.prompt, self.location, "ok", "none").inc()
        else:
            error = sample.error.value if sample.error is not None else "unknown"
            self.probes.labels(sample.target, sample.prompt, self.location, "error", error).inc()
