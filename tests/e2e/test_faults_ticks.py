"""Every tick accounted for, with the real daemon as a child process: reloads just before a tick,
a stalled process (SIGSTOP), and steps of the wall clock (libfaketime).

Each test compares the ticks the schedule named with the runs stored and the ticks counted as missed.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import SimProcess
from tests.support import apt
from tests.support.daemon import (
    Daemon,
    http_get,
    start_daemon,
    stop_daemon,
    upgrade,
    wait_ready,
    write_config,
)

EVERY_SECOND = "* * * * * *"

pytestmark = pytest.mark.timeout(120)


def set_fake_offset(path: Path, offset: str) -> None:
    """Write libfaketime's offset file in one step: it is read at every clock call
    (FAKETIME_NO_CACHE), and a reader between a truncate and a write sees no offset, a step of its own."""
    staged = path.with_suffix(".new")
    staged.write_text(offset)
    os.replace(staged, path)


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


@pytest.mark.realtime
def test_sighup_just_before_every_tick_loses_no_tick(sim: SimProcess, tmp_path: Path) -> None:
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


@pytest.mark.realtime
def test_a_storm_of_changing_and_broken_reloads_loses_no_tick_of_a_job_every_valid_file_keeps(
    sim: SimProcess, tmp_path: Path
) -> None:
    # The unchanged file alone is the easy case: here each SIGHUP reads a different file. `tick` is in
    # every valid one with its timing unchanged but other fields changed; a second job comes, goes and is
    # re-timed around it; one file in four is refused. Before, every reload removed and re-added every
    # job, and a job present in every valid file stored 22 of about 30 ticks.
    config = write_config(tmp_path, sim, schedule=EVERY_SECOND)
    base = config.read_text()
    other = "  - name: other\n    schedule: '0 0 0 1 1 *'\n    targets: [fast]\n    prompts: [short]\n"
    variants = [
        base,
        base + other,  # a job added
        base.replace("short: {tokens: 256}", "short: {tokens: 200}") + other,  # tick's prompt changed
        base + "  - name: tick\n    schedule: '* * * * * *'\n    targets: [nowhere]\n",  # refused: named twice
        base + other.replace("0 0 0 1 1 *", "0 0 0 2 1 *"),  # the other job re-timed
        base.replace("pause_s: 0", "pause_s: 0.1\n    connection: fresh"),  # tick's own fields changed
        base + "jobs: [",  # refused: not YAML
        base,  # the other job removed
    ]
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    reloads = 24
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2)
        for n in range(reloads):
            staged = config.with_suffix(".new")
            staged.write_text(variants[n % len(variants)])
            os.replace(staged, config)  # the daemon never reads half a file
            tick = int(time.time()) + 1
            sleep_until(tick - 0.005)  # the reload holds the loop as the tick falls due
            daemon.process.send_signal(signal.SIGHUP)
            sleep_until(tick + 0.3)
        applied = len(daemon.wait_for("config_reloaded", count=reloads - reloads // 4))
        rejected = len(daemon.events("reload_rejected"))
        time.sleep(1.5)
        missed = sum(
            metric(daemon, "ttft_monitor_scheduler_missed_runs_total", probe_job="tick", reason=reason)
            for reason in ("coalesced", "misfired", "still_running")
        )
    finally:
        assert stop_daemon(daemon) == 0
    log = daemon.log_path.read_text()[-3000:]
    # Every file was read: the valid ones applied, the two broken ones (one in four) refused.
    assert applied + rejected == reloads and rejected == reloads // 4, (applied, rejected, log)
    ticks = stored_ticks(tmp_path)
    assert not holes(ticks), (holes(ticks), log)
    assert len(ticks) >= reloads + 2
    assert missed == 0, log


@pytest.mark.realtime
def test_a_stalled_process_counts_the_ticks_it_folded(sim: SimProcess, tmp_path: Path) -> None:
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


LIBFAKETIME_PATHS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")


@pytest.fixture
def libfaketime() -> str:
    """libfaketime (Debian's `faketime`), installed when missing, as the other real peers are."""
    found = next((p for p in LIBFAKETIME_PATHS if Path(p).exists()), None)
    if found is None:
        why = apt.install("faketime", LIBFAKETIME_PATHS[0])
        found = next((p for p in LIBFAKETIME_PATHS if Path(p).exists()), None)
        if found is None:
            pytest.skip(f"libfaketime: {why or 'installed, but not at ' + ', '.join(LIBFAKETIME_PATHS)}")
    return found


@pytest.mark.realtime
def test_wall_clock_steps_re_arm_the_schedule_and_no_run_time_lies_in_the_future(
    sim: SimProcess,
    tmp_path: Path,
    libfaketime: str,
) -> None:
    offset = tmp_path / "faketime"
    set_fake_offset(offset, "+0\n")
    config = write_config(tmp_path, sim, schedule=EVERY_SECOND)
    upgrade(config)
    # Only the wall clock is faked: the monotonic clock (the loop's timers) goes on, as in a real step.
    daemon = start_daemon(
        config,
        tmp_path,
        env={
            "LD_PRELOAD": libfaketime,
            "FAKETIME_TIMESTAMP_FILE": str(offset),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        },
    )

    def finished() -> int:
        return len(daemon.events("job_finished"))

    def settled(ahead: Callable[[], float], within_s: float = 6.0) -> float:
        """How far the exported last run lies ahead of now, once the daemon has seen the step (it checks
        every 0.5 s; a loaded machine may take a few seconds): the first reading at or below zero, or
        the last one."""
        deadline = time.monotonic() + within_s
        while True:
            time.sleep(0.25)
            value = ahead()
            if value <= 0 or time.monotonic() > deadline:
                return value

    def last_run() -> float:
        return metric(daemon, "ttft_monitor_job_last_run_timestamp_seconds", probe_job="tick")

    def runs_since(before: int, *, count: int, within_s: float) -> int:
        """The runs finished since `before` was read, once there are `count` of them or `within_s` has
        passed: a quick machine does not wait out the window, a loaded one gets all of it."""
        deadline = time.monotonic() + within_s
        while finished() - before < count and time.monotonic() < deadline:
            time.sleep(0.1)
        return finished() - before

    try:
        wait_ready(daemon, timeout=60)  # libfaketime's every clock call slows a loaded machine's start-up
        daemon.wait_for("job_finished", count=2)
        set_fake_offset(offset, "-120\n")  # two minutes back: the next tick lay two minutes ahead
        ahead_after_back = settled(lambda: last_run() - (time.time() - 120))
        after_back = runs_since(finished(), count=2, within_s=4)
        coalesced_before = metric(
            daemon, "ttft_monitor_scheduler_missed_runs_total", probe_job="tick", reason="coalesced"
        )
        set_fake_offset(offset, "+3600\n")  # an hour forward ...
        daemon.wait_for("clock_step", count=2)
        ran_ahead = runs_since(finished(), count=1, within_s=4)  # a run stamped an hour ahead, to be corrected
        before = finished()
        set_fake_offset(offset, "+0\n")  # ... and corrected: an hour back
        future = settled(lambda: last_run() - time.time())
        after_correction = runs_since(before, count=1, within_s=4)
        daemon.wait_for("clock_step", count=3)
        steps = {d: metric(daemon, "ttft_monitor_clock_steps_total", direction=d) for d in ("forward", "backward")}
        coalesced = metric(daemon, "ttft_monitor_scheduler_missed_runs_total", probe_job="tick", reason="coalesced")
    finally:
        assert stop_daemon(daemon) == 0
    log = daemon.log_path.read_text()[-3000:]
    assert after_back >= 2, log  # probing went on (0 before: nothing for two minutes)
    assert ran_ahead >= 1, log
    assert ahead_after_back <= 0, ahead_after_back  # moved back with the clock, not left in its future
    # Probing goes on after the hour back (0 before: nothing for an hour). At least one run in 4 s: a
    # loaded machine's runs may take longer than this every-second schedule.
    assert after_correction >= 1, log
    assert future <= 0, (future, log)  # was an hour ahead, the staleness alert blind for that hour
    assert steps == {"forward": 1, "backward": 2}, (steps, log)
    sizes = sorted(round(e["step_s"]) for e in daemon.events("clock_step"))
    assert sizes == [-3600, -120, 3720], sizes
    # The hour stepped over is a step, not a stall: before, its 3,600 ticks were counted coalesced. A
    # loaded machine may fold a tick or two of its own meanwhile.
    assert coalesced - coalesced_before <= 2, log
