"""Shared pieces of the alerting tests (loaded with `pytest_plugins`, after tests.support.store_fixtures): a real
HTTP receiver on loopback that records every request and answers as scripted, incidents stored in a
real database, configs.

No test lives here. Signatures are verified with code written here, independently of monitor.alert.
PYTEST_DONT_REWRITE: the test modules import helpers from here before `pytest_plugins` loads it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from monitor.alert.model import Notification
from monitor.alert.settings import Alerts, Receiver
from monitor.store.engine import WRITE_OPTION, create_engine
from monitor.store.models import AlertDeliveryRow, AlertOutboxRow, IncidentRow, SeriesRow, table_of
from tests.support.store_fixtures import BACKENDS, Backend, PostgresServer, _skip_without_postgres

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LINK = "https://grafana.example.com/d/ttft?var-target=qwen3-8b&var-prompt=short&var-location=fra-dc1"
INCIDENT = uuid.UUID("0e6f1a52-3b7c-4d0e-9f5a-2c1b8d7e6f40")


# ---------------------------------------------------------------- a receiver on loopback


@dataclass
class Reply:
    status: int = 200
    body: Any = "ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Loopback:
    """A real aiohttp server on 127.0.0.1. `script(path, *replies)` queues answers (the last repeats);
    `verify(path, check)` refuses requests with 401 when `check` returns a problem."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._checks: dict[str, Callable[[Received], str | None]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.arrived = asyncio.Event()

    def script(self, path: str, *replies: Reply) -> None:
        self._scripts[path] = list(replies)

    def verify(self, path: str, check: Callable[[Received], str | None]) -> None:
        self._checks[path] = check

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Received]:
        return [item for item in self.received if item.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        item = Received(
            request.method,
            request.path,
            dict(request.query),
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.received.append(item)
        self.arrived.set()
        check = self._checks.get(request.path)
        problem = check(item) if check is not None else None
        if problem:
            return web.Response(status=401, text=problem)
        replies = self._scripts.get(request.path) or [Reply()]
        reply = replies.pop(0) if len(replies) > 1 else replies[0]
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        payload = reply.body
        if isinstance(payload, dict | list):
            payload = json.dumps(payload)
        data = payload.encode() if isinstance(payload, str) else payload
        return web.Response(status=reply.status, body=data, headers=reply.headers)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, count: int, *, path: str | None = None, seconds: float = 5.0) -> list[Received]:
        """Until `count` requests (to `path`, if given) have arrived; fails the test after `seconds`."""
        async with asyncio.timeout(seconds):
            while len(self.at(path) if path else self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.received


@pytest.fixture
async def loopback() -> AsyncIterator[Loopback]:
    server = Loopback()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


# ---------------------------------------------------------------- databases


@pytest.fixture(scope="module")
def alert_postgres_url(postgres_server: PostgresServer | None) -> Iterator[str | None]:
    """One PostgreSQL database per test module, migrated to head."""
    if postgres_server is None:
        yield None
        return
    url = asyncio.run(postgres_server.create())
    try:
        yield url
    finally:
        asyncio.run(postgres_server.drop(url))


async def _empty(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                sa.text(
                    "TRUNCATE alert_deliveries, alert_outbox, annotations, incidents, series RESTART IDENTITY CASCADE"
                )
            )
    finally:
        await engine.dispose()


@pytest.fixture(params=BACKENDS)
async def alert_backend(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path, alert_postgres_url: str | None
) -> AsyncIterator[Backend]:
    """Like the store suite's `backend` (SQLite and PostgreSQL at head, empty), but PostgreSQL tests share
    one database per module, emptied before each test: a database per test costs two seconds."""
    if request.param == "sqlite":
        shutil.copyfile(sqlite_template, tmp_path / "store.db")
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
        return
    if alert_postgres_url is None:
        _skip_without_postgres(request)
    assert alert_postgres_url is not None
    await _empty(alert_postgres_url)
    yield Backend("postgres", alert_postgres_url)


# ---------------------------------------------------------------- independent verifiers


def standard_webhook_problem(secret: str, item: Received) -> str | None:
    """A Standard Webhooks verifier written from the spec: None when the signature matches."""
    msg_id = item.headers.get("webhook-id")
    timestamp = item.headers.get("webhook-timestamp")
    signatures = item.headers.get("webhook-signature", "")
    if not msg_id or not timestamp:
        return "missing webhook-id or webhook-timestamp"
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    expected = base64.b64encode(
        hmac.new(key, msg_id.encode() + b"." + timestamp.encode() + b"." + item.body, hashlib.sha256).digest()
    ).decode()
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return None
    return "signature mismatch"


def feishu_sign(secret: str, timestamp: str) -> str:
    string_to_sign = timestamp + "\n" + secret
    return base64.b64encode(hmac.new(string_to_sign.encode("utf-8"), digestmod=hashlib.sha256).digest()).decode()


def dingtalk_sign(secret: str, timestamp_ms: str) -> str:
    """Before URL encoding (aiohttp's request.query has decoded it already)."""
    string_to_sign = f"{timestamp_ms}\n{secret}"
    mac = hmac.new(secret.encode("utf-8"), string_to_sign.encode("utf-8"), digestmod=hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


# ---------------------------------------------------------------- configs and notifications


def receiver(type_: str, url: str | None = None, *, secret: str | None = None, **fields: Any) -> Receiver:
    """A receiver as `load_config` would hand it over, secret resolved."""
    data = {"type": type_, **fields}
    if url is not None:
        data["url"] = url
    if secret is not None and "secret_env" not in data:
        data["secret_env"] = "TEST_RECEIVER_SECRET"
    return Receiver.model_validate(data).with_secrets(secret=secret, url=None)


def alerts(receivers: dict[str, Receiver], **fields: Any) -> Alerts:
    return Alerts(receivers=receivers, **fields)


def notification(**changes: Any) -> Notification:
    base = Notification(
        incident_id=INCIDENT,
        state="firing",
        kind="regression",
        severity="page",
        job="every-5m",
        target="qwen3-8b",
        model="Qwen/Qwen3-8B",
        provider="vllm",
        prompt="short",
        location="fra-dc1",
        since=T0,
        baseline_ms=410.0,
        observed_ms=1234.0,
        ratio=3.01,
        summary="Median TTFT 3.01x its 7-day same-hour baseline for 2 runs.",
        link=LINK,
    )
    return base.with_changes(**changes)


# ---------------------------------------------------------------- incidents in the database


@asynccontextmanager
async def write(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A write transaction that queues behind other SQLite writers (BEGIN IMMEDIATE) instead of failing."""
    async with engine.connect() as connection:
        await connection.execution_options(**{WRITE_OPTION: True})
        async with connection.begin():
            yield connection


async def store_incident(
    engine: AsyncEngine,
    *,
    target: str = "qwen3-8b",
    prompt: str = "short",
    kind: str = "regression",
    severity: str = "page",
    opened_at: datetime = T0,
    incident_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """An open incident (and its series) as the detector stores it."""
    incident_id = incident_id or uuid.uuid4()
    series = table_of(SeriesRow)
    find = sa.select(series.c.id).where(series.c.target == target, series.c.prompt == prompt)
    async with write(engine) as connection:
        series_id = await connection.scalar(find)
        if series_id is None:
            await connection.execute(
                sa.insert(series).values(
                    target=target, provider="vllm", model="Qwen/Qwen3-8B", prompt=prompt, location="fra-dc1"
                )
            )
            series_id = await connection.scalar(find)
        await connection.execute(
            sa.insert(table_of(IncidentRow)).values(
                id=incident_id,
                series_id=series_id,
                kind=kind,
                severity=severity,
                opened_at=opened_at,
                resolved_at=None,
                baseline_ms=410.0,
                observed_ms=1234.0,
                ratio=3.01,
                error=None,
                details={"job": "every-5m"},
                updated_at=opened_at,
            )
        )
    return incident_id


async def resolve_incident(engine: AsyncEngine, incident_id: uuid.UUID, at: datetime) -> None:
    table = table_of(IncidentRow)
    async with write(engine) as connection:
        await connection.execute(
            sa.update(table).where(table.c.id == incident_id).values(resolved_at=at, updated_at=at)
        )


async def outbox_rows(engine: AsyncEngine) -> list[Any]:
    table = table_of(AlertOutboxRow)
    async with engine.connect() as connection:
        return list((await connection.execute(sa.select(table).order_by(table.c.created_at, table.c.receiver))).all())


async def deliveries(engine: AsyncEngine) -> list[Any]:
    table = table_of(AlertDeliveryRow)
    async with engine.connect() as connection:
        return list((await connection.execute(sa.select(table).order_by(table.c.id))).all())
