"""One page per outage, end to end: the simulator serves two providers' models, the real pipeline
probes them run after run, stores, detects and delivers to a webhook on loopback.

Slowing every model behind one provider delivers one grouped page naming them all (each member's
incident recorded); slowing one model only delivers its own page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from monitor.app import attach_detection, build_context, open_store
from monitor.config.loader import load_config
from monitor.schedule.pipeline import execute, plan_for_job
from monitor.store.models import IncidentRow
from tests.conftest import SimProcess, run_cli
from tests.support.alert_fixtures import Loopback

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

# gateway-a serves the two Qwen models, gateway-b gpt-4o-mini; all from one simulator.
MODELS = {"qwen3-8b": "gateway-a", "qwen3-14b": "gateway-a", "gpt-4o-mini": "gateway-b"}
HEALTHY, SLOW, RECOVERED = 18, 7, 9
FAST = {"ttft_base_ms": 30.0, "prefill_ms_per_1k": 5.0}


def write_config(folder: Path, sim: SimProcess, hook: str) -> Path:
    targets = "".join(
        f"  {model}: {{provider: {provider}, model: {model}, params: {{max_tokens: 2}}}}\n"
        for model, provider in MODELS.items()
    )
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  gateway-a: {{base_url: "{sim.v1}", api: openai-chat}}
  gateway-b: {{base_url: "{sim.v1}", api: openai-chat}}
targets:
{targets}prompts:
  short: {{tokens: 128}}
jobs:
  - name: every-5m
    schedule: "*/5 * * * *"
    targets: [{", ".join(MODELS)}]
    prompts: [short]
    rounds: 2
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 6
  trailing_runs: 12
  page: {{min_delta_ms: 10}}
alerts:
  receivers:
    hook: {{type: webhook, url: "{hook}"}}
  routes:
    - receivers: [hook]
"""
    )
    return path


def set_speed(sim: SimProcess, models: Iterable[str], factor: float) -> None:
    for model in models:
        sim.post(f"/sim/models/{model}", {name: value * factor for name, value in FAST.items()})


async def run_outage(tmp_path: Path, sim: SimProcess, loopback: Loopback, slowed: list[str]) -> dict[str, Any]:
    """Healthy runs, runs with `slowed` 3x slower, healthy again; what the webhook and database saw."""
    path = write_config(tmp_path, sim, loopback.url("/hook"))
    upgraded = await asyncio.to_thread(run_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    config = load_config(str(path))
    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        dispatcher, _service = await attach_detection(context, store, stack, metrics=None)
        plan = plan_for_job(context, config.jobs[0])
        for index in range(HEALTHY + SLOW + RECOVERED):
            if index in (0, HEALTHY + SLOW):
                set_speed(sim, MODELS, 1.0)
            elif index == HEALTHY:
                set_speed(sim, slowed, 3.0)
            await execute(context, job="every-5m", plan=plan)
            await dispatcher.dispatch_due()
        async with store.engine.connect() as connection:
            table = IncidentRow.__table__
            incidents = (await connection.execute(sa.select(table.c.kind, table.c.group_id))).all()
    return {"sent": [item.json()["data"] for item in loopback.at("/hook")], "incidents": incidents}


@pytest.mark.timeout(240)
async def test_slowing_every_model_of_one_provider_pages_once_naming_them(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    seen = await run_outage(tmp_path, exact_sim, loopback, ["qwen3-8b", "qwen3-14b"])
    firing = [item for item in seen["sent"] if item["state"] == "firing"]
    titles = [item["title"] for item in seen["sent"]]
    assert len(firing) == 1, titles
    assert firing[0]["title"].startswith("[PAGE] TTFT regression on gateway-a: 2 targets, 2 series, median "), titles
    assert firing[0]["group"]["members"] == ["qwen3-14b / short @ lab", "qwen3-8b / short @ lab"]
    # Both members recorded, in one group; the group resolves once both have.
    assert len(seen["incidents"]) == 2 and len({row.group_id for row in seen["incidents"]}) == 1
    assert [item["state"] for item in seen["sent"]] == ["firing", "resolved"], titles


@pytest.mark.timeout(240)
async def test_slowing_one_model_pages_for_that_model_alone(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    seen = await run_outage(tmp_path, exact_sim, loopback, ["qwen3-8b"])
    titles = [item["title"] for item in seen["sent"]]
    assert [item["state"] for item in seen["sent"]] == ["firing", "resolved"], titles
    assert titles[0].startswith("[PAGE] TTFT regression on qwen3-8b / short @ lab"), titles
    assert seen["sent"][0]["group"] is None
    assert len(seen["incidents"]) == 1
