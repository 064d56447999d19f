"""Waiting that a stop cuts short: the one wait every loop of the monitor that sleeps between steps makes."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_unless(stop: asyncio.Event | None, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile (at once if it already is). With no `stop`, or no
    time to wait, a plain `asyncio.sleep` (which still lets the loop run others once)."""
    if stop is None or seconds <= 0:
        await asyncio.sleep(max(0.0, seconds))
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
