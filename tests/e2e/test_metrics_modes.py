"""`metrics.per_series` on a real daemon: its `/metrics` after a few probes of the simulator, per mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SimProcess
from tests.support.daemon import http_get, start_daemon, stop_daemon, upgrade, wait_ready, write_config

SERIES = 'location="test",model="gpt-4o-mini",probe_job="tick",prompt="short",provider="sim",target="fast"'


@pytest.mark.parametrize("mode", ["full", "summary", "off"])
def test_the_daemons_metrics_hold_what_its_per_series_mode_says(sim: SimProcess, tmp_path: Path, mode: str) -> None:
    config = write_config(tmp_path, sim)
    config.write_text(config.read_text().replace("metrics:\n", f"metrics:\n  per_series: {mode}\n", 1))
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2, timeout=30)
        status, body = http_get(daemon.metrics_url + "/metrics")
    finally:
        assert stop_daemon(daemon) == 0
    assert status == 200
    lines = body.splitlines()
    per_target = [line for line in lines if 'target="fast"' in line]
    assert 'ttft_monitor_job_runs_total{probe_job="tick",result="ok"}' in body
    assert "ttft_monitor_info{" in body
    if mode == "full":
        assert f'ttft_monitor_ttft_seconds_bucket{{le="0.01",{SERIES}}}' in body
        assert "# TYPE ttft_monitor_ttft_seconds histogram" in lines
        assert f"ttft_monitor_ttft_last_seconds{{{SERIES}}}" in body
    elif mode == "summary":
        assert "# TYPE ttft_monitor_ttft_seconds summary" in lines
        assert "ttft_monitor_ttft_seconds_bucket" not in body and "ttft_monitor_ttfa_seconds_bucket" not in body
        count = next(line for line in lines if line.startswith(f"ttft_monitor_ttft_seconds_count{{{SERIES}}}"))
        # Every probe of the two runs is in the summary, or counted as disturbed (the daemon itself was late
        # during it, as on a loaded CI machine) and kept out of it.
        disturbed = sum(
            float(line.rsplit(" ", 1)[1])
            for line in per_target
            if line.startswith("ttft_monitor_disturbed_samples_total{")
        )
        assert float(count.rsplit(" ", 1)[1]) >= 1
        assert float(count.rsplit(" ", 1)[1]) + disturbed >= 2
        assert f"ttft_monitor_ttft_seconds_sum{{{SERIES}}}" in body
        assert f"ttft_monitor_ttft_last_seconds{{{SERIES}}}" in body
    else:
        assert per_target == []
        assert "ttft_monitor_ttft_seconds" not in body
    # The distribution's lines differ by mode; every other per-target series is there in both modes that have any.
    others = {
        line.split("{")[0]
        for line in per_target
        if not line.startswith(("ttft_monitor_ttft_seconds", "ttft_monitor_ttfa_seconds"))
    }
    expected = {
        "ttft_monitor_ttft_last_seconds",
        "ttft_monitor_ttfb_last_seconds",
        "ttft_monitor_setup_last_seconds",
        "ttft_monitor_decode_tokens_per_second",
        "ttft_monitor_probes_total",
        "ttft_monitor_disturbed_samples_total",
        "ttft_monitor_tokens_total",
    }
    # The detector's, once it has evaluated a stored run (no baseline yet after two runs).
    detector = {"ttft_monitor_run_ttft_median_seconds", "ttft_monitor_regression_state"}
    if mode == "off":
        assert others == set()
    else:
        assert expected <= others <= expected | detector, per_target
    distribution = len(per_target) - len([line for line in per_target if line.split("{")[0] in others])
    assert distribution == {"full": 2 * 24, "summary": 2 * 2, "off": 0}[mode], per_target
