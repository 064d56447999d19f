"""One incident's figures (the peak, the baseline and observed TTFT at opening, the latest ratio) are
the same in `ttft-monitor incidents`, the JSON API and the notification sent for it, on both
databases: every surface reads them through monitor.detect.figures.

The incident is raised by the detection service from stored runs, as the daemon raises it: healthy,
slowed (a little, then a lot, so it peaks well after it opened), healthy again until it resolves."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from monitor.alert.model import Notification
from monitor.alert.outbox import Outbox
from monitor.config.models import Config
from monitor.detect.detector import Event
from monitor.detect.figures import figures_of, incident_figures
from monitor.detect.service import DetectionService, incident_change
from monitor.metrics.server import start_metrics_server
from monitor.store import schema
from monitor.store.engine import write_transaction
from monitor.store.incidents import IncidentStore
from monitor.store.models import AlertOutboxRow, IncidentRow
from monitor.store.records import runs_from_samples
from monitor.store.repository import Repository
from monitor.web.api import web_routes
from tests.support.alert_fixtures import store_incident
from tests.support.ports import free_port
from tests.support.store_fixtures import PROVIDERS, T0, Backend, make_samples
from tests.support.triage import cli, write_config

pytest_plugins = ("tests.support.store_fixtures",)

# Healthy, a little slower (a ticket), much slower (the peak), healthy again (the resolve).
PLAN = [1.0] * 20 + [1.7] * 6 + [3.0] * 6 + [1.0] * 14
FIGURES = ("peak_ratio", "peak_at", "opened_baseline_ms", "opened_observed_ms", "baseline_ms", "observed_ms", "ratio")


def settings() -> Config:
    return Config.model_validate(
        {
            "detection": {"min_history_runs": 6, "trailing_runs": 12},
            "alerts": {"receivers": {"log": {"type": "log"}}, "routes": [{"receivers": ["log"]}]},
        }
    )


async def raise_one_incident(backend: Backend) -> list[Notification]:
    engine = backend.engine()
    try:
        config = settings()
        repository = Repository(engine)
        service = DetectionService(engine, repository, config, outbox=Outbox(engine, config.alerts), metrics=None)
        for index, slow in enumerate(PLAN):
            at = T0 + timedelta(minutes=5 * index)
            samples = [
                dataclasses.replace(s, ttft_ms=s.ttft_ms * slow) if s.ttft_ms is not None else s
                for s in make_samples("qwen3-8b", "short", at=at)
            ]
            batch = runs_from_samples(samples, job="every-5m", location="fra-dc1", provider_of=PROVIDERS)
            await repository.save_runs(batch)
            await service.after_store("every-5m", batch)
        table = AlertOutboxRow.__table__
        async with engine.connect() as connection:
            rows = (await connection.execute(sa.select(table.c.payload).order_by(table.c.created_at))).all()
    finally:
        await engine.dispose()
    return [Notification.from_json(row.payload) for row in rows]


async def api_incidents(backend: Backend) -> list[dict[str, Any]]:
    engine = backend.engine()
    port = free_port()
    now = T0 + timedelta(minutes=5 * len(PLAN))
    routes = web_routes(engine, now=lambda: now)
    runner = await start_metrics_server(CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=routes)
    try:
        url = f"http://127.0.0.1:{port}/api/v1/incidents?since=1d"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
    finally:
        await runner.cleanup()
        await engine.dispose()
    items: list[dict[str, Any]] = body["incidents"]
    return items


async def _ready() -> tuple[bool, str]:
    return True, "ready"


def of(item: dict[str, Any]) -> dict[str, Any]:
    return {name: item[name] for name in FIGURES}


async def test_an_incident_has_the_same_peak_and_opening_in_the_cli_the_api_and_its_notification(
    backend: Backend, tmp_path: Path
) -> None:
    sent = await raise_one_incident(backend)
    done = cli(write_config(tmp_path, backend.url), "incidents", "--format", "json", "--days", "3650")
    assert done.code == 0, done
    (listed,) = [item for item in json.loads(done.stdout) if item["kind"] == "regression"]
    (served,) = [item for item in await api_incidents(backend) if item["kind"] == "regression"]
    resolved = [n for n in sent if n.state == "resolved" and str(n.incident_id) == listed["id"]]
    assert len(resolved) == 1, sent
    assert listed["state"] == "resolved" and served["id"] == listed["id"]
    # What it was: the opening and the peak; the latest ratio is the run that cleared it.
    figures = of(listed)
    assert figures["peak_ratio"] > 2.5, figures
    assert figures["opened_observed_ms"] / figures["opened_baseline_ms"] < figures["peak_ratio"], figures
    assert figures["ratio"] < 1.3, figures
    assert of(served) == figures
    notified = incident_figures(**{name: getattr(resolved[0], name) for name in FIGURES}).to_json()
    assert of(notified) == figures


async def test_an_escalation_and_its_resolve_keep_the_figures_the_incident_opened_with(backend: Backend) -> None:
    # The detector re-baselines an incident that escalates from ticket to page, and its resolve carries
    # those figures as `opened_*`: the row keeps the ones it was opened with.
    engine = backend.engine()
    store = IncidentStore()
    opened = Event(
        kind="regression", action="open", severity="ticket", at=T0, opened_at=T0,
        baseline_ms=200.0, observed_ms=300.0, ratio=1.5, peak_ratio=1.5, peak_at=T0,
    )  # fmt: skip
    later = T0 + timedelta(minutes=30)
    escalated = dataclasses.replace(
        opened, action="update", severity="page", at=later, baseline_ms=220.0, observed_ms=660.0, ratio=3.0,
        peak_ratio=3.0, peak_at=later,
    )  # fmt: skip
    resolved = dataclasses.replace(
        escalated, action="resolve", at=later + timedelta(minutes=30), resolved_at=later + timedelta(minutes=30),
        observed_ms=230.0, ratio=1.05, detail={"opened_baseline_ms": 220.0, "opened_observed_ms": 660.0},
    )  # fmt: skip
    try:
        incident_id = await store_incident(engine, severity="ticket")
        async with write_transaction(engine) as connection:
            for event in (opened, escalated, resolved):
                await store.update_incident(connection, incident_id, incident_change(event, event.at))
        async with engine.connect() as connection:
            row = (await connection.execute(sa.select(IncidentRow.__table__))).one()
    finally:
        await engine.dispose()
    figures = figures_of(row)
    assert (figures.opened_baseline_ms, figures.opened_observed_ms) == (200.0, 300.0)
    assert (figures.peak_ratio, figures.ratio) == (3.0, 1.05)


async def test_the_json_list_stays_json_whatever_the_command_logs(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen under load: the start-up schema check's quick read failed (a locked SQLite), the full check ran and
    # alembic logged a line, which went to stdout in the middle of `--format json`. Log lines go to stderr.
    await raise_one_incident(backend)
    monkeypatch.setattr(schema, "HEAD_REVISION", "not-the-head")  # the full check, as when the quick read fails
    alembic_log = logging.getLogger("alembic.runtime.migration")
    level = alembic_log.level
    alembic_log.setLevel(logging.INFO)  # as an earlier command in this worker had left it when it was seen
    try:
        done = cli(write_config(tmp_path, backend.url), "incidents", "--format", "json", "--days", "3650")
    finally:
        alembic_log.setLevel(level)
    assert done.code == 0, done
    assert [item["kind"] for item in json.loads(done.stdout)] == ["regression"]
    assert "Context impl" in done.stderr, done.stderr
