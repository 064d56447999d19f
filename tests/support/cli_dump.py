"""`python -m tests.support.cli_dump ARGS` runs `python -m monitor ARGS`, and on SIGUSR1 writes to stderr what
every thread and every asyncio task is waiting on, then goes on.

`run_cli` runs the CLI through this, so a command that overruns its test's timeout says where it hung
before it is killed (a kill alone left only `TimeoutExpired`, and a hang seen once in ten runs
could not be found). The monitor itself does not use SIGUSR1.
"""

from __future__ import annotations

import faulthandler
import io
import runpy
import signal
import sys
from types import FrameType

END_OF_DUMP = "=== end of dump ==="


def write_await_chain(awaitable: object, out: io.StringIO) -> None:
    """Every coroutine frame from the task's down to what it waits on (a task's own stack shows
    only its outermost coroutine), then that awaitable."""
    depth = 0
    while awaitable is not None and depth < 60:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            out.write(f"    waits on {awaitable!r}"[:400] + "\n")
            return
        out.write(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}\n")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
        depth += 1


def dump_tasks(signum: int, frame: FrameType | None) -> None:
    """The asyncio tasks' await chains (the threads' stacks were written by faulthandler already)."""
    import asyncio

    out = io.StringIO()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        out.write("=== SIGUSR1 dump: no running event loop ===\n")
    else:
        tasks = asyncio.all_tasks(loop)
        out.write(f"=== SIGUSR1 dump: {len(tasks)} asyncio tasks ===\n")
        for task in tasks:
            out.write(f"--- {task.get_name()}\n")
            write_await_chain(task.get_coro(), out)
    out.write(END_OF_DUMP + "\n")
    sys.stderr.write(out.getvalue())
    sys.stderr.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, dump_tasks)
    # Every thread's stack at once, from C, inside the signal: it comes even when the interpreter is stuck
    # in C code or starved of CPU (then the Python handler above may never get to run); chained to it.
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
    sys.argv = ["monitor", *sys.argv[1:]]
    runpy.run_module("monitor", run_name="__main__", alter_sys=True)
