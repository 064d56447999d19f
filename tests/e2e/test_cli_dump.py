"""A CLI command that overruns its test's timeout says where it waited (tests/support/cli_dump.py, run_cli)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli, silent_listener


@pytest.fixture
def silent_server() -> Iterator[int]:
    with silent_listener() as port:
        yield port


@pytest.mark.solo  # a 4 s bound on start-up to the hang: it runs while no other test runs
@pytest.mark.realtime
def test_a_command_past_its_timeout_is_killed_and_says_where_it_waited(tmp_path: Path, silent_server: int) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
database: {{url: "sqlite+aiosqlite:///{tmp_path}/ttft.db", state_dir: "{tmp_path}/state"}}
providers:
  silent: {{base_url: "http://127.0.0.1:{silent_server}/v1", api: openai-chat,
            timeout_s: {{connect: 5, first_token: 60, total: 90}}}}
targets: {{t: {{provider: silent, model: m}}}}
prompts: {{short: {{tokens: 128}}}}
jobs: [{{name: j, schedule: "*/5 * * * *", targets: [t], prompts: [short], rounds: 1, warmup: 0}}]
"""
    )
    assert run_cli("db", "upgrade", "--config", str(config)).code == 0
    with pytest.raises(AssertionError) as failed:
        run_cli("once", "--config", str(config), timeout=4)
    said = str(failed.value)
    assert "`ttft-monitor once --config" in said and "did not end within 4 s; killed" in said, said
    # faulthandler's stacks of every thread, then each asyncio task's await chain down to the probe.
    assert "Current thread" in said and "most recent call first" in said, said
    assert "asyncio tasks ===" in said and "monitor/probe/client.py" in said and "in _send" in said, said
