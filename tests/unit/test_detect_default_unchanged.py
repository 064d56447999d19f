"""With the noise model off (`detection.noise_model: false`; the default until 2026-12-06, when it was turned
on by default), detection must be exactly what it was before the model existed. Seeded series go through
`Replayer` and `Detector.evaluate` with the config's rules and the model off, and every event and the final
stored state are compared with a golden file recorded from main's detector, before the model
(tests/golden/detect_default_events.json).

Re-recorded on 2026-12-03, deliberately, twice: when a served-model change began a new baseline epoch
(issue 24: the series' change on day 15.5 resolves and restarts the baseline), and when a page streak came
to need the run itself at the page ratio (issue 20: a burst that is over breaks it; `_Core._run_is_slow`).
Otherwise re-record it only from code without the noise model, e.g. main before issue 20 was merged:
    PYTHONPATH=/path/to/main python tests/unit/test_detect_default_unchanged.py --write
(run as a script, this file imports nothing from the tests package, so `monitor` is the one on PYTHONPATH).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypedDict

from monitor.detect.detector import Detector, Event, RunPoint, SeriesState
from monitor.detect.settings import Detection
from tests.support.series import RUNS_PER_DAY, make_series

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "detect_default_events.json"


class SeriesSpec(TypedDict):
    """make_series's arguments."""

    seed: int
    days: float
    probes: int
    phi: float


SERIES: dict[str, SeriesSpec] = {
    "iid-1-probe": {"seed": 1, "days": 18, "probes": 1, "phi": 0.0},
    "ar-3-probes": {"seed": 2, "days": 18, "probes": 3, "phi": 0.9},
    "ar-5-probes": {"seed": 3, "days": 18, "probes": 5, "phi": 0.97},
}


# The words a notice carries about the evidence (issue 20's "say why"): measured for the text only, they
# change no verdict, so the decisions are compared without them (tests/unit/test_regression_evidence.py
# checks the words).
WORDS_ONLY = ("evidence", "noise")


def plain(event: Event) -> dict[str, Any]:
    """An event as JSON: every field, floats exact (repr round-trips), times as ISO strings; the detail
    without its words-only keys."""
    data = json.loads(json.dumps(asdict(event), default=lambda value: value.isoformat()))
    data["detail"] = {key: value for key, value in data["detail"].items() if key not in WORDS_ONLY}
    return data


def replayed(points: list[RunPoint], detector: Detector) -> dict[str, Any]:
    replayer = detector.replayer()
    events = [plain(event) for point in points for event in replayer.feed(point)]
    return {"events": events, "state": replayer.state.to_json()}


def evaluated(points: list[RunPoint], detector: Detector, every: int = 1) -> list[dict[str, Any]]:
    """`Detector.evaluate` run by run on its history window (as the service runs it), over the first page."""
    state, events = SeriesState(), []
    for index in range(8 * RUNS_PER_DAY, round(9.3 * RUNS_PER_DAY), every):
        run = points[index]
        since = detector.history_since(run.at)
        history = [p for p in points[:index] if p.at >= since]
        state, new = detector.evaluate(history, state, run)
        events += [plain(event) for event in new]
    return events


def default_detector() -> Detector:
    # The rules the config gives with the model off, as the service builds them (not just `Rules()`).
    return Detector(Detection(noise_model=False).rules())


def record() -> dict[str, Any]:
    detector = default_detector()
    golden: dict[str, Any] = {name: replayed(make_series(**spec), detector) for name, spec in SERIES.items()}
    golden["evaluate"] = evaluated(make_series(**SERIES["ar-3-probes"]), detector)
    return golden


def test_the_golden_series_exercise_every_rule() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    events = [e for name in SERIES for e in golden[name]["events"]]
    opened = {(e["kind"], e["severity"], e["detail"].get("rule")) for e in events if e["action"] == "open"}
    kinds = {kind for kind, _severity, _rule in opened}
    assert {"regression", "availability"} <= kinds, opened
    assert ("regression", "page", None) in opened, opened
    assert any(rule == "cusum" for _k, _s, rule in opened), opened
    assert golden["evaluate"]


def test_detection_without_the_noise_model_is_what_it_was_before_it() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    detector = default_detector()
    assert not detector.rules.noise_model
    for name, spec in SERIES.items():
        got = replayed(make_series(**spec), detector)
        assert got["events"] == golden[name]["events"], name
        # The state it stores is main's too (no noise model in it).
        assert got["state"] == golden[name]["state"], name


def test_evaluate_without_the_noise_model_is_what_it_was() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert evaluated(make_series(**SERIES["ar-3-probes"]), default_detector()) == golden["evaluate"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
