"""deploy/grafana/ttft-monitor.json: its shape, and (marked slow) every panel's and every rule's
expression run through a real Prometheus that scrapes the real daemon probing the simulator."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, SimProcess, run_cli, start_sim, stop_sim
from tests.support.daemon import Daemon, start_daemon, stop_daemon
from tests.support.ports import free_port
from tests.support.prometheus import Peer, http, start_peer, stop_peer

pytest_plugins = ("tests.support.prometheus",)

DASHBOARD = ROOT / "deploy" / "grafana" / "ttft-monitor.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
VARIABLES = ("datasource", "location", "target", "prompt")
# Grafana's own interval variables, as Grafana would fill them for a short range scraped every second.
BUILTINS = {"$__rate_interval": "20s", "$__interval": "5s", "$__range": "1m"}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def panel_queries() -> list[tuple[str, str]]:
    return [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in panels() for t in p["targets"]]


def rule_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule.get("record") or rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


# ---------------------------------------------------------------- the file


def test_the_dashboard_has_the_data_source_and_series_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert tuple(variables) == VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in VARIABLES[1:]:
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"


def test_every_panel_queries_the_chosen_data_source_and_uses_only_known_variables() -> None:
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= {*VARIABLES, "__rate_interval"}, (panel["title"], used)
            assert "job=" not in target["expr"].replace("probe_job", ""), panel["title"]


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    titles = " | ".join(p["title"] for p in panels()).lower()
    for words in (
        "p50 / p90",
        "baseline band",
        "by prompt profile, per model",
        "phases",
        "errors by class",
        "decode rate",
        "availability",
        "loop lag",
        "spool",
        "database",
        "notifications",
        "missed ticks",
    ):
        assert words in titles, words
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert "Monitor health" in rows
    (incidents,) = [a for a in dashboard()["annotations"]["list"] if a["name"] == "Incidents"]
    assert "ttft_monitor_regression_state" in incidents["expr"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


# ---------------------------------------------------------------- against a real Prometheus


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr


def write_monitor_config(folder: Path, sim: SimProcess, port: int) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
location: grafana-lab
database:
  url: "sqlite+aiosqlite:///{folder}/ttft.db"
  state_dir: "{folder}/state"
metrics:
  listen: "127.0.0.1:{port}"
providers:
  sim:
    base_url: "{sim.v1}"
    api: openai-chat
    timeout_s: {{connect: 2, first_token: 10, total: 20}}
targets:
  fast:
    provider: sim
    model: gpt-4o-mini
    params: {{max_tokens: 4}}
    slo: {{ttft_ms: 5000, objective: 0.99}}
  broken:
    provider: sim
    model: no-such-model
    params: {{max_tokens: 4}}
prompts:
  short: {{tokens: 128}}
  long: {{tokens: 1024}}
jobs:
  - name: every-second
    schedule: "* * * * * *"
    targets: [fast, broken]
    prompts: [short, long]
    rounds: 1
    warmup: 0
    pause_s: 0
detection:
  min_history_runs: 12
  trailing_runs: 12
alerts:
  receivers:
    log: {{type: log}}
  routes:
    - receivers: [log]
"""
    )
    return path


def write_prometheus_config(folder: Path, metrics_port: int) -> Path:
    path = folder / "prometheus.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "ttft-monitor", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}
                ],
            }
        )
    )
    return path


def api(prometheus: Peer, path: str, **params: str) -> Any:
    status, body = http(f"{prometheus.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
    reply = json.loads(body)
    assert status == 200 and reply["status"] == "success", f"{path} {params}: {status} {body[:500]}"
    return reply["data"]


def query_range(prometheus: Peer, expr: str, seconds: float = 30) -> list[Any]:
    now = time.time()
    return list(api(prometheus, "query_range", query=expr, start=str(now - seconds), end=str(now), step="1")["result"])


@pytest.fixture
def running(prometheus_binary: Path, tmp_path: Path) -> Iterator[tuple[Peer, Daemon]]:
    sim = start_sim("--no-noise")
    metrics_port = free_port()
    config = write_monitor_config(tmp_path, sim, metrics_port)
    upgraded = run_cli("db", "upgrade", "--config", str(config))
    assert upgraded.code == 0, str(upgraded)
    daemon = start_daemon(config, tmp_path)
    port = free_port()
    prometheus = start_peer(
        [
            str(prometheus_binary),
            f"--config.file={write_prometheus_config(tmp_path, metrics_port)}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        url=f"http://127.0.0.1:{port}",
        log=tmp_path / "prometheus.log",
    )
    try:
        yield prometheus, daemon
    finally:
        stop_peer(prometheus)
        stop_daemon(daemon)
        stop_sim(sim)


def wait_for_data(prometheus: Peer, exprs: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    missing = exprs
    while time.monotonic() < deadline:
        missing = [e for e in missing if not api(prometheus, "query", query=e)["result"]]
        if not missing:
            return
        time.sleep(1)
    raise AssertionError(f"no data within {timeout} s for {missing}")


@pytest.mark.realtime
@pytest.mark.prometheus
@pytest.mark.timeout(240)
def test_every_panel_and_rule_expression_parses_and_returns_data(running: tuple[Peer, Daemon]) -> None:
    prometheus, daemon = running
    # A few scrapes, the detector's first baselines and the slowest recording rules' inputs.
    wait_for_data(
        prometheus,
        [
            "ttft_monitor_baseline_band_high_seconds",
            'ttft_monitor_probes_total{outcome="error"}',
            "target:ttft_monitor_slo_error_ratio:rate3d",
            "series:ttft_monitor_ttft_seconds:p90_1h",
        ],
        timeout=150,
    )
    time.sleep(3)  # rate windows of 20 s hold several scrapes of each series by now
    # The variables, as Grafana fills them: each query's values, "All" for the series variables.
    values = {"datasource": "prometheus"}
    for variable in dashboard()["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        selector, label = substitute(match.group(1), values), match.group(2)
        found = api(prometheus, f"label/{label}/values", **{"match[]": selector})
        assert found, (variable["name"], selector)
        values[variable["name"]] = "|".join(found)
    assert values["location"] == "grafana-lab"
    assert set(values["target"].split("|")) == {"fast", "broken"}
    empty = []
    for name, expr in panel_queries():
        if not query_range(prometheus, substitute(expr, values)):
            empty.append(name)
    assert not empty, f"panels without data: {empty}"
    (incidents,) = [a for a in dashboard()["annotations"]["list"] if a["name"] == "Incidents"]
    query_range(prometheus, substitute(incidents["expr"], values))  # parses (no incident: no data)

    empty = []
    for name, expr in rule_expressions():
        result = query_range(prometheus, expr)
        if name[0].isupper():
            # An alert's expression is a condition, silent while all is well: every series it reads
            # must exist, so a typo in a name cannot keep it silent for ever.
            for metric in set(re.findall(r"\b(?:ttft_monitor_\w+|\w+:ttft_monitor_\w+:\w+)", expr)):
                if not api(prometheus, "series", **{"match[]": metric}):
                    empty.append(f"{name}: {metric}")
        elif not result:
            empty.append(name)
    assert not empty, f"rules without data: {empty}"
    assert daemon.process.poll() is None
