"""Tick claims: several daemons (HA replicas of one location) share a database; one probes each tick.

A claim is a row keyed by (job, scheduled time, location) (`store.ticks.TickClaimRepository`); the
insert that creates it wins, the others see a conflict and stand down. Inserting rather than
locking means no lock is held while probing, and a crashed daemon's claim simply stays as the
record that the tick was taken.

A claim never holds up a probe: it gets `CLAIM_TIMEOUT_S`, and when it cannot be made (database
down or hung) the tick is probed anyway and the claims rest for `CLAIMS_REST_S` (no more waits on a
database known to be away). Replicas then probe the same tick; the store keeps one run per
(series, location, scheduled time), so the duplicates are reconciled there, on write or on replay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.store.ticks import TickClaimRepository

CLAIM_TIMEOUT_S = 1.5
CLAIMS_REST_S = 10.0
FINISH_TIMEOUT_S = 5.0


class TickClaims:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        timeout_s: float = CLAIM_TIMEOUT_S,
        rest_s: float = CLAIMS_REST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ticks = TickClaimRepository(engine)
        self._timeout_s = timeout_s
        self._rest_s = rest_s
        self._clock = clock
        self._resting_until = 0.0
        self._attempts: set[asyncio.Task[bool]] = set()

    async def claim(self, *, job: str, scheduled_at: datetime, location: str, owner: str) -> bool:
        """True when this process won the tick; False when another daemon already has it."""
        return await self._ticks.claim(job=job, scheduled_at=scheduled_at, location=location, owner=owner)

    async def finish(self, *, job: str, scheduled_at: datetime, location: str, status: str) -> None:
        await self._ticks.finish(job=job, scheduled_at=scheduled_at, location=location, status=status)

    @property
    def resting(self) -> bool:
        return self._clock() < self._resting_until

    async def try_claim(self, *, job: str, scheduled_at: datetime, location: str, owner: str) -> bool | None:
        """True: won; False: another daemon has it; None: no claim could be made (probe anyway).

        Raises nothing and waits at most the claim timeout, whatever the database does.
        """
        if self.resting:
            return None
        # Not `asyncio.timeout`: a cancelled statement still waits for its clean-up (a rollback queued
        # behind the stuck statement on SQLite, a hung socket on PostgreSQL). The attempt is left to
        # end by itself (its own timeouts bound it) while the tick goes on.
        attempt = asyncio.create_task(self.claim(job=job, scheduled_at=scheduled_at, location=location, owner=owner))
        self._attempts.add(attempt)
        attempt.add_done_callback(self._forget)
        done, _ = await asyncio.wait({attempt}, timeout=self._timeout_s)
        if attempt in done and attempt.exception() is None:
            return attempt.result()
        self._resting_until = self._clock() + self._rest_s
        return None

    def _forget(self, attempt: asyncio.Task[bool]) -> None:
        self._attempts.discard(attempt)
        if not attempt.cancelled():
            attempt.exception()  # retrieved: a late failure is expected, not an unhandled error

    async def close(self) -> None:
        """Cancel attempts still running (shutdown)."""
        for attempt in list(self._attempts):
            attempt.cancel()
        if self._attempts:
            await asyncio.wait(set(self._attempts), timeout=1)

    async def try_finish(self, *, job: str, scheduled_at: datetime, location: str, status: str) -> None:
        """Bookkeeping only, bounded; skipped while the database is known to be away."""
        if self.resting:
            return
        try:
            async with asyncio.timeout(FINISH_TIMEOUT_S):
                await self.finish(job=job, scheduled_at=scheduled_at, location=location, status=status)
        except Exception:
            self._resting_until = self._clock() + self._rest_s
