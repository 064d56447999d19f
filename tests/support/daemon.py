"""The daemon (`ttft-monitor run`) as a child process for the end-to-end tests: its config, start, readiness,
logs and stop, and the database it writes, read back."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, SimProcess, call_cli
from tests.support.ports import free_port


def write_config(
    folder: Path,
    sim: SimProcess,
    *,
    db_url: str | None = None,
    schedule: str = "*/2 * * * * *",
    model: str = "gpt-4o-mini",
    rounds: int = 1,
    metrics_port: int | None = None,
    grace: float = 20,
    location: str = "test",
    extra: str = "",
) -> Path:
    """The daemon's config for one job probing the simulator; `extra` is YAML appended (more sections)."""
    db_url = db_url or f"sqlite+aiosqlite:///{folder}/ttft.db"
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: {location}
shutdown_grace_s: {grace}
database:
  url: "{db_url}"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{metrics_port or free_port()}"
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  fast:
    provider: sim
    model: {model}
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: tick
    schedule: "{schedule}"
    targets: [fast]
    prompts: [short]
    rounds: {rounds}
    warmup: 0
    pause_s: 0
{extra}"""
    )
    return path


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_url: str

    def logs(self) -> list[dict]:
        events = []
        for line in self.log_path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                events.append({"event": "raw", "line": line})
        return events

    def events(self, name: str) -> list[dict]:
        return [e for e in self.logs() if e.get("event") == name]

    def wait_for(self, name: str, *, count: int = 1, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if len(found) >= count:
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {count} x {name} within {timeout} s; logs:\n{self.log_path.read_text()[-3000:]}")


def start_daemon(config: Path, folder: Path, name: str = "daemon", *, env: dict[str, str] | None = None) -> Daemon:
    log_path = folder / f"{name}.log"
    text = config.read_text()
    listen = text.split('listen: "', 1)[1].split('"', 1)[0]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}, **(env or {})},
        )
    return Daemon(process=process, log_path=log_path, metrics_url=f"http://{listen}")


def stop_daemon(daemon: Daemon, *, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if daemon.process.poll() is None:
        daemon.process.send_signal(sig)
    try:
        return daemon.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait()
        raise


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_ready(daemon: Daemon, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            break
        try:
            if http_get(daemon.metrics_url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"daemon not ready; logs:\n{daemon.log_path.read_text()[-3000:]}")


def sqlite_rows(folder: Path, query: str) -> list[tuple]:
    with sqlite3.connect(folder / "ttft.db") as conn:
        return conn.execute(query).fetchall()


def upgrade(config: Path) -> None:
    """`ttft-monitor db upgrade` in-process: ~25 daemon tests call it first, and a child interpreter
    (~1.4 s of start-up each) tests nothing they assert."""
    result = call_cli("db", "upgrade", "--config", str(config))
    assert result.code == 0, str(result)


def wait_until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def _admin(url: str, statement: str) -> None:
    import asyncio

    import asyncpg

    async def execute() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(execute())


def _fresh_postgres_database(url: str) -> tuple[str, str]:
    import uuid

    name = f"ttft_daemon_{uuid.uuid4().hex[:10]}"
    _admin(url, f'CREATE DATABASE "{name}"')
    return name, url.rsplit("/", 1)[0] + "/" + name


def _query(url: str, sql: str) -> list[tuple]:
    import asyncio

    from sqlalchemy import text

    from monitor.store.engine import create_engine

    async def read() -> list[tuple]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                return [tuple(row) for row in (await conn.execute(text(sql))).all()]
        finally:
            await engine.dispose()

    return asyncio.run(read())
