"""Is the prompt cache working, against a genuine vLLM's automatic prefix cache (tests/support/vllm_peer.py):
a `cache: both` prompt through the real pipeline, stored and judged, reads as a working cache (cached
share and speed-up over the busted twin, as the series page shows them) and opens no incident; the
same target moved to a vLLM started with `--no-enable-prefix-caching` (a provider's cache gone) opens
one `cache_stopped` incident and no regression.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from monitor.schedule.pipeline import execute
from monitor.store.models import IncidentRow, SeriesRow
from monitor.web.queries import SeriesInfo, cache_view
from tests.support.banners import SummaryLines
from tests.support.pipeline import job_pipeline
from tests.support.vllm_peer import SERVED_MODEL, PreparedPeer, VllmServer, start_server

pytest_plugins = ("tests.support.vllm_peer",)
# realtime: the vLLM server the module shares takes about two minutes to start.
pytestmark = [pytest.mark.vllm, pytest.mark.realtime, pytest.mark.timeout(600)]

RUNS = 10  # the reference needs 6 runs with figures before a window of 3
PROMPT_TOKENS = 4000


def write_config(server: VllmServer, folder: Path, name: str = "config.yaml") -> Path:
    path = folder / name
    # The CPU engine shares two cores with the runner: the monitor's own lateness is not this test's subject.
    path.write_text(
        f"""
location: lab
probe_self_delay_bound_ms: 1000
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  vllm:
    base_url: "{server.v1}"
    server_metrics_url: "{server.url}/metrics"
    api: openai-chat
    timeout_s: {{connect: 5, first_token: 60, total: 90}}
targets:
  tiny: {{provider: vllm, model: {SERVED_MODEL}, params: {{max_tokens: 2}}}}
prompts:
  long: {{tokens: {PROMPT_TOKENS}, cache: both}}
jobs:
  - name: cache-watch
    schedule: "*/5 * * * *"
    targets: [tiny]
    prompts: [long]
    rounds: 2
    warmup: 0
    pause_s: 0
alerts:
  receivers:
    console: {{type: log}}
"""
    )
    return path


async def test_a_working_vllm_prefix_cache_reads_as_working(
    vllm_server: VllmServer, tmp_path: Path, vllm_figures: SummaryLines
) -> None:
    async with job_pipeline(write_config(vllm_server, tmp_path)) as pipeline:
        for _ in range(RUNS):
            outcome = await execute(pipeline.context, job="cache-watch", plan=pipeline.plan)
            assert outcome.failed == 0, outcome
        async with pipeline.store.engine.connect() as connection:
            rows = (await connection.execute(sa.select(SeriesRow).where(SeriesRow.prompt == "long.warm"))).all()
            assert len(rows) == 1, rows
            row = rows[0]
            info = SeriesInfo(row.id, row.target, row.provider, row.model, row.prompt, row.location)
            view = await cache_view(connection, info, start=datetime(2000, 1, 1, tzinfo=UTC), end=datetime.now(UTC))
            kinds = (await connection.execute(sa.select(IncidentRow.kind))).scalars().all()
    assert view is not None and view["runs"] == RUNS, view
    # vLLM caches whole blocks (128 tokens on its CPU backend): all but the prompt's last partial block,
    # 3,968 of about 4,003 tokens, every warm run.
    shares = [p["cached_share"] for p in view["points"]]
    assert all(share is not None and share > 0.85 for share in shares), shares
    assert view["speedup_p50"] > 1.3, view  # the rule watches the speed-up only above 1.3x
    assert "cache_stopped" not in kinds, kinds
    vllm_figures.append(
        f"cache: both at {PROMPT_TOKENS} prompt tokens, {RUNS} runs of 2 busted and 2 warm probes: speed-up over "
        f"cold {view['speedup_p50']:.1f}x, {view['cached_share_p50']:.0%} of the warm prompt from vLLM's prefix "
        "cache; no cache_stopped incident"
    )


async def test_the_same_target_on_a_vllm_without_prefix_caching_is_one_cache_incident(
    vllm_server: VllmServer, vllm_peer: PreparedPeer, tmp_path: Path, vllm_figures: SummaryLines
) -> None:
    started = time.monotonic()
    uncached = start_server(
        vllm_peer, log_path=tmp_path / "uncached-vllm.log", extra_args=("--no-enable-prefix-caching",)
    )
    start_s = time.monotonic() - started
    try:
        async with job_pipeline(write_config(vllm_server, tmp_path)) as pipeline:
            for _ in range(RUNS - 2):
                await execute(pipeline.context, job="cache-watch", plan=pipeline.plan)
        # The provider's base_url moves to the server without a prefix cache: the same series, its cache gone.
        async with job_pipeline(write_config(uncached, tmp_path, "moved.yaml")) as pipeline:
            for _ in range(4):
                await execute(pipeline.context, job="cache-watch", plan=pipeline.plan)
            async with pipeline.store.engine.connect() as connection:
                incidents = (
                    await connection.execute(
                        sa.select(IncidentRow.kind, SeriesRow.prompt, IncidentRow.details).join(
                            SeriesRow, SeriesRow.id == IncidentRow.series_id
                        )
                    )
                ).all()
    finally:
        uncached.stop()
    # The server says what it runs (its metrics, /version and /v1/models): the other server's cache
    # configuration is a model change on both series (a marker, a new baseline), beside the cache incident.
    kinds = sorted((kind, prompt) for kind, prompt, _details in incidents)
    assert kinds == [("cache_stopped", "long.warm"), ("model_changed", "long"), ("model_changed", "long.warm")], kinds
    changed = next(d for kind, _prompt, d in incidents if kind == "model_changed")
    assert (
        "prefix caching True" in changed["server_build_from"] and "prefix caching False" in changed["server_build_to"]
    )
    assert changed["server_build_from"].startswith("vllm 0.") and "; weights /" in changed["server_build_from"]
    details = next(d for kind, _prompt, d in incidents if kind == "cache_stopped")
    # Which evidence opens it depends on the machine's load: the 3-run window straddles the move at the
    # second run on the new server, and when the old server's last warm probes were slowed (CI measured
    # a cached request at 991 ms on a loaded machine) the speed-up is already past halfway down there
    # ("no_speedup"); else the cached shares decide a run later ("no_cached_tokens"). Either way the
    # window's median cached share is 0: the warm probes found no cache.
    assert details["reason"] in ("no_cached_tokens", "no_speedup") and details["cached_share"] == 0, details
    assert details["reference"]["cached_share"] > 0.9, details
    vllm_figures.append(
        f"the same target on a vLLM with --no-enable-prefix-caching (started in {start_s:.0f} s): {details['summary']}"
        f"; and the server build changed: {changed['server_build_from']} -> {changed['server_build_to']}"
    )
