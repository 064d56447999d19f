"""Reasoning tokens per sample, end to end: the real `probe --store` against the real simulator, stored on
SQLite and PostgreSQL, reported by the API where it counts them and estimated from the stream where not."""

from __future__ import annotations

import asyncio
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
