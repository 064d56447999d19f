"""The shared transport against a real HTTP server on loopback: what counts as sent, transient, permanent."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from monitor.alert.model import HttpRequest
from monitor.alert.transport import Transport, classify_status, parse_retry_after
from tests.support.alert_fixtures import Loopback, Reply

pytest_plugins = ("tests.support.alert_fixtures",)


def post(url: str, body: bytes = b"{}") -> HttpRequest:
    return HttpRequest("POST", url, {"Content-Type": "application/json"}, body)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "ok"),
        (202, "ok"),
        (204, "ok"),
        (400, "permanent"),
        (401, "permanent"),
        (403, "permanent"),
        (404, "permanent"),
        (410, "permanent"),
        (413, "permanent"),
        (408, "transient"),
        (429, "transient"),
        (500, "transient"),
        (502, "transient"),
        (503, "transient"),
    ],
)
def test_statuses_are_classified(status: int, outcome: str) -> None:
    assert classify_status(status) == outcome


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("", None), ("7", 7.0), ("0", 0.0), ("-3", 0.0), ("soon", None), ("99999", 3600.0)],
)
def test_retry_after_in_seconds(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90.0


async def test_a_2xx_is_ok_and_carries_the_answer(loopback: Loopback) -> None:
    loopback.script("/hook", Reply(202, '{"status":"success","message":"Event processed"}'))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/hook"), b'{"a":1}'), timeout_s=5)
    assert (result.outcome, result.status) == ("ok", 202)
    assert result.detail == '{"status":"success","message":"Event processed"}'
    assert result.duration_ms is not None and result.duration_ms > 0
    assert loopback.at("/hook")[0].body == b'{"a":1}'


async def test_a_5xx_is_transient(loopback: Loopback) -> None:
    loopback.script("/hook", Reply(503, "upstream overloaded"))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/hook")), timeout_s=5)
    assert (result.outcome, result.status, result.detail) == ("transient", 503, "upstream overloaded")
    assert result.describe() == "HTTP 503 (transient): upstream overloaded"


async def test_a_429_is_transient_with_the_servers_retry_after(loopback: Loopback) -> None:
    loopback.script("/hook", Reply(429, "slow down", {"Retry-After": "42"}))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/hook")), timeout_s=5)
    assert (result.outcome, result.retry_after_s) == ("transient", 42.0)


async def test_a_400_is_permanent_and_the_answer_is_kept_without_secrets(loopback: Loopback) -> None:
    loopback.script("/hook", Reply(400, '{"message":"Invalid routing key R0UTINGKEY-abcdef","errors":["x"]}'))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/hook")), timeout_s=5, secrets=["R0UTINGKEY-abcdef"])
    assert (result.outcome, result.status) == ("permanent", 400)
    assert result.detail == '{"message":"Invalid routing key [REDACTED]","errors":["x"]}'


async def test_tokens_in_the_url_never_reach_the_answer(loopback: Loopback) -> None:
    loopback.script("/robot/send", Reply(404, "no robot for access_token=0123456789abcdef0123"))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/robot/send?access_token=0123456789abcdef0123")), timeout_s=5)
    assert "0123456789abcdef0123" not in result.detail


async def test_a_long_answer_is_cut_to_an_excerpt(loopback: Loopback) -> None:
    loopback.script("/hook", Reply(400, "x" * 10_000))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/hook")), timeout_s=5)
    assert len(result.detail) == 300


async def test_a_redirect_is_permanent_and_not_followed(loopback: Loopback) -> None:
    loopback.script("/old", Reply(301, "", {"Location": loopback.url("/new")}))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/old")), timeout_s=5)
    assert (result.outcome, result.status) == ("permanent", 301)
    assert "redirects" in result.detail
    assert loopback.at("/new") == []


async def test_a_timeout_is_transient(loopback: Loopback) -> None:
    loopback.script("/slow", Reply(200, "late", delay_s=3))
    async with Transport() as transport:
        result = await transport.send(post(loopback.url("/slow")), timeout_s=0.3)
    assert (result.outcome, result.status) == ("transient", None)
    assert result.detail == "no answer within 0.3 s (timeout)"
    assert result.duration_ms is not None and result.duration_ms < 2000


async def test_a_refused_connection_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Transport() as transport:
        result = await transport.send(post(f"http://127.0.0.1:{port}/hook"), timeout_s=2)
    assert result.outcome == "transient"
    assert result.status is None and "ClientConnectorError" in result.detail


async def test_an_unusable_url_is_permanent() -> None:
    async with Transport() as transport:
        result = await transport.send(post("http://[not-a-host/hook"), timeout_s=2)
    assert result.outcome == "permanent"
