"""Runs targets x prompts x rounds through the concurrency limits; the probe's one orchestration path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from monitor.probe.apis import RequestParams
from monitor.probe.client import ProbeClient
from monitor.probe.endpoint import Endpoint
from monitor.probe.prompts import PromptFactory, PromptSpec
from monitor.probe.result import Sample
from monitor.probe.self_delay import LoopDelayMeter
from monitor.probe.settings import Canary
from monitor.waits import sleep_unless


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    name: str
    provider: str
    endpoint: Endpoint
    params: RequestParams
    canary: Canary | None = None  # the target's deterministic canary (monitor/probe/canary.py)


@dataclass(frozen=True, slots=True)
class RunPlan:
    targets: tuple[ProbeTarget, ...]
    prompts: tuple[PromptSpec, ...]
    rounds: int = 5
    warmup: int = 1
    pause_s: float = 1.0
    # Requests in flight at once across the whole run. 1 keeps probes from distorting each other.
    concurrency: int = 1
    # Only these (target, prompt) series; None: every one. A replica's shards of a job (jobs[].shards).
    series: frozenset[tuple[str, str]] | None = None


# Series whose tasks are made (and take their first step) in one turn of the loop when a run starts.
START_STEP = 25


class ProviderLimits:
    """One semaphore per provider (its `max_concurrency`), shared by every run in the process."""

    def __init__(self, limits: Mapping[str, int]) -> None:
        self._semaphores = {name: asyncio.Semaphore(n) for name, n in limits.items()}

    def get(self, provider: str) -> asyncio.Semaphore:
        sem = self._semaphores.get(provider)
        if sem is None:
            sem = self._semaphores[provider] = asyncio.Semaphore(1)
        return sem


async def run_plan(
    plan: RunPlan,
    *,
    client: ProbeClient,
    limits: ProviderLimits,
    prompts: PromptFactory,
    intended_at: datetime | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    meter: LoopDelayMeter | None = None,
    self_delay_bound_ms: float = 5.0,
    draining: asyncio.Event | None = None,
) -> list[Sample]:
    """Probe every series; rounds of one series run in order, series interleave under the caps.

    Returns every sample, warm-up ones included (flagged), in completion order. With a `meter`, each
    sample records the monitor's own delay around its stamps and whether that disturbed it. Once
    `draining` is set (the process is stopping), a series that has measured a round starts no more: the
    requests in flight finish and the run returns what it took, so a stop waits for about one request per
    series, not for the rest of the run (and a series not yet measured still gets its first round).
    """
    intended = intended_at or datetime.now(UTC)
    gate = asyncio.Semaphore(max(1, plan.concurrency))
    samples: list[Sample] = []

    async def series(target: ProbeTarget, spec: PromptSpec) -> None:
        params = target.params
        if params.force_tool_call != spec.tool_call or params.cache_breakpoint != (spec.cache == "warm"):
            # Frozen: the target's own is used as it is when it already says the same (most series).
            params = replace(params, force_tool_call=spec.tool_call, cache_breakpoint=spec.cache == "warm")
        warmups = max(plan.warmup, 1) if spec.primed else plan.warmup
        total = warmups + plan.rounds
        # A stop (`draining`) ends the series once it has measured a round: the tick is stored for every series
        # that started, as it would have been had the stop come a moment later.
        stop = None
        for index in range(total):
            if index:
                await sleep_unless(draining, plan.pause_s)  # a pause is only spacing: a stop cuts it short
            if stop is not None and stop.is_set():
                return
            warmup = index < warmups
            sample = Sample(
                target=target.name,
                model=target.params.model,
                api=target.endpoint.flavor.name,
                prompt=spec.name,
                round=index + 1,
                warmup=warmup,
                intended_at=intended,
                prompt_tokens_target=spec.tokens,
            )
            with meter.measuring() if meter is not None else contextlib.nullcontext():
                async with gate, limits.get(target.provider):
                    if stop is not None and stop.is_set():  # it waited for a slot while the stop came
                        return
                    text = prompts.text_for(target.name, spec, warmup=warmup)
                    await client.probe(target.endpoint, params, text, sample)
                    # Before the slot is free: the request that takes it next is sized with this count.
                    prompts.calibration.observe(
                        (target.name, spec.name), len(text), sample.prompt_tokens, family=spec.family(target.name)
                    )
                try:
                    if meter is not None:  # outside the slot: waiting for the meter's next wake-up holds up no probe
                        await meter.settle(sample)
                finally:  # cancelled while settling, the sample is judged on what the meter saw, and kept
                    if meter is not None:
                        meter.judge(sample, bound_ms=self_delay_bound_ms)
                    samples.append(sample)
                    if on_sample is not None:
                        on_sample(sample)
            if not warmup:
                stop = draining

    async with asyncio.TaskGroup() as group:
        started = 0
        for target in plan.targets:
            for spec in plan.prompts:
                if plan.series is None or (target.name, spec.name) in plan.series:
                    group.create_task(series(target, spec))
                    started += 1
                    if started % START_STEP == 0:
                        # Each task's first step runs in the loop's next turn: all of a job's series in one
                        # turn held every probe in flight and every timer due for 10-20 ms at a tick's start.
                        await asyncio.sleep(0)
    return samples
