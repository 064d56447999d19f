"""tests/unit/conftest.py keeps this tier pure: a socket or a process fails the test with a message
that says where it belongs, while the event loop (its self-pipe is a socketpair) keeps working."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

REFUSED = r"unit tests may not open sockets or processes: move this test to tests/integration or tests/e2e"


def test_connecting_a_socket_is_refused() -> None:
    with socket.socket() as sock, pytest.raises(RuntimeError, match=REFUSED):
        sock.connect(("127.0.0.1", 9))


def test_listening_is_refused() -> None:
    with socket.socket() as sock, pytest.raises(RuntimeError, match=REFUSED):
        sock.bind(("127.0.0.1", 0))


async def test_asyncio_connections_and_servers_are_refused() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.open_connection("127.0.0.1", 9)
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.start_server(lambda _reader, _writer: None, "127.0.0.1", 0)


def test_a_child_process_is_refused() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(RuntimeError, match=REFUSED):
        os.system("true")


async def test_an_asyncio_child_process_is_refused() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")


async def test_the_event_loop_still_runs_and_socketpairs_still_work() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
    await asyncio.sleep(0)
    assert await asyncio.to_thread(lambda: 42) == 42
