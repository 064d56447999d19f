"""The JSON API and pages over real loopback HTTP, on both databases; auth; /metrics stays open."""

from __future__ import annotations

import base64
import csv
import io
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from monitor.metrics.server import start_metrics_server
from monitor.store.repository import Repository
from monitor.web.api import parse_duration, to_csv, web_routes
from monitor.web.auth import Guard, hash_password, verify_password
from tests.support.ports import free_port
from tests.support.store_fixtures import T0, Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)
NOW = T0 + timedelta(hours=2)


async def _ready() -> tuple[bool, str]:
    return True, "ready"


async def _serve(backend: Backend, guard: Guard | None = None) -> AsyncIterator[str]:
    repository = Repository(backend.engine())
    try:
        for step in range(24):
            await repository.save_runs(make_batch(T0 + timedelta(minutes=5 * step)))
        port = free_port()
        routes = web_routes(repository.engine, guard=guard, now=lambda: NOW)
        runner = await start_metrics_server(CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=routes)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()
    finally:
        await repository.engine.dispose()


@pytest.fixture
async def server(backend: Backend) -> AsyncIterator[str]:
    async for url in _serve(backend):
        yield url


async def test_the_api_serves_every_view_as_json_and_csv(server: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server}/api/v1/series") as response:
            assert response.status == 200, await response.text()
            body = await response.json()
        assert len(body["series"]) == 4 and body["now"] == "2026-03-02T11:00:00Z"
        series_id = body["series"][0]["id"]
        async with http.get(f"{server}/api/v1/series/{series_id}/points?since=6h") as response:
            points = await response.json()
        assert points["resolution"] == "sample" and len(points["points"]) == 24 * 5
        async with http.get(f"{server}/api/v1/series/{series_id}/points?since=6h&format=csv") as response:
            assert response.content_type == "text/csv"
            rows = list(csv.DictReader(io.StringIO(await response.text())))
        assert len(rows) == 120 and float(rows[0]["ttft_p50_ms"]) == points["points"][0]["ttft_p50_ms"]
        async with http.get(f"{server}/api/v1/compare?since=1d&prompt=short") as response:
            compare = await response.json()
        assert {c["prompt"] for c in compare["cells"]} == {"short"} and len(compare["pairs"]) == 1
        async with http.get(f"{server}/api/v1/compare?since=1d&format=csv&table=slopes") as response:
            assert (await response.text()).startswith("target,model,ms_per_1k_tokens")
        async with http.get(f"{server}/api/v1/incidents?format=csv") as response:
            assert response.status == 200


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/api/v1/compare?since=soon", 400, "since='soon' is not a duration"),
        ("/api/v1/series/abc/points", 400, "whole number"),
        ("/api/v1/series/9999/points", 404, "no series with id 9999"),
        ("/api/v1/series?format=xml", 400, "format='xml'"),
        ("/api/v1/compare?start=2026-03-02T09:00:00", 400, "no time zone"),
        # Numbers beyond what the database or datetime hold are bad parameters, not a database failure.
        ("/api/v1/series/99999999999999999999999/points", 400, "series id '99999999999999999999999' is out of range"),
        ("/api/v1/series/" + "9" * 5000 + "/points", 400, "is out of range"),
        ("/api/v1/compare?since=99999999999999999999999999999w", 400, "since='99999999999999999999999999999w' is out"),
        ("/api/v1/compare?end=0001-01-01T00:00:00-23:59", 400, "end='0001-01-01T00:00:00-23:59' is out of range"),
        ("/api/v1/compare?end=0001-01-01T00:00:00%2B23:59", 400, "end='0001-01-01T00:00:00+23:59' is out of range"),
        ("/api/v1/compare?start=9999-12-31T23:59:59-23:59", 400, "start='9999-12-31T23:59:59-23:59' is out of range"),
        # ASCII digits only: Python's int() and float() take `1_0` as 10 and a fullwidth １ as 1.
        ("/api/v1/series/1_0/points", 400, "series id '1_0' must be a whole number"),
        ("/api/v1/series/%EF%BC%91/points", 400, "must be a whole number"),
        ("/api/v1/compare?since=1_0d", 400, "since='1_0d' is not a duration"),
        ("/api/v1/compare?since=%EF%BC%91d", 400, "is not a duration"),
        ("/api/v1/compare?end=2026-03-02T0%EF%BC%99:00:00Z", 400, "is not an ISO 8601 time"),
        ("/api/v1/series/1/points?max_points=1_000", 400, "max_points='1_000' is not a whole number"),
        ("/api/v1/series/1/points?max_points=%EF%BC%91%EF%BC%90%EF%BC%90", 400, "is not a whole number"),
    ],
)
async def test_bad_requests_get_one_clear_error(server: str, path: str, status: int, message: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(server + path) as response:
        assert response.status == status, await response.text()
        assert message in (await response.json())["error"]


async def test_a_database_failure_names_the_problem_never_the_path(tmp_path: Path) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine
    from structlog.testing import capture_logs

    from monitor.store.engine import describe_db_error

    (tmp_path / "ttft.db").write_bytes(b"not a database, " * 512)
    url = f"sqlite+aiosqlite:///{tmp_path}/ttft.db"
    engine = create_async_engine(url)
    port = free_port()
    routes = web_routes(engine, now=lambda: NOW, describe_error=lambda exc: describe_db_error(exc, url))
    runner = await start_metrics_server(CollectorRegistry(), _ready, f"127.0.0.1:{port}", routes=routes)
    try:
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/api/v1/series") as response:
                text = await response.text()
        assert response.status == 503, text
        assert "database unavailable" in text and str(tmp_path) not in text and "ttft.db" not in text
        # Whoever runs the monitor still learns where and why, from the log.
        (failed,) = [entry for entry in logs if entry["event"] == "web_request_failed"]
        assert str(tmp_path) in failed["error"] and failed["path"] == "/api/v1/series"
    finally:
        await runner.cleanup()
        await engine.dispose()


async def test_pages_and_static_files_are_served_with_a_strict_policy(server: str) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/series", "/compare", "/incidents"):
            async with http.get(server + path) as response:
                assert response.status == 200 and response.content_type == "text/html"
                assert "script-src 'self'" in response.headers["Content-Security-Policy"]
                assert "/static/common.js" in await response.text()
        async with http.get(f"{server}/static/uPlot.iife.min.js") as response:
            assert response.status == 200 and response.content_type == "application/javascript"
        async with http.get(f"{server}/static/..%2Fapi.py") as response:
            assert response.status == 404


async def test_a_token_protects_ui_and_api_but_not_metrics(backend: Backend) -> None:
    async for server in _serve(backend, Guard(token="s3cret-token")):
        # unsafe: keep cookies set by an IP address (127.0.0.1), as a browser does.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(f"{server}/api/v1/series") as response:
                assert response.status == 401
            async with http.get(f"{server}/") as response:
                assert response.status == 401 and 'name="token"' in await response.text()
            for path in ("/metrics", "/healthz", "/readyz"):
                async with http.get(server + path) as response:
                    assert response.status == 200
            forged = {"Cookie": "ttft_session=forged", "Authorization": "Bearer wrong"}
            async with http.get(f"{server}/api/v1/series", headers=forged) as response:
                assert response.status == 401
            headers = {"Authorization": "Bearer s3cret-token"}
            async with http.get(f"{server}/api/v1/series", headers=headers) as response:
                assert response.status == 200
            async with http.post(f"{server}/login", data={"token": "wrong"}, allow_redirects=False) as response:
                assert response.status == 401
            async with http.post(f"{server}/login", data={"token": "s3cret-token"}, allow_redirects=False) as response:
                assert response.status == 303
                assert "s3cret-token" not in response.headers["Set-Cookie"]
            async with http.get(f"{server}/api/v1/series") as response:
                assert response.status == 200  # the session cookie


async def test_basic_auth_checks_the_scrypt_hash(backend: Backend) -> None:
    encoded = hash_password("correct horse")
    assert verify_password("correct horse", encoded) and not verify_password("wrong", encoded)
    async for server in _serve(backend, Guard(basic_user="ops", basic_password_hash=encoded)):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server}/") as response:
                assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Basic")
            for password, status in (("wrong", 401), ("correct horse", 200)):
                token = base64.b64encode(f"ops:{password}".encode()).decode()
                async with http.get(f"{server}/", headers={"Authorization": f"Basic {token}"}) as response:
                    assert response.status == status


def test_csv_keeps_nested_values_as_json() -> None:
    text = to_csv([{"a": 1, "b": {"x": 2}}, {"a": None, "c": 'q,"r'}])
    assert text == 'a,b,c\n1,"{""x"": 2}",\n,,"q,""r"\n'


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600), ("7d", 604800), ("15m", 900), ("2w", 1209600)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text).total_seconds() == seconds


def test_notification_links_open_the_series_page_at_the_incident() -> None:
    from monitor.alert.model import series_link

    link = series_link("http://127.0.0.1:9464/series", target="q<8b", prompt="short", location="lab", job="j", at=NOW)
    assert link == (
        "http://127.0.0.1:9464/series?var-target=q%3C8b&var-prompt=short&var-location=lab&var-job=j"
        "&at=2026-03-02T11%3A00%3A00Z"
    )


def test_serve_hashes_a_password_from_stdin() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "monitor", "serve", "--hash-password"],
        input="correct horse\n", capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert verify_password("correct horse", done.stdout.strip()) and "correct horse" not in done.stdout


@pytest.mark.parametrize(
    ("config", "env", "code", "message"),
    [
        (
            "web:\n  token_env: TTFT_WEB_TOKEN_UNSET\n",
            {},
            2,
            "web.token_env names TTFT_WEB_TOKEN_UNSET, which is not set",
        ),
        ('database:\n  url: "postgresql+asyncpg://postgres:pw@127.0.0.1:1/x"\n', {}, 3, "127.0.0.1"),
    ],
)
def test_serve_refuses_in_one_line(tmp_path: Path, config: str, env: dict[str, str], code: int, message: str) -> None:
    from tests.conftest import run_cli

    path = tmp_path / "c.yaml"
    path.write_text(config)
    result = run_cli("serve", "--config", str(path), "--listen", f"127.0.0.1:{free_port()}", env=env)
    assert result.code == code, str(result)
    assert message in result.stderr and "Traceback" not in result.stderr and ":pw@" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- beyond loopback, auth or an explicit yes


def _exposed_config(tmp_path: Path, web: str = "") -> Path:
    path = tmp_path / "exposed.yaml"
    path.write_text(
        f'database:\n  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"\n  state_dir: "{tmp_path}/state"\n'
        f'metrics:\n  listen: "0.0.0.0:{free_port()}"\n{web}'
    )
    return path


@pytest.mark.realtime
def test_run_and_serve_refuse_to_serve_beyond_loopback_without_auth(tmp_path: Path) -> None:
    from tests.conftest import call_cli, cli_result

    config = _exposed_config(tmp_path)
    upgraded = call_cli("db", "upgrade", "--config", str(config))
    assert upgraded.code == 0, str(upgraded)
    for args in (
        ("run", "--config", str(config)),
        ("serve", "--config", str(config), "--listen", f"0.0.0.0:{free_port()}"),
        ("serve", "--config", str(config), "--listen", f"[::]:{free_port()}"),
    ):
        result = cli_result(*args)  # `run` as a child, `serve`'s refusal in-process
        assert result.code == 2, str(result)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"ttft-monitor {args[0]}: ") and "reachable beyond this machine" in line, line
        for key in ("web.token_env", "web.basic_user", "web.basic_password_hash", "web.allow_unauthenticated: true"):
            assert key in line, line
        assert "Traceback" not in result.stdout + result.stderr


def test_run_refuses_an_unprotected_listener_before_it_waits_for_the_database(tmp_path: Path) -> None:
    """The exposure is a config error (exit 2), said at once, not after the database retries (exit 3)."""
    import time

    from tests.conftest import run_cli

    config = tmp_path / "exposed.yaml"
    config.write_text(
        'database:\n  url: "postgresql+asyncpg://postgres@127.0.0.1:9/nowhere"\n  connect_retry_s: 30\n'
        f'  state_dir: "{tmp_path}/state"\nmetrics:\n  listen: "0.0.0.0:{free_port()}"\n'
    )
    started = time.monotonic()
    result = run_cli("run", "--config", str(config))
    assert result.code == 2, str(result)
    assert "web.allow_unauthenticated: true" in result.stderr
    assert time.monotonic() - started < 20


def test_serve_beyond_loopback_starts_when_told_so_and_warns(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.conftest import ROOT

    config = _exposed_config(tmp_path, "web:\n  allow_unauthenticated: true\n")
    port = free_port()
    upgraded = subprocess.run(
        [sys.executable, "-m", "monitor", "db", "upgrade", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    server = subprocess.Popen(
        [sys.executable, "-m", "monitor", "serve", "--config", str(config), "--listen", f"0.0.0.0:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert server.stderr is not None
        first, second = server.stderr.readline(), server.stderr.readline()
        assert "warning: the status pages on 0.0.0.0" in first and "web.allow_unauthenticated" in first, first
        assert "status pages at" in second, second
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.status == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
        if server.stderr is not None:
            server.stderr.close()


@pytest.mark.parametrize(
    ("listen", "web", "warned"),
    [
        ("0.0.0.0:9464", "", True),
        ("[::]:9464", "", True),
        ("0.0.0.0:9464", "web:\n  token_env: TTFT_WEB_TOKEN\n", False),
        ("0.0.0.0:9464", "web:\n  allow_unauthenticated: true\n", False),
        ("0.0.0.0:9464", "web:\n  enabled: false\n", False),
        ("127.0.0.1:9464", "", False),
        ("[::1]:9464", "", False),
    ],
)
def test_check_config_warns_that_run_would_refuse(tmp_path: Path, listen: str, web: str, warned: bool) -> None:
    from monitor.config.check import check_config

    path = tmp_path / "c.yaml"
    path.write_text(f'metrics:\n  listen: "{listen}"\n{web}')
    code, text = check_config(path, environ={})
    assert code == 0, text
    assert ("warning: `run` will refuse to start" in text) is warned, text
    assert "web: " in text


def test_the_token_may_come_from_a_file(tmp_path: Path) -> None:
    from monitor.config.models import Config
    from monitor.web.serve import WebConfigError, guard_from_config

    config = Config.model_validate({"web": {"token_env": "TTFT_WEB_TOKEN", "session_hours": 2}})
    (tmp_path / "token").write_text("from-a-file\n")
    guard = guard_from_config(config, {"TTFT_WEB_TOKEN_FILE": str(tmp_path / "token")})
    assert guard.token == "from-a-file" and guard.session_lifetime_s == 7200
    with pytest.raises(WebConfigError, match="TTFT_WEB_TOKEN is empty"):
        guard_from_config(config, {"TTFT_WEB_TOKEN": " "})
