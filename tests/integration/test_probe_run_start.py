"""A run of many series starts a few series a turn of the probes' loop (issue 26, event-loop lag): every
series' task made, and its first step taken, in one turn held every probe in flight and every timer due.
And how a run ends when the process stops: the requests out finish, no round starts after."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient
from monitor.probe.prompts import Calibration, PromptFactory, PromptSpec
from monitor.probe.result import Sample
from monitor.probe.runner import START_STEP, ProbeTarget, ProviderLimits, RunPlan, run_plan
from monitor.sim import ModelProfile, RunningSimulator, Simulator, start

KEY = "sim-key-0123456789"
SERIES = 3 * START_STEP + 7


@pytest.fixture
async def server() -> AsyncIterator[RunningSimulator]:
    profile = ModelProfile(
        name="plain", ttft_base_ms=5.0, prefill_ms_per_1k=0.0, noise_sigma=0.0, decode_tps=500.0, answer_tokens=2
    )
    running = await start(Simulator({"plain": profile}, noise=False, seed=3, api_key=KEY), port=0)
    yield running
    await running.close()


def plan_of(server: RunningSimulator, *, concurrency: int) -> RunPlan:
    endpoint = Endpoint(server.url + "/v1", FLAVORS["openai-chat"], api_key=KEY)
    params = RequestParams(model="plain", max_tokens=2, temperature=0.0, extra_body={}, include_usage=True)
    target = ProbeTarget(name="plain", provider="sim", endpoint=endpoint, params=params)
    prompts = tuple(PromptSpec(f"p{i}", 128) for i in range(SERIES))
    return RunPlan(targets=(target,), prompts=prompts, rounds=1, warmup=0, pause_s=0, concurrency=concurrency)


def series_tasks() -> int:
    names = (getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks())
    return sum(1 for name in names if name.endswith("run_plan.<locals>.series"))


async def test_a_large_run_starts_its_series_a_few_at_a_time_letting_the_loop_through(
    server: RunningSimulator,
) -> None:
    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append(series_tasks())
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    async with ProbeClient() as client:
        samples = await run_plan(
            plan_of(server, concurrency=4),
            client=client,
            limits=ProviderLimits({"sim": 4}),
            prompts=PromptFactory(Calibration()),
        )
    watcher.cancel()
    started = [n for n in seen if n]
    assert started[0] <= START_STEP, f"{started[0]} series started in the run's first turn of the loop"
    assert max(started) == SERIES  # all of them under way together, waiting for the caps
    assert len(samples) == SERIES and all(s.ok for s in samples)
    assert {s.prompt for s in samples[:4]} == {"p0", "p1", "p2", "p3"}  # series still start in the plan's order


async def drained_run(
    plan: RunPlan,
    draining: asyncio.Event,
    *,
    cap: int,
    timeout_s: float,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """`plan` run with the process's stop event `draining`, at most `cap` requests at once; it must return
    within `timeout_s` (a run that waited out its rounds or pauses would not)."""
    async with ProbeClient() as client:
        return await asyncio.wait_for(
            run_plan(
                plan,
                client=client,
                limits=ProviderLimits({"sim": cap}),
                prompts=PromptFactory(Calibration()),
                on_sample=on_sample,
                draining=draining,
            ),
            timeout=timeout_s,
        )


async def test_a_draining_run_finishes_the_requests_it_has_out_and_starts_no_more_rounds(
    server: RunningSimulator,
) -> None:
    plan = replace(plan_of(server, concurrency=2), rounds=50, pause_s=0.05)
    draining = asyncio.Event()
    taken: list[str] = []

    def on_sample(sample: Sample) -> None:
        taken.append(sample.prompt)
        if len(taken) == 3:
            draining.set()  # the stop comes while the run is under way, requests out

    samples = await drained_run(plan, draining, cap=2, on_sample=on_sample, timeout_s=10)
    assert all(s.ok for s in samples)  # each request out when the stop came finished and was measured
    rounds = Counter(s.prompt for s in samples)
    # Every series measured once (those the stop found unmeasured too: the tick is stored for each), and
    # none started a round after its first but the few already measured when the stop came (one a slot).
    assert set(rounds) == {spec.name for spec in plan.prompts}
    assert sum(n - 1 for n in rounds.values()) <= 2, rounds


async def test_a_run_started_while_draining_measures_each_series_once_after_its_warm_up(
    server: RunningSimulator,
) -> None:
    draining = asyncio.Event()
    draining.set()
    plan = replace(plan_of(server, concurrency=4), rounds=5, warmup=1, pause_s=30.0)
    samples = await drained_run(plan, draining, cap=4, timeout_s=20)  # the 30 s pauses cut short
    assert Counter((s.prompt, s.warmup) for s in samples) == {
        **{(spec.name, True): 1 for spec in plan.prompts},
        **{(spec.name, False): 1 for spec in plan.prompts},
    }


async def test_a_stop_during_the_pause_between_rounds_ends_the_pause(server: RunningSimulator) -> None:
    plan = replace(plan_of(server, concurrency=4), prompts=plan_of(server, concurrency=4).prompts[:2], rounds=3)
    plan = replace(plan, pause_s=60.0)  # a run that would take two minutes
    draining = asyncio.Event()

    def on_sample(sample: Sample) -> None:
        asyncio.get_running_loop().call_later(0.2, draining.set)  # the stop comes during the pause

    started = asyncio.get_running_loop().time()
    samples = await drained_run(plan, draining, cap=4, on_sample=on_sample, timeout_s=30)
    assert asyncio.get_running_loop().time() - started < 10
    assert [s.round for s in samples] == [1, 1] and all(s.ok for s in samples)
