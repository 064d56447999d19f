"""The response body as it arrives: stamped bytes sliced, decoded and parsed into the sample's token times.

The protocol (`aiohttp_hooks.StampingProtocol`) records when each byte arrived; `Body` slices what
arrived into pieces carrying those stamps (`stamped_pieces`), decodes them if compressed
(`inflate`), and feeds them to an `EventReader`, which parses SSE and classifies each event with
the API flavour.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from collections.abc import Sequence

import aiohttp

from monitor.probe.aiohttp_hooks import StampingProtocol
from monitor.probe.apis import ApiFlavor, EventKind, MalformedEvent
from monitor.probe.errors import BAD_BODY, Deadline
from monitor.probe.inflate import Inflater
from monitor.probe.result import ErrorClass, Sample
from monitor.probe.sse import SSEParser
from monitor.servertext import SERVER_TEXT_CAP, capped

# The data of each answer event of the request being read, when it is a canary's (monitor/probe/canary.py
# sets it around its request); None, and nothing kept, for every measured probe.
current_answer: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "ttft_monitor_canary_answer", default=None
)

# A body is parsed once it has arrived, once this much is waiting (well below aiohttp's read-buffer
# high-water mark, 2 x read_bufsize, where it pauses the socket), and at least this often, so an
# error event is seen soon even when the server then holds the connection open.
DRAIN_AT_BYTES = 32 * 1024
DRAIN_EVERY_S = 0.25


def stamped_pieces(
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


def estimated_reasoning_tokens(*, reasoning_events: int, token_events: int, completion_tokens: int | None) -> int:
    """Reasoning tokens when the API does not count them (Anthropic, vLLM): the reasoning events' share
    of the output the server counted, since a server may pack several tokens into one event; without a
    count, one token per event."""
    if completion_tokens is None or token_events <= 0:
        return reasoning_events
    return round(completion_tokens * reasoning_events / token_events)


class EventReader:
    """Turns stamped body bytes into the sample's token times: SSE parsing and per-API classification.

    Every event carries the arrival stamp of the bytes that completed it. Pure bookkeeping, no I/O;
    raises MalformedEvent or SSEError for a stream that is not what the API promises.
    """

    def __init__(self, flavor: ApiFlavor, sample: Sample, secrets: Sequence[str | None]) -> None:
        self.flavor = flavor
        self.sample = sample
        self.secrets = secrets
        self.parser = SSEParser()
        self.token_stamps: list[int] = []
        self.reasoning_events = 0  # token events on the reasoning channel, for an estimate of its tokens
        self.first_event: int | None = None
        self.first_answer: int | None = None
        self.first_tool_call: int | None = None
        self.done = False
        self.stopped = False  # an error event ended the stream; later bytes are ignored
        self.answer = current_answer.get()  # a canary's: its answer events' data, else None

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
                    f"event of an unexpected shape ({type(exc).__name__}): {{quote}}", quote=event.data
                ) from exc
            if info.served_model and isinstance(info.served_model, str):  # `"model": 123` is no name
                sample.served_model = info.served_model
            if info.fingerprint:
                sample.fingerprint = info.fingerprint
            # Most events carry no counts (only the usage event does): the None checks spare four calls
            # of `_count` an event, eight events a probe; `_count(None)` is None anyway.
            if info.prompt_tokens is not None and (count := _count(info.prompt_tokens)) is not None:
                sample.prompt_tokens = count
            if info.cached_tokens is not None and (count := _count(info.cached_tokens)) is not None:
                sample.cached_tokens = count
            if info.completion_tokens is not None and (count := _count(info.completion_tokens)) is not None:
                sample.completion_tokens = count
            if info.reasoning_tokens is not None and (count := _count(info.reasoning_tokens)) is not None:
                sample.reasoning_tokens = count
            kind = info.kind
            if kind is EventKind.ANSWER or kind is EventKind.REASONING or kind is EventKind.TOOL_CALL:
                self.token_stamps.append(arrived)
                if kind is EventKind.REASONING:
                    self.reasoning_events += 1
                if kind is not EventKind.REASONING and self.first_answer is None:
                    self.first_answer = arrived
                if kind is EventKind.TOOL_CALL and self.first_tool_call is None:
                    self.first_tool_call = arrived
                if kind is EventKind.ANSWER and self.answer is not None:
                    self.answer.append(event.data)
            elif kind is EventKind.DONE:
                self.done = True
            if info.finished:
                self.done = True
            elif kind is EventKind.ERROR:
                sample.error = ErrorClass.STREAM_ERROR
                message = capped(info.error_message or "", SERVER_TEXT_CAP, self.secrets)
                sample.error_message = f"error event in the stream after {len(self.token_stamps)} tokens: {message}"
                self.stopped = True
                return


class Body:
    """The response body as it arrives: bytes with their arrival stamps, fed to an `EventReader`.

    Parsed in slices, off the path of every stamp: at the end of the body; every DRAIN_EVERY_S, so
    an error event or a malformed one ends the probe soon even if the server then holds the
    connection open; once DRAIN_AT_BYTES pile up; and at once when aiohttp pauses the socket or
    the connection breaks.
    """

    def __init__(
        self,
        resp: aiohttp.ClientResponse,
        reader: EventReader,
        stamping: StampingProtocol | None,
        inflater: Inflater | None = None,
    ) -> None:
        self.content = resp.content
        self.reader = reader
        self.inflater = inflater
        self.protocol = stamping if resp.connection is not None else None  # only a live connection is watched
        self._arrivals = stamping.arrivals_of(self.content) if stamping is not None else collections.deque()
        self._consumed = 0
        self._draining = False
        # Some bytes got the time this task read them, not their arrival stamp (see TimingPath): how many.
        self.task_read = False
        self.unstamped_bytes = 0
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
        except BAD_BODY as exc:
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
                arrivals = self._arrivals
                if chunk and (not arrivals or arrivals[-1][0] < self._consumed + len(chunk)):
                    self.task_read = True
                    recorded = max(arrivals[-1][0], self._consumed) if arrivals else self._consumed
                    self.unstamped_bytes += self._consumed + len(chunk) - recorded
                for at, piece in stamped_pieces(chunk, self._consumed, self._arrivals, now):
                    self.feed(at, piece)
                self._consumed += len(chunk)
            failure = content.exception()
            if failure is not None and not self.reader.stopped:
                raise failure
        except BAD_BODY as exc:
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

        Raises Deadline(TIMEOUT_FIRST_TOKEN) if no token had arrived by then; the caller's own
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
        ticks = _DrainTicks(loop, self, settled)
        try:
            remaining = first_token_by - loop.time()
            if not settled.done() and remaining > 0:
                await asyncio.wait([settled], timeout=remaining)
            if not settled.done():
                self.drain()
                if self.reader.stopped:
                    return
                if not self.reader.token_stamps:
                    raise Deadline(ErrorClass.TIMEOUT_FIRST_TOKEN)
            await settled
            self.drain()
        except asyncio.CancelledError:
            # The total deadline (or shutdown): read what did arrive, so the sample counts its tokens
            # and sees an error event or a malformed one that came before the wait (kept in `failure`).
            with contextlib.suppress(Exception):
                self.drain()
            raise
        finally:
            ticks.cancel()
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
                    raise Deadline(ErrorClass.TIMEOUT_FIRST_TOKEN) from None
            if not chunk:
                break
            self.task_read = True
            self.unstamped_bytes += len(chunk)
            self.feed(time.perf_counter_ns(), chunk)


class _DrainTicks:
    """Has `body` parse what arrived every DRAIN_EVERY_S until `settled`, or until cancelled.

    A callback that schedules itself again. As a closure that named itself it held the body, its reader and
    the stream in a reference cycle, a probe's garbage for the cyclic collector to find (about 20 objects a
    probe); here the one reference back is the pending timer's, and cancelling it drops it
    (tests/integration/test_probe_garbage.py)."""

    __slots__ = ("_body", "_handle", "_loop", "_settled")

    def __init__(self, loop: asyncio.AbstractEventLoop, body: Body, settled: asyncio.Future[None]) -> None:
        self._loop, self._body, self._settled = loop, body, settled
        self._handle: asyncio.TimerHandle | None = loop.call_later(DRAIN_EVERY_S, self._tick)

    def _tick(self) -> None:
        self._body.take(True)
        self._handle = None if self._settled.done() else self._loop.call_later(DRAIN_EVERY_S, self._tick)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _count(value: object) -> int | None:
    """A token count as the server said it, when it is one: `"12"`, `{"n": 12}`, `-5` or `2.5` is none
    (the calibration, the store and the detector do arithmetic on it), nor is 1e300; `12.0` is 12."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value < 2**31 else None  # the store's columns are 32-bit
