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


def a_row(bench: ModuleType, *, false: int, quiet: int, pages: int, delay_s: float) -> object:
    row = bench.Score(weeks=10.0, false_alerts=false, false_pages=pages, quiet_weeks=4.0, quiet_alerts=quiet)
    for size in bench.STEP_SIZES:
        row.steps[size] = row.caught[size] = 2
        row.delays[size] = [delay_s, delay_s]
    return row


def test_the_summary_averages_the_rows_and_counts_those_meeting_each_target(bench: ModuleType) -> None:
    one_probe = a_row(bench, false=3, quiet=4, pages=0, delay_s=600)  # 0.3 / 1.0 false alerts a week: over
    five_probes = a_row(bench, false=0, quiet=0, pages=1, delay_s=1200)  # 0.1 false pages a week: over
    scores = {(1, 0.3, "iid"): {"ours": one_probe}, (5, 0.3, "iid"): {"ours": five_probes}}
    header, _rule, line = bench.summary(scores)
    assert header.startswith("| detector | rows |")
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:4] == ["ours", "2", "0.150 / 0.500", "0.0500 / 0.0000"]
    assert cells[4:8] == ["100.0% / 15"] * 4  # each row's median delay (10 and 20 minutes), averaged
    assert cells[8] == "0 / 1 / 1 / 2 / 2 / 1 of 1"
