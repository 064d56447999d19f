"""`check-config` through the real CLI: the schedule's projected tokens and cost, and a budget it exceeds
refused with exit 2 naming the job and the figures (the daemon loads the config the same way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.exitcodes import EXIT_USAGE
from tests.conftest import run_cli
from tests.support.config import build_config, write_yaml


def config(tmp_path: Path, **sections: Any) -> Path:
    data = build_config(
        "http://127.0.0.1:1/v1",
        provider_settings={"prices": {"input": 1.0, "cached_input": 0.5, "output": 4.0, "currency": "USD"}},
        targets={"a": {"model": "m", "params": {"max_tokens": 100}}},
        prompts={"short": 1000},
        database_url=f"sqlite+aiosqlite:///{tmp_path}/absent.db",
        **sections,
    )
    data["prompts"]["warm"] = {"tokens": 2000, "cache": "warm"}
    data["jobs"] = [
        {"name": "j", "schedule": "*/10 * * * *", "targets": ["a"], "prompts": ["short", "warm"], "rounds": 3}
    ]
    return write_yaml(tmp_path / "config.yaml", data)


def test_check_config_prints_the_tokens_and_cost_per_day_and_month_the_schedule_implies(tmp_path: Path) -> None:
    result = run_cli("check-config", "--config", str(config(tmp_path)))
    assert result.code == 0, str(result)
    out = result.stdout
    # By hand: 144 runs a day x 4 requests; short 1000 prompt tokens, warm 2000 with 3 of 4 cached; 100 out each.
    # Per day: input 576,000 + 1,152,000; cached 864,000; output 2 x 57,600. Cost: 0.8064 + 0.9504 USD.
    assert "  j: 144 runs/day x 8 requests" in out, out
    assert (
        "    per day: 1,843,200 tokens (input 1,728,000, cached 864,000, output 115,200, reasoning 0); 1.76 USD"
    ) in out, out
    assert (
        "    per month: 55,296,000 tokens (input 51,840,000, cached 25,920,000, output 3,456,000, reasoning 0);"
        " 52.70 USD"
    ) in out, out
    assert "    a x warm: per day 1,209,600 tokens, 0.95 USD (from max_tokens)" in out, out
    assert not (tmp_path / "absent.db").exists()  # check-config creates no database


def test_a_config_projected_over_its_budget_is_refused_at_load_with_exit_2(tmp_path: Path) -> None:
    path = config(tmp_path, budget={"jobs": {"j": {"per": "month", "cost": 50}}})
    for command in ("check-config", "once"):
        result = run_cli(command, "--config", str(path))
        assert result.code == EXIT_USAGE, str(result)
        assert (
            f"{path}: budget.jobs.j.cost: job 'j' projects 52.70 USD per month, over the budget of 50.00 USD: "
            "j 52.70 (144 runs/day x 8 requests, 55,296,000 tokens)"
        ) in result.stderr, str(result)
