"""How late the monitor itself was while a probe ran: the event loop's lateness around its stamps.

Stamps are taken where the bytes arrive (`aiohttp_hooks`), but only when the loop gets to the socket:
a callback that blocks the loop for 50 ms (a password hash, a large `/metrics` render, a full garbage
collection, a starved CPU) moves every stamp taken after it by up to 50 ms, and the server did nothing
wrong. `LoopDelayMeter` measures that: a timer on the probing loop, re-armed every `interval_ns`,
records how late each wake-up came. A wake-up late by L at time T means the loop could run nothing
in [T - L, T]; a probe whose window [sent, last stamp] overlaps such an interval may carry up to L
of the monitor's own delay. `max_lateness` answers that for one window.

A plain timer callback (`loop.call_later`), not a task: a task's step runs one loop iteration after
its timer fires, adding an iteration of unrelated work to every reading. It ticks only while a probe
holds it (`measuring`): each wake-up costs about 60 us of CPU on a small VM, mostly the wake-up
itself, so 1.1% of a core at 5 ms; nothing between runs.

The time a request waits for a provider's concurrency slot is not self delay (it happens before
`sent`), nor is the time between a stamp and its parsing (by design, stamps do not wait for it).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from monitor.probe.result import Sample, TimingPath

DEFAULT_INTERVAL_NS = 5_000_000
# The last ticks, every one kept: a window within them gets its exact worst lateness (~10 s at 5 ms).
RECENT_TICKS = 2048
# Older than that, only ticks late by at least NOTABLE_NS are kept (a long stream's stalls).
NOTABLE_NS = 500_000
NOTABLE_TICKS = 4096
# How long a finished sample waits for the meter's next wake-up (a stall covering the last stamp
# shows only then); past it, the wake-up still due counts as late by as long as it has been due.
SETTLE_TIMEOUT_S = 1.0
# The histograms of the monitor's own delay (Prometheus and OpenTelemetry alike) and of its loop's lag:
# fine below 5 ms, where a quiet daemon's p99 lies and the default bound on self delay is drawn.
SELF_DELAY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


def is_disturbed(self_delay_ms: float | None, bound_ms: float) -> bool:
    """Whether a sample's own delay makes it no evidence about the server. Unknown delay is not disturbed."""
    return self_delay_ms is not None and self_delay_ms > bound_ms


class LoopDelayMeter:
    """Lateness of a repeating timer on the running loop, kept in bounded rings (perf_counter_ns)."""

    def __init__(
        self,
        *,
        interval_ns: int = DEFAULT_INTERVAL_NS,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.interval_ns = interval_ns
        self._clock = clock
        self._recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=RECENT_TICKS)
        self._notable: collections.deque[tuple[int, int]] = collections.deque(maxlen=NOTABLE_TICKS)
        self._enabled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0
        self._started = 0
        self._users = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.ticks = 0

    @property
    def running(self) -> bool:
        """Started (it ticks while something is `measuring`)."""
        return self._enabled

    def start(self) -> None:
        self._enabled = True

    def stop(self) -> None:
        self._enabled = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        for _end, waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Tick for as long as this is held: around a probe and its `judge`. The timer runs on the loop
        of whoever holds it, the probing loop, wherever the process opened the meter."""
        self._users += 1
        try:
            if self._handle is None and self._enabled:
                self._loop = asyncio.get_running_loop()
                now = self._clock()
                self._started = self._started or now
                self._arm(now)
            yield
        finally:
            self._users -= 1

    def _arm(self, now: int) -> None:
        assert self._loop is not None
        self._due = now + self.interval_ns
        self._handle = self._loop.call_later(self.interval_ns / 1e9, self._tick)

    def _tick(self) -> None:
        now = self._clock()
        self.record(now, max(0, now - self._due))
        if self._users or self._waiters:
            self._arm(now)
        else:
            self._handle = None
        if self._waiters:
            still = []
            for end, waiter in self._waiters:
                if now > end:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((end, waiter))
            self._waiters = still

    def record(self, woke_ns: int, lateness_ns: int) -> None:
        """One wake-up at `woke_ns`, `lateness_ns` after it was due (the timer calls this; tests may too)."""
        self.ticks += 1
        entry = (woke_ns, lateness_ns)
        self._recent.append(entry)
        if lateness_ns >= NOTABLE_NS:
            self._notable.append(entry)

    def max_lateness(self, start_ns: int, end_ns: int) -> float | None:
        """Worst lateness in ms of the wake-ups whose late interval overlaps [start_ns, end_ns].

        The wake-up right after `end_ns` counts when its late interval began by `end_ns`: a stall
        covering the end shows only when the loop turns again. None when the meter never ran.
        """
        if not self._started:
            return None
        worst = 0
        for ring in (self._recent, self._notable):
            for woke, late in reversed(ring):
                if woke < start_ns:
                    break
                if woke - late <= end_ns and late > worst:
                    worst = late
        if self._handle is not None and self._due <= end_ns:
            # The next wake-up is overdue and has not run: the loop is stalled as we ask.
            now = self._clock()
            if now > self._due and not self._woke_after(end_ns):
                worst = max(worst, now - self._due)
        return worst / 1e6

    def _woke_after(self, end_ns: int) -> bool:
        return bool(self._recent) and self._recent[-1][0] > end_ns

    async def settled(self, end_ns: int, *, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Return once the meter has woken after `end_ns` (at once when it has, or is not ticking)."""
        if self._handle is None or self._woke_after(end_ns):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end_ns, waiter))
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass

    async def settle(self, sample: Sample) -> None:
        """Wait (up to one wake-up) until the meter has seen past the sample's last stamp; hold
        `measuring` since before the sample was sent."""
        end_ns = _end_ns(sample)
        if end_ns is not None:
            await self.settled(end_ns)

    def judge(self, sample: Sample, *, bound_ms: float) -> None:
        """Set the sample's `self_delay_ms` (over [sent, its last stamp]) and `disturbed`."""
        end_ns = _end_ns(sample)
        if end_ns is None or sample.sent_mono_ns is None or not self._started:
            return
        lateness = self.max_lateness(sample.sent_mono_ns, end_ns)
        # To the microsecond, as the probe's durations (client._ms) and as they are stored.
        sample.self_delay_ms = None if lateness is None else round(lateness * 1000) / 1000
        sample.disturbed = is_disturbed(self._delay_in_ttft(sample), bound_ms)

    def _delay_in_ttft(self, sample: Sample) -> float | None:
        """How much of the monitor's lateness the sample's TTFT may hold, in ms.

        Stamped when the loop read the bytes: all of it, over [sent, last stamp]. Stamped by the
        kernel (kernel_clock.py): none, if the first token was read on its own (its stamp is its
        arrival); else at most the stalls between the connection's previous read and the read that
        took the first token (a read takes every packet queued meanwhile under the newest one's stamp,
        and a loop that was not stalled reads a packet as it comes).
        """
        read_ns = sample.first_token_read_mono_ns
        if sample.timing_path is not TimingPath.KERNEL or read_ns is None:
            return sample.self_delay_ms
        if sample.first_token_stamp_exact:
            return 0.0
        # Read together with a later token, the first token may have waited unread since it arrived,
        # which is some time after the connection's previous read (or the send): a stall anywhere from
        # there to the read may be in its stamp, even one that ended well before the read (the loop
        # then works through every socket and timer that fell due meanwhile). Measured under load:
        # with only the interval before the read looked at, such first tokens were 20-40 ms late and
        # stayed evidence (bench/isolation.py). From one interval earlier, for a stall whose wake-up
        # ran in the iteration before.
        since = sample.first_token_unread_since_ns
        start = min(since, read_ns) if since is not None else read_ns
        return self.max_lateness(start - self.interval_ns, read_ns)


def _end_ns(sample: Sample) -> int | None:
    if sample.sent_mono_ns is None or sample.total_ms is None:
        return None
    return sample.sent_mono_ns + round(sample.total_ms * 1e6)
