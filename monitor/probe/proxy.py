"""Which forward proxy, if any, an outbound request goes through: one policy for every client.

Every client that leaves the process (probes, `server_metrics_url` scrapes, alert receivers, the
Pushgateway push, and any exporter added later) asks `route_for(url, settings, environment)` and
sends where it answers, never letting its HTTP library guess (aiohttp's `trust_env` stays off):

1. Loopback (`localhost`, `*.localhost`, 127.0.0.0/8, ::1) is never proxied: a proxy cannot reach
   this machine's loopback, and answering for it would only hide a local receiver behind a 502.
2. A host in the settings' `no_proxy`, or (when `environment` is on) in `NO_PROXY`, goes direct.
3. The settings' `url`, when set, is the proxy.
4. Else, with `environment` on (the default), `HTTPS_PROXY` for https:// and `HTTP_PROXY` for http://
   (the lower-case names win, as with curl); else direct.

The environment is honoured by default because it is how a host behind an egress proxy is set up
(systemd `Environment=`, Kubernetes `env:`), and the issue this answers was a host where alerts went
through it and probes did not: one rule for every client keeps them in agreement. A probe that went
through a proxy records it (`Sample.via_proxy`): its connect phase is then the proxy's, so a
measurement never includes a proxy hop unannounced. `proxy: {environment: false}` goes direct.

Pure: the environment is read once at the edge (`ProxyEnvironment.from_environ`) and handed in.
No aiohttp here, so the config models import it cheaply.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator

from monitor.config.fields import ConfigModel, EnvName, UserPath
from monitor.redact import url_credentials

PROXY_SCHEMES = ("http", "https")


def proxy_url_problem(url: str) -> str | None:
    """Why `url` cannot be a forward proxy's address, or None. Never quotes a password."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        return "is not a URL; write e.g. http://proxy.internal:3128"
    if parts.scheme not in PROXY_SCHEMES or not parts.hostname or not port_ok:
        scheme = parts.scheme or "no scheme"
        return (
            f"is not an http:// or https:// proxy URL ({scheme}); write e.g. http://proxy.internal:3128 "
            "(SOCKS proxies are not supported)"
        )
    return None


class ProxySettings(ConfigModel):
    """A provider's or receiver's `proxy:` section. The password itself never lives in a field."""

    url: str | None = Field(
        None,
        description="Forward proxy for this destination, `http://HOST:PORT` (or https://). Unset: the "
        "environment decides (see `environment`). Credentials: `username` with `password_env` or "
        "`password_file`, or `http://user:${PROXY_PASSWORD}@proxy:3128`; never logged.",
    )
    username: str | None = Field(None, description="User name for the proxy's Basic authentication.")
    password_env: EnvName = Field(
        None, description="Name of the environment variable holding the proxy password; `NAME_FILE` works too."
    )
    password_file: UserPath | None = Field(
        None, description="File holding the proxy password (surrounding whitespace is stripped)."
    )
    environment: bool = Field(
        True,
        description="Honour `HTTPS_PROXY`/`HTTP_PROXY` (when `url` is unset) and `NO_PROXY`. Off: direct "
        "unless `url` is set. Loopback is never proxied either way (docs/failure-modes.md, proxies).",
    )
    no_proxy: list[str] = Field(
        default_factory=list,
        description="Hosts reached directly, as in `NO_PROXY`: `example.com` (and its subdomains), "
        "`10.0.0.0/8`, `host:8443`, `*`.",
    )

    _password: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        problem = proxy_url_problem(url)
        if problem is not None:
            raise ValueError(f"the proxy URL {problem}")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _check_credentials(self) -> ProxySettings:
        if self.password_env is not None and self.password_file is not None:
            raise ValueError("set either password_env or password_file, not both")
        if (self.password_env is not None or self.password_file is not None) and self.username is None:
            raise ValueError("a proxy password needs its username: set username")
        if self.username is not None and ":" in self.username:
            raise ValueError("the proxy username may not contain ':' (Basic authentication separates with it)")
        return self

    def password(self) -> str | None:
        """The password resolved by `load_config`, or None."""
        return self._password

    def with_password(self, password: str | None) -> ProxySettings:
        copy = self.model_copy()
        copy._password = password
        return copy

    def secrets(self) -> tuple[str, ...]:
        found = [self._password, *(url_credentials(self.url) if self.url else [])]
        return tuple(value for value in found if value)


DIRECT = ProxySettings()  # what a destination without a `proxy:` section follows


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """Where one request goes first: the proxy's URL (no credentials in it) and its credentials."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = "config"  # or the environment variable it came from: safe to print

    @property
    def address(self) -> str:
        """`host:port` of the proxy, fit to print."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"

    def secrets(self) -> tuple[str, ...]:
        return tuple(value for value in (self.password,) if value)


@dataclass(frozen=True, slots=True)
class ProxyEnvironment:
    """The proxy variables of the process's environment, read once at start."""

    http: str | None = None
    https: str | None = None
    no_proxy: tuple[str, ...] = ()
    # (variable, why) for values that cannot be used: reported once at start, then ignored.
    ignored: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ProxyEnvironment:
        chosen: dict[str, str | None] = {}
        ignored: list[tuple[str, str]] = []
        for kind in ("http", "https"):
            value, name = None, None
            for candidate in (f"{kind}_proxy", f"{kind.upper()}_PROXY"):
                if environ.get(candidate, "").strip():
                    value, name = environ[candidate].strip(), candidate
                    break
            if value is not None and name is not None:
                # A bare `proxy:3128` is what curl and Go accept too: it means http://.
                if "://" not in value:
                    value = f"http://{value}"
                problem = proxy_url_problem(value)
                if problem is not None:
                    ignored.append((name, f"its value {problem}"))
                    value = None
            chosen[kind] = value
        raw_no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
        return cls(
            http=chosen["http"],
            https=chosen["https"],
            no_proxy=parse_no_proxy(raw_no_proxy),
            ignored=tuple(ignored),
        )

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for url in (self.http, self.https) if url for s in url_credentials(url))


def parse_no_proxy(value: str | Iterable[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    return tuple(entry.strip().lower() for entry in items if entry.strip())


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def bypassed(host: str, port: int, entries: Iterable[str]) -> bool:
    """Whether `host:port` matches a NO_PROXY entry: `*`, a domain (its subdomains too, a leading `.` or
    `*.` optional), an IP address or CIDR range, each optionally with `:port`."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address: Any = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        if entry == "*":
            return True
        name, entry_port = _split_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.removeprefix("*").removeprefix(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:8080
        inside, _, rest = entry[1:].partition("]")
        return inside, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        return name, int(port) if port.isdigit() else None
    return entry, None


def _route(proxy_url: str, *, username: str | None, password: str | None, source: str) -> ProxyRoute:
    parts = urlsplit(proxy_url)
    if parts.username is not None:
        username = username or unquote(parts.username)
        password = password or (unquote(parts.password) if parts.password is not None else None)
    netloc = parts.netloc.rpartition("@")[2]
    return ProxyRoute(f"{parts.scheme}://{netloc}", username, password, source)


def aiohttp_proxy_options(
    route: ProxyRoute | None, url: str, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The `headers=`, `proxy=` and `proxy_headers=` arguments of an aiohttp request to `url` by `route`.

    Basic credentials go as a header (aiohttp 3.14 deprecates its BasicAuth): with the CONNECT for an
    https:// destination (aiohttp sends `proxy_headers` only there, so they never cross the tunnel), in
    the request itself for http://, which the proxy reads and forwards without.
    """
    options: dict[str, Any] = {"headers": dict(headers or {})}
    if route is None:
        return options
    options["proxy"] = route.url
    if route.username is not None:
        token = base64.b64encode(f"{route.username}:{route.password or ''}".encode()).decode()
        if url.startswith("https:"):
            options["proxy_headers"] = {"Proxy-Authorization": f"Basic {token}"}
        else:
            options["headers"]["Proxy-Authorization"] = f"Basic {token}"
    return options


def route_for(url: str, settings: ProxySettings | None, environment: ProxyEnvironment) -> ProxyRoute | None:
    """The proxy a request to `url` goes through, or None for a direct connection (module docstring)."""
    settings = settings if settings is not None else DIRECT
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None  # the client reports the bad URL itself
    if not host or is_loopback_host(host):
        return None
    exclusions = [*parse_no_proxy(settings.no_proxy), *(environment.no_proxy if settings.environment else ())]
    if bypassed(host, port, exclusions):
        return None
    if settings.url is not None:
        return _route(settings.url, username=settings.username, password=settings.password(), source="config")
    if not settings.environment:
        return None
    chosen = environment.https if parts.scheme == "https" else environment.http
    if chosen is None:
        return None
    name = "HTTPS_PROXY" if parts.scheme == "https" else "HTTP_PROXY"
    return _route(chosen, username=None, password=None, source=f"environment {name}")
