"""A job's series split into shards that the replicas of one location claim apart (`jobs[].shards`).

Pure: which series a shard holds, the claim keys, and which shards a replica takes first among the
replicas it knows are alive. The rows are `store/ticks.py`'s; the policy (bounded waits, taking over
what nobody claimed) is `claims.py`'s `TickClaims.try_claim_share` and `try_take_over`.

Keys live in `job_ticks.job`, so sharding needs no column of its own: `NAME/shard-I-of-N` for a
shard's tick and `NAME/replica/OWNER` for a replica's presence at a tick. A job name never holds
`/` (`config.fields.check_name`), so neither key can be mistaken for another job's tick.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Series = tuple[str, str]  # (target, prompt): one series of the job at this location


def job_series(targets: Sequence[str], prompts: Sequence[str]) -> list[Series]:
    """The job's series in config order, the order `run_plan` starts them."""
    return [(target, prompt) for target in targets for prompt in prompts]


def shard_series(targets: Sequence[str], prompts: Sequence[str], shard: int, shards: int) -> frozenset[Series]:
    """The series of one shard: every `shards`-th in config order, so shards differ by one series at most."""
    return frozenset(s for i, s in enumerate(job_series(targets, prompts)) if i % shards == shard)


def shard_key(job: str, shard: int, shards: int) -> str:
    # The count is in the key: replicas that disagree on it (a config rolled out to some) claim apart
    # rather than each probing part of the other's split.
    return f"{job}/shard-{shard}-of-{shards}"


def replica_prefix(job: str) -> str:
    return f"{job}/replica/"


def replica_key(job: str, owner: str) -> str:
    return replica_prefix(job) + owner


def preferred_shards(shards: int, replicas: Collection[str], owner: str) -> list[int]:
    """The shards `owner` claims first: every M-th, by its rank among the M replicas alive.

    Every replica computes the same split from the same set of replicas, so they claim apart
    without waiting on each other; a replica that sees a different set (one that joined this very
    tick) at worst races another for a shard, and the claim decides.
    """
    ranked = sorted({*replicas, owner})
    rank, count = ranked.index(owner), len(ranked)
    return [shard for shard in range(shards) if shard % count == rank]


def take_over_order(shards: int, replicas: Collection[str], owner: str, claimed: Collection[int]) -> list[int]:
    """The shards nobody claimed, starting from this replica's rank, so survivors contend little."""
    ranked = sorted({*replicas, owner})
    start = ranked.index(owner) * shards // len(ranked)
    return [s for s in (*range(start, shards), *range(start)) if s not in claimed]
