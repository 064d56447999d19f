"""Triage end to end: the simulator, the real daemon and the real CLI as child processes, and a webhook
receiver on loopback. A change is annotated, a model slows down, the incident's notification names the
annotation; it is acknowledged, labelled and resolved by hand, the resolve is delivered, and
`incidents` and `incidents stats` show it all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from monitor.exitcodes import EXIT_OK
from tests.conftest import ROOT, SimProcess, start_sim, stop_sim
from tests.support.alert_fixtures import Loopback, Received
from tests.support.ports import free_port

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

SLOWED = "gpt-4o-mini"
# Unmistakable even on a loaded machine, where probes of the simulator jitter by hundreds of ms.
SLOW_FACTOR = 5.0


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def write_config(folder: Path, sim: SimProcess, hook_url: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: e2e
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
targets:
  mini:
    provider: sim
    model: {SLOWED}
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: e2e
    # Every 2 s: the detector counts runs (a baseline, then a window of slow ones), not seconds; a slowed
    # run (3 rounds of ~1.3 s) outlasts its tick, and the next tick waits.
    schedule: "*/2 * * * * *"
    targets: [mini]
    prompts: [short]
    rounds: 3
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 6
  trailing_runs: 12
alerts:
  receivers:
    hook: {{type: webhook, url: "{hook_url}"}}
"""
    )
    return path


async def cli(config: Path, *args: str) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"} | {"USER": "e2e"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "monitor",
        *args,
        "--config",
        str(config),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    result = Result(process.returncode, stdout.decode(), stderr.decode())
    assert "Traceback" not in result.stderr, result
    return result


def tail(log: Path) -> str:
    return log.read_text()[-4000:]


async def wait_for(what: str, found: Callable[[], object], *, within_s: float, log: Path) -> object:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {what} within {within_s} s; daemon log:\n{tail(log)}")


def stored_runs(folder: Path) -> int:
    try:
        with sqlite3.connect(folder / "ttft.db") as connection:
            return int(connection.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0


def received(loopback: Loopback, event: str) -> list[Received]:
    return [item for item in loopback.at("/hook") if item.json()["type"] == event]


@pytest.fixture
def sim() -> AsyncIterator[SimProcess]:  # type: ignore[misc]
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


@pytest.mark.realtime
@pytest.mark.timeout(600)
async def test_a_slowdown_is_annotated_acked_labelled_resolved_by_hand_and_counted(
    tmp_path: Path, sim: SimProcess, loopback: Loopback
) -> None:
    config = write_config(tmp_path, sim, loopback.url("/hook"))
    assert (await cli(config, "db", "upgrade")).code == EXIT_OK
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        daemon = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "monitor",
            "run",
            "--config",
            str(config),
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "TTFT_CONFIG")},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        # A baseline first: the detector wants min_history_runs runs of history.
        await wait_for("7 stored runs", lambda: stored_runs(tmp_path) >= 7, within_s=120, log=log)
        result = await cli(config, "annotate", "vLLM upgraded", "--target", "mini")
        assert result.code == EXIT_OK, result
        stamp = result.stdout.split(" recorded at ")[1][11:16]  # HH:MM of the ISO time printed
        profile = sim.get("/sim/models")["models"][SLOWED]
        sim.post(
            f"/sim/models/{SLOWED}",
            {
                "ttft_base_ms": profile["ttft_base_ms"] * SLOW_FACTOR,
                "prefill_ms_per_1k": profile["prefill_ms_per_1k"] * SLOW_FACTOR,
            },
        )
        await wait_for("firing webhook", lambda: received(loopback, "incident.firing"), within_s=240, log=log)
        firing = received(loopback, "incident.firing")[0].json()["data"]
        assert firing["kind"] == "regression" and firing["series"]["target"] == "mini"
        assert f"Change: after annotation 'vLLM upgraded' at {stamp} UTC" in firing["text"], firing["text"]
        incident = firing["incident_id"]
        short = incident[:8]

        result = await cli(config, "incidents", "ack", short)
        assert result.code == EXIT_OK and f"acknowledged incident {short}" in result.stdout, result
        result = await cli(config, "incidents", "label", short, "true-positive")
        assert result.code == EXIT_OK, result
        # Closed by hand while the model is still slow, then the model recovers: recovered first, the runs every
        # 2 s could resolve it on their own before the command (a second of start-up, more on a loaded machine).
        result = await cli(config, "incidents", "resolve", short, "--note", "rolled back vLLM")
        sim.post("/sim/reset", {})
        assert result.code == EXIT_OK and "queued for hook" in result.stdout, result
        await wait_for("resolved webhook", lambda: received(loopback, "incident.resolved"), within_s=60, log=log)
        resolved = received(loopback, "incident.resolved")[0].json()["data"]
        assert resolved["incident_id"] == incident
        assert resolved["summary"] == "Resolved by hand by e2e: rolled back vLLM"

        result = await cli(config, "incidents")
        assert result.code == EXIT_OK, result
        assert "  acked: by e2e at" in result.stdout and "  label: true-positive" in result.stdout, result
        assert "  resolved by hand: by e2e: rolled back vLLM" in result.stdout
        assert "  change: after annotation 'vLLM upgraded'" in result.stdout
        assert "mini: vLLM upgraded (by e2e)" in result.stdout
        shown = {item["id"]: item for item in json.loads((await cli(config, "incidents", "-f", "json")).stdout)}
        assert (shown[incident]["state"], shown[incident]["acked_by"], shown[incident]["label"]) == (
            "resolved",
            "e2e",
            "true-positive",
        )

        result = await cli(config, "incidents", "stats", "--format", "json")
        assert result.code == EXIT_OK, result
        rows = {(row["kind"], row["severity"]): row for row in json.loads(result.stdout)}
        mine = rows[("regression", firing["severity"])]
        assert (mine["true_positive"], mine["false_positive"], mine["precision"]) == (1, 0, 1.0), rows
        result = await cli(config, "incidents", "stats")
        line = next(row for row in result.stdout.splitlines() if row.startswith(f"regression  {firing['severity']}"))
        assert line.split()[2:4] == ["100%", "1"], result
    finally:
        if daemon.returncode is None:
            daemon.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(daemon.wait(), timeout=30)
        except TimeoutError:
            daemon.kill()
            await daemon.wait()
            raise
    assert code == 0, tail(log)
