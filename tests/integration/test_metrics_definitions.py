"""The metric definitions: labels Prometheus will not rename, no `_created` series, SLO counters,
configurable buckets, and the detector's baseline exported after every evaluated run."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.alert.metrics import AlertMetrics
from monitor.config.models import DEFAULT_TTFT_BUCKETS_S, Config
from monitor.detect.service import DetectionService
from monitor.metrics.definitions import Metrics, baseline_band_ms, job_interval_seconds, metric_objects
from monitor.probe.result import ErrorClass
from monitor.store.repository import Repository
from tests.support.store_fixtures import T0, Backend, make_batch, make_samples

pytest_plugins = ("tests.support.store_fixtures",)


def families(registry: CollectorRegistry) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = generate_latest(registry).decode()
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def observed(metrics: Metrics, *, slo_ttft_ms: float | None = None, errors: dict | None = None) -> Metrics:
    for sample in make_samples("qwen3-8b", "short", rounds=5, warmup=1, errors=errors):
        metrics.observe_sample(
            sample, provider="vllm", probe_job="every-5m", slo_ttft_ms=slo_ttft_ms, slo_objective=0.99
        )
    return metrics


def test_no_metric_has_a_label_named_job_and_probe_metrics_carry_probe_job() -> None:
    metrics = observed(Metrics(location="lab"))
    AlertMetrics(metrics.registry)
    for wrapper in metric_objects([metrics]):
        assert "job" not in wrapper._labelnames, wrapper._name  # type: ignore[attr-defined]
    scraped = families(metrics.registry)
    for name in ("ttft_monitor_ttft_seconds", "ttft_monitor_probes", "ttft_monitor_ttft_last_seconds"):
        assert scraped[name], name
        assert all(labels.get("probe_job") == "every-5m" for _, labels, _ in scraped[name]), name


def test_created_series_are_left_out_of_this_registry_only() -> None:
    metrics = observed(Metrics(location="lab"))
    text = generate_latest(metrics.registry).decode()
    assert "ttft_monitor_probes_total{" in text
    assert "_created" not in text
    # Another registry in the same process keeps them: the switch is not global.
    plain = CollectorRegistry()
    Counter("other_things_total", "Other things.", registry=plain).inc()
    assert "other_things_created" in generate_latest(plain).decode()


def test_the_slo_counters_count_probes_within_the_objective_and_failures_as_bad() -> None:
    samples = make_samples("qwen3-8b", "short", rounds=6, warmup=1, errors={3: ErrorClass.SERVER_ERROR})
    measured = [s for s in samples if not s.warmup]
    threshold = sorted(s.ttft_ms for s in measured if s.ttft_ms is not None)[2]  # three ok probes within
    metrics = Metrics(location="lab")
    for sample in samples:
        metrics.observe_sample(
            sample, provider="vllm", probe_job="every-5m", slo_ttft_ms=threshold, slo_objective=0.995
        )
    scraped = families(metrics.registry)
    (total,) = [v for n, _, v in scraped["ttft_monitor_slo_probes"] if n.endswith("_total")]
    (good,) = [v for n, _, v in scraped["ttft_monitor_slo_good_probes"] if n.endswith("_total")]
    assert total == len(measured) == 6
    assert good == 3
    assert scraped["ttft_monitor_slo_objective_ratio"][0][2] == 0.995
    assert scraped["ttft_monitor_slo_ttft_threshold_seconds"][0][2] == pytest.approx(threshold / 1000)


def test_disturbed_probes_are_counted_apart_from_the_evidence_alert_rules_read() -> None:
    samples = make_samples("qwen3-8b", "short", rounds=4, warmup=1)
    samples[4].error, samples[4].ttft_ms = ErrorClass.TIMEOUT_FIRST_TOKEN, None
    for sample in samples:
        sample.self_delay_ms = 0.3
    samples[2].self_delay_ms, samples[2].disturbed = 80.0, True  # a slow probe: the monitor's own stall
    samples[2].ttft_ms = 9000.0
    samples[4].self_delay_ms, samples[4].disturbed = 1500.0, True  # a timeout during a 1.5 s stall
    metrics = Metrics(location="lab")
    for sample in samples:
        metrics.observe_sample(sample, provider="vllm", probe_job="every-5m", slo_ttft_ms=5000, slo_objective=0.99)
    scraped = families(metrics.registry)

    def total(name: str, **labels: str) -> float:
        return sum(v for n, got, v in scraped[name] if n.endswith("_total") and labels.items() <= got.items())

    assert total("ttft_monitor_disturbed_samples", outcome="ok") == 1
    assert total("ttft_monitor_disturbed_samples", outcome="error", error_class="timeout_first_token") == 1
    assert total("ttft_monitor_probes") == 2  # the two undisturbed measured probes, both ok
    assert total("ttft_monitor_slo_probes") == total("ttft_monitor_slo_good_probes") == 2
    (count,) = [v for n, _, v in scraped["ttft_monitor_ttft_seconds"] if n.endswith("_count")]
    assert count == 2
    delays = {labels["le"]: v for n, labels, v in scraped["ttft_monitor_probe_self_delay_seconds"] if "le" in labels}
    assert (delays["0.0005"], delays["0.1"], delays["+Inf"]) == (2, 3, 4)


def test_a_series_disturbed_counter_exists_at_zero_from_its_first_probe() -> None:
    scraped = families(observed(Metrics(location="lab")).registry)
    values = [v for n, _, v in scraped["ttft_monitor_disturbed_samples"] if n.endswith("_total")]
    assert values == [0]


def test_targets_without_an_slo_have_no_slo_series() -> None:
    scraped = families(observed(Metrics(location="lab")).registry)
    assert not scraped.get("ttft_monitor_slo_probes")
    assert not scraped.get("ttft_monitor_slo_objective_ratio")


def test_the_good_counter_exists_at_zero_when_every_probe_misses() -> None:
    scraped = families(observed(Metrics(location="lab"), slo_ttft_ms=0.001).registry)
    (good,) = [v for n, _, v in scraped["ttft_monitor_slo_good_probes"] if n.endswith("_total")]
    assert good == 0


def test_default_buckets_span_10_ms_to_120_s_and_can_be_configured() -> None:
    assert DEFAULT_TTFT_BUCKETS_S[0] == 0.01
    assert DEFAULT_TTFT_BUCKETS_S[-1] == 120
    assert Config().metrics.ttft_buckets_s == list(DEFAULT_TTFT_BUCKETS_S)
    config = Config.model_validate({"metrics": {"ttft_buckets_s": [0.05, 0.5, 5]}})
    metrics = observed(Metrics(location="lab", ttft_buckets=config.metrics.ttft_buckets_s))
    bounds = {
        labels["le"] for name, labels, _ in families(metrics.registry)["ttft_monitor_ttft_seconds"] if "le" in labels
    }
    assert bounds == {"0.05", "0.5", "5.0", "+Inf"}


@pytest.mark.parametrize("bounds", [[0.5, 0.1], [0.1, 0.1], [0, 1], [-1, 1]])
def test_bucket_bounds_must_be_positive_and_increasing(bounds: list[float]) -> None:
    with pytest.raises(ValueError, match="bucket bounds"):
        Config.model_validate({"metrics": {"ttft_buckets_s": bounds}})


def test_the_slo_objective_is_a_share_between_0_and_1() -> None:
    with pytest.raises(ValueError, match="objective"):
        Config.model_validate(
            {
                "providers": {"p": {"api": "openai-chat", "base_url": "http://127.0.0.1:1/v1"}},
                "targets": {"t": {"provider": "p", "model": "m", "slo": {"ttft_ms": 500, "objective": 1}}},
            }
        )


def test_the_job_interval_comes_from_its_schedule_without_jitter() -> None:
    config = Config.model_validate(
        {
            "providers": {"p": {"api": "openai-chat", "base_url": "http://127.0.0.1:1/v1"}},
            "targets": {"t": {"provider": "p", "model": "m"}},
            "prompts": {"short": {"tokens": 128}},
            "jobs": [{"name": "j", "schedule": "*/5 * * * *", "jitter_s": 30, "targets": ["t"], "prompts": ["short"]}],
        }
    )
    assert job_interval_seconds(config, "j") == 300
    assert job_interval_seconds(config, "adhoc") is None


def test_the_band_is_the_ticket_rules_edge_above_and_its_mirror_below() -> None:
    assert baseline_band_ms(400, ticket_ratio=1.12, ticket_min_delta_ms=30) == pytest.approx((400 / 1.12, 448))
    # Small baselines: the minimum delta sets the upper edge.
    assert baseline_band_ms(100, ticket_ratio=1.12, ticket_min_delta_ms=30) == pytest.approx((100 / 1.12, 130))


async def test_the_baseline_band_median_and_ratio_are_exported_after_every_evaluated_run(backend: Backend) -> None:
    config = Config.model_validate({"detection": {"min_history_runs": 12, "trailing_runs": 12}})
    engine = backend.engine()
    try:
        repository = Repository(engine)
        metrics = Metrics(location="test-lab")
        service = DetectionService(engine, repository, config, outbox=None, metrics=metrics)
        labels = {"target": "qwen3-8b", "prompt": "short", "location": "test-lab"}
        seen: list[tuple[float, float]] = []
        for index in range(30):
            batch = make_batch(T0 + index * timedelta(minutes=5), targets=("qwen3-8b",), prompts=("short",))
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
            (run, _samples) = batch[0]
            value = functools.partial(metrics.registry.get_sample_value, labels=labels)
            median = value("ttft_monitor_run_ttft_median_seconds")
            assert run.ttft_p50_ms is not None and median is not None, index  # every made run succeeds
            assert median == pytest.approx(run.ttft_p50_ms / 1000), index
            baseline = value("ttft_monitor_baseline_ttft_seconds")
            low, high = (
                value("ttft_monitor_baseline_band_low_seconds"),
                value("ttft_monitor_baseline_band_high_seconds"),
            )
            ratio = value("ttft_monitor_run_ttft_ratio")
            if baseline is None:  # too little history for a baseline: nothing stale to draw
                assert low is None and high is None and ratio is None, index
                assert not seen, f"run {index} lost the baseline"
                continue
            assert ratio == pytest.approx(median / baseline)
            assert low is not None and high is not None, index  # a baseline always has its band
            expected = baseline_band_ms(baseline * 1000, ticket_ratio=1.12, ticket_min_delta_ms=30)
            assert (low * 1000, high * 1000) == pytest.approx(expected)
            assert value("ttft_monitor_regression_state") == 0
            seen.append((baseline, median))
        # No incident ever opened, yet the gauges moved with the runs.
        assert len(seen) >= 10
        assert len({median for _, median in seen}) == len(seen)
        assert len({baseline for baseline, _ in seen}) > 1
    finally:
        await engine.dispose()


def test_tokens_are_counted_by_kind_and_priced_per_target_warm_ups_and_failures_included() -> None:
    from monitor.probe.settings import Prices

    samples = make_samples("qwen3-8b", "short", rounds=3, warmup=1, errors={2: ErrorClass.SERVER_ERROR})
    for sample in samples:
        sample.prompt_tokens, sample.cached_tokens = 1000, 200
        sample.completion_tokens, sample.reasoning_tokens = 64, 40
    metrics = Metrics(location="lab")
    prices = Prices(input=1.0, cached_input=0.5, output=4.0, reasoning=8.0, currency="EUR")
    for sample in samples:
        metrics.observe_sample(sample, provider="vllm", probe_job="every-5m", prices=prices)
    metrics.observe_sample(samples[0], provider="free", probe_job="every-5m")  # no prices: tokens only
    scraped = families(metrics.registry)
    tokens = {labels["kind"]: v for _, labels, v in scraped["ttft_monitor_tokens"]}
    # 4 priced requests (1 warm-up, one failed after its usage came) and one unpriced: 5 x each count.
    assert tokens == {"input": 5 * 800, "cached": 5 * 200, "output": 5 * 24, "reasoning": 5 * 40}
    [(_, labels, cost)] = scraped["ttft_monitor_estimated_cost"]
    assert labels == {"target": "qwen3-8b", "location": "lab", "probe_job": "every-5m", "currency": "EUR"}
    assert cost == pytest.approx(4 * (800 * 1 + 200 * 0.5 + 24 * 4 + 40 * 8) / 1e6)
