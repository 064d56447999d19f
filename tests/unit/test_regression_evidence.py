"""Why a regression opened, in words (issue 20's "say why"): the shift, over how many runs, and the
series' noise, measured even when the rules do not use the noise model (`detection.noise_model: false`)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from monitor.detect.detector import Detector, Event, RunPoint
from monitor.detect.settings import Detection
from tests.support.series import Step, make_series, series

EVIDENCE = re.compile(
    r"\+(\d+)% over (\d+) runs \(noise: sd (\d\.\d\d), (?:runs correlate for about (\d+) min|runs look independent); "
    r"equivalent to ([\d.]+) independent runs\)"
)


def opened(points: list[RunPoint], detector: Detector) -> list[Event]:
    replayer = detector.replayer()
    return [e for p in points for e in replayer.feed(p) if e.kind == "regression" and e.action == "open"]


def test_the_rules_without_the_model_say_why_with_the_series_noise() -> None:
    detector = Detector(Detection(noise_model=False).rules())
    assert not detector.rules.noise_model
    points = series(6, sigma=0.2, seed=4, probes=3, steps=[Step(start_day=5.0, hours=6, factor=2.0)])
    (event,) = opened(points, detector)
    words = event.detail["evidence"]
    match = EVIDENCE.fullmatch(words)
    assert match, words
    assert 80 <= int(match.group(1)) <= 120, words  # a doubling, as the incident's ratio says
    assert event.ratio is not None and f"{(event.ratio - 1) * 100:+.0f}%" in words
    assert 0.1 <= float(match.group(3)) <= 0.25, words  # sigma 0.2 per probe, median of 3: about 0.12
    assert event.detail["noise"]["in_rules"] is False


def test_correlated_noise_reads_as_runs_that_correlate_and_count_for_less() -> None:
    detector = Detector(Detection(noise_model=False).rules())
    correlated = make_series(seed=5, days=12, probes=3, phi=0.97)
    independent = make_series(seed=5, days=12, probes=3, phi=0.0)
    ar = [e for e in opened(correlated, detector) if "evidence" in e.detail and "noise" in e.detail]
    iid = [e for e in opened(independent, detector) if "evidence" in e.detail and "noise" in e.detail]
    assert ar and iid

    def minutes(event: Event) -> float:
        return float(event.detail["noise"]["correlation_minutes"])

    assert max(map(minutes, ar)) > 2 * max(map(minutes, iid)), ([minutes(e) for e in ar], [minutes(e) for e in iid])
    for event in ar:
        noise = event.detail["noise"]
        window = int(EVIDENCE.fullmatch(event.detail["evidence"]).group(2))  # type: ignore[union-attr]
        assert noise["effective_runs"] < window, event.detail


@pytest.mark.parametrize("noise_model", [True, False], ids=["model-on", "model-off"])
def test_a_series_younger_than_a_day_says_its_noise_is_not_measured_yet(noise_model: bool) -> None:
    # With the model on (the default) its own estimate has nothing in it before the series' second day: the
    # notice must not call that "sd 0.00, runs look independent".
    rules = dataclasses.replace(Detection(noise_model=noise_model).rules(), min_history_runs=12)
    points = series(0.5, sigma=0.1, seed=6, probes=5, steps=[Step(start_day=0.3, hours=4, factor=3.0)])
    events = opened(points, Detector(rules))
    assert events, "a tripling within half a day pages on the trailing baseline"
    assert events[0].detail["evidence"].endswith("(noise not measured yet: under a day of seasonal history)")
    assert "noise" not in events[0].detail


def test_the_series_page_shows_the_noise_the_default_rules_do_not_use() -> None:
    from monitor.web.queries import detector_baselines, noise_estimate

    points = series(9, sigma=0.2, seed=7, probes=3)
    for rules, in_rules in ((Detection(noise_model=False).rules(), False), (Detection(noise_model=True).rules(), True)):
        models: list[tuple[object, bool]] = []
        detector_baselines(Detector(rules), points, step_from=points[-12].at, noise=models)  # type: ignore[arg-type]
        (model, used), *_ = models
        shown = noise_estimate(model, points, in_rules=used)  # type: ignore[arg-type]
        assert shown is not None and shown["in_rules"] is in_rules, shown
        assert 0.08 < shown["sd"] < 0.25 and shown["text"].startswith("noise: sd "), shown
    young = series(0.5, sigma=0.2, seed=7, probes=3)
    models = []
    detector_baselines(Detector(Detection(noise_model=False).rules()), young, step_from=young[-12].at, noise=models)  # type: ignore[arg-type]
    assert noise_estimate(models[0][0], young, in_rules=models[0][1]) is None  # type: ignore[arg-type]
