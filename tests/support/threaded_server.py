"""A small aiohttp server on its own thread and event loop, on a free loopback port: for tests whose
code under test runs in another process (the daemon, the CLI) or blocks the test's own loop.

A subclass sets ROUTE (one catch-all pattern) and writes `_handle`; start and stop it, or use it as a
context manager."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


class ThreadedServer:
    ROUTE = "/{tail:.*}"
    # How long stopping waits for requests still being answered (aiohttp's default is a minute).
    SHUTDOWN_TIMEOUT_S = 60.0

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(10), f"{type(self).__name__} did not start"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._runner is not None
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", self.ROUTE, self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=self.SHUTDOWN_TIMEOUT_S)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError
