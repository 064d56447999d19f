"""The prompt cache's health rule (monitor/detect/cache_health.py) and the `cache: both` series
(monitor/config/series.py): pure code, no I/O."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.config.series import cache_pairs, series_prompts
from monitor.detect.cache_health import (
    CacheRules,
    PairRun,
    Reference,
    advance,
    describe,
    judge,
    reference_of,
    run_is_cacheless,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def runs_of(
    cold: list[float], warm: list[float], shares: list[float | None] | None = None, prompt: float = 2000
) -> list[PairRun]:
    shares = shares if shares is not None else [0.97] * len(cold)
    return [
        PairRun(
            at=T0 + timedelta(minutes=5 * i),
            cold_ms=c,
            warm_ms=w,
            warm_cached_tokens=None if s is None else s * prompt,
            warm_prompt_tokens=prompt,
        )
        for i, (c, w, s) in enumerate(zip(cold, warm, shares, strict=True))
    ]


def noisy(center: float, n: int, rng: random.Random, sigma: float = 0.15) -> list[float]:
    return [center * rng.lognormvariate(0, sigma) for _ in range(n)]


def test_a_cache_that_stops_reporting_cached_tokens_opens_after_the_window_not_on_one_run() -> None:
    rng = random.Random(1)
    healthy = runs_of(noisy(900, 24, rng), noisy(200, 24, rng))
    one_miss = healthy + runs_of([900], [880], [0.0])
    assert advance(one_miss, None)[0] is None  # one uncached run is no incident
    two = one_miss + runs_of([910], [905], [0.0])
    assert advance(two, None)[0] is None
    three = two + runs_of([905], [900], [0.0])
    action, verdict = advance(three, None)
    assert action == "open" and verdict is not None and verdict.reason == "no_cached_tokens"
    assert verdict.reference.cached_share == pytest.approx(0.97)
    assert 4.0 < (verdict.reference.speedup or 0) < 5.0 and verdict.speedup == pytest.approx(1.0, abs=0.05)
    text = describe("qwen3-8b", "long", verdict)
    assert text.startswith("prompt cache of qwen3-8b / long stopped working: warm probes found 0% of the prompt")
    assert "(97% before)" in text and "speed-up over cold 1.0x (4." in text


def test_without_cached_token_counts_the_speed_up_decides_with_significance() -> None:
    rng = random.Random(2)
    history = runs_of(noisy(900, 24, rng), noisy(300, 24, rng), [None] * 24)
    slowed = history + runs_of([900, 920, 880], [870, 900, 860], [None] * 3)
    action, verdict = advance(slowed, None)
    assert action == "open" and verdict is not None and verdict.reason == "no_speedup"
    assert verdict.z is not None and verdict.z > 3
    # A speed-up that dipped but stayed above halfway (3x -> 2.2x) is load, not a stopped cache.
    dipped = history + runs_of([900, 900, 900], [410, 400, 420], [None] * 3)
    assert advance(dipped, None)[0] is None


def test_a_prompt_the_cache_never_helped_is_not_watched() -> None:
    rng = random.Random(3)
    flat = runs_of(noisy(300, 24, rng), noisy(290, 24, rng), [0.0] * 24)
    reference = reference_of(flat)
    assert reference is not None
    assert not reference.watches_share(CacheRules()) and not reference.watches_speed(CacheRules())
    assert advance(flat + runs_of([300] * 3, [300] * 3, [0.0] * 3), None)[0] is None


def test_too_little_history_gives_no_verdict() -> None:
    few = runs_of([900] * 5, [200] * 5) + runs_of([900] * 3, [900] * 3, [0.0] * 3)
    assert advance(few, None) == (None, None)


def test_the_frozen_reference_resolves_only_once_a_window_is_back() -> None:
    rng = random.Random(4)
    healthy = runs_of(noisy(900, 24, rng), noisy(200, 24, rng))
    broken = healthy + runs_of([900] * 3, [900] * 3, [0.0] * 3)
    action, verdict = advance(broken, None)
    assert action == "open" and verdict is not None
    frozen = verdict.reference
    # The outage's own runs would be the trailing baseline by now; the frozen reference keeps the cache
    # that worked, so 30 runs of it are still an open incident, not a new normal.
    long_outage = broken + runs_of([900] * 30, [900] * 30, [0.0] * 30)
    assert advance(long_outage, frozen)[0] is None
    partly = long_outage + runs_of([900, 900], [200, 210], [0.97, 0.97])
    assert advance(partly, frozen)[0] is None
    back = partly + runs_of([900], [205], [0.97])
    assert advance(back, frozen)[0] == "resolve"
    # What it was opened against survives the incident row's JSON.
    assert Reference.from_json(frozen.to_json()) == frozen


def test_one_run_looks_cacheless_against_the_reference() -> None:
    reference = Reference(speedup=4.5, log_sigma=0.1, cached_share=0.97, runs=24)
    assert run_is_cacheless(runs_of([900], [880], [0.0])[0], reference)
    assert not run_is_cacheless(runs_of([900], [200], [0.97])[0], reference)
    assert not run_is_cacheless(runs_of([900], [880], [0.0])[0], None)
    by_speed = Reference(speedup=3.0, log_sigma=0.1, cached_share=None, runs=24)
    assert run_is_cacheless(runs_of([900], [600], [None])[0], by_speed)  # 1.5x: at most halfway to 3x
    assert not run_is_cacheless(runs_of([900], [400], [None])[0], by_speed)


def test_a_window_with_a_missing_figure_waits() -> None:
    reference = Reference(speedup=4.5, log_sigma=0.1, cached_share=0.97, runs=24)
    window = [*runs_of([900, 900], [900, 900], [0.0, 0.0]), PairRun(T0, None, None)]
    assert judge(window, reference) is None


def test_unreadable_stored_figures_are_dropped() -> None:
    assert Reference.from_json({"speedup": "4", "log_sigma": None, "cached_share": float("nan"), "runs": "x"}) == (
        Reference(None, None, None, 0)
    )


# ---------------------------------------------------------------- `cache: both` in the config


def both_config(tmp_path: Path, extra_prompt: str = "") -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""
providers: {{sim: {{base_url: "http://127.0.0.1:8400/v1", api: openai-chat}}}}
targets: {{m: {{provider: sim, model: m}}}}
prompts:
  long: {{tokens: 2048, cache: both}}
  short: {{tokens: 256}}
{extra_prompt}
jobs: [{{name: j, schedule: "*/5 * * * *", targets: [m], prompts: [short, long]}}]
"""
    )
    return load_config(path, environ={})


def test_a_both_prompt_is_two_series_busted_and_warm(tmp_path: Path) -> None:
    config = both_config(tmp_path)
    measured = series_prompts(config.prompts, config.jobs[0].prompts)
    assert [(name, p.cache) for name, p in measured] == [("short", "bust"), ("long", "bust"), ("long.warm", "warm")]
    assert cache_pairs(config.prompts) == {"long.warm": "long"}


def test_a_prompt_named_like_a_warm_twin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        both_config(tmp_path, "  long.warm: {tokens: 2048, cache: warm}")
    assert "prompts.long.warm: that name is the warm series of prompts.long (cache: both)" in str(caught.value)
