"""The aiohttp internals the probe client leans on, checked against the installed aiohttp.

The client stamps arrivals inside aiohttp's connection protocol and splits TCP from TLS inside its
connector (monitor/probe/aiohttp_hooks.py explains each hook where it is used). These are private parts,
so pyproject pins the aiohttp range this suite runs on; this file fails loudly, naming the hook,
when an allowed aiohttp moves one of them, instead of letting the client fall back to a less exact
clock unnoticed.
"""

from __future__ import annotations

import asyncio
import inspect

import aiohttp
import pytest
from aiohttp.client_proto import ResponseHandler

from monitor.probe import aiohttp_hooks


async def test_the_response_handler_keeps_the_body_payload_and_the_paused_flag() -> None:
    handler = ResponseHandler(loop=asyncio.get_running_loop())
    # `_payload` is the StreamReader of the response being read; `_reading_paused` is set when
    # aiohttp pauses the socket because too much waits unread.
    assert hasattr(handler, "_payload"), "aiohttp ResponseHandler no longer has _payload"
    assert hasattr(handler, "_reading_paused"), "aiohttp ResponseHandler no longer has _reading_paused"
    assert handler._payload is None and handler._reading_paused is False


def test_the_connector_has_the_hook_that_splits_tcp_from_tls() -> None:
    hook = getattr(aiohttp.TCPConnector, "_wrap_create_connection", None)
    assert hook is not None, "aiohttp TCPConnector no longer has _wrap_create_connection"
    parameters = inspect.signature(hook).parameters
    for name in ("addr_infos", "req", "timeout", "client_error"):
        assert name in parameters, f"TCPConnector._wrap_create_connection lost its {name!r} parameter"
    init = inspect.signature(aiohttp.TCPConnector.__init__).parameters
    assert "socket_factory" in init, "TCPConnector no longer takes socket_factory (client passes it on)"


async def test_a_connector_instance_carries_the_attributes_the_client_reads() -> None:
    connector = aiohttp.TCPConnector()
    try:
        for name in ("_socket_factory", "_local_addr_infos", "_happy_eyeballs_delay", "_interleave", "_factory"):
            assert hasattr(connector, name), f"aiohttp TCPConnector instance has no {name}"
    finally:
        await connector.close()


def test_a_client_response_keeps_its_protocol_after_release() -> None:
    # A body that arrived with the head is read after aiohttp has released the connection; the
    # protocol (and its stamps) is then reachable only as ClientResponse._protocol.
    source = inspect.getsource(aiohttp.ClientResponse)
    assert "self._protocol" in source, "aiohttp ClientResponse no longer keeps _protocol"


def test_the_client_uses_the_stamping_protocol_for_its_connections() -> None:
    assert issubclass(aiohttp_hooks.StampingProtocol, ResponseHandler)
    assert issubclass(aiohttp_hooks.TimedConnector, aiohttp.TCPConnector)


@pytest.fixture(autouse=True)
def _aiohttp_in_the_pinned_range() -> None:
    major, minor = (int(part) for part in aiohttp.__version__.split(".")[:2])
    assert (major, minor) == (3, 14), (
        f"aiohttp {aiohttp.__version__} is outside the range this suite was written for (3.14.x); "
        "check every hook in this file, then widen the pin in pyproject.toml"
    )


def test_the_connector_hands_every_connection_through_connect_with_its_protocol() -> None:
    # The stale-connection retry reads, in `TimedConnector.connect`, the protocol of the connection a
    # request took (pooled or new) and how many bytes it had received, to tell later whether any answered.
    parameters = list(inspect.signature(aiohttp.BaseConnector.connect).parameters)
    assert parameters == ["self", "req", "traces", "timeout"], f"BaseConnector.connect is now {parameters}"
    assert isinstance(getattr(aiohttp.connector.Connection, "protocol", None), property), (
        "aiohttp Connection no longer has a protocol property"
    )
