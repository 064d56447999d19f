"""docs/metrics.md is generated from the metric definitions and documents every metric a real daemon exposes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.metrics.docs import documented_metrics, main
from tests.conftest import ROOT, SimProcess, start_sim, stop_sim
from tests.test_daemon import http_get, start_daemon, stop_daemon, upgrade, wait_ready, write_config

DOCS = ROOT / "docs" / "metrics.md"


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


def test_the_reference_is_current() -> None:
    assert main(["--check", str(DOCS)]) == 0, "run: python -m monitor.metrics.docs --write docs/metrics.md"


def test_every_defined_metric_has_a_row() -> None:
    text = DOCS.read_text()
    missing = [m["name"] for m in documented_metrics() if f"| `{m['name']}` |" not in text]
    assert not missing


def test_every_metric_a_running_daemon_exposes_is_documented(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim)
    config.write_text(config.read_text() + "alerts:\n  receivers:\n    log: {type: log}\n")
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=1, timeout=30)
        status, body = http_get(daemon.metrics_url + "/metrics")
    finally:
        assert stop_daemon(daemon) == 0
    assert status == 200
    exposed = {sample.name for family in text_string_to_metric_families(body) for sample in family.samples}
    documented = {name for metric in documented_metrics() for name in metric["exposed"]}
    text = DOCS.read_text()
    undocumented = sorted(
        name
        for name in exposed
        if name not in documented
        or not any(f"| `{m['name']}` |" in text for m in documented_metrics() if name in m["exposed"])
    )
    assert not undocumented, f"metrics missing from docs/metrics.md: {undocumented}"
    assert "ttft_monitor_ttft_seconds_bucket" in exposed
    assert not [name for name in exposed if name.endswith("_created")]
