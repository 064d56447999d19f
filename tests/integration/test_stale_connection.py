"""A pooled connection the server closed under the next request: retried once on a fresh one, and said so.

The server here has a keep-alive timeout equal to the pause between rounds (uvicorn's 5 s, which
vLLM uses, with the probe's rounds 5 s apart). In production the close and the next request cross
on the wire now and then; here they cross every time: a request that arrives on a connection idle
for (about) the keep-alive timeout finds the server's timer already fired, and the server closes
the connection without answering, with a FIN or a RST.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.result import ErrorClass, Sample

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo

KEEP_ALIVE_S = 0.3  # the server's keep-alive timeout, and the pause between rounds
HOLD_S = 0.2  # how long the stale attempt hangs before the close arrives: must not count in TTFT
TTFT_S = 0.05
PARAMS = RequestParams(model="m", max_tokens=8, temperature=0.0, extra_body={}, include_usage=True)


def answer() -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in "ab"]
    body = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@dataclass
class KeepAliveServer:
    close: str  # "fin", "rst", or "partial" (answer a head and one event, then close: never retried)
    port: int = 0
    stale_closed_ns: list[int] = field(default_factory=list)
    requests: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        idle_since: float | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.requests += 1
                if idle_since is not None and time.monotonic() - idle_since >= 0.8 * KEEP_ALIVE_S:
                    # The keep-alive timer fired as this request arrived: close instead of answering.
                    await asyncio.sleep(HOLD_S)
                    if self.close == "partial":
                        whole = answer()
                        writer.write(whole[: whole.index(b"\n\n") + 2 + 40])
                        await writer.drain()
                    elif self.close == "rst":
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.stale_closed_ns.append(time.perf_counter_ns())
                    writer.close()
                    return
                await asyncio.sleep(TTFT_S)
                writer.write(answer())
                await writer.drain()
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def keep_alive_server(request: pytest.FixtureRequest) -> AsyncIterator[KeepAliveServer]:
    state = KeepAliveServer(close=request.param)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    server.close()
    await server.wait_closed()


async def rounds(port: int, count: int) -> list[Sample]:
    endpoint = Endpoint(
        f"http://127.0.0.1:{port}/v1", FLAVORS["openai-chat"], timeouts=Timeouts(connect=2, first_token=3, total=5)
    )
    samples = []
    async with ProbeClient() as client:
        for index in range(count):
            if index:
                await asyncio.sleep(KEEP_ALIVE_S)
            sample = Sample(target="t", model="m", api="openai-chat", prompt="p", round=index + 1)
            samples.append(await client.probe(endpoint, PARAMS, "hi", sample))
    return samples


@pytest.mark.parametrize("keep_alive_server", ["fin", "rst"], indirect=True)
async def test_a_request_on_a_connection_closed_under_it_is_sent_again_fresh_and_timed_from_that_send(
    keep_alive_server: KeepAliveServer,
) -> None:
    samples = await rounds(keep_alive_server.port, 4)
    assert [(s.error, s.error_message) for s in samples] == [(None, None)] * 4
    # The retry's connection is not kept (it is a fresh one, closed after): the next round opens its
    # own, which the round after finds closed again.
    assert [s.connection_retried for s in samples] == [False, True, False, True]
    assert len(keep_alive_server.stale_closed_ns) == 2 and keep_alive_server.requests == 6
    for sample, closed_ns in zip(samples[1::2], keep_alive_server.stale_closed_ns, strict=True):
        # A fresh connection, set up after the stale one closed; TTFT from the retry's send, not the first.
        assert sample.connection_reused is False and sample.connect_ms is not None
        assert sample.sent_mono_ns is not None and sample.sent_mono_ns > closed_ns
        assert sample.ttft_ms is not None and TTFT_S * 1000 <= sample.ttft_ms < HOLD_S * 1000, sample.ttft_ms
        assert sample.setup_ms is not None and sample.setup_ms >= HOLD_S * 1000  # the lost attempt is set-up


@pytest.mark.parametrize("keep_alive_server", ["partial"], indirect=True)
async def test_a_reused_connection_that_broke_after_part_of_the_answer_is_not_sent_again(
    keep_alive_server: KeepAliveServer,
) -> None:
    first, second = await rounds(keep_alive_server.port, 2)
    assert first.ok and not first.connection_retried
    assert second.error is ErrorClass.STREAM_ERROR and not second.connection_retried, second.error_message
    assert keep_alive_server.requests == 2
