"""Run summaries and the spool's JSON form: pure functions, tables of cases."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.probe.result import ErrorClass, Sample
from monitor.probe.settings import MAX_TIMEOUT_S
from monitor.store import records
from monitor.store.models import SAMPLES
from monitor.store.records import (
    MAX_STORED_MS,
    SERVER_TEXT_LIMITS,
    STORED_DURATIONS,
    RunRecord,
    SeriesKey,
    floor_hour,
    hourly_stats,
    iter_runs_from_samples,
    new_run_id,
    run_from_dict,
    run_to_dict,
    runs_from_samples,
    sample_from_dict,
    sample_to_dict,
    storable_duration,
    storable_sample,
    storable_text,
)
from monitor.store.types import Microseconds
from tests.support.store_fixtures import PROVIDERS, T0, make_samples


def sample(round_: int, *, ttft: float | None = 100.0, warmup: bool = False, **kwargs: object) -> Sample:
    values: dict[str, object] = {
        "target": "qwen3-8b",
        "model": "m",
        "api": "openai-chat",
        "prompt": "short",
        "round": round_,
        "warmup": warmup,
        "intended_at": T0,
        "sent_at": T0 + timedelta(seconds=round_),
        "ttft_ms": ttft,
        "total_ms": 500.0,
    }
    values.update(kwargs)
    return Sample(**values)  # type: ignore[arg-type]


def summarize(samples: list[Sample]) -> RunRecord:
    [(run, _)] = runs_from_samples(samples, job="j", location="here", provider_of={"qwen3-8b": "vllm"})
    return run


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param(
            [sample(1, ttft=999.0, warmup=True), sample(2, ttft=100.0), sample(3, ttft=300.0), sample(4, ttft=200.0)],
            {
                "rounds": 3,
                "warmup": 1,
                "ok": 3,
                "errors": 0,
                "ttft_p50_ms": 200.0,
                "ttft_min_ms": 100.0,
                "ttft_max_ms": 300.0,
                "error": None,
            },
            id="the warm-up is counted but never summarised",
        ),
        pytest.param(
            [
                sample(1, ttft=100.0),
                sample(2, ttft=None, error=ErrorClass.TIMEOUT_FIRST_TOKEN),
                sample(3, ttft=None, error=ErrorClass.TIMEOUT_FIRST_TOKEN),
                sample(4, ttft=None, error=ErrorClass.CONNECT),
            ],
            {"rounds": 4, "ok": 1, "errors": 3, "ttft_p50_ms": 100.0, "error": ErrorClass.TIMEOUT_FIRST_TOKEN},
            id="the most frequent error class is the run's",
        ),
        pytest.param(
            [sample(1, ttft=None, error=ErrorClass.AUTH), sample(2, ttft=None, error=ErrorClass.AUTH)],
            {"ok": 0, "errors": 2, "ttft_p50_ms": None, "ttft_min_ms": None, "decode_tps_p50": None},
            id="a run that failed entirely has no latency",
        ),
        pytest.param(
            [
                sample(1, prompt_tokens=900, warmup=True),
                sample(2, prompt_tokens=510),
                sample(3, prompt_tokens=None, ttft=None, error=ErrorClass.SERVER_ERROR),
                sample(4, prompt_tokens=514),
            ],
            {"prompt_tokens_p50": 512.0},
            id="prompt tokens come from measured samples that reported them",
        ),
        pytest.param(
            [
                sample(1, ttft=100.0, decode_tps=50.0, ttfa_ms=150.0),
                sample(2, ttft=120.0, decode_tps=70.0, ttfa_ms=190.0),
            ],
            {"ttft_p50_ms": 110.0, "decode_tps_p50": 60.0, "ttfa_p50_ms": 170.0},
            id="medians interpolate between the two middle values",
        ),
        pytest.param(
            [
                sample(1, ttft=100.0),
                sample(2, ttft=900.0, disturbed=True, self_delay_ms=800.0),
                sample(3, ttft=None, error=ErrorClass.TIMEOUT_FIRST_TOKEN, disturbed=True, self_delay_ms=40.0),
                sample(4, ttft=120.0),
            ],
            {"rounds": 4, "ok": 2, "errors": 0, "ttft_p50_ms": 110.0, "ttft_max_ms": 120.0, "error": None},
            id="disturbed samples are counted in rounds only, never summarised",
        ),
        pytest.param(
            [sample(1, ttft=900.0, disturbed=True), sample(2, ttft=None, error=ErrorClass.CONNECT, disturbed=True)],
            {"rounds": 2, "ok": 0, "errors": 0, "ttft_p50_ms": None, "error": None},
            id="a run disturbed throughout says nothing about the server",
        ),
    ],
)
def test_it_summarises_a_run(samples: list[Sample], expected: dict[str, object]) -> None:
    run = summarize(samples)
    assert {key: getattr(run, key) for key in expected} == expected


def test_it_times_a_run_from_its_first_send_to_its_last_byte() -> None:
    run = summarize(
        [
            sample(1, total_ms=500.0),
            sample(2, total_ms=2500.0),
            sample(3, sent_at=None, ttft=None, error=ErrorClass.DNS),
        ]
    )
    assert run.intended_at == T0
    assert run.started_at == T0 + timedelta(seconds=1)
    assert run.finished_at == T0 + timedelta(seconds=2, milliseconds=2500)


def test_it_groups_samples_per_series_in_first_seen_order() -> None:
    samples = [s for t in PROVIDERS for p in ("short", "long") for s in make_samples(t, p)]
    samples.reverse()
    runs = runs_from_samples(samples, job="every-5m", location="fra", provider_of=PROVIDERS)
    assert [(run.series.target, run.series.prompt) for run, _ in runs] == [
        ("gpt-4o-mini", "long"),
        ("gpt-4o-mini", "short"),
        ("qwen3-8b", "long"),
        ("qwen3-8b", "short"),
    ]
    for run, members in runs:
        assert run.series == SeriesKey(
            target=members[0].target,
            provider=PROVIDERS[members[0].target],
            model=members[0].model,
            prompt=members[0].prompt,
            location="fra",
        )
        assert [s.round for s in members] == [1, 2, 3, 4, 5, 6]
        assert run.job == "every-5m"
    assert len({run.run_id for run, _ in runs}) == 4


def test_run_ids_are_time_ordered_uuids() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_run_id() for _ in range(1000)]
    after = time.time_ns() // 1_000_000
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    assert len(set(ids)) == 1000
    assert all(before <= i.int >> 80 <= after for i in ids)  # 48-bit Unix milliseconds first
    assert [i.int >> 80 for i in ids] == sorted(i.int >> 80 for i in ids)


def test_it_uses_the_run_id_factory() -> None:
    ids = iter([uuid.UUID(int=1), uuid.UUID(int=2)])
    samples = make_samples("qwen3-8b", "a") + make_samples("qwen3-8b", "b")
    runs = runs_from_samples(samples, job="j", location="l", provider_of=PROVIDERS, run_id_factory=lambda: next(ids))
    assert [run.run_id for run, _ in runs] == [uuid.UUID(int=1), uuid.UUID(int=2)]


def test_runs_are_made_storable_one_run_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller on the probes' loop lets it through between runs (pipeline._runs_in_steps): the first run of a
    job of many series must not make every sample of the job storable first."""
    made_storable: list[Sample] = []
    original = records.storable_sample

    def counted(sample: Sample) -> Sample:
        made_storable.append(sample)
        return original(sample)

    monkeypatch.setattr(records, "storable_sample", counted)
    samples = [s for i in range(40) for s in make_samples("qwen3-8b", f"p{i}", rounds=2, warmup=0)]
    runs = iter_runs_from_samples(samples, job="j", location="l", provider_of=PROVIDERS)
    run, members = next(runs)
    assert len(made_storable) == 2 and run.series.prompt == "p0" and len(members) == 2
    assert len(list(runs)) == 39 and len(made_storable) == 80


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_id": "not-a-uuid"}, "sample_id 'not-a-uuid' of target 'qwen3-8b' is not a UUID"),
        ({"target": "unknown"}, "no provider known for target 'unknown'"),
    ],
)
def test_it_refuses_what_it_cannot_store(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runs_from_samples([sample(1, **change)], job="j", location="l", provider_of={"qwen3-8b": "vllm"})


def test_hourly_statistics_skip_failures_for_latency_but_count_them() -> None:
    stats = hourly_stats(
        T0, [(100.0, None, 50.0), (300.0, None, 70.0), (None, "timeout_total", None), (200.0, None, None)]
    )
    assert (stats.samples, stats.errors) == (4, 1)
    assert (stats.ttft_p50_ms, stats.ttft_min_ms, stats.ttft_max_ms) == (200.0, 100.0, 300.0)
    assert stats.ttft_p90_ms == pytest.approx(280.0)
    assert stats.decode_tps_p50 == 60.0


@pytest.mark.parametrize(
    ("moment", "hour"),
    [
        (datetime(2026, 3, 2, 9, 59, 59, 999999, tzinfo=UTC), datetime(2026, 3, 2, 9, tzinfo=UTC)),
        # India is UTC+05:30: a local whole hour is not a UTC one.
        (datetime.fromisoformat("2026-03-02T15:00:00+05:30"), datetime(2026, 3, 2, 9, tzinfo=UTC)),
    ],
)
def test_hours_are_utc_hours(moment: datetime, hour: datetime) -> None:
    assert floor_hour(moment) == hour


# ---------------------------------------------------------------- the spool's JSON form

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe_ms = st.none() | st.floats(min_value=0, max_value=1e7, allow_nan=False)
aware = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
samples = st.builds(
    Sample,
    target=st.text(min_size=1, max_size=20),
    model=st.text(max_size=40),
    api=st.sampled_from(["openai-chat", "openai-completions", "anthropic-messages"]),
    prompt=st.text(min_size=1, max_size=20),
    round=st.integers(1, 1000),
    sample_id=st.uuids().map(str),
    warmup=st.booleans(),
    intended_at=st.none() | aware,
    sent_at=st.none() | aware,
    ttft_ms=maybe_ms,
    decode_tps=st.none() | finite,
    prompt_tokens=st.none() | st.integers(0, 2**31 - 1),
    connection_reused=st.none() | st.booleans(),
    served_model=st.none() | st.text(max_size=40),
    error=st.none() | st.sampled_from(list(ErrorClass)),
    error_message=st.none() | st.text(max_size=200),
)


@given(samples)
def test_a_sample_survives_the_spool_format_exactly(original: Sample) -> None:
    restored = sample_from_dict(json.loads(json.dumps(sample_to_dict(original))))
    assert restored == original


def test_the_spool_format_leaves_out_the_process_local_clock() -> None:
    original = make_samples()[0]
    original.sent_mono_ns = 123
    assert "sent_mono_ns" not in sample_to_dict(original)
    assert sample_from_dict(sample_to_dict(original)).sent_mono_ns is None


def test_a_run_survives_the_spool_format_exactly() -> None:
    samples = make_samples(errors={3: ErrorClass.RATE_LIMITED})
    [(run, _)] = runs_from_samples(samples, job="j", location="l", provider_of=PROVIDERS)
    assert run_from_dict(json.loads(json.dumps(run_to_dict(run)))) == run


@pytest.mark.parametrize(
    ("value", "limit", "expected"),
    [
        ("plain", None, "plain"),
        ("a\x00b", None, "a\ufffdb"),
        ("\x00\x00", None, "\ufffd\ufffd"),
        ("lone \ud800 high, lone \udfff low", None, "lone \ufffd high, lone \ufffd low"),
        ("😀 and 中文 are fine", None, "😀 and 中文 are fine"),
        ("x" * 10, 10, "x" * 10),
        ("x" * 11, 10, "x" * 9 + "\u2026"),
        ("\x00" * 20, 5, "\ufffd" * 4 + "\u2026"),
    ],
)
def test_text_is_made_storable(value: str, limit: int | None, expected: str) -> None:
    stored = storable_text(value, limit)
    assert stored == expected
    stored.encode("utf-8")  # what both drivers and the spool's JSON need


def test_only_the_sample_fields_that_need_it_change_and_clean_samples_stay_the_same_object() -> None:
    clean = storable_sample(make_samples(rounds=1, warmup=0)[0])
    assert storable_sample(clean) is clean
    dirty = dataclasses.replace(clean, served_model="a\x00b", error_message="e" * 5000, request_id="r\ud800")
    stored = storable_sample(dirty)
    assert (stored.served_model, stored.request_id) == ("a\ufffdb", "r\ufffd")
    assert len(stored.error_message or "") == SERVER_TEXT_LIMITS["error_message"]
    assert dataclasses.replace(stored, served_model=None, request_id=None, error_message=None) == dataclasses.replace(
        dirty, served_model=None, request_id=None, error_message=None
    )


def test_runs_from_samples_stores_what_a_server_sent_in_a_form_the_spool_and_databases_hold() -> None:
    samples = [dataclasses.replace(s, served_model="m\x00") for s in make_samples(rounds=2, warmup=0)]
    [(run, members)] = runs_from_samples(samples, job="j", location="lab", provider_of=PROVIDERS)
    assert {s.served_model for s in members} == {"m\ufffd"}
    assert run.series.target == "qwen3-8b"


def test_names_from_the_config_are_made_storable_once_per_run_and_in_every_sample() -> None:
    samples = [dataclasses.replace(s, model="Qwen\x00", prompt="p\ud800") for s in make_samples(rounds=2, warmup=0)]
    [(run, members)] = runs_from_samples(samples, job="j\x00", location="lab\x00", provider_of=PROVIDERS)
    assert (run.series.model, run.series.prompt, run.series.location, run.job) == (
        "Qwen\ufffd",
        "p\ufffd",
        "lab\ufffd",
        "j\ufffd",
    )
    assert {(s.model, s.prompt) for s in members} == {("Qwen\ufffd", "p\ufffd")}
    json.dumps(run_to_dict(run), ensure_ascii=False).encode()  # the spool can write it


def test_every_sample_field_has_a_column_and_every_samples_column_a_field():
    from dataclasses import fields

    from monitor.store.models import SAMPLES
    from monitor.store.records import SAMPLE_COLUMN_FIELDS, SAMPLE_FIELDS_STORED_APART, UNSTORED_SAMPLE_FIELDS

    sample_fields = {f.name for f in fields(Sample)}
    accounted = set(SAMPLE_COLUMN_FIELDS.values()) | SAMPLE_FIELDS_STORED_APART | UNSTORED_SAMPLE_FIELDS
    assert sample_fields - accounted == set(), "Sample fields with no column: map them in SAMPLE_COLUMN_FIELDS"
    assert accounted - sample_fields == set(), "mapped names that are not Sample fields"
    columns = {column.key for column in SAMPLES.c}  # the durations' keys: `ttft_ms` for the column `ttft_us`
    assert columns == {*SAMPLE_COLUMN_FIELDS, "run_id", "error"}


def test_durations_are_stored_to_the_microsecond_and_nothing_else_moves() -> None:
    probed = dataclasses.replace(
        make_samples(rounds=1, warmup=0)[0], ttft_ms=123.4567891, total_ms=0.0004999, self_delay_ms=2.0005001
    )
    stored = storable_sample(probed)
    assert (stored.ttft_ms, stored.total_ms, stored.self_delay_ms) == (123.457, 0.0, 2.001)
    for name in STORED_DURATIONS:
        value = getattr(stored, name)
        assert value is None or round(value * 1000) / 1000 == value, name
        original = getattr(probed, name)
        assert value is None if original is None else abs(value - original) <= 0.0005 + 1e-12, name
    no_durations: dict[str, Any] = dict.fromkeys(STORED_DURATIONS)
    assert dataclasses.replace(stored, **no_durations) == dataclasses.replace(probed, **no_durations)
    assert storable_sample(stored) is stored


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (MAX_STORED_MS, MAX_STORED_MS),
        (MAX_STORED_MS + 0.001, MAX_STORED_MS),  # a monitor stopped mid-request for over 35 minutes
        (1e300, MAX_STORED_MS),
        (float("inf"), MAX_STORED_MS),
        (-float("inf"), -MAX_STORED_MS),
        (float("nan"), None),
        (-0.0004, -0.0),
        (None, None),
    ],
)
def test_a_duration_beyond_what_the_database_holds_is_kept_at_its_bound(
    value: float | None, expected: float | None
) -> None:
    assert storable_duration(value) == expected


def test_every_stored_duration_is_a_microseconds_column_and_every_timeout_fits_in_it() -> None:
    micros = {column.key for column in SAMPLES.c if isinstance(column.type, Microseconds)}
    assert micros == set(STORED_DURATIONS)
    assert all(SAMPLES.c[name].name == name.removesuffix("_ms") + "_us" for name in STORED_DURATIONS)
    assert MAX_TIMEOUT_S * 1000 < MAX_STORED_MS
