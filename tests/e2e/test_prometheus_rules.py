"""deploy/prometheus/rules.yaml passes `promtool check rules` and its unit tests (rules.test.yaml), and
every alert has a test where it fires and one where it stays silent. promtool comes from Debian's
`prometheus` package, installed when missing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

pytest_plugins = ("tests.support.prometheus",)

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rules.test.yaml"
pytestmark = pytest.mark.promtool


def rule_groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text())["groups"])


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def run_promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_rules_pass_promtool_check(promtool: Path) -> None:
    done = run_promtool(promtool, "check", "rules", str(RULES), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_unit_tests_pass(promtool: Path) -> None:
    done = run_promtool(promtool, "test", "rules", str(RULE_TESTS), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_catch_a_broken_alert(promtool: Path, tmp_path: Path) -> None:
    broken = RULES.read_text().replace("(ttft_monitor_regression_state) == 2", "(ttft_monitor_regression_state) == 3")
    assert broken != RULES.read_text()
    (tmp_path / "rules.yaml").write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yaml")
    done = run_promtool(promtool, "test", "rules", "rules.test.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "TTFTRegressionPage" in done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in alerts():
        name = alert["alert"]
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: no test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{name}: no test where it stays silent"


def test_every_alert_routes_by_severity_and_service() -> None:
    for alert in alerts():
        labels = alert["labels"]
        assert labels["severity"] in {"page", "ticket"}, alert["alert"]
        assert labels["service"] == "ttft-monitor", alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], alert["alert"]


def test_the_burn_rate_alerts_use_the_standard_window_pairs() -> None:
    by_name = {alert["alert"]: alert for alert in alerts()}
    expected = {
        "TTFTSLOBurnRateFast": ("14.4 *", "rate1h", "rate5m", "page"),
        "TTFTSLOBurnRateMedium": ("6 *", "rate6h", "rate30m", "page"),
        "TTFTSLOBurnRateSlow": ("", "rate3d", "rate6h", "ticket"),
    }
    for name, (factor, long_window, short_window, severity) in expected.items():
        expr = by_name[name]["expr"]
        assert f"error_ratio:{long_window} >" in expr and f"error_ratio:{short_window} >" in expr, name
        assert factor in expr, name
        assert by_name[name]["labels"]["severity"] == severity


def test_no_rule_reads_a_label_named_job_for_the_probe_job() -> None:
    text = RULES.read_text()
    assert "exported_job" not in text
    for group in rule_groups():
        for rule in group["rules"]:
            assert not re.search(r"(?<![\w])job\s*[=!]|by \(job", rule["expr"]), rule
