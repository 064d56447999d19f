"""A small real OTLP/HTTP receiver for tests: an aiohttp server on loopback, in a thread of its own,
decoding each request with the official `opentelemetry-proto` messages."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

MESSAGES: dict[str, type[Message]] = {
    "metrics": ExportMetricsServiceRequest,
    "traces": ExportTraceServiceRequest,
    "logs": ExportLogsServiceRequest,
}


REQUEST_ID_PREFIX = "req-standin-"
_CHUNK = '{"id":"c1","object":"chat.completion.chunk","model":"stand-in","choices":[{"index":0,%s}]%s}'
CHAT_EVENTS = (
    _CHUNK % ('"delta":{"role":"assistant"}', ""),
    _CHUNK % ('"delta":{"content":"Hi"}', ""),
    _CHUNK % ('"delta":{"content":" there"}', ""),
    _CHUNK
    % ('"delta":{},"finish_reason":"stop"', ',"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}'),
    "[DONE]",
)


@dataclass
class Received:
    signal: str
    headers: dict[str, str]
    message: Any


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Headers of each request to the stand-in chat endpoint (`{url}/v1/chat/completions`).
    chat_headers: list[dict[str, str]] = field(default_factory=list)

    def of(self, signal: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.signal == signal]

    def wait_for(self, signal: str, *, timeout: float = 20) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.of(signal)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no OTLP {signal} request within {timeout} s")


def attributes(items: Any) -> dict[str, Any]:
    """OTLP KeyValue list -> plain dict."""
    out: dict[str, Any] = {}
    for kv in items:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind else None
    return out


def metrics_by_name(received: list[Received]) -> dict[str, list[Any]]:
    """Every exported metric, by name, in the order received (cumulative: the last is the total)."""
    out: dict[str, list[Any]] = {}
    for request in received:
        for resource in request.message.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).append(metric)
    return out


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """Answers every export with 200 and the empty response message, keeping what it decoded."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.Response:
        signal = request.match_info["signal"]
        message = MESSAGES[signal]()
        message.ParseFromString(await request.read())
        receiver: Receiver = holder["receiver"]
        with receiver.lock:
            receiver.received.append(Received(signal, dict(request.headers), message))
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def chat(request: web.Request) -> web.StreamResponse:
        """A minimal OpenAI-style stream, so a test sees the headers a probe sends (`traceparent`)."""
        await request.read()
        receiver: Receiver = holder["receiver"]
        with receiver.lock:
            receiver.chat_headers.append(dict(request.headers))
        # The server's own request id, which a probe's span carries (`ttft_monitor.request_id`).
        number = len(receiver.chat_headers)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "x-request-id": f"{REQUEST_ID_PREFIX}{number}"}
        )
        await response.prepare(request)
        for event in CHAT_EVENTS:
            await response.write(f"data: {event}\n\n".encode())
        await response.write_eof()
        return response

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/{signal}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        holder["receiver"] = Receiver(url=f"http://127.0.0.1:{port}")
        holder["stop"] = stop = asyncio.Event()
        ready.set()
        await stop.wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the OTLP receiver did not start"
    try:
        yield holder["receiver"]
    finally:
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(10)
        loop.close()
