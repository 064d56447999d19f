"""Small pure checks for the URL-ish strings in the config, and password masking for display."""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

DATABASE_SCHEMES = ("postgresql+asyncpg", "sqlite+aiosqlite")
DATABASE_URL_HINT = (
    "use postgresql+asyncpg://USER:PASSWORD@HOST:5432/DBNAME or sqlite+aiosqlite:///PATH/ttft-monitor.db"
)
# Schemes people write out of habit, and the async driver this daemon needs instead.
_DRIVER_FIXES = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+psycopg": "postgresql+asyncpg",
    "postgresql+psycopg2": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")
_PASSWORD_QUERY_KEYS = {"password", "pass", "pwd"}


def mask_password(url: str) -> str:
    """`url` with any password (in the netloc or a ?password= parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostinfo}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() in _PASSWORD_QUERY_KEYS for key, _ in pairs):
            masked = [(k, "***" if k.lower() in _PASSWORD_QUERY_KEYS else v) for k, v in pairs]
            query = urlencode(masked, safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # untouched; re-joining would also turn sqlite's "///" into "/"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_database_url(url: str) -> str:
    """`url` if it uses one of the async drivers we support, else ValueError naming the fix."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"'{mask_password(url)}' is not a database URL; {DATABASE_URL_HINT}")
    if scheme in DATABASE_SCHEMES:
        return url
    fix = _DRIVER_FIXES.get(scheme.lower())
    if fix:
        raise ValueError(f"database URL scheme '{scheme}://' needs the async driver: write '{fix}://' instead")
    raise ValueError(f"database URL scheme '{scheme}://' is not supported; {DATABASE_URL_HINT}")


def check_http_url(url: str, *, example: str) -> str:
    """`url` without a trailing slash if it is an absolute http(s) URL, else ValueError with `example`."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"'{mask_password(url)}' is not an http:// or https:// URL; write e.g. {example}")
    return url.rstrip("/")


def check_listen_address(address: str) -> str:
    """`address` if it is HOST:PORT (IPv6 hosts in brackets), else ValueError with examples."""
    host, sep, port = address.rpartition(":")
    # Hostnames and IPv4 addresses share one pattern; IPv6 needs brackets so its colons are not the port's.
    host_ok = (host.startswith("[") and host.endswith("]") and ":" in host) or bool(_HOSTNAME.match(host))
    if not sep or not host_ok or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"'{address}' is not HOST:PORT; write e.g. 127.0.0.1:9464, 0.0.0.0:9464 (all interfaces) or [::1]:9464"
        )
    return address


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT is reachable from this machine only (`:9464` and `0.0.0.0:9464` are not)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=1024)  # a pure function of its texts, asked for every probe with the same few
def api_url(base_url: str, path: str) -> str:
    """`path` appended to the path of `base_url`, before its query string, which is kept.

    `https://host/v1?key=K` + `/chat/completions` is `https://host/v1/chat/completions?key=K`; a
    path with its own query (Gemini's `...:streamGenerateContent?alt=sse`) keeps it, first.
    """
    parts = urlsplit(base_url)
    own_path, _, own_query = path.partition("?")
    query = "&".join(part for part in (own_query, parts.query) if part)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + own_path, query, ""))
