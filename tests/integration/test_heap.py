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
