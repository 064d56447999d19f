"""docs/metrics.md is generated from the metric definitions and documents every metric a real daemon exposes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.metrics.docs import documented_metrics, main
from tests.conftest import ROOT, start_sim, stop_sim
from tests.support.daemon import http_get, start_daemon, stop_daemon, upgrade, wait_ready, write_config
from tests.support.prometheus import promtool_check_metrics

pytest_plugins = ("tests.support.prometheus",)

DOCS = ROOT / "docs" / "metrics.md"


@pytest.fixture(scope="module")
def daemon_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running daemon's /metrics after its first job run (with an alert receiver configured)."""
    sim = start_sim("--no-noise")
    tmp_path = tmp_path_factory.mktemp("daemon")
    try:
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
    finally:
        stop_sim(sim)
    assert status == 200
    yield body


def test_the_reference_is_current() -> None:
    assert main(["--check", str(DOCS)]) == 0, "run: python -m monitor.metrics.docs --write docs/metrics.md"


def test_every_defined_metric_has_a_row() -> None:
    text = DOCS.read_text()
    missing = [m["name"] for m in documented_metrics() if f"| `{m['name']}` |" not in text]
    assert not missing


def test_every_metric_a_running_daemon_exposes_is_documented(daemon_scrape: str) -> None:
    exposed = {sample.name for family in text_string_to_metric_families(daemon_scrape) for sample in family.samples}
    text = DOCS.read_text()
    rows = {name: f"| `{m['name']}` |" in text for m in documented_metrics() for name in m["exposed"]}
    undocumented = sorted(name for name in exposed if not rows.get(name))
    assert not undocumented, f"metrics missing from docs/metrics.md: {undocumented}"
    assert "ttft_monitor_ttft_seconds_bucket" in exposed
    assert not [name for name in exposed if name.endswith("_created")]


@pytest.mark.promtool
def test_the_daemons_exposition_passes_promtool_check_metrics(daemon_scrape: str, promtool: Path) -> None:
    assert promtool_check_metrics(promtool, daemon_scrape) == ""
