"""The aiohttp internals the probe client leans on, checked by what they do on the installed aiohttp.

The client stamps arrivals inside aiohttp's connection protocol and splits TCP from TLS inside its
connector (monitor/probe/aiohttp_hooks.py explains each hook where it is used). These are private parts,
so pyproject pins the aiohttp range this suite runs on; this file fails loudly, naming the hook,
when an allowed aiohttp moves one of them, instead of letting the client fall back to a less exact
clock unnoticed. A loopback server writes a body in chunks with pauses, and the timed client must
hold one arrival stamp per chunk, in order, each taken after the server wrote it and before it
wrote the next (the arrival, not the later read).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler

from monitor import kernel_clock
from monitor.probe.aiohttp_hooks import (
    StampingProtocol,
    Stamps,
    TimedConnector,
    current_stamps,
    stamping_protocol,
    trace_config,
)

CHUNKS = (b"data: one\n\n", b"data: two, a little longer\n\n", b"data: three\n\n", b"data: [DONE]\n\n")
PAUSE_S = 0.15  # between writes: each chunk reaches the client on its own


class ChunkServer:
    """Writes CHUNKS with a pause before each; `written` holds the client clock's time just before each write."""

    def __init__(self) -> None:
        self.written: list[int] = []

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in CHUNKS:
            await asyncio.sleep(PAUSE_S)
            self.written.append(time.perf_counter_ns())
            await response.write(chunk)
        await response.write_eof()
        return response

    async def whole(self, _request: web.Request) -> web.Response:
        return web.Response(body=b"".join(CHUNKS))


@pytest.fixture
async def server() -> AsyncIterator[tuple[ChunkServer, str]]:
    chunks = ChunkServer()
    app = web.Application()
    app.router.add_get("/chunked", chunks.chunked)
    app.router.add_get("/whole", chunks.whole)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield chunks, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def timed_session(*, kernel_stamps: bool) -> aiohttp.ClientSession:
    """A session built as the probe client builds its own (monitor/probe/client.py), on a fresh connection."""
    connector = TimedConnector(kernel_stamps=kernel_stamps, force_close=True, enable_cleanup_closed=False)
    return aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()], auto_decompress=False)


@pytest.fixture(autouse=True)
def _aiohttp_in_the_pinned_range() -> None:
    major, minor = (int(part) for part in aiohttp.__version__.split(".")[:2])
    assert (major, minor) == (3, 14), (
        f"aiohttp {aiohttp.__version__} is outside the range this suite was written for (3.14.x); "
        "check every hook in monitor/probe/aiohttp_hooks.py, then widen the pin in pyproject.toml"
    )


@pytest.mark.parametrize("kernel_stamps", [False, True], ids=["loop-read", "kernel"])
async def test_each_chunk_gets_its_own_arrival_stamp_in_order_after_it_was_written(
    server: tuple[ChunkServer, str], kernel_stamps: bool
) -> None:
    if kernel_stamps and not kernel_clock.supported():
        pytest.skip("this kernel gives no arrival stamps (SO_TIMESTAMPNS)")
    chunks, url = server
    stamps = Stamps(request_start=time.perf_counter_ns())
    token = current_stamps.set(stamps)
    try:
        async with timed_session(kernel_stamps=kernel_stamps) as session, session.get(url + "/chunked") as resp:
            # The body is read only once it is all there: stamps taken at the read would all be later
            # than the last write, so each one falling before the next write shows it was the arrival.
            await asyncio.sleep(PAUSE_S * (len(CHUNKS) + 1))
            assert await resp.read() == b"".join(CHUNKS)
            protocol = stamping_protocol(resp)
            # `TimedConnector._factory` (the protocol of each new connection) and `TimedConnector.connect`
            # (the connection a request took): the request saw our protocol.
            assert isinstance(protocol, StampingProtocol), "aiohttp no longer builds connections with _factory"
            assert stamps.protocol is protocol, "aiohttp no longer hands the connection through connect()"
            arrivals = list(protocol.arrivals_of(resp.content))
    finally:
        current_stamps.reset(token)
    # `TCPConnector._wrap_create_connection` (the TCP handshake stamped apart from the rest).
    assert stamps.tcp_end is not None, "aiohttp no longer opens connections through _wrap_create_connection"
    assert protocol.kernel_stamped is kernel_stamps
    # `ResponseHandler._payload`: every arrival is recorded against the body it went to. The head came
    # on its own (the server paused before the first chunk), then each chunk; the stream's end may
    # come apart from the last chunk, adding no body bytes.
    (head_total, head_stamp), *rest = arrivals
    assert head_total == 0, arrivals
    body: list[tuple[int, int]] = []
    for total, stamp in rest:
        if total > (body[-1][0] if body else 0):
            body.append((total, stamp))
    sizes = [len(chunk) for chunk in CHUNKS]
    assert [total for total, _ in body] == [sum(sizes[: n + 1]) for n in range(len(CHUNKS))], arrivals
    times = [head_stamp] + [stamp for _, stamp in body]
    assert times == sorted(times), arrivals
    assert head_stamp < chunks.written[0]
    written = [*chunks.written, time.perf_counter_ns()]
    for n, (_, stamp) in enumerate(body):
        assert written[n] < stamp < written[n + 1], f"chunk {n} stamped at {stamp}, written at {written[n]}"


async def test_a_body_that_came_with_the_head_keeps_its_stamps_after_release(server: tuple[ChunkServer, str]) -> None:
    # A body that arrived with the head is read after aiohttp has put the connection back; its stamps
    # are then reachable only through `ClientResponse._protocol`.
    _, url = server
    started = time.perf_counter_ns()
    async with timed_session(kernel_stamps=False) as session, session.get(url + "/whole") as resp:
        await asyncio.sleep(0.05)
        assert resp.connection is None, "the connection was not released: this case is not exercised"
        protocol = stamping_protocol(resp)
        assert protocol is not None, "aiohttp ClientResponse no longer keeps _protocol"
        assert await resp.read() == b"".join(CHUNKS)
        ((total, stamp),) = protocol.arrivals_of(resp.content)
        assert total == sum(len(chunk) for chunk in CHUNKS)
        assert started < stamp < time.perf_counter_ns()


async def test_the_response_handler_keeps_the_body_payload_and_the_paused_flag() -> None:
    # Read with getattr and a default in `StampingProtocol.data_received`: were they renamed, arrivals
    # would go unstamped (the stamp test above fails) and a paused read would not be taken at once.
    handler = ResponseHandler(loop=asyncio.get_running_loop())
    assert hasattr(handler, "_payload"), "aiohttp ResponseHandler no longer has _payload"
    assert hasattr(handler, "_reading_paused"), "aiohttp ResponseHandler no longer has _reading_paused"
    assert handler._payload is None and handler._reading_paused is False


async def test_a_connector_instance_carries_the_attributes_the_client_reads() -> None:
    connector = aiohttp.TCPConnector()
    try:
        for name in ("_socket_factory", "_local_addr_infos", "_happy_eyeballs_delay", "_interleave", "_factory"):
            assert hasattr(connector, name), f"aiohttp TCPConnector instance has no {name}"
    finally:
        await connector.close()
