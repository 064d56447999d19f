"""Which model answered, end to end: the simulator reports a system_fingerprint, the real pipeline probes,
stores (the fingerprint per sample), detects and delivers to a webhook on loopback.

When the weights behind an unchanged model id change (the fingerprint moves) and TTFT doubles with
them, that is one change marker and one notification ("model behind qwen3-8b changed: fingerprint
fp_a1 -> fp_b7"), a new baseline epoch, and no regression incident; the same doubling with the
fingerprint unchanged pages (tests/e2e/test_detect_grouping_e2e.py).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from monitor.schedule.pipeline import execute
from monitor.store.models import AnnotationRow, IncidentRow, RunRow, SampleRow
from tests.conftest import SimProcess, run_cli
from tests.support.alert_fixtures import Loopback
from tests.support.config import build_config, write_yaml
from tests.support.pipeline import job_pipeline

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

BEFORE, AFTER = 16, 10
FAST = {"ttft_base_ms": 30.0, "prefill_ms_per_1k": 5.0}


def write_config(folder: Path, sim: SimProcess, hook: str, *, canary: bool = False) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: lab
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
providers:
  gateway: {{base_url: "{sim.v1}", api: openai-chat}}
targets:
  qwen3-8b: {{provider: gateway, model: qwen3-8b, params: {{max_tokens: 2}}{", canary: {}" if canary else ""}}}
prompts:
  short: {{tokens: 128}}
  long: {{tokens: 512}}
jobs:
  - name: every-5m
    schedule: "*/5 * * * *"
    targets: [qwen3-8b]
    prompts: [short, long]
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
      severities: [page, ticket, info]  # model changes are info: routed where a route takes them
"""
    )
    return path


async def run_with_change(
    tmp_path: Path, sim: SimProcess, loopback: Loopback, *, swap: bool, canary: str | None = None
) -> dict[str, Any]:
    """Healthy runs, then twice as slow; with `swap` the fingerprint changes with it. With `canary`
    (`changes`, `varies`) the target has a canary and the fingerprint stays: its answer changes with
    the slowdown, or differs on every run."""
    path = write_config(tmp_path, sim, loopback.url("/hook"), canary=canary is not None)
    async with job_pipeline(path) as pipeline:
        sim.post(
            "/sim/models/qwen3-8b",
            {
                **FAST,
                "system_fingerprint": "fp_a1",
                "answer_text": "ready",
                "answer_varies": canary == "varies",
                "thinks_by_default": False,  # a canary of 8 tokens would be all reasoning otherwise
            },
        )
        for index in range(BEFORE + AFTER):
            if index == BEFORE:  # twice as slow from here; with `swap`, because other weights answer
                slower = {name: value * 2 for name, value in FAST.items()}
                answer = "Ready." if canary == "changes" else "ready"
                sim.post(
                    "/sim/models/qwen3-8b",
                    {**slower, "system_fingerprint": "fp_b7" if swap else "fp_a1", "answer_text": answer},
                )
            await execute(pipeline.context, job="every-5m", plan=pipeline.plan)
            await pipeline.dispatcher.dispatch_due()
        async with pipeline.store.engine.connect() as connection:
            incidents = (await connection.execute(sa.select(IncidentRow.kind, IncidentRow.details))).all()
            marks = (await connection.execute(sa.select(AnnotationRow.text, AnnotationRow.created_by))).all()
            prints = (await connection.execute(sa.select(SampleRow.fingerprint))).scalars().all()
            canaries = (await connection.execute(sa.select(RunRow.canary))).scalars().all()
    return {
        "canaries": canaries,
        "sent": [item.json()["data"] for item in loopback.at("/hook")],
        "incidents": incidents,
        "marks": marks,
        "fingerprints": prints,
    }


@pytest.mark.timeout(240)
async def test_other_weights_behind_the_same_model_id_are_one_marker_one_notice_and_no_regression(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    seen = await run_with_change(tmp_path, exact_sim, loopback, swap=True)
    # Every sample keeps the fingerprint its server reported.
    assert sorted(set(seen["fingerprints"])) == ["fp_a1", "fp_b7"]
    assert len(seen["fingerprints"]) == (BEFORE + AFTER) * 2 * 2
    kinds = sorted(kind for kind, _details in seen["incidents"])
    assert kinds == ["model_changed", "model_changed"], kinds  # both series saw it; no regression
    text = "model behind qwen3-8b changed: fingerprint fp_a1 -> fp_b7; a new baseline starts here"
    assert seen["marks"] == [(text, "ttft-monitor")]
    titles = [item["title"] for item in seen["sent"]]
    assert len(seen["sent"]) == 1, titles
    (notice,) = seen["sent"]
    assert notice["state"] == "info" and notice["kind"] == "model_changed", notice
    assert text in str(notice), notice


@pytest.mark.timeout(240)
async def test_the_same_slowdown_with_the_same_fingerprint_is_a_regression(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    seen = await run_with_change(tmp_path, exact_sim, loopback, swap=False)
    kinds = {kind for kind, _details in seen["incidents"]}
    assert kinds == {"regression"}, seen["incidents"]
    assert seen["marks"] == []
    assert [item["state"] for item in seen["sent"]][:1] == ["firing"]


def test_probe_reports_the_model_and_fingerprint_the_server_said_answered(
    exact_sim: SimProcess, tmp_path: Path
) -> None:
    exact_sim.post("/sim/models/gpt-4o-mini", {"served_as": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_44"})
    config = write_yaml(tmp_path / "config.yaml", build_config(exact_sim.v1, targets={"mini": "gpt-4o-mini"}))
    result = run_cli("probe", "--config", str(config), "-t", "mini", "-n", "2", "--warmup", "0", "-f", "json")
    assert result.code == 0, str(result)
    samples = json.loads(result.stdout)["samples"]
    assert {(s["served_model"], s["fingerprint"]) for s in samples} == {("gpt-4o-mini-2024-07-18", "fp_44")}
    with pytest.raises(urllib.error.HTTPError) as refused:
        exact_sim.post("/sim/models/gpt-4o-mini", {"system_fingerprint": ""})
    assert refused.value.code == 400 and "system_fingerprint" in refused.value.read().decode()


@pytest.mark.timeout(240)
async def test_a_canary_whose_answer_changes_is_a_model_change_even_with_the_same_fingerprint(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    seen = await run_with_change(tmp_path, exact_sim, loopback, swap=False, canary="changes")
    # One hash per run of each series (both prompts' runs carry their target's), two answers in all.
    assert len(seen["canaries"]) == (BEFORE + AFTER) * 2 and None not in seen["canaries"]
    assert len(set(seen["canaries"])) == 2
    assert sorted(kind for kind, _ in seen["incidents"]) == ["model_changed", "model_changed"], seen["incidents"]
    assert seen["marks"] == [
        ("model behind qwen3-8b changed: canary answer changed; a new baseline starts here", "ttft-monitor")
    ]
    assert [item["state"] for item in seen["sent"]] == ["info"]


@pytest.mark.timeout(240)
async def test_a_canary_that_never_answers_the_same_is_no_change_and_the_slowdown_still_pages(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    with capture_logs() as logged:
        seen = await run_with_change(tmp_path, exact_sim, loopback, swap=False, canary="varies")
    assert len(set(seen["canaries"])) > BEFORE  # a different answer nearly every run
    assert {kind for kind, _ in seen["incidents"]} == {"regression"}, seen["incidents"]
    assert seen["marks"] == []
    flagged = [e for e in logged if e["event"] == "canary_not_deterministic"]
    assert {e["prompt"] for e in flagged} == {"short", "long"} and len(flagged) == 2


@pytest.mark.timeout(120)
async def test_a_canary_that_hangs_is_cut_at_its_timeout_and_the_run_is_stored_without_it(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    path = write_config(tmp_path, exact_sim, loopback.url("/hook"), canary=True)
    text = path.read_text().replace("canary: {}", "canary: {max_tokens: 32, timeout_s: 1}")
    path.write_text(text)
    # Tokens drip 400 ms apart: a probe's 2 take under a second, the canary's 32 would take 13 s.
    exact_sim.post("/sim/models/qwen3-8b", {**FAST, "thinks_by_default": False, "faults": {"drip_gap_ms": 400}})
    async with job_pipeline(path, detection=False) as pipeline:
        with capture_logs() as logged:
            started = asyncio.get_running_loop().time()
            outcome = await execute(pipeline.context, job="every-5m", plan=pipeline.plan)
            took = asyncio.get_running_loop().time() - started
        async with pipeline.store.engine.connect() as connection:
            canaries = (await connection.execute(sa.select(RunRow.canary))).scalars().all()
    assert outcome.ok == 4 and canaries == [None, None]
    failed = [e for e in logged if e["event"] == "canary_failed"]
    assert [e["error"] for e in failed] == ["no answer within canary.timeout_s (1 s)"]
    assert took < 8, took  # the probes' time and the canary's bound, not the canary's 13 s


@pytest.mark.timeout(120)
async def test_a_model_that_starts_reasoning_is_one_marker_and_one_notice(
    tmp_path: Path, exact_sim: SimProcess, loopback: Loopback
) -> None:
    path = write_config(tmp_path, exact_sim, loopback.url("/hook"))
    path.write_text(path.read_text().replace("params: {max_tokens: 2}", "params: {max_tokens: 512}"))
    exact_sim.post(
        "/sim/models/qwen3-8b",
        {"ttft_base_ms": 20.0, "prefill_ms_per_1k": 5.0, "decode_tps": 5000.0, "answer_tokens": 12},
    )
    async with job_pipeline(path) as pipeline:
        for index in range(4):
            # From the third run it thinks 400 tokens before its 12-token answer (a provider's default moved).
            thinks = index >= 2
            exact_sim.post("/sim/models/qwen3-8b", {"thinks_by_default": thinks, "reasoning_tokens": 400})
            await execute(pipeline.context, job="every-5m", plan=pipeline.plan)
            await pipeline.dispatcher.dispatch_due()
        async with pipeline.store.engine.connect() as connection:
            incidents = (await connection.execute(sa.select(IncidentRow.kind))).scalars().all()
            marks = (await connection.execute(sa.select(AnnotationRow.text))).scalars().all()
    assert sorted(incidents) == ["tokens_jump", "tokens_jump"], incidents  # both prompts' series
    assert marks == ["output tokens per probe of qwen3-8b jumped 12 -> 412 (reasoning 0 -> 400): the model now reasons"]
    sent = [item.json()["data"] for item in loopback.at("/hook")]
    assert [(n["kind"], n["state"]) for n in sent] == [("tokens_jump", "info")], sent
    assert marks[0] in str(sent[0])
