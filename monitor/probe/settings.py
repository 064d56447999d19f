"""The probe's config sections: `providers` (how to reach an API endpoint), `targets` (a model on a
provider, its request parameters and objectives) and `prompts` (prompt profiles). The root `Config`
(monitor/config/models.py) composes them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from monitor.config.fields import ConfigModel, EnvName, Headers, MaskedHeadersModel, UserPath
from monitor.config.urls import check_http_url
from monitor.probe.apis import FLAVORS
from monitor.probe.proxy import ProxySettings
from monitor.redact import SENSITIVE_HEADERS, mask_url, url_credentials

# The allowed values come from the registry, so a new API flavour is one module and one registry line;
# pydantic still reports "not one of ..." with the full list, in registry order. mypy cannot read a
# Literal built at run time, hence the plain `str` it sees.
if TYPE_CHECKING:
    ApiName = str
else:
    ApiName = Literal[tuple(FLAVORS)]


class Prices(ConfigModel):
    """What a provider charges, per million tokens; without it costs are reported in tokens only."""

    input: float = Field(ge=0, description="Price of a million prompt (input) tokens that were not cached.")
    cached_input: float | None = Field(
        None, ge=0, description="Price of a million prompt tokens served from the provider's cache; default `input`."
    )
    output: float = Field(ge=0, description="Price of a million visible output tokens.")
    reasoning: float | None = Field(
        None,
        ge=0,
        description="Price of a million hidden reasoning tokens (counted inside the output); default `output`, "
        "which is what OpenAI, Anthropic and Google charge for them.",
    )
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the prices, e.g. `USD` or `EUR`.")

    def per_token(self) -> tuple[float, float, float, float]:
        """(input, cached input, output, reasoning) per single token."""
        cached = self.input if self.cached_input is None else self.cached_input
        reasoning = self.output if self.reasoning is None else self.reasoning
        return self.input / 1e6, cached / 1e6, self.output / 1e6, reasoning / 1e6


# Durations are stored as whole microseconds in an int4 (monitor/store/records.py MAX_MICROSECONDS:
# 35 min 47 s), so no timeout may let one run longer. 3,600 until migration 0020.
MAX_TIMEOUT_S = 2000


class TimeoutSettings(ConfigModel):
    connect: float = Field(10, gt=0, le=MAX_TIMEOUT_S, description="Seconds allowed for DNS, TCP and TLS set-up.")
    first_token: float = Field(
        60,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Seconds from sending the request to the first token before giving up.",
    )
    total: float = Field(300, gt=0, le=MAX_TIMEOUT_S, description="Seconds allowed for the whole streamed response.")

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


class Provider(MaskedHeadersModel):
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
    proxy: ProxySettings = Field(
        default_factory=ProxySettings, description="Forward proxy for the probes and the server-metrics scrapes."
    )
    prices: Prices | None = Field(
        None,
        description="What the provider charges (docs/cost.md): `check-config` then projects the cost of the "
        "schedule, `probe` prints what its run cost and the metrics count it. A target's own `prices` replace these.",
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
        found = [
            self._secret,
            *credential_headers,
            *url_credentials(self.base_url),
            *self._from_environment,
            *self.proxy.secrets(),
        ]
        return tuple(dict.fromkeys(value for value in found if value))

    def display_url(self) -> str:
        """`base_url` fit to print, every secret in it masked."""
        return mask_url(self.base_url, self.secrets())


class Params(ConfigModel):
    max_tokens: int = Field(
        64, ge=1, description="Most tokens to generate. TTFT needs only a few; keep it small to save cost."
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Merged verbatim into the request JSON, e.g. `seed: 7` or a gateway's own switches. A key "
        "here replaces the same top-level key that `reasoning: least` sends.",
    )
    reasoning: Literal["default", "least"] = Field(
        "default",
        description="`least`: ask for the least reasoning the API allows, so a probe does not pay for hidden "
        'tokens (docs/cost.md, "The cheapest honest probe"): OpenAI chat `reasoning_effort: minimal`, '
        "Responses `reasoning.effort: minimal`, Anthropic `thinking: {type: disabled}`, Gemini "
        "`thinkingBudget: 0`, and on any other OpenAI-compatible server (vLLM, SGLang) "
        "`chat_template_kwargs: {enable_thinking: false}`. `default`: send nothing, the model decides.",
    )
    reasoning_effort: str | None = Field(
        None,
        min_length=1,
        max_length=32,
        pattern=r"^[a-z][a-z_-]*$",
        description="With `reasoning: least`, the effort level to send where the API takes one, for models "
        "whose least is not `minimal`: `none` (GPT-5.1), `low` (o3, o4-mini, gpt-oss on vLLM), or Gemini 3's "
        "`thinkingLevel` (`low`) instead of `thinkingBudget: 0`.",
    )

    @model_validator(mode="after")
    def _check_effort_needs_least(self) -> Params:
        if self.reasoning_effort is not None and self.reasoning != "least":
            raise ValueError(
                f"reasoning_effort ({self.reasoning_effort}) applies only with `reasoning: least`: add it, or "
                "remove reasoning_effort"
            )
        return self


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


DEFAULT_CANARY_PROMPT = "Reply with exactly one word, in lower case: ready"


class Canary(ConfigModel):
    """A fixed short request each run, answered at temperature 0: the hash of its answer is stored per
    run, and a change of it says other weights answer (detect/identity.py)."""

    prompt: str = Field(
        DEFAULT_CANARY_PROMPT,
        min_length=1,
        max_length=2000,
        description="The canary's prompt: short, with one right answer, so the same model gives the same reply.",
    )
    max_tokens: int = Field(8, ge=1, le=256, description="Most tokens of its answer: the first few tell models apart.")
    seed: int | None = Field(
        1234, description="Sent as `seed` where the API takes one (OpenAI chat and completions); null: not sent."
    )
    timeout_s: float = Field(
        20.0,
        gt=0,
        le=300,
        description="Seconds the canary may take: the run is stored after it, so a hung canary must not hold "
        "it for the provider's whole timeout. Past it the run has no canary answer (`canary_failed`).",
    )


class Target(ConfigModel):
    provider: str = Field(description="Name of a provider defined under `providers:`.")
    model: str = Field(description="Model name sent in the request, exactly as the API expects it.")
    params: Params = Field(default_factory=Params, description="Request parameters.")
    slo: Slo = Field(default_factory=Slo, description="Objectives for this target.")
    prices: Prices | None = Field(
        None, description="This model's prices, replacing its provider's `prices` (all of them, not key by key)."
    )
    canary: Canary | None = Field(
        None,
        description="A deterministic canary request after each run's probes (`{}` for the defaults): a change "
        "of its answer is a model change (a marker, a notification, a new baseline); answers that vary on "
        "every run are reported as not deterministic. Not measured, and its tokens are spent every run.",
    )


class PromptProfile(ConfigModel):
    tokens: int = Field(
        ge=128,
        le=131072,
        description="Approximate prompt length in tokens (128 to 131072); TTFT grows with it.",
    )
    language: Literal["en", "zh"] = Field("en", description="Language of the generated prompt text.")
    cache: Literal["bust", "warm", "both"] = Field(
        "bust",
        description="`bust` makes every prompt unique so prefix caches cannot help (cold TTFT); "
        "`warm` repeats "
        "it so they can (cached TTFT); `both` probes the two side by side in every run, as two series (the "
        "prompt's own name, busted, and `NAME.warm`), and watches the pair: the cache speed-up (cold / warm "
        "TTFT) and the share of prompt tokens served from the cache, with a `cache_stopped` incident when the "
        "cache stops working (docs/detection.md).",
    )
    tool_call: bool = Field(
        False,
        description="Offer one function and require it (`tool_choice`), so the answer is a tool call and "
        "`first_tool_call_ms` is recorded beside `ttft_ms`. For every API with tools (not "
        "`openai-completions`).",
    )
