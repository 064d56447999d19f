"""Results to the database, or to the spool while it is away; the spool replayed when it is back.

The probing process never waits on a dead database for longer than `db_timeout_s` and never sees a
database error: `save` stores or spools and returns. Order is kept: while the spool holds records,
new batches are appended behind them, and the drainer replays the spool oldest first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from monitor.store.engine import describe_db_error, is_bad_data
from monitor.store.records import Batch, StorableBatch
from monitor.store.repository import Repository
from monitor.store.spool import EventSink, Spool, SpooledRun, log_event
from monitor.waits import sleep_unless


class Saved(StrEnum):
    STORED = "stored"  # committed in the database
    SPOOLED = "spooled"  # durable in the local spool, to be replayed
    HELD = "held"  # in memory: the spool could not open a file (no descriptor free); written there next
    LOST = "lost"  # neither the database nor the spool could take it (reported as `store_lost`)


# A shortage of descriptors is transient (a flood of connections, a leak elsewhere): results are held in
# memory and written to the spool as soon as it can open its file again, rather than lost.
_DESCRIPTOR_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE})
MAX_HELD_RUNS = 10_000


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """The writer's last database write: immutable, so another thread (readiness) reads it safely."""

    ok: bool
    at: float  # time.monotonic()
    error: str | None = None  # what failed, for a human (engine.describe_db_error)


class ResultWriter:
    def __init__(
        self,
        repository: Repository,
        spool: Spool,
        *,
        on_event: EventSink | None = None,
        db_timeout_s: float = 15.0,
        drain_batch: int = 100,
    ) -> None:
        self._repository = repository
        self._spool = spool
        self._emit = on_event or log_event(logging.getLogger("monitor.store.writer"))
        self._db_timeout_s = db_timeout_s
        self._drain_batch = drain_batch
        self._save_lock = asyncio.Lock()
        self._drain_lock = asyncio.Lock()
        self._database_down = False
        # Whether writes succeed, which a ping does not tell: a read-only database answers SELECT 1.
        self.last_write: WriteOutcome | None = None
        # Drain attempts failed in a row (the drainer tries every few seconds through an outage).
        self._drain_failures = 0
        self._drain_failing_since = 0.0
        self._drain_last_error = ""
        # Counters for metrics (runs, each with its samples).
        self.stored_runs = 0
        self.spooled_runs = 0
        self.lost_runs = 0
        self.held_total = 0  # runs ever held in memory for want of a descriptor
        self._held: collections.deque[Batch] = collections.deque()
        # Told about every batch the database committed, written or replayed (detection follows it).
        self._on_stored: Callable[[Batch], None] | None = None

    def notify_stored(self, listener: Callable[[Batch], None]) -> None:
        """Call `listener` with every batch the database committed from now on (the background store's
        detection); one listener, the last given."""
        self._on_stored = listener

    @property
    def spool(self) -> Spool:
        return self._spool

    def _describe(self, exc: BaseException) -> str:
        return describe_db_error(exc, self._repository.engine.url)

    async def _store(self, batch: Batch) -> None:
        async with asyncio.timeout(self._db_timeout_s):
            await self._repository.save_runs(batch)
        if self._on_stored is not None:
            self._on_stored(batch)

    def _database_failed(self, event: str, exc: BaseException, **fields: Any) -> None:
        self._database_down = True
        error = self._describe(exc)
        self.last_write = WriteOutcome(ok=False, at=time.monotonic(), error=error)
        self._emit(event, error=error, **fields)

    def _drain_failed(self, exc: BaseException) -> None:
        """Like `_database_failed`, logged at a falling rate: the 1st, 2nd, 4th, 8th... failure in a row,
        not one line per attempt for as long as the outage lasts; `spool_drain_recovered` sums it up."""
        self._database_down = True
        error = self._describe(exc)
        now = time.monotonic()
        self.last_write = WriteOutcome(ok=False, at=now, error=error)
        self._drain_failures += 1
        if self._drain_failures == 1:
            self._drain_failing_since = now
        self._drain_last_error = error
        if logged_failure(self._drain_failures):
            self._emit(
                "spool_drain_failed",
                error=error,
                failures=self._drain_failures,
                failing_for_s=round(now - self._drain_failing_since, 1),
                next_logged_at_failure=2 * self._drain_failures,
                spool_depth=self._spool.depth,
            )

    def _drain_recovered(self) -> None:
        if not self._drain_failures:
            return
        self._emit(
            "spool_drain_recovered",
            failures=self._drain_failures,
            failing_for_s=round(time.monotonic() - self._drain_failing_since, 1),
            last_error=self._drain_last_error,
            spool_depth=self._spool.depth,
        )
        self._drain_failures = 0

    def _database_ok(self) -> None:
        self.last_write = WriteOutcome(ok=True, at=time.monotonic())
        if self._database_down:  # once per recovery, not per write
            self._database_down = False
            self._emit("database_write_ok", spool_depth=self._spool.depth)

    async def save(self, batch: Batch) -> Saved:
        """Store `batch` in one transaction, or spool it when that fails or the spool is not empty.

        Never raises for database or spool trouble; the outcome is returned and reported as events.
        """
        copied = [(run, list(samples)) for run, samples in batch]
        batch = StorableBatch(copied) if isinstance(batch, StorableBatch) else copied
        if not batch:
            return Saved.STORED
        samples = sum(len(members) for _, members in batch)
        async with self._save_lock:
            if self._held:
                await self._release_held()
            if self._spool.depth == 0 and not self._held:
                try:
                    await self._store(batch)
                except asyncio.CancelledError:
                    # Shutting down mid-write: the commit may or may not have landed. Spool it; a replay
                    # of a stored run is a no-op.
                    with contextlib.suppress(Exception):
                        self._spool.append(batch)
                    raise
                except Exception as exc:
                    self._database_failed("database_write_failed", exc, runs=len(batch), samples=samples)
                else:
                    self.stored_runs += len(batch)
                    self._database_ok()
                    return Saved.STORED
            return await self._to_spool(batch, samples)

    @property
    def held_runs(self) -> int:
        """Runs waiting in memory for the spool to be writable again."""
        return sum(len(batch) for batch in self._held)

    async def close_held(self) -> int:
        """At exit: write what is held to the spool if it can now; what cannot be is lost, counted and
        reported. Returns the runs lost."""
        async with self._save_lock:
            await self._release_held()
            lost = self.held_runs
            if lost:
                self.lost_runs += lost
                self._held.clear()
                self._emit("results_lost", error="held in memory at exit: the spool could not be opened", runs=lost)
            return lost

    async def _release_held(self) -> None:
        """Write held batches to the spool, oldest first, until one fails again."""
        released = 0
        while self._held:
            try:
                await asyncio.to_thread(self._spool.append, self._held[0])
            except Exception:
                break
            released += len(self._held.popleft())
        if released:
            self.spooled_runs += released
            self._emit("results_released", runs=released, still_held=self.held_runs, spool_depth=self._spool.depth)

    async def _to_spool(self, batch: Batch, samples: int) -> Saved:
        if self._held:  # order: behind what is already held
            return self._hold(batch, samples, reason="earlier results are held")
        try:
            await asyncio.to_thread(self._spool.append, batch)
        except OSError as exc:
            if exc.errno in _DESCRIPTOR_SHORTAGE:
                return self._hold(batch, samples, reason=f"{type(exc).__name__}: {exc.strerror}")
            return self._lose(batch, samples, exc)
        except Exception as exc:
            return self._lose(batch, samples, exc)
        self.spooled_runs += len(batch)
        self._emit(
            "results_spooled",
            runs=len(batch),
            samples=samples,
            spool_depth=self._spool.depth,
            spool_bytes=self._spool.bytes,
        )
        return Saved.SPOOLED

    def _hold(self, batch: Batch, samples: int, *, reason: str) -> Saved:
        if self.held_runs + len(batch) > MAX_HELD_RUNS:
            return self._lose(batch, samples, OSError(f"{reason}, and {MAX_HELD_RUNS} runs are already held"))
        self._held.append(batch)
        self.held_total += len(batch)
        self._emit("results_held", runs=len(batch), samples=samples, held=self.held_runs, reason=reason)
        return Saved.HELD

    def _lose(self, batch: Batch, samples: int, exc: BaseException) -> Saved:
        self.lost_runs += len(batch)
        self._emit("results_lost", error=str(exc), runs=len(batch), samples=samples, lost_total=self.lost_runs)
        return Saved.LOST

    async def drain(self) -> int:
        """Replay the spool into the database, oldest first, until it is empty or the database fails.

        Returns the number of runs replayed. Records the database refuses as invalid are moved to the
        spool's rejected.jsonl so the rest keep flowing.
        """
        replayed = 0
        if self._held:
            async with self._save_lock:
                await self._release_held()
        failed = False
        async with self._drain_lock:
            while True:
                entries = await asyncio.to_thread(self._spool.peek, self._drain_batch)
                if not entries:
                    break
                stored = await self._replay(entries)
                if stored is None:
                    failed = True
                    break
                replayed += stored
        if replayed:
            self._database_ok()
            self._emit("spool_drained", runs=replayed, spool_depth=self._spool.depth)
        if not failed and (replayed or not self._spool.depth):
            self._drain_recovered()
        return replayed

    async def _replay(self, entries: list[SpooledRun]) -> int | None:
        """Store one chunk; the number of runs stored, or None when the database failed."""
        readable = [(entry.run, entry.samples or []) for entry in entries if entry.run is not None]
        if len(readable) == len(entries):
            try:
                await self._store(readable)
            except Exception as exc:
                if not is_bad_data(exc):
                    self._drain_failed(exc)
                    return None
            else:
                await asyncio.to_thread(self._spool.ack, entries[-1])
                return len(entries)
        # Something in this chunk is unreadable or refused: go one record at a time.
        stored = 0
        for entry in entries:
            if entry.run is None:
                await asyncio.to_thread(self._spool.reject, entry, entry.problem or "unreadable record")
            else:
                try:
                    await self._store([(entry.run, entry.samples or [])])
                except Exception as exc:
                    if not is_bad_data(exc):
                        self._drain_failed(exc)
                        return None
                    await asyncio.to_thread(self._spool.reject, entry, _reason(exc))
                else:
                    stored += 1
            await asyncio.to_thread(self._spool.ack, entry)
        return stored

    async def run_drainer(self, stop: asyncio.Event, interval_s: float) -> None:
        """Drain the spool every `interval_s` seconds until `stop` is set."""
        while not stop.is_set():
            if self._spool.depth or self._held:
                try:
                    await self.drain()
                except Exception as exc:  # the spool's disk; keep trying, loudly
                    self._emit("spool_drain_failed", error=f"{type(exc).__name__}: {exc}")
            await sleep_unless(stop, interval_s)


def logged_failure(count: int) -> bool:
    """Whether the `count`-th failure in a row is logged: 1, 2, 4, 8, ... (a falling rate)."""
    return count > 0 and count & (count - 1) == 0


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0] if lines else ''}"
