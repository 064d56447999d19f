"""`BackgroundStore.caught_up`: what was handed over before the call is written and detected, whatever keeps
coming after it. The daemon freezes its heap after a job's first tick once that tick is caught up; it waited
for both stages to be idle at once (`settle`), which a job ticking faster than each tick settles never reached,
so its heap was never frozen (and a test of it timed out under the full suite's load)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from monitor.schedule.background import BackgroundStore
from monitor.store.records import Batch
from tests.support.store_fixtures import make_batch


class SlowWriter:
    """Stores each batch after `write_s`, and tells the background store (its detection) as the real one does."""

    def __init__(self, write_s: float) -> None:
        self.write_s = write_s
        self.saved: list[Batch] = []
        self._listeners: list[Callable[[Batch], None]] = []

    @property
    def spool(self) -> Any:
        return self  # `append`: nothing here is spooled

    def append(self, batch: Batch) -> None:
        raise AssertionError("nothing should be spooled")

    async def save(self, batch: Batch) -> str:
        await asyncio.sleep(self.write_s)
        self.saved.append(batch)
        for listener in self._listeners:
            listener(batch)
        return "stored"

    def notify_stored(self, listener: Callable[[Batch], None]) -> None:
        self._listeners.append(listener)


def a_batch(job: str) -> Batch:
    return make_batch(targets=("qwen3-8b",), prompts=("short",), job=job)


async def test_caught_up_waits_for_what_came_before_while_more_keeps_coming_and_settle_never_does() -> None:
    detected: list[str] = []

    async def detect(job: str, batch: Batch, *, budget_s: float | None = None) -> None:
        await asyncio.sleep(0.03)
        detected.append(job)

    store = BackgroundStore(SlowWriter(0.03), after_store=detect)
    store.start()
    stop = asyncio.Event()

    async def ticks() -> None:  # a job every 20 ms, each batch 60 ms to write and detect: never idle
        n = 0
        while not stop.is_set():
            store.submit(f"tick{n}", a_batch(f"tick{n}"), {})
            submitted.append(f"tick{n}")
            n += 1
            await asyncio.sleep(0.02)

    submitted: list[str] = []

    ticking = asyncio.create_task(ticks())
    try:
        await asyncio.sleep(0.05)
        assert not await store.settle(0.5), "both stages idle at once: the test's ticks did not keep them busy"
        before = list(submitted)
        assert await store.caught_up(5.0)
        assert set(before) <= set(detected), (before, detected)
        assert len(submitted) > len(detected), "it waited for what came after the call too"
    finally:
        stop.set()
        await ticking
        await store.close(2.0)


async def test_caught_up_says_no_when_the_writing_does_not_finish_in_time() -> None:
    store = BackgroundStore(SlowWriter(1.0), after_store=None)
    store.start()
    store.submit("slow", a_batch("slow"), {})
    assert not await store.caught_up(0.2)
    assert await store.caught_up(2.0)
    await store.close(1.0)


async def test_caught_up_waits_for_the_detection_of_the_batches_before_it() -> None:
    detected: list[str] = []
    release = asyncio.Event()

    async def detect(job: str, batch: Batch, *, budget_s: float | None = None) -> None:
        await release.wait()
        detected.append(job)

    store = BackgroundStore(SlowWriter(0.0), after_store=detect)
    store.start()
    store.submit("first", a_batch("first"), {})
    assert not await store.caught_up(0.2), "written, but its detection is still running"
    release.set()
    assert await store.caught_up(1.0)
    assert detected == ["first"]
    await store.close(1.0)
