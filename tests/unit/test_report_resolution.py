"""A report computed from the hourly rollups (a long range) says so, in Markdown and in HTML; one from
the samples does not."""

from __future__ import annotations

from typing import Any

from monitor.web.report import HOURLY_NOTE, render_html, render_markdown


def document(resolution: str) -> Any:
    return {
        "start": "2026-09-01T00:00:00Z",
        "end": "2026-12-01T00:00:00Z",
        "resolution": resolution,
        "filters": {"targets": [], "prompts": [], "locations": []},
        "available": {"targets": ["a"], "prompts": ["short"], "locations": ["lab"]},
        "cells": [
            {
                "target": "a",
                "model": "m",
                "prompt": "short",
                "n": 4200,
                "median_ms": 300.0,
                "p90_ms": 420.0,
                "ci_low_ms": 290.0,
                "ci_high_ms": 310.0,
                "prompt_tokens_median": 512.0,
            },
        ],
        "pairs": [],
        "slopes": [],
        "cache": [],
    }


def test_a_report_from_the_hours_says_so_and_one_from_the_samples_does_not() -> None:
    assert HOURLY_NOTE in render_markdown(document("hour"), title="t")
    assert HOURLY_NOTE not in render_markdown(document("sample"), title="t")
    page = render_html(document("hour"), title="t")
    assert "From the hourly rollups" in page and 'data.resolution === "hour"' in page
