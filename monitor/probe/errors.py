"""Error classification: what went wrong with a probe, as one `ErrorClass` and a message saying what to do.

Pure functions of what the client saw (a status and body text, an aiohttp exception, a redirect);
messages never carry the key (`redact`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence

import aiohttp
from aiohttp.client_exceptions import (
    ClientConnectorCertificateError,
    ClientConnectorError,
    ClientConnectorSSLError,
    ClientSSLError,
)
from yarl import URL

from monitor.probe.apis import MalformedEvent
from monitor.probe.endpoint import Endpoint, Timeouts
from monitor.probe.proxy import ProxyRoute
from monitor.probe.result import ErrorClass
from monitor.probe.sse import SSEError
from monitor.redact import redact
from monitor.servertext import SERVER_TEXT_CAP, QuotesServer, capped

# 307 and 308 repeat the POST; 301, 302 and 303 would turn it into a GET, which is no probe.
REPEATING_REDIRECTS = frozenset({307, 308})
MAX_REDIRECTS = 5


class BodyDecodeError(QuotesServer, Exception):
    """A compressed body that cannot be decoded (PROTOCOL) or decodes past the bound (MALFORMED_STREAM)."""

    def __init__(self, error: ErrorClass, message: str, *, quote: str = "") -> None:
        super().__init__(message)
        self.error = error
        self.quote_text, self.quote_limit, self.quote_repr = quote, 40, False


class Deadline(Exception):
    """A phase's deadline passed (`error` says which), found where the wait was, not by `asyncio.timeout`."""

    def __init__(self, error: ErrorClass) -> None:
        self.error = error


BAD_BODY = (MalformedEvent, SSEError, BodyDecodeError)


def bad_body(exc: Exception, secrets: Sequence[str | None]) -> tuple[ErrorClass, str]:
    if isinstance(exc, BodyDecodeError):
        return exc.error, redact(exc.describe(secrets), secrets)
    detail = exc.describe(secrets) if isinstance(exc, MalformedEvent) else str(exc)
    return ErrorClass.MALFORMED_STREAM, redact(f"malformed stream: {detail}", secrets)


STATUS_HINTS = {
    ErrorClass.AUTH: "check the API key (api_key_env / api_key_file) and that it is allowed this model",
    ErrorClass.MODEL_NOT_FOUND: "check the model name (ask GET /v1/models) and the provider's base_url",
    ErrorClass.RATE_LIMITED: "the provider is throttling; lower rounds or concurrency, or probe less often",
    ErrorClass.BAD_REQUEST: "the server rejected the request; check params.extra_body and "
    "params.reasoning_effort (docs/cost.md lists each model's least), or set include_usage: false if it "
    "rejects stream_options",
    ErrorClass.SERVER_ERROR: "the server failed; this is the provider's side",
}


def server_message(text: str, secrets: Sequence[str | None]) -> str:
    """The message in an error body (JSON or not), redacted, on one line and capped (`capped`)."""
    return capped(_body_message(text), SERVER_TEXT_CAP, secrets)


def _body_message(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split()) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err.get("type") or err)
        if isinstance(err, str):
            return err
        detail = obj.get("detail") or obj.get("message")
        if detail:
            return str(detail)
    return text


def classify_status(status: int, message: str) -> ErrorClass:
    lowered = message.lower()
    if status in (401, 403):
        return ErrorClass.AUTH
    if status == 404:
        return ErrorClass.MODEL_NOT_FOUND
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status >= 500:
        return ErrorClass.SERVER_ERROR
    if "model" in lowered and ("not exist" in lowered or "not found" in lowered or "unknown" in lowered):
        return ErrorClass.MODEL_NOT_FOUND
    return ErrorClass.BAD_REQUEST


def timeout_message(phase: ErrorClass, timeouts: Timeouts, tokens: int) -> str:
    if phase is ErrorClass.TIMEOUT_CONNECT:
        return f"no connection within {timeouts.connect:g} s; check the host and port, or raise timeout_s.connect"
    if phase is ErrorClass.TIMEOUT_FIRST_TOKEN:
        return (
            f"no token within {timeouts.first_token:g} s of sending; the server is overloaded or hung, "
            "or raise timeout_s.first_token for long prompts"
        )
    return (
        f"the stream did not finish within {timeouts.total:g} s ({tokens} tokens so far); lower "
        "max_tokens or raise timeout_s.total"
    )


def no_head_message(timeouts: Timeouts) -> str:
    return (
        f"connected, but no response headers within {timeouts.first_token:g} s of sending; the server "
        "accepted the request and never answered (overloaded or hung), or raise timeout_s.first_token"
    )


def redirect_target(resp: aiohttp.ClientResponse) -> URL | None:
    location = resp.headers.get("Location")
    if not 300 <= resp.status < 400 or not location:
        return None
    try:
        return resp.url.join(URL(location))
    except ValueError:
        return None


def redirect_message(resp: aiohttp.ClientResponse, endpoint: Endpoint) -> str:
    status = resp.status
    target = redirect_target(resp)
    if target is None:
        return f"HTTP {status} redirect without a usable Location; check base_url"
    where = f"HTTP {status} redirect to {target}"
    if not endpoint.follow_redirects:
        return f"{where}; point base_url there, or set follow_redirects: true for this provider"
    if status not in REPEATING_REDIRECTS:
        return f"{where}, which would turn the POST into a GET; point base_url there (only 307 and 308 are followed)"
    return f"{where} after {MAX_REDIRECTS} redirects already followed; point base_url at the final address"


def proxy_refused(status: int, proxy: ProxyRoute, host: str) -> tuple[ErrorClass, str]:
    """The proxy, not the server, answered `status` (a refused CONNECT, or a 407 to a forwarded request)."""
    if status == 407:
        return ErrorClass.AUTH, (
            f"the proxy {proxy.address} ({proxy.source}) wants credentials (HTTP 407); set proxy.username with "
            "proxy.password_env or proxy.password_file, or the user and password in the proxy URL"
        )
    return ErrorClass.CONNECT, (
        f"the proxy {proxy.address} ({proxy.source}) refused to reach {host} (HTTP {status}); check that it "
        "allows this host and port, or list the host in proxy.no_proxy / NO_PROXY"
    )


def classify_request_error(exc: aiohttp.ClientError, endpoint: Endpoint) -> tuple[ErrorClass, str]:
    host = endpoint.base_url
    dns_error = getattr(aiohttp, "ClientConnectorDNSError", None)
    if (dns_error is not None and isinstance(exc, dns_error)) or isinstance(
        getattr(exc, "os_error", None), socket.gaierror
    ):
        return ErrorClass.DNS, f"cannot resolve the host of {host}; check the hostname in base_url"
    if isinstance(exc, ClientConnectorCertificateError):
        return ErrorClass.TLS, (
            f"TLS certificate of {host} not trusted ({exc.certificate_error}); set tls.ca_file to the CA that signed it"
        )
    if isinstance(exc, (ClientConnectorSSLError, ClientSSLError)):
        return ErrorClass.TLS, f"TLS handshake with {host} failed; check that the port speaks https"
    proxy = endpoint.proxy
    if isinstance(exc, aiohttp.ClientProxyConnectionError) and proxy is not None:
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return ErrorClass.CONNECT, (
            f"cannot connect to the proxy {proxy.address} ({proxy.source}) for {host}: {reason}; check the "
            "provider's proxy settings or the environment's HTTPS_PROXY / HTTP_PROXY / NO_PROXY"
        )
    if isinstance(exc, aiohttp.ClientHttpProxyError) and proxy is not None:
        return proxy_refused(exc.status, proxy, host)
    if isinstance(exc, ClientConnectorError):
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return ErrorClass.CONNECT, f"cannot connect to {host}: {reason}; is the server running on that port?"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ErrorClass.CONNECT, f"{host} closed the connection before answering"
    if isinstance(exc, aiohttp.ClientResponseError):
        # aiohttp's parser refused the response head: a bad status line, oversized or broken headers.
        secrets = (endpoint.api_key, *endpoint.secrets)
        detail = capped(" ".join(str(exc.message).split()), 200, secrets) or type(exc).__name__
        return ErrorClass.PROTOCOL, redact(
            f"{host} answered with broken HTTP ({detail}); the port may speak another protocol, "
            "or a proxy in between garbles responses",
            secrets,
        )
    return ErrorClass.CONNECT, f"request to {host} failed: {type(exc).__name__}"
