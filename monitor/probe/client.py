"""The timed stream: one request, every phase stamped on one monotonic clock.

Stamps are taken when bytes arrive, before any parsing (`aiohttp_hooks`). All phase durations are
measured from the moment the request body is handed to the socket (`sent`), so a sample on a fresh
connection and one on a reused connection measure the same thing; connection set-up (DNS, TCP,
TLS, pool wait) is recorded separately in `dns_ms`, `connect_ms`, `tls_ms` and `setup_ms`.

The body is read by `body.Body`, compressed bodies decoded by `inflate`, and failures classified
by `errors`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import structlog
from yarl import URL

from monitor.probe.aiohttp_hooks import (
    SUPPORTED_AIOHTTP,
    StampingProtocol,
    Stamps,
    TimedConnector,
    aiohttp_supported,
    current_stamps,
    departure,
    head_arrival,
    stale_connection,
    stamping_protocol,
    trace_config,
)
from monitor.probe.apis import RequestParams
from monitor.probe.body import Body, EventReader, estimated_reasoning_tokens
from monitor.probe.endpoint import Endpoint, Timeouts
from monitor.probe.errors import (
    BAD_BODY,
    MAX_REDIRECTS,
    REPEATING_REDIRECTS,
    STATUS_HINTS,
    BodyDecodeError,
    Deadline,
    bad_body,
    classify_request_error,
    classify_status,
    no_head_message,
    proxy_refused,
    redirect_message,
    redirect_target,
    server_message,
    timeout_message,
)
from monitor.probe.inflate import ACCEPT_ENCODING, Inflater, inflater_for
from monitor.probe.proxy import aiohttp_proxy_options
from monitor.probe.result import CHUNK_GAPS_KEPT, ErrorClass, Sample, TimingPath
from monitor.quantile import quantile
from monitor.redact import redact
from monitor.servertext import MESSAGE_CAP, SERVER_TEXT_CAP, capped

# Endpoint and Timeouts are part of the client's interface; they live in `endpoint`, which needs no aiohttp.
__all__ = ["Endpoint", "ProbeClient", "Timeouts"]

# Sample fields holding text that came from the server (or names its URL): a hostile server can echo
# the key into any of them, headers included, so all are redacted, put on one line and capped
# (`capped`, in that order) before a sample is stored, logged or printed; the value is each one's cap.
SERVER_TEXT_FIELDS = {
    "error_message": MESSAGE_CAP,
    "served_model": SERVER_TEXT_CAP,
    "fingerprint": SERVER_TEXT_CAP,
    "request_id": SERVER_TEXT_CAP,
    "retry_after": SERVER_TEXT_CAP,
    "server_timing": SERVER_TEXT_CAP,
}
MAX_ERROR_BODY = 2000


@functools.lru_cache(maxsize=64)
def _connect_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """aiohttp's timeout for one request: only its connect bound (ours bound the rest). ClientTimeout is
    frozen, so one per bound is shared rather than made every probe."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_s)


def _header_number(value: str | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) and number >= 0 else None


def _header_count(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 19 else None


def _record_server_headers(headers: Any, sample: Sample, secrets: Sequence[str | None]) -> None:
    """What the server says about itself, when it does: kept per sample to tell where the time went."""
    get = headers.get

    def _header_text(value: str | None) -> str | None:
        return capped(value, SERVER_TEXT_CAP, secrets) if value else None

    sample.request_id = _header_text(get("x-request-id") or get("request-id"))
    sample.server_processing_ms = _header_number(get("openai-processing-ms"))
    sample.ratelimit_remaining_requests = _header_count(get("x-ratelimit-remaining-requests"))
    sample.ratelimit_remaining_tokens = _header_count(get("x-ratelimit-remaining-tokens"))
    sample.retry_after = _header_text(get("retry-after"))
    sample.server_timing = _header_text(get("server-timing"))


def _tokens(reader: EventReader | None) -> int:
    return len(reader.token_stamps) if reader is not None else 0


def _connected(stamps: Stamps) -> bool:
    return stamps.reused or stamps.conn_end is not None or stamps.sent is not None


def _ms(start: int | None, end: int | None) -> float | None:
    """Milliseconds between two monotonic stamps (ns), to the microsecond: the resolution the durations are
    stored with (int4 microseconds, monitor/store/types.py), so what the probe reports, exports and stores
    is one value. (The kernel stamps bytes to the microsecond anyway.)"""
    if start is None or end is None:
        return None
    return round((end - start) / 1e3) / 1e3


def _to_microsecond(ms: float | None) -> float | None:
    """A duration in ms made of several stamps (a quantile of gaps) to the microsecond, as `_ms` gives them."""
    return None if ms is None else round(ms * 1000) / 1000


def _timed_session(*, fresh: bool, kernel_stamps: bool) -> aiohttp.ClientSession:
    connector = TimedConnector(
        kernel_stamps=kernel_stamps,
        limit=0,  # concurrency is capped by the caller, per provider, where it is configured
        force_close=fresh,
        use_dns_cache=not fresh,
        enable_cleanup_closed=False,
    )
    # trust_env stays off: the proxy is the endpoint's (monitor.probe.proxy), never the library's guess.
    return aiohttp.ClientSession(
        connector=connector,
        trace_configs=[trace_config()],
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
    )


class RequestTracing(Protocol):
    """Headers that let a traced server join the probe's trace (W3C `traceparent`), per sample."""

    def headers_for(self, sample: Sample) -> Mapping[str, str]: ...


class ProbeClient:
    """Owns the HTTP session. `fresh=True` opens a new connection (and DNS lookup) per sample.

    `kernel_stamps` (default on): where the kernel stamps arrivals (Linux), bytes are timed by the
    kernel's stamp, not by when the probes' loop read them (kernel_clock.py).
    """

    def __init__(
        self, *, fresh: bool = False, kernel_stamps: bool = True, tracing: RequestTracing | None = None
    ) -> None:
        self.fresh = fresh
        self._tracing = tracing
        self._fallback_logged = False
        self.kernel_stamps = kernel_stamps
        self._session = _timed_session(fresh=fresh, kernel_stamps=kernel_stamps)
        # Opened on the first stale pooled connection: a retry must not take another pooled one, which
        # the server has likely closed at the same moment (its keep-alive timeout ran out for all alike).
        self._retry: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        await self._session.close()
        if self._retry is not None:
            await self._retry.close()

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def probe(self, endpoint: Endpoint, params: RequestParams, prompt: str, sample: Sample) -> Sample:
        """Send one streaming request and fill `sample` in place. Never raises for a failed probe."""
        body = json.dumps(endpoint.flavor.build_body(prompt, params), ensure_ascii=False).encode()
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Accept-Encoding": ACCEPT_ENCODING,  # said outright, not left to the HTTP library's default
            **endpoint.headers,
            **endpoint.flavor.auth_headers(endpoint.api_key),
        }
        if self._tracing is not None:
            headers.update(self._tracing.headers_for(sample))
        sample.prompt_chars = len(prompt)
        sample.via_proxy = endpoint.proxy is not None
        stamps = Stamps()
        token = current_stamps.set(stamps)
        try:
            fallback: list[str] = []
            await self._run(endpoint, endpoint.url_for(params), body, headers, stamps, sample, fallback)
        finally:
            current_stamps.reset(token)
        # Servers echo keys back, in any encoding; nothing of the endpoint's secrets is stored.
        secrets = (endpoint.api_key, *endpoint.secrets)
        for name, limit in SERVER_TEXT_FIELDS.items():
            if value := getattr(sample, name):
                setattr(sample, name, capped(value, limit, secrets))
        if sample.timing_path is TimingPath.TASK_READ and not self._fallback_logged:
            self._fallback_logged = True  # once per client, not per sample
            supported = aiohttp_supported(aiohttp.__version__)
            structlog.get_logger().warning(
                "probe_timing_fallback",
                timing_path=sample.timing_path.value,
                aiohttp=aiohttp.__version__,
                supported=SUPPORTED_AIOHTTP,
                connection="reused" if sample.connection_reused else "fresh",
                tls=endpoint.base_url.startswith("https:"),
                reason=(fallback[0] if fallback else "some body bytes had no arrival stamp")
                + "; those got the time the probe's task read them, later than arrival under load "
                "(each sample records its timing_path)",
                fix=(
                    f"aiohttp {aiohttp.__version__} is inside the supported range {SUPPORTED_AIOHTTP}: this is a "
                    "bug of the probe's hooks (monitor/probe/aiohttp_hooks.py); report it with this line"
                    if supported
                    else f"aiohttp {aiohttp.__version__} is outside the range the hooks were checked on: "
                    f"install aiohttp{SUPPORTED_AIOHTTP} (pyproject.toml pins it); "
                    "tests/integration/test_aiohttp_contract.py names the hook"
                ),
            )
        return sample

    async def _run(
        self,
        endpoint: Endpoint,
        url: str,
        body: bytes,
        headers: dict[str, str],
        stamps: Stamps,
        sample: Sample,
        fallback: list[str],
    ) -> None:
        """Probe into `sample`; `fallback` gets what made it fall back to task-read times, if it did."""
        timeouts = endpoint.timeouts
        secrets = (endpoint.api_key, *endpoint.secrets)
        loop = asyncio.get_running_loop()
        sample.sent_at = datetime.now(UTC)
        stamps.request_start = time.perf_counter_ns()
        start_loop_time = loop.time()
        phase = ErrorClass.TIMEOUT_CONNECT
        reader: EventReader | None = None
        stream: Body | None = None
        headers_at: int | None = None
        stamping: StampingProtocol | None = None
        try:
            async with asyncio.timeout_at(start_loop_time + timeouts.first_token) as deadline:
                resp = await self._send(endpoint, url, body, headers, stamps, sample)
                stamping = stamping_protocol(resp)
                sample.timing_path = TimingPath.STAMPED if stamping is not None else TimingPath.TASK_READ
                headers_at = head_arrival(resp, stamping)
                phase = ErrorClass.TIMEOUT_FIRST_TOKEN
                async with resp:
                    sample.http_status = resp.status
                    _record_server_headers(resp.headers, sample, secrets)
                    if resp.status >= 400:
                        await self._record_http_error(resp, endpoint, sample)
                        return
                    if 300 <= resp.status < 400:
                        sample.error = ErrorClass.REDIRECT
                        sample.error_message = redact(redirect_message(resp, endpoint), secrets)
                        return
                    ctype = resp.headers.get("Content-Type", "")
                    if "text/event-stream" not in ctype:
                        sample.error = ErrorClass.MALFORMED_STREAM
                        sample.error_message = (
                            f"server answered {resp.status} with {ctype or 'no content type'}, not an event "
                            "stream; check that the endpoint supports stream: true and the base_url is right"
                        )
                        return
                    reader = EventReader(endpoint.flavor, sample, secrets)
                    stream = Body(resp, reader, stamping, inflater_for(resp))
                    # The first-token deadline is checked by `stream.read`; this one now bounds the total.
                    phase = ErrorClass.TIMEOUT_TOTAL
                    deadline.reschedule(start_loop_time + timeouts.total)
                    await stream.read(first_token_by=start_loop_time + timeouts.first_token)
        except TimeoutError:
            if stream is not None and stream.failure is not None:
                # What arrived before the deadline was malformed: that is the outcome, not the wait.
                sample.error, sample.error_message = bad_body(stream.failure, secrets)
            elif reader is None or not reader.stopped:  # else an error event came first: that is the outcome
                if phase is ErrorClass.TIMEOUT_CONNECT and _connected(stamps):
                    # Connected and sent, but no response head by the first-token deadline: the wait
                    # was the server's, under that deadline, not the connect timeout's.
                    sample.error = ErrorClass.TIMEOUT_FIRST_TOKEN
                    sample.error_message = no_head_message(timeouts)
                else:
                    sample.error = phase
                    sample.error_message = timeout_message(phase, timeouts, _tokens(reader))
        except Deadline as exc:
            sample.error = exc.error
            sample.error_message = timeout_message(exc.error, timeouts, _tokens(reader))
        except BAD_BODY as exc:
            sample.error, sample.error_message = bad_body(exc, secrets)
        except aiohttp.ClientError as exc:
            if headers_at is None:
                sample.error, sample.error_message = classify_request_error(exc, endpoint)
            else:
                sample.error = ErrorClass.STREAM_ERROR
                sample.error_message = (
                    f"the connection broke mid-stream after {_tokens(reader)} tokens "
                    f"({type(exc).__name__}); the server or a proxy cut the response"
                )
        finally:
            if stream is not None and stream.task_read:
                sample.timing_path = TimingPath.TASK_READ
            elif sample.timing_path is TimingPath.STAMPED and stamping is not None and stamping.kernel_stamped:
                sample.timing_path = TimingPath.KERNEL
            self._finish(sample, endpoint, stamps, headers_at, reader)
            kernel = sample.timing_path is TimingPath.KERNEL and stamping is not None
            if kernel and stamping is not None and reader is not None and reader.token_stamps:
                first = reader.token_stamps[0]
                sample.first_token_read_mono_ns = stamping.read_at.get(first)
                # The read before it found no first token: it arrived after that (else after the send).
                earlier = [read for stamp, read in stamping.read_at.items() if stamp < first]
                sample.first_token_unread_since_ns = max(earlier) if earlier else sample.sent_mono_ns
            if sample.timing_path is TimingPath.TASK_READ:
                if stamping is None:
                    fallback.append("the connection's protocol is not the probe's stamping one: nothing was stamped")
                else:
                    count = stream.unstamped_bytes if stream is not None else 0
                    fallback.append(f"{count:,} body bytes arrived without an arrival stamp")

    async def _send(
        self,
        endpoint: Endpoint,
        first_url: str,
        body: bytes,
        headers: dict[str, str],
        stamps: Stamps,
        sample: Sample,
    ) -> aiohttp.ClientResponse:
        """POST and return the response once its head is in; 307/308 followed only when the provider says so.

        aiohttp's own following is off: it turns a POST into a GET on 301/302 and would report the
        new host's answer as the endpoint's.
        """
        timeout = _connect_timeout(endpoint.timeouts.connect)
        url: str | URL = first_url
        for hop in range(MAX_REDIRECTS + 1):
            session = self._session
            while True:
                try:
                    resp = await session.post(
                        url,
                        data=body,
                        ssl=endpoint.ssl,
                        timeout=timeout,
                        allow_redirects=False,
                        **aiohttp_proxy_options(endpoint.proxy, str(url), headers),
                    )
                    break
                except TimeoutError:
                    # aiohttp's own sock_connect timeout; ours surfaces at the caller's `async with` instead.
                    raise Deadline(ErrorClass.TIMEOUT_CONNECT) from None
                except aiohttp.ClientError as exc:
                    # aiohttp repeats only idempotent requests on a pooled connection the server had
                    # closed (its keep-alive timeout crossing our send); a POST that no byte was
                    # answered to is safe to send once more, on a fresh connection, timed anew.
                    if sample.connection_retried or not stale_connection(stamps, exc):
                        raise
                    sample.connection_retried = True
                    stamps.restart()
                    session = self._retry_session()
            target = redirect_target(resp)
            if not endpoint.follow_redirects or target is None or resp.status not in REPEATING_REDIRECTS:
                return resp
            if hop == MAX_REDIRECTS:
                return resp
            resp.release()
            url = target
        raise AssertionError("unreachable")  # pragma: no cover

    def _retry_session(self) -> aiohttp.ClientSession:
        if self._retry is None:
            self._retry = _timed_session(fresh=True, kernel_stamps=self.kernel_stamps)
        return self._retry

    def _finish(
        self,
        sample: Sample,
        endpoint: Endpoint,
        stamps: Stamps,
        headers_at: int | None,
        reader: EventReader | None,
    ) -> None:
        end = time.perf_counter_ns()
        token_stamps = reader.token_stamps if reader is not None else []
        first_event = reader.first_event if reader is not None else None
        first_answer = reader.first_answer if reader is not None else None
        first_tool_call = reader.first_tool_call if reader is not None else None
        done = reader.done if reader is not None else False
        # The clock starts when the request's last byte left: the kernel's transmit stamp where it
        # gives one (a probe held between its write and the send does not move it), else the stamp
        # taken just before the last write.
        departed = departure(stamps, headers_at)
        sample.departure_stamped = departed is not None
        sent = departed if departed is not None else stamps.sent if stamps.sent is not None else stamps.request_start
        sample.sent_mono_ns = sent
        sample.connection_reused = stamps.reused if stamps.conn_start is not None or stamps.reused else None
        if not stamps.reused:
            sample.dns_ms = _ms(stamps.dns_start, stamps.dns_end)
            if stamps.tcp_end is not None:
                sample.connect_ms = _ms(stamps.conn_start, stamps.tcp_end)
                if stamps.conn_end is not None and endpoint.base_url.startswith("https:"):
                    sample.tls_ms = _ms(stamps.tcp_end, stamps.conn_end)
            else:
                sample.connect_ms = _ms(stamps.conn_start, stamps.conn_end)
        sample.setup_ms = _ms(stamps.request_start, sent)
        sample.ttfb_ms = _ms(sent, headers_at)
        sample.first_event_ms = _ms(sent, first_event)
        if token_stamps:
            sample.ttft_ms = _ms(sent, token_stamps[0])
            if sample.timing_path is TimingPath.KERNEL and len(token_stamps) > 1:
                sample.first_token_stamp_exact = token_stamps[1] != token_stamps[0]
            sample.ttfa_ms = _ms(sent, first_answer)
            sample.first_tool_call_ms = _ms(sent, first_tool_call)
            sample.token_events = len(token_stamps)
            if sample.reasoning_tokens is None and reader is not None:
                sample.reasoning_tokens = estimated_reasoning_tokens(
                    reasoning_events=reader.reasoning_events,
                    token_events=len(token_stamps),
                    completion_tokens=sample.completion_tokens,
                )
                sample.reasoning_tokens_estimated = True
            if len(token_stamps) > 1:
                gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(token_stamps)]
                sample.chunk_gaps_ms = tuple(gaps[:CHUNK_GAPS_KEPT])  # before sorting: in arrival order
                gaps.sort()
                sample.gap_p50_ms = _to_microsecond(quantile(gaps, 0.5, presorted=True))
                sample.gap_p95_ms = _to_microsecond(quantile(gaps, 0.95, presorted=True))
                sample.gap_max_ms = _to_microsecond(gaps[-1])
                decode_s = (token_stamps[-1] - token_stamps[0]) / 1e9
                tokens = sample.completion_tokens or len(token_stamps)
                if decode_s > 0 and tokens > 1:
                    sample.decode_tps = (tokens - 1) / decode_s
        sample.total_ms = _ms(sent, end)
        if sample.error is None and sample.http_status is not None and sample.http_status < 400:
            if not token_stamps:
                sample.error = ErrorClass.EMPTY_RESPONSE
                sample.error_message = (
                    "the stream ended without a single generated token"
                    + ("" if done else " and without its end marker")
                    + "; check max_tokens and that the model generates for this prompt"
                )
            elif not done:
                sample.error = ErrorClass.STREAM_ERROR
                sample.error_message = (
                    f"the stream ended after {len(token_stamps)} tokens without its end marker "
                    "([DONE] or message_stop); the server or a proxy cut the response"
                )

    async def _record_http_error(self, resp: aiohttp.ClientResponse, endpoint: Endpoint, sample: Sample) -> None:
        try:
            raw = await resp.content.read(MAX_ERROR_BODY)
        except aiohttp.ClientError:
            raw = b""
        try:
            inflater = inflater_for(resp)
            if inflater is not None:
                raw = next(Inflater(inflater.encoding, step=MAX_ERROR_BODY).feed(raw), b"")
        except BodyDecodeError:
            raw = b"(a compressed body that does not decode)"
        text = raw.decode("utf-8", errors="replace")
        secrets = (endpoint.api_key, *endpoint.secrets)
        message = server_message(text, secrets)
        status = resp.status
        if status == 407 and endpoint.proxy is not None:
            sample.error, sample.error_message = proxy_refused(status, endpoint.proxy, endpoint.base_url)
            return
        error = classify_status(status, message)
        sample.error = error
        hint = STATUS_HINTS.get(error, "")
        retry_after = sample.retry_after
        if retry_after and error is ErrorClass.RATE_LIMITED:
            hint = f"{hint} (Retry-After: {retry_after})"
        text = f"HTTP {status}: {message}" + (f"; {hint}" if hint else "")
        sample.error_message = redact(text, secrets)
