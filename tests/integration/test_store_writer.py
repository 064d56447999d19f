"""Nothing lost: the database goes away mid-run, every sample arrives once, in order, when it is back.

PostgreSQL is cut with a real TCP proxy between the app and the server (stopping the shared server
would break whoever else is using it); SQLite with another connection holding the exclusive lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.probe.result import Sample
from monitor.store import records as records_module
from monitor.store import repository as repository_module
from monitor.store.engine import create_engine
from monitor.store.records import Batch, RunRecord, StorableBatch
from monitor.store.repository import Repository
from monitor.store.spool import Spool
from monitor.store.writer import ResultWriter, Saved
from tests.support.store_fixtures import T0, Backend, Outage, make_batch

pytest_plugins = ("tests.support.store_fixtures",)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, **fields: Any) -> None:
        self.seen.append((name, fields))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


class RecordingRepository(Repository):
    """The real repository, noting the order in which runs were committed."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.committed: list[Any] = []

    async def save_runs(self, batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> frozenset[uuid.UUID]:
        inserted = await super().save_runs(batch)
        self.committed.extend(run.run_id for run, _ in batch)
        return inserted


async def stored_sample_ids(url: str) -> list[str]:
    """Every stored sample by what names it: its run and round (a sample has no id of its own)."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(sa.text("SELECT run_id, round FROM samples"))
            return [sample_key(run_id, round_) for run_id, round_ in rows]
    finally:
        await engine.dispose()


def sample_key(run_id: object, round_: int) -> str:
    return f"{str(run_id).replace('-', '')}/{round_}"  # SQLite stores UUIDs as 32 hex digits


def sample_keys(batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> list[str]:
    return [sample_key(run.run_id, s.round) for run, members in batch for s in members]


def normalise(ids: list[str]) -> list[str]:
    return sorted(ids)


async def test_every_sample_arrives_once_and_in_order_after_the_database_comes_back(
    backend: Backend, outage: Outage, tmp_path: Path
) -> None:
    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms, connect_timeout_s=2)
    repository = RecordingRepository(engine)
    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=50 * 1024 * 1024, on_event=events)
    writer = ResultWriter(repository, spool, on_event=events, db_timeout_s=5)
    stop = asyncio.Event()
    drainer = asyncio.create_task(writer.run_drainer(stop, interval_s=0.1))

    produced: list[Any] = []
    produced_samples: list[str] = []
    outcomes: list[Saved] = []
    slowest_save = 0.0
    try:
        for tick in range(24):  # a job firing every "5 minutes", sped up
            if tick == 6:
                await outage.cut()
            if tick == 16:
                await outage.restore()
            batch = make_batch(T0 + timedelta(minutes=5 * tick))
            produced.extend(run.run_id for run, _ in batch)
            produced_samples.extend(sample_keys(batch))
            started = time.perf_counter()
            outcomes.append(await writer.save(batch))
            slowest_save = max(slowest_save, time.perf_counter() - started)
            await asyncio.sleep(0.02)
        await writer.drain()  # what a shutdown's flush does; the drainer may have emptied it already
    finally:
        stop.set()
        await drainer
        spool.close()
        await engine.dispose()

    assert outcomes[:6] == [Saved.STORED] * 6
    assert set(outcomes[6:16]) == {Saved.SPOOLED}  # the probing process went on
    assert slowest_save < 5, "a save waited on the dead database for too long"
    assert spool.depth == 0
    # Every run committed exactly once, in the order the job produced them.
    assert repository.committed == produced
    stored = await stored_sample_ids(backend.url)
    assert len(stored) == len(produced_samples) == 24 * 4 * 6
    assert normalise(stored) == normalise(produced_samples)
    assert "database_write_failed" in events.names() and "spool_drained" in events.names()
    assert events.names().count("database_write_ok") == 1  # once, when the database came back


async def test_a_batch_the_probe_made_storable_is_not_checked_again_and_stored_the_same(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's batch comes from iter_runs_from_samples, storable already (`StorableBatch`): checking its 500
    runs again held the probes' loop for 6-7 ms in one step of the writer. Any other batch is checked."""
    checked: list[int] = []
    original = records_module.storable_batch

    def counted(batch: Batch) -> list[tuple[RunRecord, list[Sample]]]:
        checked.append(len(batch))
        return original(batch)

    monkeypatch.setattr(repository_module, "storable_batch", counted)
    engine = backend.engine()
    spool = Spool(tmp_path / "spool", max_bytes=10**8)
    marked, plain = StorableBatch(make_batch(T0)), make_batch(T0 + timedelta(minutes=5))
    try:
        writer = ResultWriter(Repository(engine), spool)
        assert await writer.save(marked) == Saved.STORED
        assert checked == []
        assert await writer.save(plain) == Saved.STORED
        assert checked == [len(plain)]
    finally:
        spool.close()
        await engine.dispose()
    assert normalise(await stored_sample_ids(backend.url)) == normalise(sample_keys(marked) + sample_keys(plain))


async def test_a_crash_between_commit_and_acknowledgement_stores_nothing_twice(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = backend.engine()
    spool = Spool(tmp_path / "spool", max_bytes=10**8, on_event=Events())
    batches = [make_batch(T0 + timedelta(minutes=5 * i)) for i in range(5)]
    spool_ids = [key for batch in batches for key in sample_keys(batch)]
    for batch in batches:
        spool.append(batch)

    class Crash(BaseException):
        pass

    def crash(_entry: object) -> None:
        raise Crash

    monkeypatch.setattr(spool, "ack", crash)
    writer = ResultWriter(Repository(engine), spool, on_event=Events(), drain_batch=7)
    with pytest.raises(Crash):
        await writer.drain()  # the first chunk is committed, then the process dies
    monkeypatch.undo()
    spool.close()

    reopened = Spool(tmp_path / "spool", max_bytes=10**8, on_event=Events())
    try:
        assert reopened.depth == 20
        assert await ResultWriter(Repository(engine), reopened, on_event=Events()).drain() == 20
        assert reopened.depth == 0
    finally:
        reopened.close()
        await engine.dispose()
    assert normalise(await stored_sample_ids(backend.url)) == normalise(spool_ids)


async def test_a_record_the_database_refuses_is_set_aside_and_the_rest_flow(backend: Backend, tmp_path: Path) -> None:
    engine = backend.engine()
    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=10**8, on_event=events)
    good_before, bad, good_after = (make_batch(T0 + timedelta(minutes=5 * i)) for i in range(3))
    bad[0][1][0].sent_at = bad[0][1][0].sent_at.replace(tzinfo=None)  # type: ignore[union-attr]
    for batch in (good_before, bad, good_after):
        spool.append(batch)
    try:
        writer = ResultWriter(Repository(engine), spool, on_event=events, drain_batch=100)
        assert await writer.drain() == 11
        assert (spool.depth, spool.rejected) == (0, 1)
    finally:
        spool.close()
        await engine.dispose()
    assert len(await stored_sample_ids(backend.url)) == 11 * 6
    rejected = (tmp_path / "spool" / "rejected.jsonl").read_text()
    assert str(bad[0][0].run_id) in rejected and "naive datetime" in rejected
    assert "spool_record_rejected" in events.names()


async def test_a_database_that_hangs_costs_one_timeout_then_saves_go_to_the_spool(
    postgres_backend: Backend, tmp_path: Path
) -> None:
    # A black hole: connections are accepted and never answered, as behind a dead network path.
    hung: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = sa.make_url(postgres_backend.url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    engine = create_engine(url, connect_timeout_s=30)
    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=10**8, on_event=events)
    writer = ResultWriter(Repository(engine), spool, on_event=events, db_timeout_s=0.5)
    try:
        started = time.perf_counter()
        outcomes = [await writer.save(make_batch(T0 + timedelta(minutes=5 * i))) for i in range(5)]
        elapsed = time.perf_counter() - started
    finally:
        spool.close()
        await engine.dispose()
        for writer_ in hung:
            writer_.transport.abort()
        server.close()
        await server.wait_closed()
    assert outcomes == [Saved.SPOOLED] * 5
    assert elapsed < 2.5
    [failure] = [fields for name, fields in events.seen if name == "database_write_failed"]
    assert failure["error"] == (
        f"PostgreSQL at 127.0.0.1:{port} did not answer in time; check that the host is reachable "
        "(network, firewall) and the server is not overloaded"
    )


async def test_when_even_the_spool_fails_the_loss_is_counted_and_reported(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'no-schema.db'}")  # no tables: every write fails
    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=100, on_event=events)  # too small for any batch
    writer = ResultWriter(Repository(engine), spool, on_event=events)
    try:
        assert await writer.save(make_batch()) == Saved.LOST
    finally:
        spool.close()
        await engine.dispose()
    assert writer.lost_runs == 4
    assert events.names() == ["database_write_failed", "spool_full", "results_lost"]


async def test_a_save_cancelled_mid_write_is_spooled(backend: Backend, tmp_path: Path) -> None:
    engine = backend.engine()
    spool = Spool(tmp_path / "spool", max_bytes=10**8, on_event=Events())

    class SlowRepository(Repository):
        async def save_runs(self, batch: Sequence[tuple[RunRecord, Sequence[Sample]]]) -> frozenset[uuid.UUID]:
            await asyncio.sleep(10)
            return frozenset()

    writer = ResultWriter(SlowRepository(engine), spool, on_event=Events())
    task = asyncio.create_task(writer.save(make_batch()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    try:
        assert spool.depth == 4
        assert await ResultWriter(Repository(engine), spool, on_event=Events()).drain() == 4
    finally:
        spool.close()
        await engine.dispose()
    assert len(await stored_sample_ids(backend.url)) == 24


async def test_a_value_postgresql_refuses_is_set_aside_too(postgres_backend: Backend, tmp_path: Path) -> None:
    engine = postgres_backend.engine()
    spool = Spool(tmp_path / "spool", max_bytes=10**8, on_event=Events())
    good, bad = (make_batch(T0 + timedelta(minutes=5 * i)) for i in range(2))
    bad[0][1][2].http_status = 2**40  # does not fit the integer column
    writer = ResultWriter(Repository(engine), spool, on_event=Events())
    try:
        assert await writer.save(bad) == Saved.SPOOLED  # refused whole, kept whole
        assert await writer.save(good) == Saved.SPOOLED  # behind it, in order
        assert await writer.drain() == 7
        assert (spool.depth, spool.rejected) == (0, 1)
    finally:
        spool.close()
        await engine.dispose()
    assert len(await stored_sample_ids(postgres_backend.url)) == 7 * 6


async def test_results_are_held_in_memory_while_no_descriptor_is_free_then_spooled_then_stored(
    backend: Backend, tmp_path: Path
) -> None:
    """A flood of connections once took every descriptor: the spool could not open its file and 42
    results were lost. Now they wait in memory, in order, and reach the spool and the database later."""
    import os
    import resource

    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=10_000_000, on_event=events)
    engine = backend.engine()
    writer = ResultWriter(RecordingRepository(engine), spool, on_event=events, db_timeout_s=2)
    earlier, first, second = (make_batch(T0 + timedelta(minutes=m)) for m in (0, 5, 10))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hogs: list[int] = []
    try:
        async with engine.connect() as connection:  # the pool's connection is open before the shortage
            await connection.execute(sa.text("SELECT 1"))
        # The database is away (a spool exists already: new results queue behind it) ...
        spool.append(earlier)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        # ... and no descriptor is free.
        with contextlib.suppress(OSError):
            while True:
                hogs.append(os.open("/dev/null", os.O_RDONLY))
        assert await writer.save(first) == Saved.HELD
        assert await writer.save(second) == Saved.HELD
        assert writer.held_runs == 8 and writer.lost_runs == 0
        for fd in hogs:
            os.close(fd)
        hogs.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert await writer.drain() == 12  # the earlier spool, then both held batches, in order
        assert writer.held_runs == 0 and writer.lost_runs == 0
        committed = writer._repository.committed  # type: ignore[attr-defined]
        expected = [run.run_id for run, _ in [*earlier, *first, *second]]
        assert committed == expected
    finally:
        for fd in hogs:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        spool.close()
        await engine.dispose()
    assert "results_held" in events.names() and "results_released" in events.names()
    assert "results_lost" not in events.names()


async def test_an_outage_logs_its_drain_failures_at_a_falling_rate_and_a_summary_when_it_ends(
    backend: Backend, outage: Outage, tmp_path: Path
) -> None:
    engine = create_engine(outage.app_url, sqlite_busy_timeout_ms=outage.sqlite_busy_timeout_ms, connect_timeout_s=2)
    events = Events()
    spool = Spool(tmp_path / "spool", max_bytes=50 * 1024 * 1024, on_event=events)
    writer = ResultWriter(Repository(engine), spool, on_event=events, db_timeout_s=5)
    try:
        await outage.cut()
        batch = make_batch(T0)
        assert await writer.save(batch) == Saved.SPOOLED
        for _ in range(40):  # forty drain attempts: 200 s of outage at the daemon's 5 s interval
            assert await writer.drain() == 0
        await outage.restore()
        assert await writer.drain() == len(batch)
    finally:
        spool.close()
        await engine.dispose()
    failed = [fields for name, fields in events.seen if name == "spool_drain_failed"]
    assert [f["failures"] for f in failed] == [1, 2, 4, 8, 16, 32]  # not 40 lines
    assert all(f["error"] for f in failed)
    (summary,) = [fields for name, fields in events.seen if name == "spool_drain_recovered"]
    assert summary["failures"] == 40 and summary["failing_for_s"] >= 0 and summary["last_error"]
    assert summary["spool_depth"] == 0
