"""Is the prompt cache working, end to end: a `cache: both` prompt probed busted and warm in every run
against the simulator's prefix cache, over loopback HTTP, stored, judged and delivered to a webhook.

Switching the simulator's prefix cache off (as `--no-enable-prefix-caching` would) is one
`cache_stopped` incident on the warm series, with one notification when it opens and one when the
cache works again, and no TTFT regression of the warm probes (the same cause, told once). The real
daemon shows it in its metrics, its API and `incidents`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from monitor.schedule.pipeline import execute
from monitor.store.models import IncidentRow, RunRow, SampleRow, SeriesRow
from tests.conftest import SimProcess, run_cli
from tests.support.alert_fixtures import Loopback
from tests.support.daemon import start_daemon, stop_daemon, wait_ready
from tests.support.pipeline import job_pipeline
from tests.support.ports import free_port

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

# Cold: 20 + 150 ms per 1k prompt tokens (about 330 ms at 2,048); warm: the prefix is free, about 20 ms.
PROFILE = {"ttft_base_ms": 20.0, "prefill_ms_per_1k": 150.0, "noise_sigma": 0.05, "thinks_by_default": False}
HEALTHY, OFF, BACK = 10, 9, 5


def write_config(folder: Path, sim: SimProcess, hook: str, *, schedule: str = "*/5 * * * *", listen: str = "") -> Path:
    path = folder / "config.yaml"
    metrics = f'metrics: {{listen: "{listen}"}}\n' if listen else ""
    path.write_text(
        f"""
location: lab
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
{metrics}providers:
  gateway: {{base_url: "{sim.v1}", api: openai-chat}}
targets:
  cachey: {{provider: gateway, model: cachey, params: {{max_tokens: 2}}}}
prompts:
  long: {{tokens: 2048, cache: both}}
jobs:
  - name: cache-watch
    schedule: "{schedule}"
    targets: [cachey]
    prompts: [long]
    rounds: 2
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 6
  trailing_runs: 12
  page: {{min_delta_ms: 10}}
alerts:
  receivers:
    hook: {{type: webhook, url: "{hook}"}}
  routes:
    - receivers: [hook]
      severities: [page, ticket, info]
"""
    )
    return path


@pytest.mark.timeout(240)
async def test_a_prefix_cache_switched_off_is_one_cache_incident_and_no_regression(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    path = write_config(tmp_path, exact_sim, loopback.url("/hook"))
    async with job_pipeline(path) as pipeline:
        exact_sim.post("/sim/models/cachey", PROFILE)
        # The plan holds the busted prompt and its warm twin, which gets one unmeasured warm-up of its own.
        assert [(p.name, p.cache, p.primed) for p in pipeline.plan.prompts] == [
            ("long", "bust", False),
            ("long.warm", "warm", True),
        ]
        for index in range(HEALTHY + OFF + BACK):
            if index == HEALTHY:
                exact_sim.post("/sim/models/cachey", {"prefix_cache": False})
            if index == HEALTHY + OFF:
                exact_sim.post("/sim/models/cachey", {"prefix_cache": True})
            await execute(pipeline.context, job="cache-watch", plan=pipeline.plan)
            await pipeline.dispatcher.dispatch_due()
        async with pipeline.store.engine.connect() as connection:
            incidents = (
                await connection.execute(
                    sa.select(IncidentRow.kind, SeriesRow.prompt, IncidentRow.resolved_at, IncidentRow.details).join(
                        SeriesRow, SeriesRow.id == IncidentRow.series_id
                    )
                )
            ).all()
            cached = (
                await connection.execute(
                    sa.select(SeriesRow.prompt, SampleRow.warmup, SampleRow.cached_tokens)
                    .select_from(SampleRow)
                    .join(RunRow, RunRow.id == SampleRow.run_id)
                    .join(SeriesRow, SeriesRow.id == RunRow.series_id)
                )
            ).all()
    # Healthy warm probes were served from the cache (all but a partial block), busted ones never.
    warm_measured = [c for prompt, warmup, c in cached if prompt == "long.warm" and not warmup]
    assert len(warm_measured) == (HEALTHY + OFF + BACK) * 2
    assert all((c or 0) == 0 for prompt, _w, c in cached if prompt == "long")
    assert sum(1 for c in warm_measured if (c or 0) > 1500) == (HEALTHY + BACK) * 2, warm_measured
    assert [(kind, prompt) for kind, prompt, _r, _d in incidents] == [("cache_stopped", "long.warm")], incidents
    (_kind, _prompt, resolved_at, details) = incidents[0]
    assert resolved_at is not None and details["reason"] == "no_cached_tokens"
    assert details["reference"]["cached_share"] > 0.9 and details["reference"]["speedup"] > 5
    sent = [item.json()["data"] for item in loopback.at("/hook")]
    assert [(n["kind"], n["state"]) for n in sent] == [("cache_stopped", "firing"), ("cache_stopped", "resolved")]
    firing, back = sent
    assert firing["title"].startswith("[TICKET] Prompt cache stopped working on cachey / long.warm @ lab: speed-up")
    assert "warm probes found 0% of the prompt cached over the last 3 runs" in firing["summary"], firing
    assert back["title"].startswith("[RESOLVED] Prompt cache stopped working on cachey / long.warm @ lab: works")


@pytest.mark.realtime
@pytest.mark.timeout(240)
def test_the_daemon_shows_the_cache_speed_up_and_the_cache_incident(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path, exact_sim, loopback.url("/hook"), schedule="*/2 * * * * *", listen=listen)
    exact_sim.post("/sim/models/cachey", PROFILE)
    upgraded = run_cli("db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)
    daemon = start_daemon(path, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=8, timeout=60)
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as response:
            healthy = response.read().decode()
        exact_sim.post("/sim/models/cachey", {"prefix_cache": False})
        opened = daemon.wait_for("incident_open", timeout=60)
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as response:
            broken = response.read().decode()
        with urllib.request.urlopen(f"http://{listen}/api/v1/incidents?since=1h", timeout=10) as response:
            served = json.loads(response.read())["incidents"]
        with urllib.request.urlopen(f"http://{listen}/api/v1/series", timeout=10) as response:
            ids = {row["prompt"]: row["id"] for row in json.loads(response.read())["series"]}
        with urllib.request.urlopen(f"http://{listen}/api/v1/series/{ids['long.warm']}/points", timeout=10) as response:
            view = json.loads(response.read())
        exact_sim.post("/sim/models/cachey", {"prefix_cache": True})
        daemon.wait_for("incident_resolve", timeout=60)
    finally:
        assert stop_daemon(daemon) == 0
    assert [(e["kind"], e["prompt"]) for e in opened] == [("cache_stopped", "long.warm")], opened
    labels = 'location="lab",prompt="long",target="cachey"'
    speedup = float(healthy.split(f"ttft_monitor_cache_speedup_ratio{{{labels}}} ")[1].split()[0])
    assert speedup > 5, healthy
    share = float(healthy.split(f"ttft_monitor_cache_cached_share_ratio{{{labels}}} ")[1].split()[0])
    assert share > 0.9
    assert f"ttft_monitor_cache_stopped_state{{{labels}}} 0.0" in healthy
    assert f"ttft_monitor_cache_stopped_state{{{labels}}} 1.0" in broken
    assert f"ttft_monitor_cache_cached_share_ratio{{{labels}}} 0.0" in broken
    cache = [i for i in served if i["kind"] == "cache_stopped"]
    assert len(cache) == 1 and cache[0]["prompt"] == "long.warm", served
    assert not [i for i in served if i["kind"] == "regression"], served
    listed = run_cli("incidents", "--format", "json", "--config", str(path))
    assert listed.code == 0, str(listed)
    stored = [i for i in json.loads(listed.stdout) if i["kind"] == "cache_stopped"]
    assert len(stored) == 1 and stored[0]["state"] == "resolved", listed.stdout
    assert "stopped working: warm probes found 0% of the prompt cached" in stored[0]["summary"]
    # The series page's data: the pair's speed-up and cached share per run, healthy then gone.
    cache = view["cache"]
    assert (cache["cold_prompt"], cache["warm_prompt"], cache["cold_series_id"]) == ("long", "long.warm", ids["long"])
    assert cache["runs"] >= 11 and cache["speedup_p50"] > 5 and cache["cached_share_p50"] > 0.9, cache
    shares = [p["cached_share"] for p in cache["points"]]
    assert all(share > 0.9 for share in shares[:8]) and shares[-3:] == [0.0] * 3, shares
    assert [i["kind"] for i in view["incidents"]] == ["cache_stopped"], view["incidents"]


@pytest.mark.realtime
@pytest.mark.timeout(240)
async def test_a_pair_reloaded_away_closes_its_open_cache_incident(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    # No run judges a warm series after `cache: both` becomes `bust`: without the reload's own check its
    # incident would stay open, and its stopped gauge at 1, for ever. The daemon is driven from a thread:
    # the webhook answers on this test's event loop.
    listen = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path, exact_sim, loopback.url("/hook"), schedule="*/2 * * * * *", listen=listen)
    exact_sim.post("/sim/models/cachey", PROFILE)
    upgraded = await asyncio.to_thread(run_cli, "db", "upgrade", "--config", str(path))
    assert upgraded.code == 0, str(upgraded)

    def drive() -> tuple[dict, str]:
        daemon = start_daemon(path, tmp_path)
        try:
            wait_ready(daemon)
            daemon.wait_for("job_finished", count=8, timeout=60)
            exact_sim.post("/sim/models/cachey", {"prefix_cache": False})
            daemon.wait_for("incident_open", timeout=60)
            path.write_text(path.read_text().replace("cache: both", "cache: bust"))
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_for("config_reloaded", timeout=30)
            (closed,) = daemon.wait_for("incident_resolve", timeout=30)
            finished = len(daemon.events("job_finished"))
            daemon.wait_for("job_finished", count=finished + 2, timeout=30)
            daemon.wait_for("alert_sent", count=2, timeout=30)
            with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as response:
                return closed, response.read().decode()
        finally:
            assert stop_daemon(daemon) == 0

    closed, after = await asyncio.to_thread(drive)
    assert (closed["kind"], closed["prompt"]) == ("cache_stopped", "long.warm"), closed
    assert "closed without a verdict" in closed["summary"]
    assert "ttft_monitor_cache_stopped_state{" not in after and "ttft_monitor_cache_speedup_ratio{" not in after
    listed = await asyncio.to_thread(run_cli, "incidents", "--format", "json", "--config", str(path))
    assert listed.code == 0, str(listed)
    (stored,) = [i for i in json.loads(listed.stdout) if i["kind"] == "cache_stopped"]
    assert stored["state"] == "resolved", stored
    sent = [item.json()["data"] for item in loopback.at("/hook")]
    assert [(n["kind"], n["state"]) for n in sent] == [("cache_stopped", "firing"), ("cache_stopped", "resolved")]
    assert "closed without a verdict" in sent[1]["summary"], sent[1]
