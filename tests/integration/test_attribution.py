"""Where a regression's time went: the classifier and its sentence (tables), and where they are said."""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from monitor.alert.model import Notification
from monitor.alert.text import facts, plain_text
from monitor.commands.incidents import format_table
from monitor.config.models import Config
from monitor.detect.attribution import ServerSplit, classify, server_split, split_text
from monitor.detect.service import DetectionService
from monitor.store.records import RunRecord, SeriesKey
from monitor.store.repository import Repository
from monitor.web.incidents import IncidentView, list_incidents
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

QUEUED = ServerSplit(ttft_ms=900, ttft_baseline_ms=360, waiting=12, waiting_baseline=0)
QUEUE_SPLIT = ServerSplit(
    ttft_ms=900, ttft_baseline_ms=360, queue_ms=600, queue_baseline_ms=10, prefill_ms=290, prefill_baseline_ms=340
)
PREFILL_SPLIT = ServerSplit(
    ttft_ms=900, ttft_baseline_ms=360, queue_ms=20, queue_baseline_ms=10, prefill_ms=870, prefill_baseline_ms=340
)
SERVER_FLAT = ServerSplit(ttft_ms=370, ttft_baseline_ms=360, waiting=0, waiting_baseline=0)
SERVER_SLOWER_NOBODY_WAITING = ServerSplit(ttft_ms=900, ttft_baseline_ms=360, waiting=0, waiting_baseline=0)


@pytest.mark.parametrize(
    ("client", "baseline", "split", "expected"),
    [
        pytest.param(950, 400, QUEUED, "server_queue", id="waiting-rose"),
        pytest.param(950, 400, QUEUE_SPLIT, "server_queue", id="queue-time-grew-most"),
        pytest.param(950, 400, PREFILL_SPLIT, "server_prefill", id="prefill-time-grew-most"),
        pytest.param(950, 400, SERVER_SLOWER_NOBODY_WAITING, "server_prefill", id="server-slower-no-queue"),
        pytest.param(950, 400, SERVER_FLAT, "outside_server", id="server-unchanged"),
        pytest.param(
            950, 400, ServerSplit(ttft_ms=600, ttft_baseline_ms=360), "outside_server", id="server-under-half"
        ),
        pytest.param(
            3030,
            13,
            ServerSplit(ttft_ms=1400, ttft_baseline_ms=12, queue_ms=2100, queue_baseline_ms=1, waiting=7),
            "server_queue",
            id="queue-explains-it-though-server-ttft-mean-lags",
        ),
        pytest.param(
            7695,
            21,
            ServerSplit(
                ttft_ms=1039,
                ttft_baseline_ms=19,
                queue_ms=901,
                queue_baseline_ms=0,
                prefill_ms=4,
                prefill_baseline_ms=4,
                waiting=6,
                waiting_baseline=0,
            ),
            "server_queue",
            id="burst-dilutes-the-server-mean-but-requests-waited",
        ),
        pytest.param(
            950,
            400,
            ServerSplit(ttft_ms=380, ttft_baseline_ms=360, queue_ms=150, queue_baseline_ms=10),
            "outside_server",
            id="small-queue-growth-is-not-enough",
        ),
        pytest.param(950, 400, ServerSplit(ttft_ms=900), None, id="no-server-baseline"),
        pytest.param(950, 400, None, None, id="no-server-metrics"),
        pytest.param(380, 400, QUEUED, None, id="client-did-not-grow"),
        pytest.param(None, 400, QUEUED, None, id="no-client-value"),
    ],
)
def test_classify(
    client: float | None, baseline: float | None, split: ServerSplit | None, expected: str | None
) -> None:
    assert classify(client, baseline, split) == expected


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        (
            QUEUED,
            "client TTFT 950 ms (baseline 400); server TTFT 900 ms (baseline 360); 12 requests waiting "
            "(baseline 0): queueing on the server",
        ),
        (
            SERVER_FLAT,
            "client TTFT 950 ms (baseline 400); server TTFT 370 ms (baseline 360); 0 requests waiting "
            "(baseline 0): server TTFT unchanged: network or gateway",
        ),
        (PREFILL_SPLIT, "client TTFT 950 ms (baseline 400); server TTFT 900 ms (baseline 360): prefill on the server"),
        (None, None),
    ],
)
def test_split_text(split: ServerSplit | None, expected: str | None) -> None:
    assert split_text(950, 400, split) == expected


def _run(minutes: int, **server: Any) -> RunRecord:  # server_* fields, floats or None
    at = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    series = SeriesKey("t", "p", "m", "short", "lab")
    run = RunRecord(
        uuid.uuid4(), "j", series, "openai-chat", at, at, at, 5, 0, 5, 0, 400, 390, 410, None, None, None, None,
    )  # fmt: skip
    return dataclasses.replace(run, **server)


def test_server_split_takes_baselines_as_history_medians() -> None:
    history = [_run(i, server_ttft_ms=v, server_waiting=0) for i, v in enumerate([350, 360, 370, None])]
    split = server_split(_run(10, server_ttft_ms=900, server_waiting=12, server_queue_ms=500), history)
    assert split == ServerSplit(ttft_ms=900, ttft_baseline_ms=360, waiting=12, waiting_baseline=0, queue_ms=500)
    assert server_split(_run(10), history) is None


NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_a_regression_notice_says_where_the_time_went() -> None:
    text = split_text(950, 400, QUEUED)
    assert text is not None
    notice = Notification(
        incident_id=uuid.uuid4(), state="firing", kind="regression", severity="page", job="j", target="t",
        model="m", provider="p", prompt="short", location="lab", since=NOW, baseline_ms=400, observed_ms=950,
        ratio=2.375, cause="server_queue", attribution=text,
    )  # fmt: skip
    assert ("Where", text) in facts(notice, NOW)
    assert f"Where: {text}" in plain_text(notice, NOW).splitlines()
    assert Notification.from_json(notice.to_json()) == notice
    without = notice.with_changes(cause=None, attribution="")
    assert all(label != "Where" for label, _ in facts(without, NOW))


def test_incidents_table_and_json_state_the_split() -> None:
    text = split_text(950, 400, QUEUED)
    item = IncidentView(
        id=uuid.uuid4(), kind="regression", severity="page", target="t", model="m", provider="p", prompt="short",
        location="lab", job="j", opened_at=NOW - timedelta(minutes=5), resolved_at=None, baseline_ms=400,
        observed_ms=950, ratio=2.375, error=None, cause="server_queue", attribution=text,
    )  # fmt: skip
    table = format_table([item], NOW, 7).splitlines()
    assert table[2] == f"  where: {text}"
    assert item.to_json()["cause"] == "server_queue" and item.to_json()["attribution"] == text


# ---------------------------------------------------------------- through detection and the store


async def test_a_regression_from_the_servers_queue_is_labelled_so_in_incidents(backend: Backend) -> None:
    engine = backend.engine()
    try:
        repository = Repository(engine)
        service = DetectionService(engine, repository, Config(), outbox=None, metrics=None)
        rng = random.Random(7)
        for i in range(72):
            slow = i >= 60  # six hours at 400 ms, then the server queues: 12 waiting, 900 ms on its clock
            batch = make_batch(T0 + timedelta(minutes=5 * i), targets=("qwen3-8b",), prompts=("short",))
            noise = rng.uniform(-10, 10)
            changed = [
                (
                    dataclasses.replace(
                        run,
                        ttft_p50_ms=(950.0 if slow else 400.0) + noise,
                        server_ttft_ms=(900.0 if slow else 360.0) + noise,
                        server_waiting=12.0 if slow else 0.0,
                    ),
                    samples,
                )
                for run, samples in batch
            ]
            await repository.save_runs(changed)
            await service.after_store("every-5m", changed)
        listed = await list_incidents(engine, now=T0 + timedelta(days=1), recent_days=7)
    finally:
        await engine.dispose()
    regressions = [item for item in listed if item.kind == "regression"]
    assert regressions, listed
    item = regressions[0]
    assert item.cause == "server_queue", item
    assert item.attribution is not None and item.attribution.endswith(": queueing on the server"), item
    assert "12 requests waiting (baseline 0)" in item.attribution
