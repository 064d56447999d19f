"""Arrival times from the kernel: when a response's bytes reached the socket, not when the probe read them.

A stamp taken in `data_received` is the time the probes' event loop got to the socket. When that loop
(or the interpreter, or the machine) is busy, the bytes wait in the socket's receive queue and the
wait lands in the TTFT. Linux stamps every received packet as it is queued (`SO_TIMESTAMPNS`), and
hands the stamp over with the bytes (`recvmsg`'s ancillary data). The probe's sockets read that way,
so a read carries the time its bytes arrived, whatever the loop was doing meanwhile.

What the kernel gives is the arrival of the *last* packet a read took: packets that queue up while
nobody reads are merged, keeping the newest stamp. A read therefore never gets a stamp earlier than
its bytes' arrival, and a late read of several packets gets the newest one's: still never later than
the read itself. `read_ns` is kept beside it, so the wait in the queue (how late the probe was) is
measured, not guessed.

The stamp is on the wall clock (CLOCK_REALTIME); it is moved to the probe's monotonic clock
(`time.perf_counter_ns`, CLOCK_MONOTONIC) by the offset between the two (`WallClockOffset`). Both
clocks are slewed alike by NTP, so that offset moves only when the wall clock is *stepped* (an NTP
step, `date -s`, a virtual machine resumed or forked). A step between a packet's stamp and its read
would shift the sample by the step, unseen: a step of a few seconds makes a TTFT seconds long or
negative. So each socket measures the offset at every read and keeps since when it has held; a
stamp from before the latest step (or from before the socket saw the offset at all) is not
converted: that read falls back to the read time, and says so (`kernel_stamped` False).

Departures likewise: the probe's sockets ask for the kernel's transmit stamp of what they send
(`SO_TIMESTAMPING`, software stamps, reported on the socket's error queue), so the TTFT clock starts
when the request's last byte left, not when the probe's loop was about to write it: a probe thread
held between the two (the interpreter's lock taken by the service thread, a busy core) does not
move the start. A read drains the error queue first (the kernel reports a queued stamp as an error
event, which would wake the loop until it is read), keeping the latest departure (`departed_ns`).

The probe reads its responses this way (`probe/aiohttp_hooks.py`), and the simulator its requests
(`KernelStampedListener`): a request waiting in the simulator's receive queue while its loop is busy
is not counted against the monitor when a benchmark subtracts the simulator's own interval.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Callable

# Linux's values; CPython's socket module does not export them on every build.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_TIMESTAMPING: int = getattr(socket, "SO_TIMESTAMPING", 37)
MSG_ERRQUEUE: int = getattr(socket, "MSG_ERRQUEUE", 0x2000)
# linux/net_tstamp.h: stamp transmits in software, report software stamps, and queue the stamp
# alone (not a copy of the bytes sent).
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
DEPARTURE_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY
_TIMESPEC = struct.Struct("@qq")
_TIMESTAMPING = struct.Struct("@qqqqqq")  # software, (deprecated), hardware
_HAS_CMSG = hasattr(socket, "CMSG_SPACE")
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if _HAS_CMSG else 0
# With departures on, reads also carry an SCM_TIMESTAMPING record beside SCM_TIMESTAMPNS.
_ANCILLARY_SIZE_BOTH = _ANCILLARY_SIZE + socket.CMSG_SPACE(_TIMESTAMPING.size) if _HAS_CMSG else 0
# An error-queue message: the stamps and the extended error that says what they are (with an address).
_ERRQUEUE_ANCILLARY_SIZE = 512
# How far the wall clock may move against the monotonic one between two readings without being
# taken for a step. Both are slewed alike, so only the readings' own jitter moves it: a step smaller
# than this is at most this much error on a stamp (the isolation target is 1 ms).
STEP_TOLERANCE_NS = 200_000


def supported() -> bool:
    return sys.platform.startswith("linux") and _ANCILLARY_SIZE > 0


def keep_stamping_on() -> socket.socket | None:
    """A socket that asks for arrival stamps and does nothing else, to be held open for the process' life.

    Linux stamps packets only while some socket wants stamps, and switches that on lazily (deferred
    work, a few ms after the first socket asks) and off again after the last one closes: without this
    the first packets of a new connection can arrive unstamped. None where there are no stamps.
    """
    if not supported():
        return None
    keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        keeper.close()
        return None
    return keeper


class WallClockOffset:
    """The wall clock minus the monotonic clock, watched for steps, to move kernel stamps across.

    `observe` reads both clocks (monotonic, wall, monotonic: the reading's uncertainty is the time
    between the two monotonic reads, which a preemption can make long). A reading that disagrees
    with the kept offset by more than `STEP_TOLERANCE_NS` plus both readings' uncertainty is a step:
    the new offset is kept, and only stamps from after that reading are converted (the step happened
    somewhere since the reading before, and a stamp in between cannot be placed). A reading that
    agrees and is more certain than the kept one replaces it.

    The clocks are passed in so that a test can step the wall clock.
    """

    __slots__ = ("_mono", "_wall", "offset_ns", "spread_ns", "steady_since_ns", "steps")

    def __init__(
        self,
        wall: Callable[[], int] = time.time_ns,
        mono: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._wall = wall
        self._mono = mono
        self.offset_ns: int | None = None
        self.spread_ns = 0
        self.steady_since_ns = 0  # monotonic: the offset has held since this reading
        self.steps = 0

    def observe(self) -> int:
        """Read both clocks, note a step, and return now on the monotonic clock."""
        before = self._mono()
        wall = self._wall()
        after = self._mono()
        spread = after - before
        offset = wall - (before + after) // 2
        kept = self.offset_ns
        if kept is None:
            self.offset_ns, self.spread_ns, self.steady_since_ns = offset, spread, before
        elif abs(offset - kept) > STEP_TOLERANCE_NS + spread + self.spread_ns:
            self.offset_ns, self.spread_ns, self.steady_since_ns = offset, spread, after
            self.steps += 1
        elif spread < self.spread_ns:
            self.offset_ns, self.spread_ns = offset, spread
        return after

    def copy(self) -> WallClockOffset:
        """The same reading, watched on its own from now on (a socket's own, seeded by its listener's)."""
        twin = WallClockOffset(self._wall, self._mono)
        twin.offset_ns, twin.spread_ns, twin.steady_since_ns = self.offset_ns, self.spread_ns, self.steady_since_ns
        return twin

    def to_monotonic(self, kernel_wall_ns: int, now_mono_ns: int) -> int | None:
        """A kernel wall-clock stamp on the monotonic clock, by the offset `observe` last kept; None
        when it falls before the offset was last seen to hold (a step may lie between) or after now."""
        if self.offset_ns is None:
            return None
        mono = kernel_wall_ns - self.offset_ns
        if mono < self.steady_since_ns or mono > now_mono_ns + STEP_TOLERANCE_NS:
            return None
        return min(mono, now_mono_ns)


def _first_stamp_ns(ancdata: list[tuple[int, int, bytes]], kind: int, size: int) -> int | None:
    """The first timespec of the `kind` record (at least `size` bytes) in ancillary data, in ns."""
    for level, got, data in ancdata:
        if level == socket.SOL_SOCKET and got == kind and len(data) >= size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return int(seconds) * 1_000_000_000 + int(nanoseconds)
    return None


def kernel_wall_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The SCM_TIMESTAMPNS stamp in a `recvmsg` answer's ancillary data, in wall-clock nanoseconds."""
    return _first_stamp_ns(ancdata, SO_TIMESTAMPNS, _TIMESPEC.size)


def departure_wall_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The software transmit stamp in an error-queue message's ancillary data, wall-clock nanoseconds
    (SCM_TIMESTAMPING's first timespec; zero when the kernel took none)."""
    return _first_stamp_ns(ancdata, SO_TIMESTAMPING, _TIMESTAMPING.size) or None


class KernelStampedSocket(socket.socket):
    """A TCP socket whose reads keep the kernel's arrival stamp of what they returned.

    asyncio's transports read with `recv` (plain protocols) and `recv_into` (TLS, buffered
    protocols); both are answered with `recvmsg` here. After each read, `arrival_ns` is when its
    bytes arrived (monotonic, `perf_counter_ns`), `read_ns` when the read ran, and `kernel_stamped`
    whether the arrival came from the kernel.
    """

    __slots__ = ("_ancillary", "arrival_ns", "clock", "departed_ns", "departures", "kernel_stamped", "read_ns")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # Replaced by `adopt`'s shared one; read at once, before anything is sent or received on
        # this socket, so that its stamps all come after its first reading.
        self.clock = WallClockOffset()
        self.clock.observe()
        self.arrival_ns = 0
        self.read_ns = 0
        self.kernel_stamped = False
        self.departures = False  # whether the kernel stamps what this socket sends
        self.departed_ns: int | None = None  # the latest departure seen, monotonic
        self._ancillary = _ANCILLARY_SIZE

    @classmethod
    def adopt(
        cls, sock: socket.socket, *, departures: bool = False, clock: WallClockOffset | None = None
    ) -> KernelStampedSocket:
        """The same connection as `sock` (which is detached), reading with arrival stamps on, and with
        `departures`, asking for the kernel's transmit stamps (where it refuses, without them).

        `clock`, the connector's or listener's, has watched the wall clock since before this
        connection's bytes (a listener's since it was bound, so a request that arrived before its
        connection was accepted keeps its stamp): it is read now and the socket goes on from a copy.
        Each socket watches on its own after that: a step seen by one socket's read must still be
        seen by another's, whose unread bytes may have been stamped before it (on one shared reading
        a step back of 50 ms seen by one socket let another place such a stamp 50 ms late).
        Without `clock` the socket starts its own."""
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # raises before anything is handed over
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        if clock is not None:
            clock.observe()
            adopted.clock = clock.copy()
        if departures:
            try:
                adopted.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, DEPARTURE_FLAGS)
            except OSError:
                return adopted
            adopted.departures = True
            adopted._ancillary = _ANCILLARY_SIZE_BOTH
        return adopted

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if self.departures:
            self.drain_departures()
        data, ancdata, _flags, _address = self.recvmsg(bufsize, self._ancillary, flags)
        self._note(ancdata)
        return data

    def recv_into(self, buffer: object, nbytes: int = 0, flags: int = 0) -> int:
        if self.departures:
            self.drain_departures()
        view = memoryview(buffer)  # type: ignore[arg-type]
        if nbytes:
            view = view[:nbytes]
        count, ancdata, _flags, _address = self.recvmsg_into([view], self._ancillary, flags)
        self._note(ancdata)
        return count

    def drain_departures(self) -> int | None:
        """Read every transmit stamp waiting on the error queue; returns (and keeps in `departed_ns`)
        the latest departure on the monotonic clock, or the one kept before when none was waiting."""
        latest: int | None = None
        while True:
            try:
                _data, ancdata, _flags, _address = self.recvmsg(1, _ERRQUEUE_ANCILLARY_SIZE, MSG_ERRQUEUE)
            except OSError:  # nothing waiting (EAGAIN: the socket is non-blocking), or no queue at all
                break
            wall = departure_wall_ns(ancdata)
            if wall is not None and (latest is None or wall > latest):
                latest = wall
        if latest is not None:
            departed = self.clock.to_monotonic(latest, self.clock.observe())
            if departed is not None:
                self.departed_ns = departed
        return self.departed_ns

    def _note(self, ancdata: list[tuple[int, int, bytes]]) -> None:
        now_mono = self.clock.observe()
        self.read_ns = now_mono
        wall = kernel_wall_ns(ancdata)
        arrival = self.clock.to_monotonic(wall, now_mono) if wall is not None else None
        self.kernel_stamped = arrival is not None
        self.arrival_ns = arrival if arrival is not None else now_mono


class KernelStampedListener(socket.socket):
    """A listening TCP socket whose accepted connections are `KernelStampedSocket`s.

    asyncio accepts with the listener's own `accept` (`loop.create_server(sock=...)`), and
    `socket.accept` makes a plain socket whatever the listener's class: this one adopts each.
    """

    clock: WallClockOffset

    def accept(self) -> tuple[socket.socket, object]:
        conn, address = super().accept()
        try:
            return KernelStampedSocket.adopt(conn, clock=self.clock), address
        except OSError:
            return conn, address

    @classmethod
    def bound(cls, host: str, port: int, *, backlog: int) -> KernelStampedListener | None:
        """A non-blocking listener on `host`:`port` (a numeric IPv4 or IPv6 address), or None where
        the kernel has no stamps or `host` is a name (the caller listens the usual way)."""
        if not supported():
            return None
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            socket.inet_pton(family, host)
        except OSError:
            return None
        listener = cls(family, socket.SOCK_STREAM)
        listener.clock = WallClockOffset()
        listener.clock.observe()  # before any connection: every request's stamp comes after
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                listener.bind((host, port))
            except OSError as exc:
                # Worded as asyncio's `create_server` words it, so callers report both alike.
                reason = (exc.strerror or str(exc)).lower()
                raise OSError(
                    exc.errno, f"error while attempting to bind on address {(host, port)!r}: {reason}"
                ) from exc
            listener.listen(backlog)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        return listener
