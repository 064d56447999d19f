"""Reasoning tokens per sample, end to end: the real `probe --store` against the real simulator, stored on
SQLite and PostgreSQL, reported by the API where it counts them and estimated from the stream where not."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import sqlalchemy as sa

from tests.conftest import SimProcess, run_cli
from tests.support.config import build_config, write_yaml
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)


async def test_reasoning_tokens_are_stored_reported_or_estimated_on_both_databases(
    backend: Backend, sim: SimProcess, tmp_path: Path
) -> None:
    # An OpenAI-shaped server counting reasoning in completion_tokens_details; the seed Qwen profiles do not (vLLM).
    sim.post("/sim/models/qwen3-14b", {"reports_reasoning_tokens": True})
    data = build_config(
        sim.v1,
        targets={"thinker": "qwen3-8b", "plain": "gpt-4o-mini", "counted": "qwen3-14b"},
        database_url=backend.url,
        state_dir=tmp_path / "state",
    )
    data["providers"]["sim-responses"] = {"base_url": sim.v1, "api": "openai-responses"}
    data["targets"]["responses"] = {"provider": "sim-responses", "model": "qwen3-8b"}
    config = write_yaml(tmp_path / "config.yaml", data)
    args = ["probe", "--config", str(config), "--store", "-n", "2", "--warmup", "0", "--pause", "0", "-f", "json"]
    for name in ("thinker", "plain", "counted", "responses"):
        args += ["-t", name]
    result = await asyncio.to_thread(run_cli, *args)
    assert result.code == 0, str(result)

    engine = backend.engine()
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.text(
                        "SELECT series.target, samples.completion_tokens, samples.reasoning_tokens, "
                        "samples.reasoning_tokens_estimated FROM samples "
                        "JOIN runs ON runs.id = samples.run_id JOIN series ON series.id = runs.series_id"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    stored = {(target, completion, reasoning, bool(estimated)) for target, completion, reasoning, estimated in rows}
    # The Qwen profiles think 40 tokens, then answer up to max_tokens (64); gpt-4o-mini answers 48 and never thinks.
    assert stored == {
        ("thinker", 64, 40, True),
        ("plain", 48, 0, True),
        ("counted", 64, 40, False),
        ("responses", 64, 40, False),
    }
    assert len(rows) == 8


def test_probe_prints_what_its_run_cost_from_the_tokens_the_server_reported(sim: SimProcess, tmp_path: Path) -> None:
    data = build_config(
        sim.v1,
        provider_settings={"prices": {"input": 1.0, "output": 4.0, "reasoning": 8.0, "currency": "EUR"}},
        targets={"thinker": "qwen3-8b", "plain": "gpt-4o-mini"},
    )
    data["providers"]["free"] = {"base_url": sim.v1, "api": "openai-chat"}
    data["targets"]["unpriced"] = {"provider": "free", "model": "gpt-4o-mini"}
    config = write_yaml(tmp_path / "config.yaml", data)
    args = ["probe", "--config", str(config), "-n", "2", "--warmup", "1", "--pause", "0", "--prompt", "short"]
    args += ["-t", "thinker", "-t", "plain", "-t", "unpriced", "-f", "json"]
    result = run_cli(*args)
    assert result.code == 0, str(result)
    samples = json.loads(result.stdout)["samples"]
    assert len(samples) == 9  # warm-ups are paid for too
    prompt = sum(s["prompt_tokens"] for s in samples)
    priced = [s for s in samples if s["target"] != "unpriced"]
    # thinker: 40 reasoning (estimated) + 24 answer; plain: 48 answer, no reasoning.
    assert {(s["target"], s["completion_tokens"], s["reasoning_tokens"]) for s in samples} == {
        ("thinker", 64, 40),
        ("plain", 48, 0),
        ("unpriced", 48, 0),
    }
    cost = (sum(s["prompt_tokens"] for s in priced) + 4 * (3 * 24 + 3 * 48) + 8 * 3 * 40) / 1e6
    expected = (
        f"cost of this run: {prompt + 3 * 64 + 6 * 48:,} tokens (input {prompt:,}, cached 0, "
        f"output {3 * 24 + 6 * 48:,}, reasoning 120); {cost:.4f} EUR "
        "(no prices for unpriced; reasoning estimated from the stream in 3 samples)"
    )
    assert expected in result.stderr, str(result)
