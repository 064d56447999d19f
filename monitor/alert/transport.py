"""The one HTTP transport every receiver shares, and how its results are classified.

`ok`: a 2xx. `transient` (worth retrying): timeouts, connection errors, 5xx, 408 and 429 (with the
server's Retry-After). `permanent` (retrying cannot help): every other 4xx, redirects (the URL is
wrong), a URL aiohttp cannot use. The answer excerpt is redacted: servers echo keys and URLs back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from urllib.parse import parse_qsl, urlsplit

import aiohttp

from monitor.alert.model import HttpRequest, Outcome
from monitor.probe.proxy import ProxyEnvironment, ProxySettings, aiohttp_proxy_options, route_for
from monitor.redact import redact
from monitor.servertext import capped

EXCERPT_CHARS = 300
# A server asking for more than this is treated as asking for this; the outbox's age limit rules anyway.
MAX_RETRY_AFTER_S = 3600.0
TRANSIENT_4XX = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class SendResult:
    """What happened to one request: the classification, the HTTP status if any, and the receiver's
    answer (a short, redacted body excerpt, or the connection error)."""

    outcome: Outcome
    status: int | None
    detail: str
    retry_after_s: float | None = None
    duration_ms: float | None = None
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def describe(self) -> str:
        """`HTTP 404 (permanent): no_service`."""
        where = f"HTTP {self.status}" if self.status is not None else "no HTTP answer"
        text = f"{where} ({self.outcome})"
        return f"{text}: {self.detail}" if self.detail else text


def classify_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return "ok"
    if status >= 500 or status in TRANSIENT_4XX:
        return "transient"
    return "permanent"


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date. None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = (moment - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def url_secrets(url: str | None) -> list[str]:
    """Parts of a webhook URL that are credentials: the whole URL, long query values, long path segments."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [url]
    found += [value for _, value in parse_qsl(parts.query) if len(value) >= 8]
    found += [segment for segment in parts.path.split("/") if len(segment) >= 16]
    if parts.password:
        found.append(parts.password)
    return found


def excerpt(body: bytes, secrets: Iterable[str | None]) -> str:
    # The byte bound leaves room: 4 bytes a character at most, before redaction and the cap (`capped`).
    text = " ".join(body[: EXCERPT_CHARS * 4].decode(errors="replace").split())
    return capped(text, EXCERPT_CHARS, secrets)


class Transport:
    """Sends HttpRequests on one aiohttp session. Use as an async context manager (or `close()`)."""

    def __init__(
        self, session: aiohttp.ClientSession | None = None, *, proxies: ProxyEnvironment | None = None
    ) -> None:
        self._session = session
        self._owns_session = session is None
        # The process's HTTP(S)_PROXY / NO_PROXY, read at the edge; none given: none honoured.
        self._proxies = proxies if proxies is not None else ProxyEnvironment()

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No cookies: receivers are independent of each other. No proxy guessing by aiohttp: each
            # request goes where monitor.probe.proxy routes it (loopback never through a proxy).
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def send(
        self,
        request: HttpRequest,
        *,
        timeout_s: float,
        secrets: Iterable[str | None] = (),
        proxy: ProxySettings | None = None,
    ) -> SendResult:
        """Send `request`, give up after `timeout_s` in total, and classify what happened. Never raises
        for network trouble: every failure comes back as a transient or permanent SendResult."""
        route = route_for(request.url, proxy, self._proxies)
        secret_list = [
            *secrets,
            *url_secrets(request.url),
            *self._proxies.secrets(),
            *(route.secrets() if route else ()),
        ]
        started = time.perf_counter_ns()

        def elapsed() -> float:
            return (time.perf_counter_ns() - started) / 1e6

        try:
            async with self._get_session().request(
                request.method,
                request.url,
                data=request.body,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
                **aiohttp_proxy_options(route, request.url, request.headers),
            ) as response:
                body = await response.read()
                status = response.status
                outcome = classify_status(status)
                detail = excerpt(body, secret_list)
                if 300 <= status < 400:
                    outcome = "permanent"
                    detail = "the receiver redirects; put the final URL in the config"
                retry_after = parse_retry_after(response.headers.get("Retry-After")) if outcome == "transient" else None
                return SendResult(outcome, status, detail, retry_after, elapsed(), body)
        except TimeoutError:
            return SendResult("transient", None, f"no answer within {timeout_s:g} s (timeout)", None, elapsed())
        except aiohttp.InvalidURL:
            return SendResult("permanent", None, "the receiver URL is not a valid URL", None, elapsed())
        except (aiohttp.ClientError, OSError) as exc:
            text = redact(str(exc) or type(exc).__name__, secret_list)
            return SendResult("transient", None, f"{type(exc).__name__}: {text}", None, elapsed())
        except ValueError as exc:  # a header value aiohttp refuses: the config, not the network
            text = redact(str(exc), secret_list)
            return SendResult("permanent", None, f"cannot send: {text}", None, elapsed())
