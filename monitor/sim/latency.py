"""The latency model (pure) and the sleeps that keep the simulator on schedule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from monitor.sim.profiles import ModelProfile

Clock = Callable[[], int]

# asyncio timers land up to ~1 ms late (epoll timeouts are whole milliseconds), so the last
# stretch before a first token is spun out on the event loop instead of slept.
SPIN_NS = 1_500_000


def ttft_ms(profile: ModelProfile, *, uncached_tokens: int, cached_tokens: int, noise: float = 1.0) -> float:
    """Time to first token, from the moment the request is received, for one prompt."""
    per_token = profile.prefill_ms_per_1k / 1000.0
    prefill = per_token * uncached_tokens + profile.cached_prefill_factor * per_token * cached_tokens
    return (profile.ttft_base_ms + prefill) * noise


def token_gap_ns(profile: ModelProfile) -> int:
    """Spacing between streamed tokens: the drip fault's gap, else the decode rate."""
    drip = profile.faults.drip_gap_ms
    if drip is not None:
        return round(drip * 1_000_000)
    return round(1e9 / profile.decode_tps)


async def sleep_until(deadline_ns: int, *, clock: Clock = time.perf_counter_ns) -> None:
    """Sleep until `deadline_ns`, waking at most ~1 ms late; for decode steps, where that is fine."""
    remaining = deadline_ns - clock()
    if remaining > 0:
        await asyncio.sleep(remaining / 1e9)


async def sleep_until_precisely(
    deadline_ns: int, *, clock: Clock = time.perf_counter_ns, spin_ns: int = SPIN_NS
) -> None:
    """Return within a few tens of microseconds after `deadline_ns` (on an idle loop).

    Spinning yields to the loop on every turn, so other streams keep running meanwhile.
    """
    remaining = deadline_ns - clock()
    if remaining > spin_ns:
        await asyncio.sleep((remaining - spin_ns) / 1e9)
    while clock() < deadline_ns:  # noqa: ASYNC110 - a busy wait is the point: no timer is this precise
        await asyncio.sleep(0)
