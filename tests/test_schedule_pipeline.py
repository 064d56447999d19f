"""The job pipeline on its own: a run cancelled mid-way still stores the samples it took."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from monitor.app import build_context, open_store, start_background_store
from monitor.config.loader import load_config
from monitor.probe.result import Sample
from monitor.schedule.pipeline import execute, plan_for_job
from tests.conftest import SimProcess, run_cli


def write_config(folder: Path, sim: SimProcess) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  sim: {{base_url: "{sim.v1}", api: openai-chat}}
targets:
  fast: {{provider: sim, model: gpt-4o-mini, params: {{max_tokens: 4}}}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: slow
    schedule: "0 * * * *"
    targets: [fast]
    prompts: [short]
    rounds: 200
    warmup: 0
    pause_s: 0.05
"""
    )
    return path


def stored_samples(folder: Path) -> set[str]:
    with sqlite3.connect(folder / "ttft.db") as db:
        return {row[0].replace("-", "") for row in db.execute("select id from samples")}


@pytest.mark.parametrize("background", [True, False], ids=["background-store", "inline-store"])
async def test_a_cancelled_run_still_stores_the_samples_it_took(
    tmp_path: Path, exact_sim: SimProcess, background: bool
) -> None:
    path = write_config(tmp_path, exact_sim)
    upgraded = await asyncio.to_thread(run_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    config = load_config(str(path))
    taken: list[Sample] = []
    enough = asyncio.Event()

    def on_sample(sample: Sample) -> None:
        taken.append(sample)
        if len(taken) == 3:
            enough.set()

    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        store_behind = start_background_store(context, store) if background else None
        plan = plan_for_job(context, config.jobs[0])
        run = asyncio.create_task(execute(context, job="slow", plan=plan, on_sample=on_sample))
        await asyncio.wait_for(enough.wait(), 30)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        if store_behind is not None:
            assert await store_behind.flush(30)
            await store_behind.close(5)
    assert 3 <= len(taken) < 200  # cancelled mid-way
    assert stored_samples(tmp_path) == {s.sample_id.replace("-", "") for s in taken}
    assert store.spool.depth == 0
