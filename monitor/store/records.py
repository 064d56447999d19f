"""What gets stored, as plain values: series keys, run summaries, hourly statistics. Pure code.

`runs_from_samples` turns one probe run's samples into per-series runs with their summary, with
every text field in a form both databases and the spool can hold (`storable_sample`); the
`*_to_dict` / `*_from_dict` pairs are the spool's JSON form (lossless, including floats).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from monitor.probe.result import ErrorClass, Sample, TimingPath
from monitor.quantile import quantile
from monitor.servertext import MESSAGE_CAP, TRUNCATED_MARK

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Record = TypeVar("Record", bound=DataclassInstance)

ADHOC_JOB = "adhoc"  # the job name of `probe --store` runs, which have no scheduled tick
# Not stored: process-local monotonic clock values, meaningless after the process ends, and the
# per-chunk gaps (for OpenTelemetry export; their p50/p95/max are stored).
UNSTORED_SAMPLE_FIELDS = frozenset(
    {
        "sent_mono_ns",
        "departure_stamped",
        "first_token_stamp_exact",
        "first_token_read_mono_ns",
        "first_token_unread_since_ns",
        "chunk_gaps_ms",
    }
)
# The samples table's value columns and the Sample field each is read from, spelled out so that renaming
# a Sample field cannot change the schema without a migration (tests/unit/test_store_records.py checks that
# every field and every column is accounted for).
SAMPLE_COLUMN_FIELDS: dict[str, str] = {
    "round": "round",
    "warmup": "warmup",
    "intended_at": "intended_at",
    "sent_at": "sent_at",
    "dns_ms": "dns_ms",
    "connect_ms": "connect_ms",
    "tls_ms": "tls_ms",
    "connection_reused": "connection_reused",
    "setup_ms": "setup_ms",
    "ttfb_ms": "ttfb_ms",
    "first_event_ms": "first_event_ms",
    "ttft_ms": "ttft_ms",
    "ttfa_ms": "ttfa_ms",
    "first_tool_call_ms": "first_tool_call_ms",
    "total_ms": "total_ms",
    "gap_p50_ms": "gap_p50_ms",
    "gap_p95_ms": "gap_p95_ms",
    "gap_max_ms": "gap_max_ms",
    "decode_tps": "decode_tps",
    "token_events": "token_events",
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
    "cached_tokens": "cached_tokens",
    "reasoning_tokens": "reasoning_tokens",
    "reasoning_tokens_estimated": "reasoning_tokens_estimated",
    "prompt_tokens_target": "prompt_tokens_target",
    "prompt_chars": "prompt_chars",
    "served_model": "served_model",
    "fingerprint": "fingerprint",
    "request_id": "request_id",
    "http_status": "http_status",
    "server_processing_ms": "server_processing_ms",
    "ratelimit_remaining_requests": "ratelimit_remaining_requests",
    "ratelimit_remaining_tokens": "ratelimit_remaining_tokens",
    "retry_after": "retry_after",
    "server_timing": "server_timing",
    "error_message": "error_message",
    "timing_path": "timing_path",
    "self_delay_ms": "self_delay_ms",
    "disturbed": "disturbed",
    "via_proxy": "via_proxy",
    "connection_retried": "connection_retried",
}
# The largest duration an int4 column of microseconds holds: 35 min 47 s, beyond every probe timeout
# (`timeout_s` allows at most 2,000 s). A longer one can only be a monitor stopped mid-request (a
# suspended VM): stored as this, and its sample is `disturbed` by the same stop.
MAX_MICROSECONDS = 2**31 - 1
MAX_STORED_MS = MAX_MICROSECONDS / 1000


# The durations stored as whole microseconds (types.Microseconds, migration 0020); the server's own
# `server_processing_ms` is a header's text, stored as it came.
STORED_DURATIONS = (
    "dns_ms",
    "connect_ms",
    "tls_ms",
    "setup_ms",
    "ttfb_ms",
    "first_event_ms",
    "ttft_ms",
    "ttfa_ms",
    "first_tool_call_ms",
    "total_ms",
    "gap_p50_ms",
    "gap_p95_ms",
    "gap_max_ms",
    "self_delay_ms",
)
_durations_of = attrgetter(*STORED_DURATIONS)
# Sample fields stored elsewhere: once per run or series (target, model, api, prompt), not at all
# (sample_id, since migration 0020: a sample read back is named by its run and round, `sample_id_of`)
# or converted (error, an ErrorClass stored by value).
SAMPLE_FIELDS_STORED_APART = frozenset({"target", "model", "api", "prompt", "sample_id", "error"})
# What a text column cannot hold: NUL (PostgreSQL refuses it in text) and lone surrogates (not UTF-8,
# so neither database driver nor the spool's JSON can encode them). Each becomes U+FFFD.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_REPLACEMENT = "\ufffd"
# Caps, in characters, on text a server chooses; longer values are cut and end with TRUNCATED_MARK.
SERVER_TEXT_LIMITS = {"served_model": 256, "fingerprint": 256, "request_id": 256, "error_message": MESSAGE_CAP}
_SERVED_MODEL_LIMIT, _FINGERPRINT_LIMIT, _REQUEST_ID_LIMIT, _ERROR_MESSAGE_LIMIT = (
    SERVER_TEXT_LIMITS["served_model"],
    SERVER_TEXT_LIMITS["fingerprint"],
    SERVER_TEXT_LIMITS["request_id"],
    SERVER_TEXT_LIMITS["error_message"],
)


@dataclass(frozen=True, slots=True)
class BudgetHoldRecord:
    """A stored budget hold (table budget_holds): `action` (reduce, pause) on `job` until `until`."""

    job: str
    action: str
    budget: str
    per: str
    since: datetime
    until: datetime


@dataclass(frozen=True, slots=True, order=True)
class SeriesKey:
    """One history: a model on a provider, with one prompt profile, measured from one location."""

    target: str
    provider: str
    model: str
    prompt: str
    location: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of one series. Counts and statistics cover measured samples; warm-ups are only counted.

    Disturbed samples (the monitor itself was late around their stamps, `Sample.disturbed`) are no
    evidence about the server: they count in `rounds` only, so `rounds - ok - errors` of them were
    disturbed, and a run whose measured samples all were has no TTFT and `ok == errors == 0`.

    `ttft_*` and `ttfa_p50_ms`, `decode_tps_p50` come from successful undisturbed measured samples;
    `prompt_tokens_p50` from measured samples whose server reported a count; `error` is the most
    frequent error class among measured samples (None when all succeeded).
    """

    run_id: uuid.UUID
    job: str
    series: SeriesKey
    api: str
    intended_at: datetime
    started_at: datetime
    finished_at: datetime
    rounds: int
    warmup: int
    ok: int
    errors: int
    ttft_p50_ms: float | None
    ttft_min_ms: float | None
    ttft_max_ms: float | None
    ttfa_p50_ms: float | None
    decode_tps_p50: float | None
    prompt_tokens_p50: float | None
    error: ErrorClass | None
    # What the server's own metrics said over the run (monitor.probe.server_metrics.ServerMetrics);
    # None: its provider names no `server_metrics_url`, or the endpoint did not answer in time.
    server_waiting: float | None = None
    server_running: float | None = None
    server_kv_cache_usage: float | None = None
    server_prefix_hit_rate: float | None = None
    server_ttft_ms: float | None = None
    server_queue_ms: float | None = None
    server_prefill_ms: float | None = None
    # The hash of the target's canary answer after the run (monitor/probe/canary.py); None: no canary.
    canary: str | None = None
    # What its self-hosted server says it runs: version, weights, cache configuration (providers with
    # `server_metrics_url`; monitor/probe/server_metrics.py `server_build`). None: not known.
    server_build: str | None = None


SERVER_RUN_FIELDS = (
    "server_waiting", "server_running", "server_kv_cache_usage", "server_prefix_hit_rate",
    "server_ttft_ms", "server_queue_ms", "server_prefill_ms",
)  # fmt: skip
# Run fields that say which model answered, stored as they are.
IDENTITY_RUN_FIELDS = ("canary", "server_build")


# Runs with their samples: what is written, spooled and replayed together.
Batch = Sequence[tuple[RunRecord, Sequence[Sample]]]


class StorableBatch(list[tuple[RunRecord, Sequence[Sample]]]):
    """A batch whose runs `iter_runs_from_samples` made and nothing changed since: every run and sample
    already as `storable_batch` would leave it, so a save does not check them again (6.4-7.1 ms of the
    probes' loop in one step for a job of 500 series). Who changes a run or sample in it must not keep
    the mark."""


@dataclass(frozen=True, slots=True)
class HourlyStats:
    """Measured samples of one series in one UTC hour (by their run's start).

    TTFT quantiles are of the successful samples; the phases' and token counts' medians of every
    measured sample that has the value (as the series view's buckets of raw samples); the server's
    numbers are medians of the hour's runs (one value per run, `RunRecord.server_*`)."""

    hour: datetime
    samples: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    ttft_min_ms: float | None
    ttft_max_ms: float | None
    decode_tps_p50: float | None
    ttft_p10_ms: float | None = None
    dns_ms_p50: float | None = None
    connect_ms_p50: float | None = None
    tls_ms_p50: float | None = None
    ttfb_ms_p50: float | None = None
    first_event_ms_p50: float | None = None
    ttfa_ms_p50: float | None = None
    prompt_tokens_p50: float | None = None
    cached_tokens_p50: float | None = None
    server_waiting_p50: float | None = None
    server_running_p50: float | None = None
    server_kv_cache_usage_p50: float | None = None
    server_prefix_hit_rate_p50: float | None = None
    server_ttft_ms_p50: float | None = None
    server_queue_ms_p50: float | None = None
    server_prefill_ms_p50: float | None = None


# The sample columns whose hourly median a rollup keeps (the series view's phases and token counts),
# and the run columns (the server's own numbers); each rollup column is the name plus "_p50".
ROLLUP_SAMPLE_MEDIANS = (
    "dns_ms", "connect_ms", "tls_ms", "ttfb_ms", "first_event_ms", "ttfa_ms", "prompt_tokens", "cached_tokens",
)  # fmt: skip
ROLLUP_RUN_MEDIANS = SERVER_RUN_FIELDS


def storable_text(value: str, limit: int | None = None) -> str:
    """`value` as any text column of either database can hold it: NUL and lone surrogates replaced,
    at most `limit` characters."""
    # The common case first: ASCII without NUL (two C-speed scans) needs no regular expression.
    if ("\x00" in value or not value.isascii()) and _UNSTORABLE.search(value) is not None:
        value = _UNSTORABLE.sub(UNSTORABLE_REPLACEMENT, value)
    if limit is not None and len(value) > limit:
        value = value[: limit - len(TRUNCATED_MARK)] + TRUNCATED_MARK
    return value


def _storable_as_is(value: str | None, limit: int) -> bool:
    return value is None or (value.isascii() and "\x00" not in value and len(value) <= limit)


def sample_id_of(run_id: uuid.UUID, round_: int) -> uuid.UUID:
    """The id a sample read back from the database goes by: derived from its run and round, which are
    what keeps it (the probe's own random id is not stored since migration 0020), so the same every read."""
    return uuid.uuid5(run_id, str(round_))


def storable_sample(sample: Sample) -> Sample:
    """`sample` as the databases hold it: its durations to the microsecond (`storable_duration`) and the
    text a server chose storable (see `storable_text`); the same object when it already is.

    Durations are kept as whole microseconds (types.Microseconds); rounded here, where samples become
    runs, the probe's run summary, the spool, detection and a later read of the database see the same
    values. Servers choose `served_model`, `fingerprint`, `request_id` and `error_message` (a 500 body, an
    error event): one NUL byte in them must not make the database refuse the run and every other sample
    with it. (Target, model, API and prompt come from the config and are checked once per run.)
    """
    changes: dict[str, Any] = {}
    durations = _durations_of(sample)
    # This runs for every sample stored: the common case costs a check each (to_microseconds, inlined).
    for value in durations:
        if value is not None and not (-MAX_STORED_MS <= value <= MAX_STORED_MS and round(value * 1000) / 1000 == value):
            changes = dict(zip(STORED_DURATIONS, map(storable_duration, durations), strict=True))
            break
    if not (
        _storable_as_is(sample.served_model, _SERVED_MODEL_LIMIT)
        and _storable_as_is(sample.fingerprint, _FINGERPRINT_LIMIT)
        and _storable_as_is(sample.request_id, _REQUEST_ID_LIMIT)
        and _storable_as_is(sample.error_message, _ERROR_MESSAGE_LIMIT)
    ):
        for name, limit in SERVER_TEXT_LIMITS.items():
            value = getattr(sample, name)
            if value is not None and (text := storable_text(value, limit)) != value:
                changes[name] = text
    return dataclasses.replace(sample, **changes) if changes else sample


def storable_duration(value: float | None) -> float | None:
    """Milliseconds to the microsecond, within what the database's int4 of microseconds holds."""
    if value is None:
        return None
    if not -MAX_STORED_MS <= value <= MAX_STORED_MS:
        # Beyond every timeout: a monitor stopped mid-request (the sample is disturbed by that stop), or
        # not a number. Kept at the bound rather than refused with its whole batch.
        return MAX_STORED_MS if value > 0 else -MAX_STORED_MS if value < 0 else None
    # As the column type converts it (types.Microseconds), so storing changes nothing more.
    return to_microseconds(value) / 1000


def to_microseconds(ms: float) -> int:
    """A duration in ms as the database holds it: whole microseconds (types.Microseconds, the PostgreSQL COPY)."""
    return round(ms * 1000)


def _clean(value: str) -> bool:
    return value.isascii() and "\x00" not in value


def storable_series(series: SeriesKey) -> SeriesKey:
    values = (series.target, series.provider, series.model, series.prompt, series.location)
    if all(map(_clean, values)):
        return series
    return SeriesKey(*map(storable_text, values))


def storable_run(run: RunRecord) -> RunRecord:
    """`run` with its series, job and API storable; the same object when they already are."""
    series = storable_series(run.series)
    if series is run.series and _clean(run.job) and _clean(run.api):
        return run
    return dataclasses.replace(run, series=series, job=storable_text(run.job), api=storable_text(run.api))


def storable_batch(
    batch: Iterable[tuple[RunRecord, Sequence[Sample]]],
) -> list[tuple[RunRecord, list[Sample]]]:
    """Every run and sample of `batch` as the databases and the spool can hold them."""
    return [(storable_run(run), [storable_sample(s) for s in samples]) for run, samples in batch]


def new_run_id() -> uuid.UUID:
    """A time-ordered UUID (version 7, RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

    Ids that grow with time land at the right edge of the primary-key and foreign-key indexes, so
    inserts touch a few hot pages instead of random ones all over ever-growing indexes.
    """
    millis = time.time_ns() // 1_000_000
    random_bits = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 for rand_a, 62 for rand_b
    value = (millis & (2**48 - 1)) << 80
    value |= 0x7 << 76
    value |= (random_bits >> 68) << 64
    value |= 0b10 << 62
    value |= random_bits & (2**62 - 1)
    return uuid.UUID(int=value)


def floor_hour(moment: datetime) -> datetime:
    """The start of `moment`'s UTC hour."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _values(samples: Iterable[Sample], name: str) -> list[float]:
    return [float(v) for v in (getattr(s, name) for s in samples) if v is not None]


def summarize_run(
    samples: Sequence[Sample],
    *,
    run_id: uuid.UUID,
    job: str,
    series: SeriesKey,
    now: datetime | None = None,
) -> RunRecord:
    """The summary of one series' samples from one run."""
    if not samples:
        raise ValueError("a run needs at least one sample")
    measured = [s for s in samples if not s.warmup]
    evidence = [s for s in measured if not s.disturbed]
    ok = [s for s in evidence if s.ok]
    ttfts = _values(ok, "ttft_ms")
    sent = [s.sent_at for s in samples if s.sent_at is not None]
    intended = [s.intended_at for s in samples if s.intended_at is not None]
    fallback = now or datetime.now(UTC)
    started = min(sent) if sent else (min(intended) if intended else fallback)
    ends = [
        s.sent_at + timedelta(milliseconds=s.total_ms or s.ttfb_ms or 0.0) for s in samples if s.sent_at is not None
    ]
    errors = Counter(s.error for s in evidence if s.error is not None)
    return RunRecord(
        run_id=run_id,
        job=job,
        series=series,
        api=samples[0].api,
        intended_at=min(intended) if intended else started,
        started_at=started,
        finished_at=max(ends) if ends else started,
        rounds=len(measured),
        warmup=len(samples) - len(measured),
        ok=len(ok),
        errors=len(evidence) - len(ok),
        ttft_p50_ms=quantile(ttfts, 0.5),
        ttft_min_ms=min(ttfts) if ttfts else None,
        ttft_max_ms=max(ttfts) if ttfts else None,
        ttfa_p50_ms=quantile(_values(ok, "ttfa_ms"), 0.5),
        decode_tps_p50=quantile(_values(ok, "decode_tps"), 0.5),
        prompt_tokens_p50=quantile(_values(measured, "prompt_tokens"), 0.5),
        error=errors.most_common(1)[0][0] if errors else None,
    )


def runs_from_samples(
    samples: Iterable[Sample],
    *,
    job: str,
    location: str,
    provider_of: Mapping[str, str],
    run_id_factory: Callable[[], uuid.UUID] = new_run_id,
    now: datetime | None = None,
) -> list[tuple[RunRecord, list[Sample]]]:
    """Group one probe run's samples per series (target x prompt), in first-seen order, and summarise.

    `provider_of` maps target names to provider names. Every sample id must be a UUID (the OpenTelemetry
    export keys a sample's spans by it). Durations and text is made storable here (`storable_sample`), so
    the database, the spool and detection all see the same values.
    """
    return list(
        iter_runs_from_samples(
            samples, job=job, location=location, provider_of=provider_of, run_id_factory=run_id_factory, now=now
        )
    )


def iter_runs_from_samples(
    samples: Iterable[Sample],
    *,
    job: str,
    location: str,
    provider_of: Mapping[str, str],
    run_id_factory: Callable[[], uuid.UUID] = new_run_id,
    now: datetime | None = None,
) -> Iterator[tuple[RunRecord, list[Sample]]]:
    """`runs_from_samples` one run at a time (the samples grouped at the first step), so that a caller on
    the probes' loop can let it through between runs."""
    # Grouped first, made storable a run at a time: for a job of 500 series, every sample at the first step
    # held the probes' loop for 5 ms (`storable_sample` leaves the series' names as they are).
    groups: dict[tuple[str, str, str, str], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.target, sample.prompt, sample.model, sample.api), []).append(sample)
    for (target, prompt, model, api), raw in groups.items():
        members = list(map(storable_sample, raw))
        for sample in members:
            try:
                uuid.UUID(sample.sample_id)
            except (ValueError, TypeError, AttributeError):
                raise ValueError(f"sample_id {sample.sample_id!r} of target '{sample.target}' is not a UUID") from None
        if target not in provider_of:
            raise ValueError(f"no provider known for target '{target}'; include it in provider_of")
        series = storable_series(
            SeriesKey(target=target, provider=provider_of[target], model=model, prompt=prompt, location=location)
        )
        names: dict[str, Any] = {
            "target": series.target,
            "prompt": series.prompt,
            "model": series.model,
            "api": storable_text(api),
        }
        if names != {"target": target, "prompt": prompt, "model": model, "api": api}:
            members = [dataclasses.replace(s, **names) for s in members]
        ordered = sorted(members, key=lambda s: (s.round, not s.warmup))
        run = summarize_run(ordered, run_id=run_id_factory(), job=storable_text(job), series=series, now=now)
        yield run, ordered


def hourly_stats(
    hour: datetime,
    rows: Iterable[Sequence[Any]],
    runs: Iterable[Sequence[float | None]] = (),
) -> HourlyStats:
    """Statistics of one hour. `rows`: per measured sample (ttft_ms, error, decode_tps, then the
    `ROLLUP_SAMPLE_MEDIANS` columns in order); `runs`: per run of the hour, its `ROLLUP_RUN_MEDIANS`."""
    count = 0
    errors = 0
    ttfts: list[float] = []
    rates: list[float] = []
    others: list[list[float]] = [[] for _ in ROLLUP_SAMPLE_MEDIANS]
    for ttft, error, rate, *values in rows:
        count += 1
        for found, value in zip(others, values, strict=False):
            if value is not None:
                found.append(value)
        if error is not None:
            errors += 1
            continue
        if ttft is not None:
            ttfts.append(ttft)
        if rate is not None:
            rates.append(rate)
    servers: list[list[float]] = [[] for _ in ROLLUP_RUN_MEDIANS]
    for run in runs:
        for found, value in zip(servers, run, strict=True):
            if value is not None:
                found.append(value)
    ttfts.sort()
    return HourlyStats(
        hour=hour,
        samples=count,
        errors=errors,
        ttft_p50_ms=quantile(ttfts, 0.5, presorted=True),
        ttft_p90_ms=quantile(ttfts, 0.9, presorted=True),
        ttft_p99_ms=quantile(ttfts, 0.99, presorted=True),
        ttft_min_ms=ttfts[0] if ttfts else None,
        ttft_max_ms=ttfts[-1] if ttfts else None,
        decode_tps_p50=quantile(rates, 0.5),
        ttft_p10_ms=quantile(ttfts, 0.1, presorted=True),
        **{f"{name}_p50": quantile(found, 0.5) for name, found in zip(ROLLUP_SAMPLE_MEDIANS, others, strict=True)},
        **{f"{name}_p50": quantile(found, 0.5) for name, found in zip(ROLLUP_RUN_MEDIANS, servers, strict=True)},
    )


# ---------------------------------------------------------------- JSON form (the spool's)


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


def sample_to_dict(sample: Sample) -> dict[str, Any]:
    out = sample.as_dict()
    for name in UNSTORED_SAMPLE_FIELDS:
        out.pop(name, None)
    return out


def sample_from_dict(data: Mapping[str, Any]) -> Sample:
    known = {f.name for f in fields(Sample)} - UNSTORED_SAMPLE_FIELDS
    values = {k: v for k, v in data.items() if k in known}
    values["intended_at"] = _time(values.get("intended_at"))
    values["sent_at"] = _time(values.get("sent_at"))
    error = values.get("error")
    values["error"] = ErrorClass(error) if error is not None else None
    timing_path = values.get("timing_path")
    values["timing_path"] = TimingPath(timing_path) if timing_path is not None else None
    return Sample(**values)


def run_to_dict(run: RunRecord) -> dict[str, Any]:
    out: dict[str, Any] = {f.name: getattr(run, f.name) for f in fields(RunRecord)}
    out["run_id"] = str(run.run_id)
    out["series"] = {f.name: getattr(run.series, f.name) for f in fields(SeriesKey)}
    for name in ("intended_at", "started_at", "finished_at"):
        out[name] = out[name].isoformat()
    out["error"] = run.error.value if run.error is not None else None
    return out


def run_from_dict(data: Mapping[str, Any]) -> RunRecord:
    values = dict(data)
    values["run_id"] = uuid.UUID(values["run_id"])
    values["series"] = SeriesKey(**values["series"])
    for name in ("intended_at", "started_at", "finished_at"):
        values[name] = datetime.fromisoformat(values[name])
    values["error"] = ErrorClass(values["error"]) if values.get("error") is not None else None
    return RunRecord(**values)


def record_from_row(record: type[Record], row: Any, **given: Any) -> Record:
    """The `record` dataclass of a database row (a SQLAlchemy `Row`) whose columns carry the fields' names.
    `given` are the fields the row holds no column of that name for (a nested key, a value worked out from
    others); a defaulted field the row has no column for keeps its default."""
    columns = row._mapping
    values = {f.name: columns[f.name] for f in fields(record) if f.name in columns and f.name not in given}
    return record(**values, **given)
