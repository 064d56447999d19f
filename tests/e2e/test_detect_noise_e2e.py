"""The noise model end to end (issue 20): the real daemon probes the simulator, whose TTFT carries load
that comes and goes (half of its noise's variance an AR(1) process shared by every request), every
second, with `detection.noise_model` on. Hours' worth of runs raise no incident; then the simulator
doubles its latency and a page reaches a webhook on loopback within the runs the issue allows.

A second here stands for a 5-minute run: the AR(1) step is one second, so runs correlate as 5-minute
runs under load that comes and goes for about an hour do (phi 0.9 per run, as the bench's `ar:0.9:0.5`,
at sigma 0.2). A minute is no week: the series has no seasonal baseline, so its runs are judged
against the trailing one, where only pages (and availability) can open; the bench scores the rest.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from tests.conftest import SimProcess, start_sim, stop_sim
from tests.support.alert_fixtures import Loopback
from tests.support.daemon import Daemon, start_daemon, stop_daemon, upgrade, write_config

pytest_plugins = ("tests.support.alert_fixtures",)

MODEL = "wander"
# Fast enough that 5 probes, doubled, fit in a 1-second tick; sigma 0.2 per probe (the simulator's own
# models have 0.15 to 0.2), half of its variance load that comes and goes.
PROFILE = {
    "ttft_base_ms": 60.0,
    "prefill_ms_per_1k": 0.0,
    "noise_sigma": 0.2,
    "decode_tps": 400.0,
    "reasoning_tokens": 0,
    "ar_share": 0.5,
    "ar_phi": 0.9,
    "ar_step_s": 1.0,
}
ROUNDS = 5
# 60 runs: 5 hours of 5-minute runs, 3 of them after `min_history_runs` (24) lets anything open.
QUIET_RUNS = 60
# Issue 20: a doubling is paged within 30 minutes at 5 probes per run: 6 runs of 5 minutes.
PAGE_WITHIN_RUNS = 6


def noise_config(folder: Path, sim: SimProcess, hook: str) -> Path:
    extra = f"""detection:
  noise_model: true
  # The simulator answers in 60 ms, so a doubling is +60 ms: under the 100 ms a page asks of a real
  # endpoint (where 60 ms is network noise). Every other rule is as shipped.
  page: {{min_delta_ms: 20}}
alerts:
  receivers:
    hook: {{type: webhook, url: "{hook}"}}
  routes:
    - receivers: [hook]
"""
    return write_config(folder, sim, schedule="* * * * * *", model=MODEL, rounds=ROUNDS, grace=5, extra=extra)


async def runs_finished(daemon: Daemon, count: int, *, seconds: float) -> None:
    """Until `count` runs have finished; without blocking the loop the webhook receiver runs on."""
    deadline = time.monotonic() + seconds
    while len(daemon.events("job_finished")) < count:
        assert daemon.process.poll() is None, daemon.log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{count} runs not finished in {seconds} s"
        await asyncio.sleep(0.2)


def runs_before_page(daemon: Daemon, after_runs: int) -> tuple[int | None, int]:
    """How many runs finished after the first `after_runs` until a regression page was raised, from the
    daemon's log in order (None while none has been), and how many of those runs' samples the daemon marked
    disturbed (its own loop late around their stamps: no evidence, so a run's worth of its evidence each)."""
    finished = disturbed = 0
    for event in daemon.logs():
        if event.get("event") == "job_finished":
            finished += 1
        elif event.get("event") == "probe_sample" and finished >= after_runs and event.get("disturbed"):
            disturbed += 1
        elif event.get("event") in ("incident_open", "incident_update") and event.get("severity") == "page":
            assert event["kind"] == "regression", event
            return finished - after_runs, disturbed
    return None, disturbed


@pytest.mark.realtime
@pytest.mark.timeout(150)
async def test_correlated_noise_raises_no_incident_for_hours_of_runs_and_a_doubling_pages(
    loopback: Loopback, tmp_path: Path
) -> None:
    sim = start_sim("--seed", "20")
    try:
        sim.post(f"/sim/models/{MODEL}", PROFILE)
        config = noise_config(tmp_path, sim, loopback.url("/hook"))
        upgrade(config)
        daemon = start_daemon(config, tmp_path)
        try:
            await runs_finished(daemon, QUIET_RUNS, seconds=QUIET_RUNS * 1.5 + 15)
            quiet = daemon.events("incident_open")
            assert quiet == [], quiet
            assert loopback.received == []
            before = len(daemon.events("job_finished"))
            sim.post(f"/sim/models/{MODEL}", {"ttft_base_ms": 2 * PROFILE["ttft_base_ms"]})
            # Up to three times the runs allowed, so a late page says how late it was.
            await runs_finished(daemon, before + 3 * PAGE_WITHIN_RUNS, seconds=3 * PAGE_WITHIN_RUNS * 2 + 5)
            runs, disturbed = runs_before_page(daemon, before)
            if runs is not None:
                await loopback.wait_for(1, path="/hook", seconds=10)
        finally:
            assert stop_daemon(daemon) == 0
    finally:
        stop_sim(sim)
    # The run under way when the latency doubled was partly fast: one run more than the issue's; and a run more
    # for each sample the daemon marked disturbed meanwhile (none on a quiet machine; under the test suite's
    # load, some: left out of detection, as the instrument's own delay must be).
    assert runs is not None and runs <= PAGE_WITHIN_RUNS + 1 + disturbed, (
        f"paged after {runs} runs ({disturbed} disturbed)"
    )
    notices = [item.json()["data"] for item in loopback.at("/hook")]
    assert [(n["state"], n["kind"], n["severity"]) for n in notices][:1] == [("firing", "regression", "page")], notices
    # The notice says why, in figures: the shift and over how many runs. The series is minutes old: its noise
    # model learns from the runs a day before each run, so it has measured nothing, and the notice says so
    # rather than "sd 0.00, runs look independent" (tests/unit/test_regression_evidence.py: a day-old series'
    # notice gives the sd and how long runs correlate).
    assert re.fullmatch(
        r"\+\d+% over \d+ runs \(noise not measured yet: under a day of seasonal history\)", notices[0]["summary"]
    ), notices[0]
