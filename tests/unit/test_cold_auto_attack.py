"""The cold tier's least fixed cutoff (`Config.cold_minimum`) against what detection reads: pure parts of the attack
on `cold_after_days` (tests/integration/test_cold_auto_attack.py has the databases')."""

from __future__ import annotations

import itertools
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config.cron import next_fire_times
from monitor.config.loader import load_config
from monitor.config.models import COLD_REFERENCE, Config


def config_of(tmp_path: Path, schedule: str, **retention: Any) -> Config:
    data: dict[str, Any] = {
        "providers": {"sim": {"base_url": "http://127.0.0.1:8400/v1", "api": "openai-chat"}},
        "targets": {"qwen3-8b": {"provider": "sim", "model": "qwen3-8b"}},
        "prompts": {"short": {"tokens": 512}},
        "jobs": [{"name": "probe", "schedule": schedule, "targets": ["qwen3-8b"], "prompts": ["short"]}],
        "database": {"retention": {"raw_days": 400, **retention}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_config(path, environ={})


def detection_reach_days(config: Config) -> int:
    """The most whole days detection reads back for any run of the job over a week: each run is evaluated with
    the gap between the job's next two fires as its interval (detect/service.py job_interval), that is the gap
    after the next run's."""
    rules = config.detection.rules()
    fires = next_fire_times(config.jobs[0].trigger(), COLD_REFERENCE, 8 * 24 * 60)
    fires = [fire for fire in fires if fire < COLD_REFERENCE + timedelta(days=8)]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(fires)]
    return math.ceil(max(rules.history_reach_s(gap) for gap in gaps) / 86400.0)


@pytest.mark.parametrize(
    "schedule",
    [
        "*/5 * * * *",
        "0 * * * *",
        "0 9,17 * * *",  # 12 fires find its 16 h
        "*/5 9-17 * * 1-5",  # business hours: 15 h each night, 63 h over the weekend
        "* 9 * * *",  # a minute's burst a day: 23 h 1 min
        "30 8-18/2 * * 1-5",
    ],
)
def test_the_least_fixed_cutoff_covers_what_detection_reads_of_every_run_of_a_week(
    tmp_path: Path, schedule: str
) -> None:
    """`cold_minimum` read 12 fires from a Monday's midnight: a job's gaps later in the day or the week went
    unseen, and `cold_after_days: 9` was accepted for a business-hours job whose 17:50 run detection reads 38
    days back (63 h x 61 + 8 days on Fridays: 169)."""
    config = config_of(tmp_path, schedule)
    assert config.cold_minimum()[0] >= detection_reach_days(config)
