"""The job pipeline on its own: a run cancelled mid-way still stores the samples it took."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import structlog.testing

from monitor.app import build_context, open_store, start_background_store
from monitor.config.loader import load_config
from monitor.probe.result import Sample
from monitor.schedule.pipeline import execute, plan_for_job
from monitor.store.records import Batch
from tests.conftest import SimProcess, call_cli


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
    """The stored samples by their request id (the simulator's, one per request; a sample has no id of its own)."""
    with sqlite3.connect(folder / "ttft.db") as db:
        return {row[0] for row in db.execute("select request_id from samples")}


@pytest.mark.parametrize("background", [True, False], ids=["background-store", "inline-store"])
async def test_a_cancelled_run_still_stores_the_samples_it_took(
    tmp_path: Path, exact_sim: SimProcess, background: bool
) -> None:
    path = write_config(tmp_path, exact_sim)
    upgraded = await asyncio.to_thread(call_cli, "db", "upgrade", "--config", str(path))
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
    assert None not in {s.request_id for s in taken}
    assert stored_samples(tmp_path) == {s.request_id for s in taken}
    assert store.spool.depth == 0


async def test_detection_past_its_budget_is_skipped_loudly_and_the_run_is_still_stored(
    tmp_path: Path, exact_sim: SimProcess
) -> None:
    """The aftercare budget bounds detection (a hung database must not pile up runs behind it), and
    within the budget detection runs to its end: `once` gives it longer than the daemon does."""
    path = write_config(tmp_path, exact_sim)
    path.write_text(path.read_text().replace("rounds: 200", "rounds: 1"))
    upgraded = await asyncio.to_thread(call_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    config = load_config(str(path))
    detected: list[str] = []
    budgets: list[float | None] = []
    detection_s = {"slow": 0.0}

    async def detection(job: str, batch: Batch, *, budget_s: float | None = None) -> None:
        budgets.append(budget_s)
        await asyncio.sleep(detection_s["slow"])
        detected.append(job)

    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        context.after_store = detection
        background = start_background_store(context, store, aftercare_timeout_s=0.5)
        plan = plan_for_job(context, config.jobs[0])
        with structlog.testing.capture_logs() as logs:
            detection_s["slow"] = 0.2  # within the budget: detected
            await execute(context, job="slow", plan=plan)
            assert await background.settle(10)
            detection_s["slow"] = 30.0  # past it: skipped at the budget, not after 30 s
            started = asyncio.get_running_loop().time()
            await execute(context, job="slow", plan=plan)
            assert await background.settle(10)
            settled_after = asyncio.get_running_loop().time() - started
        await background.close(5)
    assert detected == ["slow"]
    assert settled_after < 5, settled_after
    assert budgets == [0.5, 0.5]  # the detector is told its budget (it stops itself there)
    # The hard stop behind it: the budget and as much again to notify, at most.
    stopped = [e for e in logs if e["event"] == "detection_stopped"]
    assert len(stopped) == 1 and stopped[0]["error"] == "TimeoutError" and stopped[0]["job"] == "slow", logs
    assert stopped[0]["batch_runs"] == 1 and stopped[0]["budget_s"] == 0.5, stopped
    assert len(stored_samples(tmp_path)) == 2  # both runs' samples, the undetected one too
