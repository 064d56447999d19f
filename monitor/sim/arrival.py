"""When a request's last bytes arrived, stamped before aiohttp parses and routes it.

aiohttp spends a few hundred microseconds (on a small VM) between reading a request off the
socket and calling its handler. Counting TTFT from the handler would make every first token,
as a client sees it, late by that much; counting from the bytes' arrival keeps the simulator's
configured TTFT close to what a client measures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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

    def _received(self, protocol: asyncio.BaseProtocol) -> None:
        self._last_data_ns[protocol] = self._clock()

    def _closed(self, protocol: asyncio.BaseProtocol) -> None:
        self._last_data_ns.pop(protocol, None)


class _StampingProtocol(asyncio.Protocol):
    """Passes every event through to `inner`, noting when data arrives."""

    def __init__(self, inner: asyncio.Protocol, stamps: ArrivalStamps) -> None:
        self._inner = inner
        self._stamps = stamps

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._stamps._received(self._inner)
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
