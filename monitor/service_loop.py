"""The second event loop: everything the daemon serves, in its own thread, away from the probes.

The probes' loop (the main thread) times every request on its own: a stamp is taken when the loop
runs the connection's `data_received`, so any time the loop spends elsewhere lands in the TTFT it
stores. What the monitor serves to others (the UI and API, auth, `/metrics` rendering, health,
alert delivery, housekeeping) runs here instead, on its own database engine and HTTP session, and
can be as slow as its clients make it without moving a probe's clock. The two loops share only
thread-safe things: the Prometheus registry, plain attributes read for readiness, and wake-ups sent
with `call_soon_threadsafe` (docs/architecture.md, "Two loops").

CPython runs one thread's bytecode at a time; `PROBE_SWITCH_INTERVAL_S` makes the interpreter hand
the lock to a waiting thread within half a millisecond (the default is 5 ms), so a probe whose bytes
arrive while this thread renders a page waits at most that long for its stamp. What it did wait
is measured by the probes' own delay meter, not assumed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

PROBE_SWITCH_INTERVAL_S = 0.0005


def favour_waiting_threads() -> None:
    """Shorten the interpreter's switch interval (see the module docstring). Process-wide, once."""
    if sys.getswitchinterval() > PROBE_SWITCH_INTERVAL_S:
        sys.setswitchinterval(PROBE_SWITCH_INTERVAL_S)


class ServiceLoop:
    """An asyncio loop in a daemon thread. `start()` returns once it turns; `run(coro)` awaits a
    coroutine on it from another loop; `close(timeout)` stops it and joins the thread."""

    def __init__(self, name: str = "ttft-service") -> None:
        self._name = name
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "ServiceLoop.start() first"
        return self._loop

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def run(self, coroutine: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:  # noqa: ASYNC109
        """`coroutine`'s result, run on this loop; on `timeout` it is cancelled there and TimeoutError raised."""
        future = self.submit(coroutine)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """`callback(*args)` on this loop, from any thread; a no-op once the loop has stopped."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback, *args)

    def close(self, timeout: float = 5.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            structlog.get_logger().warning("service_loop_not_stopped", within_s=timeout)
