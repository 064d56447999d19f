"""The config schema: the root `Config`, composing each stage's own section (`probe/settings.py`:
providers, targets, prompts; `detect/settings.py`: detection; `alert/settings.py`: alerts) with the
sections the wiring owns (database, metrics, jobs, web). Every model forbids unknown keys
(`config/fields.py`), so a typo is an error rather than a silent default.

Field descriptions are the documentation: docs/configuration.md is generated from them
(`python -m monitor.config.docs --write docs/configuration.md`) and a test fails when it is stale.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field, field_serializer, field_validator, model_validator
from pydantic_core import PydanticCustomError

from monitor.alert.settings import Alerts
from monitor.config.cron import build_trigger
from monitor.config.fields import ConfigModel, CronExpression, EnvName, Name, TimezoneName, UserPath, check_name
from monitor.config.references import reference_problems
from monitor.config.series import cache_pairs
from monitor.config.urls import check_database_url, check_http_url, check_listen_address, mask_password
from monitor.detect.settings import Detection
from monitor.otel.settings import OtelConfig
from monitor.probe.settings import PromptProfile, Provider, Target

# The cold tier never compacts fewer days than this: check-config's cost projection reads 2 days of samples as
# rows (commands/check_config.py HISTORY_DAYS), the overview's baselines and the cost view a day. (Detection reads
# its history from chunks and rows alike: it needs no rows.)
COLD_FLOOR_DAYS = 3

# Error type of the whole-config reference check; the loader reports these itself, per key path.
REFERENCE_ERROR_TYPE = "config_references"


# ---------------------------------------------------------------- database and metrics


class Retention(ConfigModel):
    raw_days: int = Field(30, ge=1, description="Days to keep every individual probe sample.")
    rollup_days: int = Field(400, ge=1, description="Days to keep hourly/daily rollups (percentiles per target).")
    cold_after_days: int | Literal["auto", "off"] | None = Field(
        "auto",
        description="When a series' day of runs and samples is kept as two compressed chunks instead of rows (the "
        "cold tier, docs/storage.md): every reader gives the same answers (but a compare, which reads the hourly "
        "rollups sooner: a compacted run counts 6 toward its limit), at about a quarter of the bytes. `auto` "
        "(the default): once the day is past what this config needs as rows (the least number of days, which "
        "check-config prints: 3, or detection.slo_burn's longest window when longer; detection reads its history "
        "from chunks too). A number of days: every series after that many (at least that least number). `off` "
        "(or null): every day stays rows.",
    )

    @field_validator("cold_after_days", mode="before")
    @classmethod
    def _read_cold_after_days(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false: what the user wrote is `off`.
        if value is False:
            return "off"
        if isinstance(value, str) and value.strip().isdigit():  # from ${VAR}
            value = int(value)
        if value is None or value in ("auto", "off") or (isinstance(value, int) and not isinstance(value, bool)):
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{value} days is not a cold tier: a number of days >= 1, auto (the default) or off")
            return value
        raise ValueError(f"{value!r} is not a number of days >= 1, auto (the default) or off")

    def cold_days(self) -> int | None:
        """The fixed days the cold tier waits, None for `auto` and `off`."""
        return self.cold_after_days if isinstance(self.cold_after_days, int) else None

    def cold_tier_on(self) -> bool:
        return self.cold_after_days not in ("off", None)


@dataclass(frozen=True, slots=True)
class ColdPolicy:
    """Which days housekeeping moves into the cold tier (Repository.compact): none younger than `after_days`
    whole days, and with `keep_runs` set (`auto`), per series none that its newest `keep_runs` runs reach (what
    the overview's note on a series without a baseline counts)."""

    after_days: int
    keep_runs: int | None = None


class Database(ConfigModel):
    url: str = Field(
        "sqlite+aiosqlite:///./state/ttft-monitor.db",
        description="SQLAlchemy URL. `postgresql+asyncpg://USER:PASSWORD@HOST:5432/DB` for production, "
        "`sqlite+aiosqlite:///PATH` for one host. Put the password in `${VAR}`.",
    )
    state_dir: UserPath = Field(
        Path("./state"), description="Directory for local state: the spool of results not yet stored, etc."
    )
    retention: Retention = Field(default_factory=Retention, description="How long results are kept.")
    spool_max_mb: int = Field(
        256,
        ge=1,
        description="Cap on the on-disk spool used while the database is unreachable; oldest dropped.",
    )
    connect_retry_s: float = Field(
        30,
        gt=0,
        le=3600,
        description="Seconds between reconnect attempts while the database is unreachable.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        return check_database_url(url)

    # Dumps and reprs end up in logs; the live value stays available as `.url`.
    @field_serializer("url")
    def _dump_url(self, url: str) -> str:
        return mask_password(url)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (mask_password(value) if name == "url" else value)


# OpenTelemetry GenAI's `gen_ai.server.time_to_first_token` boundaries from 10 ms up (its 1 ms and 5 ms
# are below any network round trip), extended past its 10 s: a 128k prompt on a busy gateway takes a minute.
DEFAULT_TTFT_BUCKETS_S = (
    *(0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    *(15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0),
)


class MetricsSettings(ConfigModel):
    listen: str = Field(
        "127.0.0.1:9464",
        description="HOST:PORT for the Prometheus `/metrics` endpoint (`[::1]:9464` for IPv6).",
    )
    pushgateway: str | None = Field(
        None,
        description="Prometheus Pushgateway URL `once` pushes to after its run (CronJob mode), one group per "
        "probe job and location; a rejected push makes `once` exit 4.",
    )
    ttft_buckets_s: list[float] = Field(
        default_factory=lambda: list(DEFAULT_TTFT_BUCKETS_S),
        min_length=1,
        description="Upper bounds, in seconds, of the TTFT and TTFA histogram buckets. The default follows "
        "OpenTelemetry's `gen_ai.server.time_to_first_token` boundaries from 10 ms, extended to 120 s for "
        "long prompts on busy gateways.",
    )

    per_series: Literal["full", "summary", "off"] = Field(
        "full",
        description="What `/metrics` exposes per probe series (target x prompt x location x job): `full`, the "
        "TTFT and TTFA histograms with their buckets and every other series (68 series each); `summary`, those "
        "two as a summary of `_sum` and `_count` under the same names, without buckets (24: averages and the "
        "SLO, probe-error and regression alerts work; the quantile rules and panels stay empty); `off`, nothing "
        "labelled by target (job, scheduler and process series only; regressions page through `alerting`). "
        "docs/metrics.md counts them.",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, address: str) -> str:
        return check_listen_address(address)

    @field_validator("per_series", mode="before")
    @classmethod
    def _read_off(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false: what the user wrote is the mode `off`.
        return "off" if value is False else value

    @field_validator("pushgateway")
    @classmethod
    def _check_pushgateway(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="http://pushgateway:9091")

    @field_validator("ttft_buckets_s")
    @classmethod
    def _check_buckets(cls, bounds: list[float]) -> list[float]:
        if any(b <= 0 or b != b or b == float("inf") for b in bounds):
            raise ValueError("bucket bounds must be positive and finite (the +Inf bucket is always added)")
        if any(later <= earlier for earlier, later in itertools.pairwise(bounds)):
            raise ValueError(f"bucket bounds must increase strictly, got {bounds}")
        return bounds


# ---------------------------------------------------------------- jobs


class Job(ConfigModel):
    name: str = Field(description="Unique job name (letters, digits, `_`, `.`, `-`); used in metrics and alerts.")
    schedule: CronExpression = Field(
        description="Cron expression: 5 fields `minute hour day month weekday` (Sunday = 0 or 7), "
        "6 fields with "
        'seconds first, or `@hourly`/`@daily`/... Quote it in YAML: `"*/5 * * * *"`.'
    )
    timezone: TimezoneName = Field("UTC", description="IANA timezone the schedule is read in, e.g. `Europe/Berlin`.")
    jitter_s: float = Field(
        0,
        ge=0,
        le=86400,
        description="Start each run up to this many seconds late, at random, so jobs do not all fire at :00.",
    )
    targets: list[str] = Field(min_length=1, description="Targets to probe, by name.")
    prompts: list[str] = Field(min_length=1, description="Prompt profiles to send to every target, by name.")
    rounds: int = Field(5, ge=1, le=1000, description="Measured requests per target and prompt in each run.")
    warmup: int = Field(
        1,
        ge=0,
        le=100,
        description="Unmeasured requests first, so connection set-up and cold caches are not counted.",
    )
    pause_s: float = Field(1.0, ge=0, le=3600, description="Seconds to wait between rounds.")
    connection: Literal["reuse", "fresh"] = Field(
        "reuse",
        description="`reuse` keeps connections alive between requests (what clients see when warm); "
        "`fresh` opens "
        "a new one per request (includes DNS/TCP/TLS).",
    )

    shards: int = Field(
        1,
        ge=1,
        le=1024,
        description="Split the job's series (targets x prompts) into this many shards that the replicas of one "
        "location (daemons sharing the database, same `location`) claim apart each tick, so a large job is probed "
        "by several daemons; each series is still probed once per tick. 1: one replica probes the whole tick. "
        "At most the job's number of series; give every replica the same jobs (docs/deploy.md, "
        '"A job shared by several daemons").',
    )

    @field_validator("name")
    @classmethod
    def _check_job_name(cls, name: str) -> str:
        return check_name(name)

    @model_validator(mode="after")
    def _check_shards(self) -> Job:
        series = len(self.targets) * len(self.prompts)
        if self.shards > series:
            raise ValueError(
                f"shards: {self.shards} is more than the job's {series} series (targets x prompts); "
                f"use at most {series}"
            )
        return self

    @field_validator("targets", "prompts")
    @classmethod
    def _check_no_repeats(cls, names: list[str]) -> list[str]:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repr(n) for n in repeated)} listed more than once")
        return names

    def trigger(self) -> CronTrigger:
        """This job's schedule as an APScheduler trigger (timezone and jitter applied)."""
        return build_trigger(self.schedule, self.timezone, self.jitter_s)


# ---------------------------------------------------------------- budget


class BudgetLimit(ConfigModel):
    per: Literal["day", "month"] = Field("month", description="The period the limit is for; a month is 30 days.")
    cost: float | None = Field(
        None, gt=0, description="Most the probes may cost in the period, in `currency` (needs `prices`)."
    )
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code of `cost`.")
    tokens: int | None = Field(
        None, ge=1, description="Most tokens (input, output and reasoning together) the probes may spend in the period."
    )
    action: Literal["notify", "reduce", "pause"] = Field(
        "notify",
        description="What the daemon does when the spend is on course to exceed the limit, beside the one "
        "notification: `notify` only; `reduce` runs the jobs in the budget's scope with 1 round and no "
        "warm-up; `pause` skips their ticks. Either holds until the period ends (UTC day or month), is logged, "
        "and shows in `ttft_monitor_job_budget_action` and on the overview (docs/cost.md).",
    )

    @model_validator(mode="after")
    def _check_some_limit(self) -> BudgetLimit:
        if self.cost is None and self.tokens is None:
            raise ValueError("a budget needs `cost` (with prices), `tokens` or both, e.g. `cost: 20`")
        return self


class Budget(ConfigModel):
    """Limits on what probing spends (docs/cost.md): a config whose projection exceeds one is refused."""

    total: BudgetLimit | None = Field(None, description="A limit on every job together.")
    providers: dict[Name, BudgetLimit] = Field(
        default_factory=dict, description="Limits on what the jobs spend at one provider, by provider name."
    )
    jobs: dict[Name, BudgetLimit] = Field(default_factory=dict, description="Limits on one job, by job name.")


# ---------------------------------------------------------------- web


class Web(ConfigModel):
    """The status pages and the JSON API, served beside `/metrics` by `run` and alone by `serve`."""

    enabled: bool = Field(True, description="Serve the UI at `/` and the API at `/api/v1/` on `metrics.listen`.")
    token_env: EnvName = Field(
        None,
        description="Name of the environment variable holding a bearer token the UI and API then require "
        "(`Authorization: Bearer ...`, or the login form). If it is unset but `NAME_FILE` is set, the token "
        "is read from that file. An empty value means none. `/metrics` and the health endpoints stay open.",
    )
    basic_user: str | None = Field(None, description="User name for HTTP basic auth on the UI and API.")
    basic_password_hash: str | None = Field(
        None,
        description="Hash of the basic-auth password, as printed by `ttft-monitor serve --hash-password` "
        "(scrypt; never the password itself).",
    )
    session_hours: float = Field(
        12,
        gt=0,
        le=24 * 31,
        description="How long a sign-in on the login form lasts; the browser is then asked for the token "
        "again. `POST /logout` (the pages' Sign out button) ends it sooner.",
    )
    trust_proxy_headers: bool = Field(
        False,
        description="Behind a reverse proxy that sets them: take the client's address for the sign-in "
        "failure limit from the last `X-Forwarded-For` entry, and mark the session cookie `Secure` when "
        "`X-Forwarded-Proto: https`. Leave false when clients reach the monitor directly: they could "
        "send those headers themselves.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve the UI and API beyond loopback without auth. `run` and `serve` refuse to start "
        "when `metrics.listen` / `--listen` is not a loopback address and neither `token_env` nor "
        "`basic_user` is set, unless this is true.",
    )

    @field_validator("token_env", mode="before")
    @classmethod
    def _empty_token_env_is_none(cls, name: object) -> object:
        # `token_env: ${TTFT_WEB_AUTH_ENV:-}` in the example config: no auth unless the image names a variable.
        return None if name == "" else name

    @model_validator(mode="after")
    def _check_basic(self) -> Web:
        if (self.basic_user is None) != (self.basic_password_hash is None):
            raise ValueError("basic_user and basic_password_hash go together; set both or neither")
        if self.basic_password_hash is not None and not self.basic_password_hash.startswith("scrypt$"):
            raise ValueError("basic_password_hash must come from `ttft-monitor serve --hash-password` (scrypt$...)")
        return self


# ---------------------------------------------------------------- the whole file


class Config(ConfigModel):
    location: str = Field(
        "local",
        min_length=1,
        description="Where this monitor runs (e.g. `fra-dc1`); a label on every result.",
    )
    database: Database = Field(default_factory=Database, description="Where results are stored.")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, description="Prometheus exposition.")
    otel: OtelConfig = Field(default_factory=OtelConfig, description="OpenTelemetry export over OTLP.")
    providers: dict[Name, Provider] = Field(default_factory=dict, description="API endpoints, by name.")
    targets: dict[Name, Target] = Field(
        default_factory=dict, description="What to probe: a model on a provider, by name."
    )
    prompts: dict[Name, PromptProfile] = Field(default_factory=dict, description="Prompt profiles, by name.")
    jobs: list[Job] = Field(default_factory=list, description="Schedules: which targets and prompts, when.")
    detection: Detection = Field(default_factory=Detection, description="Regression detection.")
    alerts: Alerts = Field(default_factory=Alerts, description="Where incidents are sent.")
    web: Web = Field(default_factory=Web, description="Status pages and JSON API.")
    budget: Budget = Field(default_factory=Budget, description="Limits on what probing costs (docs/cost.md).")
    probe_self_delay_bound_ms: float = Field(
        5,
        gt=0,
        le=60000,
        description="A sample during which the monitor itself was late by more than this (its event loop's "
        "worst lateness between sending the request and the last stamp: a blocked loop, a starved CPU) is "
        "`disturbed`: stored, shown and counted, but not used as evidence by detection. Quiet, the lateness "
        "is well under 1 ms.",
    )
    shutdown_grace_s: float = Field(
        20,
        gt=0,
        le=600,
        description="On SIGTERM/SIGINT, seconds the requests in flight get to finish before they are cancelled "
        "(no series starts another round once it has measured one). Keep it below systemd `TimeoutStopSec` and "
        "Kubernetes `terminationGracePeriodSeconds` (both 30 in the shipped unit and manifests), so the process "
        "flushes and exits 0 before it is killed.",
    )

    @model_validator(mode="after")
    def _check_burn_windows_are_kept(self) -> Config:
        burn = self.detection.slo_burn
        if not burn.enabled or not any(t.slo.ttft_ms is not None for t in self.targets.values()):
            return self
        longest = burn.longest_window_minutes()
        if self.database.retention.raw_days * 1440 < longest:
            raise ValueError(
                f"database.retention.raw_days ({self.database.retention.raw_days}) keeps fewer days of probes than "
                f"detection.slo_burn's longest window ({longest / 1440:g} days): raise raw_days to at least "
                f"{math.ceil(longest / 1440)} or shorten the window"
            )
        return self

    def cold_minimum(self) -> tuple[int, str]:
        """The fewest whole days the cold tier must leave as rows, and what needs them: check-config's token
        history and the cost view's day, and the burn rates' longest window. (Detection reads chunks too.)"""
        needs = [(COLD_FLOOR_DAYS * 86400.0, "check-config's token history (2 days) and the cost view's day")]
        burn = self.detection.slo_burn
        if burn.enabled and any(t.slo.ttft_ms is not None for t in self.targets.values()):
            # And a day more: a batch the spool replays late counts its windows back from when it ran.
            needs.append(
                (burn.longest_window_minutes() * 60.0 + 86400.0, "detection.slo_burn's longest window and a day")
            )
        reach, what = max(needs)
        return math.ceil(reach / 86400.0), what

    def cold_policy(self) -> ColdPolicy | None:
        """What housekeeping compacts (database.retention.cold_after_days); None when nothing: `off`, or no day
        it may compact is younger than retention's."""
        retention = self.database.retention
        if not retention.cold_tier_on():
            return None
        fixed = retention.cold_days()
        if fixed is not None:
            return ColdPolicy(after_days=fixed) if fixed < retention.raw_days else None
        # auto: what this config needs as rows (the burn windows, check-config's token history). Detection's
        # history, which reaches back a week and more (further for a business-hours cron's evening run, or a
        # job slowed from 5 minutes to an hour), reads chunks and rows alike (Repository.history_rows).
        # Each series' newest runs as many as the detector learns from: the overview counts them for its note on a
        # series without a baseline (one retired a week ago), from rows.
        after, _ = self.cold_minimum()
        if after >= retention.raw_days:
            return None
        return ColdPolicy(after_days=after, keep_runs=self.detection.rules().min_history_runs)

    @model_validator(mode="after")
    def _check_the_cold_tier_leaves_detection_its_rows(self) -> Config:
        retention = self.database.retention
        fixed = retention.cold_days()
        if fixed is None:
            return self
        days, what = self.cold_minimum()
        if fixed < days:
            raise ValueError(
                f"database.retention.cold_after_days ({fixed}) would compact runs still read as rows ({days} days "
                f"back) by {what}: raise it to at least {days}, or set it to auto (the default) or off"
            )
        return self

    @model_validator(mode="after")
    def _check_warm_twins_are_free(self) -> Config:
        for twin, name in cache_pairs(self.prompts).items():
            if twin in self.prompts:
                raise ValueError(
                    f"prompts.{twin}: that name is the warm series of prompts.{name} (cache: both); rename "
                    f"prompts.{twin}, or set prompts.{name}.cache to bust or warm"
                )
        return self

    @model_validator(mode="after")
    def _check_references(self) -> Config:
        problems = reference_problems(self.model_dump(mode="json"))
        if problems:
            text = "; ".join(f"{format_path(loc)}: {message}" for loc, message in problems)
            raise PydanticCustomError(REFERENCE_ERROR_TYPE, "{problems}", {"problems": text})
        return self

    def job(self, name: str) -> Job:
        """The job called `name`; KeyError listing the known names otherwise."""
        for job in self.jobs:
            if job.name == name:
                return job
        known = ", ".join(job.name for job in self.jobs) or "none"
        raise KeyError(f"no job named '{name}' (known: {known})")


def format_path(loc: tuple[str | int, ...]) -> str:
    """`('jobs', 1, 'targets', 0)` -> `jobs[1].targets[0]`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
