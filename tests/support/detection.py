"""The detection service on a real database, driven tick by tick over runs built as the probe builds them: a
healthy stretch, an outage slowed by a factor per target, a recovery; what it stored and enqueued, read back."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.alert.model import Notification
from monitor.alert.outbox import Outbox
from monitor.config.models import Config
from monitor.detect.service import DetectionService
from monitor.store.models import AlertOutboxRow
from monitor.store.records import RunRecord, runs_from_samples
from monitor.store.repository import Repository
from tests.support.store_fixtures import T0, make_samples

HEALTHY, SLOW, RECOVERED = 20, 8, 12
PROVIDER_OF = {"a1": "gateway-a", "a2": "gateway-a", "a3": "gateway-a", "b1": "gateway-b"}


PROMPTS = ("short", "long")


def config(*, grouping: bool = True, by: str = "provider") -> Config:
    return Config.model_validate(
        {
            "detection": {"min_history_runs": 6, "trailing_runs": 12},
            "alerts": {
                "receivers": {"log": {"type": "log"}},
                "routes": [{"receivers": ["log"]}],
                "grouping": {"enabled": grouping, "by": by},
            },
        }
    )


def tick(
    index: int, slow: Mapping[str, float], *, location: str = "lab", targets: Iterable[str] = PROVIDER_OF
) -> list[tuple[RunRecord, list[Any]]]:
    """One job run over every target and prompt, `slow[target]` times slower."""
    at = T0 + timedelta(minutes=5 * index)
    samples = [
        dataclasses.replace(s, ttft_ms=s.ttft_ms * slow.get(target, 1.0)) if s.ttft_ms is not None else s
        for target in targets
        for prompt in PROMPTS
        for s in make_samples(target, prompt, at=at)
    ]
    return runs_from_samples(samples, job="every-5m", location=location, provider_of=PROVIDER_OF)


def disturbed(batch: list[tuple[RunRecord, list[Any]]]) -> list[tuple[RunRecord, list[Any]]]:
    """The batch as the probe records it when the monitor itself was late around every stamp."""
    samples = [dataclasses.replace(s, disturbed=True, self_delay_ms=250.0) for _run, members in batch for s in members]
    return runs_from_samples(samples, job="every-5m", location="lab", provider_of=PROVIDER_OF)


def outage(slow: Mapping[str, float]) -> list[Mapping[str, float]]:
    """Healthy, then `slow`, then healthy again: each tick's slow-downs."""
    return [{}] * HEALTHY + [slow] * SLOW + [{}] * RECOVERED


async def run_ticks(
    engine: AsyncEngine, service: DetectionService, plan: list[Mapping[str, float]], **kwargs: Any
) -> None:
    repository = Repository(engine)
    for index, slow in enumerate(plan):
        batch = tick(index, slow, **kwargs)
        await repository.save_runs(batch)
        await service.after_store("every-5m", batch)


def service_on(engine: AsyncEngine, settings: Config) -> DetectionService:
    outbox = Outbox(engine, settings.alerts)
    return DetectionService(engine, Repository(engine), settings, outbox=outbox, metrics=None)


async def notifications(engine: AsyncEngine) -> list[Notification]:
    table = AlertOutboxRow.__table__
    async with engine.connect() as connection:
        rows = (await connection.execute(sa.select(table.c.payload).order_by(table.c.created_at))).all()
    return [Notification.from_json(row.payload) for row in rows]


async def rows(engine: AsyncEngine, model: Any) -> list[Any]:
    async with engine.connect() as connection:
        return list((await connection.execute(sa.select(model.__table__))).all())
