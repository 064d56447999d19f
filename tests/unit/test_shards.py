"""How a job's series split into shards and which shards each replica claims first (schedule/shards.py)."""

from __future__ import annotations

import pytest

from monitor.schedule.claims import lease_s
from monitor.schedule.shards import (
    job_series,
    preferred_shards,
    replica_key,
    replica_prefix,
    shard_key,
    shard_series,
    take_over_order,
)

TARGETS = [f"t{i}" for i in range(5)]
PROMPTS = ["short", "long"]


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 10])
def test_the_shards_of_a_job_hold_every_series_once_and_differ_by_one_at_most(shards: int) -> None:
    parts = [shard_series(TARGETS, PROMPTS, shard, shards) for shard in range(shards)]
    every = [s for part in parts for s in part]
    assert sorted(every) == sorted(job_series(TARGETS, PROMPTS))
    assert len(every) == len(set(every)) == 10
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_a_shard_is_the_same_on_every_replica_given_the_same_job() -> None:
    assert shard_series(TARGETS, PROMPTS, 1, 3) == shard_series(list(TARGETS), list(PROMPTS), 1, 3)
    assert shard_series(TARGETS, PROMPTS, 0, 3) == {("t0", "short"), ("t1", "long"), ("t3", "short"), ("t4", "long")}


@pytest.mark.parametrize(
    ("shards", "replicas", "expected"),
    [
        (6, ["a", "b", "c"], {"a": [0, 3], "b": [1, 4], "c": [2, 5]}),
        (6, ["a", "c"], {"a": [0, 2, 4], "c": [1, 3, 5]}),  # b died: its shards are shared out
        (4, ["a", "b", "c"], {"a": [0, 3], "b": [1], "c": [2]}),
        (2, ["a", "b", "c"], {"a": [0], "b": [1], "c": []}),  # more replicas than shards: c stands by
        (3, ["a"], {"a": [0, 1, 2]}),
    ],
)
def test_replicas_that_see_the_same_replicas_split_the_shards_between_them(
    shards: int, replicas: list[str], expected: dict[str, list[int]]
) -> None:
    split = {owner: preferred_shards(shards, replicas, owner) for owner in replicas}
    assert split == expected
    assert sorted(s for share in split.values() for s in share) == list(range(shards))


def test_a_replica_not_yet_listed_counts_itself() -> None:
    assert preferred_shards(4, ["a", "c"], "b") == [1]


def test_survivors_take_over_the_unclaimed_shards_from_different_ends() -> None:
    claimed = [0, 3]
    first = take_over_order(6, ["a", "b", "c"], "a", claimed)
    last = take_over_order(6, ["a", "b", "c"], "c", claimed)
    assert sorted(first) == sorted(last) == [1, 2, 4, 5]
    assert first[0] != last[0]


def test_claim_keys_carry_the_shard_and_the_replica_and_no_job_name_holds_them() -> None:
    assert shard_key("ttft", 2, 8) == "ttft/shard-2-of-8"
    assert replica_key("ttft", "host:1:ab") == "ttft/replica/host:1:ab"
    assert replica_key("ttft", "x").startswith(replica_prefix("ttft"))
    assert not shard_key("ttft", 0, 2).startswith(replica_prefix("ttft"))


@pytest.mark.parametrize(
    ("interval_s", "lease"),
    [(1, 2.0), (8, 2.0), (12, 3.0), (60, 15.0), (300, 15.0)],
)
def test_a_claims_lease_is_a_quarter_of_the_interval_within_its_bounds(interval_s: float, lease: float) -> None:
    assert lease_s(interval_s) == lease
