"""The `otel:` config section (composed into the root Config by config/models.py), and what export does
once the standard `OTEL_*` variables are read.

`resolve(config, environ)` is pure: the environment is handed in, so a test states it and the
daemon passes `os.environ`. Keys set in the config win over the environment; for each signal its
own variable (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, ...) wins over the general one, as the
OpenTelemetry specification has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator, Field

from monitor.config.fields import Headers, MaskedHeadersModel

SIGNALS = ("metrics", "traces", "logs")
SUPPORTED_PROTOCOL = "http/protobuf"
DEFAULT_EXPORT_INTERVAL_S = 60.0  # the specification's default for OTEL_METRIC_EXPORT_INTERVAL
DEFAULT_TIMEOUT_S = 10.0  # and for OTEL_EXPORTER_OTLP_TIMEOUT
DEFAULT_QUEUE_SIZE = 2048


class OtelSettingsError(Exception):
    """The `otel:` section or an `OTEL_*` variable cannot be used; the message names it and the fix."""


def _check_endpoint(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{url}' is not an http(s) URL; e.g. http://otel-collector:4318")
    return url.rstrip("/")


Endpoint = Annotated[str | None, AfterValidator(_check_endpoint)]


class OtelConfig(MaskedHeadersModel):
    """`otel:`: export over OTLP. Off unless `endpoint` or `OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT` is set."""

    endpoint: Endpoint = Field(
        None,
        description="Base URL of the OTLP/HTTP receiver, e.g. `http://otel-collector:4318`; each signal is sent "
        "to `/v1/metrics`, `/v1/traces`, `/v1/logs` under it. Unset: `OTEL_EXPORTER_OTLP_ENDPOINT` (or its "
        "per-signal variant) decides, and export is off when neither is set.",
    )
    protocol: Literal["http/protobuf"] | None = Field(
        None,
        description="OTLP transport. Only `http/protobuf` (every Collector's `otlp` receiver takes it on port "
        "4318); unset: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`.",
    )
    headers: Headers = Field(
        default_factory=dict,
        description="HTTP headers sent with every export (an API key: `DD-API-KEY: ${DD_API_KEY}`). Values are "
        "treated as secrets: never logged. Merged over `OTEL_EXPORTER_OTLP_HEADERS`.",
    )
    header_files: dict[str, Path] = Field(
        default_factory=dict,
        description="Headers whose value is read from a file (a Kubernetes secret volume, systemd "
        "`LoadCredential`), e.g. `Authorization: /run/secrets/otlp-auth`.",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=300,
        description="Seconds allowed per export request, for every signal. Unset: each signal's "
        "`OTEL_EXPORTER_OTLP_{METRICS,TRACES,LOGS}_TIMEOUT`, then `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds, "
        "as the specification says), else 10.",
    )
    export_interval_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="Seconds between metric exports. Unset: `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds), "
        "else 60. `once` exports what it measured before it exits, whatever this is.",
    )
    temporality: Literal["cumulative", "delta"] | None = Field(
        None,
        description="Aggregation temporality of counters and histograms (`delta` for Datadog, New Relic). Unset: "
        "`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`, else `cumulative`.",
    )
    resource_attributes: dict[str, str] = Field(
        default_factory=dict,
        description="Resource attributes on everything exported, merged over `OTEL_RESOURCE_ATTRIBUTES`; "
        "`service.name` defaults to `OTEL_SERVICE_NAME`, else `ttft-monitor`.",
    )
    traces: bool = Field(
        False,
        description="Also export one CLIENT span per probe (docs/opentelemetry.md).",
    )
    logs: bool = Field(
        True,
        description="Also export incidents (opened, resolved) as log records.",
    )
    queue_size: int = Field(
        DEFAULT_QUEUE_SIZE,
        ge=16,
        le=1_000_000,
        description="Spans and log records held for export at most; past it the oldest is dropped and counted "
        "(`ttft_monitor_otel_dropped_total`), so a collector that is away never holds up a probe.",
    )


@dataclass(frozen=True)
class Resolved:
    """What export does: one endpoint per signal (None: that signal is not exported)."""

    endpoints: dict[str, str | None]
    headers: dict[str, dict[str, str]]
    timeout_s: float
    export_interval_s: float
    temporality: Literal["cumulative", "delta"]
    resource: dict[str, str]
    queue_size: int
    secrets: tuple[str, ...] = field(default=())
    # Per signal, from OTEL_EXPORTER_OTLP_{SIGNAL}_TIMEOUT; `timeout_s` for the others.
    signal_timeouts_s: dict[str, float] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return any(url is not None for url in self.endpoints.values())

    def timeout_for(self, signal: str) -> float:
        """Seconds allowed per export request of `signal`."""
        return self.signal_timeouts_s.get(signal, self.timeout_s)

    @property
    def close_bound_s(self) -> float:
        """How long the last exports may take at exit: each exported signal's timeout, one after the other."""
        return sum(self.timeout_for(s) for s, url in self.endpoints.items() if url is not None) + 1


def parse_key_values(text: str, *, variable: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (values percent-decoded), the W3C Baggage-like form of OTEL_*_HEADERS and
    OTEL_RESOURCE_ATTRIBUTES."""
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never quote the item: it may be `Authorization=Bearer ...`.
            raise OtelSettingsError(f"{variable}: an entry is not key=value; write it as key1=value1,key2=value2")
        out[unquote(key.strip())] = unquote(value.strip())
    return out


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _millis(environ: Mapping[str, str], name: str) -> float | None:
    raw = _env(environ, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise OtelSettingsError(f"{name}={raw!r} is not a number of milliseconds") from None
    if not 0 < value <= 3_600_000:
        raise OtelSettingsError(f"{name}={raw!r}: milliseconds must be above 0 and at most 3600000")
    return value / 1000


def _signal_path(base: str, signal: str) -> str:
    return f"{base.rstrip('/')}/v1/{signal}"


def read_header_files(files: Mapping[str, Path]) -> dict[str, str]:
    """The values of `otel.header_files`, read now; OtelSettingsError naming the key when one cannot be."""
    from monitor.config.secrets import SecretError, read_secret_file

    out: dict[str, str] = {}
    for name, path in files.items():
        try:
            out[name] = read_secret_file(Path(path).expanduser(), field=f"otel.header_files.{name}", origin="")
        except SecretError as exc:
            raise OtelSettingsError(f"otel.header_files.{name}: {str(exc).strip()}") from None
    return out


def resolve(
    config: OtelConfig,
    environ: Mapping[str, str],
    *,
    file_headers: Mapping[str, str] | None = None,
    service_version: str = "",
) -> Resolved | None:
    """What export does, or None when it is off (no endpoint anywhere, or `OTEL_SDK_DISABLED=true`)."""
    if (_env(environ, "OTEL_SDK_DISABLED") or "").lower() == "true":
        return None
    endpoints: dict[str, str | None] = {}
    headers: dict[str, dict[str, str]] = {}
    general_headers = parse_key_values(
        _env(environ, "OTEL_EXPORTER_OTLP_HEADERS") or "", variable="OTEL_EXPORTER_OTLP_HEADERS"
    )
    for signal in SIGNALS:
        upper = signal.upper()
        own = _env(environ, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        general = _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
        if config.endpoint is not None:
            endpoints[signal] = _signal_path(config.endpoint, signal)
        elif own is not None:
            endpoints[signal] = own  # a per-signal URL is used as given, path included
        elif general is not None:
            endpoints[signal] = _signal_path(general, signal)
        else:
            endpoints[signal] = None
        protocol = (
            config.protocol
            or _env(environ, f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
            or _env(environ, "OTEL_EXPORTER_OTLP_PROTOCOL")
            or SUPPORTED_PROTOCOL
        )
        if endpoints[signal] is not None and protocol != SUPPORTED_PROTOCOL:
            raise OtelSettingsError(
                f"OTLP protocol {protocol!r} is not supported; set otel.protocol (or OTEL_EXPORTER_OTLP_PROTOCOL) "
                f"to {SUPPORTED_PROTOCOL} and point the endpoint at the Collector's OTLP/HTTP port (4318)"
            )
        own_headers = parse_key_values(
            _env(environ, f"OTEL_EXPORTER_OTLP_{upper}_HEADERS") or "", variable=f"OTEL_EXPORTER_OTLP_{upper}_HEADERS"
        )
        headers[signal] = {**general_headers, **own_headers, **config.headers, **(file_headers or {})}
    for signal, url in endpoints.items():
        if url is not None and config.endpoint is None:
            try:
                _check_endpoint(url)
            except ValueError as exc:
                raise OtelSettingsError(f"the OTLP {signal} endpoint from the environment: {exc}") from None
    if not config.traces:
        endpoints["traces"] = None
    if not config.logs:
        endpoints["logs"] = None
    for signal in SIGNALS:
        # OTEL_{METRICS,TRACES,LOGS}_EXPORTER: `none` turns a signal off, `otlp` (the default) keeps it.
        variable = f"OTEL_{signal.upper()}_EXPORTER"
        chosen = [e.strip().lower() for e in (_env(environ, variable) or "otlp").split(",") if e.strip()]
        if chosen == ["none"]:
            endpoints[signal] = None
        elif any(e != "otlp" for e in chosen):
            raise OtelSettingsError(
                f"{variable}={_env(environ, variable)!r}: ttft-monitor exports over OTLP only; set it to otlp, "
                "or to none to turn that signal off"
            )
    if not any(url is not None for url in endpoints.values()):
        return None
    timeout = config.timeout_s or _millis(environ, "OTEL_EXPORTER_OTLP_TIMEOUT") or DEFAULT_TIMEOUT_S
    signal_timeouts: dict[str, float] = {}
    if config.timeout_s is None:  # the config's timeout is for every signal
        for signal in SIGNALS:
            own_timeout = _millis(environ, f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT")
            if own_timeout is not None:
                signal_timeouts[signal] = own_timeout
    interval = config.export_interval_s or _millis(environ, "OTEL_METRIC_EXPORT_INTERVAL") or DEFAULT_EXPORT_INTERVAL_S
    preference = (_env(environ, "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") or "cumulative").lower()
    temporality = config.temporality or ("delta" if preference in ("delta", "lowmemory") else "cumulative")
    resource = parse_key_values(_env(environ, "OTEL_RESOURCE_ATTRIBUTES") or "", variable="OTEL_RESOURCE_ATTRIBUTES")
    resource.setdefault("service.name", _env(environ, "OTEL_SERVICE_NAME") or "ttft-monitor")
    if service_version:
        resource.setdefault("service.version", service_version)
    resource.update(config.resource_attributes)
    from monitor.redact import url_credentials

    secret_values = {value for per_signal in headers.values() for value in per_signal.values() if value}
    secret_values.update(c for url in endpoints.values() if url for c in url_credentials(url) if c)
    return Resolved(
        endpoints=endpoints,
        headers=headers,
        timeout_s=timeout,
        export_interval_s=interval,
        temporality=temporality,
        resource=resource,
        queue_size=config.queue_size,
        secrets=tuple(sorted(secret_values)),
        signal_timeouts_s=signal_timeouts,
    )


def header_secrets(config: OtelConfig, environ: Mapping[str, str]) -> list[str]:
    """Every header value export may send, for the log redactor; an unreadable setting gives none
    (opening export reports it)."""
    try:
        files = read_header_files(config.header_files)
        resolved = resolve(config, environ, file_headers=files)
    except OtelSettingsError:
        return list(config.headers.values())
    return list(resolved.secrets) if resolved is not None else list(config.headers.values())
