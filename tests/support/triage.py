"""The triage commands (`incidents`, `ack`, ...) run in-process against a config of their own."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CliResult, call_cli


def write_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""\
location: fra-dc1
database:
  url: {url}
  state_dir: {tmp_path / "state"}
providers:
  vllm:
    base_url: http://127.0.0.1:8000/v1
    api: openai-chat
targets:
  qwen3-8b:
    provider: vllm
    model: Qwen/Qwen3-8B
prompts:
  short:
    tokens: 512
jobs:
  - name: every-5m
    schedule: "*/5 * * * *"
    targets: [qwen3-8b]
    prompts: [short]
alerts:
  receivers:
    console:
      type: log
"""
    )
    return path


def cli(config: Path, *args: str) -> CliResult:
    # In-process (conftest's call_cli): these tests ask what each command prints and returns, ~35 times
    # a backend, and a child interpreter's start-up added ~1 s to each.
    result = call_cli(*args, "--config", str(config), env={"USER": "alice"})
    assert "Traceback" not in result.stderr, result
    return result
