"""Writes kubernetes/prometheusrule.yaml from deploy/prometheus/rules.yaml, so the rules have one source.

python deploy/prometheus/kubernetes.py     # rewrite the PrometheusRule
python deploy/prometheus/kubernetes.py --check   # exit 1 when it is stale (tests/e2e/test_kubernetes.py checks too)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
PROMETHEUS_RULE = ROOT / "kubernetes" / "prometheusrule.yaml"
HEADER = """\
# GENERATED from deploy/prometheus/rules.yaml by `python deploy/prometheus/kubernetes.py`: edit that file,
# not this one (tests/e2e/test_kubernetes.py fails when they differ).
#
# For the Prometheus Operator (kube-prometheus-stack). Its Prometheus picks up PrometheusRules whose
# labels match its ruleSelector: kube-prometheus-stack's default is `release: <the Helm release name>`,
# so set that label to yours. Needs the operator's CRDs, which is why kustomization.yaml does not list it.
"""


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object carrying `rules` (a Prometheus rule file) unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "ttft-monitor",
            "labels": {
                "app.kubernetes.io/name": "ttft-monitor",
                "app.kubernetes.io/component": "rules",
                "release": "kube-prometheus-stack",
            },
        },
        "spec": {"groups": rules["groups"]},
    }


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    return HEADER + yaml.safe_dump(prometheus_rule(rules), sort_keys=False, width=200, allow_unicode=True)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PROMETHEUS_RULE.read_text() != text:
            print(f"{PROMETHEUS_RULE} is stale: run python deploy/prometheus/kubernetes.py", file=sys.stderr)
            return 1
        return 0
    PROMETHEUS_RULE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
