"""Replay: the samples CSV, incidents from a recorded history, `ttft-monitor replay`, and --export."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from monitor.cli import build_parser
from monitor.commands import replay as cli
from monitor.detect.detector import Detector, RunPoint
from monitor.detect.export import export_samples, series_names
from monitor.detect.replay import SampleRow, read_samples_csv, replay, write_samples_csv
from monitor.detect.sample_cells import ReplayError
from monitor.probe.result import ErrorClass
from monitor.store.records import SeriesKey
from monitor.store.repository import Repository
from tests.support.ports import free_port
from tests.support.store_fixtures import T0 as STORE_T0
from tests.support.store_fixtures import Backend, make_batch

pytest_plugins = ("tests.support.store_fixtures",)

T0 = datetime(2025, 1, 6, tzinfo=UTC)
EVERY = timedelta(minutes=5)
INCIDENT_KEYS = [
    "series",
    "kind",
    "severity",
    "opened_at",
    "resolved_at",
    "baseline_ms",
    "observed_ms",
    "ratio",
    "error",
]


def read(text: str) -> dict[str, list[RunPoint]]:
    return read_samples_csv(io.StringIO(text))


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


# ---------------------------------------------------------------- reading the CSV


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a,100\n2025-01-06T00:05:00Z,a,\n",
            {"a": [(at(0), 100.0, None, 1, 0), (at(5), None, None, 0, 1)]},
        ),
        (  # rows sharing a run_id are one run: the median of its successes, the time of its first row
            "timestamp,series,ttft_ms,error,run_id\n"
            "2025-01-06T00:00:02Z,a,300,,r1\n"
            "2025-01-06T00:00:01Z,a,100,,r1\n"
            "2025-01-06T00:00:03Z,a,,timeout_first_token,r1\n"
            "2025-01-06T00:00:04Z,a,200,,r1\n",
            {"a": [(at(0) + timedelta(seconds=1), 200.0, "timeout_first_token", 3, 1)]},
        ),
        (  # a run whose every request failed has no TTFT; its dominant error class is kept
            "run_id,series,timestamp,ttft_ms,error\n"
            "r1,a,2025-01-06T00:00:00Z,,server_error\n"
            "r1,a,2025-01-06T00:00:01Z,,rate_limited\n"
            "r1,a,2025-01-06T00:00:02Z,,server_error\n",
            {"a": [(at(0), None, "server_error", 0, 3)]},
        ),
        (  # a request with an error failed, even with a first token (as in the store)
            "timestamp,series,ttft_ms,error\n2025-01-06T00:00:00Z,a,150,stream_error\n",
            {"a": [(at(0), None, "stream_error", 0, 1)]},
        ),
        (  # series are kept apart and runs sorted; the same run_id in two series is two runs
            "timestamp,series,ttft_ms,run_id\n"
            "2025-01-06T00:05:00Z,b,20,r1\n"
            "2025-01-06T00:10:00+01:00,a,30,r1\n"
            "2025-01-06T00:00:00,a,10,r2\n",
            {"a": [(at(-50), 30.0, None, 1, 0), (at(0), 10.0, None, 1, 0)], "b": [(at(5), 20.0, None, 1, 0)]},
        ),
        (  # extra columns, a byte order mark, blank lines and surrounding spaces are tolerated
            "\ufefftimestamp, series ,ttft_ms,note\n\n2025-01-06T00:00:00Z, a , 12.5 ,hello\n",
            {"a": [(at(0), 12.5, None, 1, 0)]},
        ),
    ],
    ids=["one-row-per-run", "run-id-groups", "all-failed", "error-wins", "series-and-order", "lenient"],
)
def test_it_reads_runs_from_the_samples_csv(
    text: str, expected: dict[str, list[tuple[datetime, float | None, str | None, int, int]]]
) -> None:
    runs = read(text)
    assert {name: [(p.at, p.ttft_ms, p.error, p.ok, p.errors) for p in points] for name, points in runs.items()} == (
        expected
    )


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 1, "empty"),
        ("timestamp,series\n2025-01-06T00:00:00Z,a\n", 1, "lacks 'ttft_ms'"),
        ("time,series,ttft\n", 1, "'timestamp', 'ttft_ms'"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a,1\nyesterday,a,1\n", 3, "timestamp 'yesterday'"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a,fast\n", 2, "ttft_ms 'fast'"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a,-4\n", 2, "positive number"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a,nan\n", 2, "positive number"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,,1\n", 2, "series is empty"),
        ("timestamp,series,ttft_ms\n2025-01-06T00:00:00Z,a\n", 2, "2 fields where the header has 3"),
        ("timestamp,series,ttft_ms,error\n2025-01-06T00:00:00Z,a,,connection refused by peer\n", 2, "error class"),
    ],
)
def test_a_bad_csv_is_refused_with_its_line_number(text: str, line: int, message: str) -> None:
    with pytest.raises(ReplayError, match=message) as caught:
        read(text)
    assert caught.value.line == line
    assert str(caught.value).startswith(f"line {line}: ")


def test_written_samples_read_back_as_the_same_runs() -> None:
    rows = [
        SampleRow(at(0), "qwen3-8b/short/fra", 101.25, run_id="r1"),
        SampleRow(at(0) + timedelta(seconds=1), "qwen3-8b/short/fra", None, "timeout_first_token", "r1"),
        SampleRow(at(5), "qwen3-8b/short/fra", 99.0, run_id="r2"),
        SampleRow(at(5), 'odd, "quoted" name', 1 / 3),
    ]
    stream = io.StringIO()
    assert write_samples_csv(rows, stream) == 4
    text = stream.getvalue()
    assert text.splitlines()[:2] == [
        "timestamp,series,ttft_ms,error,run_id",
        "2025-01-06T00:00:00Z,qwen3-8b/short/fra,101.25,,r1",
    ]
    runs = read(text)
    assert [(p.at, p.ttft_ms, p.error, p.ok, p.errors) for p in runs["qwen3-8b/short/fra"]] == [
        (at(0), 101.25, "timeout_first_token", 1, 1),
        (at(5), 99.0, None, 1, 0),
    ]
    assert runs['odd, "quoted" name'][0].ttft_ms == 1 / 3


# ---------------------------------------------------------------- replaying


def outage_csv(series: str = "api/short/lab", *, ttft: float = 100.0) -> str:
    rows = [
        SampleRow(at(5 * i), series, None if 30 <= i < 34 else ttft, "timeout_first_token" if 30 <= i < 34 else None)
        for i in range(40)
    ]
    stream = io.StringIO()
    write_samples_csv(rows, stream)
    return stream.getvalue()


def test_replay_yields_each_incident_once_with_its_numbers() -> None:
    incidents = list(replay(read(outage_csv()), lambda _series: Detector()))
    assert incidents == [
        {
            "series": "api/short/lab",
            "kind": "availability",
            "severity": "page",
            "opened_at": "2025-01-06T02:40:00Z",
            "resolved_at": "2025-01-06T03:00:00Z",
            "baseline_ms": None,
            "observed_ms": None,
            "ratio": None,
            "error": "timeout_first_token",
        }
    ]


def test_an_incident_still_open_at_the_end_has_no_resolution() -> None:
    points = {"s": [RunPoint(at(5 * i), 100.0 if i < 30 else 1000.0) for i in range(40)]}
    incidents = list(replay(points, lambda _series: Detector()))
    assert [(i["kind"], i["severity"], i["resolved_at"]) for i in incidents] == [("regression", "page", None)]
    assert incidents[0]["ratio"] == pytest.approx(10.0)
    assert incidents[0]["baseline_ms"] == pytest.approx(100.0)


@pytest.mark.solo  # a time bound: it runs while no other test runs
def test_a_year_of_five_minute_runs_replays_in_seconds(tmp_path: Path) -> None:
    rng = random.Random(9)
    rows = (
        SampleRow(T0 + i * EVERY, "s", 400 * (1 + 0.2 * math.sin(2 * math.pi * i / 288)) * math.exp(rng.gauss(0, 0.2)))
        for i in range(365 * 288)
    )
    path = tmp_path / "year.csv"
    with path.open("w", encoding="utf-8", newline="") as stream:
        write_samples_csv(rows, stream)
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    code = cli.run(parse("replay", "--samples", str(path)), stdout=out, stderr=err)
    elapsed = time.perf_counter() - started
    assert code == 0, err.getvalue()
    assert "replayed 105120 runs of 1 series" in err.getvalue()
    # The sequential rule costs per run: 12.6 to 17.4 s here on a shared, loaded 2-core VM (under 10 s
    # without it).
    assert elapsed < 25, f"{elapsed:.1f} s"


# ---------------------------------------------------------------- the command


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))  # the real registry, as `ttft-monitor` parses


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(parse("replay", *argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_replay_prints_one_json_object_per_incident(tmp_path: Path) -> None:
    samples = tmp_path / "samples.csv"
    samples.write_text(outage_csv() + outage_csv("api/long/lab").split("\n", 1)[1])
    code, out, err = run("--samples", str(samples))
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [list(line) for line in lines] == [INCIDENT_KEYS, INCIDENT_KEYS]
    assert [(line["series"], line["kind"]) for line in lines] == [
        ("api/long/lab", "availability"),
        ("api/short/lab", "availability"),
    ]
    assert err == (
        "api/long/lab: 0.1 days of runs, too few for a weekly alert rate (7 needed; tickets open only after 3.5)\n"
        "api/short/lab: 0.1 days of runs, too few for a weekly alert rate (7 needed; tickets open only after 3.5)\n"
        "replayed 80 runs of 2 series: 2 incidents\n"
    )


def test_replay_says_per_series_the_alert_rate_its_history_implies(tmp_path: Path) -> None:
    # Two weeks of a healthy series with one 3-hour doubling (a page) on day 10: the replay's regression
    # alerts per week, which on a history without the doubling would be its false-alert rate.
    rng = random.Random(4)
    rows = [
        SampleRow(
            T0 + i * EVERY,
            "api/short/lab",
            400 * (2.0 if 10 * 288 <= i < 10 * 288 + 36 else 1.0) * math.exp(rng.gauss(0, 0.2)),
        )
        for i in range(14 * 288)
    ]
    path = tmp_path / "weeks.csv"
    with path.open("w", encoding="utf-8", newline="") as stream:
        write_samples_csv(rows, stream)
    code, out, err = run("--samples", str(path))
    assert code == 0, err
    regressions = [line for line in map(json.loads, out.splitlines()) if line["kind"] == "regression"]
    assert "page" in [r["severity"] for r in regressions], out
    days = 14 - 1 / 288
    line = err.splitlines()[0]
    assert line == (
        f"api/short/lab: {days:.1f} days of runs, {len(regressions)} regression alerts: "
        f"{len(regressions) / (days / 7):.2f} a week at these settings (on a healthy history, its false-alert rate)"
    ), err


def test_replay_uses_the_configs_rules_and_the_targets_slo(tmp_path: Path) -> None:
    samples = tmp_path / "samples.csv"
    samples.write_text(outage_csv("api/short/lab", ttft=100.0))
    config = tmp_path / "config.yaml"
    config.write_text(
        "providers:\n  local: {base_url: 'http://127.0.0.1:8000/v1', api: openai-chat}\n"
        "targets:\n  api: {provider: local, model: m, slo: {ttft_p50_ms: 80}}\n"
        "detection:\n  availability: {consecutive_failures: 5}\n"
    )
    code, out, err = run("--samples", str(samples), "--config", str(config))
    assert code == 0, err
    kinds = [(line["kind"], line["severity"]) for line in map(json.loads, out.splitlines())]
    assert kinds == [("slo", "ticket")]  # four failures in a row no longer page


@pytest.mark.parametrize(
    ("argv", "content", "message"),
    [
        (["--samples", "{dir}/missing.csv"], None, "cannot read"),
        (["--samples", "{dir}/bad.csv"], "timestamp,series,ttft_ms\n2025-01-06,a,x\n", "bad.csv: line 2: ttft_ms 'x'"),
        (["--samples", "{dir}/bad.csv"], b"timestamp,series,ttft_ms\n\xff\n", "not UTF-8"),
        (["--samples", "{dir}/bad.csv", "--config", "{dir}/nope.yaml"], "", "file not found"),
        ([], None, "give --samples FILE.csv"),
        (["--samples", "x.csv", "--export"], None, "not both"),
    ],
)
def test_bad_input_exits_2_saying_what_to_fix(
    tmp_path: Path, argv: list[str], content: str | bytes | None, message: str
) -> None:
    if isinstance(content, bytes):
        (tmp_path / "bad.csv").write_bytes(content)
    elif content is not None:
        (tmp_path / "bad.csv").write_text(content)
    code, out, err = run(*(arg.format(dir=tmp_path) for arg in argv))
    assert (code, out) == (2, ""), err
    assert message in err


# ---------------------------------------------------------------- --export


async def test_the_stored_history_exports_as_the_runs_it_holds(engine: AsyncEngine) -> None:
    repository = Repository(engine)
    batches = [
        make_batch(STORE_T0 + i * EVERY, targets=("qwen3-8b",), errors={2: ErrorClass.SERVER_ERROR} if i == 1 else None)
        for i in range(3)
    ]
    for batch in batches:
        await repository.save_runs(batch)
    stream = io.StringIO()
    assert await export_samples(repository, stream) == 3 * 2 * 5  # runs x prompts x measured rounds
    runs = read(stream.getvalue())
    assert sorted(runs) == ["qwen3-8b/long/test-lab", "qwen3-8b/short/test-lab"]
    stored = sorted((run.series.prompt, run.ttft_p50_ms, run.ok, run.errors) for batch in batches for run, _ in batch)
    exported = sorted(
        (name.split("/")[1], point.ttft_ms, point.ok, point.errors) for name, points in runs.items() for point in points
    )
    # Typed as objects: mypy sees no overlap between pytest's Approx and a float, which it compares equal to.
    approximately: list[tuple[object, ...]] = [(p, pytest.approx(t), ok, e) for p, t, ok, e in exported]
    assert approximately == stored


def test_series_that_would_share_a_name_are_told_apart() -> None:
    old = SeriesKey("api", "vllm", "Qwen/Qwen3-8B", "short", "fra")
    new = SeriesKey("api", "vllm", "Qwen/Qwen3-14B", "short", "fra")
    other = SeriesKey("api", "vllm", "Qwen/Qwen3-8B", "long", "fra")
    assert series_names([old, new, other]) == {
        old: "api/short/fra[vllm:Qwen/Qwen3-8B]",
        new: "api/short/fra[vllm:Qwen/Qwen3-14B]",
        other: "api/long/fra",
    }


async def test_export_writes_the_configs_database_to_a_file(backend: Backend, tmp_path: Path) -> None:
    engine = backend.engine()
    try:
        await Repository(engine).save_runs(make_batch(STORE_T0, targets=("qwen3-8b",), prompts=("short",)))
    finally:
        await engine.dispose()
    config = tmp_path / "config.yaml"
    config.write_text(f"database:\n  url: '{backend.url}'\n")
    target = tmp_path / "history.csv"
    code, out, err = await asyncio.to_thread(run, "--export", str(target), "--config", str(config))
    assert (code, out) == (0, ""), err
    assert err == f"exported 5 samples to {target}\n"
    assert [len(points) for points in read(target.read_text()).values()] == [1]


async def test_export_from_a_database_without_the_schema_exits_3(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"database:\n  url: 'sqlite+aiosqlite:///{tmp_path / 'empty.db'}'\n")
    code, out, err = await asyncio.to_thread(run, "--export", "--config", str(config))
    assert (code, out) == (3, ""), err
    assert err.startswith("ttft-monitor replay --export: ")


async def test_export_from_a_database_that_refuses_the_connection_exits_3_naming_the_database(
    tmp_path: Path,
) -> None:
    # The refusal is an OSError too: it must not read as the output file failing (exit 2).
    config = tmp_path / "config.yaml"
    config.write_text(f"database:\n  url: 'postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/absent'\n")
    target = tmp_path / "history.csv"
    code, out, err = await asyncio.to_thread(run, "--export", str(target), "--config", str(config))
    assert (code, out) == (3, ""), err
    assert err.startswith("ttft-monitor replay --export: cannot connect to PostgreSQL at 127.0.0.1:"), err
    assert "cannot write" not in err


def test_export_to_a_file_that_cannot_be_created_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"database:\n  url: 'sqlite+aiosqlite:///{tmp_path / 'empty.db'}'\n")
    target = tmp_path / "missing" / "history.csv"
    code, out, err = run("--export", str(target), "--config", str(config))
    assert (code, out, err) == (2, "", f"ttft-monitor replay: cannot write {target}: No such file or directory\n")


def step_csv(path: Path, *, seed: int = 2, factor: float = 1.2) -> None:
    """Nine and a half days of runs (sigma 0.15, about what 5 probes of 0.3 give; a +-20% daily cycle),
    `factor` slower from day 8.25 on."""
    rng = random.Random(seed)
    rows = []
    for i in range(round(9.5 * 288)):
        level = 800 * (1 + 0.2 * math.sin(2 * math.pi * i / 288)) * (factor if i >= 8.25 * 288 else 1.0)
        rows.append(SampleRow(T0 + i * EVERY, "api/short/lab", level * math.exp(rng.gauss(0, 0.15))))
    with path.open("w", encoding="utf-8", newline="") as stream:
        write_samples_csv(rows, stream)


@pytest.mark.parametrize(
    ("detection", "tickets"),
    [
        ("{}", True),  # a +20% step: tickets
        ("{window_tickets: false}", True),  # the CUSUM alone catches it
        ("{cusum: {threshold: 1000}, window_tickets: false}", False),  # it never adds up to 1000
        ("{cusum: {enabled: false}}", True),  # without it the window rule tickets
    ],
)
def test_the_cusum_keys_of_the_config_reach_the_detector(tmp_path: Path, detection: str, tickets: bool) -> None:
    samples = tmp_path / "samples.csv"
    step_csv(samples)
    config = tmp_path / "config.yaml"
    config.write_text(
        "providers:\n  local: {base_url: 'http://127.0.0.1:8000/v1', api: openai-chat}\n"
        f"targets:\n  api: {{provider: local, model: m}}\ndetection: {detection}\n"
    )
    code, out, err = run("--samples", str(samples), "--config", str(config))
    assert code == 0, err
    incidents = [json.loads(line) for line in out.splitlines()]
    # A step that lasts becomes the level within a day: the ticket resolves, and may open again.
    assert bool(incidents) == tickets, incidents
    assert {(incident["kind"], incident["severity"]) for incident in incidents} <= {("regression", "ticket")}
    assert all(incident["opened_at"] > "2025-01-14T06:00:00Z" for incident in incidents)  # after the step


def test_the_configs_defaults_are_the_detectors() -> None:
    from monitor.detect.detector import Rules
    from monitor.detect.settings import Detection

    assert Rules.from_config(Detection()) == Rules()
    rules = Rules.from_config(Detection.model_validate({"cusum": {"threshold": 18, "clip": 2}, "window_tickets": True}))
    assert rules.cusum is not None
    assert (rules.cusum.threshold, rules.cusum.clip, rules.window_tickets) == (18, 2, True)
    assert Rules.from_config(Detection.model_validate({"cusum": {"enabled": False}})).cusum is None


def test_a_bad_cusum_key_exits_2_naming_it(tmp_path: Path) -> None:
    samples = tmp_path / "samples.csv"
    samples.write_text(outage_csv())
    config = tmp_path / "config.yaml"
    config.write_text(
        "providers:\n  local: {base_url: 'http://127.0.0.1:8000/v1', api: openai-chat}\n"
        "targets:\n  api: {provider: local, model: m}\ndetection: {cusum: {threshold: 0}}\n"
    )
    code, out, err = run("--samples", str(samples), "--config", str(config))
    assert (code, out) == (2, ""), err
    assert "detection.cusum.threshold" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- grouping


GROUPING_CONFIG = (
    "providers:\n"
    "  gateway-a: {base_url: 'http://127.0.0.1:8000/v1', api: openai-chat}\n"
    "  gateway-b: {base_url: 'http://127.0.0.1:8001/v1', api: openai-chat}\n"
    "targets:\n"
    "  a1: {provider: gateway-a, model: m1}\n"
    "  a2: {provider: gateway-a, model: m2}\n"
    "  b1: {provider: gateway-b, model: m3}\n"
    "detection: {min_history_runs: 6, trailing_runs: 12}\n"
)


def slow_csv(slowed: dict[str, int], runs: int = 60) -> str:
    """Three series, runs every 5 minutes a few seconds apart; `slowed[series]`: the run it turns 3x slower
    at, for 12 runs."""
    rng = random.Random(4)
    rows = []
    for i in range(runs):
        for offset, series in enumerate(("a1/short/lab", "a2/short/lab", "b1/short/lab")):
            start = slowed.get(series)
            factor = 3.0 if start is not None and start <= i < start + 12 else 1.0
            for probe in range(5):
                ttft = 200.0 * factor * math.exp(rng.gauss(0, 0.1))
                rows.append(SampleRow(at(5 * i) + timedelta(seconds=3 * offset + probe), series, ttft, None, f"r{i}"))
    stream = io.StringIO()
    write_samples_csv(rows, stream)
    return stream.getvalue()


def run_groups(tmp_path: Path, slowed: dict[str, int], *extra: str, more: str = "") -> tuple[list[dict], str]:
    samples, config = tmp_path / "samples.csv", tmp_path / "config.yaml"
    samples.write_text(slow_csv(slowed))
    config.write_text(GROUPING_CONFIG + more)
    code, out, err = run("--samples", str(samples), "--config", str(config), *extra)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()], err


def test_replay_groups_a_providers_series_that_slow_down_together(tmp_path: Path) -> None:
    # a1 confirms a run before a2 (it slowed earlier): the page waits for a2 and names both.
    groups, err = run_groups(tmp_path, {"a1/short/lab": 30, "a2/short/lab": 31}, "--groups")
    assert [(g["group"], g["members"]) for g in groups] == [("gateway-a#1", ["a1 / short @ lab", "a2 / short @ lab"])]
    assert [(n["state"], n["members"]) for n in groups[0]["notifications"]] == [("firing", 2), ("resolved", 2)]
    assert groups[0]["notifications"][0]["summary"].startswith("gateway-a: 2 targets, 2 series, median ")
    assert err.endswith("2 incidents, in 1 groups (2 notifications)\n")
    incidents, _ = run_groups(tmp_path, {"a1/short/lab": 30, "a2/short/lab": 31})
    assert [(i["series"], i["group"]) for i in incidents] == [
        ("a1/short/lab", "gateway-a#1"),
        ("a2/short/lab", "gateway-a#1"),
    ]


def test_replay_keeps_other_providers_and_later_outages_apart(tmp_path: Path) -> None:
    # b1 slows with a1 but is behind another provider; a2 slows an hour after a1 has recovered.
    groups, _ = run_groups(tmp_path, {"a1/short/lab": 20, "b1/short/lab": 20, "a2/short/lab": 44}, "--groups")
    assert sorted((g["group"], tuple(g["members"])) for g in groups) == [
        ("gateway-a#1", ("a1 / short @ lab",)),
        ("gateway-a#2", ("a2 / short @ lab",)),
        ("gateway-b#1", ("b1 / short @ lab",)),
    ]
    for group in groups:
        firing = [n for n in group["notifications"] if n["state"] == "firing"]
        assert len(firing) == 1 and firing[0]["members"] == 1


def test_replay_groups_by_location_when_the_config_says_so(tmp_path: Path) -> None:
    slowed = {"a1/short/lab": 20, "b1/short/lab": 20}
    groups, _ = run_groups(tmp_path, slowed, "--groups", more="alerts: {grouping: {by: location}}\n")
    assert [(g["group"], g["members"]) for g in groups] == [("lab#1", ["a1 / short @ lab", "b1 / short @ lab"])]
    assert groups[0]["notifications"][0]["summary"].startswith("from lab: 2 targets, 2 series")


def test_replay_groups_lists_the_slo_burn_pages_that_go_out_on_their_own(tmp_path: Path) -> None:
    """With an objective, a1's slow hour is also an SLO burn page; it is not grouped, so `--groups`
    lists it after the groups (every page the daemon would send) and the counts say so."""
    more = "  a1: {provider: gateway-a, model: m1, slo: {ttft_ms: 400}}\n"
    slowed = {"a1/short/lab": 30, "a2/short/lab": 31}
    samples, config = tmp_path / "samples.csv", tmp_path / "config.yaml"
    samples.write_text(slow_csv(slowed))
    config.write_text(GROUPING_CONFIG.replace("  a1: {provider: gateway-a, model: m1}\n", more))
    code, out, err = run("--samples", str(samples), "--config", str(config), "--groups")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("summary", line.get("kind"))[:10] for line in lines] == ["gateway-a:", "slo_burn"], lines
    assert lines[1]["series"] == "a1/*/lab" and lines[1]["group"] is None and lines[1]["severity"] == "page"
    assert err.endswith("3 incidents, in 1 groups (2 notifications), 1 notified on their own\n"), err
    # Without --groups every incident has the same fields, the burn one too.
    code, out, _err = run("--samples", str(samples), "--config", str(config))
    incidents = [json.loads(line) for line in out.splitlines()]
    assert len(incidents) == 3 and all("group" in item for item in incidents), incidents
