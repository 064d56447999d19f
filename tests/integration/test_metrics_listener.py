"""`/metrics` over loopback HTTP: gzip to a client that asks for it (Prometheus does), the text to one that
does not, both with a Content-Length that matches what arrives and the same text as generate_latest."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time
from collections.abc import Iterator

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from monitor.metrics.definitions import Metrics, MonitorRegistry
from monitor.metrics.server import start_metrics_server
from monitor.probe.result import Sample
from tests.support.ports import free_port


async def _ready() -> tuple[bool, str]:
    return True, "ready"


def _metrics(targets: int) -> Metrics:
    metrics = Metrics(location="lab")
    for t in range(targets):
        for round_ in range(3):
            sample = Sample(
                target=f"t{t}", model="m", api="openai-chat", prompt="short", round=round_, ttft_ms=100.0 + t + round_
            )
            metrics.observe_sample(sample, provider="p", probe_job="j")
    return metrics


def _raw_get(port: int, accept_encoding: str | None) -> tuple[dict[str, str], bytes]:
    """One GET /metrics over a plain socket (no client library deciding the encoding): headers, body."""
    return _raw_get_fields(port, [f"Accept-Encoding: {accept_encoding}"] if accept_encoding is not None else [])


async def test_metrics_are_gzip_to_a_client_that_asks_and_text_to_one_that_does_not() -> None:
    metrics = _metrics(300)
    port = free_port()
    runner = await start_metrics_server(metrics.registry, _ready, f"127.0.0.1:{port}")
    try:
        text = generate_latest(metrics.registry)
        headers, body = await asyncio.to_thread(_raw_get, port, "gzip")
        assert headers["content-encoding"] == "gzip"
        assert int(headers["content-length"]) == len(body) < len(text) / 5
        assert gzip.decompress(body) == text
        for accept in (None, "identity", "gzip;q=0"):
            headers, body = await asyncio.to_thread(_raw_get, port, accept)
            assert "content-encoding" not in headers
            assert int(headers["content-length"]) == len(body) == len(text)
            assert body == text
        # aiohttp's client asks for gzip and decompresses it, as Prometheus does.
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert await response.read() == text
    finally:
        await runner.cleanup()


async def test_a_client_that_reads_nothing_does_not_hold_up_the_next_scrape() -> None:
    # The text is decompressed a piece at a time for a client that does not take gzip: one that never reads
    # holds its own response, not the rendering or the listener.
    metrics = _metrics(300)
    port = free_port()
    runner = await start_metrics_server(metrics.registry, _ready, f"127.0.0.1:{port}")
    stuck = socket.create_connection(("127.0.0.1", port))
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.2)
        _headers, body = await asyncio.wait_for(asyncio.to_thread(_raw_get, port, None), timeout=10)
        assert body == generate_latest(metrics.registry)
    finally:
        stuck.close()
        await runner.cleanup()


async def test_a_head_request_gets_the_headers_and_leaves_the_connection_usable() -> None:
    # HEAD /metrics wrote the body after the headers: on a kept-alive connection the next answer read
    # started in the middle of it ("Bad status line").
    metrics = _metrics(50)
    port = free_port()
    runner = await start_metrics_server(metrics.registry, _ready, f"127.0.0.1:{port}")
    try:
        connector = aiohttp.TCPConnector(limit=1)  # one connection: the GETs reuse the HEAD's
        async with aiohttp.ClientSession(connector=connector) as session:
            for accept in ("gzip", "identity"):
                headers = {"Accept-Encoding": accept}
                async with session.head(f"http://127.0.0.1:{port}/metrics", headers=headers) as response:
                    assert response.status == 200 and int(response.headers["Content-Length"]) > 0
                    assert await response.read() == b""
                async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response:
                    assert await response.read() == generate_latest(metrics.registry)
    finally:
        await runner.cleanup()


def _raw_get_fields(port: int, fields: list[str]) -> tuple[dict[str, str], bytes]:
    """One GET /metrics with these header fields, sent as they are (several Accept-Encoding fields too)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        extra = "".join(f"{field}\r\n" for field in fields)
        sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    return {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}, body


async def test_gzip_goes_only_to_a_client_whose_accept_encoding_weighs_it_above_zero() -> None:
    # The first of gzip, x-gzip and `*` decided alone: `*, gzip;q=0` (gzip refused by name) got gzip, and
    # `*;q=0, gzip` did not; `q=0.` (a zero weight) was read as acceptance, and only the first of several
    # Accept-Encoding fields was read.
    metrics = _metrics(20)
    port = free_port()
    runner = await start_metrics_server(metrics.registry, _ready, f"127.0.0.1:{port}")
    try:
        text = generate_latest(metrics.registry)
        cases = {
            ("Accept-Encoding: *, gzip;q=0",): False,
            ("Accept-Encoding: *;q=1, GZIP; Q=0.000",): False,
            ("Accept-Encoding: gzip;q=0.",): False,
            ("Accept-Encoding: *", "Accept-Encoding: gzip;q=0"): False,
            ("Accept-Encoding: *;q=0, gzip",): True,
            ("Accept-Encoding: identity;q=0, x-gzip;q=0.5",): True,
            ("Accept-Encoding: identity", "Accept-Encoding: gzip"): True,
            ("Accept-Encoding: br;q=garbage, *;q=0",): False,
        }
        for fields, gzipped in cases.items():
            headers, body = await asyncio.to_thread(_raw_get_fields, port, list(fields))
            assert ("content-encoding" in headers) is gzipped, fields
            assert int(headers["content-length"]) == len(body), fields
            assert (gzip.decompress(body) if gzipped else body) == text, fields
    finally:
        await runner.cleanup()


class _SlowCollector:
    """A collector that takes `seconds` to collect, and counts how many collections run at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0
        self.most = 0
        self.calls = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.seconds)
        finally:
            with self._lock:
                self.running -= 1
        yield GaugeMetricFamily("slow_thing", "Takes a while.", value=1)


async def test_scrapers_that_hang_up_during_a_rendering_do_not_start_more_renderings() -> None:
    # The scrape whose request started a rendering was cancelled when its client went away (the listener's
    # handler_cancellation), which released the one-at-a-time lock while the worker thread went on
    # rendering: each client that asked and hung up started one more, five at once from five of them.
    registry = MonitorRegistry()
    slow = _SlowCollector(0.5)
    registry.register(slow)
    port = free_port()
    runner = await start_metrics_server(registry, _ready, f"127.0.0.1:{port}")
    try:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.05)
        headers, body = await asyncio.to_thread(_raw_get, port, None)  # one that waits gets a whole rendering
        assert b"slow_thing 1.0" in body
        assert int(headers["content-length"]) == len(body)
    finally:
        await runner.cleanup()
    assert slow.most == 1, f"{slow.most} renderings at once"
