"""What `ttft-monitor run` holds in memory that a daemon nobody visits does not use (issue 26, the daemon's
own cost: resident memory under 100 MB at 500 series, docs/benchmarks.md).

A real `run` probes the simulator in a child process; an audit hook takes the modules loaded when its
first probe connects, and the child writes them, with those loaded at its exit, when SIGTERM stops it; then it
has glibc list its heaps (two: the threads share one besides the main thread's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from monitor.app import THREAD_HEAPS
from tests.conftest import ROOT, SimProcess
from tests.support.daemon import http_get, upgrade, write_config

CHILD = """
import json, os, sys
port = int(os.environ["FOOTPRINT_SIM_PORT"])
seen = {}

def on_connect(event, args):
    if event == "socket.connect" and not seen and isinstance(args[1], tuple) and args[1][1:2] == (port,):
        seen["at_first_probe"] = sorted(sys.modules)

sys.addaudithook(on_connect)
from monitor import cli
code = cli.main(sys.argv[1:])
with open(os.environ["FOOTPRINT_OUT"], "w") as out:
    json.dump({"code": code, **seen, "at_exit": sorted(sys.modules)}, out)
import ctypes
ctypes.CDLL("libc.so.6").malloc_stats()  # glibc's heaps, an "Arena N:" paragraph each, on stderr
"""

# The UI's queries (about 3 MB resident) are imported by the first view asked for.
NOT_UNTIL_A_VIEW_IS_ASKED_FOR = ("monitor.web.queries",)
# SQLAlchemy's PostgreSQL dialect with its drivers' modules (2.3 MB resident), and asyncpg: the daemon
# in this test is on SQLite, so neither is imported, before a view or after (monitor/store/types.py).
NEVER_ON_SQLITE = ("sqlalchemy.dialects.postgresql", "asyncpg")


def test_run_imports_ui_queries_only_for_a_view_and_no_postgresql_on_sqlite(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim, schedule="*/1 * * * * *")
    upgrade(config)
    listen = config.read_text().split('listen: "', 1)[1].split('"', 1)[0]
    out = tmp_path / "footprint.json"
    env = {
        **{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
        "FOOTPRINT_SIM_PORT": str(urlsplit(sim.url).port),
        "FOOTPRINT_OUT": str(out),
    }
    log = (tmp_path / "daemon.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and '"probe_sample"' not in (tmp_path / "daemon.log").read_text():
            assert child.poll() is None, (tmp_path / "daemon.log").read_text()[-3000:]
            time.sleep(0.1)
        # The first sample is logged before its run is stored: ask until the view shows the stored series.
        while True:
            status, body = http_get(f"http://{listen}/api/v1/series")
            assert status == 200, body
            if json.loads(body)["series"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert json.loads(body)["series"], body
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
        log.close()
    result = json.loads(out.read_text())
    assert result["code"] == 0
    assert "at_first_probe" in result, "no probe reached the simulator"
    early = [m for m in NOT_UNTIL_A_VIEW_IS_ASKED_FOR if m in result["at_first_probe"]]
    assert early == [], f"imported by a daemon before anyone asked for a view: {early}"
    assert "monitor.web.api" in result["at_first_probe"]  # the routes are mounted
    assert set(NOT_UNTIL_A_VIEW_IS_ASKED_FOR) <= set(result["at_exit"])  # and the view answered with them
    postgres = [m for m in NEVER_ON_SQLITE if m in result["at_exit"]]
    assert postgres == [], f"imported by a daemon on SQLite: {postgres}"
    # The database's threads and the service loop's share one heap besides the main thread's (app.share_thread_heaps).
    heaps = [line for line in (tmp_path / "daemon.log").read_text().splitlines() if line.startswith("Arena ")]
    assert 1 <= len(heaps) <= THREAD_HEAPS, heaps
