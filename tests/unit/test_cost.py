"""What probing costs: runs per day from cron, the projection against a hand computation, prices, budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from monitor.config.cost import (
    Seen,
    Tokens,
    budget_problems,
    cost_of,
    money_text,
    project,
    runs_per_day,
    spent,
)
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.config.models import Config
from monitor.probe.settings import Prices
from tests.support.config import build_config, write_yaml

PRICES = {"input": 1.0, "cached_input": 0.5, "output": 4.0, "reasoning": 8.0, "currency": "USD"}


@pytest.mark.parametrize(
    ("schedule", "timezone", "expected"),
    [
        ("*/5 * * * *", "UTC", 288),
        ("* * * * *", "UTC", 1440),
        ("*/10 * * * * *", "UTC", 8640),  # six fields, seconds first
        ("@hourly", "UTC", 24),
        ("@daily", "UTC", 1),
        ("0 9-17 * * 1-5", "Europe/Berlin", 9 * 5 / 7),  # office hours on weekdays
        ("*/15 8-19 * * mon-fri", "UTC", 4 * 12 * 5 / 7),
        ("0 0 1 * *", "UTC", 12 / 364),  # monthly: 12 fires in the 52 weeks counted
        ("30 2 * * *", "America/New_York", 1),
    ],
)
def test_runs_per_day_follow_the_cron_schedule(schedule: str, timezone: str, expected: float) -> None:
    assert runs_per_day(schedule, timezone) == pytest.approx(expected)


def hand_config(**sections: Any) -> dict[str, Any]:
    data = build_config(
        "http://127.0.0.1:1/v1",
        provider_settings={"prices": PRICES},
        targets={"a": {"model": "m", "params": {"max_tokens": 100}}},
        prompts={"short": 1000},
        **sections,
    )
    data["prompts"]["warm"] = {"tokens": 2000, "cache": "warm"}
    data["jobs"] = [
        {"name": "j", "schedule": "*/10 * * * *", "targets": ["a"], "prompts": ["short", "warm"], "rounds": 3}
    ]
    return data


def test_the_projection_matches_a_hand_computation() -> None:
    [job] = project(Config.model_validate(hand_config()))
    # 144 runs a day, 3 rounds + 1 warm-up = 4 requests per target and prompt.
    assert job.runs_per_day == 144 and job.requests_per_run == 8
    short, warm = job.series
    # short: 4 x 1000 prompt tokens, 4 x 100 output (max_tokens) a run.
    assert short.per_day == Tokens(input=576_000, cached=0, output=57_600, reasoning=0)
    assert short.cost_per_day == pytest.approx(0.576 + 0.2304)  # 576,000 x $1/M + 57,600 x $4/M
    # warm: all but the run's first request come from the cache: 3 x 2000 of 4 x 2000 a run.
    assert warm.per_day == Tokens(input=1_152_000, cached=864_000, output=57_600, reasoning=0)
    assert warm.cost_per_day == pytest.approx(0.288 + 0.432 + 0.2304)  # uncached $1/M, cached $0.5/M
    assert job.cost_per_day() == {"USD": pytest.approx(1.7568)}
    assert job.per_day.total == 1_843_200


def test_a_canary_costs_one_short_request_per_target_and_run() -> None:
    data = hand_config()
    data["targets"]["a"]["canary"] = {"prompt": "x" * 40, "max_tokens": 8}
    [job] = project(Config.model_validate(data))
    canary = job.series[-1]
    assert (canary.prompt, canary.requests_per_run) == ("canary", 1)
    # 144 runs a day, one request each: 40 characters ~ 10 tokens + 16 of the chat template in, 8 out.
    assert canary.per_day == Tokens(input=144 * 26, cached=0, output=144 * 8, reasoning=0)
    assert canary.cost_per_day == pytest.approx((144 * 26 * 1.0 + 144 * 8 * 4.0) / 1e6)


def test_history_replaces_max_tokens_with_the_output_and_reasoning_seen_per_probe() -> None:
    # The public report's probe: 977 output tokens, 950 of them reasoning.
    seen = {("a", "short"): Seen(50, prompt_tokens=1010, cached_tokens=0, completion_tokens=977, reasoning_tokens=950)}
    [job] = project(Config.model_validate(hand_config()), seen)
    short = job.series[0]
    assert short.seen == 50
    assert short.per_day == Tokens(input=144 * 4 * 1010, cached=0, output=144 * 4 * 27, reasoning=144 * 4 * 950)
    assert short.cost_per_day == pytest.approx(0.58176 + 0.062208 + 4.3776)  # reasoning at $8/M
    assert job.series[1].seen == 0  # no history for warm: still the upper bound


def test_a_target_s_prices_replace_its_provider_s_and_unpriced_targets_cost_nothing_known() -> None:
    data = hand_config()
    data["targets"]["b"] = {"provider": "sim", "model": "m2", "prices": {"input": 2, "output": 2, "currency": "EUR"}}
    data["providers"]["free"] = {"base_url": "http://127.0.0.1:2/v1", "api": "openai-chat"}
    data["targets"]["c"] = {"provider": "free", "model": "m3"}
    data["jobs"][0]["targets"] = ["a", "b", "c"]
    [job] = project(Config.model_validate(data))
    by_target = {(s.target, s.prompt): s for s in job.series}
    assert by_target["b", "short"].currency == "EUR"
    # 576,000 input + 4 x 64 x 144 = 36,864 output, all at 2 EUR/M (cached_input and reasoning default).
    assert by_target["b", "short"].cost_per_day == pytest.approx((576_000 + 36_864) * 2e-6)
    assert by_target["c", "short"].cost_per_day is None
    assert set(job.cost_per_day()) == {"USD", "EUR"}


def test_cost_of_defaults_cached_input_to_input_and_reasoning_to_output() -> None:
    prices = Prices(input=2.0, output=10.0)
    tokens = spent(prompt_tokens=1000, cached_tokens=400, completion_tokens=977, reasoning_tokens=950)
    assert tokens == Tokens(input=1000, cached=400, output=27, reasoning=950)
    assert cost_of(tokens, prices) == pytest.approx((1000 * 2 + 977 * 10) / 1e6)
    assert money_text(0.0012) == "0.0012" and money_text(52.704) == "52.70" and money_text(0) == "0.00"


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    return write_yaml(tmp_path / "config.yaml", data)


def test_a_config_whose_projection_exceeds_a_budget_is_refused_naming_the_job_and_figures(tmp_path: Path) -> None:
    path = write(tmp_path, hand_config(budget={"jobs": {"j": {"per": "month", "cost": 50}}}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [issue] = caught.value.errors
    assert issue.path == "budget.jobs.j.cost"
    # 1.7568 USD a day x 30
    assert issue.message.startswith(
        "job 'j' projects 52.70 USD per month, over the budget of 50.00 USD: "
        "j 52.70 (144 runs/day x 8 requests, 55,296,000 tokens); lower rounds"
    ), issue.message


@pytest.mark.parametrize(
    ("budget", "path", "fragment"),
    [
        ({"total": {"per": "day", "tokens": 1_000_000}}, "budget.total.tokens", "all jobs together projects 1,843,200"),
        ({"providers": {"sim": {"per": "day", "cost": 1.5}}}, "budget.providers.sim.cost", "projects 1.76 USD per day"),
        ({"jobs": {"nope": {"cost": 5}}}, "budget.jobs.nope", "no job named 'nope' (known: j)"),
        ({"providers": {"nope": {"cost": 5}}}, "budget.providers.nope", "no provider named 'nope' (known: sim)"),
        ({"total": {"cost": 500, "currency": "EUR"}}, "budget.total.currency", "the budget is in EUR but a (USD)"),
    ],
)
def test_each_budget_is_checked_in_its_scope(tmp_path: Path, budget: dict, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, hand_config(budget=budget)))
    [issue] = caught.value.errors
    assert issue.path == path and fragment in issue.message, issue


def test_a_cost_budget_over_an_unpriced_target_says_it_cannot_be_checked(tmp_path: Path) -> None:
    data = hand_config(budget={"total": {"cost": 500}})
    del data["providers"]["sim"]["prices"]
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data))
    assert "target(s) a have no prices, so a cost budget cannot be checked" in str(caught.value)


def test_a_budget_within_the_projection_loads_and_needs_a_limit(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, hand_config(budget={"total": {"per": "month", "cost": 60}})))
    assert budget_problems(config) == []
    with pytest.raises(ConfigError, match=r"budget.total: a budget needs `cost` \(with prices\), `tokens` or both"):
        load_config(write(tmp_path, hand_config(budget={"total": {"per": "day"}})))


@pytest.mark.parametrize(
    ("before", "after", "jumped"),
    [
        (12, 950, True),  # the public report's health check
        (48, 448, True),
        (48, 60, False),  # noise
        (300, 1100, False),  # grew by less than 4x
        (10, 90, False),  # 9x, but fewer than 100 tokens more
        (0, 120, True),
    ],
)
def test_a_jump_in_tokens_per_probe_is_told_from_noise(before: int, after: int, jumped: bool) -> None:
    from monitor.probe.spend import PerProbe, token_jumps

    key = ("t", "short")
    found = token_jumps({key: PerProbe(before, 0)}, {key: PerProbe(after, after - 10), ("new", "p"): PerProbe(999, 0)})
    assert [k for k, _, _ in found] == ([key] if jumped else [])


def test_a_budget_s_course_extrapolates_the_spend_seen_to_its_period() -> None:
    from monitor.config.cost import budget_course

    config = Config.model_validate(
        hand_config(budget={"jobs": {"j": {"per": "day", "cost": 100, "tokens": 10_000_000}}, "total": {"tokens": 1}})
    )
    # 10 minutes of 1,000 prompt and 977 output tokens (950 reasoning) a request, 60 requests.
    spent = {("j", "a"): Tokens(input=60_000, cached=0, output=1_620, reasoning=57_000), ("other", "a"): Tokens(5)}
    assert budget_course(config, spent, span_s=10) == []  # too short to judge
    courses = {course.path: course for course, _ in budget_course(config, spent, span_s=600)}
    job = courses["jobs.j"]
    assert job.tokens == pytest.approx(118_620 * 144)  # a day is 144 ten-minute spans
    assert job.cost == pytest.approx((60_000 * 1 + 1_620 * 4 + 57_000 * 8) / 1e6 * 144)  # 75.26 USD
    assert job.ratio == pytest.approx(118_620 * 144 / 10_000_000) and job.over
    assert courses["total"].tokens == pytest.approx((118_620 + 5) * 144 * 30) and courses["total"].over


def test_a_budget_notice_is_one_per_budget_and_period() -> None:
    from datetime import UTC, datetime

    from monitor.detect.budget_service import notice_id

    morning, evening = datetime(2026, 12, 2, 8, tzinfo=UTC), datetime(2026, 12, 2, 20, tzinfo=UTC)
    tomorrow = datetime(2026, 12, 3, 8, tzinfo=UTC)
    assert notice_id("lab", "jobs.j", "day", morning) == notice_id("lab", "jobs.j", "day", evening)
    assert notice_id("lab", "jobs.j", "day", morning) != notice_id("lab", "jobs.j", "day", tomorrow)
    assert notice_id("lab", "jobs.j", "month", morning) == notice_id("lab", "jobs.j", "month", tomorrow)
    assert notice_id("lab", "jobs.j", "day", morning) != notice_id("lab", "total", "day", morning)


# ---------------------------------------------------------------- what a crossed budget holds


def test_a_budget_action_holds_the_jobs_of_its_scope_until_its_period_ends() -> None:
    from datetime import UTC, datetime

    from monitor.config.cost import jobs_in_scope, period_end

    config = Config.model_validate(
        {
            "providers": {
                "a": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"},
                "b": {"base_url": "http://127.0.0.1:2/v1", "api": "openai-chat"},
            },
            "targets": {"ta": {"provider": "a", "model": "m"}, "tb": {"provider": "b", "model": "m"}},
            "prompts": {"p": {"tokens": 128}},
            "jobs": [
                {"name": "only-a", "schedule": "*/5 * * * *", "targets": ["ta"], "prompts": ["p"]},
                {"name": "both", "schedule": "*/5 * * * *", "targets": ["ta", "tb"], "prompts": ["p"]},
                {"name": "only-b", "schedule": "*/5 * * * *", "targets": ["tb"], "prompts": ["p"]},
            ],
        }
    )
    assert jobs_in_scope(config, "total") == ["only-a", "both", "only-b"]
    assert jobs_in_scope(config, "providers.a") == ["only-a", "both"]  # a job with one of its targets is held whole
    assert jobs_in_scope(config, "jobs.only-b") == ["only-b"]
    assert jobs_in_scope(config, "jobs.gone") == [] and jobs_in_scope(config, "nonsense") == []
    assert period_end("day", datetime(2026, 12, 3, 23, 59, tzinfo=UTC)) == datetime(2026, 12, 4, tzinfo=UTC)
    assert period_end("month", datetime(2026, 12, 31, 12, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end("month", datetime(2026, 2, 1, tzinfo=UTC)) == datetime(2026, 3, 1, tzinfo=UTC)
