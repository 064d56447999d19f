"""A step of the wall clock between a packet's kernel stamp and its read, on real loopback sockets with the kernel's
real stamps: the socket's wall clock is stepped by the test (monitor/kernel_clock.py). Not timed to the
millisecond, so not `solo` (tests/integration/test_kernel_clock.py is)."""

from __future__ import annotations

import socket
import time

import pytest

from monitor import kernel_clock

pytestmark = pytest.mark.skipif(not kernel_clock.supported(), reason="kernel arrival stamps are Linux's")


def test_a_step_between_a_packets_arrival_and_its_read_falls_back_to_the_read_time() -> None:
    # Real loopback bytes and the kernel's real stamps; the socket's wall clock is stepped by 2 s
    # after the bytes arrived and before they are read, as an NTP step would be.
    step = [0]
    listener = socket.create_server(("127.0.0.1", 0))
    raw = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    sock = kernel_clock.KernelStampedSocket.adopt(
        raw, clock=kernel_clock.WallClockOffset(wall=lambda: time.time_ns() + step[0])
    )
    sock.clock.observe()
    try:
        peer.sendall(b"first")
        time.sleep(0.05)
        assert sock.recv(100) == b"first"
        assert sock.kernel_stamped and sock.read_ns - sock.arrival_ns >= 45_000_000  # waited 50 ms, seen
        peer.sendall(b"second")
        time.sleep(0.05)
        step[0] = 2_000_000_000
        assert sock.recv(100) == b"second"
        assert sock.clock.steps == 1
        assert not sock.kernel_stamped and sock.arrival_ns == sock.read_ns
    finally:
        peer.close()
        listener.close()
        sock.close()


def test_a_step_one_socket_saw_is_still_seen_by_anothers_read_of_bytes_stamped_before_it() -> None:
    # Two connections of one connector. B's bytes arrive, the wall clock steps back 50 ms, A reads (and
    # sees the step), then B reads 100 ms after its bytes came: on the old offset B's stamp would be
    # placed 50 ms late, inside the span A saw the new offset hold.
    step = [0]
    connector_clock = kernel_clock.WallClockOffset(wall=lambda: time.time_ns() + step[0])
    connector_clock.observe()
    listener = socket.create_server(("127.0.0.1", 0))
    pairs = []
    try:
        for _ in range(2):
            raw = socket.create_connection(listener.getsockname())
            peer, _address = listener.accept()
            pairs.append((kernel_clock.KernelStampedSocket.adopt(raw, clock=connector_clock), peer))
        (a, a_peer), (b, b_peer) = pairs
        b_peer.sendall(b"b")
        time.sleep(0.005)
        step[0] = -50_000_000
        a_peer.sendall(b"a")
        time.sleep(0.005)
        assert a.recv(10) == b"a" and a.clock.steps == 1
        time.sleep(0.09)
        assert b.recv(10) == b"b"
        assert b.clock.steps == 1
        assert not b.kernel_stamped and b.arrival_ns == b.read_ns
    finally:
        listener.close()
        for sock, peer in pairs:
            sock.close()
            peer.close()
