"""Detection keeps each series' history between evaluations (monitor/detect/history.py) and reads only the runs
stored since: on a real database (SQLite and PostgreSQL) it decides exactly what a service reading every run
afresh decides, through a late run (a spool's replay) stored among the kept ones, and a run deleted."""

from __future__ import annotations

import asyncio
import shutil
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from monitor.app import attach_detection, attach_detection_service, build_context, open_store
from monitor.config.models import Config
from monitor.detect.service import DetectionService
from monitor.store.engine import create_engine
from monitor.store.models import DetectorStateRow, IncidentRow, RunRow
from monitor.store.repository import HistoryRead, Repository
from tests.support.detection import config, outage, service_on, tick
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)

TARGETS = ("a1", "b1")
# One series' first slow runs (ticks 20-27 of a1 3x slower from 20 to 44) reach the database at tick 33 (a
# spool replayed) and are not evaluated: the evaluations after read them all the same. Tick 33, after that
# series' page (tick 31: with the noise model a page waits out 4 slow runs in a row): slow runs stored before
# a streak is confirmed join the reference it is tested against, and no page opens (docs/detection.md).
LATE_TICKS, STORED_AT_TICK = range(20, 28), 33
DELETED_TICK, DELETED_AT_TICK = 10, 40


async def _states(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        states = (
            await connection.execute(
                sa.select(DetectorStateRow.series_id, DetectorStateRow.version, DetectorStateRow.state).order_by(
                    DetectorStateRow.series_id
                )
            )
        ).all()
        incidents = (
            await connection.execute(
                sa.select(
                    IncidentRow.series_id, IncidentRow.kind, IncidentRow.severity, IncidentRow.opened_at
                ).order_by(IncidentRow.series_id, IncidentRow.opened_at)
            )
        ).all()
    return [tuple(row) for row in states] + [tuple(row) for row in incidents]


async def _delete_run(engine: AsyncEngine, run_id: Any) -> None:
    async with engine.begin() as connection:
        await connection.execute(sa.delete(RunRow).where(RunRow.id == run_id))


async def test_a_service_keeping_histories_decides_as_one_reading_every_run_afresh(
    backend: Backend, tmp_path: Path, sqlite_template: Path
) -> None:
    shutil.copy(sqlite_template, tmp_path / "afresh.db")
    engines = {
        "kept": backend.engine(),
        "afresh": create_engine(f"sqlite+aiosqlite:///{tmp_path / 'afresh.db'}"),
    }
    afresh_config = config().model_copy(deep=True)
    afresh_config.detection.history_memory_mb = 0.0
    services = {
        "kept": service_on(engines["kept"], config()),
        "afresh": service_on(engines["afresh"], afresh_config),
    }
    repositories = {name: Repository(engine) for name, engine in engines.items()}
    plan: list[dict[str, float]] = [{}] * 20 + [{"a1": 3.0}] * 25 + [{}] * 15
    late: list[Any] = []
    deleted: Any = None
    rereads = 0
    try:
        for index, slow in enumerate(plan):
            batch = tick(index, slow, targets=TARGETS)
            if index in LATE_TICKS:
                late.append(batch[0])
                batch = batch[1:]
            if index == DELETED_TICK:
                deleted = batch[1][0].run_id
            for name in engines:
                if index == STORED_AT_TICK:
                    await repositories[name].save_runs(late)
                if index == DELETED_AT_TICK:
                    await _delete_run(engines[name], deleted)
                await repositories[name].save_runs(batch)
                with capture_logs() as logs:
                    await services[name].after_store("every-5m", batch)
                if name == "kept":
                    rereads += sum(1 for line in logs if line["event"] == "detection_history_reread")
            assert await _states(engines["kept"]) == await _states(engines["afresh"]), f"tick {index}"
        incidents = [row for row in await _states(engines["kept"]) if len(row) == 4]
    finally:
        for engine in engines.values():
            await engine.dispose()
    # The late run and the deleted one each made their series read its history afresh, once.
    assert rereads == 2
    assert {kind for _series, kind, _severity, _opened in incidents} == {"regression"}
    assert len(incidents) == 2  # a1's two prompts paged: the scenario did decide something


async def test_series_beyond_the_memory_budget_are_read_afresh_said_once_and_decide_alike(
    tmp_path: Path, sqlite_template: Path
) -> None:
    for name in ("tight.db", "afresh.db"):
        shutil.copy(sqlite_template, tmp_path / name)
    engines = {name: create_engine(f"sqlite+aiosqlite:///{tmp_path / (name + '.db')}") for name in ("tight", "afresh")}
    settings = {name: config().model_copy(deep=True) for name in engines}
    settings["tight"].detection.history_memory_mb = 0.004  # two or three series' first ticks, then fewer
    settings["afresh"].detection.history_memory_mb = 0.0
    services = {name: service_on(engine, settings[name]) for name, engine in engines.items()}
    warnings: dict[str, int] = {name: 0 for name in engines}
    try:
        for index, slow in enumerate(outage({"b1": 3.0})):
            batch = tick(index, slow, targets=TARGETS)
            for name, engine in engines.items():
                await Repository(engine).save_runs(batch)
                with capture_logs() as logs:
                    await services[name].after_store("every-5m", batch)
                warnings[name] += sum(1 for line in logs if line["event"] == "detection_history_budget_full")
            assert await _states(engines["tight"]) == await _states(engines["afresh"]), f"tick {index}"
    finally:
        for engine in engines.values():
            await engine.dispose()
    # Said once by the service with a budget too small, never by the one told to keep nothing.
    assert warnings == {"tight": 1, "afresh": 0}


class _HeldRepository(Repository):
    """Holds the next whole-history read until released: a reload can land while an evaluation reads."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.reading = asyncio.Event()
        self.release = asyncio.Event()
        self.hold = False

    async def history_rows(self, *args: Any, **kwargs: Any) -> HistoryRead:
        rows = await super().history_rows(*args, **kwargs)
        if self.hold:
            self.hold = False
            self.reading.set()
            await self.release.wait()
        return rows


async def test_a_history_read_under_settings_a_reload_replaced_is_not_kept(
    tmp_path: Path, sqlite_template: Path
) -> None:
    # An evaluation under the old detection settings reads a series' history; a reload with other settings
    # drops every history kept; the evaluation goes on under the old ones and must not put what it read, or
    # the residuals it computed under them, in the new cache.
    shutil.copy(sqlite_template, tmp_path / "reload.db")
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'reload.db'}")
    repository = _HeldRepository(engine)
    settings = config()
    service = DetectionService(engine, repository, settings, outbox=None, metrics=None)
    try:
        for index in range(12):
            batch = tick(index, {}, targets=("a1",))
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
        assert len(service._histories) == 2  # the histories the service keeps: what the race is about
        service.update_config(
            settings.model_copy(
                update={"detection": settings.detection.model_copy(update={"seasonal_window_minutes": 20.0})}
            )
        )
        assert len(service._histories) == 0
        service.update_config(settings)  # back: the histories are read whole again ...
        repository.hold = True
        batch = tick(12, {}, targets=("a1",))
        await repository.save_runs(batch)
        evaluation = asyncio.create_task(service.after_store("every-5m", batch))
        await asyncio.wait_for(repository.reading.wait(), 10)
        # ... and while the first of them is read, the settings change again.
        service.update_config(
            settings.model_copy(
                update={"detection": settings.detection.model_copy(update={"seasonal_window_minutes": 20.0})}
            )
        )
        repository.release.set()
        await asyncio.wait_for(evaluation, 10)
        # The series read under the old settings was not kept; the other, read under the new, was.
        assert len(service._histories) == 1
    finally:
        await engine.dispose()


async def test_once_keeps_no_history_and_the_daemon_does(tmp_path: Path, sqlite_template: Path) -> None:
    # `once` evaluates each series once and exits: a history kept would only hold memory (up to the budget)
    # until then. The daemon's detection keeps them.
    shutil.copy(sqlite_template, tmp_path / "once.db")
    settings = Config.model_validate(
        {
            "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'once.db'}", "state_dir": str(tmp_path / "state")},
            "detection": config().detection.model_dump(),
        }
    )
    async with AsyncExitStack() as stack:
        store = await open_store(settings, metrics=None)
        stack.callback(store.spool.close)
        stack.push_async_callback(store.engine.dispose)
        context = await build_context(settings, stack, store=store, metrics=None)
        _dispatcher, once = await attach_detection(context, store, stack, metrics=None)  # as `once` attaches it
        daemon = attach_detection_service(context, store, outbox=_dispatcher.outbox, metrics=None)  # as `run` does
        for index in range(8):
            batch = tick(index, {}, targets=("a1",))
            await store.repository.save_runs(batch)
            await once.after_store("every-5m", batch)
            await daemon.after_store("every-5m", batch)
        assert len(once._histories) == 0 and len(daemon._histories) == 2  # the histories each keeps


async def test_a_reload_that_removes_a_target_drops_its_per_series_bookkeeping(
    tmp_path: Path, sqlite_template: Path
) -> None:
    # A daemon reloaded for months as targets come and go kept a history lock and an evaluation turn for
    # every series it had ever evaluated.
    shutil.copy(sqlite_template, tmp_path / "prune.db")
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'prune.db'}")
    repository = Repository(engine)

    def probing(targets: tuple[str, ...]) -> Config:
        settings = config().model_dump()
        settings["providers"] = {
            provider: {"base_url": "http://127.0.0.1:9/v1", "api": "openai-chat"}
            for provider in ("gateway-a", "gateway-b")
        }
        settings["targets"] = {
            "a1": {"provider": "gateway-a", "model": "m"},
            "b1": {"provider": "gateway-b", "model": "m"},
        }
        settings["prompts"] = {"short": {"tokens": 128}, "long": {"tokens": 1024}}
        settings["jobs"] = [
            {"name": "every-5m", "schedule": "*/5 * * * *", "targets": list(targets), "prompts": ["short", "long"]}
        ]
        return Config.model_validate(settings)

    service = DetectionService(engine, repository, probing(("a1", "b1")), outbox=None, metrics=None)
    try:
        for index in range(8):
            batch = tick(index, {}, targets=("a1", "b1"))
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
        evaluated = {(key.target, key.prompt) for key in service._history_locks}
        assert evaluated == {(t, p) for t in ("a1", "b1") for p in ("short", "long")}
        assert {(key.target, key.prompt) for key in service._turns} == evaluated
        service.update_config(probing(("a1",)))
        assert {(key.target, key.prompt) for key in service._history_locks} == {("a1", "short"), ("a1", "long")}
        assert {(key.target, key.prompt) for key in service._turns} == {("a1", "short"), ("a1", "long")}
    finally:
        await engine.dispose()
