"""`/metrics`, `/healthz` and `/readyz` (and the UI's routes) on a small aiohttp runner that cleans up
after itself, with the limits a listener open to untrusted clients needs.

Every listener the monitor serves goes through `start_metrics_server`, so each gets the same limits:
a bound on how long a connection may sit without sending a whole request (a half-sent request is
closed after `idle_timeout_s`, as an idle keep-alive connection is), a cap on open connections (past
it a connection gets one `503` and is closed, so a flood of sockets cannot take the descriptors the
probes and the spool need), caps on the request line, headers and body, the handler cancelled when
its client goes away, a cap on UI and API requests in progress, and the same security headers on
every answer (aiohttp's own 404 and 405 pages included) with no version banner.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from monitor.metrics.exposition import Rendering, render_parts

ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# What the listener says it is: no aiohttp or Python version for a scanner to match against.
SERVER_NAME = "ttft-monitor"
# Served without the UI's cap: a probe of the monitor's health must get through while the UI is busy.
OPERATIONS_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """Bounds on what one client can make the listener hold. The defaults fit a status page and a
    Prometheus scrape; none is a config key yet (docs/failure-modes.md, "The monitor's own listener")."""

    # A connection that has not sent a whole request head this long after connecting (or after its
    # last answer) is closed: aiohttp's keep-alive timer, which also runs while a head is half-sent.
    idle_timeout_s: float = 10.0
    max_connections: int = 256
    max_line_bytes: int = 8190
    max_field_bytes: int = 8190
    max_headers: int = 64
    max_body_bytes: int = 64 * 1024
    # UI and API requests handled at once, and how many may wait for a turn; the rest get 503.
    max_requests_in_progress: int = 4
    max_requests_waiting: int = 32
    wait_for_turn_s: float = 10.0


def _security_headers(response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers["Server"] = SERVER_NAME


async def _on_prepare(_request: web.Request, response: web.StreamResponse) -> None:
    _security_headers(response)


class RequestGate:
    """At most `in_progress` requests handled at once and `waiting` waiting; the rest are told to retry.

    The UI's queries share the database and the CPU with the probes' process; a burst of fifty heavy
    views is served a few at a time instead of all at once, and beyond the queue refused quickly."""

    def __init__(self, *, in_progress: int, waiting: int, wait_s: float) -> None:
        self._slots = asyncio.Semaphore(in_progress)
        self._waiting = 0
        self._max_waiting = waiting
        self._wait_s = wait_s
        self.refused = 0

    async def handle(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._slots.locked() and self._waiting >= self._max_waiting:
            self.refused += 1
            return _busy()
        self._waiting += 1
        try:
            async with asyncio.timeout(self._wait_s):
                await self._slots.acquire()
        except TimeoutError:
            self.refused += 1
            return _busy()
        finally:
            self._waiting -= 1
        try:
            return await handler(request)
        finally:
            self._slots.release()


def _busy() -> web.Response:
    return web.json_response(
        {"error": "the monitor is answering other requests; retry in a few seconds"},
        status=503,
        headers={"Retry-After": "2"},
    )


# /metrics is written to the client this many bytes at a time.
METRICS_WRITE_BYTES = 256 * 1024


class _RenderedMetrics:
    """The registry's exposition, rendered in a worker thread (a registry of thousands of series takes
    seconds, and the listener must keep answering /healthz meanwhile), one rendering at a time, and
    reused while younger than `reuse_factor` times what it took to render.

    A scrape costs the process CPU time the probes share; scraped back to back, an unbounded registry
    would render all the time. This way rendering takes at most a third of a core, and a scrape sees
    values at most twice a rendering old (Prometheus scrapes every 15-60 s).

    It is kept gzip-compressed (Prometheus asks for gzip): a thirtieth of the text (4-5 MB at 500 probe
    series) while a scrape is written, and on the wire; a client that does not accept gzip gets the text,
    decompressed a piece at a time in a worker thread."""

    def __init__(self, registry: CollectorRegistry, *, reuse_factor: float = 2.0, min_reuse_s: float = 0.0) -> None:
        self._registry = registry
        self._rendering: asyncio.Task[Rendering] | None = None
        self._body: Rendering | None = None
        self._fresh_until = 0.0
        self._reuse_factor = reuse_factor
        self._min_reuse_s = min_reuse_s

    async def body(self) -> Rendering:
        if self._body is not None and time.monotonic() < self._fresh_until:
            return self._body
        if self._rendering is None:
            self._body = None  # the last rendering is not kept while the next one is made
            self._rendering = asyncio.get_running_loop().create_task(self._render())
            self._rendering.add_done_callback(self._rendered)
        # Shielded: a scrape cancelled because its client went away leaves the rendering to the next one, which
        # waits for it; cancelled with it, the worker thread rendered on and the next scrape started another.
        return await asyncio.shield(self._rendering)

    async def _render(self) -> Rendering:
        started = time.monotonic()
        body = await asyncio.to_thread(render_parts, self._registry, gzip=True)
        took = time.monotonic() - started
        reuse_s = max(self._min_reuse_s, self._reuse_factor * took)
        self._body = body
        self._fresh_until = time.monotonic() + reuse_s
        # Past its reuse it is never served again: not kept until the next scrape.
        asyncio.get_running_loop().call_later(reuse_s, self._forget, body)
        return body

    def _rendered(self, task: asyncio.Task[Rendering]) -> None:
        self._rendering = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every scrape that waited for it may have gone

    def _forget(self, body: Rendering) -> None:
        if self._body is body:
            self._body = None


async def _pieces(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip: `gzip` (or `x-gzip`) with a weight above 0, or, when
    neither is named, `*` with one. A named coding's weight overrides `*` (RFC 9110, 12.5.3), in either
    order: `*, gzip;q=0` refuses gzip, `*;q=0, gzip` takes it."""
    named: float | None = None
    anything: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        coding = coding.lower()
        if coding not in ("gzip", "x-gzip", "*"):
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                with contextlib.suppress(ValueError):  # a weight that is no number: as if not given
                    quality = float(value.strip())
        if coding == "*":
            anything = quality if anything is None else max(anything, quality)
        else:
            named = quality if named is None else max(named, quality)
    weight = named if named is not None else anything
    return weight is not None and weight > 0


async def _text_pieces(body: Rendering) -> AsyncIterator[bytes]:
    """A compressed rendering's text, METRICS_WRITE_BYTES at most at a time, each decompressed in a worker
    thread. A compressed piece is a thirtieth of its text: decompressed whole, each of a 500-series body's
    pieces was 1.1 MB of text, held with what the transport buffered of the last one (2.5 MB more resident
    at the peak of a scrape by a client that does not take gzip)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    for piece in body.pieces:
        data = piece
        while True:
            text = await asyncio.to_thread(decompressor.decompress, data, METRICS_WRITE_BYTES)
            data = decompressor.unconsumed_tail
            if text:
                yield text
            # A full-length answer may leave output to come with no input left (a long match, say).
            if not data and len(text) < METRICS_WRITE_BYTES:
                break
    if rest := decompressor.flush():
        yield rest


GATE: web.AppKey[RequestGate] = web.AppKey("gate", RequestGate)


def build_app(
    registry: CollectorRegistry,
    readiness: ReadinessCheck,
    routes: Sequence[web.RouteDef] = (),
    *,
    limits: ListenerLimits | None = None,
) -> web.Application:
    """`routes` are served beside these three on the same listener (the web UI, monitor.web.api)."""
    limits = limits or ListenerLimits()
    gate = RequestGate(
        in_progress=limits.max_requests_in_progress, waiting=limits.max_requests_waiting, wait_s=limits.wait_for_turn_s
    )
    rendered = _RenderedMetrics(registry)

    @web.middleware
    async def gated(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in OPERATIONS_PATHS:
            return await handler(request)
        return await gate.handle(request, handler)

    async def metrics(request: web.Request) -> web.StreamResponse:
        body = await rendered.body()
        # Every Accept-Encoding field: a client may send the list in several (RFC 9110, 5.3).
        compressed = accepts_gzip(",".join(request.headers.getall("Accept-Encoding", ())))
        headers = {"Content-Type": CONTENT_TYPE_LATEST, "Vary": "Accept-Encoding"}
        if compressed:
            headers["Content-Encoding"] = "gzip"
        response = web.StreamResponse(headers=headers)
        response.content_length = sum(map(len, body.pieces)) if compressed else body.text_bytes
        await response.prepare(request)
        if request.method == "HEAD":  # the headers only: a body after them would be read as the next answer
            await response.write_eof()
            return response
        # A piece at a time, each written when the client has taken the last: the whole body handed to the
        # socket at once is copied into its transport's buffer once the kernel's is full.
        pieces = _pieces(body.pieces) if compressed else _text_pieces(body)
        async for piece in pieces:
            view = memoryview(piece)
            for start in range(0, len(piece), METRICS_WRITE_BYTES):
                await response.write(view[start : start + METRICS_WRITE_BYTES])
        await response.write_eof()
        return response

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        ready, reason = await readiness()
        return web.Response(text=f"{reason}\n", status=200 if ready else 503)

    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[gated])
    app.on_response_prepare.append(_on_prepare)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.add_routes(routes)
    app[GATE] = gate
    return app


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: " + SERVER_NAME.encode() + b"\r\nRetry-After: 2\r\n"
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)


class _Refused(asyncio.Protocol):
    """A connection past the cap: one 503 and closed, so its descriptor is free at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSAL)
        transport.close()


class CappedSite(web.TCPSite):
    """A TCP site that holds at most `max_connections` connections open."""

    __slots__ = ("_last_log", "_max_connections", "refused")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int) -> None:
        super().__init__(runner, host, port)
        self._max_connections = max_connections
        self.refused = 0
        self._last_log = 0.0

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert isinstance(server, web.Server)

        def protocol() -> asyncio.Protocol:
            if len(server.connections) >= self._max_connections:
                self.refused += 1
                now = time.monotonic()
                if now - self._last_log >= 60:  # one line a minute, not one per connection
                    self._last_log = now
                    structlog.get_logger().warning(
                        "listener_connections_refused", cap=self._max_connections, refused_total=self.refused
                    )
                return _Refused()
            return server()

        self._server = await loop.create_server(protocol, self._host, self._port, backlog=self._backlog)
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]


async def start_metrics_server(
    registry: CollectorRegistry,
    readiness: ReadinessCheck,
    listen: str,
    *,
    routes: Sequence[web.RouteDef] = (),
    limits: ListenerLimits | None = None,
) -> web.AppRunner:
    limits = limits or ListenerLimits()
    runner = web.AppRunner(
        build_app(registry, readiness, routes, limits=limits),
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,  # a client that went away stops its query, not after it
        keepalive_timeout=limits.idle_timeout_s,
        max_line_size=limits.max_line_bytes,
        max_field_size=limits.max_field_bytes,
        max_headers=limits.max_headers,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    host, port = split_listen(listen)
    site = CappedSite(runner, host, port, max_connections=limits.max_connections)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
