"""Tick claims on both databases: racing claimers, stale claims, finishing, and the claim policy."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.schedule.claims import TickClaims
from monitor.store.engine import create_engine
from monitor.store.ticks import TickClaimRepository
from tests.support.store_fixtures import T0, Backend

pytest_plugins = ("tests.support.store_fixtures",)

TICK = T0 + timedelta(minutes=5)


async def rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        result = await connection.execute(
            sa.text("SELECT job, location, claimed_by, status, finished_at FROM job_ticks ORDER BY id")
        )
        return [dict(row) for row in result.mappings()]


@pytest.fixture
async def engines(backend: Backend) -> Any:
    """Two engines on one database: two daemons sharing it."""
    pair = (backend.engine(), backend.engine())
    yield pair
    for engine in pair:
        await engine.dispose()


async def test_two_claimers_of_one_tick_exactly_one_wins(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    first, second = (TickClaimRepository(engine) for engine in engines)
    won = await asyncio.gather(
        first.claim(job="j", scheduled_at=TICK, location="lab", owner="a"),
        second.claim(job="j", scheduled_at=TICK, location="lab", owner="b"),
    )
    assert sorted(won) == [False, True]
    winner = "a" if won[0] else "b"
    assert [(r["claimed_by"], r["status"]) for r in await rows(engines[0])] == [(winner, "running")]


async def test_eight_racing_claimers_on_two_engines_leave_one_winner(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    claimers = [TickClaimRepository(engines[i % 2]) for i in range(8)]
    won = await asyncio.gather(
        *(c.claim(job="j", scheduled_at=TICK, location="lab", owner=f"o{i}") for i, c in enumerate(claimers))
    )
    assert won.count(True) == 1
    assert len(await rows(engines[0])) == 1


async def test_a_stale_claim_keeps_its_tick_and_the_next_tick_is_won(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    crashed, alive = (TickClaimRepository(engine) for engine in engines)
    # The owner crashed after claiming: no finish ever comes, and the claim stays the record.
    assert await crashed.claim(job="j", scheduled_at=TICK, location="lab", owner="crashed")
    assert not await alive.claim(job="j", scheduled_at=TICK, location="lab", owner="alive")
    assert await alive.claim(job="j", scheduled_at=TICK + timedelta(minutes=1), location="lab", owner="alive")
    assert [(r["claimed_by"], r["status"], r["finished_at"]) for r in await rows(engines[0])] == [
        ("crashed", "running", None),
        ("alive", "running", None),
    ]


async def test_the_same_tick_of_another_job_or_location_is_its_own_claim(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    ticks = TickClaimRepository(engines[0])
    assert await ticks.claim(job="j", scheduled_at=TICK, location="lab", owner="a")
    assert await ticks.claim(job="k", scheduled_at=TICK, location="lab", owner="a")
    assert await ticks.claim(job="j", scheduled_at=TICK, location="edge", owner="a")
    assert not await ticks.claim(job="j", scheduled_at=TICK, location="lab", owner="a")  # not even its owner twice


async def test_finishing_records_the_outcome_on_that_tick_only(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    ticks = TickClaimRepository(engines[0])
    for minute in (0, 1):
        await ticks.claim(job="j", scheduled_at=TICK + timedelta(minutes=minute), location="lab", owner="a")
    assert await ticks.finish(job="j", scheduled_at=TICK, location="lab", status="ok", now=TICK + timedelta(seconds=3))
    assert not await ticks.finish(job="j", scheduled_at=TICK + timedelta(hours=1), location="lab", status="ok")
    found = await rows(engines[0])
    assert [r["status"] for r in found] == ["ok", "running"]
    assert found[0]["finished_at"] is not None and found[1]["finished_at"] is None
    assert len(found) == 2  # finishing a tick nobody claimed creates no row


async def test_the_claim_policy_wins_loses_and_rests_while_the_database_is_away(
    backend: Backend, tmp_path: Path
) -> None:
    engine = backend.engine()
    try:
        mine, theirs = TickClaims(engine), TickClaims(engine)
        assert await mine.try_claim(job="j", scheduled_at=TICK, location="lab", owner="a") is True
        assert await theirs.try_claim(job="j", scheduled_at=TICK, location="lab", owner="b") is False
    finally:
        await engine.dispose()
    now = [0.0]
    away = create_engine(f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/ttft.db")
    try:
        claims = TickClaims(away, rest_s=10, clock=lambda: now[0])
        assert await claims.try_claim(job="j", scheduled_at=TICK, location="lab", owner="a") is None
        assert claims.resting  # no more waits on a database known to be away ...
        now[0] = 11.0
        assert not claims.resting  # ... until the rest is over
    finally:
        await claims.close()
        await away.dispose()


# ---------------------------------------------------------------- a job split into shards (jobs[].shards)

SHARDS = 6


async def share(claims: TickClaims, owner: str, tick: Any = TICK) -> tuple[list[int], set[str]]:
    got = await claims.try_claim_share(job="big", shards=SHARDS, scheduled_at=tick, location="lab", owner=owner)
    assert got is not None
    return got


async def test_three_replicas_present_at_a_tick_split_its_shards_once_each(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    replicas = {owner: TickClaims(engines[i % 2]) for i, owner in enumerate("abc")}
    # The tick before: each announces itself (a replica sees only those that came before it).
    before = TICK - timedelta(minutes=1)
    for owner, claims in replicas.items():
        await share(claims, owner, before)
    # This tick, all three are known to all three, and they race: the shards split 2-2-2, once each.
    shares = await asyncio.gather(*(share(claims, owner) for owner, claims in replicas.items()))
    won = {owner: mine for owner, (mine, _) in zip(replicas, shares, strict=True)}
    assert won == {"a": [0, 3], "b": [1, 4], "c": [2, 5]}
    assert all(seen == {"a", "b", "c"} for _, seen in shares)
    found = [r for r in await rows(engines[0]) if r["job"].startswith("big/shard-")]
    assert len(found) == 2 * SHARDS  # both ticks, each shard once
    # Nothing is left to take over.
    assert (
        await replicas["a"].try_take_over(
            job="big", shards=SHARDS, scheduled_at=TICK, location="lab", owner="a", replicas={"a", "b", "c"}
        )
        == []
    )


async def test_the_shards_of_a_replica_that_died_are_taken_over_then_shared_out(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    a, b, dead = TickClaims(engines[0]), TickClaims(engines[1]), TickClaims(engines[0])
    for owner, claims in (("a", a), ("b", b), ("dead", dead)):
        await share(claims, owner, TICK - timedelta(minutes=1))
    # "dead" was present at the tick before but says nothing at this one: its shards go unclaimed...
    (mine_a, seen_a), (mine_b, seen_b) = await share(a, "a"), await share(b, "b")
    assert (mine_a, mine_b) == ([0, 3], [1, 4])
    assert "dead" in seen_a
    # ...until a survivor takes them over after the others' turn; the other survivor finds none left.
    taken = await a.try_take_over(
        job="big", shards=SHARDS, scheduled_at=TICK, location="lab", owner="a", replicas=seen_a
    )
    assert taken == [2, 5]
    assert (
        await b.try_take_over(job="big", shards=SHARDS, scheduled_at=TICK, location="lab", owner="b", replicas=seen_b)
        == []
    )
    # The tick after, "dead" is no longer expected: two replicas split the six shards three each.
    after = TICK + timedelta(minutes=1)
    assert ((await share(a, "a", after))[0], (await share(b, "b", after))[0]) == ([0, 2, 4], [1, 3, 5])


async def test_a_claim_not_renewed_is_taken_over_once_and_a_renewed_one_is_not(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    dying, alive = TickClaims(engines[0]), TickClaims(engines[1])
    survivors = [TickClaims(engines[i % 2]) for i in range(4)]
    keys = ["big/shard-0-of-2", "big/shard-1-of-2"]
    for key, (owner, claims) in zip(keys, (("dying", dying), ("alive", alive)), strict=True):
        assert await claims.claim(job=key, scheduled_at=TICK, location="lab", owner=owner)
    seen = await survivors[0].try_running(keys=keys, scheduled_at=TICK, location="lab")
    assert seen is not None and {k: owner for k, (owner, _) in seen.items()} == {keys[0]: "dying", keys[1]: "alive"}
    await asyncio.sleep(0.01)  # a stamp later than the one seen, on any clock resolution
    await alive.try_renew(keys=[keys[1]], scheduled_at=TICK, location="lab", owner="alive")
    now = await survivors[0].try_running(keys=keys, scheduled_at=TICK, location="lab")
    assert now is not None and now[keys[0]] == seen[keys[0]] and now[keys[1]] != seen[keys[1]]
    # Four survivors race for the claim that was not renewed: one gets it. The renewed one stays.
    won = await asyncio.gather(
        *(
            s.try_take_over_stale(key=keys[0], scheduled_at=TICK, location="lab", owner=f"s{i}", was=seen[keys[0]])
            for i, s in enumerate(survivors)
        )
    )
    assert won.count(True) == 1
    assert not await survivors[0].try_take_over_stale(
        key=keys[1], scheduled_at=TICK, location="lab", owner="s0", was=seen[keys[1]]
    )
    # A finished claim is not running, so nobody watches or takes it.
    await alive.try_finish(job=keys[1], scheduled_at=TICK, location="lab", status="ok")
    left = await survivors[0].try_running(keys=keys, scheduled_at=TICK, location="lab")
    assert left is not None and list(left) == [keys[0]] and left[keys[0]][0] == f"s{won.index(True)}"


async def test_replicas_of_another_location_or_a_job_whose_name_is_a_pattern_are_not_counted(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    claims = TickClaims(engines[0])
    assert await share(claims, "a") == (list(range(SHARDS)), {"a"})
    other = await claims.try_claim_share(job="big", shards=SHARDS, scheduled_at=TICK, location="edge", owner="x")
    lookalike = await claims.try_claim_share(job="b_g", shards=SHARDS, scheduled_at=TICK, location="lab", owner="y")
    assert other == (list(range(SHARDS)), {"x"})
    assert lookalike == (list(range(SHARDS)), {"y"})  # `_` is no wildcard: big's replica "a" is not counted


async def test_a_share_that_cannot_be_claimed_says_so_and_rests(tmp_path: Path) -> None:
    away = create_engine(f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/ttft.db")
    try:
        claims = TickClaims(away, rest_s=10)
        assert await claims.try_claim_share(job="big", shards=3, scheduled_at=TICK, location="lab", owner="a") is None
        assert claims.resting
        taken = await claims.try_take_over(
            job="big", shards=3, scheduled_at=TICK, location="lab", owner="a", replicas={"a", "b"}
        )
        assert taken == []
    finally:
        await claims.close()
        await away.dispose()
