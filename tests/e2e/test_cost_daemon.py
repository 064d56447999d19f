"""The daemon counts what its probes spend: tokens by kind and the estimated cost per target, on /metrics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SimProcess, run_cli
from tests.support.daemon import http_get, start_daemon, stop_daemon, upgrade, wait_ready, write_config

PRICES = "{input: 1.0, cached_input: 0.5, output: 4.0, reasoning: 8.0, currency: EUR}"


def test_the_daemon_counts_tokens_by_kind_and_their_cost_per_target(sim: SimProcess, tmp_path: Path) -> None:
    # Qwen3 thinks first: with max_tokens 4 every token is reasoning (estimated from the stream: vLLM-shaped).
    config = write_config(tmp_path, sim, model="qwen3-8b")
    text = config.read_text().replace(
        "    params: {max_tokens: 4}", f"    params: {{max_tokens: 4}}\n    prices: {PRICES}"
    )
    config.write_text(text)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2, timeout=30)
        status, body = http_get(daemon.metrics_url + "/metrics")
        assert status == 200
    finally:
        assert stop_daemon(daemon) == 0
    families = {f.name: f.samples for f in text_string_to_metric_families(body)}
    tokens = {s.labels["kind"]: s.value for s in families["ttft_monitor_tokens"] if s.name.endswith("_total")}
    assert {s.labels["target"] for s in families["ttft_monitor_tokens"]} == {"fast"}
    # A probe the monitor itself delayed (a loaded machine) is counted apart from the probes, and costs
    # as much: every probe is in one of the two.
    probes = sum(
        s.value
        for name in ("ttft_monitor_probes", "ttft_monitor_disturbed_samples")
        for s in families.get(name, [])
        if s.name.endswith("_total")
    )
    assert probes >= 2
    assert tokens["reasoning"] == 4 * probes and tokens["output"] == 0
    assert tokens["input"] >= 256 * probes and tokens["cached"] == 0  # cache: bust
    [cost] = [s for s in families["ttft_monitor_estimated_cost"] if s.name.endswith("_total")]
    assert cost.labels == {"target": "fast", "location": "test", "probe_job": "tick", "currency": "EUR"}
    assert cost.value == pytest.approx((tokens["input"] * 1.0 + tokens["reasoning"] * 8.0) / 1e6)
    samples = daemon.events("probe_sample")
    assert all(s["reasoning_tokens"] == 4 and s["reasoning_tokens_estimated"] for s in samples), samples


def test_the_pages_and_the_report_show_what_probing_each_series_costs_a_month(sim: SimProcess, tmp_path: Path) -> None:
    config = write_config(tmp_path, sim, model="qwen3-8b")
    config.write_text(
        config.read_text().replace(
            "    params: {max_tokens: 4}", f"    params: {{max_tokens: 4}}\n    prices: {PRICES}"
        )
    )
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=3, timeout=30)
        status, body = http_get(daemon.metrics_url + "/api/v1/series")
        assert status == 200, body
        [row] = json.loads(body)["series"]
        status, body = http_get(daemon.metrics_url + f"/api/v1/series/{row['id']}/points")
        assert status == 200, body
        points = json.loads(body)
        samples = daemon.events("probe_sample")
    finally:
        assert stop_daemon(daemon) == 0
    # One probe every 2 s (one round, no warm-up): 43,200 a day, 30 days; each as the probes so far spent.
    prompt = statistics.mean(s["prompt_tokens"] for s in samples)
    reasoning = statistics.mean(s["reasoning_tokens"] for s in samples)
    per_probe = (prompt * 1.0 + reasoning * 8.0) / 1e6
    cost = row["cost"]
    assert cost["from_history"] is True and cost["currency"] == "EUR", cost
    assert cost["cost_per_month"] == pytest.approx(43200 * 30 * per_probe, rel=0.02), (cost, prompt, reasoning)
    assert cost["tokens_per_month"] == pytest.approx(43200 * 30 * (prompt + reasoning), rel=0.02)
    assert points["cost"] == cost
    report = run_cli("report", "--format", "md", "--since", "1h", "--config", str(config))
    assert report.code == 0, str(report)
    line = f"| fast | short | {cost['tokens_per_month']:,} | {cost['cost_per_month']:,.2f} EUR |"
    assert "## What probing costs (a month at the schedule, from the last day's probes)" in report.stdout
    assert line in report.stdout, report.stdout


def test_a_model_that_starts_reasoning_is_logged_once_as_an_event(sim: SimProcess, tmp_path: Path) -> None:
    sim.post("/sim/models/gpt-4o-mini", {"decode_tps": 5000})
    config = write_config(tmp_path, sim)
    config.write_text(config.read_text().replace("params: {max_tokens: 4}", "params: {max_tokens: 1000}"))
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        daemon.wait_for("job_finished", count=2, timeout=30)
        # The provider turns reasoning on behind the same model name: 48 tokens a probe become 948.
        sim.post("/sim/models/gpt-4o-mini", {"reasoning_tokens": 900, "thinks_by_default": True})
        [event] = daemon.wait_for("model_now_reasons", timeout=30)
        finished = len(daemon.events("job_finished"))
        daemon.wait_for("job_finished", count=finished + 2, timeout=30)
    finally:
        assert stop_daemon(daemon) == 0
    assert len(daemon.events("model_now_reasons")) == 1  # a jump, not every run after it
    assert event["target"] == "fast" and event["prompt"] == "short"
    assert event["completion_tokens_before"] == 48 and event["completion_tokens_after"] == 948
    assert event["reasoning_tokens_before"] == 0 and event["reasoning_tokens_after"] == 900


ALERTS = """
budget:
  jobs:
    tick: {per: day, tokens: 20000000}
alerts:
  receivers:
    console: {type: log}
  routes:
    - receivers: [console]
"""


@pytest.mark.realtime
@pytest.mark.timeout(120)
def test_a_budget_crossed_at_run_time_notifies_once_and_shows_its_course(sim: SimProcess, tmp_path: Path) -> None:
    # The schedule asks for 43,200 runs a day of 256 + 4 tokens (11.2M, inside the budget of 20M), but the request
    # lets the model go past max_tokens (extra_body, as max_completion_tokens would) and it reasons 900 tokens.
    sim.post("/sim/models/gpt-4o-mini", {"decode_tps": 5000, "reasoning_tokens": 900, "thinks_by_default": True})
    config = write_config(tmp_path, sim, extra=ALERTS)
    text = config.read_text().replace(
        "params: {max_tokens: 4}", "params: {max_tokens: 4, extra_body: {max_tokens: 1000}}"
    )
    config.write_text(text)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        [warning] = daemon.wait_for("budget_on_course_to_exceed", timeout=60)
        [notice] = daemon.wait_for("alert_notification", timeout=30)
        runs = len(daemon.events("job_finished"))
        daemon.wait_for("job_finished", count=runs + 3, timeout=30)
        _, body = http_get(daemon.metrics_url + "/metrics")
    finally:
        assert stop_daemon(daemon) == 0
    assert warning["budget"] == "jobs.tick" and warning["ratio"] > 1
    assert len(daemon.events("alert_notification")) == 1  # once, though every later run is over too
    assert len(daemon.events("budget_on_course_to_exceed")) == 1
    assert "budget.jobs.tick: job 'tick' is on course to spend" in str(notice), notice
    families = {f.name: f.samples for f in text_string_to_metric_families(body)}
    [course] = families["ttft_monitor_budget_course_ratio"]
    assert course.labels == {"budget": "jobs.tick", "per": "day"} and course.value > 1


@pytest.mark.realtime
@pytest.mark.timeout(150)
@pytest.mark.parametrize("action", ["reduce", "pause"])
def test_a_crossed_budget_with_an_action_reduces_or_pauses_its_job_and_says_so(
    sim: SimProcess, tmp_path: Path, action: str
) -> None:
    # As above, the model reasons past max_tokens; the job asks for 3 rounds and a warm-up.
    sim.post("/sim/models/gpt-4o-mini", {"decode_tps": 5000, "reasoning_tokens": 900, "thinks_by_default": True})
    # 4 requests a tick of 256 + 4 tokens project 44.9M a day, inside 50M; reasoning 900 each is 200M.
    budget = ALERTS.replace("tokens: 20000000}", f"tokens: 50000000, action: {action}}}")
    config = write_config(tmp_path, sim, rounds=3, extra=budget)
    text = (
        config.read_text()
        .replace("params: {max_tokens: 4}", "params: {max_tokens: 4, extra_body: {max_tokens: 1000}}")
        .replace("warmup: 0", "warmup: 1")
    )
    config.write_text(text)
    upgrade(config)
    daemon = start_daemon(config, tmp_path)
    try:
        wait_ready(daemon)
        [held] = daemon.wait_for("budget_action", timeout=60)
        [notice] = daemon.wait_for("alert_notification", timeout=30)
        ticks = "run_reduced_by_budget" if action == "reduce" else "tick_paused_by_budget"
        daemon.wait_for(ticks, count=3, timeout=30)
        _, metrics = http_get(daemon.metrics_url + "/metrics")
        _, overview = http_get(daemon.metrics_url + "/api/v1/series")
        samples_then = len(daemon.events("probe_sample"))
        daemon.wait_for(ticks, count=5, timeout=30)
        samples_after = len(daemon.events("probe_sample"))
    finally:
        assert stop_daemon(daemon) == 0
    assert held["job"] == "tick" and held["action"] == action and held["budget"] == "jobs.tick", held
    assert "its jobs (tick) " in notice["summary"] and "until" in notice["summary"], notice
    families = {f.name: f.samples for f in text_string_to_metric_families(metrics)}
    [level] = families["ttft_monitor_job_budget_action"]
    assert level.labels == {"probe_job": "tick"} and level.value == (1 if action == "reduce" else 2)
    [hold] = json.loads(overview)["budget_holds"]
    assert hold["job"] == "tick" and hold["action"] == action and hold["until"].endswith("T00:00:00+00:00"), hold
    if action == "reduce":  # one measured request a tick, no warm-up, from the hold on
        reduced = daemon.events("job_finished")[-2:]
        assert all(e["ok"] + e["failed"] == 1 for e in reduced), reduced
        assert samples_after > samples_then
    else:  # paused: nothing more is sent, and the skipped ticks are counted
        assert samples_after == samples_then
        skipped = [s for s in families["ttft_monitor_job_runs"] if s.labels.get("result") == "skipped_budget"]
        assert skipped and skipped[0].value >= 3, skipped
        # A restart keeps the pause: the last hour spent nothing, so only the saved hold says so.
        again = start_daemon(config, tmp_path, name="restarted")
        try:
            wait_ready(again)
            [restored] = again.wait_for("budget_action_restored", timeout=30)
            again.wait_for("tick_paused_by_budget", count=3, timeout=30)
        finally:
            assert stop_daemon(again) == 0
        assert (restored["job"], restored["action"], restored["until"]) == ("tick", "pause", hold["until"]), restored
        assert not again.events("probe_sample"), again.events("probe_sample")


@pytest.mark.realtime
@pytest.mark.timeout(240)
def test_a_pause_holds_each_once_of_a_cronjob_too(sim: SimProcess, tmp_path: Path) -> None:
    # A CronJob's `once` is a new process each time, with an empty state directory: the hold lives in the
    # database (budget_holds), and the next `once` reads it before its first request and sends nothing.
    # The schedule projects 33.7M tokens a day (a run every 2 s of 3 requests of 260 tokens), the least budget
    # check-config accepts. A `once` of 3 requests that reason 4,000 tokens spends about 15,000: a budget of 40M a
    # day is on course to be crossed while `once`s come at least every 30 s (with 900 tokens and 50M, every 9 s,
    # which process start-ups on a loaded machine missed: failed once in .ci/run at load 7).
    sim.post("/sim/models/gpt-4o-mini", {"decode_tps": 20000, "reasoning_tokens": 4000, "thinks_by_default": True})
    budget = ALERTS.replace("tokens: 20000000}", "tokens: 40000000, action: pause}")
    config = write_config(tmp_path, sim, rounds=3, extra=budget)
    config.write_text(
        config.read_text().replace("params: {max_tokens: 4}", "params: {max_tokens: 4, extra_body: {max_tokens: 5000}}")
    )
    upgrade(config)
    crossed = None
    for _ in range(15):  # the course needs 20 s of spend to project from (COURSE_MIN_SPAN_S)
        crossed = run_cli("once", "--config", str(config), timeout=60)
        assert crossed.code == 0, crossed
        if "budget_action" in crossed.stderr + crossed.stdout:
            break
    assert crossed is not None and "budget_action" in crossed.stderr + crossed.stdout, crossed
    paused = run_cli("once", "--config", str(config), timeout=60)
    assert paused.code == 0, paused
    output = paused.stderr + paused.stdout
    assert "tick_paused_by_budget" in output and "probe_sample" not in output, output
    # Exit 0, not a failure: a CronJob must not page its owners for a pause they configured.
    assert "ttft-monitor once: nothing probed, paused: tick by budget.jobs.tick until" in paused.stderr, paused
