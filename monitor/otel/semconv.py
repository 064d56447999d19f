"""What a probe is called in the OpenTelemetry GenAI semantic conventions: names, attributes, buckets.

Pure: a sample and its provider's API and URL in, attribute maps out. The names follow the
conventions' client inference document (semantic-conventions-genai, docs/gen-ai/client-inference.md
and gen-ai-token-metrics.md), which in 2026 renamed `gen_ai.client.operation.*` to
`gen_ai.client.inference.*` and replaced `gen_ai.client.token.usage` with counters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from monitor.probe.result import Sample

DURATION = "gen_ai.client.inference.duration"
TIME_TO_FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
USAGE_INPUT = "gen_ai.client.inference.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.client.inference.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.client.inference.usage.cache_read.input_tokens"

# The conventions' ExplicitBucketBoundaries for the three inference histograms.
GENAI_SECONDS_BUCKETS: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

# ttft-monitor's own instruments, for what the conventions do not define.
TTFT = "ttft_monitor.time_to_first_token"
TTFA = "ttft_monitor.time_to_first_answer_token"
PHASE = "ttft_monitor.phase.duration"
DECODE_RATE = "ttft_monitor.decode.rate"
PROBES = "ttft_monitor.probes"
DISTURBED = "ttft_monitor.probes.disturbed"
SELF_DELAY = "ttft_monitor.probe.self_delay"
BASELINE = "ttft_monitor.detector.baseline"
RUN_MEDIAN = "ttft_monitor.detector.run_median"
RUN_RATIO = "ttft_monitor.detector.run_ratio"
REGRESSION_STATE = "ttft_monitor.detector.state"

# `gen_ai.operation.name` per API flavour (the conventions' well-known values).
OPERATION = {
    "openai-chat": "chat",
    "openai-completions": "text_completion",
    "openai-responses": "chat",
    "anthropic-messages": "chat",
    "gemini": "generate_content",
}

# `gen_ai.provider.name`: a well-known value by host where the host says who serves it; otherwise the
# flavour's vendor, as the conventions ask of a client that talks a vendor's API to a proxy or a
# compatible server (vLLM, SGLang and gateways speak OpenAI's API, so they report `openai`).
_HOST_PROVIDERS = (
    ("api.openai.com", "openai"),
    ("openai.azure.com", "azure.ai.openai"),
    ("api.anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.deepseek.com", "deepseek"),
    ("api.groq.com", "groq"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.cohere.com", "cohere"),
    ("api.moonshot.ai", "moonshot_ai"),
)
_FLAVOUR_PROVIDERS = {
    "openai-chat": "openai",
    "openai-completions": "openai",
    "openai-responses": "openai",
    "anthropic-messages": "anthropic",
    "gemini": "gcp.gen_ai",
}

# Marks synthetic traffic, so a passive tool (a gateway's or a server's own telemetry) can join or leave
# out the monitor's requests (the general `user_agent.synthetic.type` attribute).
SYNTHETIC = {"user_agent.synthetic.type": "test"}

# The phases exported under `ttft_monitor.phase.duration`, from Sample fields.
PHASES = (
    ("dns", "dns_ms"),
    ("connect", "connect_ms"),
    ("tls", "tls_ms"),
    ("setup", "setup_ms"),
    ("response_head", "ttfb_ms"),
    ("first_event", "first_event_ms"),
)


def provider_name(api: str, base_url: str) -> str:
    host = (urlsplit(base_url).hostname or "").lower()
    for known, name in _HOST_PROVIDERS:
        # Subdomains and regional prefixes too: my-res.openai.azure.com, europe-west4-aiplatform.googleapis.com.
        if host == known or host.endswith(("." + known, "-" + known)):
            return name
    return _FLAVOUR_PROVIDERS.get(api, "_OTHER")


def server_address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


@dataclass(frozen=True)
class Endpoint:
    """What the conventions need of a provider: its API flavour and where it is."""

    api: str
    base_url: str

    def attributes(self) -> dict[str, str | int]:
        host, port = server_address(self.base_url)
        return {
            "gen_ai.operation.name": OPERATION.get(self.api, "chat"),
            "gen_ai.provider.name": provider_name(self.api, self.base_url),
            "server.address": host,
            "server.port": port,
        }


def genai_attributes(sample: Sample, endpoint: Mapping[str, str | int] | None) -> dict[str, str | int]:
    """The conventions' attributes of one probe: operation, provider, models, server, error class.

    `endpoint`: its provider's `Endpoint.attributes()`, worked out once per provider.

    `error.type` is the sample's ErrorClass, a fixed set, never the server's message.
    """
    base: Mapping[str, str | int] = (
        endpoint
        if endpoint is not None
        else {
            "gen_ai.operation.name": OPERATION.get(sample.api, "chat"),
            "gen_ai.provider.name": _FLAVOUR_PROVIDERS.get(sample.api, "_OTHER"),
        }
    )
    out = {**base, "gen_ai.request.model": sample.model}
    if sample.served_model:
        out["gen_ai.response.model"] = sample.served_model
    if sample.error is not None:
        out["error.type"] = sample.error.value
    return out


def monitor_attributes(sample: Sample, *, location: str, probe_job: str) -> dict[str, str]:
    """ttft-monitor's bounded series labels, the same as its Prometheus metrics carry."""
    return {
        "ttft_monitor.target": sample.target,
        "ttft_monitor.prompt": sample.prompt,
        "ttft_monitor.location": location,
        "ttft_monitor.probe_job": probe_job,
        **SYNTHETIC,
    }


def detector_attributes(series: Sequence[str], *, location: str | None = None) -> dict[str, str]:
    """A detector series (target, prompt, location) as attributes."""
    target, prompt, series_location = [*series, "", "", ""][:3]
    return {
        "ttft_monitor.target": target,
        "ttft_monitor.prompt": prompt,
        "ttft_monitor.location": series_location or (location or ""),
    }
