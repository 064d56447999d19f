"""Finished runs leave the probe path here: a job hands its batch over and returns at once.

Two stages, each one task, each strictly in order:

- writing: the writer stores the batch, or spools it when the database is down, slow or behind
  (the spool is local disk, so a hung database delays a write by the writer's timeout at most,
  and only this stage, never the next tick);
- aftercare, for runs the database holds: calibration fits and detection, each with a bounded
  wait. Runs stored later by the spool's replay join the same queue when they land, so detection
  still sees every stored run, in the order stored.

At shutdown `close` gives both stages what is left of the grace; whatever the writing stage has
not written by then goes to the spool, so nothing measured is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from monitor.logging import Bounded, error_text
from monitor.store.records import Batch

# Detection and calibration saves after a run, at most this long. In the daemon they queue behind
# one another, so a hung database must not pile them up; a run past its budget goes undetected
# (logged as `detection_skipped`) and probing goes on.
AFTERCARE_TIMEOUT_S = 10.0
# In `once` nothing waits behind detection but the process's exit (bounded by the CronJob's deadline
# and by SIGTERM), and a skipped detection delays a page by a whole schedule period: seen at 7.7 s
# for one incident on a node whose two cores a real vLLM and other work kept busy.
ONCE_AFTERCARE_TIMEOUT_S = 60.0
# A batch's detection gets that bound or this long per run, whichever is more: one job of 4,000
# series evaluated 40% of its runs in 10 s on a loaded machine (6 ms a run), and with the bound cut
# short, none of the groups it had opened was notified. The detector stops evaluating when its budget
# is spent (it counts what it left) and then notifies the groups it changed, within a margin more.
AFTERCARE_PER_RUN_S = 0.025
GROUP_NOTIFY_MARGIN_S = 5.0


def detection_budget_s(runs: int, bound_s: float) -> float:
    """How long detecting a batch of `runs` may take, given the per-batch bound."""
    return max(bound_s, AFTERCARE_PER_RUN_S * runs)


def aftercare_deadline_s(budget_s: float) -> float:
    """The hard stop around a batch's aftercare: its detection budget, then time to notify (a
    database too slow for that gets no more: the next batch is waiting)."""
    return budget_s + min(GROUP_NOTIFY_MARGIN_S, budget_s)


class AfterStore(Protocol):
    """Detection after a stored batch: evaluate its runs for at most `budget_s` (None: no bound), then
    notify what changed."""

    def __call__(self, job: str, batch: Batch, *, budget_s: float | None = None) -> Awaitable[None]: ...


# Saves a batch's moved calibration fits, (target, prompt) -> (characters per token, overhead tokens), at once.
SaveCalibration = Callable[[Mapping[tuple[str, str], tuple[float, float]]], Awaitable[None]]


class Spooled(Protocol):
    def append(self, batch: Batch) -> object: ...


class BatchWriter(Protocol):
    """What the background store needs of the writer (store.writer.ResultWriter): save a batch (or spool it
    itself when the database is away), spool one at once, and tell a listener of every committed batch."""

    @property
    def spool(self) -> Spooled: ...

    async def save(self, batch: Batch) -> str: ...

    def notify_stored(self, listener: Callable[[Batch], None]) -> None: ...


@dataclass
class _Write:
    job: str
    batch: Batch
    fits: dict[tuple[str, str], tuple[float, float]]
    done: asyncio.Future[str]


@dataclass
class _Aftercare:
    job: str
    batch: Batch = ()
    fits: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


class BackgroundStore:
    def __init__(
        self,
        writer: BatchWriter | None,
        *,
        after_store: AfterStore | None = None,
        save_calibration: SaveCalibration | None = None,
        saved_fits: dict[tuple[str, str], tuple[float, float]] | None = None,
        aftercare_timeout_s: float = AFTERCARE_TIMEOUT_S,
    ) -> None:
        self._writer = writer
        self.after_store = after_store
        self._save_calibration = save_calibration
        self.saved_fits = saved_fits if saved_fits is not None else {}
        self._aftercare_timeout_s = aftercare_timeout_s
        self._writes: asyncio.Queue[_Write] = asyncio.Queue()
        self._aftercare: asyncio.Queue[_Aftercare] = asyncio.Queue()
        self._in_hand: _Write | None = None
        self._aftercare_busy = False
        # Counted as they come and go, so that `caught_up` can wait for what came before it alone: batches
        # submitted, and finished (written, spooled or lost); aftercare queued, and done.
        self._submitted = self._finished = 0
        self._aftercare_queued = self._aftercare_done = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._log = structlog.get_logger()
        if writer is not None:
            # Runs the spool's replay stores are detected like the ones written directly.
            writer.notify_stored(self._stored)

    def attach(
        self, writer: BatchWriter, *, after_store: AfterStore | None, save_calibration: SaveCalibration | None
    ) -> None:
        """The writer of a background store made without one (`once` probes before it opens the store):
        what was submitted meanwhile waits in the queue until `start`."""
        self._writer, self.after_store, self._save_calibration = writer, after_store, save_calibration
        writer.notify_stored(self._stored)

    def start(self) -> None:
        assert self._writer is not None, "attach a writer first"
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="store-writes"),
            asyncio.create_task(self._aftercare_loop(), name="store-aftercare"),
        ]

    @property
    def pending_writes(self) -> int:
        return self._writes.qsize() + (self._in_hand is not None)

    def submit(self, job: str, batch: Batch, fits: dict[tuple[str, str], tuple[float, float]]) -> asyncio.Future[str]:
        """Queue a finished run's batch; the future resolves to the writer's outcome ("stored", ...)."""
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        item = _Write(job, batch, fits, done)
        self._submitted += 1
        if self._closing:
            self._spool_now(item)
        else:
            self._writes.put_nowait(item)
        return done

    def _stored(self, batch: Batch) -> None:
        """Called by the writer for every batch the database committed (written or replayed)."""
        if self.after_store is None:
            return
        by_job: list[tuple[str, list[Any]]] = []
        for run, samples in batch:
            if by_job and by_job[-1][0] == run.job:
                by_job[-1][1].append((run, samples))
            else:
                by_job.append((run.job, [(run, samples)]))
        for job, runs in by_job:
            self._aftercare.put_nowait(_Aftercare(job, runs))
            self._aftercare_queued += 1

    async def _write_loop(self) -> None:
        while True:
            item = await self._writes.get()
            self._in_hand = item
            try:
                assert self._writer is not None  # start() checked
                saved = str(await self._writer.save(item.batch))
            except Exception as exc:  # the writer reports its own trouble; this is a bug, keep going
                self._log.error("store_stage_failed", job=item.job, error=error_text(exc))
                saved = "lost"
            finally:
                self._in_hand = None
            if not item.done.done():
                item.done.set_result(saved)
            if item.fits and saved == "stored":
                self._aftercare.put_nowait(_Aftercare(item.job, fits=item.fits))
                self._aftercare_queued += 1
            self._finished += 1  # after its aftercare is queued (the writer queued the batch's own as it stored it)

    async def _aftercare_loop(self) -> None:
        while True:
            item = await self._aftercare.get()
            self._aftercare_busy = True
            budget_s = detection_budget_s(len(item.batch), self._aftercare_timeout_s)
            try:
                async with asyncio.timeout(aftercare_deadline_s(budget_s)):
                    if item.fits:
                        await self._save_fits(item.fits)
                    if item.batch and self.after_store is not None:
                        await self.after_store(item.job, item.batch, budget_s=budget_s)
            except Exception as exc:  # the database is slow or away: this batch's detection stops, probing goes on
                if item.batch:
                    # How many were evaluated before the stop is not known here: the detector logs
                    # `detection_skipped` with both counts when it stops itself, at its budget.
                    self._log.warning(
                        "detection_stopped",
                        job=item.job,
                        batch_runs=len(item.batch),
                        budget_s=round(budget_s, 1),
                        error=type(exc).__name__,
                        reason="detection and its notifications outlasted the batch's budget (a database "
                        "this slow); runs evaluated before the stop stay evaluated, the rest are stored "
                        "and not evaluated",
                    )
                else:
                    self._log.warning("calibration_not_saved", job=item.job, error=type(exc).__name__)
            finally:
                self._aftercare_busy = False
                self._aftercare_done += 1

    async def _save_fits(self, fits: dict[tuple[str, str], tuple[float, float]]) -> None:
        if self._save_calibration is None:
            return
        await self._save_calibration(fits)
        self.saved_fits.update(fits)

    def spool_held(self, spool: Spooled) -> None:
        """Spool what waits in the queue of a background store that never started (`once` could not open
        its database after probing): the next run replays it."""
        while not self._writes.empty():
            item = self._writes.get_nowait()
            try:
                spool.append(item.batch)
                saved = "spooled"
            except Exception as exc:
                self._log.warning("results_lost", job=item.job, runs=len(item.batch), error=Bounded(str(exc), 300))
                saved = "lost"
            self._finished += 1
            if not item.done.done():
                item.done.set_result(saved)

    def _spool_now(self, item: _Write) -> None:
        try:
            if self._writer is None:
                raise RuntimeError("no writer attached")
            self._writer.spool.append(item.batch)
            saved = "spooled"
        except Exception as exc:
            self._log.warning("results_lost", job=item.job, runs=len(item.batch), error=Bounded(str(exc), 300))
            saved = "lost"
        self._finished += 1
        if not item.done.done():
            item.done.set_result(saved)

    async def flush(self, within_s: float) -> bool:
        """Wait up to `within_s` s until every submitted batch is written (stored or spooled)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        # Polled: the state spans two queues and a task; a 20 ms poll costs nothing at shutdown.
        while self.pending_writes and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return not self.pending_writes

    async def settle(self, within_s: float) -> bool:
        """Wait up to `within_s` s until aftercare (calibration, detection) has caught up too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        if not await self.flush(within_s):
            return False
        await self._aftercare_idle(deadline - loop.time())
        return self._aftercare.empty()

    async def caught_up(self, within_s: float) -> bool:
        """Wait up to `within_s` s until every batch submitted before the call is written (stored or spooled)
        and the aftercare queued for it is done; what is submitted meanwhile is not waited for. On a daemon
        whose ticks come faster than each is written and detected (a job every second, a loaded machine),
        `settle` never finds both stages idle at once: waiting for it, the heap was never frozen after a
        first tick (`Daemon._after_first_tick`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        submitted = self._submitted
        while self._finished < submitted and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if self._finished < submitted:
            return False
        queued = self._aftercare_queued  # every finished batch's aftercare is in by now
        while self._aftercare_done < queued and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return self._aftercare_done >= queued

    async def _aftercare_idle(self, within_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while loop.time() < deadline and (not self._aftercare.empty() or self._aftercare_busy):  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    async def close(self, within_s: float) -> dict[str, int]:
        """Write what is queued within `within_s` s; spool the rest; stop both stages. Never raises."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, within_s)
        written = await self.flush(max(0.0, deadline - loop.time()))
        self._closing = True
        spooled_at_close = 0
        if not written and self._tasks:
            # The database is hung: the batch in hand is spooled by the writer when cancelled.
            self._tasks[0].cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._tasks[0]), timeout=2)
            in_hand = self._in_hand
            if in_hand is not None and not in_hand.done.done():
                in_hand.done.set_result("spooled")
            while not self._writes.empty():
                self._spool_now(self._writes.get_nowait())
                spooled_at_close += 1
        await self._aftercare_idle(max(0.0, deadline - loop.time()))
        undetected = self._aftercare.qsize()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return {"spooled_at_close": spooled_at_close, "aftercare_skipped": undetected}
