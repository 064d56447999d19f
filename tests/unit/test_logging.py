"""Log lines are read by people: numbers come rounded, stored values keep every digit."""

from __future__ import annotations

import io
import json
import math

import pytest
import structlog

from monitor.logging import configure_logging, readable


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
