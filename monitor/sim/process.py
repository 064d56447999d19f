"""The simulator in a child process, for `probe --with-sim` and the demo: measuring a server on our own event
loop would skew TTFT."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@contextmanager
def simulator_process(port: int) -> Iterator[None]:
    """`ttft-monitor sim` on 127.0.0.1:`port` for the duration; a server already listening there is used."""
    if port_open("127.0.0.1", port):
        print(f"using the server already listening on 127.0.0.1:{port}", file=sys.stderr)
        yield
        return
    child = subprocess.Popen(
        [sys.executable, "-m", "monitor", "sim", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while not port_open("127.0.0.1", port):
            if child.poll() is not None or time.monotonic() > deadline:
                err = child.stderr.read().decode(errors="replace") if child.stderr else ""
                raise RuntimeError(f"the simulator did not start on port {port}: {err.strip()[-300:]}")
            time.sleep(0.05)
        yield
    finally:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
