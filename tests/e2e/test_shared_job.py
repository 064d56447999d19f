"""Three real daemons of one location share one job's series on one PostgreSQL; one is killed mid-tick.

The job has 12 series in 6 shards (`jobs[].shards`). With three replicas each probes two shards a
tick. SIGKILL one while it probes: its claims of that tick are no longer renewed, so a survivor
takes them over within the tick and probes their series; at the next tick (it was present at the
tick before, so still expected) its shards go unclaimed and are taken over; after that the two
left split the six shards three each. Throughout, every tick is stored once, each series once,
and no daemon logs a series twice in a tick; the only second request to a series is the killed
replica's, in flight when it died (its measurement died with it).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from monitor.schedule.shards import job_series, shard_series
from tests.conftest import SimProcess, start_sim, stop_sim
from tests.support.daemon import Daemon, _admin, _query, http_get, start_daemon, stop_daemon, upgrade, wait_ready
from tests.support.ports import free_port

POSTGRES_ENV = "TTFT_TEST_POSTGRES_URL"
TARGETS = ["m0", "m1", "m2", "m3"]
PROMPTS = ["p128", "p256", "p512"]
SHARDS = 6
EVERY_S = 12  # the lease (a quarter of it, 3 s) and the take-over start within half of it


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


@pytest.fixture
def postgres_database() -> Iterator[str]:
    admin = os.environ.get(POSTGRES_ENV)
    if admin is None:
        pytest.skip(f"needs PostgreSQL: set {POSTGRES_ENV} (see tests/support/store_fixtures.py)")
    name = f"ttft_shards_{uuid.uuid4().hex[:10]}"
    _admin(admin, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        _admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write_config(folder: Path, sim: SimProcess, db_url: str) -> Path:
    targets = "".join(
        f"  {name}:\n    provider: sim\n    model: gpt-4o-mini\n    params: {{max_tokens: 120}}\n" for name in TARGETS
    )
    prompts = "".join(f"  {name}: {{tokens: {name[1:]}}}\n" for name in PROMPTS)
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
shutdown_grace_s: 10
database:
  url: "{db_url}"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{free_port()}"
web: {{enabled: false}}
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
    max_concurrency: 12
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
{targets}prompts:
{prompts}jobs:
  - name: big
    schedule: "*/{EVERY_S} * * * * *"
    targets: [{", ".join(TARGETS)}]
    prompts: [{", ".join(PROMPTS)}]
    shards: {SHARDS}
    rounds: 1
    warmup: 0
    pause_s: 0
"""
    )
    return path


def tick_of(event: dict) -> datetime:
    return datetime.fromisoformat(event["scheduled"])


def claimed(daemon: Daemon) -> dict[datetime, list[int]]:
    """Tick -> the shards this daemon probed at it (its share and what it took over)."""
    out: dict[datetime, list[int]] = {}
    for event in daemon.logs():
        if event.get("event") in ("shards_claimed", "shards_taken_over"):
            out.setdefault(tick_of(event), []).extend(event["shards"])
    return out


def wait_until(condition: Callable[[], object], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def sim_first_tokens(sim: SimProcess) -> int:
    status, text = http_get(f"{sim.url}/metrics")
    assert status == 200
    return round(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:time_to_first_token_seconds_count{")
        )
    )


@pytest.mark.realtime
@pytest.mark.timeout(300)  # three daemons, about eight 12 s ticks: about 100 s on a busy VM
def test_three_replicas_share_a_job_and_one_killed_mid_tick_leaves_each_tick_stored_once(
    sim: SimProcess, tmp_path: Path, postgres_database: str
) -> None:
    folders = [tmp_path / name for name in ("a", "b", "c")]
    configs = []
    for folder in folders:
        folder.mkdir()
        configs.append(write_config(folder, sim, postgres_database))
    upgrade(configs[0])
    daemons = [start_daemon(config, folder, folder.name) for config, folder in zip(configs, folders, strict=True)]
    survivors, victim = daemons[:2], daemons[2]
    try:
        for daemon in daemons:
            wait_ready(daemon)

        def balanced_ticks() -> list[datetime]:
            shares = [claimed(d) for d in daemons]
            common = set(shares[0]) & set(shares[1]) & set(shares[2])
            return sorted(t for t in common if all(len(s[t]) == 2 for s in shares))

        wait_until(lambda: balanced_ticks(), timeout=90, what="a tick split 2-2-2")
        # Mid-tick: the victim has claimed its share of a tick and its requests are streaming.
        before = len(victim.events("shards_claimed"))
        wait_until(lambda: len(victim.events("shards_claimed")) > before, timeout=30, what="the victim's next tick")
        time.sleep(0.5)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        killed_at = tick_of(victim.events("shards_claimed")[-1])
        assert killed_at not in {tick_of(e) for e in victim.events("job_finished")}, "killed after its tick ended"

        def split_by_two() -> list[datetime]:
            shares = [claimed(d) for d in survivors]
            common = set(shares[0]) & set(shares[1])
            return sorted(t for t in common if t > killed_at and all(len(s[t]) == 3 for s in shares))

        wait_until(lambda: len(split_by_two()) >= 2, timeout=90, what="two ticks split 3-3 after the kill")
        time.sleep(EVERY_S / 2)  # the last of those ticks' runs stored
    finally:
        codes = [stop_daemon(daemon) for daemon in survivors]
        if victim.process.poll() is None:
            victim.process.kill()
            victim.process.wait()
    assert codes == [0, 0]
    first_tokens = sim_first_tokens(sim)

    shares = [claimed(d) for d in daemons]
    first, last = balanced_ticks()[0], split_by_two()[-1]
    ticks = sorted({t for share in shares for t in share if first <= t <= last})
    assert len(ticks) >= 4 and killed_at in ticks, ticks
    victim_shards = shares[2][killed_at]
    # Each shard is probed by one replica per tick, every shard of every tick by someone; in the
    # kill tick the victim's shards were taken over, because it stopped renewing them.
    for tick in ticks:
        owners = Counter(shard for share in shares[:2] for shard in share.get(tick, []))
        if tick != killed_at:
            owners.update(shares[2].get(tick, []))
        assert sorted(owners) == list(range(SHARDS)) and set(owners.values()) == {1}, (tick, owners)
    renewed_not = [
        shard
        for d in survivors
        for e in d.events("shards_taken_over")
        if tick_of(e) == killed_at and e["reason"] == "not renewed"
        for shard in e["shards"]
    ]
    assert sorted(renewed_not) == sorted(victim_shards), (renewed_not, victim_shards)
    # The tick after, the victim was still expected: its shards were left unclaimed and taken over.
    next_tick = min(t for t in ticks if t > killed_at)
    unclaimed = [e for d in survivors for e in d.events("shards_taken_over") if tick_of(e) == next_tick]
    assert unclaimed and all(e["reason"] == "unclaimed" for e in unclaimed), unclaimed

    # No daemon logs a series twice in a tick, nor do two daemons log the same series in a tick...
    probed = Counter(
        (tick_of(e), e["target"], e["prompt"]) for d in daemons for e in d.events("probe_sample") if "scheduled" in e
    )
    assert probed and max(probed.values()) == 1, [k for k, n in probed.items() if n > 1]
    # ...and the simulator answered those, and the victim's requests in flight when it was killed.
    lost = frozenset().union(*(shard_series(TARGETS, PROMPTS, s, SHARDS) for s in victim_shards))
    in_flight = first_tokens - sum(1 for d in daemons for e in d.events("probe_sample") if e.get("ttft_ms"))
    assert 0 <= in_flight <= len(lost), in_flight

    # Every tick stored once: each series of each tick, the kill tick included, one run.
    rows = _query(
        postgres_database,
        "SELECT s.target, s.prompt, r.intended_at FROM runs r JOIN series s ON s.id = r.series_id WHERE r.job = 'big'",
    )
    stored = Counter((intended, target, prompt) for target, prompt, intended in rows)
    assert max(stored.values()) == 1
    for tick in ticks:
        here = {(target, prompt) for (intended, target, prompt) in stored if intended == tick}
        assert here == set(job_series(TARGETS, PROMPTS)), (tick, sorted(set(job_series(TARGETS, PROMPTS)) - here))
    samples = _query(postgres_database, "SELECT count(*) FROM samples")
    assert samples == [(len(rows),)]  # rounds: 1, warmup: 0
