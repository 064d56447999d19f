"""Real Prometheus, promtool and Pushgateway for the tests: Debian's `prometheus` and
`prometheus-pushgateway` packages, installed with apt-get when missing (the tests run as root on CI).
When that is impossible the tests that need them are skipped, and the terminal summary says so loudly.

PYTEST_DONT_REWRITE: the test modules import helpers from here before `pytest_plugins` loads it.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import apt, banners
from tests.support.ports import free_port

PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
PUSHGATEWAY = Path("/usr/bin/prometheus-pushgateway")
PACKAGES = {PROMETHEUS: "prometheus", PROMTOOL: "prometheus", PUSHGATEWAY: "prometheus-pushgateway"}


def require(binary: Path) -> Path:
    """`binary`, installed from its Debian package when missing; skips the test when that fails."""
    if not binary.exists():
        package = PACKAGES[binary]
        reason = apt.install(package, binary)
        if reason is not None:
            message = f"a Prometheus test was skipped: {binary} is missing and {reason}"
            banners.add("PROMETHEUS TESTS SKIPPED", message)
            pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def promtool() -> Path:
    return require(PROMTOOL)


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return require(PROMETHEUS)


@pytest.fixture(scope="session")
def pushgateway_binary() -> Path:
    return require(PUSHGATEWAY)


def http(url: str, *, method: str = "GET", data: bytes | None = None, timeout: float = 5) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class Peer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


def start_peer(command: list[str], *, url: str, log: Path, ready_path: str = "/-/ready", timeout: float = 20) -> Peer:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http(url + ready_path, timeout=1)[0] == 200:
                return Peer(url, process, log)
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop_peer(Peer(url, process, log))
            raise AssertionError(f"{command[0]} did not become ready:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop_peer(peer: Peer) -> None:
    if peer.process.poll() is None:
        peer.process.terminate()
        try:
            peer.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            peer.process.kill()
            peer.process.wait()


@pytest.fixture
def pushgateway(pushgateway_binary: Path, tmp_path: Path) -> Iterator[Peer]:
    """A Pushgateway on a free loopback port, nothing persisted."""
    port = free_port()
    peer = start_peer(
        [str(pushgateway_binary), f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="],
        url=f"http://127.0.0.1:{port}",
        log=tmp_path / "pushgateway.log",
    )
    yield peer
    stop_peer(peer)


def promtool_check_metrics(promtool: Path, exposition: str) -> str:
    """promtool's lint findings for an exposition (empty when clean)."""
    done = subprocess.run(
        [str(promtool), "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=30
    )
    return (done.stdout + done.stderr).strip() if done.returncode else ""
