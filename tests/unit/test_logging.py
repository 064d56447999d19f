"""Log lines are read by people: numbers come rounded, stored values keep every digit."""

from __future__ import annotations

import io
import json
import math

import pytest
import structlog

from monitor.logging import LOG_TEXT_CAP, configure_logging, error_text, readable


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (186.83132367138577, 186.831),
        (2.4567891234, 2.457),
        (0.94213, 0.942),
        (0.0123456, 0.0123),
        (0.000123456, 0.000123),
        (-3.14159, -3.142),
        (1234567.891234, 1234567.891),
        (0.0, 0.0),
        (12.0, 12.0),
    ],
)
def test_a_float_keeps_three_decimals_and_three_significant_digits(value: float, shown: float) -> None:
    assert readable(value) == shown


def test_infinities_and_nan_are_left_as_they_are() -> None:
    assert readable(math.inf) == math.inf
    assert math.isnan(readable(math.nan))


def test_an_incident_line_prints_rounded_figures_nested_ones_included() -> None:
    out = io.StringIO()
    configure_logging(stream=out, json_output=True)
    try:
        structlog.get_logger().warning(
            "incident_opened",
            baseline_ms=186.83132367138577,
            observed_ms=459.1234567,
            ratio=2.45789123,
            rounds=3,
            flag=True,
            details={"peak_ratio": 2.8212345, "runs": [1.23456789, 7]},
        )
    finally:
        structlog.reset_defaults()
    line = out.getvalue().strip()
    event = json.loads(line)
    assert (event["baseline_ms"], event["observed_ms"], event["ratio"]) == (186.831, 459.123, 2.458), line
    assert event["details"] == {"peak_ratio": 2.821, "runs": [1.235, 7]}, line
    assert (event["rounds"], event["flag"]) == (3, True)
    assert "186.83132" not in line


def _line(out: io.StringIO) -> dict[str, object]:
    lines = out.getvalue().strip().splitlines()
    loaded: dict[str, object] = json.loads(lines[-1])
    return loaded


def test_a_text_logged_again_is_masked_with_the_secrets_known_now() -> None:
    out = io.StringIO()
    redactor = configure_logging(stream=out, json_output=True)
    try:
        structlog.get_logger().info("probe_sample", target="gateway-sk9Qz7xW2pLm")
        assert _line(out)["target"] == "gateway-sk9Qz7xW2pLm"
        redactor.secrets = ("sk9Qz7xW2pLm",)  # a reload learnt it
        structlog.get_logger().info("probe_sample", target="gateway-sk9Qz7xW2pLm")
        assert _line(out)["target"] == "gateway-[REDACTED]"
    finally:
        structlog.reset_defaults()


def test_long_texts_and_bounded_ones_are_still_capped_after_redaction() -> None:
    out = io.StringIO()
    configure_logging(stream=out, json_output=True, secrets=["hunter2-secret"])
    try:
        structlog.get_logger().info(
            "probe_failed",
            long="x" * 5000,
            bounded=error_text(RuntimeError("boom " + "y" * 400), 50),
            nested={"url": "https://u:pw@host/", "items": ["hunter2-secret", 1.23456]},
        )
    finally:
        structlog.reset_defaults()
    event = _line(out)
    assert len(str(event["long"])) == LOG_TEXT_CAP
    assert len(str(event["bounded"])) == 50
    assert event["nested"] == {"url": "https://u:[REDACTED]@host/", "items": ["[REDACTED]", 1.235]}


def test_a_url_password_is_redacted_after_any_run_of_letters_in_time_linear_in_the_text() -> None:
    # The scheme's pattern once ran to the end of every run of letters from each of its characters (a 100 KB
    # value took a minute): 300,000 letters glued to a scheme would now take hours; the test's timeout says so.
    out = io.StringIO()
    configure_logging(stream=out, json_output=True)
    try:
        glued = "x" * 50 + "postgresql://u:hunter3@db/x"
        long = "p" * 300_000 + "https://svc:hunter4@host/ " + "q" * 300_000 + "://"
        structlog.get_logger().info("failed", glued=glued, long=long)
    finally:
        structlog.reset_defaults()
    event = _line(out)
    assert str(event["glued"]).endswith("postgresql://u:[REDACTED]@db/x"), event
    assert "hunter3" not in out.getvalue() and "hunter4" not in out.getvalue()
    assert len(str(event["long"])) == LOG_TEXT_CAP


def test_a_line_keeps_its_keys_in_order_with_its_time_last() -> None:
    out = io.StringIO()
    configure_logging(stream=out, json_output=True)
    try:
        structlog.get_logger().bind(job="load").info("probe_sample", target="t1", ttft_ms=41.23456, ok=True)
    finally:
        structlog.reset_defaults()
    event = _line(out)
    assert list(event) == ["job", "target", "ttft_ms", "ok", "event", "level", "timestamp"]
    assert (event["ttft_ms"], event["ok"]) == (41.235, True)
    assert str(event["timestamp"]).endswith("Z")
