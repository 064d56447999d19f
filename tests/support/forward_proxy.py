"""A small real forward proxy on loopback, for the proxy tests: CONNECT tunnels and absolute-form requests.

    async with ForwardProxy(hosts={"llm.proxied.test": ("127.0.0.1", port)}) as proxy:
        ...  # send with proxy=proxy.url; proxy.requests lists what it was asked for

Like a real egress proxy it resolves the names it is asked for itself (`hosts` first, so tests can
use names that resolve nowhere else, then the name as given), so a client that bypasses it fails
to resolve them. `credentials=(user, password)` makes it answer 407 without the right
Proxy-Authorization; `answer_502=True` makes it answer 502 to everything (a proxy that cannot reach
what it is asked for, as one on another host cannot reach this machine's loopback).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass


@dataclass
class ProxiedRequest:
    method: str
    target: str  # host:port for CONNECT, the absolute URL otherwise
    authorization: str | None  # the Proxy-Authorization header as received


class ForwardProxy:
    def __init__(
        self,
        *,
        hosts: dict[str, tuple[str, int]] | None = None,
        credentials: tuple[str, str] | None = None,
        answer_502: bool = False,
    ) -> None:
        self.hosts = hosts or {}
        self.credentials = credentials
        self.answer_502 = answer_502
        self.requests: list[ProxiedRequest] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _authorized(self, authorization: str | None) -> bool:
        if self.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        return authorization == expected

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ", 2)
        headers = [line for line in header_lines if line]
        authorization = next(
            (line.split(":", 1)[1].strip() for line in headers if line.lower().startswith("proxy-authorization:")),
            None,
        )
        self.requests.append(ProxiedRequest(method, target, authorization))
        if self.answer_502:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\nConnection: close\r\n\r\nbad gateway")
            await writer.drain()
            return
        if not self._authorized(authorization):
            writer.write(
                b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="test"\r\n'
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._resolve(host, int(port)))
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await self._relay(reader, writer, upstream_reader, upstream_writer)
            return
        # Absolute form: `POST http://host:port/path HTTP/1.1`. Rewritten to the origin form for the
        # first request; later requests on the connection pass through as sent (servers accept both).
        rest = target.split("://", 1)[1]
        authority, slash, path = rest.partition("/")
        host, _, port = authority.rpartition(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._resolve(host, int(port or 80)))
        kept = [line for line in headers if not line.lower().startswith("proxy-")]
        lines = [f"{method} {slash}{path} {version}", *kept, "", ""]
        upstream_writer.write("\r\n".join(lines).encode("latin-1"))
        await self._relay(reader, writer, upstream_reader, upstream_writer)

    def _resolve(self, host: str, port: int) -> tuple[str, int]:
        return self.hosts.get(host, (host, port))

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.close()

        try:
            await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))
        finally:
            upstream_writer.close()
