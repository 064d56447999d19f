"""Tick claims: several daemons (HA replicas of one location) share a database; one probes each tick.

A claim is a row keyed by (job, scheduled time, location) (`store.ticks.TickClaimRepository`); the
insert that creates it wins, the others see a conflict and stand down. Inserting rather than
locking means no lock is held while probing, and a crashed daemon's claim simply stays as the
record that the tick was taken.

A claim never holds up a probe: it gets `CLAIM_TIMEOUT_S`, and when it cannot be made (database
down or hung) the tick is probed anyway and the claims rest for `CLAIMS_REST_S` (no more waits on a
database known to be away). Replicas then probe the same tick; the store keeps one run per
(series, location, scheduled time), so the duplicates are reconciled there, on write or on replay.

A job with `shards: N` is claimed per shard of its series (`schedule/shards.py`): each replica
records itself present at the tick, takes its share among the replicas present at this tick or the
one before (`try_claim_share`), and after the others had their turn takes over the shards nobody
claimed (`try_take_over`: a replica that died, or one that is late). While it probes, a replica
renews its claims (`try_renew`, every third of `lease_s`); a claim another replica sees unrenewed
for a whole lease is taken over (`try_take_over_stale`) and its series probed, so a replica killed
mid-tick leaves no hole. A replica that joins or dies changes the share from the next tick on.
The same bounded wait and rest apply: when the share cannot be claimed, every shard is probed, as
an unclaimed tick is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.schedule.shards import preferred_shards, replica_key, replica_prefix, shard_key, take_over_order
from monitor.store.ticks import TickClaimRepository

T = TypeVar("T")

CLAIM_TIMEOUT_S = 1.5
CLAIMS_REST_S = 10.0
FINISH_TIMEOUT_S = 5.0
# A sharded tick's shards that nobody claimed this long after the tick (plus the job's jitter, at most
# half its interval) are taken over: the replicas firing with it have claimed their share by then.
TAKE_OVER_DELAY_S = 2.0
# A replica renews its running shard claims every third of the lease; a claim not renewed for a whole
# lease, as seen by another replica on its own clock, is taken over (its replica died mid-tick). A
# quarter of the job's interval, within these bounds: long enough for a loop stall not to lose a
# claim, short enough that the take-over's probes still start within half an interval of the tick.
LEASE_MIN_S = 2.0
LEASE_MAX_S = 15.0


def lease_s(interval_s: float) -> float:
    return min(LEASE_MAX_S, max(LEASE_MIN_S, interval_s / 4))


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
        self._attempts: set[asyncio.Future[Any]] = set()

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
        return await self._bounded(self.claim(job=job, scheduled_at=scheduled_at, location=location, owner=owner))

    async def claim_share(
        self, *, job: str, shards: int, scheduled_at: datetime, location: str, owner: str
    ) -> tuple[list[int], set[str]]:
        """Announce `owner` at the tick and claim its share of the shards: (shards won, replicas present)."""
        replicas = await self._ticks.announce(
            key=replica_key(job, owner),
            prefix=replica_prefix(job),
            scheduled_at=scheduled_at,
            location=location,
            owner=owner,
        )
        won = []
        for shard in preferred_shards(shards, replicas, owner):
            key = shard_key(job, shard, shards)
            if await self._ticks.claim(job=key, scheduled_at=scheduled_at, location=location, owner=owner):
                won.append(shard)
        return won, replicas

    async def take_over(
        self, *, job: str, shards: int, scheduled_at: datetime, location: str, owner: str, replicas: set[str]
    ) -> list[int]:
        """Claim the shards of the tick that nobody has claimed yet; the ones won."""
        keys = [shard_key(job, shard, shards) for shard in range(shards)]
        taken = await self._ticks.claimed(keys=keys, scheduled_at=scheduled_at, location=location)
        claimed = [shard for shard, key in enumerate(keys) if key in taken]
        won = []
        for shard in take_over_order(shards, replicas, owner, claimed):
            if await self._ticks.claim(job=keys[shard], scheduled_at=scheduled_at, location=location, owner=owner):
                won.append(shard)
        return won

    async def try_claim_share(
        self, *, job: str, shards: int, scheduled_at: datetime, location: str, owner: str
    ) -> tuple[list[int], set[str]] | None:
        """`claim_share` within the claim timeout; None: no claim could be made (probe every shard)."""
        return await self._bounded(
            self.claim_share(job=job, shards=shards, scheduled_at=scheduled_at, location=location, owner=owner)
        )

    async def try_take_over(
        self, *, job: str, shards: int, scheduled_at: datetime, location: str, owner: str, replicas: set[str]
    ) -> list[int]:
        """`take_over` within the claim timeout; nothing while the database is away (this replica's
        share is being probed; the shards of a replica that died wait for the next tick)."""
        won = await self._bounded(
            self.take_over(
                job=job, shards=shards, scheduled_at=scheduled_at, location=location, owner=owner, replicas=replicas
            )
        )
        return won or []

    async def try_renew(self, *, keys: list[str], scheduled_at: datetime, location: str, owner: str) -> None:
        """Renew this replica's running shard claims (their lease); bounded, skipped while resting."""
        if self.resting:
            return
        await self._bounded(self._ticks.renew(keys=keys, scheduled_at=scheduled_at, location=location, owner=owner))

    async def try_running(
        self, *, keys: list[str], scheduled_at: datetime, location: str
    ) -> dict[str, tuple[str, datetime]] | None:
        """The running claims of these keys with their owner and last stamp; None: not known now."""
        if self.resting:
            return None
        return await self._bounded(self._ticks.running(keys=keys, scheduled_at=scheduled_at, location=location))

    async def try_take_over_stale(
        self, *, key: str, scheduled_at: datetime, location: str, owner: str, was: tuple[str, datetime]
    ) -> bool:
        """Take a claim that was not renewed since it was seen as `was`; False when another did, or unknown."""
        if self.resting:
            return False
        won = await self._bounded(
            self._ticks.take_over(key=key, scheduled_at=scheduled_at, location=location, owner=owner, was=was)
        )
        return bool(won)

    async def _bounded(self, work: Awaitable[T]) -> T | None:
        """`work`'s result, or None when it failed or did not end within the claim timeout (then rest)."""
        if self.resting:
            if asyncio.iscoroutine(work):
                work.close()  # never started: no "was never awaited" warning
            return None
        # Not `asyncio.timeout`: a cancelled statement still waits for its clean-up (a rollback queued
        # behind the stuck statement on SQLite, a hung socket on PostgreSQL). The attempt is left to
        # end by itself (its own timeouts bound it) while the tick goes on.
        attempt: asyncio.Future[T] = asyncio.ensure_future(work)
        self._attempts.add(attempt)
        attempt.add_done_callback(self._forget)
        done, _ = await asyncio.wait({attempt}, timeout=self._timeout_s)
        if attempt in done and attempt.exception() is None:
            return attempt.result()
        self._resting_until = self._clock() + self._rest_s
        return None

    def _forget(self, attempt: asyncio.Future[Any]) -> None:
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
