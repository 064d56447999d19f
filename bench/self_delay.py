"""What the self-delay meter costs and what it reads on a quiet loop (monitor.probe.self_delay).

    .venv/bin/python bench/self_delay.py [--seconds 10]

Prints the process CPU time of an idle event loop for `--seconds`, three ways: nothing running, a bare
`call_later` chain at the meter's interval (the cost of waking the loop at all), and the meter held as
a probe holds it; then the distribution of the lateness the meter recorded (its noise floor, against
which `probe_self_delay_bound_ms` is set).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from monitor.probe.self_delay import LoopDelayMeter


async def _cpu_over(seconds: float) -> float:
    start = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - start


async def _bare_chain(seconds: float, interval_s: float) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    ticks = [0]
    handle: list[asyncio.TimerHandle] = []

    def tick() -> None:
        ticks[0] += 1
        handle[:] = [loop.call_later(interval_s, tick)]

    handle.append(loop.call_later(interval_s, tick))
    cpu = await _cpu_over(seconds)
    handle[0].cancel()
    return cpu, ticks[0]


async def main(seconds: float) -> None:
    idle = await _cpu_over(seconds)
    meter = LoopDelayMeter()
    bare, bare_ticks = await _bare_chain(seconds, meter.interval_ns / 1e9)
    meter.start()
    with meter.measuring():
        held = await _cpu_over(seconds)
    meter.stop()
    ticks = meter.ticks
    print(f"over {seconds:g} s of an idle loop, CPU time:")
    print(f"  nothing running        {idle * 1000:8.1f} ms")
    print(
        f"  bare call_later chain  {bare * 1000:8.1f} ms  {bare_ticks} wake-ups, "
        f"{(bare - idle) / bare_ticks * 1e6:.0f} us each"
    )
    print(
        f"  meter held             {held * 1000:8.1f} ms  {ticks} wake-ups, {(held - idle) / ticks * 1e6:.0f} us each, "
        f"{(held - idle) / seconds * 100:.2f}% of a core"
    )
    late = sorted(lateness / 1e6 for _woke, lateness in meter._recent)

    def q(p: float) -> float:
        return late[round(p * (len(late) - 1))]

    print(
        f"lateness of the last {len(late)} wake-ups (ms): p50 {q(0.5):.3f}  p90 {q(0.9):.3f}  "
        f"p99 {q(0.99):.3f}  max {late[-1]:.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args().seconds))
