"""When a request's last bytes arrived, stamped before aiohttp parses and routes it.

aiohttp spends a few hundred microseconds (on a small VM) between reading a request off the
socket and calling its handler. Counting TTFT from the handler would make every first token,
as a client sees it, late by that much; counting from the bytes' arrival keeps the simulator's
configured TTFT close to what a client measures.

Where the listener reads with the kernel's arrival stamps (`monitor/kernel_clock.py`, Linux), the
stamp is when the bytes reached the socket: a request that waited in the receive queue while the
simulator's loop was busy (a benchmark loading the machine) is timed from its arrival, as a real
server's queue would be, and the wait is not counted against the client that measured it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from monitor.kernel_clock import KernelStampedSocket
from monitor.sim.latency import Clock


class ArrivalStamps:
    """Last-data time per connection, for the protocols made by `wrap`; empty when serving elsewhere."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last_data_ns: dict[asyncio.BaseProtocol, int] = {}

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server` that stamps data on its way to `factory`'s protocols."""

        def make() -> asyncio.Protocol:
            return _StampingProtocol(factory(), self)

        return make

    def last_data_ns(self, protocol: asyncio.BaseProtocol | None) -> int | None:
        """When `protocol` last received data; a handler that has read its whole body gets its arrival."""
        return None if protocol is None else self._last_data_ns.get(protocol)

    def _received(self, protocol: asyncio.BaseProtocol, sock: KernelStampedSocket | None) -> None:
        # The kernel's stamp is on perf_counter_ns: only comparable when that is the simulator's clock.
        kernel = sock is not None and sock.kernel_stamped and self._clock is time.perf_counter_ns
        self._last_data_ns[protocol] = sock.arrival_ns if kernel and sock is not None else self._clock()

    def _closed(self, protocol: asyncio.BaseProtocol) -> None:
        self._last_data_ns.pop(protocol, None)


class _StampingProtocol(asyncio.Protocol):
    """Passes every event through to `inner`, noting when data arrives."""

    def __init__(self, inner: asyncio.Protocol, stamps: ArrivalStamps) -> None:
        self._inner = inner
        self._stamps = stamps
        self._sock: KernelStampedSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio hands out its socket wrapped (`TransportSocket`); the wrapped one is `_sock`.
        raw = getattr(transport.get_extra_info("socket"), "_sock", None)
        self._sock = raw if isinstance(raw, KernelStampedSocket) else None
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._stamps._received(self._inner, self._sock)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stamps._closed(self._inner)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
