"""Kernel arrival stamps: a probe's TTFT does not move when the probes' own event loop is blocked.

The server runs in a thread of its own (blocking sockets), so it keeps to its schedule while the
probe's loop is held by `time.sleep`: the first token reaches the probe's socket on time and waits
there. Timed by the kernel's stamp the TTFT is the server's; timed when the loop reads it, it is the
block's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from monitor import kernel_clock
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.result import Sample, TimingPath
from monitor.probe.self_delay import LoopDelayMeter

pytestmark = [
    pytest.mark.skipif(not kernel_clock.supported(), reason="kernel arrival stamps are Linux's"),
    pytest.mark.solo,  # its figures are times within milliseconds: it runs while no other test runs
]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def token(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


PARAMS = RequestParams(model="m", max_tokens=8, temperature=0.0, extra_body={}, include_usage=False)


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# --- the conversion, pure ---------------------------------------------------------------------


def test_the_stamp_is_read_from_scm_timestampns_and_nothing_else() -> None:
    stamp = struct.pack("@qq", 12, 345)
    assert kernel_clock.kernel_wall_ns([(socket.SOL_SOCKET, kernel_clock.SO_TIMESTAMPNS, stamp)]) == 12_000_000_345
    assert kernel_clock.kernel_wall_ns([(socket.SOL_SOCKET, kernel_clock.SO_TIMESTAMPNS + 1, stamp)]) is None
    assert kernel_clock.kernel_wall_ns([(socket.SOL_SOCKET, kernel_clock.SO_TIMESTAMPNS, b"\0" * 4)]) is None
    assert kernel_clock.kernel_wall_ns([]) is None


# --- a server on its own thread, a blocked probe loop --------------------------------------------


class ThreadedSSE:
    """One HTTP/1.1 SSE answer per connection on a thread: head, then each (seconds after the request, bytes)."""

    def __init__(self, script: list[tuple[float, bytes]], ssl_context: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.ssl_context = ssl_context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received_at: list[float] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, raw: socket.socket) -> None:
        conn = self.ssl_context.wrap_socket(raw, server_side=True) if self.ssl_context else raw
        with conn, contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending = b""
            while True:  # one answer per request, on a kept connection
                while b"\r\n\r\n" not in pending:
                    more = conn.recv(65536)
                    if not more:
                        return
                    pending += more
                head, _, pending = pending.partition(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = int(next(h for h in lines if h.startswith(b"content-length:")).split(b":")[1])
                while len(pending) < length:
                    pending += conn.recv(65536)
                pending = pending[length:]
                start = time.monotonic()
                self.received_at.append(start)
                conn.sendall(HEAD + http_chunk(ROLE))
                for at, piece in self.script:
                    time.sleep(max(0.0, start + at - time.monotonic()))
                    conn.sendall(http_chunk(piece))
                conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def threaded() -> Iterator[list[ThreadedSSE]]:
    servers: list[ThreadedSSE] = []
    yield servers
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    folder: Path = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


async def probe_with_loop_blocked(
    url: str, *, block_at_s: float, block_s: float, kernel_stamps: bool, trust: ssl.SSLContext | bool = True
) -> Sample:
    """One probe while the probe's own loop is held from `block_at_s` after sending, for `block_s`."""
    endpoint = Endpoint(url, FLAVORS["openai-chat"], timeouts=Timeouts(connect=5, first_token=10, total=20), ssl=trust)
    meter = LoopDelayMeter(interval_ns=1_000_000)
    meter.start()
    sample = Sample(target="t", model="m", api="openai-chat", prompt="p", round=1)
    loop = asyncio.get_running_loop()
    async with ProbeClient(kernel_stamps=kernel_stamps) as client:
        # A first probe opens the connection (and does the TLS handshake) outside the measurement.
        await client.probe(endpoint, PARAMS, "warm", Sample("t", "m", "x", "p", 0))
        with meter.measuring():
            loop.call_later(block_at_s, time.sleep, block_s)
            await client.probe(endpoint, PARAMS, "hi", sample)
            await meter.settle(sample)
        meter.judge(sample, bound_ms=5)
    meter.stop()
    return sample


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_blocked_probe_loop_does_not_move_a_kernel_stamped_ttft(threaded, tls_pair, tls: bool) -> None:
    server_ctx, trust = tls_pair
    # The first token at 150 ms; the probe's loop is held from 50 ms to 450 ms; the next token at 700 ms.
    server = ThreadedSSE([(0.15, token("a")), (0.7, token("b")), (0.72, DONE)], server_ctx if tls else None)
    threaded.append(server)
    sample = await probe_with_loop_blocked(
        server.url, block_at_s=0.05, block_s=0.4, kernel_stamps=True, trust=trust if tls else True
    )
    assert sample.ok, sample.error_message
    assert sample.timing_path is TimingPath.KERNEL
    assert sample.ttft_ms is not None and 145 <= sample.ttft_ms < 200, sample.ttft_ms
    # The monitor was late, and says so; the first token was read alone, so its stamp is its own and
    # the sample stays evidence.
    assert sample.self_delay_ms is not None and sample.self_delay_ms > 300
    assert sample.first_token_stamp_exact is True
    assert sample.disturbed is False


async def test_without_kernel_stamps_the_block_lands_in_the_ttft(threaded) -> None:
    # The same case timed when the loop reads the bytes: what kernel stamps remove.
    server = ThreadedSSE([(0.15, token("a")), (0.7, token("b")), (0.72, DONE)])
    threaded.append(server)
    sample = await probe_with_loop_blocked(server.url, block_at_s=0.05, block_s=0.4, kernel_stamps=False)
    assert sample.ok, sample.error_message
    assert sample.timing_path is TimingPath.STAMPED
    assert sample.ttft_ms is not None and sample.ttft_ms >= 400, sample.ttft_ms
    assert sample.first_token_stamp_exact is None
    assert sample.disturbed is True


async def test_a_first_token_read_with_the_next_one_is_not_evidence_when_the_loop_was_late(threaded) -> None:
    # Both tokens queue while the loop is held: the kernel keeps the newer packet's stamp for both, so
    # the first token's stamp may hold the monitor's delay, and the sample is marked disturbed.
    server = ThreadedSSE([(0.15, token("a")), (0.3, token("b")), (0.72, DONE)])
    threaded.append(server)
    sample = await probe_with_loop_blocked(server.url, block_at_s=0.05, block_s=0.4, kernel_stamps=True)
    assert sample.ok, sample.error_message
    assert sample.timing_path is TimingPath.KERNEL
    assert sample.first_token_stamp_exact is False
    # Never later than the read, never earlier than the first token's arrival.
    assert sample.ttft_ms is not None and 145 <= sample.ttft_ms < 460, sample.ttft_ms
    assert sample.disturbed is True


# --- departures: the clock starts when the request's last byte left --------------------------


def holding_the_write(hold_s: float) -> aiohttp.TraceConfig:
    """A trace hook that holds the probe between its own `sent` stamp (the hook before it) and the
    write: what the interpreter's lock taken by another thread, or a busy core, does at random."""

    async def hold(_session: object, _context: object, _params: object) -> None:
        time.sleep(hold_s)  # noqa: ASYNC251 - holding the probe is the point

    config = aiohttp.TraceConfig()
    config.on_request_chunk_sent.append(hold)
    config.freeze()
    return config


async def probe_held_before_the_write(url: str, *, hold_s: float, kernel_stamps: bool) -> Sample:
    endpoint = Endpoint(url, FLAVORS["openai-chat"], timeouts=Timeouts(connect=5, first_token=10, total=20))
    sample = Sample(target="t", model="m", api="openai-chat", prompt="p", round=1)
    async with ProbeClient(kernel_stamps=kernel_stamps) as client:
        await client.probe(endpoint, PARAMS, "warm", Sample("t", "m", "x", "p", 0))  # the connection, once
        # aiohttp hook: a session's trace configs are `_trace_configs`, read at every request.
        client._session._trace_configs.append(holding_the_write(hold_s))
        await client.probe(endpoint, PARAMS, "hi", sample)
    return sample


async def test_a_probe_held_before_its_write_starts_the_clock_when_the_bytes_left(threaded) -> None:
    server = ThreadedSSE([(0.15, token("a")), (0.3, DONE)])
    threaded.append(server)
    sample = await probe_held_before_the_write(server.url, hold_s=0.2, kernel_stamps=True)
    assert sample.ok, sample.error_message
    assert sample.departure_stamped is True
    # The server's 150 ms, not 350: the 200 ms between the probe's stamp and its write are not TTFT.
    assert sample.ttft_ms is not None and 145 <= sample.ttft_ms < 200, sample.ttft_ms


async def test_without_kernel_stamps_a_hold_before_the_write_lands_in_the_ttft(threaded) -> None:
    server = ThreadedSSE([(0.15, token("a")), (0.3, DONE)])
    threaded.append(server)
    sample = await probe_held_before_the_write(server.url, hold_s=0.2, kernel_stamps=False)
    assert sample.ok, sample.error_message
    assert sample.departure_stamped is False
    assert sample.ttft_ms is not None and sample.ttft_ms >= 340, sample.ttft_ms


async def test_a_departure_stamp_waiting_on_the_error_queue_does_not_spin_the_loop(threaded) -> None:
    # The kernel reports a queued transmit stamp as an error event on the socket: unread, it would
    # wake the loop again and again for the whole wait for the first token (here 400 ms).
    server = ThreadedSSE([(0.4, token("a")), (0.45, DONE)])
    threaded.append(server)
    endpoint = Endpoint(server.url, FLAVORS["openai-chat"], timeouts=Timeouts(connect=5, first_token=10, total=20))
    async with ProbeClient(kernel_stamps=True) as client:
        await client.probe(endpoint, PARAMS, "warm", Sample("t", "m", "x", "p", 0))
        cpu = time.process_time()
        sample = await client.probe(endpoint, PARAMS, "hi", Sample("t", "m", "x", "p", 1))
        cpu = time.process_time() - cpu
    assert sample.ok and sample.departure_stamped, sample.error_message
    assert cpu < 0.1, f"{cpu * 1000:.0f} ms of CPU while waiting 400 ms for a first token"


def test_an_earlier_requests_departure_is_not_taken_for_this_ones() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    raw = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    try:
        sock = kernel_clock.KernelStampedSocket.adopt(raw, departures=True)
        assert sock.departures
        before = time.perf_counter_ns()
        sock.sendall(b"first request")
        after = time.perf_counter_ns()
        time.sleep(0.1)  # read late: the stamp is still the send's
        departed = sock.drain_departures()
        assert departed is not None and before <= departed <= after, (before, departed, after)
        # Nothing new sent: the same departure is kept, and a request stamped after it must not use it.
        assert sock.drain_departures() == departed
    finally:
        peer.close()
        listener.close()
        sock.close()
