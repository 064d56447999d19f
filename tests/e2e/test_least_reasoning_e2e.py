"""`params.reasoning: least` through the real `once`: a model that thinks by default (the simulator's
qwen3-8b) answers without thinking on every API that has a switch, its samples store no reasoning
tokens, and its canary gets an answer instead of a reply spent thinking."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.conftest import SimProcess, run_cli

APIS = {
    "chat": ("openai-chat", "/v1"),
    "responses": ("openai-responses", "/v1"),
    "anthropic": ("anthropic-messages", "/v1"),
    "gemini": ("gemini", "/v1beta"),
}


def _config(tmp_path: Path, sim: SimProcess) -> Path:
    providers = "".join(
        f'  {name}:\n    base_url: "{sim.url}{prefix}"\n    api: {api}\n' for name, (api, prefix) in APIS.items()
    )
    least = "".join(
        f"  least-{name}:\n    provider: {name}\n    model: qwen3-8b\n"
        "    params: {max_tokens: 8, reasoning: least}\n    canary: {}\n"
        for name in APIS
    )
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""
location: test
database:
  url: "sqlite+aiosqlite:///{tmp_path}/ttft.db"
  state_dir: "{tmp_path}/state"
providers:
{providers}targets:
{least}  thinks:
    provider: chat
    model: qwen3-8b
    params: {{max_tokens: 64}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: tick
    schedule: "*/5 * * * *"
    targets: [{", ".join(f"least-{name}" for name in APIS)}, thinks]
    prompts: [short]
    rounds: 2
    warmup: 0
    pause_s: 0
"""
    )
    return path


def test_least_reasoning_leaves_out_the_thinking_on_every_api(tmp_path: Path, exact_sim: SimProcess) -> None:
    config = str(_config(tmp_path, exact_sim))
    checked = run_cli("check-config", "--config", config)
    assert checked.code == 0, checked
    assert "least-gemini: model qwen3-8b on gemini, max_tokens 8, reasoning least" in checked.stdout
    assert "thinks: model qwen3-8b on chat, max_tokens 64\n" in checked.stdout
    upgrade = run_cli("db", "upgrade", "--config", config)
    assert upgrade.code == 0, upgrade
    once = run_cli("once", "--config", config, timeout=60)
    assert once.code == 0, once
    with sqlite3.connect(tmp_path / "ttft.db") as conn:
        rows = conn.execute(
            "SELECT s.target, sm.reasoning_tokens, sm.request_id, sm.error, sm.ttft_us / 1000.0 AS ttft_ms, "
            "sm.ttfa_us / 1000.0 AS ttfa_ms, r.canary "
            "FROM samples sm JOIN runs r ON r.id = sm.run_id JOIN series s ON s.id = r.series_id"
        ).fetchall()
    by_target: dict[str, list[tuple]] = {}
    for row in rows:
        by_target.setdefault(row[0], []).append(row)
    assert set(by_target) == {*(f"least-{name}" for name in APIS), "thinks"}
    for target, samples in by_target.items():
        assert len(samples) == 2 and all(error is None for *_, error, _t, _a, _c in samples), samples
        for _, reasoning, request_id, _, ttft, ttfa, canary in samples:
            stamp = exact_sim.get(f"/sim/requests/{request_id}")
            if target == "thinks":
                assert stamp["reasoning"] is True and reasoning and reasoning > 0
                assert ttfa > ttft
            else:
                assert stamp["reasoning"] is False, (target, stamp)
                assert not reasoning and ttfa == ttft
                # The canary inherits the switch: 8 tokens are an answer, not the start of a thought.
                assert canary is not None, target
    assert "canary_failed" not in once.stderr


def test_probe_url_takes_least_and_refuses_an_effort_alone(exact_sim: SimProcess) -> None:
    base = ("probe", "--url", exact_sim.v1, "--model", "qwen3-8b", "--rounds", "1", "--warmup", "0", "--pause", "0")
    alone = run_cli(*base, "--reasoning-effort", "low")
    assert alone.code == 2 and "--reasoning-effort applies only with --reasoning least" in alone.stderr, alone
    wrong = run_cli(*base, "--reasoning", "least", "--reasoning-effort", "low; drop")
    assert wrong.code == 2 and "is not an effort level" in wrong.stderr, wrong
    config_only = run_cli("probe", "--config", "config.yaml", "--target", "qwen3-8b", "--reasoning", "least")
    assert config_only.code == 2 and "apply to --url only" in config_only.stderr, config_only
    least = run_cli(*base, "--reasoning", "least", "--format", "json")
    assert least.code == 0, least
    (sample,) = json.loads(least.stdout)["samples"]
    assert exact_sim.get(f"/sim/requests/{sample['request_id']}")["reasoning"] is False
