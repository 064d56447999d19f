"""The simulator's own Prometheus metrics, under vLLM's names, so `server_metrics_url` can be tested.

The simulator has no request queue: every request is scheduled on arrival, so its queue time is 0,
nothing ever waits, and its prefill time is its time to first token.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from monitor.sim.cache import PrefixCache

# vLLM's buckets for TTFT (seconds), cut to the range the simulator serves.
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)


class SimMetrics:
    """One registry per simulator (several simulators may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        label = ["model_name"]
        r = self.registry
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", label, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests being generated.", label, registry=r)
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc", "Fraction of the prefix cache in use.", label, registry=r
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", label, registry=r
        )
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up.", label, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", label, buckets=BUCKETS, registry=r
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Time waiting to be scheduled.", label, buckets=BUCKETS, registry=r
        )
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "Time in prefill.", label, buckets=BUCKETS, registry=r
        )

    def arrived(self, model: str, *, prompt_tokens: int, cached_tokens: int) -> None:
        self.waiting.labels(model).set(0)
        self.running.labels(model).inc()
        self.prefix_queries.labels(model).inc(prompt_tokens)
        self.prefix_hits.labels(model).inc(cached_tokens)

    def first_token(self, model: str, seconds: float) -> None:
        self.ttft.labels(model).observe(seconds)
        self.queue.labels(model).observe(0.0)
        self.prefill.labels(model).observe(seconds)

    def finished(self, model: str) -> None:
        self.running.labels(model).dec()

    def page(self, models: Iterable[str], caches: dict[str, PrefixCache]) -> bytes:
        for model in models:  # as vLLM does: every served model's series exist from the start
            for metric in (self.waiting, self.running, self.prefix_hits, self.prefix_queries):
                metric.labels(model)
            for histogram in (self.ttft, self.queue, self.prefill):
                histogram.labels(model)
        for model, cache in caches.items():
            self.kv_cache_usage.labels(model).set(len(cache) / cache.capacity_blocks if cache.capacity_blocks else 0.0)
        return generate_latest(self.registry)
