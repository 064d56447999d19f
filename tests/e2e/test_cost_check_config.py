"""`check-config` through the real CLI: the schedule's projected tokens and cost, and a budget it exceeds
refused with exit 2 naming the job and the figures (the daemon loads the config the same way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monitor.exitcodes import EXIT_USAGE
from tests.conftest import SimProcess, run_cli
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


def test_once_history_exists_the_projection_uses_the_output_and_reasoning_seen_per_probe(
    sim: SimProcess, tmp_path: Path
) -> None:
    data = build_config(
        sim.v1,
        provider_settings={"prices": {"input": 1.0, "output": 4.0, "reasoning": 8.0}},
        targets={"thinker": "qwen3-8b"},
        database_url=f"sqlite+aiosqlite:///{tmp_path}/ttft.db",
        state_dir=tmp_path / "state",
    )
    data["jobs"] = [{"name": "j", "schedule": "*/10 * * * *", "targets": ["thinker"], "prompts": ["short"]}]
    path = write_yaml(tmp_path / "config.yaml", data)
    before = run_cli("check-config", "--config", str(path))
    assert "thinker x short: per day 165,888 tokens" in before.stdout, str(before)  # 144 x 6 x (128 + 64)
    assert run_cli("db", "upgrade", "--config", str(path)).code == 0
    stored = run_cli(
        "probe", "--config", str(path), "--store", "--prompt", "short", "-n", "3", "--warmup", "0", "--pause", "0"
    )
    assert stored.code == 0, str(stored)

    result = run_cli("check-config", "--config", str(path))
    assert result.code == 0, str(result)
    # The simulated Qwen3 thinks 40 tokens and answers 24 within max_tokens 64 (estimated from the stream):
    # 144 runs x 6 requests (5 rounds + 1 warm-up) x 40 reasoning and x 24 output a day.
    assert "output 20,736, reasoning 34,560)" in result.stdout, str(result)
    assert "(seen in 3 samples)" in result.stdout, str(result)
    assert "history: 3 samples of 1 target x prompt pairs over the last 2 days" in result.stdout, str(result)
    unread = run_cli("check-config", "--config", str(path), "--no-history")
    assert "(from max_tokens)" in unread.stdout and "history:" not in unread.stdout, str(unread)
