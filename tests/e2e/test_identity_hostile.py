"""Which model answered, attacked by a hostile server on loopback: what the server says it is (its
`model`, its `system_fingerprint`), its usage counts and its canary's answers are the server's to
choose, any JSON type, any count. The real pipeline probes, stores and detects: the run is stored and
what the monitor sends stays what it configured."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiohttp import web
from structlog.testing import capture_logs

from monitor.schedule.pipeline import JobOutcome, execute
from monitor.store.models import AnnotationRow, RunRow, SampleRow
from tests.support.pipeline import job_pipeline
from tests.support.secrets import KEY
from tests.support.threaded_server import ThreadedServer

KEY_ENV = "HOSTILE_IDENTITY_KEY"


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class HostileServer(ThreadedServer):
    """An OpenAI chat server whose `model`, `system_fingerprint` and canary answer the test sets between runs.

    A canary request is the one carrying `seed`. `canary` is one of: `ok` (answers `canary_text`), `500`,
    `close` (drops the connection), `malformed` (an SSE event that is not JSON), `hang`."""

    SHUTDOWN_TIMEOUT_S = 1.0  # a hung canary's handler is cut at teardown

    def __init__(self) -> None:
        super().__init__()
        self.model: Any = "m"
        self.fingerprint: Any = "fp_a"
        self.canary = "ok"
        self.canary_text = "ready"
        self.canary_prompts: list[str] = []
        self.prompt_tokens: int | None = None  # reported for every prompt, whatever its length; None: about right
        self.prompt_chars: list[int] = []
        self.usage: dict[str, Any] = {}  # overrides of the usage object's counts
        self.reasons = 0  # > 0: completion tokens are this plus a few more the longer the prompt
        self.canary_started = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "seed" in body:
            self.canary_prompts.append(body["messages"][0]["content"])
            return await self._canary(request)
        chunk = {"model": self.model, "system_fingerprint": self.fingerprint}
        events = [{**chunk, "choices": [{"index": 0, "delta": {"content": word}}]} for word in ("hello", " there")]
        content = body["messages"][0]["content"]
        self.prompt_chars.append(len(content))
        prompt_tokens = len(content) // 4 if self.prompt_tokens is None else self.prompt_tokens
        completion = 2 if not self.reasons else self.reasons + len(content) // 100
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, **self.usage}
        events.append({**chunk, "choices": [], "usage": usage})
        return web.Response(body=_sse(*events), content_type="text/event-stream")

    async def _canary(self, request: web.Request) -> web.StreamResponse:
        if self.canary == "500":
            return web.Response(status=500, text=f"canary exploded for key {KEY}")
        if self.canary == "close":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if self.canary == "malformed":
            return web.Response(body=b"data: {not json\n\n", content_type="text/event-stream")
        if self.canary == "hang":
            self._loop.call_soon_threadsafe(self.canary_started.set)
            await asyncio.sleep(30)
        event = {"model": "m", "choices": [{"index": 0, "delta": {"content": self.canary_text}}]}
        return web.Response(body=_sse(event), content_type="text/event-stream")


def write_config(folder: Path, port: int, *, canary: str = "{}", prompts: str = "[short]") -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  hostile:
    base_url: "http://127.0.0.1:{port}/v1"
    api: openai-chat
    api_key_env: {KEY_ENV}
    max_concurrency: 1
    timeout_s: {{connect: 2, first_token: 5, total: 5}}
targets:
  t: {{provider: hostile, model: m, params: {{max_tokens: 2}}, canary: {canary}}}
prompts:
  short: {{tokens: 128}}
  long: {{tokens: 512}}
jobs:
  - name: every-5m
    schedule: "*/5 * * * *"
    targets: [t]
    prompts: {prompts}
    rounds: 2
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 6
  trailing_runs: 12
alerts:
  receivers:
    console: {{type: log}}
  routes:
    - receivers: [console]
      severities: [page, ticket, info]
"""
    )
    return path


@pytest.fixture
def server() -> Any:
    with HostileServer() as running:
        yield running


async def _runs(path: Path, steps: list[Any]) -> dict[str, Any]:
    """Execute one run per step (each step a callable that sets the server up first); what was stored."""
    outcomes: list[JobOutcome | BaseException] = []
    async with job_pipeline(path) as pipeline:
        for step in steps:
            step()
            try:
                outcomes.append(await execute(pipeline.context, job="every-5m", plan=pipeline.plan))
            except Exception as exc:  # what broke is the finding
                outcomes.append(exc)
            await pipeline.dispatcher.dispatch_due()
        async with pipeline.store.engine.connect() as connection:
            runs = (await connection.execute(sa.select(RunRow.canary))).scalars().all()
            samples = (await connection.execute(sa.select(SampleRow.served_model, SampleRow.fingerprint))).all()
            marks = (await connection.execute(sa.select(AnnotationRow.text))).scalars().all()
    return {"outcomes": outcomes, "runs": runs, "samples": samples, "marks": marks, "url": pipeline.config.database.url}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", [123, {"name": "m"}, ["m"], True], ids=["number", "object", "list", "bool"])
async def test_a_served_model_that_is_not_text_keeps_the_run(
    tmp_path: Path, server: HostileServer, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    path = write_config(tmp_path, server.port)

    def hostile() -> None:
        server.model = model

    seen = await _runs(path, [hostile])
    assert all(isinstance(o, JobOutcome) for o in seen["outcomes"]), [
        o for o in seen["outcomes"] if not isinstance(o, JobOutcome)
    ]
    assert len(seen["samples"]) == 2 and {s.served_model for s in seen["samples"]} == {None}, seen["samples"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reported", [10, 1])
async def test_a_server_that_reports_the_same_few_prompt_tokens_does_not_grow_the_prompt_without_bound(
    tmp_path: Path, server: HostileServer, reported: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway whose usage says 10 prompt tokens for every prompt: the calibration must not take it at
    its word run after run (128 tokens of text, x12.8 each run, is a megabyte by the fifth)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    server.prompt_tokens = reported
    path = write_config(tmp_path, server.port)
    seen = await _runs(path, [lambda: None] * 8)
    assert all(isinstance(o, JobOutcome) for o in seen["outcomes"]), [
        o for o in seen["outcomes"] if not isinstance(o, JobOutcome)
    ]
    # 128 tokens is some 540 characters of English; a few times that at most, however wrong the counts.
    assert max(server.prompt_chars) <= 128 * 16, server.prompt_chars


@pytest.mark.timeout(120)
async def test_an_alias_moved_with_its_fingerprint_is_one_change_not_two(
    tmp_path: Path, server: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI moves `gpt-4o` to new weights: the served model and the fingerprint change in the same run.
    The name counts at once and the fingerprint once confirmed: a run later, that was a second change
    (a second marker and notice, and the new epoch reset again)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    path = write_config(tmp_path, server.port)

    def before() -> None:
        server.model, server.fingerprint = "gpt-4o-2024-08-06", "fp_a"

    def after() -> None:
        server.model, server.fingerprint = "gpt-4o-2024-11-20", "fp_b"

    seen = await _runs(path, [before] * 7 + [after] * 4)
    assert seen["marks"] == [
        "model behind m changed: served model gpt-4o-2024-08-06 -> gpt-4o-2024-11-20, fingerprint fp_a -> fp_b; "
        "a new baseline starts here"
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "count",
    ["12", {"n": 12}, [12], -5, 2.5, True, 1e300],
    ids=["text", "object", "list", "neg", "frac", "bool", "huge"],
)
@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
async def test_usage_counts_that_are_not_counts_keep_the_run(
    tmp_path: Path, server: HostileServer, field: str, count: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    path = write_config(tmp_path, server.port)

    def normal() -> None:
        server.usage = {}

    def hostile() -> None:
        server.usage = {field: count}

    with capture_logs() as logged:
        seen = await _runs(path, [normal, hostile, hostile, normal])
    assert all(isinstance(o, JobOutcome) for o in seen["outcomes"]), [
        o for o in seen["outcomes"] if not isinstance(o, JobOutcome)
    ]
    assert len(seen["samples"]) == 8
    failures = [e for e in logged if e.get("log_level") in ("error", "critical") or "exc_info" in e]
    assert failures == [], failures


@pytest.mark.timeout(120)
async def test_a_model_that_starts_reasoning_is_one_marker_though_each_prompt_reasons_its_own_length(
    tmp_path: Path, server: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thinking runs longer for a longer prompt: the short prompt's series jumps 2 -> 405, the long one's
    2 -> 421. It is one change of the target: one marker (and one notice), not one per prompt."""
    monkeypatch.setenv(KEY_ENV, KEY)
    path = write_config(tmp_path, server.port, prompts="[short, long]")

    def answers() -> None:
        server.reasons = 0

    def reasons() -> None:
        server.reasons = 400

    seen = await _runs(path, [answers, answers, reasons, reasons])
    assert len(seen["marks"]) == 1, seen["marks"]
    # No reasoning reported, none estimated: the marker says nothing of it ("reasoning 0 -> 0").
    assert re.fullmatch(r"output tokens per probe of m jumped 2 -> 4\d\d", seen["marks"][0]), seen["marks"]
