"""aiohttp instrumentation: where the probe's clock is read, inside aiohttp's connection machinery.

Stamps are taken when bytes arrive, before any parsing, with `time.perf_counter_ns`. Public
aiohttp gives request-phase trace hooks (`trace_config`), but no stamp per arrival of body bytes
and no split between the TCP and the TLS handshake, so this module leans on aiohttp internals.
Each is explained once, where it is used:

- `ResponseHandler._payload` and `ResponseHandler._reading_paused` (`StampingProtocol.data_received`)
- `TCPConnector._factory` (`TimedConnector.__init__`)
- `TCPConnector._wrap_create_connection`, with `_loop`, `_local_addr_infos`, `_happy_eyeballs_delay`,
  `_interleave` and `_socket_factory` (`TimedConnector._wrap_create_connection`)
- `ClientResponse._protocol` (`stamping_protocol`)
- `BaseConnector.connect` returning the `Connection` with its `protocol` (`TimedConnector.connect`)

pyproject pins the aiohttp range they were checked on; tests/integration/test_aiohttp_contract.py fails,
naming the hook, when an allowed aiohttp moves one.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import itertools
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohappyeyeballs
import aiohttp
from aiohttp.client_exceptions import (
    ClientConnectorCertificateError,
    ClientConnectorError,
    ClientConnectorSSLError,
)
from aiohttp.client_proto import ResponseHandler

from monitor import kernel_clock

# The aiohttp range these hooks were checked on: pyproject.toml pins the same (a test compares them).
SUPPORTED_AIOHTTP = ">=3.14,<3.15"
_SUPPORTED_FROM, _SUPPORTED_BELOW = (3, 14), (3, 15)


def aiohttp_supported(version: str) -> bool:
    """Whether an aiohttp version (`3.14.5`, `3.14.0rc1`) is inside SUPPORTED_AIOHTTP."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            return False
        parts.append(int(digits))
    return _SUPPORTED_FROM <= tuple(parts) < _SUPPORTED_BELOW


@dataclass(slots=True)
class Stamps:
    """Monotonic nanosecond stamps of one request; filled by trace hooks and the read loop."""

    request_start: int = 0
    dns_start: int | None = None
    dns_end: int | None = None
    conn_start: int | None = None
    tcp_end: int | None = None
    conn_end: int | None = None
    reused: bool = False
    sent: int | None = None
    # The connection's protocol and how many bytes it had received when this request took it, so a
    # failure can tell whether any byte of the answer arrived (`stale_connection`).
    protocol: StampingProtocol | None = None
    received_before: int = 0

    def restart(self) -> None:
        """Forget the failed attempt's connection and send; the retry's phases are its own."""
        self.dns_start = self.dns_end = self.conn_start = self.tcp_end = self.conn_end = self.sent = None
        self.reused = False
        self.protocol = None
        self.received_before = 0


current_stamps: contextvars.ContextVar[Stamps | None] = contextvars.ContextVar("ttft_probe_stamps", default=None)


class StampingProtocol(ResponseHandler):
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
        self.received = 0  # bytes this connection ever received (`Stamps.received_before`)
        # The connection's socket when it reads with the kernel's arrival stamps (kernel_clock);
        # set by TimedConnector once the connection is made.
        self.kernel_clock: kernel_clock.KernelStampedSocket | None = None
        # Whether every stamp of the current response came from the kernel.
        self.kernel_stamped = False
        # Kernel arrival stamp -> when the loop read those bytes, for the current response: how late a
        # read was is what a first token read together with later packets may carry.
        self.read_at: dict[int, int] = {}

    def data_received(self, data: bytes) -> None:
        # An empty call is aiohttp resuming a paused read: it parses bytes that came with an earlier
        # call, so they carry that call's stamp (never one earlier than their arrival).
        if data:
            stamp, from_kernel = self._arrival()
        else:
            stamp, from_kernel = self._last_stamp, self.kernel_stamped
        self._last_stamp = stamp
        self.received += len(data)
        before = getattr(self, "_payload", None)
        super().data_received(data)
        # aiohttp hook: `_payload` is the StreamReader of the response being read (None until its
        # head is parsed), the body the bytes just went to.
        payload = getattr(self, "_payload", None)
        if payload is None and before is not None and before is self._stamped_payload:
            # These bytes ended the body, and a connection that is not kept (`force_close`: the probe's
            # fresh connections; `Connection: close`) was released and closed inside that call, which
            # drops `_payload`: they went to the body it had.
            payload = before
        if payload is not None:
            if payload is not self._stamped_payload:
                # A new response: these bytes completed its head.
                self._stamped_payload = payload
                self.head_arrived = stamp
                self.arrivals.clear()
                self.read_at.clear()
                self.kernel_stamped = from_kernel
            else:
                self.kernel_stamped = self.kernel_stamped and from_kernel
            self.arrivals.append((payload.total_bytes, stamp))
            if from_kernel and data and self.kernel_clock is not None:
                self.read_at.setdefault(stamp, self.kernel_clock.read_ns)
        if self._take is not None:
            # aiohttp hook: `_reading_paused` is set when aiohttp pauses the socket because too much
            # (or too many pieces) waits unread; once paused nothing arrives, so the reader must
            # take the buffer now.
            self._take(getattr(self, "_reading_paused", False))
            self._check_settled()

    def _arrival(self) -> tuple[int, bool]:
        """When the bytes being handed over arrived, and whether the kernel said so.

        These bytes came from the socket's latest read (TLS: its plaintext, decrypted in the same
        call); with the kernel's stamps that is when they reached the socket, never earlier than the
        stamp before (stamps of one connection never go back).
        """
        clock = self.kernel_clock
        if clock is not None and clock.kernel_stamped:
            return max(clock.arrival_ns, self._last_stamp), True
        return time.perf_counter_ns(), False

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


class TimedConnector(aiohttp.TCPConnector):
    """A TCPConnector that stamps the end of the TCP handshake, so TLS time can be told apart.

    aiohttp does TCP and TLS in one `create_connection` call; this splits it in two: connect the
    socket (as aiohttp does, with happy eyeballs), stamp, then let the loop do the TLS handshake.
    """

    def __init__(self, *, kernel_stamps: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kernel_stamps = kernel_stamps
        self._stamping_keeper = kernel_clock.keep_stamping_on() if kernel_stamps else None
        # Watched since before any of this connector's connections; each new one starts from it.
        self._wall_clock = kernel_clock.WallClockOffset()
        self._wall_clock.observe()
        # aiohttp hook: `_factory` makes the protocol of each new connection; ours stamps arrivals.
        self._factory = functools.partial(StampingProtocol, loop=self._loop)  # type: ignore[assignment]

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:  # noqa: ASYNC109
        # aiohttp hook: the session takes every connection, pooled or new, through `connect`, in the
        # request's task (so `current_stamps` is this request's); the connection's `protocol` is ours.
        conn = await super().connect(req, traces, timeout)
        stamps = current_stamps.get()
        if stamps is not None:
            protocol = conn.protocol
            stamps.protocol = protocol if isinstance(protocol, StampingProtocol) else None
            stamps.received_before = stamps.protocol.received if stamps.protocol is not None else 0
        return conn

    async def close(self, *args: Any, **kwargs: Any) -> None:
        if self._stamping_keeper is not None:
            self._stamping_keeper.close()
            self._stamping_keeper = None
        await super().close(*args, **kwargs)

    async def _wrap_create_connection(
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
        client_error: type[Exception] = ClientConnectorError,
        **kwargs: Any,
    ) -> Any:
        # aiohttp hook: the connector calls `_wrap_create_connection` to open each connection, TLS
        # included. This is aiohttp's own body split in two, reading the connector's settings
        # (`_loop`, `_local_addr_infos`, `_happy_eyeballs_delay`, `_interleave`, `_socket_factory`)
        # as aiohttp does, and raising the errors aiohttp raises.
        stamps = current_stamps.get()
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
                stamped = _kernel_stamped(sock, self._wall_clock) if self._kernel_stamps else None
                transport, protocol = await self._loop.create_connection(*args, **kwargs, sock=stamped or sock)
                if stamped is not None and isinstance(protocol, StampingProtocol):
                    protocol.kernel_clock = stamped
                return transport, protocol
        except ssl.CertificateError as exc:
            raise ClientConnectorCertificateError(req.connection_key, exc) from exc
        except ssl.SSLError as exc:
            raise ClientConnectorSSLError(req.connection_key, exc) from exc
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc


def _kernel_stamped(sock: Any, clock: kernel_clock.WallClockOffset) -> kernel_clock.KernelStampedSocket | None:
    """`sock`'s connection, reading with the kernel's arrival stamps and asking for its departure
    stamps; None where the kernel has none."""
    if not kernel_clock.supported() or not isinstance(sock, socket.socket) or sock.type != socket.SOCK_STREAM:
        return None
    try:
        return kernel_clock.KernelStampedSocket.adopt(sock, departures=True, clock=clock)
    except OSError:
        return None


def trace_config() -> aiohttp.TraceConfig:
    """aiohttp's public request trace hooks, writing into the current request's `Stamps`."""

    def stamps() -> Stamps | None:
        return current_stamps.get()

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


def stale_connection(stamps: Stamps, exc: BaseException) -> bool:
    """Whether `exc` is a pooled connection that had been closed under the request: it was reused, broke
    (closed or reset) before a single byte of the answer arrived. Safe to send again: the server never
    answered, and a server closing an idle connection has not taken the request."""
    if not stamps.reused or stamps.protocol is None:
        return False
    if isinstance(exc, ClientConnectorError) or not isinstance(
        exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError
    ):
        return False
    return stamps.protocol.received == stamps.received_before


def departure(stamps: Stamps, head_at: int | None) -> int | None:
    """When the request's last byte left, by the kernel's transmit stamp (monotonic ns), or None.

    A stamp before `stamps.sent` (taken just before the last write) is an earlier request's on the
    same connection, and one after the response's head arrived cannot be this request's: neither is
    used, and the start stays the probe's own stamp."""
    protocol = stamps.protocol
    sock = protocol.kernel_clock if protocol is not None else None
    if sock is None or not sock.departures or stamps.sent is None:
        return None
    departed = sock.drain_departures()
    if departed is None or departed < stamps.sent or (head_at is not None and departed > head_at):
        return None
    return departed


def stamping_protocol(resp: aiohttp.ClientResponse) -> StampingProtocol | None:
    """The protocol that stamped `resp`'s bytes; None when it is not ours (then nothing was stamped)."""
    # aiohttp hook: when the whole body came with the head, aiohttp has already put the connection
    # back in the pool; its protocol, kept on the response as `_protocol`, still holds the stamps.
    protocol = resp.connection.protocol if resp.connection is not None else getattr(resp, "_protocol", None)
    return protocol if isinstance(protocol, StampingProtocol) else None


def head_arrival(resp: aiohttp.ClientResponse, protocol: StampingProtocol | None) -> int:
    """When the response head arrived, from the protocol's stamps; now, if it kept none."""
    stamp = protocol.head_arrival_of(resp.content) if protocol is not None else None
    return stamp if stamp is not None else time.perf_counter_ns()
