"""The unit tier's rule, enforced: a test here opens no socket and starts no process.

While a unit test's fixtures are set up and while it runs, connecting or binding a socket (asyncio's
create_connection and create_server go through them) and starting a process (subprocess, asyncio's
subprocesses, os.fork, posix_spawn, os.system) raise. socket.socketpair stays free: asyncio's event
loop wakes itself through one. Teardown is left alone: the session's fixtures of other tiers (the
simulator, the databases) may be torn down after the last unit test, and they must stop cleanly.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest

MESSAGE = "unit tests may not open sockets or processes: move this test to tests/integration or tests/e2e"


def _refusal(what: str) -> Callable[..., NoReturn]:
    def refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{MESSAGE} (it called {what})")

    return refuse


def _guarded() -> pytest.MonkeyPatch:
    """Every way out of the process, refused until `undo()`."""
    guard = pytest.MonkeyPatch()
    for method in ("connect", "connect_ex", "bind"):
        guard.setattr(socket.socket, method, _refusal(f"socket.{method}"))
    # Every subprocess.Popen, asyncio's subprocesses included, starts its child here.
    guard.setattr(subprocess.Popen, "_execute_child", _refusal("subprocess.Popen"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            guard.setattr(os, name, _refusal(f"os.{name}"))
    return guard


def _refusing() -> Iterator[None]:
    """A hook wrapper's body: the guard up around the wrapped phase, down after it."""
    guard = _guarded()
    try:
        return (yield)
    finally:
        guard.undo()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _refusing())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _refusing())
