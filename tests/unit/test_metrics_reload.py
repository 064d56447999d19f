"""A reload forgets the metric series of jobs, targets, models and prompts the config no longer has: left in
place they are exported at their last values for as long as the process runs, and the shipped alerts read
them (a renamed job's last run grows old and `TTFTMonitorJobStale` pages; a removed target's regression state
stays at 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.metrics.definitions import Metrics
from monitor.metrics.exposition import render
from monitor.probe.result import Sample
from tests.support.config import build_config, write_yaml


def _config(
    tmp_path: Path, *, targets: dict[str, str], jobs: list[dict[str, Any]], cached: bool = False, slo: bool = True
) -> Config:
    """`targets`: name -> model, each with the per-probe SLO `_probe` reports (`slo`: with it)."""
    specs = {name: {"model": model, **({"slo": {"ttft_ms": 500}} if slo else {})} for name, model in targets.items()}
    data = build_config("http://127.0.0.1:9/v1", targets=specs, prompts={"short": 128, "long": 512}, jobs=jobs)
    if cached:
        data["prompts"]["long"]["cache"] = "both"
    return load_config(write_yaml(tmp_path / "config.yaml", data), environ={})


def _job(name: str, targets: list[str], prompts: list[str]) -> dict[str, Any]:
    return {"name": name, "schedule": "*/5 * * * *", "targets": targets, "prompts": prompts}


def _probe(metrics: Metrics, job: str, target: str, model: str, prompt: str) -> None:
    sample = Sample(target=target, model=model, api="openai-chat", prompt=prompt, round=0, ttft_ms=120.0, ttfa_ms=130.0)
    metrics.observe_sample(sample, provider="sim", probe_job=job, slo_ttft_ms=500, slo_objective=0.99)
    series = (target, prompt, "local")
    metrics.observe_baseline(series, baseline_ms=100, run_median_ms=250, ticket_ratio=1.12, ticket_min_delta_ms=30)
    metrics.observe_regression_state(series, 2)
    metrics.job_last_run.labels(job).set(1.8e9)
    metrics.job_interval.labels(job).set(300)
    metrics.start_job_series(job)


def _lines(metrics: Metrics, needle: str) -> list[str]:
    return [line for line in render(metrics.registry).decode().splitlines() if needle in line]


def test_a_reload_forgets_the_series_of_removed_jobs_targets_and_prompts(tmp_path: Path) -> None:
    metrics = Metrics()
    _probe(metrics, "main", "a", "m-a", "short")
    _probe(metrics, "main", "a", "m-a", "long")
    _probe(metrics, "main", "b", "m-b", "short")
    _probe(metrics, "old", "a", "m-a", "short")
    adhoc = Sample(target="a", model="m-a", api="openai-chat", prompt="x", round=0, ttft_ms=1.0)
    metrics.observe_sample(adhoc, provider="sim")  # `probe --store`
    # The new config: job `old` renamed away, target `b` gone, prompt `long` left out of `main`.
    config = _config(tmp_path, targets={"a": "m-a"}, jobs=[_job("main", ["a"], ["short"])])

    removed = metrics.forget_unconfigured(config)

    assert removed > 0
    assert not _lines(metrics, 'probe_job="old"'), _lines(metrics, 'probe_job="old"')
    assert not _lines(metrics, 'target="b"')
    assert not _lines(metrics, 'prompt="long"')
    kept = _lines(metrics, 'target="a"')
    assert 'ttft_monitor_regression_state{location="local",prompt="short",target="a"} 2.0' in kept
    assert any(line.startswith("ttft_monitor_ttft_last_seconds{") and 'probe_job="main"' in line for line in kept)
    assert _lines(metrics, 'ttft_monitor_job_last_run_timestamp_seconds{probe_job="main"}')
    assert _lines(metrics, 'probe_job="adhoc"'), "probe --store's series are not the schedule's to forget"
    assert metrics.forget_unconfigured(config) == 0  # nothing left to forget


def test_a_target_pointed_at_another_model_forgets_the_old_models_series_and_keeps_its_detector_state(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    _probe(metrics, "main", "a", "m-1", "short")
    config = _config(tmp_path, targets={"a": "m-2"}, jobs=[_job("main", ["a"], ["short"])])

    metrics.forget_unconfigured(config)

    assert not _lines(metrics, 'model="m-1"')
    # The detector's series is the target's, whatever model it names (a model change starts a new epoch).
    assert _lines(metrics, 'ttft_monitor_regression_state{location="local",prompt="short",target="a"}')


def test_a_cache_both_prompts_warm_twin_is_a_configured_series(tmp_path: Path) -> None:
    metrics = Metrics()
    _probe(metrics, "main", "a", "m-a", "long")
    _probe(metrics, "main", "a", "m-a", "long.warm")
    config = _config(tmp_path, targets={"a": "m-a"}, jobs=[_job("main", ["a"], ["long"])], cached=True)

    assert metrics.forget_unconfigured(config) == 0
    assert _lines(metrics, 'prompt="long.warm"')


def test_a_target_kept_without_its_slo_loses_its_slo_series_and_keeps_the_rest(tmp_path: Path) -> None:
    metrics = Metrics()
    _probe(metrics, "main", "a", "m-a", "short")  # with a 500 ms SLO at 0.99
    assert _lines(metrics, "ttft_monitor_slo_objective_ratio{")
    jobs = [_job("main", ["a"], ["short"])]

    metrics.forget_unconfigured(_config(tmp_path, targets={"a": "m-a"}, jobs=jobs, slo=False))

    assert not [line for line in _lines(metrics, 'target="a"') if "_slo_" in line]
    assert _lines(metrics, "ttft_monitor_ttft_last_seconds{")
    _probe(metrics, "main", "a", "m-a", "short")  # its SLO back in the config: kept
    assert metrics.forget_unconfigured(_config(tmp_path, targets={"a": "m-a"}, jobs=jobs)) == 0
    assert _lines(metrics, "ttft_monitor_slo_objective_ratio{")


def test_a_removed_budget_or_one_whose_period_changed_loses_its_course(tmp_path: Path) -> None:
    metrics = Metrics()
    for budget, per in (("total", "month"), ("jobs.main", "day"), ("providers.sim", "month"), ("jobs.gone", "day")):
        metrics.budget_course.labels(budget, per).set(1.4)
    config = _config(tmp_path, targets={"a": "m-a"}, jobs=[_job("main", ["a"], ["short"])])
    config = config.model_copy(
        update={
            "budget": config.budget.model_validate(
                {"total": {"tokens": 1e9, "per": "month"}, "jobs": {"main": {"tokens": 1e6, "per": "month"}}}
            )
        }
    )

    metrics.forget_unconfigured(config)

    courses = _lines(metrics, "ttft_monitor_budget_course_ratio{")
    assert courses == ['ttft_monitor_budget_course_ratio{budget="total",per="month"} 1.4'], courses
