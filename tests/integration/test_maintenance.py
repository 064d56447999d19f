"""The daemon's housekeeping step: rollups first, then retention, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from monitor.config.models import Database
from monitor.probe.result import Sample
from monitor.schedule.claims import TickClaims
from monitor.schedule.maintenance import maintain_once
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)


def sample(at: datetime) -> Sample:
    return Sample(
        target="t",
        model="m",
        api="openai-chat",
        prompt="p",
        round=1,
        intended_at=at,
        sent_at=at,
        ttft_ms=200.0,
        total_ms=300.0,
        http_status=200,
    )


async def test_maintenance_rolls_up_then_prunes_what_is_past_retention(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = Repository(engine)
        claims = TickClaims(engine)
        now = datetime.now(UTC)
        old, recent = now - timedelta(days=40), now - timedelta(days=2)
        for at in (old, recent):
            await repository.save_runs(
                runs_from_samples([sample(at)], job="j", location="l", provider_of={"t": "p"}, now=at)
            )
            assert await claims.claim(job="j", scheduled_at=at, location="l", owner="me")
        done = await maintain_once(repository, Database(url=backend.url), now=now)
        assert done["hours_rolled_up"] == 2
        assert (done["runs_pruned"], done["samples_pruned"], done["job_ticks_pruned"]) == (1, 1, 1)
        series = (await repository.series_list())[0]
        assert [r.started_at.date() for r in await repository.last_runs(series, 10)] == [recent.date()]
    finally:
        await engine.dispose()
