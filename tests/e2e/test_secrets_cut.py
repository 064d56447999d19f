"""A secret cut by a text cap leaks nothing, not even its first characters.

A purpose-built server echoes the key at the place where the monitor caps server text (300 characters):
a 401 whose JSON message and whose plain-text body hold padding and then the key, and a stream whose
`x-request-id` is padding and then the key. `once` (the real CLI, the daemon's pipeline) stores them
on SQLite and PostgreSQL; neither its log lines, the database, nor the API's JSON and CSV hold any
six characters of the key (a cap applied before redaction left `gwtok_...` minus its last characters).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from monitor.metrics.server import start_metrics_server
from monitor.store.engine import create_engine
from monitor.web.api import web_routes
from tests.conftest import run_cli
from tests.support.ports import free_port
from tests.support.store_fixtures import Backend
from tests.support.threaded_server import ThreadedServer

pytest_plugins = ("tests.support.store_fixtures",)

TOKEN = "gwtok_7Hq2Lx9Vb3Nz5Rk8Tm4Wp6Yc1Ds0xyzABCD"
TOKEN_ENV = "CUT_TOKEN"
PREFIX = "Incorrect API key provided: "
# Where each echo starts: the key begins before the 300-character cap and ends after it.
JSON_PAD = 300 - len(PREFIX) - 12
TEXT_PAD = 300 - len("denied ") - 10
ID_PAD = 300 - 25


def leaked(text: str) -> list[str]:
    """Every six-character piece of the key found in `text`."""
    return sorted({TOKEN[i : i + 6] for i in range(len(TOKEN) - 5) if TOKEN[i : i + 6] in text})


class CutServer(ThreadedServer):
    ROUTE = "/{mode}/{tail:.*}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        mode = request.match_info["mode"]
        if mode == "json401":
            message = PREFIX + "p" * JSON_PAD + TOKEN
            return web.json_response({"error": {"message": message, "type": "invalid_request"}}, status=401)
        if mode == "text401":
            return web.Response(status=401, text="denied " + "p" * TEXT_PAD + TOKEN)
        if mode == "badevent":  # quoted in the message, 80 characters of it
            body = f"data: {'p' * 70}{TOKEN}\n\n".encode()
            return web.Response(body=body, content_type="text/event-stream")
        if mode == "encoding":  # quoted in the message, 40 characters of it
            headers = {"Content-Encoding": "p" * 30 + TOKEN}
            return web.Response(body=b"data: [DONE]\n\n", content_type="text/event-stream", headers=headers)
        chunk = {"model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        return web.Response(body=body, content_type="text/event-stream", headers={"x-request-id": "r" * ID_PAD + TOKEN})


@pytest.fixture(scope="module")
def cut_server() -> Iterator[CutServer]:
    with CutServer() as server:
        yield server


def _config(tmp_path: Path, port: int, database_url: str) -> Path:
    modes = ("json401", "text401", "reqid", "badevent", "encoding")
    providers = {
        mode: {
            "base_url": f"http://127.0.0.1:{port}/{mode}/v1",
            "api": "openai-chat",
            "api_key_env": TOKEN_ENV,
            "timeout_s": {"connect": 2, "first_token": 5, "total": 5},
        }
        for mode in modes
    }
    data: dict[str, Any] = {
        "location": "test",
        "database": {"url": database_url, "state_dir": str(tmp_path / "state"), "connect_retry_s": 5},
        "providers": providers,
        "targets": {mode: {"provider": mode, "model": "m"} for mode in modes},
        "prompts": {"short": {"tokens": 128}},
        "jobs": [
            {
                "name": "cut",
                "schedule": "0 0 1 1 *",
                "targets": list(modes),
                "prompts": ["short"],
                "rounds": 2,
                "warmup": 0,
                "pause_s": 0,
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


async def _samples(url: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            query = "SELECT request_id, error_message FROM samples"
            return [tuple(row) for row in (await connection.execute(sa.text(query))).all()]
    finally:
        await engine.dispose()


async def _api(url: str) -> AsyncIterator[str]:
    engine = create_engine(url)
    port = free_port()
    runner = await start_metrics_server(CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=web_routes(engine))
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        await runner.cleanup()
        await engine.dispose()


async def _ready() -> tuple[bool, str]:
    return True, "ready"


async def test_a_key_straddling_the_cap_leaves_no_prefix_in_logs_rows_or_the_api(
    tmp_path: Path, cut_server: CutServer, backend: Backend
) -> None:
    path = _config(tmp_path, cut_server.port, backend.url)
    once = run_cli("once", "--config", str(path), env={TOKEN_ENV: TOKEN}, timeout=60)
    assert once.code == 0, once  # some probes succeeded (the request-id stream)
    assert "r" * 50 in once.stdout and "HTTP 401" in once.stdout, once  # the log lines carry both echoes
    assert leaked(str(once)) == [], [line for line in str(once).splitlines() if leaked(line)]

    rows = await _samples(backend.url)
    assert len(rows) == 10, rows
    assert leaked(repr(rows)) == [], rows
    messages = {message for _, message in rows if message}
    assert any(PREFIX + "p" * 20 in m and "[REDACTED]" in m for m in messages), messages
    assert any("denied ppp" in m and "[REDACTED]" in m for m in messages), messages
    assert any("event data is not JSON: 'ppp" in m and "[REDACTED]" in m for m in messages), messages
    assert any("Content-Encoding: ppp" in m and "[REDACTED]" in m for m in messages), messages

    async for api in _api(backend.url):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{api}/series") as response:
                assert response.status == 200, await response.text()
                series = (await response.json())["series"]
            assert len(series) == 5
            for item in series:
                for fmt in ("json", "csv"):
                    async with http.get(f"{api}/series/{item['id']}/points?since=1d&format={fmt}") as response:
                        text = await response.text()
                        assert response.status == 200, text
                    assert leaked(text) == [], text
                    assert "r" * 50 in text or "ppp" in text, text


@pytest.mark.realtime
def test_the_log_redactor_caps_after_redacting_so_no_prefix_of_a_secret_is_logged() -> None:
    import io

    import structlog

    from monitor.logging import LOG_TEXT_CAP, configure_logging, error_text

    stream = io.StringIO()
    configure_logging(stream=stream, json_output=True, secrets=[TOKEN])
    try:
        # An exception whose text puts the key across the 300-character cap of an `error` field,
        # and a text far longer than any log line may be.
        structlog.get_logger().warning("failed", error=error_text(RuntimeError("p" * 280 + TOKEN)))
        structlog.get_logger().warning("long", detail="p" * (LOG_TEXT_CAP - 10) + TOKEN + "q" * 100_000)
    finally:
        structlog.reset_defaults()
    failed, long = (json.loads(line) for line in stream.getvalue().splitlines())
    assert len(failed["error"]) <= 300 and failed["error"].startswith("RuntimeError: ppp"), failed
    assert len(long["detail"]) == LOG_TEXT_CAP and long["detail"].endswith("\u2026"), long
    assert leaked(stream.getvalue()) == [], stream.getvalue()
