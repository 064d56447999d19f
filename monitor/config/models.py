"""The config schema. Every model forbids unknown keys, so a typo is an error rather than a silent default.

Field descriptions are the documentation: docs/configuration.md is generated from them
(`python -m monitor.config.docs --write docs/configuration.md`) and a test fails when it is stale.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from datetime import datetime
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from monitor.alert.receivers import KINDS as RECEIVER_KINDS
from monitor.config.cron import build_trigger, resolve_timezone
from monitor.config.references import reference_problems
from monitor.config.urls import check_database_url, check_http_url, check_listen_address, mask_password
from monitor.detect.rules import (
    CUSUM_BOUNDS,
    DEFAULT_RULES,
    MIN_BASELINE_RUNS,
    RULES_BOUNDS,
    THRESHOLD_BOUNDS,
    Bound,
    Cusum,
    FieldBounds,
    Rules,
    Severity,
    hysteresis_problem,
)
from monitor.probe.apis import FLAVORS
from monitor.redact import SENSITIVE_HEADERS, mask_url, url_credentials

# The allowed values come from the registries, so a new API flavour or receiver is one module and one
# registry line; pydantic still reports "not one of ..." with the full list, in registry order.
if TYPE_CHECKING:
    ApiName = str
    ReceiverType = str
else:
    ApiName = Literal[tuple(FLAVORS)]
    ReceiverType = Literal[tuple(RECEIVER_KINDS)]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Error type of the whole-config reference check; the loader reports these itself, per key path.
REFERENCE_ERROR_TYPE = "config_references"


def _check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"name '{name}' may only contain letters, digits, '_', '.' and '-'")
    return name


def _check_env_name(name: str | None) -> str | None:
    # Never echo the value: a common slip is pasting the key itself where its variable's name belongs.
    if name is not None and not ENV_NAME_PATTERN.match(name):
        raise ValueError(
            "must be the NAME of an environment variable (letters, digits and '_', e.g. OPENAI_API_KEY), "
            "not the secret itself"
        )
    return name


def _expand_user(path: Path | None) -> Path | None:
    return path.expanduser() if path is not None else None


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not re.match(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", name):
            raise ValueError(f"'{name}' is not a valid HTTP header name")
        if "\n" in value or "\r" in value:
            raise ValueError(f"the value of header '{name}' contains a line break")
    return headers


def _masked_headers(headers: dict[str, str]) -> dict[str, str]:
    return dict.fromkeys(headers, "***")


Name = Annotated[str, AfterValidator(_check_name)]
EnvName = Annotated[str | None, AfterValidator(_check_env_name)]
UserPath = Annotated[Path, AfterValidator(_expand_user)]
Headers = Annotated[dict[str, str], AfterValidator(_check_headers)]


def _check_cron(expr: str) -> str:
    build_trigger(expr, "UTC")
    return expr


def _check_timezone(name: str) -> str:
    resolve_timezone(name)
    return name


# A job's schedule and a silence's window share these checks.
CronExpression = Annotated[str, AfterValidator(_check_cron)]
TimezoneName = Annotated[str, AfterValidator(_check_timezone)]


def _numeric_kind(annotation: Any) -> str | None:
    """'an integer' or 'a number' when a field holds one (optionally None), else None."""
    members = [annotation]
    while members:
        current = members.pop()
        origin = get_origin(current)
        if origin is Annotated:
            members.append(get_args(current)[0])
        elif origin in (Union, UnionType):
            members += [arg for arg in get_args(current) if arg is not type(None)]
        elif current is int:
            return "an integer"
        elif current is float:
            return "a number"
    return None


class ConfigModel(BaseModel):
    # Numbers are accepted where text is expected so `model: 3` or a numeric header value just work.
    # `inf` and `nan` are refused: `pause_s: .inf` would hang a job, and nan passes no bound check.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's `true` would otherwise pass as 1: `rounds: true` is a slip, not a count.
        if isinstance(value, bool) and info.field_name is not None:
            kind = _numeric_kind(cls.model_fields[info.field_name].annotation)
            if kind is not None:
                raise ValueError(f"expected {kind}, got {'true' if value else 'false'}")
        return value


# ---------------------------------------------------------------- database and metrics


class Retention(ConfigModel):
    raw_days: int = Field(30, ge=1, description="Days to keep every individual probe sample.")
    rollup_days: int = Field(400, ge=1, description="Days to keep hourly/daily rollups (percentiles per target).")


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

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, address: str) -> str:
        return check_listen_address(address)

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


# ---------------------------------------------------------------- providers and targets


class TimeoutSettings(ConfigModel):
    connect: float = Field(10, gt=0, le=3600, description="Seconds allowed for DNS, TCP and TLS set-up.")
    first_token: float = Field(
        60, gt=0, le=3600, description="Seconds from sending the request to the first token before giving up."
    )
    total: float = Field(300, gt=0, le=3600, description="Seconds allowed for the whole streamed response.")

    @model_validator(mode="after")
    def _check_order(self) -> TimeoutSettings:
        if not self.connect <= self.first_token <= self.total:
            raise ValueError(
                f"timeouts must satisfy connect <= first_token <= total, got connect={self.connect:g}, "
                f"first_token={self.first_token:g}, total={self.total:g}"
            )
        return self


class Tls(ConfigModel):
    verify: bool = Field(True, description="Verify the server certificate. Switch off only for lab endpoints.")
    ca_file: UserPath | None = Field(
        None, description="PEM bundle of extra CA certificates to trust (private CAs). Must exist."
    )

    @field_validator("ca_file")
    @classmethod
    def _check_ca_file(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"CA file {path} does not exist (relative paths start at the working directory)")
        return path


class Provider(ConfigModel):
    """An API endpoint and how to reach it. The key itself never lives here; see `secret()`."""

    base_url: str = Field(
        description="API base URL including the version prefix, e.g. `https://api.openai.com/v1`. "
        "A trailing slash is removed."
    )
    api: ApiName = Field(
        description="Wire protocol: `openai-chat` (/chat/completions), `openai-completions` (/completions), "
        "`anthropic-messages` (/messages), `openai-responses` (/responses) or `gemini` "
        "(/models/MODEL:streamGenerateContent?alt=sse, base_url e.g. "
        "`https://generativelanguage.googleapis.com/v1beta`)."
    )
    api_key_env: EnvName = Field(
        None,
        description="Name of the environment variable holding the API key. If it is unset but `NAME_FILE` is "
        "set, the key is read from that file (systemd credentials, Kubernetes secrets).",
    )
    api_key_file: UserPath | None = Field(
        None,
        description="File holding the API key (surrounding whitespace is stripped). Exclusive with "
        "`api_key_env`; leave both out for endpoints without auth.",
    )
    headers: Headers = Field(
        default_factory=dict,
        description="Extra HTTP headers sent with every request. Values may use `${VAR}` for secrets.",
    )
    timeout_s: TimeoutSettings = Field(default_factory=TimeoutSettings, description="Per-request time limits.")
    max_concurrency: int = Field(
        4,
        ge=1,
        description="Most requests in flight to this provider at once; more would skew each other's TTFT.",
    )
    tls: Tls = Field(default_factory=Tls, description="Certificate checking.")
    include_usage: bool = Field(
        True,
        description="Ask for token counts in the stream (`stream_options.include_usage`). Switch off for "
        "servers that reject the option.",
    )
    follow_redirects: bool = Field(
        False,
        description="Follow 307 and 308 redirects (up to 5), repeating the POST with its key to the new "
        "address. Off: a redirect is recorded as error `redirect` with its `Location`. 301, 302 and 303 are "
        "never followed (they would turn the POST into a GET).",
    )
    server_metrics_url: str | None = Field(
        None,
        description="The server's own Prometheus endpoint (self-hosted vLLM or SGLang), e.g. "
        "`http://127.0.0.1:8000/metrics`. Scraped right before and right after each run (limits: 2 s before, "
        "5 s after, when no probe waits; a slow or dead endpoint only leaves the run's `server_*` columns "
        "empty) to store requests waiting and "
        "running, KV-cache usage, prefix-cache hit rate and the server's own TTFT, queue and prefill time.",
    )

    _secret: str | None = PrivateAttr(default=None)
    _auth_source: str = PrivateAttr(default="none")
    _from_environment: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str) -> str:
        return check_http_url(url, example="http://127.0.0.1:8000/v1 or https://api.openai.com/v1")

    @field_validator("server_metrics_url")
    @classmethod
    def _check_server_metrics_url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="http://127.0.0.1:8000/metrics")

    @model_validator(mode="after")
    def _check_one_key_source(self) -> Provider:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("set either api_key_env or api_key_file, not both")
        return self

    @model_validator(mode="after")
    def _check_gemini_streams_events(self) -> Provider:
        # Without alt=sse Gemini answers with one JSON array, not events: the probe always adds it.
        if self.api != "gemini":
            return self
        path, _, query = self.base_url.partition("?")
        if ":streamGenerateContent" in path or ":generateContent" in path or "/models/" in path:
            raise ValueError(
                "api gemini: base_url must stop before /models/..., e.g. "
                "https://generativelanguage.googleapis.com/v1beta (the probe adds the model and ?alt=sse)"
            )
        if any(part.split("=", 1)[0].lower() == "alt" for part in query.split("&") if part):
            raise ValueError(
                "api gemini: remove alt= from base_url; the probe always asks for alt=sse, without which "
                "Gemini sends a JSON array instead of events"
            )
        return self

    def secret(self) -> str | None:
        """The API key resolved by `load_config`, or None when the provider has no auth."""
        return self._secret

    def auth_source(self) -> str:
        """Where the key came from, safe to print: `env OPENAI_API_KEY`, `file /run/key`, or `none`."""
        return self._auth_source

    def with_secret(self, secret: str | None, *, source: str, from_environment: tuple[str, ...] = ()) -> Provider:
        """A copy carrying `secret`. Kept out of fields so it never reaches repr, dumps or errors.

        `from_environment`: values `${VAR}` put into `base_url` or `headers`, masked like the key.
        """
        copy = self.model_copy()
        copy._secret = secret
        copy._auth_source = source
        copy._from_environment = from_environment
        return copy

    def secrets(self) -> tuple[str, ...]:
        """Everything of this provider's that must never be shown: the key, credential headers' values,
        credentials in `base_url` (userinfo, key-like query values) and whatever `${VAR}` put into the
        URL or any header. A literal `X-Debug: true` is no secret: masking it would mask every "true"."""
        credential_headers = [value for name, value in self.headers.items() if name.lower() in SENSITIVE_HEADERS]
        found = [self._secret, *credential_headers, *url_credentials(self.base_url), *self._from_environment]
        return tuple(dict.fromkeys(value for value in found if value))

    def display_url(self) -> str:
        """`base_url` fit to print, every secret in it masked."""
        return mask_url(self.base_url, self.secrets())

    # Header values often carry credentials via ${VAR}; the live values stay available as `.headers`.
    @field_serializer("headers")
    def _dump_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return _masked_headers(headers)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (_masked_headers(value) if name == "headers" else value)


class Params(ConfigModel):
    max_tokens: int = Field(
        64, ge=1, description="Most tokens to generate. TTFT needs only a few; keep it small to save cost."
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Merged verbatim into the request JSON, e.g. "
        "`chat_template_kwargs: {enable_thinking: false}` for Qwen3 on vLLM.",
    )


class Slo(ConfigModel):
    ttft_p50_ms: float | None = Field(
        None,
        gt=0,
        description="Median TTFT objective in milliseconds: runs persistently above it open an `slo` ticket.",
    )
    ttft_ms: float | None = Field(
        None,
        gt=0,
        description="Per-probe TTFT objective in milliseconds: a probe is good when it succeeds within it. The "
        "daemon opens `slo_burn` incidents when the target spends its error budget too fast "
        "(`detection.slo_burn`), and counts `ttft_monitor_slo_probes_total` and "
        "`ttft_monitor_slo_good_probes_total` for Prometheus' burn-rate alerts; unset, the target has no such SLO.",
    )
    objective: float = Field(
        0.99,
        gt=0,
        lt=1,
        description="Share of probes that should be good under `ttft_ms` (0.99: an error budget of 1%). A failed "
        "or timed-out probe is bad. Burning the budget too fast opens an `slo_burn` incident "
        "(`detection.slo_burn`).",
    )

    @model_validator(mode="after")
    def _check_objective_has_threshold(self) -> Slo:
        if "objective" in self.model_fields_set and self.ttft_ms is None:
            raise ValueError(
                f"objective ({self.objective:g}) needs ttft_ms, the per-probe TTFT threshold it applies to: add "
                "e.g. `ttft_ms: 800` (ttft_p50_ms is a different objective, on the median of each run)"
            )
        return self


class Target(ConfigModel):
    provider: str = Field(description="Name of a provider defined under `providers:`.")
    model: str = Field(description="Model name sent in the request, exactly as the API expects it.")
    params: Params = Field(default_factory=Params, description="Request parameters.")
    slo: Slo = Field(default_factory=Slo, description="Objectives for this target.")


class PromptProfile(ConfigModel):
    tokens: int = Field(
        ge=128,
        le=131072,
        description="Approximate prompt length in tokens (128 to 131072); TTFT grows with it.",
    )
    language: Literal["en", "zh"] = Field("en", description="Language of the generated prompt text.")
    cache: Literal["bust", "warm"] = Field(
        "bust",
        description="`bust` makes every prompt unique so prefix caches cannot help (cold TTFT); "
        "`warm` repeats "
        "it so they can (cached TTFT).",
    )
    tool_call: bool = Field(
        False,
        description="Offer one function and require it (`tool_choice`), so the answer is a tool call and "
        "`first_tool_call_ms` is recorded beside `ttft_ms`. For every API with tools (not "
        "`openai-completions`).",
    )


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

    @field_validator("name")
    @classmethod
    def _check_job_name(cls, name: str) -> str:
        return _check_name(name)

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


# ---------------------------------------------------------------- detection


# Defaults and bounds are the detector's own (monitor/detect/rules.py), defined there once.


def _rule(bounds: dict[str, Bound], name: str) -> FieldBounds:
    return bounds[name].field_bounds()


class SeverityRule(ConfigModel):
    ratio: float = Field(**_rule(THRESHOLD_BOUNDS, "ratio"), description="Fire when TTFT exceeds baseline x ratio ...")
    min_delta_ms: float = Field(
        **_rule(THRESHOLD_BOUNDS, "min_delta_ms"),
        description="... and exceeds baseline by at least this many milliseconds ...",
    )
    confirmations: int = Field(
        **_rule(THRESHOLD_BOUNDS, "confirmations"), description="... in this many consecutive runs ..."
    )
    window_runs: int = Field(
        **_rule(THRESHOLD_BOUNDS, "window_runs"),
        description="... comparing the median of this many recent runs (defaults assume 5-minute runs) ...",
    )
    z_threshold: float = Field(
        **_rule(THRESHOLD_BOUNDS, "z_threshold"),
        description="... which must also be this many standard errors (from MAD) above the baseline.",
    )
    min_probes: int = Field(
        0,
        **_rule(THRESHOLD_BOUNDS, "min_probes"),
        description="The window stretches back (to at most this many runs) until it holds this many measured "
        "requests, so jobs with few `rounds` decide on more runs; 0: never.",
    )


class Availability(ConfigModel):
    consecutive_failures: int = Field(
        DEFAULT_RULES.consecutive_failures,
        **_rule(RULES_BOUNDS, "consecutive_failures"),
        description="Runs in a row where every request failed before alerting.",
    )
    error_rate: float = Field(
        DEFAULT_RULES.error_rate,
        **_rule(RULES_BOUNDS, "error_rate"),
        description="Alert when the share of failed requests over `window_runs` reaches this.",
    )
    window_runs: int = Field(
        DEFAULT_RULES.error_window_runs,
        **_rule(RULES_BOUNDS, "error_window_runs"),
        description="Runs over which `error_rate` is measured.",
    )


_DEFAULT_CUSUM = DEFAULT_RULES.cusum or Cusum(shift_ratio=1.15, threshold=None, clip=2.5)


class SequentialRule(ConfigModel):
    """The CUSUM that opens tickets for moderate shifts (docs/detection.md, "Adding up evidence")."""

    enabled: bool = Field(
        DEFAULT_RULES.cusum is not None,
        description="Add up evidence across runs; false leaves tickets to the window rule.",
    )
    shift_ratio: float = Field(
        _DEFAULT_CUSUM.shift_ratio,
        **_rule(CUSUM_BOUNDS, "shift_ratio"),
        description="The smallest shift worth a ticket: each run adds its residual minus half of log(shift_ratio).",
    )
    threshold: float | None = Field(
        _DEFAULT_CUSUM.threshold,
        **_rule(CUSUM_BOUNDS, "threshold"),
        description="A ticket opens when the sum reaches this (in the residuals' long-run sigmas); lower is sooner "
        "and noisier. Unset (the default): derived per series from `detection.false_alerts_per_week` and the "
        "series' measured noise.",
    )
    clip: float = Field(
        _DEFAULT_CUSUM.clip,
        **_rule(CUSUM_BOUNDS, "clip"),
        description="One run adds at most this many sigmas beyond the allowance, so spikes cannot push it.",
    )
    min_delta_ms: float = Field(
        _DEFAULT_CUSUM.min_delta_ms,
        **_rule(CUSUM_BOUNDS, "min_delta_ms"),
        description="The shift the sum estimates must also be at least this many milliseconds.",
    )
    block_runs: int = Field(
        _DEFAULT_CUSUM.block_runs,
        **_rule(CUSUM_BOUNDS, "block_runs"),
        description="No longer read (kept so configs that set it still load): each series' noise model measures "
        "how autocorrelated its residuals are.",
    )


DEFAULT_SEVERITY_RULES: dict[str, dict[str, float]] = {
    "page": dataclasses.asdict(DEFAULT_RULES.page),
    "ticket": dataclasses.asdict(DEFAULT_RULES.ticket),
}


DEFAULT_BURN_WINDOWS: tuple[dict[str, Any], ...] = (
    # Google's SRE workbook, "Alerting on SLOs": 2% of a 30-day budget in an hour, 5% in 6 hours,
    # 10% in 3 days. deploy/prometheus/rules.yaml alerts on the same windows (a test keeps them equal).
    {"severity": "page", "burn_rate": 14.4, "long_window_minutes": 60, "short_window_minutes": 5},
    {"severity": "page", "burn_rate": 6.0, "long_window_minutes": 360, "short_window_minutes": 30},
    {"severity": "ticket", "burn_rate": 1.0, "long_window_minutes": 4320, "short_window_minutes": 360},
)


class BurnWindow(ConfigModel):
    severity: Literal["page", "ticket"] = Field(description="What the incident is when this pair fires.")
    burn_rate: float = Field(
        gt=0,
        description="Fires when the share of bad probes is at least this many times the error budget "
        "(1 - `slo.objective`) over both windows.",
    )
    long_window_minutes: float = Field(gt=0, description="The long window: how much budget has been spent.")
    short_window_minutes: float = Field(
        gt=0, description="The short window: whether it is still being spent (so the incident resolves soon after)."
    )

    @model_validator(mode="after")
    def _check_windows(self) -> BurnWindow:
        if self.short_window_minutes >= self.long_window_minutes:
            raise ValueError(
                f"short_window_minutes ({self.short_window_minutes:g}) must be shorter than long_window_minutes "
                f"({self.long_window_minutes:g}); the workbook's pairs use a twelfth, e.g. 60 and 5"
            )
        return self


class SloBurn(ConfigModel):
    """Multi-window, multi-burn-rate incidents on `targets.*.slo.ttft_ms` (docs/detection.md, "SLO burn rate")."""

    enabled: bool = Field(True, description="Open `slo_burn` incidents for targets with `slo.ttft_ms`.")
    windows: list[BurnWindow] = Field(
        default_factory=lambda: [BurnWindow.model_validate(w) for w in DEFAULT_BURN_WINDOWS],
        min_length=1,
        description="Window pairs: page at 14.4x over 1 h and 5 min or 6x over 6 h and 30 min, ticket at 1x over "
        "3 d and 6 h. A list given here replaces them all.",
    )
    min_probes: int = Field(
        10,
        ge=1,
        description="Probes a long window must hold before its pair can fire, so the first bad probe of a new "
        "target does not page.",
    )
    keep_firing_minutes: float = Field(
        10,
        ge=0,
        description="An incident resolves once no pair of its severity has fired for this long (Prometheus' "
        "`keep_firing_for`), so a burn that pauses for one run does not resolve and page again.",
    )

    def longest_window_minutes(self) -> float:
        return max(w.long_window_minutes for w in self.windows)


class Detection(ConfigModel):
    min_history_runs: int = Field(
        DEFAULT_RULES.min_history_runs,
        **_rule(RULES_BOUNDS, "min_history_runs"),
        description="Runs of history needed before a target can alert.",
    )
    seasonal_days: int = Field(
        DEFAULT_RULES.seasonal_days,
        **_rule(RULES_BOUNDS, "seasonal_days"),
        description="Days back to compare the same time of day against; tickets need 3 days of it (0 turns the "
        "seasonal baseline off, at about 6 false alerts a week).",
    )
    trailing_runs: int = Field(
        DEFAULT_RULES.trailing_runs,
        **_rule(RULES_BOUNDS, "trailing_runs"),
        description=f"Recent runs forming the trailing baseline, used until a seasonal baseline exists (at least "
        f"{MIN_BASELINE_RUNS}: a baseline needs that many runs).",
    )
    false_alerts_per_week: float = Field(
        DEFAULT_RULES.false_alerts_per_week,
        **_rule(RULES_BOUNDS, "false_alerts_per_week"),
        description="The false alerts a healthy series may raise per week: the CUSUM's threshold is derived from it "
        "and each series' measured noise (lower is quieter and slower; docs/detection.md).",
    )
    page: SeverityRule = Field(
        default_factory=lambda: SeverityRule.model_validate(DEFAULT_SEVERITY_RULES["page"]),
        description="Rule for `page` severity: large, confirmed regressions. Keys left out keep their defaults.",
    )
    ticket: SeverityRule = Field(
        default_factory=lambda: SeverityRule.model_validate(DEFAULT_SEVERITY_RULES["ticket"]),
        description="Rule for `ticket` severity: smaller, sustained regressions. Keys left out keep their defaults.",
    )
    seasonal_window_minutes: float = Field(
        DEFAULT_RULES.seasonal_window_minutes,
        **_rule(RULES_BOUNDS, "seasonal_window_minutes"),
        description="The seasonal baseline uses each past day's runs within this many minutes of the same time of day.",
    )
    level_hours: float = Field(
        DEFAULT_RULES.level_hours,
        **_rule(RULES_BOUNDS, "level_hours"),
        description="Hours of recent runs that set the baseline's current level, so slow drift is not a regression.",
    )
    clear_runs: int = Field(
        DEFAULT_RULES.clear_runs,
        **_rule(RULES_BOUNDS, "clear_runs"),
        description="An incident clears on the median of max(clear_runs, the severity's window_runs) runs.",
    )
    clear_ratio: float = Field(
        DEFAULT_RULES.clear_ratio,
        **_rule(RULES_BOUNDS, "clear_ratio"),
        description="An incident clears once TTFT is back below baseline x this (below `ticket.ratio`).",
    )
    cusum: SequentialRule = Field(
        default_factory=SequentialRule,
        description="The sequential rule (a one-sided CUSUM of the seasonal residuals) that opens tickets.",
    )
    window_tickets: bool = Field(
        DEFAULT_RULES.window_tickets,
        description="The `ticket` window rule opens tickets beside the CUSUM too (it always does when `cusum` is "
        "disabled).",
    )
    availability: Availability = Field(default_factory=Availability, description="Alerting on failed requests.")
    slo_burn: SloBurn = Field(
        default_factory=SloBurn, description="Error-budget burn-rate incidents on targets' `slo.ttft_ms`."
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_partial_rules(cls, data: Any) -> Any:
        # `page: {ratio: 2}` should mean "page, with ratio 2", not "page, missing two keys".
        if isinstance(data, dict):
            data = dict(data)
            for severity, defaults in DEFAULT_SEVERITY_RULES.items():
                if isinstance(data.get(severity), dict):
                    data[severity] = {**defaults, **data[severity]}
        return data

    @model_validator(mode="after")
    def _check_hysteresis(self) -> Detection:
        problem = hysteresis_problem(self.clear_ratio, page_ratio=self.page.ratio, ticket_ratio=self.ticket.ratio)
        if problem is not None:
            raise ValueError(problem)
        return self

    def rules(self) -> Rules:
        """The detector's rules for this section."""
        return Rules.from_config(self)


# ---------------------------------------------------------------- alerts


class Receiver(ConfigModel):
    type: ReceiverType = Field(description="Kind of destination.")
    url: str | None = Field(None, description="Destination URL. Webhook URLs are often secrets: prefer `url_env`.")
    url_env: EnvName = Field(None, description="Name of the environment variable holding the URL.")
    secret_env: EnvName = Field(
        None,
        description="Name of the environment variable holding the receiver's secret (PagerDuty routing key, "
        "signing secret, bearer token). `NAME_FILE` works as for providers.",
    )
    secret_file: UserPath | None = Field(None, description="File holding the receiver's secret.")
    headers: Headers = Field(default_factory=dict, description="Extra HTTP headers; values may use `${VAR}`.")
    timeout_s: float = Field(10, gt=0, le=300, description="Seconds allowed per delivery attempt.")

    _secret: str | None = PrivateAttr(default=None)
    _resolved_url: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="https://hooks.example.com/ttft")

    @model_validator(mode="after")
    def _check_exclusive(self) -> Receiver:
        if self.url is not None and self.url_env is not None:
            raise ValueError("set either url or url_env, not both")
        if self.secret_env is not None and self.secret_file is not None:
            raise ValueError("set either secret_env or secret_file, not both")
        return self

    def secret(self) -> str | None:
        """The secret resolved by `load_config`, or None."""
        return self._secret

    def resolved_url(self) -> str | None:
        """`url`, or the value of `url_env` as resolved by `load_config`."""
        return self._resolved_url if self._resolved_url is not None else self.url

    def with_secrets(self, *, secret: str | None, url: str | None) -> Receiver:
        copy = self.model_copy()
        copy._secret = secret
        copy._resolved_url = url
        return copy

    @field_serializer("headers")
    def _dump_headers(self, headers: dict[str, str]) -> dict[str, str]:
        return _masked_headers(headers)

    @field_serializer("url")
    def _dump_url(self, url: str | None) -> str | None:
        return None if url is None else "***"

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "headers":
                yield name, _masked_headers(value)
            elif name == "url" and value is not None:
                yield name, "***"
            else:
                yield name, value


def _paged_severities() -> list[Severity]:
    return ["page", "ticket"]


class Route(ConfigModel):
    receivers: list[str] = Field(min_length=1, description="Receivers to notify, by name.")
    severities: list[Severity] = Field(
        default_factory=_paged_severities, min_length=1, description="Severities this route takes."
    )
    jobs: list[str] = Field(default_factory=list, description="Only alerts from these jobs; empty means all jobs.")


class Silence(ConfigModel):
    targets: list[str] = Field(default_factory=list, description="Targets silenced; empty silences everything.")
    start: datetime | None = Field(None, description="Start of a one-off window, with UTC offset.")
    end: datetime | None = Field(None, description="End of a one-off window, with UTC offset.")
    cron: CronExpression | None = Field(
        None, description="Start of a recurring window, as a cron expression (needs `duration_s`)."
    )
    duration_s: float | None = Field(
        None, gt=0, le=366 * 86400, description="Length of each recurring window in seconds."
    )
    timezone: TimezoneName = Field("UTC", description="IANA timezone `cron` is read in.")
    comment: str = Field("", description="Why; shown with suppressed alerts.")

    @field_validator("start", "end")
    @classmethod
    def _check_aware(cls, moment: datetime | None) -> datetime | None:
        if moment is not None and moment.tzinfo is None:
            raise ValueError(f"{moment.isoformat()} has no UTC offset; write e.g. {moment.isoformat()}+00:00")
        return moment

    @model_validator(mode="after")
    def _check_window(self) -> Silence:
        one_off = self.start is not None or self.end is not None
        recurring = self.cron is not None or self.duration_s is not None
        if one_off == recurring:
            raise ValueError("a silence needs either start and end, or cron and duration_s")
        if one_off and (self.start is None or self.end is None):
            raise ValueError("a one-off silence needs both start and end")
        if recurring and (self.cron is None or self.duration_s is None):
            raise ValueError("a recurring silence needs both cron and duration_s")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class Grouping(ConfigModel):
    """One page per outage (docs/alerting.md, "One page per outage")."""

    enabled: bool = Field(
        True,
        description="Regressions of several series behind one provider that open within `window_minutes` of each "
        "other are notified as one group naming its members (one PagerDuty dedup key, one Alertmanager alert); "
        "false notifies every series on its own.",
    )
    window_minutes: float = Field(
        15,
        gt=0,
        le=1440,
        description="A regression joins its provider's open group when the group's last member opened at most this "
        "many minutes before; later, it starts a new group.",
    )
    by: Literal["provider", "location"] = Field(
        "provider",
        description="What one outage is: regressions of series behind one `provider` (any location), or of "
        "series seen from one `location` (any provider: that location's network or egress).",
    )
    hold_minutes: float = Field(
        10,
        ge=0,
        le=1440,
        description="A group's first notification waits while other series of the provider have begun confirming a "
        "regression (they are a run or two from joining), at most this many minutes after it opened; a lone "
        "regression goes out at once. 0: never wait.",
    )


class Alerts(ConfigModel):
    base_url: str | None = Field(
        None,
        description="Public URL of your dashboard, used for links in notifications; for the built-in status "
        "pages, their series page (`http://HOST:9464/series`), which links open at the incident's time.",
    )
    renotify_interval_s: float = Field(
        14400,
        ge=0,
        le=30 * 86400,
        description="Repeat an open incident's notification this often (0 = never).",
    )
    send_resolved: bool = Field(True, description="Also notify when an incident clears.")
    receivers: dict[Name, Receiver] = Field(default_factory=dict, description="Notification destinations, by name.")
    routes: list[Route] = Field(default_factory=list, description="Which alerts go to which receivers.")
    silences: list[Silence] = Field(default_factory=list, description="Windows in which alerts are suppressed.")
    grouping: Grouping = Field(default_factory=Grouping, description="One notification per outage.")

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url, example="https://grafana.example.com/d/ttft")


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
    providers: dict[Name, Provider] = Field(default_factory=dict, description="API endpoints, by name.")
    targets: dict[Name, Target] = Field(
        default_factory=dict, description="What to probe: a model on a provider, by name."
    )
    prompts: dict[Name, PromptProfile] = Field(default_factory=dict, description="Prompt profiles, by name.")
    jobs: list[Job] = Field(default_factory=list, description="Schedules: which targets and prompts, when.")
    detection: Detection = Field(default_factory=Detection, description="Regression detection.")
    alerts: Alerts = Field(default_factory=Alerts, description="Where incidents are sent.")
    web: Web = Field(default_factory=Web, description="Status pages and JSON API.")
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
        description="On SIGTERM/SIGINT, seconds in-flight probes get to finish before they are cancelled. "
        "Keep it below systemd `TimeoutStopSec` and Kubernetes `terminationGracePeriodSeconds` (both 30 in "
        "the shipped unit and manifests), so the process flushes and exits 0 before it is killed.",
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
