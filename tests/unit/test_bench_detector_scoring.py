"""bench/detector.py's scoring, which docs/detection.md's tables and issue 20's targets are read from: an
alert is false by when it opened, a page by when it paged."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "detector.py"
HOUR = 3600.0
WEEK = 7 * 24 * HOUR


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_detector_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def a_week_with_a_doubling(bench: ModuleType) -> object:
    step = bench.Step(start=100 * HOUR, end=110 * HOUR, factor=2.0)
    return bench.Series(times=[], ttfts=[], steps=[step], duration_s=WEEK, probes=[], rounds=5)


def test_a_ticket_opened_before_a_doubling_and_paged_on_it_is_a_false_alert_not_a_false_page(
    bench: ModuleType,
) -> None:
    series = a_week_with_a_doubling(bench)
    wander = bench.Alert(opened=98 * HOUR, severity="page", resolved=111 * HOUR, paged=100.3 * HOUR, opener="cusum")
    result = bench.score(series, [wander])
    assert (result.false_alerts, result.false_pages, result.pages) == (1, 0, 1)
    assert result.caught[2.0] == 1 and result.delays[2.0] == [pytest.approx(0.3 * HOUR)]


def test_a_page_outside_every_step_is_false_whenever_its_incident_opened(bench: ModuleType) -> None:
    series = a_week_with_a_doubling(bench)
    on_no_step = bench.Alert(opened=20 * HOUR, severity="page", resolved=21 * HOUR, paged=20 * HOUR, opener="page")
    # Opened as a ticket during the step, paged a day after it ended: the page woke someone for nothing.
    late = bench.Alert(opened=105 * HOUR, severity="page", resolved=140 * HOUR, paged=135 * HOUR, opener="ticket")
    result = bench.score(series, [on_no_step, late])
    assert (result.false_alerts, result.false_pages) == (1, 2)


def test_a_ticket_outside_every_step_is_a_false_alert_and_no_page(bench: ModuleType) -> None:
    series = a_week_with_a_doubling(bench)
    ticket = bench.Alert(opened=20 * HOUR, severity="ticket", resolved=22 * HOUR, opener="ticket")
    result = bench.score(series, [ticket])
    assert (result.false_alerts, result.false_pages, result.false_by["ticket"]) == (1, 0, 1)
