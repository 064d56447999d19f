"""`once` reaches its first request without what it does not need by then (issue 26, the daemon's own cost).

Every module imported and every collection run before the first request is start-up a CronJob's run pays
(docs/benchmarks.md, `once` start-up). A real `once` probes the simulator in a child process; an audit
hook takes the modules loaded when it opens its first connection to the simulator, and a gc callback
notes any collection before it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.conftest import ROOT, SimProcess, run_cli
from tests.support.daemon import write_config

CHILD = """
import gc, json, os, sys
port = int(os.environ["STARTUP_SIM_PORT"])
seen = {}
collections = []

def on_connect(event, args):
    if event == "socket.connect" and not seen and isinstance(args[1], tuple) and args[1][1:2] == (port,):
        seen["modules"] = sorted(sys.modules)
        seen["collections"] = list(collections)

def on_gc(phase, info):
    if phase == "start" and not seen:
        collections.append(info["generation"])

sys.addaudithook(on_connect)
from monitor import cli  # as `python -m monitor` imports it, before main turns the collector off
gc.callbacks.append(on_gc)
code = cli.main(sys.argv[1:])
with open(os.environ["STARTUP_OUT"], "w") as out:
    json.dump({"code": code, **seen}, out)
"""

# Modules `once` must not have imported when its first request leaves: the store (SQLAlchemy, its
# models, the writer), detection and alert delivery open after probing, the saved calibration being read
# without them; the pages, the listener and the scheduler are `run`'s; OpenTelemetry is off in this config;
# tick claims are for shared jobs of `run`; the Pushgateway is pushed to after the run; rich (installed
# with the development tools) is not for structlog to load.
NOT_BEFORE_THE_FIRST_REQUEST = (
    "sqlalchemy",
    "monitor.store.engine",
    "monitor.store.models",
    "monitor.store.repository",
    "monitor.store.writer",
    "monitor.detect.service",
    "monitor.alert.dispatcher",
    "alembic",
    "aiohttp.web",
    "jinja2",
    "opentelemetry",
    "rich",
    "monitor.web",
    "monitor.served",
    "monitor.otel.export",
    "monitor.metrics.server",
    "monitor.metrics.push",
    "monitor.schedule.scheduler",
    "monitor.schedule.claims",
    "monitor.store.ticks",
    "monitor.store.migrate",
    "monitor.detect.replay",
)


def test_once_sends_its_first_request_without_the_modules_it_does_not_need_and_without_a_collection(
    sim: SimProcess, tmp_path: Path
) -> None:
    config = write_config(tmp_path, sim)
    assert run_cli("db", "upgrade", "--config", str(config)).code == 0
    out = tmp_path / "startup.json"
    env = {**os.environ, "STARTUP_SIM_PORT": str(urlsplit(sim.url).port), "STARTUP_OUT": str(out)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "once", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["code"] == 0, done  # the probe was made and its sample stored
    assert "modules" in result, "no connection to the simulator was seen"
    loaded = set(result["modules"])
    early = sorted(
        name for name in loaded if any(name == m or name.startswith(m + ".") for m in NOT_BEFORE_THE_FIRST_REQUEST)
    )
    assert early == [], f"imported before the first request: {early}"
    # The collector stays off until the heap is frozen, and freezing it does not collect first (~50 ms).
    assert result["collections"] == [], "a garbage collection ran before the first request"
    # What it does need is there: the probe's client and the saved calibration, read without the store.
    assert {"aiohttp.client", "monitor.store.saved_calibration"} <= loaded


def test_once_whose_store_fails_after_probing_exits_3_naming_the_fix_and_spools_what_it_measured(
    sim: SimProcess, tmp_path: Path
) -> None:
    # The saved calibration reads (its table is there), but the schema says it is a migration behind:
    # `once` has probed by the time the store says so. The same message and exit code as at start, the
    # run in the spool, and written by the next run once the schema is current.
    config = write_config(tmp_path, sim)
    assert run_cli("db", "upgrade", "--config", str(config)).code == 0
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        head = conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    failed = run_cli("once", "--config", str(config), timeout=60)
    assert failed.code == 3, str(failed)
    assert "ttft-monitor once: " in failed.stderr and "ttft-monitor db upgrade" in failed.stderr, str(failed)
    assert "ttft-monitor once: 1 runs wait in the spool" in failed.stderr, str(failed)
    assert "Traceback" not in failed.stdout + failed.stderr
    with sqlite3.connect(tmp_path / "ttft.db") as conn:  # the schema is current again
        conn.execute("UPDATE alembic_version SET version_num = ?", (head,))
    again = run_cli("once", "--config", str(config), timeout=60)
    assert again.code == 0, str(again)
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
