"""The monitor's own delay: the loop-lateness meter (a table of windows), and probes against the real
simulator (a child process, so blocking our loop does not slow the server) marked disturbed or not."""

from __future__ import annotations

import asyncio
import time

import pytest

from monitor.probe.client import ProbeClient
from monitor.probe.endpoint import Timeouts
from monitor.probe.plan import adhoc_target
from monitor.probe.prompts import Calibration, PromptFactory, PromptSpec
from monitor.probe.report import render_table, summarize
from monitor.probe.result import Sample, TimingPath
from monitor.probe.runner import ProviderLimits, RunPlan, run_plan
from monitor.probe.self_delay import LoopDelayMeter, is_disturbed
from tests.conftest import SimProcess

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo

MS = 1_000_000

# Wake-ups as (woke at, late by), in ms; then windows [start, end] and the worst lateness overlapping them.
TICKS = [(5, 0.1), (10, 0.2), (65, 55), (70, 0.1), (75, 3), (80, 0.1)]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 9, 0.1),  # only the first wake-up's late interval reaches into it
        (0, 9.9, 0.2),
        (11, 14, 55.0),  # a stall covering the whole window shows at the wake-up after it (at 65, late from 10)
        (0, 12, 55.0),  # a stall that began before the window's end
        (20, 30, 55.0),
        (66, 73, 3.0),  # the wake-up at 75 was late from 72
        (71, 71.5, 0.0),  # ... not yet at 71.5
        (76, 79.95, 0.1),
        (90, 95, 0.0),  # nothing recorded after it yet: no lateness known
    ],
)
def test_max_lateness_is_the_worst_wake_up_whose_late_interval_overlaps_the_window(
    start: float, end: float, expected: float
) -> None:
    meter = LoopDelayMeter(clock=lambda: 1)
    meter._started = 1  # as if started; no timer armed
    for woke, late in TICKS:
        meter.record(int(woke * MS), int(late * MS))
    assert meter.max_lateness(int(start * MS), int(end * MS)) == pytest.approx(expected)


def test_a_meter_that_never_ran_knows_nothing() -> None:
    assert LoopDelayMeter().max_lateness(0, 10 * MS) is None


@pytest.mark.parametrize(
    ("delay", "bound", "disturbed"), [(None, 5, False), (0.3, 5, False), (5.0, 5, False), (5.01, 5, True)]
)
def test_a_sample_is_disturbed_only_beyond_the_bound(delay: float | None, bound: float, disturbed: bool) -> None:
    assert is_disturbed(delay, bound) is disturbed


async def test_the_meter_sees_a_50ms_block_of_the_loop() -> None:
    meter = LoopDelayMeter()
    meter.start()
    with meter.measuring():
        await asyncio.sleep(0.05)
        start = time.perf_counter_ns()
        asyncio.get_running_loop().call_soon(time.sleep, 0.05)
        await asyncio.sleep(0.02)
        end = time.perf_counter_ns()
        await meter.settled(end)
        assert (meter.max_lateness(start, end) or 0) >= 40
        await asyncio.sleep(0.05)
        quiet_start = time.perf_counter_ns()
        await asyncio.sleep(0.05)
        quiet_end = time.perf_counter_ns()
        await meter.settled(quiet_end)
        assert (meter.max_lateness(quiet_start, quiet_end) or 0) < 5
    meter.stop()


async def test_the_meter_ticks_only_while_a_probe_holds_it() -> None:
    meter = LoopDelayMeter()
    meter.start()
    await asyncio.sleep(0.03)
    assert meter.ticks == 0
    with meter.measuring():
        await asyncio.sleep(0.03)
    ticked = meter.ticks
    assert ticked >= 3
    await asyncio.sleep(0.03)
    assert meter.ticks <= ticked + 1  # the one armed before release, then nothing
    meter.stop()


def _plan(sim: SimProcess, model: str) -> RunPlan:
    target = adhoc_target(
        url=sim.v1,
        api="openai-chat",
        model=model,
        api_key=None,
        max_tokens=8,
        extra_body={},
        include_usage=True,
        timeouts=Timeouts(connect=2, first_token=10, total=20),
    )
    return RunPlan(targets=(target,), prompts=(PromptSpec("short", 128),), rounds=1, warmup=0, pause_s=0)


async def _probe_once(
    sim: SimProcess, meter: LoopDelayMeter, *, block_after_s: float | None, kernel_stamps: bool = True
) -> Sample:
    plan = _plan(sim, "qwen3-8b")
    loop = asyncio.get_running_loop()
    if block_after_s is not None:
        # A callback of ours that hogs the loop while the server is still working on the first token.
        loop.call_later(block_after_s, time.sleep, 0.05)
    async with ProbeClient(kernel_stamps=kernel_stamps) as client:
        samples = await run_plan(
            plan,
            client=client,
            limits=ProviderLimits({}),
            prompts=PromptFactory(Calibration()),
            meter=meter,
            self_delay_bound_ms=5.0,
        )
    (sample,) = samples
    assert sample.ok, sample.error_message
    return sample


async def test_a_probe_during_which_the_loop_was_blocked_is_marked_disturbed(exact_sim: SimProcess) -> None:
    # Timed when the loop reads the bytes, a block while the server works may be in the TTFT.
    exact_sim.post("/sim/models/qwen3-8b", {"ttft_base_ms": 300, "prefill_ms_per_1k": 0})
    meter = LoopDelayMeter()
    meter.start()
    try:
        await _probe_once(exact_sim, meter, block_after_s=None, kernel_stamps=False)  # warm the imports
        sample = await _probe_once(exact_sim, meter, block_after_s=0.1, kernel_stamps=False)
    finally:
        meter.stop()
    assert sample.timing_path is TimingPath.STAMPED
    assert sample.self_delay_ms is not None and sample.self_delay_ms >= 40, sample.self_delay_ms
    assert sample.disturbed


async def test_a_block_over_before_the_first_token_arrived_is_not_in_a_kernel_stamped_ttft(
    exact_sim: SimProcess,
) -> None:
    # The same block, with the kernel's arrival stamps: it ended 150 ms before the first token came, so
    # the token was read as it arrived; the monitor still says it was late, and the sample is evidence.
    exact_sim.post("/sim/models/qwen3-8b", {"ttft_base_ms": 300, "prefill_ms_per_1k": 0})
    meter = LoopDelayMeter()
    meter.start()
    try:
        await _probe_once(exact_sim, meter, block_after_s=None)
        sample = await _probe_once(exact_sim, meter, block_after_s=0.1)
    finally:
        meter.stop()
    assert sample.timing_path is TimingPath.KERNEL
    assert sample.self_delay_ms is not None and sample.self_delay_ms >= 40, sample.self_delay_ms
    assert sample.first_token_read_mono_ns is not None
    assert not sample.disturbed


async def test_a_quiet_probe_records_its_self_delay_under_the_bound(exact_sim: SimProcess) -> None:
    exact_sim.post("/sim/models/qwen3-8b", {"ttft_base_ms": 100, "prefill_ms_per_1k": 0})
    meter = LoopDelayMeter()
    meter.start()
    try:
        await _probe_once(exact_sim, meter, block_after_s=None)
        sample = await _probe_once(exact_sim, meter, block_after_s=None)
    finally:
        meter.stop()
    assert sample.self_delay_ms is not None and sample.self_delay_ms < 5, sample.self_delay_ms
    assert not sample.disturbed


def test_probes_table_leaves_disturbed_samples_out_of_its_figures_and_says_so() -> None:
    def sample(round_: int, ttft: float, *, disturbed: bool = False) -> Sample:
        return Sample("a", "m", "openai-chat", "short", round_, ttft_ms=ttft, disturbed=disturbed)

    rows = summarize([sample(1, 100.0), sample(2, 900.0, disturbed=True), sample(3, 120.0)])
    assert [(r.samples, r.disturbed, r.ttft_max_ms) for r in rows] == [(3, 1, 120.0)]
    text = render_table(rows)
    assert "disturbed (this monitor was itself late around the stamps" in text
    assert "  1 of 3: a / short" in text
    assert "disturbed" not in render_table(summarize([sample(1, 100.0)]))


class _SlowToSettle(LoopDelayMeter):
    """A meter whose wait for its next wake-up never ends, so a test can cancel the run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.settling = asyncio.Event()

    async def settle(self, sample: Sample) -> None:
        self.settling.set()
        await asyncio.sleep(60)


async def test_a_run_cancelled_while_its_sample_settles_keeps_the_judged_sample(exact_sim: SimProcess) -> None:
    meter = _SlowToSettle()
    meter.start()
    kept: list[Sample] = []
    async with ProbeClient() as client:
        task = asyncio.create_task(
            run_plan(
                _plan(exact_sim, "qwen3-8b"),
                client=client,
                limits=ProviderLimits({}),
                prompts=PromptFactory(Calibration()),
                on_sample=kept.append,
                meter=meter,
                self_delay_bound_ms=5.0,
            )
        )
        await asyncio.wait_for(meter.settling.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    meter.stop()
    [sample] = kept
    assert sample.ok and sample.self_delay_ms is not None
