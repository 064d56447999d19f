"""A crossed budget's holds kept in the database (table budget_holds, migration 0016), on SQLite and
PostgreSQL: saved when a budget acts, taken up by a new process (a restart, another replica, each
`once`), left out once their period ended or the config no longer asks for them, and read by `once`
before its first request without SQLAlchemy (monitor.store.saved_calibration)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.config.models import Config
from monitor.detect.budget_service import BudgetService, Hold, in_force
from monitor.store.records import BudgetHoldRecord
from monitor.store.repository import Repository
from monitor.store.saved_calibration import read_before_probing
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)


def config(action: str = "pause", **extra: Any) -> Config:
    return Config.model_validate(
        {
            "location": "fra",
            "providers": {"p": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"t": {"provider": "p", "model": "m"}},
            "prompts": {"short": {"tokens": 128}},
            "jobs": [
                {"name": "tick", "schedule": "*/5 * * * *", "targets": ["t"], "prompts": ["short"]},
                {"name": "other", "schedule": "*/5 * * * *", "targets": ["t"], "prompts": ["short"]},
            ],
            "budget": {"jobs": {"tick": {"per": "day", "tokens": 1000, "action": action}}},
            **extra,
        }
    )


def hold(job: str = "tick", action: str = "pause", until: datetime = NOW + timedelta(hours=12)) -> BudgetHoldRecord:
    return BudgetHoldRecord(job, action, "jobs.tick", "day", NOW - timedelta(hours=1), until)


def test_a_hold_is_in_force_while_its_period_lasts_and_the_config_asks_for_it() -> None:
    assert in_force(config(), Hold.of(hold()), NOW)
    assert not in_force(config(), Hold.of(hold(until=NOW)), NOW)  # its period ended
    assert not in_force(config("reduce"), Hold.of(hold()), NOW)  # the action changed in the file
    assert not in_force(config("notify"), Hold.of(hold()), NOW)
    assert not in_force(config(), Hold.of(hold(job="other")), NOW)  # not in the budget's scope
    assert not in_force(config(), Hold.of(hold(action="explode")), NOW)


async def test_a_new_process_takes_up_the_holds_in_force_and_drops_the_rest(
    engine: AsyncEngine, backend: Backend
) -> None:
    repository = Repository(engine)
    await repository.save_budget_hold("fra", hold())
    await repository.save_budget_hold("fra", hold(job="other"))  # the config no longer asks for it
    await repository.save_budget_hold("elsewhere", hold(action="reduce"))  # another location's
    assert sorted(h.job for h in await repository.load_budget_holds("fra")) == ["other", "tick"]
    await repository.save_budget_hold("fra", hold(until=NOW + timedelta(hours=6)))  # replaces, never doubles
    service = BudgetService(repository, config(), outbox=None, metrics=None, clock=lambda: NOW)
    await service.restore()
    taken = service.hold_for("tick", NOW)
    assert taken is not None and (taken.action, taken.until) == ("pause", NOW + timedelta(hours=6))
    assert service.hold_for("other", NOW) is None
    # `once` reads the same, before its first request and without the store.
    read = await read_before_probing(backend.url, location="fra", timeout_s=5)
    assert read is not None
    assert {(h.job, h.action, h.until) for h in read.holds} == {
        ("tick", "pause", NOW + timedelta(hours=6)),
        ("other", "pause", NOW + timedelta(hours=12)),
    }
    # The stale hold is deleted at the next check; the one in force stays.
    await service._check()
    assert [h.job for h in await repository.load_budget_holds("fra")] == ["tick"]
    await repository.delete_budget_holds("fra", ["tick"])
    assert await repository.load_budget_holds("fra") == []
    assert [h.job for h in await repository.load_budget_holds("elsewhere")] == ["tick"]


async def test_a_schema_without_the_table_makes_once_open_the_store_first(empty_backend: Backend) -> None:
    # An empty database (no calibration, no budget_holds): the store's own check then names the upgrade.
    assert await read_before_probing(empty_backend.url, location="fra", timeout_s=5) is None
