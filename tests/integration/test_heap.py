"""`run` has glibc give large freed blocks back (issue 26: resident memory under 100 MB at 500 series).

By default glibc raises its mapping threshold to the largest block freed, so a second `/metrics` rendering of
5 MB is carved from a heap that keeps it. A child process allocates and frees large blocks behind a small
live object, as the daemon does between scrapes, and reads its resident memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

CHILD = """
import sys
from monitor.app import return_large_blocks

def resident_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

if sys.argv[1] == "fixed":
    assert return_large_blocks()
kept = []
freed = bytearray(12 << 20)
del freed  # glibc's default raises its threshold past the renderings below
before = resident_kb()
for _ in range(4):
    block = bytearray(8 << 20)  # a rendering, touched
    kept.append(bytearray(64))  # something small that lives on, made after it
    del block
print(resident_kb() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc")
def test_large_blocks_freed_by_the_daemon_go_back_to_the_system() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "fixed"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    grown_kb = int(done.stdout)
    assert grown_kb < 4 * 1024, f"freed 8 MB blocks stayed resident: {grown_kb} kB"


THREADS_CHILD = """
import ctypes, sys, threading
from monitor.app import share_thread_heaps

if sys.argv[1] == "shared":
    assert share_thread_heaps()
kept = []
started = threading.Barrier(6)

def allocate():
    started.wait()  # all at once, so that no thread finds another's heap free and takes it
    kept.append([bytearray(1000) for _ in range(100)])  # past pymalloc: glibc's heap of this thread
    started.wait()

threads = [threading.Thread(target=allocate) for _ in range(5)]
for thread in threads:
    thread.start()
started.wait()
started.wait()
for thread in threads:
    thread.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" paragraph a heap, on stderr
"""


def _heaps(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", THREADS_CHILD, mode], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    return sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_stats")
def test_the_daemon_s_threads_share_two_heaps_instead_of_one_each() -> None:
    assert _heaps("default") > 2  # what the daemon had: a heap for each thread that allocates
    assert _heaps("shared") == 2
