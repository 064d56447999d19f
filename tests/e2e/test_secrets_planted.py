"""A key planted in every place a config can carry one (a query parameter, URL userinfo, a header, the
API key) and echoed back by a purpose-built server in every form it travels in (as given, URL-encoded,
base64, Basic `user:key`, inside the request URL, in a stream's model name and request id) appears
nowhere: not in the logs, the database (SQLite and PostgreSQL), or any command's output."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from aiohttp import web

from monitor.config.loader import load_config
from monitor.probe.client import ProbeClient
from monitor.probe.plan import Endpoints
from monitor.probe.proxy import ProxyEnvironment
from monitor.probe.result import Sample
from tests.conftest import run_cli
from tests.support.secrets import KEY, USER, database_text, forms_of, leaks
from tests.support.store_fixtures import Backend
from tests.support.threaded_server import ThreadedServer

pytest_plugins = ("tests.support.store_fixtures",)

# '!' and '$' change when URL-encoded; long enough to be masked, shaped like no known key format.
KEY_ENV = "PLANTED_KEY"


# ---------------------------------------------------------------- the echoing server


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"


class EchoServer(ThreadedServer):
    """Answers every request by echoing the planted key in the form named by the first path segment."""

    ROUTE = "/{mode}/{tail:.*}"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) as received

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests.append((request.path, dict(request.query)))
        mode = request.match_info["mode"]
        basic = base64.b64encode(f"{USER}:{KEY}".encode()).decode()
        messages = {
            "plain": f"Incorrect API key provided: {KEY}",
            "urlencoded": f"invalid key={quote(KEY, safe='')}",
            "base64": f"invalid credential {base64.b64encode(KEY.encode()).decode()}",
            "basic": f"rejected Authorization: Basic {basic}",
            "echo": f"you sent {request.raw_path} auth={request.headers.get('Authorization')} "
            f"api-key={request.headers.get('api-key')}",
        }
        if mode in messages:
            return web.json_response({"error": {"message": messages[mode], "type": "invalid_request"}}, status=401)
        if mode == "text500":
            return web.Response(status=500, text=f"upstream said: key {KEY} / {basic} is bad")
        if mode == "stream":
            chunk = {"model": KEY, "choices": [{"index": 0, "delta": {"content": "hi"}}]}
            body = _sse(chunk, {"error": {"message": f"quota for {KEY} exhausted"}})
            return web.Response(body=body, content_type="text/event-stream", headers={"x-request-id": f"req-{KEY}"})
        return web.json_response({"error": {"message": "unknown mode"}}, status=404)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    server.start()
    yield server
    server.stop()


# ---------------------------------------------------------------- a config planting the key everywhere

MODES = ("plain", "urlencoded", "base64", "basic", "echo", "text500", "stream")
# How each provider carries the key: base_url template and extra provider keys.
PLANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "query": ("http://127.0.0.1:{port}/{mode}/v1?key=${{" + KEY_ENV + "}}", {}),
    "userinfo": ("http://" + USER + ":${{" + KEY_ENV + "}}@127.0.0.1:{port}/{mode}/v1", {}),
    "header": ("http://127.0.0.1:{port}/{mode}/v1", {"headers": {"api-key": "${" + KEY_ENV + "}"}}),
    "apikey": ("http://127.0.0.1:{port}/{mode}/v1", {"api_key_env": KEY_ENV}),
}


def planted_config(tmp_path: Path, port: int, database_url: str) -> Path:
    providers: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for plant, (template, extra) in PLANTS.items():
        for mode in MODES:
            name = f"{plant}-{mode}"
            providers[name] = {
                "base_url": template.format(port=port, mode=mode),
                "api": "openai-chat",
                "timeout_s": {"connect": 2, "first_token": 5, "total": 5},
                **extra,
            }
            targets[name] = {"provider": name, "model": "m"}
    # Nothing listens on port 9: the connection error names the URL, credentials and all.
    providers["closed"] = {
        "base_url": "http://" + USER + ":${" + KEY_ENV + "}@127.0.0.1:9/v1?key=${" + KEY_ENV + "}",
        "api": "openai-chat",
        "timeout_s": {"connect": 2, "first_token": 5, "total": 5},
    }
    targets["closed"] = {"provider": "closed", "model": "m"}
    data = {
        "location": "test",
        "database": {"url": database_url, "state_dir": str(tmp_path / "state"), "connect_retry_s": 5},
        "providers": providers,
        "targets": targets,
        "prompts": {"short": {"tokens": 128}},
        "jobs": [
            {
                "name": "planted",
                "schedule": "0 0 1 1 *",
                "targets": list(targets),
                "prompts": ["short"],
                "rounds": 1,
                "warmup": 0,
                "pause_s": 0,
            }
        ],
        "detection": {"availability": {"consecutive_failures": 1, "error_rate": 0.5, "window_runs": 1}},
        "alerts": {"receivers": {"console": {"type": "log"}}, "routes": [{"receivers": ["console"]}]},
        # On a machine loaded by the rest of the suite the monitor's own lateness can pass the 5 ms bound:
        # then every sample is `disturbed`, the run is no evidence and no availability incident opens (seen
        # once in CI). This test is about secrets, not timing.
        "probe_self_delay_bound_ms": 1000,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ---------------------------------------------------------------- the tests


@pytest.mark.realtime
async def test_a_planted_key_appears_in_no_log_row_or_output(
    tmp_path: Path, echo: EchoServer, backend: Backend
) -> None:
    path = planted_config(tmp_path, echo.port, backend.url)
    env = {KEY_ENV: KEY}

    checked = run_cli("check-config", "--config", str(path), env=env, timeout=30)
    assert checked.code == 0, checked
    assert "auth: env PLANTED_KEY" in checked.stdout
    assert leaks(str(checked)) == [], checked

    once = run_cli("once", "--config", str(path), env=env, timeout=60)
    assert once.code == 1, once  # every probe failed, as planned
    assert "error" in once.stdout
    assert leaks(str(once)) == [], once

    stored = await database_text(backend.url)
    # The server's messages were stored, only without the key.
    assert "Incorrect API key provided: [REDACTED]" in stored
    assert "rejected Authorization: Basic [REDACTED]" in stored
    assert "invalid credential [REDACTED]" in stored
    assert "cannot connect to http://" in stored
    assert leaks(stored) == [], [line for line in stored.splitlines() if leaks(line)][:5]

    for command in (["incidents"], ["incidents", "--format", "json"]):
        listed = run_cli(*command, "--config", str(path), env=env, timeout=30)
        assert listed.code == 0, listed
        assert leaks(str(listed)) == [], listed
    assert "availability" in listed.stdout

    for output in ("table", "json", "csv"):
        probed = run_cli(
            "probe", "--config", str(path), "--rounds", "1", "--warmup", "0", "--format", output, env=env, timeout=60
        )
        assert probed.code == 1, probed
        assert leaks(str(probed)) == [], probed


def test_a_key_in_an_ad_hoc_url_stays_out_of_probe_output(echo: EchoServer) -> None:
    for mode in ("echo", "basic", "plain"):
        url = f"http://{USER}:{quote(KEY, safe='')}@127.0.0.1:{echo.port}/{mode}/v1?key={quote(KEY, safe='')}"
        for output in ("table", "json", "csv"):
            probed = run_cli(
                "probe", "--url", url, "--model", "m", "--rounds", "1", "--warmup", "0", "--format", output, timeout=30
            )
            assert probed.code == 1, probed
            assert "HTTP 401" in str(probed), probed
            assert leaks(str(probed)) == [], probed


async def test_the_api_path_goes_before_the_query_string_which_is_kept(tmp_path: Path, echo: EchoServer) -> None:
    path = planted_config(tmp_path, echo.port, "sqlite+aiosqlite:///unused.db")
    config = load_config(path, environ={KEY_ENV: KEY})
    echo.requests.clear()
    target = Endpoints(config, proxies=ProxyEnvironment()).target("query-plain")
    assert target.endpoint.url == f"http://127.0.0.1:{echo.port}/plain/v1/chat/completions?key={KEY}"
    async with ProbeClient() as client:
        sample = Sample(target="query-plain", model="m", api="openai-chat", prompt="short", round=0)
        await client.probe(target.endpoint, target.params, "hello", sample)
    assert echo.requests == [("/plain/v1/chat/completions", {"key": KEY})]
    assert sample.http_status == 401
    assert sample.error_message is not None and KEY not in sample.error_message


def test_the_log_redactor_masks_every_form_of_a_configured_secret(tmp_path: Path) -> None:
    import io

    import structlog

    from monitor.app import secrets_of
    from monitor.logging import configure_logging

    config = load_config(planted_config(tmp_path, 1, "sqlite+aiosqlite:///unused.db"), environ={KEY_ENV: KEY})
    stream = io.StringIO()
    configure_logging(stream=stream, json_output=True, secrets=secrets_of(config))
    try:
        for form in sorted(forms_of(KEY)):
            structlog.get_logger().warning("server_said", detail=f"the server echoed <{form}> back")
    finally:
        structlog.reset_defaults()
    text = stream.getvalue()
    assert text.count("the server echoed <[REDACTED]> back") == len(forms_of(KEY)), text
    assert leaks(text) == [], text
