"""The headers a server says about itself (request id, openai-processing-ms, x-ratelimit-*, retry-after,
server-timing) are stored per sample; a hostile server can put the configured key in any of them.

A purpose-built server answers a good stream with the API key echoed back in every one of those
headers, in each form a key travels in (as given, URL-encoded, base64, Basic `apikey:key`). The real
daemon probes it on a schedule; the database (SQLite and PostgreSQL), the daemon's log and its
`/metrics`, and `probe`'s outputs hold no form of the key, and the headers without it are kept.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web

from tests.conftest import run_cli
from tests.support.daemon import http_get, start_daemon, stop_daemon, upgrade, wait_ready
from tests.support.ports import free_port
from tests.support.secrets import KEY, database_text, leaks
from tests.support.store_fixtures import Backend
from tests.support.threaded_server import ThreadedServer

pytest_plugins = ("tests.support.store_fixtures",)

KEY_ENV = "HEADER_PLANTED_KEY"
FORMS = {
    "plain": KEY,
    "urlencoded": quote(KEY, safe=""),
    "base64": base64.b64encode(KEY.encode()).decode(),
    "basic": "Basic " + base64.b64encode(f"apikey:{KEY}".encode()).decode(),
}
STREAM = (
    b'data: {"model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    b'data: {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 10, "completion_tokens": 1}}\n\n'
    b"data: [DONE]\n\n"
)


def echoed_headers(form: str) -> dict[str, str]:
    """Every self-describing header, each carrying the key in `form` beside text worth keeping."""
    value = FORMS[form]
    return {
        "x-request-id": f"req-{value}-end",
        "openai-processing-ms": value,
        "x-ratelimit-remaining-requests": value,
        "x-ratelimit-remaining-tokens": value,
        "retry-after": f"{value} 7",
        "server-timing": f'upstream;desc="{value}";dur=12.5',
    }


class HeaderEcho(ThreadedServer):
    """Streams a good answer; the first path segment names the form the key comes back in."""

    ROUTE = "/{form}/{tail:.*}"

    def base_url(self, form: str) -> str:
        return self.url(f"/{form}/v1")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        form = request.match_info["form"]
        if form not in FORMS:
            return web.json_response({"error": {"message": "unknown form"}}, status=404)
        return web.Response(body=STREAM, content_type="text/event-stream", headers=echoed_headers(form))


@pytest.fixture(scope="module")
def header_echo() -> Iterator[HeaderEcho]:
    server = HeaderEcho()
    server.start()
    yield server
    server.stop()


def config_text(server: HeaderEcho, folder: Path, database_url: str) -> str:
    providers = "".join(
        f"""
  {form}:
    base_url: "{server.base_url(form)}"
    api: openai-chat
    api_key_env: {KEY_ENV}
    timeout_s: {{connect: 2, first_token: 5, total: 5}}"""
        for form in FORMS
    )
    targets = "".join(f"\n  {form}: {{provider: {form}, model: m, params: {{max_tokens: 4}}}}" for form in FORMS)
    return f"""
location: test
shutdown_grace_s: 10
database:
  url: "{database_url}"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:{providers}
targets:{targets}
prompts:
  short: {{tokens: 128}}
jobs:
  - name: tick
    schedule: "*/2 * * * * *"
    targets: [{", ".join(FORMS)}]
    prompts: [short]
    rounds: 1
    warmup: 0
    pause_s: 0
"""


async def test_a_key_echoed_in_self_describing_headers_is_stored_and_logged_nowhere(
    tmp_path: Path, header_echo: HeaderEcho, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(header_echo, tmp_path, backend.url))
    monkeypatch.setenv(KEY_ENV, KEY)
    await asyncio.to_thread(upgrade, config)
    daemon = await asyncio.to_thread(start_daemon, config, tmp_path)
    try:
        await asyncio.to_thread(wait_ready, daemon)
        finished = await asyncio.to_thread(daemon.wait_for, "job_finished")
        _, metrics = await asyncio.to_thread(http_get, daemon.metrics_url + "/metrics")
    finally:
        assert await asyncio.to_thread(stop_daemon, daemon) == 0
    assert finished[0]["ok"] == len(FORMS), finished  # good streams: the headers were all read
    assert "ttft" in metrics
    assert leaks(metrics) == [], [line for line in metrics.splitlines() if leaks(line)][:5]
    logs = daemon.log_path.read_text()
    assert '"request_id": "req-[REDACTED]-end"' in logs
    assert leaks(logs) == [], [line for line in logs.splitlines() if leaks(line)][:5]

    stored = await database_text(backend.url)
    assert leaks(stored) == [], [line for line in stored.splitlines() if leaks(line)][:5]
    # What was around the key is kept: the server's text minus the secret.
    assert "req-[REDACTED]-end" in stored
    assert "[REDACTED] 7" in stored
    assert 'upstream;desc="[REDACTED]";dur=12.5' in stored


@pytest.mark.parametrize("output", ["json", "csv", "table"])
def test_probe_output_carries_no_key_from_the_headers(header_echo: HeaderEcho, output: str) -> None:
    for form in FORMS:
        probed = run_cli(
            *("probe", "--url", header_echo.base_url(form), "--model", "m", "--api-key-env", KEY_ENV),
            *("--rounds", "1", "--warmup", "0", "--max-tokens", "4", "--format", output),
            env={KEY_ENV: KEY},
            timeout=30,
        )
        assert probed.code == 0, probed
        assert leaks(str(probed)) == [], probed
        if output == "json":
            sample = json.loads(probed.stdout)["samples"][0]
            masked = "Basic [REDACTED]" if form == "basic" else "[REDACTED]"
            assert sample["server_timing"] == f'upstream;desc="{masked}";dur=12.5', sample
            assert sample["retry_after"] == f"{masked} 7", sample
            # A base64 run that holds the key is masked whole, here with the `-end` that joins it.
            assert sample["request_id"].startswith(f"req-{masked}"), sample
            # A key where a number belongs is no number: nothing is stored.
            assert sample["server_processing_ms"] is None, sample
            assert sample["ratelimit_remaining_requests"] is None, sample
