"""Ending a set of asyncio tasks within a bound: shared by the daemon's stop and the service loop's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def finish_tasks(tasks: Iterable[asyncio.Task[object]] | Iterable[asyncio.Task[None]], within_s: float) -> None:
    """Let `tasks` end by themselves within `within_s` s, then cancel what is left; never raises."""
    live = [t for t in tasks if not t.done()]
    if live:
        await asyncio.wait(live, timeout=max(0.0, within_s))
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, timeout=1)
