"""Generates the metrics reference in docs/metrics.md from the metric definitions.

    python -m monitor.metrics.docs --write docs/metrics.md
    python -m monitor.metrics.docs --check docs/metrics.md   # exit 1 when stale (a test does this too)

Only the text between the BEGIN and END markers is generated; the prose around it is kept.
"""

from __future__ import annotations

from typing import Any

from monitor.alert.metrics import AlertMetrics
from monitor.config.models import DEFAULT_TTFT_BUCKETS_S
from monitor.docgen import regenerate
from monitor.metrics.definitions import PER_SERIES_MODES, Metrics, MonitorRegistry, PerSeries, metric_objects
from monitor.metrics.exposition import render
from monitor.otel.counters import ExportCounters
from monitor.probe.result import Sample

BEGIN = "<!-- BEGIN GENERATED METRICS REFERENCE -->"
END = "<!-- END GENERATED METRICS REFERENCE -->"
# What each type exposes, as Prometheus sees it (no `_created`: the registry leaves it out).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}


def documented_metrics() -> list[dict[str, Any]]:
    """Every metric the monitor defines: exposed name, type, labels, help, and the names it exposes."""
    metrics = Metrics(MonitorRegistry())
    alert_metrics = AlertMetrics(metrics.registry)
    export_counters = ExportCounters(metrics.registry)
    out = []
    # prometheus_client keeps these on its metric objects; it has no public accessor for label names.
    for wrapper in metric_objects([metrics, alert_metrics, export_counters]):
        kind = wrapper._type  # type: ignore[attr-defined]
        base = wrapper._name  # type: ignore[attr-defined]
        exposed = [base + suffix for suffix in SUFFIXES[kind]]
        labels = list(wrapper._labelnames)  # type: ignore[attr-defined]
        if kind == "info":
            labels = ["version", "location"]
        out.append(
            {
                "name": exposed[0] if kind != "histogram" else base,
                "type": kind,
                "labels": labels,
                "help": wrapper._documentation,  # type: ignore[attr-defined]
                "exposed": exposed,
            }
        )
    return sorted(out, key=lambda m: m["name"])


def series_per_probe_series(mode: PerSeries) -> int:
    """The series `/metrics` holds for one probe series (one target, prompt, location and job) that has
    succeeded, has a target SLO and detector state, counted from a rendering (failures add one
    `ttft_monitor_probes_total` series per error class seen)."""
    metrics = Metrics(MonitorRegistry(), location="here", per_series=mode)
    probe = Sample(target="t", model="m", api="a", prompt="p", round=0, ttft_ms=1, ttfa_ms=1, ttfb_ms=1, setup_ms=0)
    probe.decode_tps = 1
    metrics.observe_sample(probe, provider="x", probe_job="j", slo_ttft_ms=1, slo_objective=0.9)
    series = ("t", "p", "here")
    metrics.observe_baseline(series, baseline_ms=1, run_median_ms=1, ticket_ratio=1.5, ticket_min_delta_ms=1)
    metrics.observe_regression_state(series, 0)
    return sum(1 for line in render(metrics.registry).decode().splitlines() if 'target="t"' in line)


def render_reference() -> str:
    lines = [
        BEGIN,
        "",
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for metric in documented_metrics():
        labels = ", ".join(f"`{label}`" for label in metric["labels"]) or "none"
        lines.append(f"| `{metric['name']}` | {metric['type']} | {labels} | {metric['help']} |")
    bounds = ", ".join(f"{b:g}" for b in DEFAULT_TTFT_BUCKETS_S)
    lines += [
        "",
        f"Default TTFT and TTFA histogram bucket bounds (`metrics.ttft_buckets_s`), in seconds: {bounds}.",
        "",
        "Series per probe series (one target, prompt, location and job; a target SLO and detector state "
        "included: four fewer without an SLO, one more per error class seen), by `metrics.per_series`, with "
        "the default buckets:",
        "",
        "| `metrics.per_series` | series per probe series |",
        "| --- | --- |",
        *(f"| `{mode}` | {series_per_probe_series(mode)} |" for mode in PER_SERIES_MODES),
        "",
        END,
    ]
    return "\n".join(lines)


def replace_reference(document: str, reference: str) -> str:
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no {BEGIN} ... {END} section")
    return document[:start] + reference + document[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    return regenerate(
        argv,
        prog="python -m monitor.metrics.docs",
        description=__doc__.splitlines()[0],
        update=lambda document: replace_reference(document, render_reference()),
    )


if __name__ == "__main__":
    raise SystemExit(main())
