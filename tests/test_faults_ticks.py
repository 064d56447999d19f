"""Every tick accounted for, with the real daemon as a child process: reloads just before a tick,
a stalled process (SIGSTOP), and steps of the wall clock (libfaketime).

Each test compares the ticks the schedule named with the runs stored and the ticks counted as missed.
"""

from __future__ import annotations

import itertools
import re
import signal
import sqlite3
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.test_daemon import (
    Daemon,
    SimProcess,
    http_get,
    sim,  # noqa: F401 - the fixture
    start_daemon,
    stop_daemon,
    upgrade,
    wait_ready,
    write_config,
)

EVERY_SECOND = "* * * * * *"

pytestmark = pytest.mark.timeout(120)


def stored_ticks(folder: Path) -> list[datetime]:
    with sqlite3.connect(folder / "ttft.db") as conn:
        rows = conn.execute("select intended_at from runs where job = 'tick' order by intended_at").fetchall()
    return [datetime.fromisoformat(r[0]) for r in rows]


def holes(ticks: list[datetime], step_s: float = 1.0) -> list[str]:
    """The ticks missing between the first and the last stored one."""
    return [
        f"{a.isoformat()} -> {b.isoformat()}"
        for a, b in itertools.pairwise(ticks)
        if (b - a).total_seconds() > step_s * 1.5
    ]


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    status, body = http_get(daemon.metrics_url + "/metrics")
    assert status == 200
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in body.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(part in match.group(1).split(",") for part in wanted.split(",") if part):
            return float(match.group(2))
    return 0.0


def sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        time.sleep(min(left, 0.05) if left > 0.06 else left)


def test_sighup_just_before_every_tick_loses_no_tick(sim: SimProcess, tmp_path: Path) -> None:  # noqa: F811
    config = write_config(tmp_path, sim, schedule=EVERY_SECOND)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    reloads = 12
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        for _ in range(reloads):
            tick = int(time.time()) + 1
            sleep_until(tick - 0.005)  # the reload holds the loop as the tick falls due
            daemon.process.send_signal(signal.SIGHUP)
            sleep_until(tick + 0.3)
        daemon.wait_for("config_reloaded", count=reloads)
        time.sleep(1.5)
        missed = sum(
            metric(daemon, "ttft_monitor_scheduler_missed_runs_total", probe_job="tick", reason=reason)
            for reason in ("coalesced", "misfired", "still_running")
        )
    finally:
        assert stop_daemon(daemon) == 0
    ticks = stored_ticks(tmp_path)
    assert not holes(ticks), (holes(ticks), daemon.log_path.read_text()[-3000:])
    assert len(ticks) >= reloads + 2
    assert missed == 0


def test_a_stalled_process_counts_the_ticks_it_folded(sim: SimProcess, tmp_path: Path) -> None:  # noqa: F811
    config = write_config(tmp_path, sim, schedule=EVERY_SECOND)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        daemon.process.send_signal(signal.SIGSTOP)  # a suspended VM, a frozen cgroup
        stopped = time.monotonic()
        time.sleep(5)
        daemon.process.send_signal(signal.SIGCONT)
        stalled = time.monotonic() - stopped
        time.sleep(2.5)
        missed = {
            reason: metric(daemon, "ttft_monitor_scheduler_missed_runs_total", probe_job="tick", reason=reason)
            for reason in ("coalesced", "misfired", "still_running")
        }
        folded = daemon.events("job_runs_coalesced")
    finally:
        assert stop_daemon(daemon) == 0
    log = daemon.log_path.read_text()[-3000:]
    assert abs(missed["coalesced"] - (stalled - 1)) <= 1, (missed, stalled, log)
    assert [e["missed"] for e in folded] and sum(e["missed"] for e in folded) == missed["coalesced"], (folded, log)
    assert all(e["job"] == "tick" and e["first_missed"] < e["scheduled"] for e in folded), folded
    # Every tick the schedule named between the first and the last run was stored or counted.
    ticks = stored_ticks(tmp_path)
    due = round((ticks[-1] - ticks[0]).total_seconds()) + 1
    assert due == len(ticks) + sum(missed.values()), (due, len(ticks), missed, holes(ticks))
