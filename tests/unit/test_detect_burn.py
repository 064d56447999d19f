"""SLO burn rates (monitor/detect/burn.py): the verdict for one moment from constructed probe series,
the incident's life over time, the incremental replayer against the one-shot verdict, the wording."""

from __future__ import annotations

import argparse
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from monitor.config.models import Config
from monitor.detect.burn import (
    BurnIncident,
    BurnPolicy,
    BurnReplayer,
    BurnRule,
    Probe,
    advance,
    describe,
    describe_resolved,
    is_good,
    policy_for,
    replay_probes,
    verdict,
    window_counts,
)
from monitor.detect.settings import SloBurn
from monitor.probe.settings import Target
from tests.conftest import ROOT

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
POLICY = BurnPolicy(threshold_ms=800.0, objective=0.99, min_probes=10, keep_firing_s=600.0)


def series(*spans: tuple[float, float, int, int]) -> list[Probe]:
    """Probes from (oldest_minutes_ago, newest_minutes_ago, probes_per_5_min, bad_per_5_min) spans, one
    run every 5 minutes, the bad ones first in each run."""
    out = []
    for oldest, newest, per_run, bad in spans:
        minute = oldest
        while minute >= newest:
            at = NOW - timedelta(minutes=minute)
            out += [Probe(at, good=i >= bad) for i in range(per_run)]
            minute -= 5
    return out


@pytest.mark.parametrize(
    ("name", "probes", "severity"),
    [
        ("no data", [], None),
        ("all good for 3 days", series((4320, 0, 5, 0)), None),
        # 12 runs of 5 in the hour (the run 60 minutes ago is out): 12 of 60 bad = 20x, the last run 20x too.
        ("20% bad for the last hour pages", series((4320, 65, 5, 0), (60, 0, 5, 1)), "page"),
        (
            "exactly 14.4x over both windows pages (>=)",
            # 125 probes in the hour, 18 bad = 14.4%; the last 5 minutes: 25 probes, 3.6 bad is impossible,
            # so the short window is 25 probes with 4 bad (16%) and the hour carries exactly 18.
            [Probe(NOW - timedelta(minutes=50 - i * 0.4), good=i >= 14) for i in range(100)]
            + [Probe(NOW - timedelta(seconds=i), good=i >= 4) for i in range(25)],
            "page",
        ),
        (
            # (The 3-day window holds the same hour only, so 13.6x there opens a ticket.)
            "just under 14.4x over the hour does not page",
            [Probe(NOW - timedelta(minutes=50 - i * 0.4), good=i >= 13) for i in range(100)]
            + [Probe(NOW - timedelta(seconds=i), good=i >= 4) for i in range(25)],
            "ticket",
        ),
        (
            "a burning hour whose last 5 minutes are clean does not page",
            series((4320, 65, 5, 0), (60, 5, 5, 1), (0, 0, 5, 0)),
            None,
        ),
        ("a bad last 5 minutes after a clean hour does not page", series((4320, 5, 5, 0), (0, 0, 5, 5)), None),
        ("too few probes in the hour: 9 of 9 bad", series((40, 0, 1, 1)), None),
        ("10 probes in the hour, all bad: pages", series((45, 0, 1, 1)), "page"),
        # 2% bad over 3 days (2x) and over 6 h: a ticket, not a page (6x needs 6%).
        ("2% bad for 3 days is a ticket", series((4320, 0, 50, 1)), "ticket"),
        ("7% bad for 6 hours pages on the 6 h pair", series((4320, 365, 100, 0), (360, 0, 100, 7)), "page"),
        ("0.5% bad for 3 days is within the budget", series((4320, 0, 200, 1)), None),
    ],
)
def test_the_verdict_on_constructed_series(name: str, probes: list[Probe], severity: str | None) -> None:
    found = verdict(probes, POLICY, NOW)
    assert found.severity == severity, (name, [(r.rule, r.long_burn, r.short_burn) for r in found.results])


def test_failed_and_timed_out_probes_are_bad_and_the_threshold_itself_is_good() -> None:
    assert is_good(800.0, None, 800.0)
    assert not is_good(800.1, None, 800.0)
    assert not is_good(None, "timeout_first_token", 800.0)
    assert not is_good(120.0, "http_5xx", 800.0)  # failed after its first token: still a failed probe


def test_errors_burn_the_budget_like_slow_probes() -> None:
    probes = [Probe(NOW - timedelta(minutes=m), good=is_good(None, "connect", 800.0)) for m in range(0, 60, 5)]
    assert verdict(probes, POLICY, NOW).severity == "page"


def test_windows_hold_probes_after_now_minus_w_up_to_now() -> None:
    probes = [Probe(NOW - timedelta(seconds=300), False), Probe(NOW, False), Probe(NOW + timedelta(seconds=1), False)]
    counts = window_counts(probes, [300.0], NOW)
    assert (counts[300.0].total, counts[300.0].bad) == (1, 1)  # the one 5 min old is out, the future one too


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold_ms": 0}, "threshold_ms"),
        ({"threshold_ms": 800, "objective": 1.0}, "objective"),
        ({"threshold_ms": 800, "rules": ()}, "rules"),
    ],
)
def test_a_bad_policy_is_refused_with_its_cause(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BurnPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_rule_needs_a_short_window_shorter_than_its_long_one() -> None:
    with pytest.raises(ValueError, match="short < long"):
        BurnRule("page", 14.4, 300.0, 3600.0)


# ---------------------------------------------------------------- over time


def test_an_incident_opens_becomes_a_page_keeps_its_peak_and_resolves_after_keep_firing() -> None:
    ticket = verdict(series((4320, 0, 50, 1)), POLICY, NOW)
    incident, action = advance(None, ticket, NOW, POLICY)
    assert action == "open" and incident is not None and incident.severity == "ticket"

    later = NOW + timedelta(minutes=5)
    page = verdict(series((4320, 65, 5, 0), (60, -5, 5, 2)), POLICY, later)
    incident, action = advance(incident, page, later, POLICY)
    assert action == "update" and incident is not None and incident.severity == "page"
    peak = incident.peak_burn
    assert peak is not None and peak > 14.4

    quiet = verdict([], POLICY, later)
    for minutes, expected in ((9, None), (10, "resolve")):
        moment = later + timedelta(minutes=minutes)
        kept, action = advance(incident, quiet, moment, POLICY)
        assert action == expected, minutes
        assert kept is not None and kept.peak_burn == peak and kept.severity == "page"


def test_a_page_does_not_fall_back_to_a_ticket_while_open() -> None:
    incident = BurnIncident("page", NOW, NOW, 20.0, 20.0, NOW)
    ticket = verdict(series((4320, 0, 50, 1)), POLICY, NOW)
    moved, action = advance(incident, ticket, NOW, POLICY)
    assert action is None and moved is not None and moved.severity == "page" and moved.peak_burn == 20.0


def test_the_replayer_matches_the_one_shot_verdict_at_every_run() -> None:
    rng = random.Random(13)
    start = NOW - timedelta(days=4)
    probes = []
    runs = []
    for i in range(4 * 288):
        at = start + timedelta(minutes=5 * i)
        share = 0.3 if 700 <= i < 760 else 0.004
        goods = [rng.random() >= share for _ in range(3)]
        runs.append((at, goods))
        probes += [Probe(at, g) for g in goods]
    replayer = BurnReplayer(POLICY)
    incident = None
    resolved_at = None
    opened = 0
    for at, goods in runs:
        events = replayer.feed(at, goods)
        expected = verdict([p for p in probes if p.at <= at], POLICY, at)
        incident, action = advance(incident, expected, at, POLICY, last_resolved_at=resolved_at)
        if action == "resolve":
            incident, resolved_at = None, at
        assert [e.action for e in events] == ([action] if action else []), at
        opened += action == "open"
    assert opened >= 1
    assert [e.action for e in replay_probes(probes, POLICY)][:1] == ["open"]


def test_the_replayer_refuses_runs_out_of_order() -> None:
    replayer = BurnReplayer(POLICY)
    replayer.feed(NOW, [True])
    with pytest.raises(ValueError, match="oldest first"):
        replayer.feed(NOW - timedelta(minutes=5), [True])


# ---------------------------------------------------------------- wording and config


def test_the_page_names_the_share_the_threshold_the_objective_and_the_burn_rate() -> None:
    found = verdict(series((4320, 65, 5, 0), (60, 0, 5, 1)), POLICY, NOW)
    assert found.worst is not None
    assert describe("qwen3-8b", found.worst, POLICY) == (
        "qwen3-8b: 20% of probes over 800 ms or failed in the last hour (SLO 99%): burning 20x "
        "(page at 14.4x over 1 h and 5 min; 20% in the last 5 min)"
    )
    incident = BurnIncident("page", NOW, NOW, 15.0, 18.0, NOW)
    quiet = verdict(series((4320, 0, 5, 0)), POLICY, NOW)
    assert describe_resolved("qwen3-8b", quiet.headline_result(), POLICY, incident) == (
        "qwen3-8b: back under every burn rate (0% of probes over 800 ms or failed in the last 5 min); peaked at 18x"
    )


def test_the_policy_comes_from_the_target_and_detection_slo_burn() -> None:
    target = Target.model_validate({"provider": "p", "model": "m", "slo": {"ttft_ms": 800, "objective": 0.995}})
    policy = policy_for(target, SloBurn())
    assert policy is not None
    assert (policy.threshold_ms, round(policy.budget, 6), policy.keep_firing_s) == (800, 0.005, 600.0)
    assert [(r.severity, r.factor, r.long_s, r.short_s) for r in policy.rules] == [
        ("page", 14.4, 3600.0, 300.0),
        ("page", 6.0, 21600.0, 1800.0),
        ("ticket", 1.0, 259200.0, 21600.0),
    ]
    assert policy_for(Target.model_validate({"provider": "p", "model": "m"}), SloBurn()) is None
    assert policy_for(target, SloBurn(enabled=False)) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"targets": {"t": {"slo": {"objective": 0.99}}}}, "objective (0.99) needs ttft_ms"),
        ({"targets": {"t": {"slo": {"ttft_ms": 800, "objective": 1.5}}}}, "less than 1"),
        (
            {
                "detection": {
                    "slo_burn": {
                        "windows": [
                            {
                                "severity": "page",
                                "burn_rate": 14.4,
                                "long_window_minutes": 5,
                                "short_window_minutes": 60,
                            }
                        ]
                    }
                }
            },
            "short_window_minutes (60) must be shorter than long_window_minutes (5)",
        ),
        ({"detection": {"slo_burn": {"windows": []}}}, "at least 1 item"),
        (
            {
                "detection": {
                    "slo_burn": {
                        "windows": [
                            {"severity": "info", "burn_rate": 1, "long_window_minutes": 60, "short_window_minutes": 5}
                        ]
                    }
                }
            },
            "'page' or 'ticket'",
        ),
        (
            {"database": {"retention": {"raw_days": 2}}, "targets": {"t": {"slo": {"ttft_ms": 800}}}},
            "raw_days (2) keeps fewer days of probes than detection.slo_burn's longest window (3 days)",
        ),
    ],
)
def test_bad_slo_config_is_refused_naming_the_key_and_the_fix(change: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "providers": {"p": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
        "targets": {"t": {"provider": "p", "model": "m"}},
    }
    for key, value in change.items():
        if key == "targets":
            base["targets"] = {"t": {"provider": "p", "model": "m", **value["t"]}}  # type: ignore[index]
        else:
            base[key] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        Config.model_validate(base)


def test_the_old_slo_keys_still_load() -> None:
    config = Config.model_validate(
        {
            "providers": {"p": {"base_url": "http://127.0.0.1:1/v1", "api": "openai-chat"}},
            "targets": {"t": {"provider": "p", "model": "m", "slo": {"ttft_p50_ms": 500}}},
        }
    )
    assert config.targets["t"].slo.ttft_p50_ms == 500 and config.targets["t"].slo.ttft_ms is None


def _prometheus_duration(minutes: float) -> str:
    for unit, size in (("d", 1440), ("h", 60), ("m", 1)):
        if minutes % size == 0:
            return f"{minutes // size:g}{unit}"
    raise AssertionError(f"{minutes} minutes has no Prometheus duration")


def test_the_default_windows_are_the_prometheus_burn_rate_alerts() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if r.get("alert", "").startswith("TTFTSLOBurnRate")]
    found = set()
    for alert in alerts:
        long, short = re.findall(
            r"error_ratio:rate(\w+) >= on \(target\) group_left \(\) \(?(?:([\d.]+) \*)?", alert["expr"]
        )
        assert long[1] == short[1], alert["alert"]
        found.add((alert["labels"]["severity"], float(long[1] or 1), long[0], short[0]))
    defaults = {
        (
            w.severity,
            w.burn_rate,
            _prometheus_duration(w.long_window_minutes),
            _prometheus_duration(w.short_window_minutes),
        )
        for w in SloBurn().windows
    }
    assert found == defaults


def test_a_burn_notification_reads_as_a_burn_rate_not_as_ttft_against_a_baseline() -> None:
    import uuid

    from monitor.alert.model import Notification
    from monitor.alert.text import plain_text

    firing = Notification(
        incident_id=uuid.UUID(int=1),
        state="firing",
        kind="slo_burn",
        severity="page",
        job="every-5m",
        target="qwen3-8b",
        model="Qwen/Qwen3-8B",
        provider="vllm",
        prompt="*",
        location="fra",
        since=NOW,
        baseline_ms=800.0,
        ratio=18.0,
        peak_ratio=21.5,
        peak_at=NOW,
        summary="qwen3-8b: 18% of probes over 800 ms or failed in the last hour (SLO 99%): burning 18x",
    )
    text = plain_text(firing, NOW).splitlines()
    assert text[0] == "[PAGE] TTFT SLO burn rate on qwen3-8b / * @ fra: burning the error budget 18.00x"
    assert text[1] == firing.summary
    assert not any(line.startswith("TTFT:") for line in text)
    resolved = plain_text(firing.with_changes(state="resolved", resolved_at=NOW), NOW).splitlines()
    assert resolved[0] == "[RESOLVED] TTFT SLO burn rate on qwen3-8b / * @ fra: back under, peaked at 21.50x"


# ---------------------------------------------------------------- replay


def test_replay_pools_a_targets_prompts_per_location_and_reports_one_burn_incident(tmp_path: Path) -> None:
    import io
    import json

    from monitor.commands import replay as cli

    start = NOW - timedelta(hours=4)
    rows = ["timestamp,series,ttft_ms,error,run_id"]
    for i in range(48):  # every 5 minutes for 4 hours; hour 2 to 3 slow on both prompts at lab
        at = (start + timedelta(minutes=5 * i)).isoformat()
        slow = 12 <= i < 24
        for series in ("api/short/lab", "api/long/lab", "api/short/far", "other/short/lab"):
            for r in range(2):
                ttft = "900" if slow and series.endswith("/lab") else "200"
                error = "timeout_first_token" if slow and r == 1 and series == "api/long/lab" else ""
                rows.append(f"{at},{series},{'' if error else ttft},{error},run{i}")
    samples = tmp_path / "samples.csv"
    samples.write_text("\n".join(rows) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        "providers:\n  local: {base_url: 'http://127.0.0.1:8000/v1', api: openai-chat}\n"
        "targets:\n  api: {provider: local, model: m, slo: {ttft_ms: 800}}\n"
        "  other: {provider: local, model: m}\n"
        "detection:\n  slo_burn: {keep_firing_minutes: 0}\n"
    )
    parser = argparse.ArgumentParser(prog="ttft-monitor replay")
    cli.register(parser)
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(parser.parse_args(["--samples", str(samples), "--config", str(config)]), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    burns = [line for line in map(json.loads, out.getvalue().splitlines()) if line["kind"] == "slo_burn"]
    assert [(b["series"], b["severity"]) for b in burns] == [("api/*/lab", "page")], burns
    assert burns[0]["opened_at"] == (start + timedelta(minutes=60)).isoformat().replace("+00:00", "Z")
    # Fast again from minute 120: the 6 h / 30 min page pair holds it until its 30 minutes are clean
    # (minute 145); the 3 d / 6 h ticket pair, which would hold it for 6 hours, does not hold a page.
    assert burns[0]["resolved_at"] == (start + timedelta(minutes=145)).isoformat().replace("+00:00", "Z")
    assert burns[0]["baseline_ms"] == 800 and burns[0]["peak_ratio"] >= 14.4


def test_a_page_resolves_when_only_the_ticket_pair_still_fires_and_the_ticket_waits_for_fresh_probes() -> None:
    # An hour at 100% bad ended 40 minutes ago: the 3 d / 6 h ticket pair still fires, no page pair does.
    probes = series((4320, 105, 5, 0), (100, 45, 5, 5), (40, 0, 5, 0))
    found = verdict(probes, POLICY, NOW)
    assert found.severity == "ticket"
    page = BurnIncident("page", NOW - timedelta(minutes=95), NOW - timedelta(minutes=45), 80.0, 100.0, NOW)
    kept, action = advance(page, found, NOW, POLICY)
    assert action == "resolve" and kept is not None and kept.severity == "page"
    # Resolved 30 minutes ago: the 6-hour window still holds the outage's probes, so no new ticket ...
    reopened, action = advance(None, found, NOW, POLICY, last_resolved_at=NOW - timedelta(minutes=30))
    assert (reopened, action) == (None, None)
    # ... until it holds only probes from after the resolve (and they still burn the budget).
    later = NOW + timedelta(hours=6)
    burning = verdict(series((4320, 105, 5, 0), (100, -360, 50, 1)), POLICY, later)  # 2%: 2x
    assert burning.severity == "ticket"
    _, action = advance(None, burning, later, POLICY, last_resolved_at=later - timedelta(hours=6, minutes=1))
    assert action == "open"
    _, action = advance(None, burning, later, POLICY, last_resolved_at=later - timedelta(hours=5))
    assert action is None
