"""A regression that is only the monitor's own overload never pages, end to end.

The real pipeline probes the simulator (a child process: its timing is untouched) run after run,
stores, detects and delivers to a webhook on loopback. Then the monitor's own loop is overloaded
(a callback hogging it 200 ms out of every 220 ms) while the simulator answers exactly as before.
With the kernel's arrival stamps a first token read on its own keeps its true TTFT; one the stall
held together with the next token may carry the stall, and is disturbed: stored, but no evidence.
Either way nothing opens. The same overload with neither (no meter, bytes timed when the loop reads
them, as before) stores TTFTs several-fold and pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from monitor.app import attach_detection, build_context, open_store
from monitor.config.loader import load_config
from monitor.schedule.pipeline import execute, plan_for_job
from monitor.store.models import IncidentRow, SampleRow
from tests.conftest import SimProcess, run_cli
from tests.support.alert_fixtures import Loopback

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

HEALTHY, OVERLOADED = 18, 7
FAST = {"ttft_base_ms": 30.0, "prefill_ms_per_1k": 5.0}
BOUND_MS = 20


def write_config(folder: Path, sim: SimProcess, hook: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
# Above the few ms a shared CI machine's own noise reaches, far below the 200 ms stalls of the overload.
probe_self_delay_bound_ms: {BOUND_MS}
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  gateway: {{base_url: "{sim.v1}", api: openai-chat}}
targets:
  qwen3-8b: {{provider: gateway, model: qwen3-8b, params: {{max_tokens: 2}}}}
prompts:
  short: {{tokens: 128}}
jobs:
  - name: every-5m
    schedule: "*/5 * * * *"
    targets: [qwen3-8b]
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


async def hog_the_loop() -> None:
    """The monitor's own overload: the loop is free 20 ms at a time, so every probe overlaps a stall."""
    while True:
        await asyncio.sleep(0.02)
        time.sleep(0.2)  # noqa: ASYNC251 - blocking the loop is the point


async def run_through_overload(
    tmp_path: Path, sim: SimProcess, loopback: Loopback, *, measured: bool, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    if not measured:
        monkeypatch.setenv("TTFT_KERNEL_TIMESTAMPS", "0")
    sim.post("/sim/models/qwen3-8b", FAST)
    path = write_config(tmp_path, sim, loopback.url("/hook"))
    upgraded = await asyncio.to_thread(run_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    config = load_config(str(path))
    async with AsyncExitStack() as stack:
        store = await open_store(config, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(config, stack, store=store, metrics=None)
        if not measured:
            context.meter = None
        dispatcher, _service = await attach_detection(context, store, stack, metrics=None)
        plan = plan_for_job(context, config.jobs[0])
        with capture_logs() as logs:
            for index in range(HEALTHY + OVERLOADED):
                hog = asyncio.create_task(hog_the_loop()) if index >= HEALTHY else None
                try:
                    await execute(context, job="every-5m", plan=plan)
                finally:
                    if hog is not None:
                        hog.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await hog
                await dispatcher.dispatch_due()
        async with store.engine.connect() as connection:
            incidents = (await connection.execute(sa.select(IncidentRow.kind, IncidentRow.severity))).all()
            samples = (
                await connection.execute(sa.select(SampleRow.ttft_ms, SampleRow.self_delay_ms, SampleRow.disturbed))
            ).all()
    return {
        "sent": [item.json()["data"] for item in loopback.at("/hook")],
        "incidents": incidents,
        "samples": samples,
        "skipped": [e for e in logs if e["event"] == "detection_skipped_disturbed"],
    }


@pytest.mark.timeout(180)
async def test_the_monitors_own_overload_is_stored_as_disturbed_and_never_pages(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = await run_through_overload(tmp_path, exact_sim, loopback, measured=True, monkeypatch=monkeypatch)
    assert seen["sent"] == [] and seen["incidents"] == []
    # The overloaded runs' samples (a shared CI machine may add a quiet one now and then).
    overloaded = [row for row in seen["samples"] if row.self_delay_ms is not None and row.self_delay_ms >= 100]
    quiet = [row for row in seen["samples"] if row.self_delay_ms is not None and row.self_delay_ms <= BOUND_MS]
    # Every overloaded run's two; a quiet run's sample the suite's load held past 100 ms too, now and then (CI: 15).
    assert 2 * OVERLOADED <= len(overloaded) <= 2 * OVERLOADED + 2, seen["samples"]
    assert len(quiet) >= 2 * HEALTHY - 2, seen["samples"]
    assert not any(row.disturbed for row in quiet), quiet
    truth = statistics.median(row.ttft_ms for row in quiet)
    # Every overloaded sample kept as evidence is timed by its arrival: the stall is not in it.
    kept = [row for row in overloaded if not row.disturbed]
    assert all(abs(row.ttft_ms - truth) < BOUND_MS for row in kept), (truth, kept)
    # A run whose samples were all disturbed is not evaluated, and says so.
    skipped = [e for e in seen["skipped"] if not e["run_evaluated"]]
    assert all(e["samples"] == e["disturbed"] == 2 for e in skipped), skipped


@pytest.mark.timeout(180)
async def test_the_same_overload_unmeasured_pages(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = await run_through_overload(tmp_path, exact_sim, loopback, measured=False, monkeypatch=monkeypatch)
    assert ("regression", "page") in {(row.kind, row.severity) for row in seen["incidents"]}, seen
    assert any(item["severity"] == "page" for item in seen["sent"]), seen["sent"]
    assert not any(row.disturbed for row in seen["samples"])
