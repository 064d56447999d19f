"""The scheduler wrapper on its own: which tick a jittered run belongs to, and every missed tick counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)

from monitor.config.models import Job
from monitor.metrics.definitions import Metrics
from monitor.schedule.clock import ClockWatch, wall_clock_step
from monitor.schedule.scheduler import JobScheduler, nominal_fire_time, ticks_between


def job(schedule: str, jitter_s: float = 0, name: str = "alpha") -> Job:
    return Job(name=name, schedule=schedule, jitter_s=jitter_s, targets=["t"], prompts=["p"])


def at(hour: int, minute: int, second: int = 0, micro: int = 0) -> datetime:
    return datetime(2026, 3, 2, hour, minute, second, micro, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "jitter_s", "run_time", "tick"),
    [
        ("*/5 * * * *", 0, at(12, 5, 17), at(12, 5, 17)),  # no jitter: the run time is the tick
        ("*/5 * * * *", 30, at(12, 5, 0), at(12, 5)),  # jitter drew 0
        ("*/5 * * * *", 30, at(12, 5, 17), at(12, 5)),
        ("*/5 * * * *", 30, at(12, 5, 30), at(12, 5)),  # the largest delay
        ("*/5 * * * *", 30, at(12, 5, 29, 999999), at(12, 5)),
        ("0 * * * *", 120, at(13, 1, 59), at(13, 0)),
        ("0 * * * *", 120, at(13, 0, 0, 1), at(13, 0)),
        ("* * * * *", 50, at(8, 0, 49), at(8, 0)),  # ticks closer than twice the jitter
        ("* * * * *", 50, at(8, 1, 10), at(8, 1)),
    ],
)
def test_a_jittered_run_belongs_to_the_tick_at_or_before_it(schedule, jitter_s, run_time, tick):
    assert nominal_fire_time(job(schedule, jitter_s), run_time) == tick


def missed(metrics: Metrics, job_name: str, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "ttft_monitor_scheduler_missed_runs_total", {"probe_job": job_name, "reason": reason}
    )
    return value or 0.0


async def eventually(condition: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


async def nothing(_job: Job, _tick: datetime) -> None:
    return None


def test_it_counts_coalesced_misfired_and_still_running_ticks_per_job_and_reason():
    metrics = Metrics()
    scheduler = JobScheduler(nothing, metrics=metrics)
    scheduler.set_jobs([job("*/5 * * * *"), job("*/5 * * * *", name="beta")])
    # APScheduler 3 hands a coalesced submission only its last run time: the folded ticks come from the schedule.
    scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "alpha", "default", [at(12, 0)]))
    scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "alpha", "default", [at(12, 15)]))
    scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "beta", "default", [at(12, 10)]))
    scheduler._on_event(JobExecutionEvent(EVENT_JOB_MISSED, "alpha", "default", at(12, 15)))
    scheduler._on_event(JobSubmissionEvent(EVENT_JOB_MAX_INSTANCES, "beta", "default", [at(12, 15)]))
    scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "beta", "default", [at(12, 20)]))
    assert missed(metrics, "alpha", "coalesced") == 2  # 12:05 and 12:10 were folded into 12:15
    assert missed(metrics, "beta", "coalesced") == 0  # 12:15 was skipped and counted as such, not again
    assert missed(metrics, "alpha", "misfired") == 1
    assert missed(metrics, "beta", "still_running") == 1
    assert missed(metrics, "alpha", "still_running") == 0


@pytest.mark.parametrize(
    ("schedule", "jitter_s", "after", "before", "count", "first"),
    [
        ("*/5 * * * *", 0, at(12, 0), at(12, 5), 0, None),  # consecutive ticks
        ("*/5 * * * *", 0, at(12, 0), at(12, 15), 2, at(12, 5)),
        ("*/5 * * * *", 60, at(12, 0), at(12, 15), 2, at(12, 5)),  # nominal ticks, jitter left out
        ("* * * * * *", 0, at(12, 0), at(12, 1), 59, at(12, 0, 1)),
        ("0 * * * *", 0, at(12, 0), at(12, 0), 0, None),
        ("* * * * * *", 0, at(12, 0), at(13, 0), 1000, at(12, 0, 1)),  # capped (limit=1000 below)
    ],
)
def test_the_ticks_folded_between_two_runs_come_from_the_schedule(schedule, jitter_s, after, before, count, first):
    assert ticks_between(job(schedule, jitter_s), after, before, limit=1000) == (count, first)


async def test_a_tick_due_while_the_last_run_still_goes_is_skipped_and_counted():
    metrics = Metrics()
    started: list[datetime] = []
    release = asyncio.Event()

    async def slow(_job: Job, tick: datetime) -> None:
        started.append(tick)
        await release.wait()

    scheduler = JobScheduler(slow, metrics=metrics)
    scheduler.set_jobs([job("* * * * * *")])  # every second
    scheduler.start()
    try:
        await eventually(lambda: missed(metrics, "alpha", "still_running") >= 2, 10)
        assert len(started) == 1  # never two runs of one job at once
        assert started[0].microsecond == 0  # the nominal tick, not the moment it started
    finally:
        release.set()
        scheduler.pause()
        await eventually(lambda: not scheduler.tasks, 5)
        scheduler.shutdown()


async def test_a_reload_leaves_unchanged_jobs_alone_and_re_times_changed_ones_from_when_it_was_asked():
    ran: list[tuple[str, int]] = []

    async def record(j: Job, _tick: datetime) -> None:
        ran.append((j.name, j.rounds))

    scheduler = JobScheduler(record, metrics=Metrics())
    scheduler.set_jobs([job("0 3 * * *", name="kept"), job("0 4 * * *", name="moved"), job("0 5 * * *", name="gone")])
    scheduler.start()
    try:
        before = scheduler.next_run_times()
        asked = datetime.now(UTC)
        kept = job("0 3 * * *", name="kept").model_copy(update={"rounds": 7})
        scheduler.set_jobs([kept, job("0 6 * * *", name="moved"), job("0 7 * * *", name="new")], since=asked)
        after = scheduler.next_run_times()
        assert set(after) == {"kept", "moved", "new"}
        assert after["kept"] == before["kept"]  # not re-added: a tick due during the reload still runs
        assert after["moved"] is not None and after["moved"].hour == 6
        # A re-timed job whose new tick fell due while the reload ran still gets it.
        due = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=0)
        scheduler.set_jobs([kept, job(f"{due.second} * * * * *", name="moved")], since=due - timedelta(seconds=0.5))
        await eventually(lambda: ("moved", 5) in ran, 3)  # not a minute later
        assert scheduler._jobs["kept"].rounds == 7  # the next tick of a kept job runs its new definition
    finally:
        scheduler.pause()
        await eventually(lambda: not scheduler.tasks, 5)
        scheduler.shutdown()


@pytest.mark.parametrize(
    ("before", "after", "step"),
    [
        ((1000.0, 50.0), (1000.5, 50.5), None),  # both moved alike
        ((1000.0, 50.0), (1030.0, 80.0), None),  # a stalled process: both moved alike, far
        ((1000.0, 50.0), (1001.9, 50.5), None),  # within the threshold
        ((1000.0, 50.0), (880.5, 50.5), -120.0),
        ((1000.0, 50.0), (4600.5, 50.5), 3600.0),
    ],
)
def test_a_wall_clock_step_is_what_the_wall_clock_moved_beyond_the_monotonic_one(before, after, step):
    assert wall_clock_step(before, after) == step


async def test_a_backward_step_re_arms_the_schedule_from_the_new_time_and_moves_the_last_run_back():
    readings = [(time.time(), 100.0)]
    metrics = Metrics()
    scheduler = JobScheduler(nothing, metrics=metrics, clock=ClockWatch(read=lambda: readings[-1]))
    scheduler.set_jobs([job("0 3 * * *")])
    scheduler.start()
    try:
        metrics.job_last_run.labels("alpha").set(readings[-1][0])
        assert scheduler.check_clock() is None
        armed = scheduler.next_run_times()["alpha"]
        # The clocks as read after a step two days back (a reading the real clock cannot give).
        readings.append((readings[-1][0] - 2 * 86400 + 0.5, 100.5))
        assert scheduler.check_clock() == pytest.approx(-2 * 86400)
        rearmed = scheduler.next_run_times()["alpha"]
        assert armed is not None and rearmed is not None
        assert armed - rearmed == timedelta(days=2)  # from the new wall time, not two days ahead
        assert metrics.registry.get_sample_value("ttft_monitor_clock_steps_total", {"direction": "backward"}) == 1
        last = metrics.registry.get_sample_value("ttft_monitor_job_last_run_timestamp_seconds", {"probe_job": "alpha"})
        assert last is not None and last <= readings[-1][0]  # never in the future
        assert scheduler.check_clock() is None  # counted once
    finally:
        scheduler.shutdown()


async def test_a_tick_of_the_new_clock_between_the_step_and_its_check_runs_instead_of_being_skipped():
    wall = float(int(time.time())) + 0.5
    readings = [(wall, 100.0)]
    scheduler = JobScheduler(nothing, metrics=Metrics(), clock=ClockWatch(read=lambda: readings[-1]))
    scheduler.set_jobs([job("* * * * * *")])
    scheduler.start()
    try:
        assert scheduler.check_clock() is None
        # Two minutes back, seen 0.9 s after the last check: the new clock passed a second boundary
        # (at wall - 120 + 0.5) in between, which must still run.
        readings.append((wall - 120 + 0.9, 100.9))
        assert scheduler.check_clock() == pytest.approx(-120)
        rearmed = scheduler.next_run_times()["alpha"]
        assert rearmed is not None and abs(rearmed.timestamp() - (wall - 120 + 0.5)) < 0.01, rearmed
    finally:
        scheduler.shutdown()


async def test_a_forward_step_first_seen_by_a_tick_does_not_arm_that_tick_again():
    """The wall clock steps forward (back from two minutes behind) just before a tick, and the loop's
    timer fires that tick before the half-second check saw the step: the tick is accounted on the new
    clock and re-arming must not hand the same tick out again (it ran twice, or was counted as
    skipped because its first run was still going)."""
    # A fake wall clock against the real monotonic one: two minutes behind until `offset` is cleared.
    offset = [-120.0]
    metrics = Metrics()
    started: list[datetime] = []

    async def slow(_job: Job, tick: datetime) -> None:
        started.append(tick)
        await asyncio.sleep(0.3)

    scheduler = JobScheduler(
        slow, metrics=metrics, clock=ClockWatch(read=lambda: (time.time() + offset[0], time.monotonic()))
    )
    scheduler.set_jobs([job("* * * * * *")])  # every second
    scheduler.start()
    try:
        for _ in range(2):
            await eventually(lambda: len(started) >= 1, 5)
            # 0.3 s before a second boundary: a last check on the old clock, then the step.
            await asyncio.sleep(1.7 - time.time() % 1)
            assert scheduler.check_clock() is None
            offset[0] = 0.0 if offset[0] else -120.0  # forward, then back again
            await asyncio.sleep(0.8)  # past the boundary, whose tick sees the step first
        await asyncio.sleep(0.5)
        assert len(started) == len(set(started)), started  # no tick handed out twice
        assert missed(metrics, "alpha", "still_running") == 0
        assert missed(metrics, "alpha", "coalesced") == 0
        assert metrics.registry.get_sample_value("ttft_monitor_clock_steps_total", {"direction": "forward"}) == 1
    finally:
        scheduler.pause()
        await eventually(lambda: not scheduler.tasks, 5)
        scheduler.shutdown()


async def test_a_tick_whose_start_came_after_a_forward_step_runs_instead_of_being_counted_missed():
    """APScheduler reads the wall clock again when the run starts: a step forward between the
    submission and the start made an on-time tick look minutes late, and it was dropped as misfired."""
    offset = [0.0]
    metrics = Metrics()
    scheduler = JobScheduler(
        nothing, metrics=metrics, clock=ClockWatch(read=lambda: (time.time() + offset[0], time.monotonic()))
    )
    scheduler.set_jobs([job("* * * * * *")])
    scheduler.start()
    try:
        tick = datetime.fromtimestamp(int(time.time()), UTC)
        scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "alpha", "default", [tick]))
        offset[0] = 120.0  # the step, before the run started
        scheduler._on_event(JobExecutionEvent(EVENT_JOB_MISSED, "alpha", "default", tick))
        assert missed(metrics, "alpha", "misfired") == 0
        assert scheduler.next_run_times()["alpha"] == tick + timedelta(seconds=120)  # the same moment, new clock
        # Without a step in between, a late start is still a misfire.
        scheduler._on_event(JobSubmissionEvent(EVENT_JOB_SUBMITTED, "alpha", "default", [tick]))
        scheduler._on_event(JobExecutionEvent(EVENT_JOB_MISSED, "alpha", "default", tick))
        assert missed(metrics, "alpha", "misfired") == 1
    finally:
        scheduler.shutdown()
