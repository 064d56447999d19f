"""APScheduler 3 wrapper: one CronTrigger per job, nothing skipped silently.

Choices, deliberately:
- `max_instances=1`: a job still running when its next tick comes is not started twice; the tick
  is counted as missed (`reason="still_running"`), because overlapping runs would measure each other.
- `coalesce=True`: after a stall (suspended VM, blocked loop) several due ticks run once, not in a
  burst; the ones folded away are counted (`reason="coalesced"`), read from the schedule itself:
  APScheduler 3 hands a coalesced submission only its last run time.
- `misfire_grace_time`: a tick that could not start within this many seconds is dropped and counted
  (`reason="misfired"`): a probe hours late would be recorded at the wrong time of day.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import structlog
from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_PAUSED
from apscheduler.triggers.cron import CronTrigger

from monitor.config.cron import build_trigger
from monitor.config.models import Job
from monitor.metrics.definitions import Metrics
from monitor.schedule.clock import ClockWatch

MISFIRE_GRACE_S = 30
MAX_COUNTED_TICKS = 100_000
RunJob = Callable[[Job, datetime], Awaitable[None]]


def _timing(job: Job) -> tuple[str, str, float]:
    """What decides when a job's ticks fall: a reload changing none of it leaves the job alone."""
    return (job.schedule, job.timezone, job.jitter_s)


def nominal_fire_time(job: Job, run_time: datetime) -> datetime:
    """The tick a (possibly jittered) run time belongs to: the same on every replica."""
    if not job.jitter_s:
        return run_time
    plain = build_trigger(job.schedule, job.timezone, 0)
    start = run_time - timedelta(seconds=job.jitter_s + 1)
    fire = plain.get_next_fire_time(None, start)
    best = fire
    while fire is not None and fire <= run_time:
        best = fire
        fire = plain.get_next_fire_time(fire, fire + timedelta(microseconds=1))
    return best or run_time


def ticks_between(
    job: Job, after: datetime, before: datetime, *, limit: int = MAX_COUNTED_TICKS
) -> tuple[int, datetime | None]:
    """(how many, the first) of the job's nominal ticks strictly between `after` and `before`.

    Pure: the schedule read without jitter. Counting stops at `limit` (a year of a per-second
    schedule is not walked tick by tick); the count is then `limit`.
    """
    plain = build_trigger(job.schedule, job.timezone, 0)
    fire = plain.get_next_fire_time(None, after + timedelta(microseconds=1))
    first = fire if fire is not None and fire < before else None
    count = 0
    while fire is not None and fire < before and count < limit:
        count += 1
        fire = plain.get_next_fire_time(fire, fire + timedelta(microseconds=1))
    return count, first


class _SteppedScheduler(AsyncIOScheduler):  # type: ignore[misc]  # APScheduler 3 ships no types: Any
    """Looks at the clocks each time it wakes, before it reads the wall clock to find the due ticks.

    Its timer runs on the monotonic clock, so it can wake right after a step that the half-second
    check has not seen yet. Re-arming after the due ticks were handed out gave out the tick just
    submitted a second time (run twice, or counted as skipped because its first run still went).
    """

    def __init__(self, before_wakeup: Callable[[], object], **options: object) -> None:
        super().__init__(**options)
        self._before_wakeup = before_wakeup

    def _process_jobs(self) -> float | None:
        if self.state != STATE_PAUSED:
            self._before_wakeup()
        wait: float | None = super()._process_jobs()
        return wait


class JobScheduler:
    def __init__(self, run_job: RunJob, *, metrics: Metrics | None = None, clock: ClockWatch | None = None) -> None:
        self._run_job = run_job
        self._metrics = metrics
        self._clock = clock or ClockWatch()
        self._scheduler = _SteppedScheduler(self.check_clock, job_defaults={"misfire_grace_time": MISFIRE_GRACE_S})
        # Its skip and misfire warnings are ours to log (with the job and a reason) and to count.
        logging.getLogger("apscheduler").setLevel(logging.ERROR)
        self._scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self._jobs: dict[str, Job] = {}
        self._intended: dict[str, datetime] = {}
        # Per job, the last nominal tick the scheduler accounted for (started, skipped or missed).
        self._accounted: dict[str, datetime] = {}
        # The wall-clock steps seen so far, summed, and its value when each job's tick was submitted:
        # a step between the submission and the run's start makes the run look late (or early).
        self._stepped_s = 0.0
        self._stepped_at_submission: dict[str, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._log = structlog.get_logger()

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def set_jobs(self, jobs: list[Job], *, since: datetime | None = None) -> None:
        """Schedule `jobs` (start-up and reload), changing only what changed.

        A job whose schedule, timezone and jitter are unchanged is left alone in the job store, so a
        tick that fell due while the reload held the loop still runs (removing and re-adding it
        computed its next run from after the tick, and the tick was lost). A new or re-timed job
        gets its first tick from `since` (when the reload was asked for), not from now. Running job
        instances finish undisturbed; the next tick of a kept job uses its new definition.
        """
        since = since or datetime.now(UTC)
        wanted = {job.name: job for job in jobs}
        for name in list(self._jobs):
            if name not in wanted:
                self._scheduler.remove_job(name)
                self._accounted.pop(name, None)
                self._stepped_at_submission.pop(name, None)
        for job in jobs:
            old = self._jobs.get(job.name)
            if old is not None and _timing(old) == _timing(job):
                continue
            trigger: CronTrigger = build_trigger(job.schedule, job.timezone, job.jitter_s)
            first = trigger.get_next_fire_time(None, since)
            self._accounted.pop(job.name, None)  # the ticks of another schedule are not this one's
            if old is not None:
                self._scheduler.modify_job(job.name, trigger=trigger, next_run_time=first)
                continue
            self._scheduler.add_job(
                self._fire,
                trigger=trigger,
                args=(job.name,),
                id=job.name,
                name=job.name,
                max_instances=1,
                coalesce=True,
                replace_existing=True,
                next_run_time=first,
            )
        self._jobs = wanted

    def check_clock(self, *, ran: tuple[str, datetime] | None = None) -> float | None:
        """Re-arm the schedule when the wall clock stepped since the last check; the step, or None.

        Called every half second from the probes' loop and before each tick is accounted for. Each
        job's next tick is computed again from the new wall time (back: the old one lay ahead by
        the step, and nothing probed until then; forward: the ticks stepped over are not counted
        as folded, they never came), and the last-run times exported are moved by the step, so
        none lies in the future and none looks fresher than it is. `ran` is the job and run time
        being accounted for when the check comes from a submission: that tick is not armed again.
        """
        stepped = self._clock.check()
        if stepped is None:
            return None
        step, wall, since_wall = stepped
        self._stepped_s += step
        now = datetime.fromtimestamp(wall, UTC)
        # From the last check's moment on the new clock, not from now: a tick of the new clock that fell
        # between the step and this check (up to half a second) is due at once, not skipped unseen.
        since = datetime.fromtimestamp(since_wall, UTC)
        self._accounted.clear()
        for scheduled in self._scheduler.get_jobs():
            if scheduled.next_run_time is not None:
                start = since
                # A run time after now was read on the old clock (a step back between the two reads),
                # and `since` already lies past it on the new one.
                if ran is not None and ran[0] == scheduled.id and since <= ran[1] <= now:
                    start = ran[1] + timedelta(microseconds=1)
                self._scheduler.modify_job(
                    scheduled.id, next_run_time=scheduled.trigger.get_next_fire_time(None, start)
                )
        direction = "forward" if step > 0 else "backward"
        if self._metrics is not None:
            self._metrics.clock_steps.labels(direction).inc()
            self._metrics.shift_job_last_run(step, now=wall)
        self._log.warning(
            "clock_step",
            step_s=round(step, 3),
            direction=direction,
            now=now.isoformat(),
            next_runs={k: v.isoformat() if v else None for k, v in self.next_run_times().items()},
        )
        return step

    def next_run_times(self) -> dict[str, datetime | None]:
        return {job.id: job.next_run_time for job in self._scheduler.get_jobs()}

    def start(self) -> None:
        self._scheduler.start()

    def pause(self) -> None:
        """Stop starting new ticks; job instances already running go on (the daemon waits for them)."""
        if self._scheduler.running:
            self._scheduler.pause()

    def shutdown(self) -> None:
        # APScheduler's asyncio executor cancels the jobs still running: call after they finished.
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    async def _fire(self, name: str) -> None:
        job = self._jobs.get(name)
        intended = self._intended.pop(name, None)
        if job is None or intended is None:
            return
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        try:
            await self._run_job(job, nominal_fire_time(job, intended))
        except asyncio.CancelledError:
            # Cancelled at shutdown once the grace is over: the daemon has logged it and the samples
            # taken are handed to the store. Ending normally keeps APScheduler from logging an error.
            return
        finally:
            if task is not None:
                self.tasks.discard(task)

    def _count_miss(self, job: str, reason: str, n: int = 1) -> None:
        if self._metrics is not None:
            self._metrics.scheduler_missed.labels(job, reason).inc(n)

    def _account(self, job_id: str, run_time: datetime) -> None:
        """Count the ticks folded away before `run_time` (started or skipped now): APScheduler 3 hands
        a coalesced submission only its last run time, so they are read from the schedule itself."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        # Seen at each wake-up already; this catches a step between that check and the scheduler's
        # reading of the clock. A forward step is not a stall: its ticks never came.
        self.check_clock(ran=(job_id, run_time))
        tick = nominal_fire_time(job, run_time)
        previous = self._accounted.get(job_id)
        self._accounted[job_id] = tick
        if previous is None or tick <= previous:  # the first tick, or the wall clock went back
            return
        folded, first = ticks_between(job, previous, tick)
        if folded and first is not None:
            self._count_miss(job_id, "coalesced", folded)
            self._log.warning(
                "job_runs_coalesced",
                job=job_id,
                missed=folded,
                first_missed=first.isoformat(),
                scheduled=tick.isoformat(),
                reason="the process or its event loop was held up past these ticks; they ran once, late",
            )

    def _rearm_stepped_miss(self, job_id: str, run_time: datetime) -> bool:
        """A tick that looked missed only because the wall clock stepped forward between its
        submission and its start (APScheduler reads the clock again there) runs now; True if so."""
        self.check_clock()
        moved = self._stepped_s - self._stepped_at_submission.get(job_id, self._stepped_s)
        scheduled, job = self._scheduler.get_job(job_id), self._jobs.get(job_id)
        if not moved or scheduled is None or job is None:
            return False
        # The same moment on the new clock, onto the schedule (a step is measured to a few microseconds).
        moment = nominal_fire_time(job, run_time) + timedelta(seconds=moved)
        tick = build_trigger(job.schedule, job.timezone, 0).get_next_fire_time(None, moment - timedelta(milliseconds=1))
        if tick is None or abs(self._clock.wall - tick.timestamp()) > MISFIRE_GRACE_S:
            return False
        if scheduled.next_run_time is None or tick < scheduled.next_run_time:
            self._scheduler.modify_job(job_id, next_run_time=tick)
        self._log.info("job_run_rearmed_after_clock_step", job=job_id, scheduled=tick.isoformat())
        return True

    def _on_event(self, event: JobEvent) -> None:
        if isinstance(event, JobSubmissionEvent) and event.code == EVENT_JOB_SUBMITTED:
            run_time = max(event.scheduled_run_times)
            self._intended[event.job_id] = run_time
            self._account(event.job_id, run_time)
            self._stepped_at_submission[event.job_id] = self._stepped_s
        elif event.code == EVENT_JOB_MISSED and self._rearm_stepped_miss(event.job_id, event.scheduled_run_time):
            return
        elif event.code == EVENT_JOB_MISSED:
            # Its submission accounted for the ticks before it; this one is the misfire itself.
            self._count_miss(event.job_id, "misfired")
            self._log.warning(
                "job_run_missed",
                job=event.job_id,
                scheduled=event.scheduled_run_time.isoformat(),
                reason=f"could not start within {MISFIRE_GRACE_S} s of its time",
            )
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            if isinstance(event, JobSubmissionEvent) and event.scheduled_run_times:
                self._account(event.job_id, max(event.scheduled_run_times))
            self._count_miss(event.job_id, "still_running")
            self._log.warning("job_run_skipped", job=event.job_id, reason="the previous run is still going")
