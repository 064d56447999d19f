"""Loaded by the daemons `bench/daemon.py` starts (this folder last on their PYTHONPATH), of any checkout:
times every garbage collection from a `gc.callbacks` hook and writes them, one JSON line each, to
$BENCH_GC_OUT when the process exits. A collection's pause is timed twice: on the wall clock, and on its
thread's CPU clock, which the other workers of a loaded machine do not lengthen.

Two looks for finding what the collector walks and what it frees (docs/benchmarks.md, "Garbage collection"):

- $BENCH_GC_CENSUS_AT (seconds after start): the objects it tracks then, by type and generation, with the
  references a full collection follows from those of the oldest, to $BENCH_GC_OUT.census (JSON);
- $BENCH_GC_GARBAGE_AT (seconds after start): the cyclic garbage made over the next 10 s (kept by
  DEBUG_SAVEALL), by type, and for a few of them the chain of referrers up to the cycle that held them,
  to $BENCH_GC_OUT.garbage (JSON).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import threading
import time


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _install(out: str) -> None:
    records: list[tuple[float, int, int, int, int]] = []
    started = [0, 0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0], started[1] = time.perf_counter_ns(), time.thread_time_ns()
        else:
            wall, cpu = time.perf_counter_ns() - started[0], time.thread_time_ns() - started[1]
            records.append((time.time(), info["generation"], wall, cpu, info["collected"]))

    def dump() -> None:
        with open(out, "w") as file:
            for at, generation, wall_ns, cpu_ns, collected in records:
                row = {"at": at, "gen": generation, "wall_ns": wall_ns, "cpu_ns": cpu_ns, "collected": collected}
                file.write(json.dumps(row) + "\n")

    gc.callbacks.append(on_gc)
    atexit.register(dump)


def _census(out: str) -> None:
    counts: dict[str, dict[str, int]] = {}
    referents: dict[str, int] = {}
    for generation in range(3):
        for obj in gc.get_objects(generation):
            by_generation = counts.setdefault(_name(obj), {})
            by_generation[f"gen{generation}"] = by_generation.get(f"gen{generation}", 0) + 1
            if generation == 2:
                referents[_name(obj)] = referents.get(_name(obj), 0) + len(gc.get_referents(obj))
    census = {"frozen": gc.get_freeze_count(), "count": gc.get_count(), "threshold": gc.get_threshold()}
    with open(out + ".census", "w") as file:
        json.dump({**census, "types": counts, "referents_gen2": referents}, file)


def _referrer_chain(obj: object, garbage_ids: set[int], limit: int = 25) -> list[str]:
    """`obj`, what refers to it, what refers to that, ... among the garbage, until one repeats (the cycle)."""
    chain: list[str] = []
    seen: set[int] = set()
    node: object | None = obj
    while node is not None and id(node) not in seen and len(chain) < limit:
        seen.add(id(node))
        label = _name(node)
        if hasattr(node, "__qualname__") and type(node).__name__ in ("function", "coroutine", "method"):
            label += f" {node.__qualname__}"
        chain.append(label)
        node = next((r for r in gc.get_referrers(node) if id(r) in garbage_ids), None)
    if node is not None:
        chain.append(f"(cycle back to {_name(node)})")
    return chain


def _garbage(out: str, seconds: float) -> None:
    def end() -> None:
        gc.collect()
        gc.set_debug(0)
        garbage = list(gc.garbage)
        gc.garbage.clear()
        ids = {id(o) for o in garbage}
        counts: dict[str, int] = {}
        examples: dict[str, object] = {}
        for obj in garbage:
            counts[_name(obj)] = counts.get(_name(obj), 0) + 1
            examples.setdefault(_name(obj), obj)
        top = sorted(counts, key=lambda name: -counts[name])[:5]
        chains = [_referrer_chain(examples[name], ids) for name in top]
        with open(out + ".garbage", "w") as file:
            json.dump({"seconds": seconds, "objects": len(garbage), "types": counts, "chains": chains}, file)

    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    threading.Timer(seconds, end).start()


def _at(seconds: float, action: object) -> None:
    timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
    timer.daemon = True
    timer.start()


_OUT = os.environ.get("BENCH_GC_OUT")
if _OUT:
    _install(_OUT)
    if os.environ.get("BENCH_GC_CENSUS_AT"):
        _at(float(os.environ["BENCH_GC_CENSUS_AT"]), lambda: _census(_OUT))
    if os.environ.get("BENCH_GC_GARBAGE_AT"):
        _at(float(os.environ["BENCH_GC_GARBAGE_AT"]), lambda: _garbage(_OUT, 10.0))
