"""What one probe records: the sample, and the fixed set of failure classes."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class ErrorClass(StrEnum):
    """A small fixed set, safe to use as a metric label; free text goes in `error_message`."""

    DNS = "dns"
    CONNECT = "connect"
    TLS = "tls"
    TIMEOUT_CONNECT = "timeout_connect"
    TIMEOUT_FIRST_TOKEN = "timeout_first_token"
    TIMEOUT_TOTAL = "timeout_total"
    PROTOCOL = "protocol"
    REDIRECT = "redirect"
    AUTH = "auth"
    MODEL_NOT_FOUND = "model_not_found"
    RATE_LIMITED = "rate_limited"
    BAD_REQUEST = "bad_request"
    SERVER_ERROR = "server_error"
    STREAM_ERROR = "stream_error"
    MALFORMED_STREAM = "malformed_stream"
    EMPTY_RESPONSE = "empty_response"


class TimingPath(StrEnum):
    """Which clock measured a sample's response: the exact one, or the fallback."""

    # Every byte carries the time the kernel queued it on the socket (kernel_clock.py): what the
    # probes' loop was doing meanwhile is not in it.
    KERNEL = "kernel"
    # Every byte carries the time it arrived, stamped in aiohttp's connection protocol (aiohttp_hooks)
    # when the probes' loop read it (no kernel stamps: not Linux, or the wall clock stepped).
    STAMPED = "stamped"
    # Some bytes carry the time the probe's task read them, later than their arrival under load: the
    # connection's protocol kept no stamps (an aiohttp that moved a hook the client relies on).
    TASK_READ = "task_read"


@dataclass(slots=True)
class Sample:
    """One streamed request. Durations are milliseconds from the request being sent, on one monotonic clock."""

    target: str
    model: str
    api: str
    prompt: str
    round: int
    sample_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    warmup: bool = False
    intended_at: datetime | None = None
    sent_at: datetime | None = None
    # Connection set-up; None when the request rode on a reused connection.
    dns_ms: float | None = None
    connect_ms: float | None = None
    tls_ms: float | None = None
    connection_reused: bool | None = None
    # From the start of the request to its body being handed to the socket: pool wait + set-up.
    setup_ms: float | None = None
    ttfb_ms: float | None = None
    first_event_ms: float | None = None
    ttft_ms: float | None = None
    ttfa_ms: float | None = None
    # First token of a tool call's name or arguments (a forced tool call: tool_choice).
    first_tool_call_ms: float | None = None
    total_ms: float | None = None
    gap_p50_ms: float | None = None
    gap_p95_ms: float | None = None
    gap_max_ms: float | None = None
    decode_tps: float | None = None
    token_events: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Hidden reasoning tokens (part of completion_tokens): as the API reports them, else estimated from the
    # stream's reasoning events (`reasoning_tokens_estimated`); None when neither could say (no tokens).
    reasoning_tokens: int | None = None
    reasoning_tokens_estimated: bool = False
    prompt_tokens_target: int | None = None
    prompt_chars: int | None = None
    served_model: str | None = None
    # What the API says about the configuration that answered (OpenAI's `system_fingerprint`).
    fingerprint: str | None = None
    request_id: str | None = None
    http_status: int | None = None
    # What the server says about itself, when it does (response headers, capped in length).
    server_processing_ms: float | None = None  # openai-processing-ms
    ratelimit_remaining_requests: int | None = None  # x-ratelimit-remaining-requests
    ratelimit_remaining_tokens: int | None = None  # x-ratelimit-remaining-tokens
    retry_after: str | None = None  # seconds or an HTTP date, as sent
    server_timing: str | None = None  # Server-Timing, as sent
    error: ErrorClass | None = None
    error_message: str | None = None
    # The raw monotonic stamp of `sent`, to compare with another process's stamps (benchmarks).
    sent_mono_ns: int | None = None
    # Whether `sent` is the kernel's transmit stamp of the request's last byte (kernel_clock.py), not
    # the probe's own stamp before its last write. Not stored.
    departure_stamped: bool = False
    # None when no response head arrived (nothing was timed from the response).
    timing_path: TimingPath | None = None
    # How late the monitor itself was between `sent` and the last stamp (its event loop's worst lateness,
    # monitor.probe.self_delay); None when nothing measured it. Beyond `probe_self_delay_bound_ms` the
    # sample is `disturbed`: stored and shown, but no evidence for the detector.
    self_delay_ms: float | None = None
    disturbed: bool = False
    # With kernel stamps (timing_path "kernel"): whether the first token's stamp is its own. A late read
    # takes every packet queued meanwhile under the newest one's stamp, so a first token read together
    # with the next one may carry up to the monitor's delay; read alone, its stamp is its arrival.
    # None when unknown (not kernel-stamped, or a single token). Not stored.
    first_token_stamp_exact: bool | None = None
    # With kernel stamps: when the probes' loop read the first token's bytes (monotonic ns). Not stored.
    first_token_read_mono_ns: int | None = None
    # With kernel stamps: the latest moment the first token is known not to have arrived yet (the read of
    # the connection before the one that took it, else the send; monotonic ns). Not stored.
    first_token_unread_since_ns: int | None = None
    # The gaps between consecutive token chunks (ms, in arrival order), for the OpenTelemetry
    # `gen_ai.client.inference.time_per_output_chunk` histogram; the first CHUNK_GAPS_KEPT only, so a
    # long answer costs a bounded list. Not stored: the stored gap_p50/p95/max summarise all of them.
    chunk_gaps_ms: tuple[float, ...] = ()
    # Sent through a forward proxy (monitor.probe.proxy): dns/connect/tls are then the proxy's, not the server's.
    via_proxy: bool = False
    # The first send failed on a reused pooled connection before any byte of the answer (the server had
    # closed it while idle) and was sent again on a fresh one; every phase is timed from that second send.
    connection_retried: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("intended_at", "sent_at"):
            value = out[key]
            out[key] = value.isoformat() if value is not None else None
        out["error"] = self.error.value if self.error is not None else None
        out["timing_path"] = self.timing_path.value if self.timing_path is not None else None
        return out


# At most this many of a sample's chunk gaps are kept on it (`chunk_gaps_ms`): the first ones.
CHUNK_GAPS_KEPT = 256

SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Sample))
