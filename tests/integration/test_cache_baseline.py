"""A cache outage stays out of the warm series' baseline: the runs its `cache_stopped` incidents cover
(the judging window, then to the resolution) are left out of the history the regression detector draws
its baseline from, read from the stored incidents on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.config.models import Config
from monitor.detect.cache_health import leave_out_cacheless
from monitor.detect.cache_service import CacheService
from monitor.detect.detector import Detector, RunPoint, SeriesState
from monitor.store.records import SeriesKey
from tests.support.alert_fixtures import resolve_incident, store_incident
from tests.support.series import EVERY, T0

pytest_plugins = ("tests.support.store_fixtures",)

WARM = SeriesKey("cachey", "vllm", "Qwen/Qwen3-8B", "long.warm", "fra-dc1")


def runs(count: int, ms: float = 20.0, start: int = 0, **extra: Any) -> list[RunPoint]:
    return [RunPoint(T0 + (start + i) * EVERY, ms, ok=2, errors=0, **extra) for i in range(count)]


def config() -> Config:
    return Config.model_validate(
        {
            "location": "fra-dc1",
            "providers": {"vllm": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"cachey": {"provider": "vllm", "model": "Qwen/Qwen3-8B"}},
            "prompts": {"long": {"tokens": 2048, "cache": "both"}},
            "jobs": [{"name": "j", "schedule": "*/5 * * * *", "targets": ["cachey"], "prompts": ["long"]}],
        }
    )


def test_the_window_that_opened_an_outage_and_the_outage_are_left_out() -> None:
    history = runs(40)
    at = [point.at for point in history]
    kept = leave_out_cacheless(history, [(at[20], at[30])], window_runs=3)
    assert [point.at for point in kept] == at[:18] + at[31:]
    # Two outages, one opened within the first runs (its window clipped at the start), one still open.
    kept = leave_out_cacheless(history, [(at[1], at[4]), (at[35], at[-1] + EVERY)], window_runs=3)
    assert [point.at for point in kept] == at[5:33]
    assert leave_out_cacheless(history, [], window_runs=3) == history
    assert leave_out_cacheless([], [(at[1], at[4])], window_runs=3) == []


def test_with_the_outage_left_out_the_warm_baseline_is_the_cached_path() -> None:
    # Half a day of 20 ms, then an outage of 9 hours at 330 ms, then the cache back: left in, the outage
    # lifts the warm baseline far from the cached path; left out, it stays there.
    healthy, outage = runs(144), runs(108, ms=330.0, start=144)
    after = runs(3, start=252)
    span = [(outage[2].at, outage[-1].at)]
    detector = Detector()
    polluted = detector.evaluate_with_baseline([*healthy, *outage, *after[:-1]], SeriesState(), after[-1])[2]
    kept = leave_out_cacheless([*healthy, *outage, *after[:-1]], span, window_runs=3)
    clean = detector.evaluate_with_baseline(kept, SeriesState(), after[-1])[2]
    assert clean is not None and 18 < clean < 23, clean
    assert polluted is not None and polluted > 1.5 * clean, polluted


def test_a_run_that_is_no_latency_evidence_is_not_the_replays_history() -> None:
    replayer = Detector().replayer()
    for point in runs(144):
        replayer.feed(point)
    before = replayer.baseline_ms
    for point in runs(120, ms=330.0, start=144, latency_evidence=False):
        replayer.feed(point)
    replayer.feed(runs(1, start=264)[0])
    assert before is not None and replayer.baseline_ms == before


async def test_the_service_reads_the_outages_from_the_stored_incidents(engine: AsyncEngine) -> None:
    history = runs(40)
    at = [point.at for point in history]
    closed = await store_incident(engine, target="cachey", prompt="long.warm", kind="cache_stopped", opened_at=at[10])
    await resolve_incident(engine, closed, at[14])
    await store_incident(engine, target="cachey", prompt="long.warm", kind="cache_stopped", opened_at=at[30])
    # Another kind, another series: not outages of this cache.
    await store_incident(engine, target="cachey", prompt="long.warm", kind="regression", opened_at=at[22])
    await store_incident(engine, target="cachey", prompt="long", kind="cache_stopped", opened_at=at[24])
    service = CacheService(engine, cast(Any, None), config(), outbox=None, metrics=None)
    assert service.is_warm("long.warm") and not service.is_warm("long")
    kept = await service.without_cacheless(WARM, history, at[-1] + timedelta(minutes=1))
    assert [point.at for point in kept] == at[:8] + at[15:28]
    unknown = SeriesKey("other", "vllm", "m", "long.warm", "fra-dc1")
    assert await service.without_cacheless(unknown, history, at[-1]) == history
