"""A real TCP proxy that can cut or blackhole a peer, for fault tests and bench/faults.py.

It runs its own event loop in a thread, so synchronous tests, subprocess daemons and benchmarks
can all put it between a client and a server (PostgreSQL, a receiver, an endpoint):

    with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql+asyncpg://postgres@127.0.0.1:{proxy.port}/test"
        proxy.set_mode("blackhole")   # connections accept, nothing answers (a hung database)
        proxy.set_mode("cut")         # every connection is reset, new ones closed at once (database down)
        proxy.set_mode("pass")        # healthy again

Switching away from "pass" drops the connections that were open, as a real partition or server
restart would; switching back to "pass" drops blackholed connections too, so clients reconnect
instead of waiting forever on a connection that lost its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Literal

Mode = Literal["pass", "blackhole", "cut"]
MODES: tuple[Mode, ...] = ("pass", "blackhole", "cut")


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.mode: Mode = "pass"
        self.port = 0
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("tcp proxy did not start")
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_mode(self, mode: Mode) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        asyncio.run_coroutine_threadsafe(self._set_mode(mode), self._loop).result(10)

    # --- inside the proxy's loop -----------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_mode(self, mode: Mode) -> None:
        previous, self.mode = self.mode, mode
        if previous != mode:
            self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                transport = writer.transport
                # abort() sends RST: the peer sees a reset, as after a crash or a partition.
                transport.abort()
        self._writers.clear()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_all()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        try:
            if self.mode == "cut":
                writer.transport.abort()
                return
            if self.mode == "blackhole":
                await self._swallow(reader)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            self._writers.add(up_writer)
            try:
                await asyncio.gather(
                    self._pipe(reader, up_writer, writer),
                    self._pipe(up_reader, writer, up_writer),
                    return_exceptions=True,
                )
            finally:
                self._writers.discard(up_writer)
                up_writer.close()  # a stream writer left open warns (ResourceWarning) when collected
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, src_writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if self.mode != "pass":
                    # Blackholed mid-connection: hold the bytes, answer nothing.
                    await self._swallow(src)
                    return
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                if dst.can_write_eof():
                    dst.write_eof()
