"""The demo's story on its own clock: the slowdown comes a set time after the first probe and only once
the slowed model has a baseline's worth of runs, and it lasts as long as asked (monitor.demo.Story)."""

from __future__ import annotations

from monitor.demo import BASELINE_RUNS, SLOWED, Story

LAUNCH = 1000.0  # monotonic seconds when the daemon was launched


def runs(story: Story, count: int, *, first_at: float, every_s: float = 5.0) -> float:
    """`count` runs of the slowed model's short prompt (three rounds each), the first at `first_at`."""
    at = first_at
    for index in range(count):
        at = first_at + index * every_s
        for round_ in (1, 2, 3):
            story.saw_sample({"target": SLOWED, "prompt": "short", "round": round_}, at)
            story.saw_sample({"target": "qwen3-8b", "prompt": "short", "round": round_}, at)
    return at


def test_the_clock_starts_at_the_first_probe_not_at_the_daemon_s_launch() -> None:
    # A daemon that took 20 s to start on a busy machine: 60 s are counted from its first probe.
    story = Story(slow_after_s=60, recover_after_s=150)
    assert not story.slow_due(LAUNCH + 61)  # no probe yet
    last = runs(story, BASELINE_RUNS + 1, first_at=LAUNCH + 20)
    assert not story.slow_due(LAUNCH + 20 + 59)
    assert story.slow_due(max(last, LAUNCH + 20 + 60))


def test_the_slowdown_waits_for_a_baseline_s_worth_of_runs() -> None:
    # Ticks missed at the start: at 60 s the slowed model has 8 runs, not 12; a slowdown now would be
    # inside the detector's trailing baseline and no page would open.
    story = Story(slow_after_s=60, recover_after_s=150)
    runs(story, 8, first_at=LAUNCH, every_s=5)
    assert story.runs == 8 and not story.slow_due(LAUNCH + 61)
    runs(story, BASELINE_RUNS - 8, first_at=LAUNCH + 62)
    assert story.runs == BASELINE_RUNS and story.slow_due(LAUNCH + 80)


def test_the_slowdown_lasts_as_long_as_asked_however_late_it_came() -> None:
    story = Story(slow_after_s=60, recover_after_s=120)
    runs(story, BASELINE_RUNS, first_at=LAUNCH)
    story.slowed_at = 75.0  # it waited 15 s for its runs
    assert not story.recover_due(LAUNCH + 120) and not story.recover_due(LAUNCH + 134.9)
    assert story.recover_due(LAUNCH + 135)
    story.recovered = True
    assert not story.recover_due(LAUNCH + 200) and not story.slow_due(LAUNCH + 200)
