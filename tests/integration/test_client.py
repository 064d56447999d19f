"""The timed stream against small purpose-built servers, one per edge case, over real loopback HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import ssl
import subprocess
import tomllib
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from monitor.probe.aiohttp_hooks import SUPPORTED_AIOHTTP, aiohttp_supported
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.result import ErrorClass, Sample, TimingPath

# Its figures are times within milliseconds: it runs while no other test runs.
pytestmark = pytest.mark.solo

Script = list[tuple[float, bytes]]  # (sleep seconds before, bytes to write)
SECRET = "sk-test-abcdefghijklmnopqrstuvwxyz0123"


def chunk(delta: dict | None = None, **extra: object) -> bytes:
    obj: dict[str, object] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "served-model"}
    obj["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    obj.update(extra)
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
ROLE = chunk({"role": "assistant", "content": ""})


def content(text: str) -> bytes:
    return chunk({"content": text})


def streaming_handler(script: Script, *, headers: dict[str, str] | None = None, cut: bool = False):
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "x-request-id": "req-42", **(headers or {})}
        )
        await resp.prepare(request)
        try:
            for delay, data in script:
                if delay:
                    await asyncio.sleep(delay)
                await resp.write(data)
        except ConnectionResetError:  # the probe gave up (timeouts); nothing more to send
            return resp
        if cut:
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write_eof()
        return resp

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Callable, *, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        scheme = "https" if ssl_context else "http"
        return f"{scheme}://127.0.0.1:{port}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


DEFAULT_TIMEOUTS = Timeouts(connect=2, first_token=2, total=5)
PARAMS = RequestParams(model="m", max_tokens=16, temperature=0.0, extra_body={}, include_usage=True)


async def probe(
    base_url: str,
    *,
    api: str = "openai-chat",
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    api_key: str | None = None,
    fresh: bool = False,
    ssl_option: ssl.SSLContext | bool = True,
    client: ProbeClient | None = None,
    follow_redirects: bool = False,
) -> Sample:
    endpoint = Endpoint(
        base_url, FLAVORS[api], api_key=api_key, timeouts=timeouts, ssl=ssl_option, follow_redirects=follow_redirects
    )
    sample = Sample(target="t", model="m", api=api, prompt="p", round=1)
    if client is not None:
        return await client.probe(endpoint, PARAMS, "hello", sample)
    async with ProbeClient(fresh=fresh) as own:
        return await own.probe(endpoint, PARAMS, "hello", sample)


async def test_the_role_chunk_is_not_the_first_token(serve) -> None:
    url = await serve(streaming_handler([(0, ROLE), (0.1, content("Hi")), (0, chunk({}, usage=None)), (0, DONE)]))
    sample = await probe(url)
    assert sample.ok, sample.error_message
    assert sample.first_event_ms is not None and sample.first_event_ms < 50
    assert sample.ttft_ms is not None and 100 <= sample.ttft_ms < 150
    assert sample.ttfa_ms == sample.ttft_ms
    assert sample.request_id == "req-42"
    assert sample.served_model == "served-model"
    assert sample.timing_path is TimingPath.KERNEL


async def test_comments_and_empty_deltas_are_not_tokens(serve) -> None:
    script = [(0, b": ping\n\n"), (0.04, b": ping\n\n"), (0, chunk({})), (0.04, content("x")), (0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and 80 <= sample.ttft_ms < 130


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_counts_for_ttft_and_the_answer_for_ttfa(serve, field: str) -> None:
    script = [
        (0, ROLE),
        (0.05, chunk({field: "Let me think"})),
        (0.02, chunk({field: " more"})),
        (0.08, content("Answer")),
        (0, DONE),
    ]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and 50 <= sample.ttft_ms < 90
    assert sample.ttfa_ms is not None and 150 <= sample.ttfa_ms < 200
    assert sample.token_events == 3


async def test_a_tool_call_is_a_token(serve) -> None:
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}
    sample = await probe(await serve(streaming_handler([(0, ROLE), (0.03, chunk(call)), (0, DONE)])))
    assert sample.ok and sample.ttft_ms is not None and sample.ttft_ms >= 30


async def test_it_reads_usage_from_a_usage_only_final_chunk(serve) -> None:
    usage = {
        "prompt_tokens": 1234,
        "completion_tokens": 2,
        "total_tokens": 1236,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    script = [(0, ROLE), (0, content("a")), (0.01, content("b")), (0, chunk(None, usage=usage)), (0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert (sample.prompt_tokens, sample.completion_tokens, sample.cached_tokens) == (1234, 2, 1024)
    assert sample.gap_max_ms is not None and sample.gap_max_ms >= 10
    assert sample.decode_tps is not None and sample.decode_tps > 0


async def test_every_duration_is_reported_to_the_microsecond_as_it_is_stored(serve) -> None:
    from monitor.store.records import STORED_DURATIONS, storable_sample

    script = [(0, ROLE), (0.003, content("t0")), (0.01, content("t1")), (0.002, content("t2")), (0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    durations = {name: getattr(sample, name) for name in STORED_DURATIONS}
    assert {name for name, value in durations.items() if value is not None} >= {
        "setup_ms",
        "ttfb_ms",
        "first_event_ms",
        "ttft_ms",
        "total_ms",
        "gap_p50_ms",
        "gap_p95_ms",
        "gap_max_ms",
    }
    for name, value in durations.items():
        assert value is None or value == round(value * 1000) / 1000, (name, value)
    # So storing it changes nothing (and costs no copy): the probe, its exports and the database agree.
    assert storable_sample(sample) is sample


async def test_it_keeps_the_first_chunk_gaps_in_arrival_order_and_no_more_than_its_cap(serve) -> None:
    from monitor.probe.result import CHUNK_GAPS_KEPT

    tokens = CHUNK_GAPS_KEPT + 44
    script = [(0, ROLE), (0, content("t0")), (0.05, content("t1"))]
    script += [(0, content(f"t{i}")) for i in range(2, tokens)] + [(0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    assert sample.token_events == tokens
    assert len(sample.chunk_gaps_ms) == CHUNK_GAPS_KEPT  # tokens - 1 gaps, the first CHUNK_GAPS_KEPT kept
    assert sample.chunk_gaps_ms[0] >= 45  # the pause before the second token: first, not sorted last
    assert sample.gap_max_ms == round(max(sample.chunk_gaps_ms), 3)  # the durations: to the microsecond


async def test_an_error_event_mid_stream_is_a_stream_error(serve) -> None:
    err = b'data: {"error": {"message": "engine died", "type": "server_error", "code": 500}}\n\n'
    sample = await probe(await serve(streaming_handler([(0, ROLE), (0, content("a")), (0, err)])))
    assert sample.error is ErrorClass.STREAM_ERROR
    assert sample.error_message == "error event in the stream after 1 tokens: engine died"
    assert sample.ttft_ms is not None


async def test_a_utf8_character_split_across_writes_is_reassembled(serve) -> None:
    raw = b'data: {"choices":[{"index":0,"delta":{"content":"' + "首字".encode() + b'"}}]}\n\n'
    split = raw.index("首".encode()) + 1  # inside the first character's three bytes
    script = [(0, ROLE), (0.02, raw[:split]), (0.03, raw[split:]), (0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    # The token is complete only when its second half arrives.
    assert sample.ttft_ms is not None and sample.ttft_ms >= 50


def http_chunks(data: bytes, size: int) -> bytes:
    """`data` in HTTP/1.1 chunked encoding, `size` bytes a chunk (no terminating chunk)."""
    return b"".join(
        f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n" for i in range(0, len(data), size)
    )


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.fixture
async def raw_serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """A bare TCP server: `answer(reader, writer)` writes whatever bytes the case needs."""
    servers: list[asyncio.Server] = []

    async def start(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            # The whole request, so closing the socket later sends a FIN, not a reset for unread bytes.
            length = next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
            await reader.readexactly(int(length.split(b":")[1]))
            try:
                await answer(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("before_first_token", [True, False], ids=["before-the-first-token", "mid-stream"])
async def test_an_error_event_ends_the_probe_though_the_server_holds_the_connection(
    raw_serve, before_first_token: bool
) -> None:
    # The body is parsed in slices: an error event is seen within a fraction of a second, not at a deadline.
    events = [ROLE] if before_first_token else [ROLE, content("a")]
    events.append(chunk(None, error={"message": "engine died"}))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + http_chunks(b"".join(events), 4096))
        await writer.drain()
        await reader.read()  # holds the connection open until the client goes

    sample = await probe(await raw_serve(answer), timeouts=Timeouts(connect=2, first_token=3, total=6))
    assert sample.error is ErrorClass.STREAM_ERROR
    tokens = 0 if before_first_token else 1
    assert sample.error_message == f"error event in the stream after {tokens} tokens: engine died"
    assert sample.total_ms is not None and sample.total_ms < 1500


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b'data: {"choices": 5}\n\n'], ids=["not-json", "wrong-shape"])
async def test_a_malformed_event_ends_the_probe_though_the_server_holds_the_connection(raw_serve, bad: bytes) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + http_chunks(ROLE + content("a"), 4096))
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(http_chunks(bad, 4096))
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer), timeouts=Timeouts(connect=2, first_token=3, total=6))
    assert sample.error is ErrorClass.MALFORMED_STREAM, sample.error_message
    assert sample.error_message is not None and sample.error_message.startswith("malformed stream: event")
    assert sample.ttft_ms is not None  # the token before it still counts
    assert sample.total_ms is not None and sample.total_ms < 1500


async def test_every_token_of_a_burst_is_counted_when_the_connection_breaks_after_it(raw_serve) -> None:
    # Head and ~70 KiB of events in one write, then the connection closes mid-body: the bytes
    # aiohttp holds when it fails the body are taken first, every one of them.
    tokens = 400
    events = b"".join(
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%05d%s"}}]}\n\n' % (i, b"x" * 150)
        for i in range(tokens)
    )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + http_chunks(events, 1000))
        await writer.drain()
        await asyncio.sleep(0.05)  # then the fixture closes the connection, the body unfinished

    sample = await probe(await raw_serve(answer))
    assert sample.error is ErrorClass.STREAM_ERROR
    assert sample.token_events == tokens
    assert sample.error_message is not None and f"after {tokens} tokens" in sample.error_message


async def test_a_flood_of_tiny_chunks_does_not_stall_the_stream(raw_serve) -> None:
    # aiohttp pauses the socket once some 16,000 HTTP chunks wait unread, whatever their size; the
    # reader must take them then, or nothing more arrives until a deadline.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + http_chunks(ROLE, 4096) + http_chunks(b"\n" * 17_000, 1))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(http_chunks(content("a") + DONE, 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer), timeouts=Timeouts(connect=2, first_token=3, total=6))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and 200 <= sample.ttft_ms < 1500


async def test_a_body_that_comes_with_the_head_is_stamped_when_it_arrived(raw_serve) -> None:
    # Head and whole body in one write: aiohttp has released the connection before the probe's task
    # sees the response. The token still gets the stamp of the bytes' arrival (the same as the head's),
    # not the later moment the task got round to reading.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(CHUNKED_HEAD + http_chunks(ROLE, 4096) + http_chunks(content("a") + DONE, 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    sample = await probe(await raw_serve(answer))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and sample.ttft_ms >= 50
    assert sample.ttft_ms == sample.ttfb_ms == sample.first_event_ms
    assert sample.timing_path is TimingPath.KERNEL


async def test_a_body_longer_than_the_read_buffer_is_read_to_the_end(serve) -> None:
    # ~600 KiB, past aiohttp's high-water mark (2 x read_bufsize): a body left unread there would pause
    # the socket and never end; every token must still be counted and stamped as it came.
    tokens = 3000
    script: Script = [(0.0, ROLE)] + [(0.0, content("x" * 150))] * tokens + [(0.0, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    assert sample.token_events == tokens
    assert sample.gap_max_ms is not None and sample.gap_max_ms < 1000


async def test_an_error_event_deep_in_a_long_body_is_seen_before_the_body_ends(serve) -> None:
    # The body is parsed as it piles up, so an error event 200 KiB in ends the probe although the
    # server then hangs with the connection open.
    script: Script = [(0.0, ROLE)] + [(0.0, content("y" * 150))] * 1000
    script += [(0, chunk(None, error={"message": "engine died"})), (0, content("z" * 40_000)), (3, DONE)]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.error is ErrorClass.STREAM_ERROR
    assert sample.error_message == "error event in the stream after 1000 tokens: engine died"
    assert sample.total_ms is not None and sample.total_ms < 2000


async def test_a_stream_cut_mid_way_is_a_stream_error(serve) -> None:
    url = await serve(streaming_handler([(0, ROLE), (0, content("a")), (0.01, content("b"))], cut=True))
    sample = await probe(url)
    assert sample.error is ErrorClass.STREAM_ERROR
    assert sample.ttft_ms is not None


async def test_malformed_json_is_a_malformed_stream(serve) -> None:
    sample = await probe(await serve(streaming_handler([(0, ROLE), (0, b"data: {not json\n\n")])))
    assert sample.error is ErrorClass.MALFORMED_STREAM
    assert sample.error_message == "malformed stream: event data is not JSON: '{not json'"


async def test_a_stream_without_tokens_is_an_empty_response(serve) -> None:
    sample = await probe(
        await serve(
            streaming_handler(
                [
                    (0, ROLE),
                    (
                        0,
                        chunk(
                            {},
                        ),
                    ),
                    (0, DONE),
                ]
            )
        )
    )
    assert sample.error is ErrorClass.EMPTY_RESPONSE
    assert sample.ttft_ms is None


async def test_a_json_answer_instead_of_a_stream_is_malformed(serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "hi"}}]})

    sample = await probe(await serve(handler))
    assert sample.error is ErrorClass.MALFORMED_STREAM
    assert "not an event stream" in (sample.error_message or "")


def error_handler(status: int, body: dict, headers: dict[str, str] | None = None):
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=status, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("status", "body", "expected", "message"),
    [
        (
            401,
            {"error": {"message": f"Incorrect API key provided: {SECRET}"}},
            ErrorClass.AUTH,
            "HTTP 401: Incorrect API key provided: [REDACTED]; check the API key (api_key_env / api_key_file) "
            "and that it is allowed this model",
        ),
        (
            404,
            {"error": {"message": "The model `m` does not exist.", "code": 404}},
            ErrorClass.MODEL_NOT_FOUND,
            "HTTP 404: The model `m` does not exist.; check the model name (ask GET /v1/models) and the "
            "provider's base_url",
        ),
        (400, {"error": {"message": "model 'm' not found"}}, ErrorClass.MODEL_NOT_FOUND, None),
        (400, {"error": {"message": "stream_options not supported"}}, ErrorClass.BAD_REQUEST, None),
        (500, {"error": {"message": "boom"}}, ErrorClass.SERVER_ERROR, None),
        (503, {"detail": "overloaded"}, ErrorClass.SERVER_ERROR, None),
    ],
)
async def test_http_errors_are_classified_with_the_servers_message(
    serve, status: int, body: dict, expected: ErrorClass, message: str | None
) -> None:
    sample = await probe(await serve(error_handler(status, body)), api_key=SECRET)
    assert sample.error is expected
    assert sample.http_status == status
    assert SECRET not in (sample.error_message or "")
    if message is not None:
        assert sample.error_message == message


async def test_rate_limiting_reports_retry_after(serve) -> None:
    url = await serve(error_handler(429, {"error": {"message": "slow down"}}, {"Retry-After": "7"}))
    sample = await probe(url)
    assert sample.error is ErrorClass.RATE_LIMITED
    assert sample.error_message is not None and sample.error_message.endswith("(Retry-After: 7)")


async def test_a_refused_connection_is_a_connect_error(unused_tcp_port: int) -> None:
    sample = await probe(f"http://127.0.0.1:{unused_tcp_port}/v1")
    assert sample.error is ErrorClass.CONNECT
    assert sample.error_message is not None
    assert sample.error_message.startswith(f"cannot connect to http://127.0.0.1:{unused_tcp_port}/v1")
    assert sample.error_message.endswith("is the server running on that port?")
    assert sample.timing_path is None  # no response: nothing was timed from one


async def test_an_unknown_host_is_a_dns_error() -> None:
    sample = await probe("http://no-such-host.invalid/v1")
    assert sample.error is ErrorClass.DNS
    assert sample.error_message == (
        "cannot resolve the host of http://no-such-host.invalid/v1; check the hostname in base_url"
    )


async def test_a_server_that_hangs_before_the_first_token_times_out(serve) -> None:
    url = await serve(streaming_handler([(0, ROLE), (5, content("late"))]))
    sample = await probe(url, timeouts=Timeouts(connect=1, first_token=0.3, total=5))
    assert sample.error is ErrorClass.TIMEOUT_FIRST_TOKEN
    assert sample.total_ms is not None and 280 <= sample.total_ms < 800
    assert sample.first_event_ms is not None


@pytest.mark.parametrize("hang", [False, True], ids=["stream", "hang-after-role"])
async def test_without_the_stamping_protocol_the_task_reads_and_keeps_the_deadlines(serve, hang: bool) -> None:
    # The fallback for a connection whose protocol keeps no stamps: still every token, still the
    # first-token deadline. (Our connector always makes stamping protocols; this swaps in aiohttp's own.)
    import functools

    from aiohttp.client_proto import ResponseHandler

    tokens = [(1.0, content("late"))] if hang else [(0.05, content("a")), (0.01, content("b"))]
    url = await serve(streaming_handler([(0, ROLE), *tokens, (0, DONE)]))
    async with ProbeClient() as client:
        connector = client._session.connector
        assert connector is not None
        connector._factory = functools.partial(ResponseHandler, loop=asyncio.get_running_loop())  # type: ignore[attr-defined]
        with capture_logs() as logs:
            sample = await probe(url, client=client, timeouts=Timeouts(connect=2, first_token=0.3, total=5))
            again = await probe(url, client=client, timeouts=Timeouts(connect=2, first_token=0.3, total=5))
    if hang:
        assert sample.error is ErrorClass.TIMEOUT_FIRST_TOKEN
    else:
        assert sample.ok, sample.error_message
        assert sample.token_events == 2
        assert sample.ttft_ms is not None and sample.ttft_ms >= 50
    # The sample says it was timed by the fallback clock, and the client warns once, not per sample,
    # naming what happened: not "install the pinned aiohttp" when the installed one is inside the pin.
    assert sample.timing_path is again.timing_path is TimingPath.TASK_READ
    warnings = [e for e in logs if e["event"] == "probe_timing_fallback"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning", logs
    warning = warnings[0]
    assert warning["reason"].startswith("the connection's protocol is not the probe's stamping one")
    assert warning["connection"] == "fresh" and warning["tls"] is False
    assert aiohttp_supported(aiohttp.__version__)
    assert warning["fix"].startswith(f"aiohttp {aiohttp.__version__} is inside the supported range"), warning


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "protocol"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("fresh", [False, True], ids=["reused", "fresh"])
async def test_every_sample_is_stamped_on_fresh_and_reused_connections_plain_and_tls(
    serve, self_signed, fresh: bool, tls: bool, kernel: bool
) -> None:
    # Tokens apart from the head, so the body's end comes in its own read: on a connection that is not
    # kept, aiohttp releases and closes it inside that very read. Both clocks: the kernel's stamps, and
    # the protocol's own (where the kernel keeps none), which is where fresh samples lost theirs.
    cert, key = self_signed
    server_ctx = None
    if tls:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
    script = [(0, ROLE), (0.06, content("a")), (0.02, content("b")), (0.02, DONE)]
    url = await serve(streaming_handler(script), ssl_context=server_ctx)
    trust: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(cert)) if tls else True
    with capture_logs() as logs:
        async with ProbeClient(fresh=fresh, kernel_stamps=kernel) as client:
            samples = [await probe(url, client=client, ssl_option=trust) for _ in range(4)]
    assert all(s.ok for s in samples), [s.error_message for s in samples]
    assert [s.timing_path for s in samples] == [TimingPath.KERNEL if kernel else TimingPath.STAMPED] * 4
    assert [s.connection_reused for s in samples] == ([False] * 4 if fresh else [False, True, True, True])
    assert all(s.ttft_ms is not None and 50 <= s.ttft_ms < 1000 for s in samples)
    if tls:  # each new connection's handshake is measured: every sample's when fresh, the first's else
        assert all(s.tls_ms is not None and s.tls_ms > 0 for s in samples[: 4 if fresh else 1])
    assert [e for e in logs if e["event"] == "probe_timing_fallback"] == []


@pytest.mark.parametrize(
    ("version", "supported"),
    [("3.14.0", True), ("3.14.5", True), ("3.14.0rc1", True), ("3.13.9", False), ("3.15.0", False), ("4", False)],
)
def test_the_supported_aiohttp_range(version: str, supported: bool) -> None:
    assert aiohttp_supported(version) is supported


def test_the_supported_aiohttp_range_is_the_one_pyproject_pins() -> None:
    pyproject = tomllib.loads((Path(__file__).parent.parent.parent / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("aiohttp")]
    assert pins == [f"aiohttp{SUPPORTED_AIOHTTP}"]


async def test_a_slow_drip_hits_the_total_timeout(serve) -> None:
    url = await serve(streaming_handler([(0, ROLE), (0, content("a"))] + [(0.1, content("b"))] * 20))
    sample = await probe(url, timeouts=Timeouts(connect=1, first_token=1, total=0.5))
    assert sample.error is ErrorClass.TIMEOUT_TOTAL
    assert sample.ttft_ms is not None
    assert sample.error_message is not None and "did not finish within 0.5 s" in sample.error_message


async def test_a_reused_connection_records_no_setup_and_a_fresh_one_does(serve) -> None:
    url = await serve(streaming_handler([(0, ROLE), (0, content("a")), (0, DONE)]))
    async with ProbeClient() as client:
        first = await probe(url, client=client)
        second = await probe(url, client=client)
    assert first.connection_reused is False and first.connect_ms is not None
    assert second.connection_reused is True
    assert (second.dns_ms, second.connect_ms, second.tls_ms) == (None, None, None)
    async with ProbeClient(fresh=True) as client:
        fresh = [await probe(url, client=client) for _ in range(2)]
    assert all(s.connection_reused is False and s.connect_ms is not None for s in fresh)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_time_is_measured_and_an_untrusted_certificate_is_a_tls_error(serve, self_signed) -> None:
    cert, key = self_signed
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    url = await serve(streaming_handler([(0, ROLE), (0, content("a")), (0, DONE)]), ssl_context=server_ctx)
    untrusted = await probe(url)
    assert untrusted.error is ErrorClass.TLS
    assert untrusted.error_message is not None and "set tls.ca_file" in untrusted.error_message
    trusted = await probe(url, ssl_option=ssl.create_default_context(cafile=str(cert)))
    assert trusted.ok, trusted.error_message
    assert trusted.tls_ms is not None and trusted.tls_ms > 0
    assert trusted.connect_ms is not None


async def test_an_anthropic_stream_with_thinking(serve) -> None:
    def ev(name: str, data: dict) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    script = [
        (
            0,
            ev(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "model": "claude-x",
                        "usage": {"input_tokens": 10, "cache_read_input_tokens": 90},
                    },
                },
            ),
        ),
        (
            0,
            ev(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
            ),
        ),
        (0, ev("ping", {"type": "ping"})),
        (
            0.04,
            ev(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
            ),
        ),
        (
            0.04,
            ev(
                "content_block_delta",
                {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
            ),
        ),
        (
            0,
            ev(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
            ),
        ),
        (0, ev("message_stop", {"type": "message_stop"})),
    ]
    sample = await probe(await serve(streaming_handler(script)), api="anthropic-messages")
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and 40 <= sample.ttft_ms < 75
    assert sample.ttfa_ms is not None and sample.ttfa_ms >= 80
    assert (sample.prompt_tokens, sample.cached_tokens, sample.completion_tokens) == (100, 90, 2)
    assert sample.served_model == "claude-x"


async def test_an_anthropic_error_event_is_a_stream_error(serve) -> None:
    err = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    sample = await probe(await serve(streaming_handler([(0, err)])), api="anthropic-messages")
    assert sample.error is ErrorClass.STREAM_ERROR
    assert sample.error_message == "error event in the stream after 0 tokens: Overloaded"


async def test_the_request_carries_the_key_and_body_per_api(serve) -> None:
    seen: list[tuple[dict, dict]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append((dict(request.headers), await request.json()))
        return await streaming_handler([(0, content("a")), (0, DONE)])(request)

    url = await serve(handler)
    await probe(url, api_key=SECRET)
    await probe(url, api="anthropic-messages", api_key=SECRET)
    (openai_headers, openai_body), (anthropic_headers, anthropic_body) = seen
    assert openai_headers["Authorization"] == f"Bearer {SECRET}"
    assert openai_body["stream"] is True and openai_body["stream_options"] == {"include_usage": True}
    assert openai_body["messages"] == [{"role": "user", "content": "hello"}]
    assert anthropic_headers["x-api-key"] == SECRET and anthropic_headers["anthropic-version"]
    assert "stream_options" not in anthropic_body


@pytest.mark.parametrize(
    ("chunk", "offset", "arrivals", "expected"),
    [
        (b"abcdef", 0, [(6, 10)], [(10, b"abcdef")]),
        (b"abcdef", 0, [(2, 10), (6, 20)], [(10, b"ab"), (20, b"cdef")]),
        (b"cdef", 2, [(2, 10), (4, 20), (9, 30)], [(20, b"cd"), (30, b"ef")]),
        (b"abc", 0, [], [(99, b"abc")]),
        (b"abcd", 0, [(2, 10)], [(10, b"ab"), (99, b"cd")]),
    ],
)
def test_body_bytes_get_the_time_they_arrived(chunk, offset, arrivals, expected) -> None:
    from collections import deque

    from monitor.probe.body import stamped_pieces

    assert stamped_pieces(chunk, offset, deque(arrivals), 99) == expected


# --- compressed bodies ----------------------------------------------------------------------------


def compressor(encoding: str):
    """A zlib compressor for the Content-Encoding: gzip, deflate (zlib-wrapped) or raw deflate."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw-deflate": -zlib.MAX_WBITS}[encoding]
    return zlib.compressobj(6, zlib.DEFLATED, wbits)


def encoded_head(encoding: str, *, ctype: str = "text/event-stream", status: str = "200 OK") -> bytes:
    header = encoding.removeprefix("raw-")
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Encoding: {header}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_a_compressed_stream_is_decoded_and_stamped_when_its_compressed_bytes_arrived(
    raw_serve, encoding: str
) -> None:
    # Each event is flushed, as a compressing server does for SSE; the token's time is the arrival
    # of the compressed bytes that carry it.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        packer = compressor(encoding)
        first = packer.compress(ROLE) + packer.flush(zlib.Z_SYNC_FLUSH)
        writer.write(encoded_head(encoding) + http_chunks(first, 4096))
        await writer.drain()
        for text in ("Hi", " there"):
            await asyncio.sleep(0.1)
            writer.write(http_chunks(packer.compress(content(text)) + packer.flush(zlib.Z_SYNC_FLUSH), 4096))
            await writer.drain()
        writer.write(http_chunks(packer.compress(DONE) + packer.flush(), 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer))
    assert sample.ok, sample.error_message
    assert sample.token_events == 2
    assert sample.first_event_ms is not None and sample.first_event_ms < 50
    assert sample.ttft_ms is not None and 100 <= sample.ttft_ms < 180
    assert sample.gap_max_ms is not None and 80 <= sample.gap_max_ms < 180


async def test_a_compressed_body_that_comes_with_the_head_keeps_its_arrival_stamp(raw_serve) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        whole = gzip.compress(ROLE + content("a") + DONE)
        writer.write(encoded_head("gzip") + http_chunks(whole, 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and sample.ttft_ms >= 50
    assert sample.ttft_ms == sample.ttfb_ms


async def test_the_probe_asks_for_the_encodings_it_decodes(serve) -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Accept-Encoding", ""))
        return await streaming_handler([(0, content("a")), (0, DONE)])(request)

    await probe(await serve(handler))
    assert seen == ["gzip, deflate"]


BOMB_MEMBER = gzip.compress(b"\n" * (1 << 20), 9)  # 1 MiB of blank lines in about 1 KiB


@pytest.mark.parametrize(
    "bomb",
    [
        pytest.param(lambda: BOMB_MEMBER * 1024, id="1-GiB-in-1024-members"),
        pytest.param(lambda: gzip.compress(b"\n" * (32 << 20), 1), id="32-MiB-in-one-member"),
    ],
)
async def test_a_gzip_bomb_is_refused_in_bounded_memory_and_time(raw_serve, bomb: Callable[[], bytes]) -> None:
    body = bomb()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        writer.write(body)
        await writer.drain()
        await reader.read()

    url = await raw_serve(answer)
    tracemalloc.start()
    try:
        sample = await probe(url, timeouts=Timeouts(connect=2, first_token=10, total=20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sample.error is ErrorClass.MALFORMED_STREAM, sample.error_message
    assert sample.error_message is not None and "compression bomb" in sample.error_message
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
    assert sample.total_ms is not None and sample.total_ms < 10_000  # unbounded, parsing 32 MiB alone takes ~45 s


@pytest.mark.parametrize(
    ("encoding", "body", "expected"),
    [
        ("gzip", b"this is not gzip at all", "does not decode"),
        ("br", b"\x1b\x00\x00", "Content-Encoding: br, which was not asked for"),
    ],
    ids=["corrupt-gzip", "brotli-not-asked-for"],
)
async def test_a_body_that_cannot_be_decoded_is_a_protocol_error(
    raw_serve, encoding: str, body: bytes, expected: str
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encoded_head(encoding) + http_chunks(body, 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer))
    assert sample.error is ErrorClass.PROTOCOL
    assert sample.error_message is not None and expected in sample.error_message


async def test_a_compressed_error_body_gives_the_servers_message(raw_serve) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = gzip.compress(json.dumps({"error": {"message": "engine overloaded"}}).encode())
        writer.write(encoded_head("gzip", ctype="application/json", status="503 Service Unavailable"))
        writer.write(http_chunks(body, 4096) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    sample = await probe(await raw_serve(answer))
    assert sample.error is ErrorClass.SERVER_ERROR
    assert sample.error_message is not None and sample.error_message.startswith("HTTP 503: engine overloaded;")


# --- redirects ------------------------------------------------------------------------------------


def redirecting_handler(status: int, location: str, seen: list[str]):
    async def handler(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        await request.read()
        return web.Response(status=status, headers={"Location": location})

    return handler


def recording_stream(seen: list[str]):
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(f"{request.method} {request.path} {len(body)}")
        return await streaming_handler([(0, ROLE), (0, content("elsewhere")), (0, DONE)])(request)

    return handler


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_its_own_error_and_is_not_followed_by_default(serve, status: int) -> None:
    elsewhere: list[str] = []
    other = await serve(recording_stream(elsewhere))
    asked: list[str] = []
    url = await serve(redirecting_handler(status, f"{other}/chat/completions?key={SECRET}", asked))
    sample = await probe(url, api_key=SECRET)
    assert sample.error is ErrorClass.REDIRECT
    assert sample.http_status == status
    assert asked == ["POST /v1/chat/completions"]
    assert elsewhere == []  # the other host was never asked, nor counted as this endpoint's success
    assert sample.error_message == (
        f"HTTP {status} redirect to {other}/chat/completions?key=[REDACTED]; point base_url there, "
        "or set follow_redirects: true for this provider"
    )


@pytest.mark.parametrize("status", [307, 308])
async def test_a_provider_that_allows_it_follows_307_and_308_with_the_post(serve, status: int) -> None:
    elsewhere: list[str] = []
    other = await serve(recording_stream(elsewhere))
    url = await serve(redirecting_handler(status, f"{other}/chat/completions", []))
    sample = await probe(url, follow_redirects=True)
    assert sample.ok, sample.error_message
    assert sample.http_status == 200
    assert len(elsewhere) == 1 and elsewhere[0].startswith("POST /v1/chat/completions ")
    assert int(elsewhere[0].split()[-1]) > 0  # the body went along


@pytest.mark.parametrize("status", [301, 302, 303])
async def test_a_redirect_that_would_turn_the_post_into_a_get_is_never_followed(serve, status: int) -> None:
    elsewhere: list[str] = []
    other = await serve(recording_stream(elsewhere))
    url = await serve(redirecting_handler(status, f"{other}/chat/completions", []))
    sample = await probe(url, follow_redirects=True)
    assert sample.error is ErrorClass.REDIRECT
    assert elsewhere == []
    assert sample.error_message is not None and "would turn the POST into a GET" in sample.error_message


async def test_a_redirect_loop_stops_after_a_few_hops(serve) -> None:
    asked: list[str] = []
    url = await serve(redirecting_handler(307, "/v1/chat/completions", asked))
    sample = await probe(url, follow_redirects=True)
    assert sample.error is ErrorClass.REDIRECT
    assert len(asked) == 6
    assert sample.error_message is not None and "after 5 redirects already followed" in sample.error_message


# --- the phase a failure happened in --------------------------------------------------------------


async def test_a_server_that_accepts_and_never_answers_is_no_head_in_time_not_a_connect_timeout(raw_serve) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the request, answers nothing, until the client goes

    url = await raw_serve(answer)
    sample = await probe(url, timeouts=Timeouts(connect=0.2, first_token=0.8, total=3))
    assert sample.error is ErrorClass.TIMEOUT_FIRST_TOKEN
    assert sample.error_message == (
        "connected, but no response headers within 0.8 s of sending; the server accepted the request and "
        "never answered (overloaded or hung), or raise timeout_s.first_token"
    )
    assert sample.total_ms is not None and 750 <= sample.total_ms < 1500
    assert sample.connect_ms is not None


async def test_headers_dripped_at_a_byte_a_second_hit_the_first_token_deadline(raw_serve) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for byte in CHUNKED_HEAD:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(), 1)
                return  # the client went away
            except TimeoutError:
                continue

    sample = await probe(await raw_serve(answer), timeouts=Timeouts(connect=0.2, first_token=1.5, total=3))
    assert sample.error is ErrorClass.TIMEOUT_FIRST_TOKEN
    assert sample.error_message is not None and sample.error_message.startswith(
        "connected, but no response headers within 1.5 s"
    )
    assert sample.total_ms is not None and 1450 <= sample.total_ms < 3000


async def test_a_full_listen_queue_is_still_a_connect_timeout() -> None:
    # A listener that never accepts, its queue filled: the kernel drops further SYNs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        await asyncio.sleep(0.1)
        sample = await probe(f"http://127.0.0.1:{port}/v1", timeouts=Timeouts(connect=0.3, first_token=1, total=2))
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert sample.error is ErrorClass.TIMEOUT_CONNECT
    assert sample.error_message is not None and sample.error_message.startswith("no connection within 0.3 s")
    assert sample.total_ms is not None and sample.total_ms < 900


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 2xx OK\r\nContent-Type: text/event-stream\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(300)) + b"\r\n",
    ],
    ids=["bad-status-line", "not-http", "oversized-header", "too-many-headers"],
)
async def test_a_broken_response_head_is_a_protocol_error(raw_serve, head: bytes) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        await writer.drain()
        await reader.read()

    url = await raw_serve(answer)
    sample = await probe(url, api_key=SECRET)
    assert sample.error is ErrorClass.PROTOCOL, sample.error_message
    assert sample.error_message is not None
    assert sample.error_message.startswith(f"{url} answered with broken HTTP (")
    assert sample.total_ms is not None and sample.total_ms < 1000


@pytest.mark.parametrize(("configured", "expected"), [({}, False), ({"follow_redirects": True}, True)])
def test_following_redirects_is_a_per_provider_setting_off_by_default(configured: dict, expected: bool) -> None:
    from monitor.probe.plan import endpoint_for
    from monitor.probe.proxy import ProxyEnvironment
    from monitor.probe.settings import Provider

    provider = Provider.model_validate({"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat", **configured})
    assert endpoint_for(provider, ProxyEnvironment()).follow_redirects is expected


# --- what the server says about itself, and tool calls ---------------------------------------------


async def test_the_servers_own_headers_are_kept_with_the_sample(serve) -> None:
    headers = {
        "openai-processing-ms": "412",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-remaining-tokens": "1499850",
        "server-timing": "gfet4t7; dur=245",
        "request-id": "req_ignored_when_x_request_id_is_there",
    }
    sample = await probe(await serve(streaming_handler([(0, content("a")), (0, DONE)], headers=headers)))
    assert sample.ok, sample.error_message
    assert sample.request_id == "req-42"
    assert sample.server_processing_ms == 412.0
    assert (sample.ratelimit_remaining_requests, sample.ratelimit_remaining_tokens) == (9999, 1499850)
    assert sample.server_timing == "gfet4t7; dur=245"
    assert sample.retry_after is None


async def test_a_429_keeps_its_retry_after_and_odd_header_values_are_dropped(serve) -> None:
    headers = {
        "Retry-After": "20",
        "openai-processing-ms": "nan",
        "x-ratelimit-remaining-requests": "-1",
        "x-ratelimit-remaining-tokens": "lots",
        "server-timing": "x" * 5000,
    }
    sample = await probe(await serve(error_handler(429, {"error": {"message": "slow down"}}, headers)))
    assert sample.error is ErrorClass.RATE_LIMITED
    assert sample.retry_after == "20"
    assert sample.server_processing_ms is None
    assert (sample.ratelimit_remaining_requests, sample.ratelimit_remaining_tokens) == (None, None)
    assert sample.server_timing is not None and len(sample.server_timing) == 300


def tool_call_delta(arguments: str, *, first: bool = False) -> bytes:
    call: dict[str, object] = {"index": 0, "function": {"arguments": arguments}}
    if first:
        call.update(id="call_1", type="function", function={"name": "get_weather", "arguments": arguments})
    return chunk({"tool_calls": [call]})


async def test_the_first_tool_call_token_is_timed_beside_ttft(serve) -> None:
    script = [
        (0, ROLE),
        (0.04, content("Let me look that up.")),
        (0.06, tool_call_delta("", first=True)),
        (0.02, tool_call_delta('{"city": "Par')),
        (0, tool_call_delta('is"}')),
        (0, DONE),
    ]
    sample = await probe(await serve(streaming_handler(script)))
    assert sample.ok, sample.error_message
    assert sample.ttft_ms is not None and 40 <= sample.ttft_ms < 90
    assert sample.first_tool_call_ms is not None and 100 <= sample.first_tool_call_ms < 170
    assert sample.token_events == 4


async def test_without_a_tool_call_there_is_no_tool_call_time(serve) -> None:
    sample = await probe(await serve(streaming_handler([(0, ROLE), (0, content("a")), (0, DONE)])))
    assert sample.ok and sample.first_tool_call_ms is None


@pytest.mark.parametrize(
    ("api", "events"),
    [
        (
            "anthropic-messages",
            [
                b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
                b'"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}\n\n',
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                b'"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": "}}\n\n',
                b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
            ],
        ),
        (
            "openai-responses",
            [
                b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,'
                b'"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":""}}\n\n',
                b"event: response.function_call_arguments.delta\n"
                b'data: {"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,'
                b'"delta":"{\\"city\\":"}\n\n',
                b'event: response.completed\ndata: {"type":"response.completed","response":{"status":"completed"}}\n\n',
            ],
        ),
        (
            "gemini",
            [
                b'data: {"candidates":[{"content":{"parts":[{"functionCall":{"name":"get_weather",'
                b'"args":{"city":"Paris"}}}],"role":"model"},"finishReason":"STOP","index":0}]}\r\n\r\n',
            ],
        ),
    ],
)
async def test_a_tool_call_is_timed_in_every_api_with_tools(serve, api: str, events: list[bytes]) -> None:
    script: Script = [(0.05, events[0]), *[(0, event) for event in events[1:]]]
    sample = await probe(await serve(streaming_handler(script)), api=api)
    assert sample.ok, sample.error_message
    assert sample.first_tool_call_ms is not None and sample.first_tool_call_ms >= 50
    assert sample.first_tool_call_ms == sample.ttft_ms == sample.ttfa_ms


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", lambda data: gzip.compress(data[:500]) + gzip.compress(data[500:])),  # two members
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, no zlib header
    ],
    ids=["gzip-two-members", "deflate", "raw-deflate"],
)
@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_the_decoder_gives_the_same_bytes_however_the_body_is_cut(encoding: str, packed, piece: int) -> None:
    from monitor.probe.inflate import Inflater

    data = b"".join(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(300))
    body = packed(data)
    inflater = Inflater(encoding, step=1000)
    out = b"".join(b"".join(inflater.feed(body[i : i + piece])) for i in range(0, len(body), piece))
    assert out == data
