"""The timed stream: one request, every phase stamped on one monotonic clock.

Stamps are taken when bytes arrive, before any parsing, with `time.perf_counter_ns`. All phase
durations are measured from the moment the request body is handed to the socket (`sent`), so a
sample on a fresh connection and one on a reused connection measure the same thing; connection
set-up (DNS, TCP, TLS, pool wait) is recorded separately in `dns_ms`, `connect_ms`, `tls_ms` and
`setup_ms`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import itertools
import json
import math
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohappyeyeballs
import aiohttp
from aiohttp.client_exceptions import (
    ClientConnectorCertificateError,
    ClientConnectorError,
    ClientConnectorSSLError,
    ClientSSLError,
)
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from monitor.config.urls import api_url
from monitor.probe.apis import ApiFlavor, EventKind, MalformedEvent, RequestParams
from monitor.probe.result import ErrorClass, Sample
from monitor.probe.sse import SSEError, SSEParser
from monitor.probe.stats import percentile
from monitor.redact import redact, redact_fields

Clock = Callable[[], int]
# Sample fields holding text that came from the server (or names its URL): a hostile server can echo
# the key into any of them, headers included, so all are redacted before a sample is stored or logged.
SERVER_TEXT_FIELDS = ("error_message", "served_model", "request_id", "retry_after", "server_timing")
MAX_ERROR_BODY = 2000
# A body is parsed once it has arrived, once this much is waiting (well below aiohttp's read-buffer
# high-water mark, 2 x read_bufsize, where it pauses the socket), and at least this often, so an
# error event is seen soon even when the server then holds the connection open.
DRAIN_AT_BYTES = 32 * 1024
DRAIN_EVERY_S = 0.25
# Compressed bodies are decoded, because the SDKs real clients use (httpx under openai and
# anthropic) ask for gzip and deflate too: a gateway that compresses, and may buffer while it does,
# is part of what users wait for. Stamps stay on the compressed bytes' arrival. Decoding goes in
# steps of DECODE_STEP bytes straight into the SSE parser (whose line length is bounded), and stops
# at a bound (see _Inflater), so a compression bomb costs bounded memory and time.
ACCEPT_ENCODING = "gzip, deflate"
DECODE_STEP = 16 * 1024
MAX_DECODED_BYTES = 64 * 1024 * 1024
DECODE_FREE_BYTES = 64 * 1024
MAX_EXPANSION = 100
# 307 and 308 repeat the POST; 301, 302 and 303 would turn it into a GET, which is no probe.
REPEATING_REDIRECTS = frozenset({307, 308})
MAX_REDIRECTS = 5


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 10.0
    first_token: float = 60.0
    total: float = 300.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to send: everything about a provider the probe needs, secrets included."""

    base_url: str
    flavor: ApiFlavor
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    ssl: ssl.SSLContext | bool = True
    # Everything else that must never reach a sample: header values, credentials in base_url.
    secrets: tuple[str, ...] = ()
    follow_redirects: bool = False

    @property
    def url(self) -> str:
        return api_url(self.base_url, self.flavor.path)

    def url_for(self, params: RequestParams) -> str:
        """The request URL: the API's path goes before any query in base_url, and the queries merge."""
        return api_url(self.base_url, self.flavor.path_for(params))

    def __repr__(self) -> str:  # never show the key
        return f"Endpoint({self.base_url!r}, {self.flavor.name})"


@dataclass(slots=True)
class _Stamps:
    """Monotonic nanosecond stamps of one request; filled by trace hooks and the read loop."""

    request_start: int = 0
    dns_start: int | None = None
    dns_end: int | None = None
    conn_start: int | None = None
    tcp_end: int | None = None
    conn_end: int | None = None
    reused: bool = False
    sent: int | None = None


_current_stamps: contextvars.ContextVar[_Stamps | None] = contextvars.ContextVar("ttft_probe_stamps", default=None)


class _StampingProtocol(ResponseHandler):
    """Stamps every arrival of body bytes in `data_received`, before anything else looks at them.

    Each record says: the response body up to byte offset N had arrived at monotonic time T. The
    stream is parsed from these records in slices (`watch`'s `take` callback decides when), so
    parsing never delays a stamp: under load the loop runs every queued callback before it gets to
    a socket's read, and a task woken per event to parse it would sit in that queue ahead of other
    streams' reads. `watch` also tells the reader when the body is complete or broken, so it needs
    no wake-up per event at all.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: collections.deque[tuple[int, int]] = collections.deque()
        self._stamped_payload: Any = None
        self.head_arrived: int | None = None  # when the current response's head was complete
        self._last_stamp = 0
        self._watched: aiohttp.StreamReader | None = None
        self._settled: asyncio.Future[None] | None = None
        self._take: Callable[[bool], None] | None = None

    def data_received(self, data: bytes) -> None:
        # An empty call is aiohttp resuming a paused read: it parses bytes that came with an earlier
        # call, so they carry that call's stamp (never one earlier than their arrival).
        stamp = time.perf_counter_ns() if data else self._last_stamp
        self._last_stamp = stamp
        super().data_received(data)
        payload = getattr(self, "_payload", None)
        if payload is not None:
            if payload is not self._stamped_payload:
                # A new response: these bytes completed its head.
                self._stamped_payload = payload
                self.head_arrived = stamp
                self.arrivals.clear()
            self.arrivals.append((payload.total_bytes, stamp))
        if self._take is not None:
            # aiohttp pauses the socket when too much (or too many pieces) waits unread; once
            # paused nothing arrives, so the reader must take the buffer now.
            self._take(getattr(self, "_reading_paused", False))
            self._check_settled()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._take is not None and self._watched is not None and self._watched.exception() is None:
            # aiohttp is about to fail the unfinished body, and a failed StreamReader no longer
            # hands out what it holds: the reader takes those bytes (the tokens before the break) now.
            self._take(True)
        super().connection_lost(exc)
        self._check_settled()

    def arrivals_of(self, content: aiohttp.StreamReader) -> collections.deque[tuple[int, int]]:
        """The arrival record of `content`; empty if this connection has since moved on to another body."""
        return self.arrivals if content is self._stamped_payload else collections.deque()

    def head_arrival_of(self, content: aiohttp.StreamReader) -> int | None:
        return self.head_arrived if content is self._stamped_payload else None

    def watch(self, content: aiohttp.StreamReader, take: Callable[[bool], None]) -> asyncio.Future[None]:
        """A future that resolves once `content` has all its bytes, or has failed.

        `take(force)` runs after each arrival, with force=True when the buffered bytes must be read
        now; it must not raise.
        """
        self._watched = content
        self._take = take
        self._settled = asyncio.get_running_loop().create_future()
        self._check_settled()
        return self._settled

    def settle(self) -> None:
        """Resolve the watch early: the reader has seen enough (an error event, a malformed stream)."""
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    def unwatch(self) -> None:
        self._watched = None
        self._take = None
        self._settled = None

    def _check_settled(self) -> None:
        content, settled = self._watched, self._settled
        if content is None or settled is None or settled.done():
            return
        if content.is_eof() or content.exception() is not None or self.transport is None:
            settled.set_result(None)


class _TimedConnector(aiohttp.TCPConnector):
    """A TCPConnector that stamps the end of the TCP handshake, so TLS time can be told apart.

    aiohttp does TCP and TLS in one `create_connection` call; this splits it in two: connect the
    socket (as aiohttp does, with happy eyeballs), stamp, then let the loop do the TLS handshake.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(_StampingProtocol, loop=self._loop)  # type: ignore[assignment]

    async def _wrap_create_connection(  # type: ignore[override]
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
        client_error: type[Exception] = ClientConnectorError,
        **kwargs: Any,
    ) -> Any:
        stamps = _current_stamps.get()
        try:
            async with asyncio.timeout(timeout.sock_connect):
                sock = await aiohappyeyeballs.start_connection(
                    addr_infos=addr_infos,
                    local_addr_infos=self._local_addr_infos,
                    happy_eyeballs_delay=self._happy_eyeballs_delay,
                    interleave=self._interleave,
                    loop=self._loop,
                    socket_factory=self._socket_factory,
                )
                if stamps is not None:
                    stamps.tcp_end = time.perf_counter_ns()
                return await self._loop.create_connection(*args, **kwargs, sock=sock)
        except ssl.CertificateError as exc:
            raise ClientConnectorCertificateError(req.connection_key, exc) from exc
        except ssl.SSLError as exc:
            raise ClientConnectorSSLError(req.connection_key, exc) from exc
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc


def _trace_config() -> aiohttp.TraceConfig:
    def stamps() -> _Stamps | None:
        return _current_stamps.get()

    async def dns_start(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        if (st := stamps()) is not None:
            st.dns_start = time.perf_counter_ns()

    async def dns_end(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        if (st := stamps()) is not None:
            st.dns_end = time.perf_counter_ns()

    async def conn_start(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        if (st := stamps()) is not None:
            st.conn_start = time.perf_counter_ns()

    async def conn_end(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        if (st := stamps()) is not None:
            st.conn_end = time.perf_counter_ns()

    async def reuse(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        if (st := stamps()) is not None:
            st.reused = True

    async def chunk_sent(_s: Any, _c: SimpleNamespace, _p: Any) -> None:
        # Called just before each body chunk is written to the transport; the last one wins.
        if (st := stamps()) is not None:
            st.sent = time.perf_counter_ns()

    config = aiohttp.TraceConfig()
    config.on_dns_resolvehost_start.append(dns_start)
    config.on_dns_resolvehost_end.append(dns_end)
    config.on_connection_create_start.append(conn_start)
    config.on_connection_create_end.append(conn_end)
    config.on_connection_reuseconn.append(reuse)
    config.on_request_chunk_sent.append(chunk_sent)
    return config


def _stamped_pieces(
    chunk: bytes, offset: int, arrivals: collections.deque[tuple[int, int]], fallback: int
) -> list[tuple[int, bytes]]:
    """Cut `chunk` (body bytes from `offset` on) where its bytes arrived at different times.

    `arrivals` holds (body bytes received so far, stamp) from the protocol; bytes with no record
    (a protocol without stamps) get `fallback`, the time the reader returned them.
    """
    end = offset + len(chunk)
    pieces: list[tuple[int, bytes]] = []
    start = offset
    while arrivals and start < end:
        total, stamp = arrivals[0]
        if total <= start:
            arrivals.popleft()
            continue
        cut = min(total, end)
        pieces.append((stamp, chunk[start - offset : cut - offset]))
        start = cut
        if total <= end:
            arrivals.popleft()
    if start < end:
        pieces.append((fallback, chunk[start - offset :]))
    return pieces


class BodyDecodeError(Exception):
    """A compressed body that cannot be decoded (PROTOCOL) or decodes past the bound (MALFORMED_STREAM)."""

    def __init__(self, error: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error = error


class _Inflater:
    """Incremental gzip/deflate decoding in bounded steps: compressed bytes in, decoded pieces out.

    Bounded twice: in all (MAX_DECODED_BYTES), and in expansion, past a first DECODE_FREE_BYTES
    (at most MAX_EXPANSION decoded bytes per compressed byte consumed). Event streams compress
    about 10 to 1 (a degenerate one repeating one token, under 100 to 1) while a bomb expands about
    1000 to 1: caught after some 80 KiB, before the parser spends a second on it.
    """

    def __init__(self, encoding: str, *, limit: int = MAX_DECODED_BYTES, step: int = DECODE_STEP) -> None:
        self.encoding = encoding
        self._limit = limit
        self._step = step
        self._decoded = 0
        self._consumed = 0  # compressed bytes the decoder has taken
        self._inflate: Any = None  # made on the first bytes: deflate may come with or without its zlib header
        self._first = b""

    def _new(self, first: bytes) -> Any:
        if self.encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # RFC 9110 deflate is zlib-wrapped; some servers send raw deflate, as browsers tolerate.
        wrapped = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)

    def _check(self, data: bytes, inflate: Any) -> None:
        consumed = self._consumed + len(data) - len(inflate.unconsumed_tail)
        if self._decoded > self._limit:
            raise BodyDecodeError(
                ErrorClass.MALFORMED_STREAM,
                f"the {self.encoding} body decodes to more than {self._limit // (1024 * 1024)} MiB "
                "(a compression bomb, or a runaway stream); lower max_tokens or fix the server",
            )
        if self._decoded > DECODE_FREE_BYTES + MAX_EXPANSION * consumed:
            raise BodyDecodeError(
                ErrorClass.MALFORMED_STREAM,
                f"the {self.encoding} body expands more than {MAX_EXPANSION} times (a compression bomb); "
                "the server's answer was not decoded further",
            )

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._inflate is None and self.encoding == "deflate" and len(self._first + data) < 2:
            self._first += data  # not enough to tell a zlib header from raw deflate yet
            return
        data, self._first = self._first + data, b""
        try:
            while data:
                if self._inflate is None:
                    self._inflate = self._new(data)
                inflate = self._inflate
                fed = data
                out = inflate.decompress(fed, self._step)
                # Output may be pending inside zlib even once the input is used up: ask until a short step.
                while True:
                    if out:
                        self._decoded += len(out)
                        self._check(fed, inflate)
                        yield out
                    if not inflate.unconsumed_tail and len(out) < self._step:
                        break
                    self._consumed += len(fed) - len(inflate.unconsumed_tail)
                    fed = inflate.unconsumed_tail
                    out = inflate.decompress(fed, self._step)
                self._consumed += len(fed) - len(inflate.unconsumed_tail) - len(inflate.unused_data)
                # gzip allows several members back to back; anything after the end starts the next.
                data = inflate.unused_data if inflate.eof and self.encoding == "gzip" else b""
                if data:
                    self._inflate = None
        except zlib.error as exc:
            raise BodyDecodeError(
                ErrorClass.PROTOCOL,
                f"the body says Content-Encoding: {self.encoding} but does not decode ({exc}); "
                "the server or a proxy garbles compressed responses",
            ) from exc


def _inflater(resp: aiohttp.ClientResponse) -> _Inflater | None:
    """The decoder the response's Content-Encoding needs; None for identity. Raises for one not asked for."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Inflater("gzip")
    if encoding == "deflate":
        return _Inflater("deflate")
    raise BodyDecodeError(
        ErrorClass.PROTOCOL,
        f"the server sent Content-Encoding: {encoding[:40]}, which was not asked for "
        f"(Accept-Encoding: {ACCEPT_ENCODING}); check headers: in the provider or the proxy in between",
    )


_BAD_BODY = (MalformedEvent, SSEError, BodyDecodeError)


def _bad_body(exc: Exception, api_key: str | None) -> tuple[ErrorClass, str]:
    if isinstance(exc, BodyDecodeError):
        return exc.error, redact(str(exc), [api_key])
    return ErrorClass.MALFORMED_STREAM, redact(f"malformed stream: {exc}", [api_key])


class _EventReader:
    """Turns stamped body bytes into the sample's token times: SSE parsing and per-API classification.

    Every event carries the arrival stamp of the bytes that completed it. Pure bookkeeping, no I/O;
    raises MalformedEvent or SSEError for a stream that is not what the API promises.
    """

    def __init__(self, flavor: ApiFlavor, sample: Sample, api_key: str | None) -> None:
        self.flavor = flavor
        self.sample = sample
        self.api_key = api_key
        self.parser = SSEParser()
        self.token_stamps: list[int] = []
        self.first_event: int | None = None
        self.first_answer: int | None = None
        self.first_tool_call: int | None = None
        self.done = False
        self.stopped = False  # an error event ended the stream; later bytes are ignored

    def feed(self, arrived: int, data: bytes) -> None:
        if self.stopped:
            return
        sample = self.sample
        for event in self.parser.feed(data):
            if self.first_event is None:
                self.first_event = arrived
            try:
                info = self.flavor.classify(event)
            except (TypeError, KeyError, IndexError, AttributeError) as exc:
                # JSON of an unexpected shape ({"choices": 5}); the API promised otherwise.
                raise MalformedEvent(
                    f"event of an unexpected shape ({type(exc).__name__}): {event.data[:80]!r}"
                ) from exc
            if info.served_model:
                sample.served_model = info.served_model
            if info.prompt_tokens is not None:
                sample.prompt_tokens = info.prompt_tokens
            if info.cached_tokens is not None:
                sample.cached_tokens = info.cached_tokens
            if info.completion_tokens is not None:
                sample.completion_tokens = info.completion_tokens
            kind = info.kind
            if kind is EventKind.ANSWER or kind is EventKind.REASONING or kind is EventKind.TOOL_CALL:
                self.token_stamps.append(arrived)
                if kind is not EventKind.REASONING and self.first_answer is None:
                    self.first_answer = arrived
                if kind is EventKind.TOOL_CALL and self.first_tool_call is None:
                    self.first_tool_call = arrived
            elif kind is EventKind.DONE:
                self.done = True
            if info.finished:
                self.done = True
            elif kind is EventKind.ERROR:
                sample.error = ErrorClass.STREAM_ERROR
                sample.error_message = redact(
                    f"error event in the stream after {len(self.token_stamps)} tokens: {info.error_message}",
                    [self.api_key],
                )
                self.stopped = True
                return


class _Body:
    """The response body as it arrives: bytes with their arrival stamps, fed to an `_EventReader`.

    Parsed in slices, off the path of every stamp: at the end of the body; every DRAIN_EVERY_S, so
    an error event or a malformed one ends the probe soon even if the server then holds the
    connection open; once DRAIN_AT_BYTES pile up; and at once when aiohttp pauses the socket or
    the connection breaks.
    """

    def __init__(
        self,
        resp: aiohttp.ClientResponse,
        reader: _EventReader,
        stamping: _StampingProtocol | None,
        inflater: _Inflater | None = None,
    ) -> None:
        self.content = resp.content
        self.reader = reader
        self.inflater = inflater
        self.protocol = stamping if resp.connection is not None else None  # only a live connection is watched
        self._arrivals = stamping.arrivals_of(self.content) if stamping is not None else collections.deque()
        self._consumed = 0
        self._draining = False
        self.failure: Exception | None = None  # why the stream is malformed, found by a drain in a callback

    def take(self, force: bool = False) -> None:
        """The protocol's callback after each arrival (and the periodic tick's): parse when it is time.

        Never raises: a malformed stream is kept in `failure` and ends the watch.
        """
        if self.failure is not None or self.reader.stopped:
            return
        if not force and self.content.total_bytes - self._consumed < DRAIN_AT_BYTES:
            return
        try:
            self.drain()
        except _BAD_BODY as exc:
            self.failure = exc
        except Exception:
            # The payload's own error (a broken connection): the task meets it on its next drain.
            # Nothing may raise into aiohttp's protocol callbacks.
            pass
        if (self.failure is not None or self.reader.stopped) and self.protocol is not None:
            self.protocol.settle()

    def drain(self) -> None:
        """Feed the reader every byte that has arrived so far, each piece with its arrival stamp.

        Raises a malformed stream, or the payload's error (a broken connection) once what arrived
        before it is read.
        """
        if self._draining:  # reading may resume a paused protocol, which calls back into `take`
            return
        self._draining = True
        try:
            if self.failure is not None:
                raise self.failure
            content = self.content
            if content.exception() is None:
                chunk = content.read_nowait()
                now = time.perf_counter_ns()
                for at, piece in _stamped_pieces(chunk, self._consumed, self._arrivals, now):
                    self.feed(at, piece)
                self._consumed += len(chunk)
            failure = content.exception()
            if failure is not None and not self.reader.stopped:
                raise failure
        except _BAD_BODY as exc:
            self.failure = exc
            raise
        finally:
            self._draining = False

    def feed(self, arrived: int, data: bytes) -> None:
        """Body bytes that arrived at `arrived`, decoded first if compressed: decoded bytes keep that stamp."""
        inflater = self.inflater
        if inflater is None:
            self.reader.feed(arrived, data)
            return
        reader = self.reader
        for piece in inflater.feed(data):
            reader.feed(arrived, piece)
            if reader.stopped:
                return

    async def read(self, first_token_by: float) -> None:
        """Wait for the whole body (a token must have arrived by loop time `first_token_by`), then parse it.

        Raises _Deadline(TIMEOUT_FIRST_TOKEN) if no token had arrived by then; the caller's own
        deadline bounds the total.
        """
        protocol = self.protocol
        if protocol is None:
            if self.content.is_eof():
                self.drain()
            else:
                await self._read_in_task(first_token_by)
            return
        loop = asyncio.get_running_loop()
        settled = protocol.watch(self.content, self.take)
        tick: asyncio.TimerHandle | None = None

        def on_tick() -> None:
            nonlocal tick
            self.take(True)
            tick = loop.call_later(DRAIN_EVERY_S, on_tick) if not settled.done() else None

        tick = loop.call_later(DRAIN_EVERY_S, on_tick)
        try:
            remaining = first_token_by - loop.time()
            if not settled.done() and remaining > 0:
                await asyncio.wait([settled], timeout=remaining)
            if not settled.done():
                self.drain()
                if self.reader.stopped:
                    return
                if not self.reader.token_stamps:
                    raise _Deadline(ErrorClass.TIMEOUT_FIRST_TOKEN)
            await settled
            self.drain()
        except asyncio.CancelledError:
            # The total deadline (or shutdown): read what did arrive, so the sample counts its tokens
            # and sees an error event or a malformed one that came before the wait (kept in `failure`).
            with contextlib.suppress(Exception):
                self.drain()
            raise
        finally:
            if tick is not None:
                tick.cancel()
            protocol.unwatch()

    async def _read_in_task(self, first_token_by: float) -> None:
        """The plain way, for a body without stamping protocol: bytes get the time this task reads them."""
        while not self.reader.stopped:
            if self.reader.token_stamps:
                chunk = await self.content.readany()
            else:
                try:
                    async with asyncio.timeout_at(first_token_by):
                        chunk = await self.content.readany()
                except TimeoutError:
                    raise _Deadline(ErrorClass.TIMEOUT_FIRST_TOKEN) from None
            if not chunk:
                break
            self.feed(time.perf_counter_ns(), chunk)


def _stamping_protocol(resp: aiohttp.ClientResponse) -> _StampingProtocol | None:
    # When the whole body came with the head, aiohttp has already put the connection back in the
    # pool; its protocol (which aiohttp keeps as `_protocol`) still holds the arrival stamps.
    protocol = resp.connection.protocol if resp.connection is not None else getattr(resp, "_protocol", None)
    return protocol if isinstance(protocol, _StampingProtocol) else None


def _head_arrival(resp: aiohttp.ClientResponse, protocol: _StampingProtocol | None) -> int:
    """When the response head arrived, from the protocol's stamps; now, if it kept none."""
    stamp = protocol.head_arrival_of(resp.content) if protocol is not None else None
    return stamp if stamp is not None else time.perf_counter_ns()


HEADER_TEXT_CAP = 300


def _header_text(value: str | None) -> str | None:
    return value[:HEADER_TEXT_CAP] if value else None


def _header_number(value: str | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) and number >= 0 else None


def _header_count(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 19 else None


def _record_server_headers(headers: Any, sample: Sample) -> None:
    """What the server says about itself, when it does: kept per sample to tell where the time went."""
    get = headers.get
    sample.request_id = _header_text(get("x-request-id") or get("request-id"))
    sample.server_processing_ms = _header_number(get("openai-processing-ms"))
    sample.ratelimit_remaining_requests = _header_count(get("x-ratelimit-remaining-requests"))
    sample.ratelimit_remaining_tokens = _header_count(get("x-ratelimit-remaining-tokens"))
    sample.retry_after = _header_text(get("retry-after"))
    sample.server_timing = _header_text(get("server-timing"))


def _tokens(reader: _EventReader | None) -> int:
    return len(reader.token_stamps) if reader is not None else 0


def _ms(start: int | None, end: int | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) / 1e6


class _Deadline(Exception):
    def __init__(self, error: ErrorClass) -> None:
        self.error = error


class ProbeClient:
    """Owns the HTTP session. `fresh=True` opens a new connection (and DNS lookup) per sample."""

    def __init__(self, *, fresh: bool = False) -> None:
        self.fresh = fresh
        connector = _TimedConnector(
            limit=0,  # concurrency is capped by the caller, per provider, where it is configured
            force_close=fresh,
            use_dns_cache=not fresh,
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            trace_configs=[_trace_config()],
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def probe(self, endpoint: Endpoint, params: RequestParams, prompt: str, sample: Sample) -> Sample:
        """Send one streaming request and fill `sample` in place. Never raises for a failed probe."""
        body = json.dumps(endpoint.flavor.build_body(prompt, params), ensure_ascii=False).encode()
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": ACCEPT_ENCODING,  # said outright, not left to the HTTP library's default
            **endpoint.headers,
            **endpoint.flavor.auth_headers(endpoint.api_key),
        }
        sample.prompt_chars = len(prompt)
        stamps = _Stamps()
        token = _current_stamps.set(stamps)
        try:
            await self._run(endpoint, endpoint.url_for(params), body, headers, stamps, sample)
        finally:
            _current_stamps.reset(token)
        # Servers echo keys back, in any encoding; nothing of the endpoint's secrets is stored.
        redact_fields(sample, SERVER_TEXT_FIELDS, (endpoint.api_key, *endpoint.secrets))
        return sample

    async def _run(
        self,
        endpoint: Endpoint,
        url: str,
        body: bytes,
        headers: dict[str, str],
        stamps: _Stamps,
        sample: Sample,
    ) -> None:
        timeouts = endpoint.timeouts
        loop = asyncio.get_running_loop()
        sample.sent_at = datetime.now(UTC)
        stamps.request_start = time.perf_counter_ns()
        start_loop_time = loop.time()
        phase = ErrorClass.TIMEOUT_CONNECT
        reader: _EventReader | None = None
        stream: _Body | None = None
        headers_at: int | None = None
        try:
            async with asyncio.timeout_at(start_loop_time + timeouts.first_token) as deadline:
                resp = await self._send(endpoint, url, body, headers)
                stamping = _stamping_protocol(resp)
                headers_at = _head_arrival(resp, stamping)
                phase = ErrorClass.TIMEOUT_FIRST_TOKEN
                async with resp:
                    sample.http_status = resp.status
                    _record_server_headers(resp.headers, sample)
                    if resp.status >= 400:
                        await self._record_http_error(resp, endpoint, sample)
                        return
                    if 300 <= resp.status < 400:
                        sample.error = ErrorClass.REDIRECT
                        sample.error_message = redact(_redirect_message(resp, endpoint), [endpoint.api_key])
                        return
                    ctype = resp.headers.get("Content-Type", "")
                    if "text/event-stream" not in ctype:
                        sample.error = ErrorClass.MALFORMED_STREAM
                        sample.error_message = (
                            f"server answered {resp.status} with {ctype or 'no content type'}, not an event "
                            "stream; check that the endpoint supports stream: true and the base_url is right"
                        )
                        return
                    reader = _EventReader(endpoint.flavor, sample, endpoint.api_key)
                    stream = _Body(resp, reader, stamping, _inflater(resp))
                    # The first-token deadline is checked by `stream.read`; this one now bounds the total.
                    phase = ErrorClass.TIMEOUT_TOTAL
                    deadline.reschedule(start_loop_time + timeouts.total)
                    await stream.read(first_token_by=start_loop_time + timeouts.first_token)
        except TimeoutError:
            if stream is not None and stream.failure is not None:
                # What arrived before the deadline was malformed: that is the outcome, not the wait.
                sample.error, sample.error_message = _bad_body(stream.failure, endpoint.api_key)
            elif reader is None or not reader.stopped:  # else an error event came first: that is the outcome
                if phase is ErrorClass.TIMEOUT_CONNECT and _connected(stamps):
                    # Connected and sent, but no response head by the first-token deadline: the wait
                    # was the server's, under that deadline, not the connect timeout's.
                    sample.error = ErrorClass.TIMEOUT_FIRST_TOKEN
                    sample.error_message = _no_head_message(timeouts)
                else:
                    sample.error = phase
                    sample.error_message = self._timeout_message(phase, timeouts, _tokens(reader))
        except _Deadline as exc:
            sample.error = exc.error
            sample.error_message = self._timeout_message(exc.error, timeouts, _tokens(reader))
        except _BAD_BODY as exc:
            sample.error, sample.error_message = _bad_body(exc, endpoint.api_key)
        except aiohttp.ClientError as exc:
            if headers_at is None:
                sample.error, sample.error_message = _classify_request_error(exc, endpoint)
            else:
                sample.error = ErrorClass.STREAM_ERROR
                sample.error_message = (
                    f"the connection broke mid-stream after {_tokens(reader)} tokens "
                    f"({type(exc).__name__}); the server or a proxy cut the response"
                )
        finally:
            self._finish(sample, endpoint, stamps, headers_at, reader)

    async def _send(
        self, endpoint: Endpoint, first_url: str, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """POST and return the response once its head is in; 307/308 followed only when the provider says so.

        aiohttp's own following is off: it turns a POST into a GET on 301/302 and would report the
        new host's answer as the endpoint's.
        """
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=endpoint.timeouts.connect)
        url: str | URL = first_url
        for hop in range(MAX_REDIRECTS + 1):
            try:
                resp = await self._session.post(
                    url, data=body, headers=headers, ssl=endpoint.ssl, timeout=timeout, allow_redirects=False
                )
            except TimeoutError:
                # aiohttp's own sock_connect timeout; ours surfaces at the caller's `async with` instead.
                raise _Deadline(ErrorClass.TIMEOUT_CONNECT) from None
            target = _redirect_target(resp)
            if not endpoint.follow_redirects or target is None or resp.status not in REPEATING_REDIRECTS:
                return resp
            if hop == MAX_REDIRECTS:
                return resp
            resp.release()
            url = target
        raise AssertionError("unreachable")  # pragma: no cover

    def _finish(
        self,
        sample: Sample,
        endpoint: Endpoint,
        stamps: _Stamps,
        headers_at: int | None,
        reader: _EventReader | None,
    ) -> None:
        end = time.perf_counter_ns()
        token_stamps = reader.token_stamps if reader is not None else []
        first_event = reader.first_event if reader is not None else None
        first_answer = reader.first_answer if reader is not None else None
        first_tool_call = reader.first_tool_call if reader is not None else None
        done = reader.done if reader is not None else False
        sent = stamps.sent if stamps.sent is not None else stamps.request_start
        sample.sent_mono_ns = sent
        sample.connection_reused = stamps.reused if stamps.conn_start is not None or stamps.reused else None
        if not stamps.reused:
            sample.dns_ms = _ms(stamps.dns_start, stamps.dns_end)
            if stamps.tcp_end is not None:
                sample.connect_ms = _ms(stamps.conn_start, stamps.tcp_end)
                if stamps.conn_end is not None and endpoint.base_url.startswith("https:"):
                    sample.tls_ms = _ms(stamps.tcp_end, stamps.conn_end)
            else:
                sample.connect_ms = _ms(stamps.conn_start, stamps.conn_end)
        sample.setup_ms = _ms(stamps.request_start, sent)
        sample.ttfb_ms = _ms(sent, headers_at)
        sample.first_event_ms = _ms(sent, first_event)
        if token_stamps:
            sample.ttft_ms = _ms(sent, token_stamps[0])
            sample.ttfa_ms = _ms(sent, first_answer)
            sample.first_tool_call_ms = _ms(sent, first_tool_call)
            sample.token_events = len(token_stamps)
            if len(token_stamps) > 1:
                gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(token_stamps)]
                gaps.sort()
                sample.gap_p50_ms = percentile(gaps, 50, presorted=True)
                sample.gap_p95_ms = percentile(gaps, 95, presorted=True)
                sample.gap_max_ms = gaps[-1]
                decode_s = (token_stamps[-1] - token_stamps[0]) / 1e9
                tokens = sample.completion_tokens or len(token_stamps)
                if decode_s > 0 and tokens > 1:
                    sample.decode_tps = (tokens - 1) / decode_s
        sample.total_ms = _ms(sent, end)
        if sample.error is None and sample.http_status is not None and sample.http_status < 400:
            if not token_stamps:
                sample.error = ErrorClass.EMPTY_RESPONSE
                sample.error_message = (
                    "the stream ended without a single generated token"
                    + ("" if done else " and without its end marker")
                    + "; check max_tokens and that the model generates for this prompt"
                )
            elif not done:
                sample.error = ErrorClass.STREAM_ERROR
                sample.error_message = (
                    f"the stream ended after {len(token_stamps)} tokens without its end marker "
                    "([DONE] or message_stop); the server or a proxy cut the response"
                )

    @staticmethod
    def _timeout_message(phase: ErrorClass, timeouts: Timeouts, tokens: int) -> str:
        if phase is ErrorClass.TIMEOUT_CONNECT:
            return f"no connection within {timeouts.connect:g} s; check the host and port, or raise timeout_s.connect"
        if phase is ErrorClass.TIMEOUT_FIRST_TOKEN:
            return (
                f"no token within {timeouts.first_token:g} s of sending; the server is overloaded or hung, "
                "or raise timeout_s.first_token for long prompts"
            )
        return (
            f"the stream did not finish within {timeouts.total:g} s ({tokens} tokens so far); lower "
            "max_tokens or raise timeout_s.total"
        )

    async def _record_http_error(self, resp: aiohttp.ClientResponse, endpoint: Endpoint, sample: Sample) -> None:
        try:
            raw = await resp.content.read(MAX_ERROR_BODY)
        except aiohttp.ClientError:
            raw = b""
        try:
            inflater = _inflater(resp)
            if inflater is not None:
                raw = next(_Inflater(inflater.encoding, step=MAX_ERROR_BODY).feed(raw), b"")
        except BodyDecodeError:
            raw = b"(a compressed body that does not decode)"
        text = raw.decode("utf-8", errors="replace")
        message = _server_message(text)
        status = resp.status
        error = _classify_status(status, message)
        sample.error = error
        hint = _STATUS_HINTS.get(error, "")
        retry_after = resp.headers.get("Retry-After")
        if retry_after and error is ErrorClass.RATE_LIMITED:
            hint = f"{hint} (Retry-After: {retry_after})"
        text = f"HTTP {status}: {message}" + (f"; {hint}" if hint else "")
        sample.error_message = redact(text, [endpoint.api_key])


_STATUS_HINTS = {
    ErrorClass.AUTH: "check the API key (api_key_env / api_key_file) and that it is allowed this model",
    ErrorClass.MODEL_NOT_FOUND: "check the model name (ask GET /v1/models) and the provider's base_url",
    ErrorClass.RATE_LIMITED: "the provider is throttling; lower rounds or concurrency, or probe less often",
    ErrorClass.BAD_REQUEST: "the server rejected the request; check params.extra_body, or set "
    "include_usage: false if it rejects stream_options",
    ErrorClass.SERVER_ERROR: "the server failed; this is the provider's side",
}


def _server_message(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err.get("type") or err)[:300]
        if isinstance(err, str):
            return err[:300]
        detail = obj.get("detail") or obj.get("message")
        if detail:
            return str(detail)[:300]
    return text[:300]


def _classify_status(status: int, message: str) -> ErrorClass:
    lowered = message.lower()
    if status in (401, 403):
        return ErrorClass.AUTH
    if status == 404:
        return ErrorClass.MODEL_NOT_FOUND
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status >= 500:
        return ErrorClass.SERVER_ERROR
    if "model" in lowered and ("not exist" in lowered or "not found" in lowered or "unknown" in lowered):
        return ErrorClass.MODEL_NOT_FOUND
    return ErrorClass.BAD_REQUEST


def _connected(stamps: _Stamps) -> bool:
    return stamps.reused or stamps.conn_end is not None or stamps.sent is not None


def _no_head_message(timeouts: Timeouts) -> str:
    return (
        f"connected, but no response headers within {timeouts.first_token:g} s of sending; the server "
        "accepted the request and never answered (overloaded or hung), or raise timeout_s.first_token"
    )


def _redirect_target(resp: aiohttp.ClientResponse) -> URL | None:
    location = resp.headers.get("Location")
    if not 300 <= resp.status < 400 or not location:
        return None
    try:
        return resp.url.join(URL(location))
    except ValueError:
        return None


def _redirect_message(resp: aiohttp.ClientResponse, endpoint: Endpoint) -> str:
    status = resp.status
    target = _redirect_target(resp)
    if target is None:
        return f"HTTP {status} redirect without a usable Location; check base_url"
    where = f"HTTP {status} redirect to {target}"
    if not endpoint.follow_redirects:
        return f"{where}; point base_url there, or set follow_redirects: true for this provider"
    if status not in REPEATING_REDIRECTS:
        return f"{where}, which would turn the POST into a GET; point base_url there (only 307 and 308 are followed)"
    return f"{where} after {MAX_REDIRECTS} redirects already followed; point base_url at the final address"


def _classify_request_error(exc: aiohttp.ClientError, endpoint: Endpoint) -> tuple[ErrorClass, str]:
    host = endpoint.base_url
    dns_error = getattr(aiohttp, "ClientConnectorDNSError", None)
    if (dns_error is not None and isinstance(exc, dns_error)) or isinstance(
        getattr(exc, "os_error", None), socket.gaierror
    ):
        return ErrorClass.DNS, f"cannot resolve the host of {host}; check the hostname in base_url"
    if isinstance(exc, ClientConnectorCertificateError):
        return ErrorClass.TLS, (
            f"TLS certificate of {host} not trusted ({exc.certificate_error}); set tls.ca_file to the CA that signed it"
        )
    if isinstance(exc, (ClientConnectorSSLError, ClientSSLError)):
        return ErrorClass.TLS, f"TLS handshake with {host} failed; check that the port speaks https"
    if isinstance(exc, ClientConnectorError):
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return ErrorClass.CONNECT, f"cannot connect to {host}: {reason}; is the server running on that port?"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ErrorClass.CONNECT, f"{host} closed the connection before answering"
    if isinstance(exc, aiohttp.ClientResponseError):
        # aiohttp's parser refused the response head: a bad status line, oversized or broken headers.
        detail = " ".join(str(exc.message).split())[:200] or type(exc).__name__
        return ErrorClass.PROTOCOL, redact(
            f"{host} answered with broken HTTP ({detail}); the port may speak another protocol, "
            "or a proxy in between garbles responses",
            [endpoint.api_key],
        )
    return ErrorClass.CONNECT, f"request to {host} failed: {type(exc).__name__}"
