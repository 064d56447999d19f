"""A real Prometheus Alertmanager (Debian's prometheus-alertmanager) receives, shows and resolves our alert.

The binary is installed with apt-get when missing (the tests run as root on CI); when that is not
possible the test is skipped, and the terminal summary says so loudly.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from monitor.alert.dispatcher import Dispatcher
from monitor.alert.transport import Transport
from monitor.store.engine import create_engine
from tests.support import apt, banners
from tests.support.alert_fixtures import alerts, notification, outbox_rows, receiver, resolve_incident, store_incident
from tests.support.ports import free_port

pytest_plugins = ("tests.support.store_fixtures", "tests.support.alert_fixtures")

BINARY = Path("/usr/bin/prometheus-alertmanager")
CONFIG = """\
route:
  receiver: blackhole
  group_by: [alertname]
receivers:
  - name: blackhole
"""


@pytest.fixture(scope="session")
def alertmanager_binary() -> Path:
    if not BINARY.exists():
        reason = apt.install("prometheus-alertmanager", BINARY)
        if reason is not None:
            message = f"the Alertmanager test was skipped: {BINARY} is missing and {reason}"
            banners.add("ALERTMANAGER TEST SKIPPED", message)
            pytest.skip(message)
    return BINARY


@dataclass
class RunningAlertmanager:
    url: str
    process: subprocess.Popen[bytes]

    async def alerts(self, **filters: str) -> list[dict[str, Any]]:
        params = [("filter", f'{name}="{value}"') for name, value in filters.items()]
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/api/v2/alerts", params=params) as resp:
            assert resp.status == 200, await resp.text()
            return list(await resp.json())


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture
def alertmanager(alertmanager_binary: Path, tmp_path: Path) -> Iterator[RunningAlertmanager]:
    """Alertmanager on a free loopback port, clustering off, its state in tmp."""
    (tmp_path / "alertmanager.yml").write_text(CONFIG)
    port = free_port()
    log_path = tmp_path / "alertmanager.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(alertmanager_binary),
                f"--config.file={tmp_path / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"alertmanager did not start: {log_path.read_text()[-500:]}")
            time.sleep(0.1)
        yield RunningAlertmanager(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> Iterator[str]:
    shutil.copyfile(sqlite_template, tmp_path / "store.db")
    yield f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"


@pytest.mark.alertmanager
@pytest.mark.timeout(300)  # the first run may install the package
async def test_alertmanager_shows_our_alert_firing_and_then_resolved(
    alertmanager: RunningAlertmanager, sqlite_url: str
) -> None:
    engine = create_engine(sqlite_url)
    config = alerts({"am": receiver("alertmanager", alertmanager.url)}, renotify_interval_s=0)
    opened = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    try:
        incident = await store_incident(engine, opened_at=opened)
        firing = notification(incident_id=incident, since=opened)
        async with Transport() as transport:
            dispatcher = Dispatcher(engine, config, transport)
            await dispatcher.outbox.notify(firing)
            assert (await dispatcher.dispatch_due()).sent == 1

            (shown,) = await alertmanager.alerts(incident_id=str(incident))
            assert shown["status"]["state"] == "active"
            assert shown["labels"] == {
                "alertname": "TTFTRegression",
                "severity": "page",
                "kind": "regression",
                "target": "qwen3-8b",
                "model": "Qwen/Qwen3-8B",
                "provider": "vllm",
                "prompt": "short",
                "location": "fra-dc1",
                "job": "every-5m",
                "incident_id": str(incident),
            }
            assert shown["annotations"]["summary"].startswith("[PAGE] TTFT regression on qwen3-8b / short @ fra-dc1")
            assert shown["annotations"]["baseline_ms"] == "410" and shown["annotations"]["ratio"] == "3.01"
            assert shown["startsAt"].startswith(opened.strftime("%Y-%m-%dT%H:%M:%S"))
            assert datetime.fromisoformat(shown["endsAt"].replace("Z", "+00:00")) > datetime.now(UTC)

            # While it fires, it is re-sent every minute so Alertmanager keeps it.
            a_minute_later = datetime.now(UTC) + timedelta(seconds=61)
            assert await dispatcher.renotify_due(a_minute_later) == 1
            assert (await dispatcher.dispatch_due(a_minute_later)).sent == 1
            (still,) = await alertmanager.alerts(incident_id=str(incident))
            assert still["status"]["state"] == "active"

            resolved_at = datetime.now(UTC)
            await resolve_incident(engine, incident, resolved_at)
            await dispatcher.outbox.notify(firing.with_changes(state="resolved", resolved_at=resolved_at))
            assert (await dispatcher.dispatch_due()).sent == 1
        # The API lists active alerts only: a resolved one (endsAt in the past) is gone.
        assert await alertmanager.alerts(incident_id=str(incident)) == []
        assert [row.status for row in await outbox_rows(engine)] == ["sent", "sent", "sent"]
    finally:
        await engine.dispose()
