"""The triage commands (`incidents`, `ack`, ...) run as `python -m monitor` against a config of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, CliResult


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
    env = {k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"} | {"USER": "alice"}
    done = subprocess.run(
        [sys.executable, "-m", "monitor", *args, "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = CliResult(done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, result
    return result
