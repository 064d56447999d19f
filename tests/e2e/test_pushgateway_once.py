"""`once` against a real Pushgateway (Debian's prometheus-pushgateway): every probe job keeps its own
group, a rejected push fails the run, and the pushed exposition passes `promtool check metrics`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.metrics.push import belongs_to_job, group_path
from tests.conftest import SimProcess, call_cli, run_cli, start_sim, stop_sim
from tests.support.forward_proxy import ForwardProxy
from tests.support.prometheus import Peer, http, promtool_check_metrics

pytest_plugins = ("tests.support.prometheus",)


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    process = start_sim("--no-noise")
    yield process
    stop_sim(process)


def write_config(folder: Path, sim: SimProcess, gateway: str, *, location: str = "lab/1") -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: "{location}"
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
metrics:
  pushgateway: "{gateway}"
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 15, total: 30}}
targets:
  fast:
    provider: sim
    model: gpt-4o-mini
    params: {{max_tokens: 4}}
    slo: {{ttft_ms: 5000, objective: 0.99}}
  other:
    provider: sim
    model: gpt-4o-mini
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 256}}
jobs:
  - name: alpha
    schedule: "*/5 * * * *"
    targets: [fast]
    prompts: [short]
    rounds: 3  # one probe the monitor delayed under load is left out of the TTFT series; three are not all
    warmup: 0
  - name: beta
    schedule: "*/10 * * * *"
    targets: [fast, other]
    prompts: [short]
    rounds: 3  # one probe the monitor delayed under load is left out of the TTFT series; three are not all
    warmup: 0
"""
    )
    upgraded = call_cli("db", "upgrade", "--config", str(path))  # in-process: `once` is what runs as a child
    assert upgraded.code == 0, str(upgraded)
    return path


def groups(gateway: Peer) -> dict[tuple[str, str], dict[str, Any]]:
    """The gateway's groups by (probe_job, location), each mapping metric name -> its JSON."""
    status, body = http(gateway.url + "/api/v1/metrics")
    assert status == 200, body
    out = {}
    for group in json.loads(body)["data"]:
        labels = group["labels"]
        assert labels["job"] == "ttft-monitor"
        out[(labels.get("probe_job", ""), labels.get("location", ""))] = {
            name: value for name, value in group.items() if name.startswith("ttft_monitor_")
        }
    return out


def scraped_series(gateway: Peer, name: str) -> list[dict[str, str]]:
    status, body = http(gateway.url + "/metrics")
    assert status == 200
    return [
        sample.labels
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name
    ]


@pytest.mark.parametrize(
    ("labels", "job", "expected"),
    [
        ({"probe_job": "alpha", "target": "fast"}, "alpha", True),
        ({"probe_job": "beta", "target": "fast"}, "alpha", False),
        ({"target": "fast", "prompt": "short", "location": "l"}, "alpha", True),
        ({"target": "other", "prompt": "short", "location": "l"}, "alpha", False),
        ({"target": "fast"}, "alpha", True),
        ({"target": "other"}, "alpha", False),
        ({}, "alpha", True),
    ],
)
def test_a_sample_goes_to_the_group_of_its_job_or_series(labels: dict[str, str], job: str, expected: bool) -> None:
    assert belongs_to_job(labels, job, {("fast", "short")}) is expected


def test_group_paths_escape_values_the_url_cannot_carry() -> None:
    assert (
        group_path({"probe_job": "a", "location": "fra-dc1"})
        == "/metrics/job/ttft-monitor/probe_job/a/location/fra-dc1"
    )
    assert group_path({"location": "lab/1"}) == "/metrics/job/ttft-monitor/location@base64/bGFiLzE="


@pytest.mark.pushgateway
def test_a_two_job_run_keeps_each_jobs_series_in_its_own_group(
    sim: SimProcess, pushgateway: Peer, promtool: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, sim, pushgateway.url)
    result = run_cli("once", "--config", str(config))
    assert result.code == 0, str(result)
    found = groups(pushgateway)
    assert set(found) == {("alpha", "lab/1"), ("beta", "lab/1")}, found.keys()
    for group in found.values():
        assert "ttft_monitor_ttft_seconds" in group
        assert "ttft_monitor_job_last_run_timestamp_seconds" in group
    # Each job's own series, under its own probe_job: alpha probed fast only, beta fast and other.
    counts = scraped_series(pushgateway, "ttft_monitor_ttft_seconds_count")
    by_job = {(labels["probe_job"], labels["target"]) for labels in counts}
    assert by_job == {("alpha", "fast"), ("beta", "fast"), ("beta", "other")}
    assert all(labels["job"] == "ttft-monitor" and labels["location"] == "lab/1" for labels in counts)
    assert not [labels for labels in counts if "exported_job" in labels]
    # The SLO counters went to the job of the series.
    assert {labels["probe_job"] for labels in scraped_series(pushgateway, "ttft_monitor_slo_probes_total")} == {
        "alpha",
        "beta",
    }
    _status, body = http(pushgateway.url + "/metrics")
    ours = "\n".join(line for line in body.splitlines() if "ttft_monitor_" in line) + "\n"
    assert promtool_check_metrics(promtool, ours) == ""


@pytest.mark.pushgateway
def test_cronjob_style_runs_of_different_jobs_do_not_overwrite_each_other(
    sim: SimProcess, pushgateway: Peer, tmp_path: Path
) -> None:
    config = write_config(tmp_path, sim, pushgateway.url, location="k8s")
    for job in ("alpha", "beta"):
        result = run_cli("once", "--config", str(config), "--job", job)
        assert result.code == 0, str(result)
    found = groups(pushgateway)
    assert set(found) == {("alpha", "k8s"), ("beta", "k8s")}
    last_runs = scraped_series(pushgateway, "ttft_monitor_job_last_run_timestamp_seconds")
    assert {labels["probe_job"] for labels in last_runs} == {"alpha", "beta"}
    # alpha's group holds only alpha's series: beta's run did not add to it or replace it. Read from the
    # disturbed-samples counter, which every series' first probe makes (at zero when the probe was not delayed):
    # `probes_total` leaves out a probe the monitor itself delayed, and under the full suite's load alpha's one
    # probe once was, and its series was missing there.
    alpha = scraped_series(pushgateway, "ttft_monitor_disturbed_samples_total")
    assert {(labels["probe_job"], labels["target"]) for labels in alpha} == {
        ("alpha", "fast"),
        ("beta", "fast"),
        ("beta", "other"),
    }


@pytest.mark.pushgateway
def test_a_rejected_push_fails_the_run_with_the_gateways_answer_logged(
    sim: SimProcess, pushgateway: Peer, tmp_path: Path
) -> None:
    # Another group already has ttft_monitor_probes_total as a gauge: the gateway refuses a counter.
    status, body = http(
        pushgateway.url + "/metrics/job/someone-else",
        method="PUT",
        data=b"# TYPE ttft_monitor_probes_total gauge\nttft_monitor_probes_total 1\n",
    )
    assert status in (200, 202), body
    config = write_config(tmp_path, sim, pushgateway.url)
    result = run_cli("once", "--config", str(config), "--job", "alpha")
    assert result.code == 5, str(result)
    assert "Pushgateway did not take the metrics" in result.stderr
    rejected = [
        json.loads(line)
        for line in result.stdout.splitlines()
        if line.startswith("{") and "pushgateway_rejected" in line
    ]
    assert rejected, str(result)
    assert rejected[0]["status"] == 400
    assert "ttft_monitor_probes_total" in rejected[0]["answer"]


@pytest.mark.pushgateway
def test_an_unreachable_gateway_fails_the_run(sim: SimProcess, tmp_path: Path) -> None:
    from tests.support.ports import free_port

    config = write_config(tmp_path, sim, f"http://127.0.0.1:{free_port()}")
    result = run_cli("once", "--config", str(config), "--job", "alpha")
    assert result.code == 5, str(result)
    assert "pushgateway_unreachable" in result.stdout


@pytest.mark.pushgateway
async def test_once_pushes_through_the_environment_proxy_while_its_loopback_probes_go_direct(
    sim: SimProcess, pushgateway: Peer, tmp_path: Path
) -> None:
    # A host behind an egress proxy: the gateway's name resolves only through the proxy. Before, the
    # push ignored HTTP_PROXY (pushgateway_unreachable, exit 5) while alert delivery honoured it.
    port = urlsplit(pushgateway.url).port
    assert port is not None
    gateway = f"http://push.proxied.test:{port}"
    async with ForwardProxy(hosts={"push.proxied.test": ("127.0.0.1", port)}) as proxy:
        config = write_config(tmp_path, sim, gateway, location="behind-proxy")
        env = {"HTTP_PROXY": proxy.url, "http_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""}
        # In a worker thread: the proxy serves on this loop while the child runs.
        result = await asyncio.to_thread(run_cli, "once", "--config", str(config), "--job", "alpha", env=env)
    assert result.code == 0, str(result)
    assert ("alpha", "behind-proxy") in groups(pushgateway)
    # Only the push went through the proxy: the simulator is on loopback, which is never proxied.
    assert [(r.method, r.target.split("/metrics/", 1)[0]) for r in proxy.requests] == [("PUT", gateway)]
