"""SLO burn rates end to end: the real daemon probes the simulator over loopback HTTP into SQLite or
PostgreSQL; the model's TTFT crosses the target's `slo.ttft_ms`, an `slo_burn` page opens and is
notified, and resolves once the probes are fast again; `incidents` shows it, and `replay` of the
exported history finds the same incident. Windows are seconds long so the test takes half a minute."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.conftest import SimProcess, call_cli
from tests.support.daemon import start_daemon, stop_daemon, wait_ready
from tests.support.ports import free_port
from tests.support.store_fixtures import Backend

pytest_plugins = ("tests.support.store_fixtures",)

FAST = {"ttft_base_ms": 40, "prefill_ms_per_1k": 0, "decode_tps": 400}
SLOW = {"ttft_base_ms": 700, "prefill_ms_per_1k": 0, "decode_tps": 400}


def burn_config(folder: Path, simulator: SimProcess, db_url: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
database:
  url: "{db_url}"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{free_port()}"
providers:
  sim:
    base_url: "{simulator.v1}"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  burner:
    provider: sim
    model: burner
    params: {{max_tokens: 4}}
    slo: {{ttft_ms: 300, objective: 0.99}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: tick
    schedule: "*/2 * * * * *"
    targets: [burner]
    prompts: [short]
    rounds: 2
    warmup: 0
    pause_s: 0
detection:
  slo_burn:
    min_probes: 4
    keep_firing_minutes: 0
    windows:
      - {{severity: page, burn_rate: 14.4, long_window_minutes: 0.5, short_window_minutes: 0.1}}
alerts:
  send_resolved: true
  receivers:
    console: {{type: log}}
  routes:
    - receivers: [console]
"""
    )
    return path


@pytest.mark.realtime
@pytest.mark.timeout(180)
async def test_a_target_over_its_ttft_objective_pages_by_burn_rate_and_resolves(
    sim: SimProcess,
    backend: Backend,
    tmp_path: Path,
) -> None:
    sim.post("/sim/models/burner", FAST)
    config = burn_config(tmp_path, sim, backend.url)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=3, timeout=30)
        assert not [e for e in daemon.events("incident_open") if e.get("kind") == "slo_burn"]
        sim.post("/sim/models/burner", SLOW)
        opened = daemon.wait_for("incident_open", timeout=40)
        sim.post("/sim/models/burner", FAST)
        resolved = daemon.wait_for("incident_resolve", timeout=40)
        notices = daemon.wait_for("alert_notification", count=2, timeout=30)
        # Fast runs past the resolve, for the replay below: it dates a run by its first request, the daemon
        # by the run's start, so a slow run on the edge of the short window can hold the replayed page
        # one run longer (seen under a loaded CI: the history ended on the daemon's resolving run).
        finished = len(daemon.events("job_finished"))
        daemon.wait_for("job_finished", count=finished + 4, timeout=30)
    finally:
        assert stop_daemon(daemon) == 0
    assert [(e["kind"], e["severity"], e["target"]) for e in opened] == [("slo_burn", "page", "burner")]
    assert "of probes over 300 ms or failed in the last 30 s" not in opened[0]["summary"]  # windows in min/h/d
    assert "of probes over 300 ms or failed in the last 0.5 min (SLO 99%): burning" in opened[0]["summary"]
    assert resolved[0]["kind"] == "slo_burn"
    firing = [n for n in notices if n["state"] == "firing"]
    back = [n for n in notices if n["state"] == "resolved"]
    assert len(firing) == 1 and len(back) == 1, notices
    assert firing[0]["message"].startswith("[PAGE] TTFT SLO burn rate on burner / * @ lab: burning the error budget")
    assert firing[0]["ratio"] >= 14.4 and firing[0]["baseline_ms"] == 300
    assert back[0]["message"].startswith("[RESOLVED] TTFT SLO burn rate on burner / * @ lab: back under, peaked at")
    assert back[0]["incident_id"] == firing[0]["incident_id"]

    # The commands in-process, in a thread of their own (they call asyncio.run): what they print and return
    # is the point here, not a new interpreter's start-up.
    listed = await asyncio.to_thread(call_cli, "incidents", "--format", "json", "--config", str(config))
    assert listed.code == 0, str(listed)
    burns = [i for i in json.loads(listed.stdout) if i["kind"] == "slo_burn"]
    assert len(burns) == 1, listed.stdout
    assert burns[0]["state"] == "resolved" and burns[0]["severity"] == "page" and burns[0]["prompt"] == "*"
    assert burns[0]["peak_ratio"] >= 14.4 and "burning" in burns[0]["summary"]
    table = await asyncio.to_thread(call_cli, "incidents", "--config", str(config))
    assert "burner / * @ lab" in table.stdout and "  slo: burner: " in table.stdout, table.stdout

    exported = tmp_path / "history.csv"
    assert (await asyncio.to_thread(call_cli, "replay", "--export", str(exported), "--config", str(config))).code == 0
    replayed = await asyncio.to_thread(call_cli, "replay", "--samples", str(exported), "--config", str(config))
    assert replayed.code == 0, str(replayed)
    found = [json.loads(line) for line in replayed.stdout.splitlines()]
    again = [i for i in found if i["kind"] == "slo_burn"]
    assert [(i["series"], i["severity"]) for i in again] == [("burner/*/lab", "page")], replayed.stdout
    assert again[0]["resolved_at"] is not None
