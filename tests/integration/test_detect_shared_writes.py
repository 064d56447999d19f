"""On SQLite a batch's runs are evaluated in shared write transactions (monitor/detect/service.py, `_SharedWrites`):
a series' history read and state written on the transaction's connection, one connection and one commit for up to
SHARED_WRITES_RUNS runs; a failure rolls the shared transaction back and its runs are evaluated again one by one,
each exactly once; a cancelled batch lets SQLite's lock go."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from monitor.detect import service as service_module
from monitor.detect.detector import Detector
from monitor.store.engine import create_engine, write_transaction
from monitor.store.models import DetectorStateRow
from monitor.store.repository import Repository
from tests.support.detection import config, service_on, tick

pytest_plugins = ("tests.support.store_fixtures",)

TARGETS = ("a1", "a2", "b1")  # two prompts each: six series a tick


@pytest.fixture
async def engine(tmp_path: Path, sqlite_template: Path) -> Any:
    shutil.copy(sqlite_template, tmp_path / "shared.db")
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}")
    yield engine
    await engine.dispose()


async def versions(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as connection:
        rows = await connection.execute(sa.select(DetectorStateRow.version).order_by(DetectorStateRow.series_id))
        return list(rows.scalars())


def counting_checkouts(engine: AsyncEngine) -> list[int]:
    count = [0]

    def checked_out(*_args: Any) -> None:
        count[0] += 1

    sa.event.listen(engine.sync_engine, "checkout", checked_out)
    return count


async def test_a_batch_takes_one_connection_for_its_evaluations_however_many_runs(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    service = service_on(engine, config())
    for index in range(6):  # histories kept, then brought up to date
        batch = tick(index, {}, targets=TARGETS)
        await repository.save_runs(batch)
        await service.after_store("every-5m", batch)
    checkouts = []
    count = counting_checkouts(engine)
    for index, targets in ((6, TARGETS[:1]), (7, TARGETS)):
        batch = tick(index, {}, targets=targets)
        await repository.save_runs(batch)
        count[0] = 0
        await service.after_store("every-5m", batch)
        checkouts.append(count[0])
    assert checkouts[0] == checkouts[1]  # 2 runs or 6: the evaluations' one shared transaction
    assert await versions(engine) == [8, 8, 7, 7, 7, 7]  # a1 probed 8 times, a2 and b1 7


def on_each_evaluation(monkeypatch: pytest.MonkeyPatch, before: Callable[[int], None]) -> None:
    """Call `before(n)` ahead of the detector's n-th evaluation from now on (counted from 1; `before` may raise)."""
    original = Detector.evaluate_with_baseline
    calls = itertools.count(1)

    def evaluate(self: Detector, history: Any, state: Any, point: Any) -> Any:
        before(next(calls))
        return original(self, history, state, point)

    monkeypatch.setattr(Detector, "evaluate_with_baseline", evaluate)


async def test_a_failed_run_rolls_the_shared_transaction_back_and_every_other_run_is_evaluated_once(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = Repository(engine)
    service = service_on(engine, config())
    calls = {"last": 0, "before_tick": 0}

    def fourth_of_a_tick_fails(call: int) -> None:
        # The fourth evaluation of each tick fails, after three evaluated in the shared transaction.
        calls["last"] = call
        if call - calls["before_tick"] == 4:
            raise RuntimeError("boom")

    on_each_evaluation(monkeypatch, fourth_of_a_tick_fails)
    ticks = 4
    with capture_logs() as logs:
        for index in range(ticks):
            calls["before_tick"] = calls["last"]
            batch = tick(index, {}, targets=TARGETS)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
    # Each series evaluated once a tick (its version one on a tick, none overwritten and none twice); the one
    # that failed was evaluated again on its own, and then evaluated.
    assert await versions(engine) == [ticks] * 6
    assert sum(1 for line in logs if line["event"] == "detection_shared_rolled_back") == ticks
    assert [line for line in logs if line["event"] == "detection_failed"] == []


async def test_one_run_a_transaction_when_the_shared_size_is_one(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "SHARED_WRITES_RUNS", 1)
    repository = Repository(engine)
    service = service_on(engine, config())
    commits = [0]

    def committed(*_args: Any) -> None:
        commits[0] += 1

    batch = tick(0, {}, targets=TARGETS)
    await repository.save_runs(batch)
    sa.event.listen(engine.sync_engine, "commit", committed)
    await service.after_store("every-5m", batch)
    assert commits[0] >= len(batch)
    assert await versions(engine) == [1] * 6


async def test_a_cancelled_batch_rolls_back_and_leaves_the_database_writable(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = Repository(engine)
    service = service_on(engine, config())
    reached = asyncio.Event()
    on_each_evaluation(monkeypatch, lambda call: reached.set() if call == 3 else None)
    batch = tick(0, {}, targets=TARGETS)
    await repository.save_runs(batch)
    hold = asyncio.Event()
    original_history = service._history

    async def slow_history(*args: Any) -> Any:
        if reached.is_set():
            await hold.wait()  # cancelled here, in the shared transaction, with runs evaluated in it
        return await original_history(*args)

    monkeypatch.setattr(service, "_history", slow_history)
    evaluation = asyncio.create_task(service.after_store("every-5m", batch))
    await asyncio.wait_for(reached.wait(), 10)
    await asyncio.sleep(0.05)
    evaluation.cancel()
    with pytest.raises(asyncio.CancelledError):
        await evaluation
    assert await versions(engine) == []  # nothing of the shared transaction was committed
    async with asyncio.timeout(2):  # SQLite's write lock was let go (a writer would wait 5 s on it)
        async with write_transaction(engine) as connection:
            await connection.execute(sa.text("SELECT 1"))
