"""Text a server chooses (a 500 body, the served model) is stored whatever bytes it holds.

A purpose-built HTTP server answers with NUL bytes and lone surrogates; `probe --store` (the real
CLI, the same pipeline as the daemon) stores every sample on SQLite and PostgreSQL, and nothing is
rejected into the spool. (The probe shows a NUL, a control character, as the escape `\x00`; the store
turns what still cannot be kept, the lone surrogates, into U+FFFD.)
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa

from monitor.servertext import TRUNCATED_MARK
from monitor.store.records import SERVER_TEXT_LIMITS, UNSTORABLE_REPLACEMENT
from tests.conftest import run_cli
from tests.support.config import build_config, write_yaml
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)

R = UNSTORABLE_REPLACEMENT
# JSON escapes: the client's JSON parser turns them into a NUL and a lone surrogate.
DIRTY_MODEL_JSON = "a\\u0000b\\ud800c"
BROKEN_BODY = b'upstream \x00 exploded {"model": "x\x00y"}'
LONG_MODEL = "m" * 5000


def _stream(model_json: str) -> bytes:
    chunks = [
        f'{{"id":"c1","object":"chat.completion.chunk","model":"{model_json}","choices":[{{"index":0,'
        f'"delta":{{"content":"{word}"}},"finish_reason":null}}]}}'
        for word in ("hello", " there")
    ]
    return b"".join(f"data: {chunk}\n\n".encode() for chunk in chunks) + b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        if model == "broken":
            self._send(500, "text/plain", BROKEN_BODY)
        elif model == "dirty":
            self._send(200, "text/event-stream", _stream(DIRTY_MODEL_JSON), request_id="req-1")
        elif model == "long":
            self._send(200, "text/event-stream", _stream(LONG_MODEL))
        else:
            self._send(200, "text/event-stream", _stream("clean"))

    def _send(self, status: int, content_type: str, payload: bytes, request_id: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if request_id:
            self.send_header("x-request-id", request_id)
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def hostile_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _config(folder: Path, db_url: str, base_url: str) -> Path:
    data = build_config(
        base_url,
        provider="hostile",
        provider_settings={"timeout_s": {"connect": 2, "first_token": 10, "total": 20}},
        targets={name: name for name in ("clean", "dirty", "broken", "long")},
        database_url=db_url,
        state_dir=folder / "state",
        location="lab",
    )
    return write_yaml(folder / "config.yaml", data)


async def test_nul_bytes_and_lone_surrogates_from_a_server_are_stored_not_rejected(
    backend: Backend, hostile_server: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, backend.url, hostile_server)
    args = ["probe", "--config", str(config), "--store", "--prompt", "short", "-n", "2", "--warmup", "0"]
    args += ["--pause", "0", "-f", "json"]
    for name in ("clean", "dirty", "broken", "long"):
        args += ["-t", name]
    result = await asyncio.to_thread(run_cli, *args)
    assert result.code in (0, 1), str(result)  # 1: some probes failed (the 500s), as they should
    assert "spool" not in result.stdout + result.stderr, str(result)

    engine = backend.engine()
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.text(
                        "SELECT series.target, samples.served_model, samples.http_status, samples.error_message "
                        "FROM samples JOIN runs ON runs.id = samples.run_id JOIN series ON series.id = runs.series_id"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    by_target: dict[str, list[tuple]] = {}
    for target, *values in rows:
        by_target.setdefault(target, []).append(tuple(values))
    # Every sample of every target is stored, the hostile ones included.
    assert {t: len(v) for t, v in by_target.items()} == {"clean": 2, "dirty": 2, "broken": 2, "long": 2}
    assert {served for served, _, _ in by_target["dirty"]} == {f"a\\x00b{R}c"}
    assert {served for served, _, _ in by_target["clean"]} == {"clean"}
    (status, message), *_ = {(status, message) for _, status, message in by_target["broken"]}
    assert status == 500
    assert "upstream \\x00 exploded" in message and "\x00" not in message
    (long_model,) = {served for served, _, _ in by_target["long"]}
    assert len(long_model) == SERVER_TEXT_LIMITS["served_model"] and long_model.endswith(TRUNCATED_MARK)
    spool = tmp_path / "state" / "spool"
    assert not list(spool.rglob("rejected.jsonl"))
