"""A server's text reaches no terminal or log line raw or unbounded.

A purpose-built server sends ANSI escapes, BEL, NUL and C1 controls, in a 200 KB error event, a 500
body and a served model name. `ttft-monitor probe` (the real CLI) prints no control character in any
format and no line anywhere near that long; `once` (the daemon's pipeline) logs none either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from monitor.logging import LOG_TEXT_CAP
from tests.conftest import run_cli
from tests.support.store_fixtures import Backend
from tests.support.threaded_server import ThreadedServer

pytest_plugins = ("tests.support.store_fixtures",)

NASTY = "\x1b[31mred\x1b[0m \x1b]0;owned\x07 bell\x07 nul\x00 cr\r csi\x9b del\x7f "
HUGE = 200_000
# Anything a terminal acts on; the newline that ends a line is the one allowed.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# The longest line any output may have: a sample's every field on one CSV line, the error capped.
LONGEST_LINE = 6000


def _chunk(model: str, content: str) -> str:
    chunk = {"model": model, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n"


class HostileServer(ThreadedServer):
    ROUTE = "/{mode}/{tail:.*}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        mode = request.match_info["mode"]
        if mode == "body500":
            return web.Response(status=500, text=NASTY + "B" * 5000, content_type="text/plain")
        if mode == "event":
            error = {"error": {"message": NASTY + "E" * HUGE}}
            body = _chunk(NASTY, "hi") + f"data: {json.dumps(error)}\n\n"
            return web.Response(body=body.encode(), content_type="text/event-stream")
        model = NASTY + "M" * HUGE
        body = _chunk(model, "hi") + _chunk(model, " there") + "data: [DONE]\n\n"
        return web.Response(body=body.encode(), content_type="text/event-stream")


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


def _check(output: str) -> None:
    found = sorted({f"{ord(c):#04x}" for c in CONTROL.findall(output)})
    assert found == [], f"raw control characters {found} in {output[:2000]!r}"
    longest = max(map(len, output.splitlines()), default=0)
    assert longest < LONGEST_LINE, f"a line of {longest} characters: {output[:2000]!r}"


@pytest.mark.parametrize("output", ["table", "json", "csv"])
@pytest.mark.parametrize("mode", ["body500", "event", "model"])
def test_probe_prints_no_control_character_and_no_huge_line(hostile: HostileServer, mode: str, output: str) -> None:
    url = hostile.url(f"/{mode}/v1")
    args = ["probe", "--url", url, "--model", "m", "--rounds", "1", "--warmup", "0", "--format", output]
    result = run_cli(*args, timeout=60)
    assert result.code in (0, 1), result
    _check(result.stdout)
    _check(result.stderr)
    shown = result.stdout + result.stderr
    if mode != "model":
        assert result.code == 1 and "\\x1b[31mred" in shown, result  # the message is there, escaped
    elif output != "table":
        assert result.code == 0 and "\\x1b[31mred" in shown, result  # the served model, escaped
    if output == "json":
        (sample,) = json.loads(result.stdout)["samples"]
        assert all(len(str(value)) <= 2000 for value in sample.values()), sample


def _config(tmp_path: Path, port: int, database_url: str) -> Path:
    modes = ("body500", "event", "model")
    data = {
        "location": "test",
        "database": {"url": database_url, "state_dir": str(tmp_path / "state"), "connect_retry_s": 5},
        "providers": {
            mode: {
                "base_url": f"http://127.0.0.1:{port}/{mode}/v1",
                "api": "openai-chat",
                "timeout_s": {"connect": 2, "first_token": 5, "total": 5},
            }
            for mode in modes
        },
        "targets": {mode: {"provider": mode, "model": "m"} for mode in modes},
        "prompts": {"short": {"tokens": 128}},
        "jobs": [
            {
                "name": "hostile",
                "schedule": "0 0 1 1 *",
                "targets": list(modes),
                "prompts": ["short"],
                "rounds": 1,
                "warmup": 0,
                "pause_s": 0,
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


async def test_once_logs_no_control_character_and_no_huge_line(
    tmp_path: Path, hostile: HostileServer, backend: Backend
) -> None:
    result = run_cli("once", "--config", str(_config(tmp_path, hostile.port, backend.url)), timeout=60)
    assert result.code == 0, result
    _check(result.stdout)
    _check(result.stderr)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    samples = [event for event in events if event["event"] == "probe_sample"]
    assert len(samples) == 3, events
    for sample in samples:
        for value in sample.values():
            assert CONTROL.search(str(value)) is None and len(str(value)) <= LOG_TEXT_CAP, sample


def test_a_console_log_line_carries_no_escape_sequence() -> None:
    import io
    import logging

    import structlog

    from monitor.logging import configure_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    configure_logging(stream=stream, json_output=False)  # the console renderer, as at a terminal
    try:
        # A library's message (through the stdlib bridge) is the event itself, printed as it is.
        logging.getLogger("aiohttp.client").warning("peer said %s", NASTY)
        structlog.get_logger().warning("server_said", detail=NASTY)
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    text = stream.getvalue()
    assert CONTROL.search(text) is None, repr(text)
    assert "peer said \\x1b[31mred" in text, repr(text)
