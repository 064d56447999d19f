"""The SSE parser and the API rules over streams captured from a genuine vLLM (tests/streams/vllm/).

The files are the response bodies byte for byte, captured by tests/streams/capture_vllm.py from
vLLM 0.32.0 (CPU build) serving the tiny model of tests/support/vllm_tiny_model.py; requests.json holds
the requests. These tests need no vLLM: they pin what the monitor makes of a real server's stream.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from monitor.probe.apis import FLAVORS, EventInfo, EventKind
from monitor.probe.sse import SSEEvent, SSEParser
from tests.conftest import run_cli

STREAMS = Path(__file__).resolve().parent.parent / "streams" / "vllm"
REQUESTS = json.loads((STREAMS / "requests.json").read_text())["streams"]
# What counts as a generated token: every kind but these (a tool-call kind, where there is one, counts).
NOT_TOKENS = {EventKind.OTHER, EventKind.DONE, EventKind.ERROR}


@dataclass(frozen=True)
class Capture:
    name: str
    api: str
    first_event: str  # what the stream starts with
    first_token_at: int  # index of the event that carries the first generated token
    token_events: int  # events that carry generated text
    completion_tokens: int  # max_tokens: this model never stops early
    prompt_tokens: int
    cached_tokens: int
    last_event: str  # what ends the stream

    @property
    def id(self) -> str:
        return self.name


CAPTURES = [
    Capture("chat", "openai-chat", "role-only chunk", 1, 8, 8, 346, 0, "[DONE]"),
    # The same request sent twice: the second finds whole KV blocks of its prompt in the prefix cache.
    Capture("chat-cached", "openai-chat", "role-only chunk", 1, 8, 8, 347, 256, "[DONE]"),
    Capture("completions", "openai-completions", "the first text chunk", 0, 8, 8, 336, 0, "[DONE]"),
    # created, in_progress, output_item.added and content_part.added come before the first delta.
    # vLLM hands a lagging stream the tokens generated meanwhile in one delta: 8 tokens in 5 events.
    Capture("responses", "openai-responses", "response.created", 4, 5, 8, 345, 0, "response.completed"),
    Capture("responses-cached", "openai-responses", "response.created", 4, 8, 8, 344, 256, "response.completed"),
]


def events_of(data: bytes, chunk: int) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for start in range(0, len(data), chunk):
        events += parser.feed(data[start : start + chunk])
    return events + parser.close()


def classify(capture: Capture) -> tuple[list[SSEEvent], list[EventInfo]]:
    if capture.api not in FLAVORS:
        pytest.skip(f"{capture.api} is not in monitor.probe.apis.FLAVORS yet (it comes with the wire branch)")
    events = events_of((STREAMS / f"{capture.name}.sse").read_bytes(), 1 << 20)
    return events, [FLAVORS[capture.api].classify(event) for event in events]


def text_of(api: str, event: SSEEvent) -> str:
    """The generated text an event carries, read straight from its JSON (independent of apis.py)."""
    obj: dict[str, Any] = json.loads(event.data)
    if api == "openai-chat":
        return obj["choices"][0]["delta"].get("content") or "" if obj.get("choices") else ""
    if api == "openai-completions":
        return obj["choices"][0].get("text") or "" if obj.get("choices") else ""
    return obj.get("delta") or "" if obj.get("type") == "response.output_text.delta" else ""


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.id)
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_every_chunking_of_a_real_stream_gives_the_same_events(capture: Capture, chunk: int) -> None:
    data = (STREAMS / f"{capture.name}.sse").read_bytes()
    assert events_of(data, chunk) == events_of(data, len(data))


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.id)
def test_the_first_token_is_the_first_event_with_generated_text(capture: Capture) -> None:
    events, infos = classify(capture)
    token_at = [i for i, info in enumerate(infos) if info.kind not in NOT_TOKENS]
    with_text = [i for i, event in enumerate(events) if event.data != "[DONE]" and text_of(capture.api, event)]
    assert token_at == with_text
    assert token_at[0] == capture.first_token_at, [e.data[:100] for e in events[: capture.first_token_at + 1]]
    before = infos[: capture.first_token_at]
    assert all(info.kind is EventKind.OTHER for info in before), f"{capture.first_event}: {before}"
    assert len(token_at) == capture.token_events
    assert all(infos[i].kind is EventKind.ANSWER for i in token_at)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.id)
def test_usage_and_the_served_model_come_out_of_a_real_stream(capture: Capture) -> None:
    _, infos = classify(capture)
    # As the probe client does: the last value of each field seen in the stream counts.
    usage: dict[str, Any] = {}
    for info in infos:
        for name in ("served_model", "prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(info, name)
            if value is not None:
                usage[name] = value
    body = REQUESTS[capture.name]["body"]
    assert (
        usage["completion_tokens"] == capture.completion_tokens == body.get("max_tokens", body.get("max_output_tokens"))
    )
    assert usage["prompt_tokens"] == capture.prompt_tokens
    assert usage["cached_tokens"] == capture.cached_tokens
    assert usage["served_model"] == "tiny"


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.id)
def test_a_real_stream_ends_as_its_api_says(capture: Capture) -> None:
    events, infos = classify(capture)
    assert not [info for info in infos if info.kind is EventKind.ERROR]
    last = events[-1].data if events[-1].data == "[DONE]" else json.loads(events[-1].data)["type"]
    assert last == capture.last_event
    assert infos[-1].kind is EventKind.DONE
    assert [info.kind for info in infos].count(EventKind.DONE) == 1


class _ReplayHandler(BaseHTTPRequestHandler):
    """Answers each API's path with its captured vLLM stream, one chunk per event, as vLLM sends it."""

    protocol_version = "HTTP/1.1"
    streams: ClassVar[dict[str, str]] = {
        "/v1/chat/completions": "chat",
        "/v1/completions": "completions",
        "/v1/responses": "responses",
    }

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        data = (STREAMS / f"{self.streams[self.path]}.sse").read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in data.split(b"\n\n")[:-1]:
            chunk = event + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def replay_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ReplayHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("capture", [c for c in CAPTURES if "cached" not in c.name], ids=lambda c: c.id)
def test_the_probe_measures_a_replayed_vllm_stream_end_to_end(replay_server: str, capture: Capture) -> None:
    if capture.api not in FLAVORS:
        pytest.skip(f"{capture.api} is not in monitor.probe.apis.FLAVORS yet (it comes with the wire branch)")
    args = ("--url", replay_server, "--api", capture.api, "--model", "tiny", "--format", "json")
    result = run_cli("probe", *args, "--rounds", "1", "--warmup", "0", "--prompt-tokens", "128")
    assert result.code == 0, str(result)
    [sample] = json.loads(result.stdout)["samples"]
    assert sample["error"] is None, sample
    assert 0 < sample["ttft_ms"] == sample["ttfa_ms"] <= sample["total_ms"], sample
    assert (sample["prompt_tokens"], sample["completion_tokens"], sample["cached_tokens"]) == (
        capture.prompt_tokens,
        capture.completion_tokens,
        capture.cached_tokens,
    )
