"""What a probe sends to: the endpoint with its secrets, and its timeouts. No I/O here."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from monitor.config.urls import api_url
from monitor.probe.apis import ApiFlavor, RequestParams
from monitor.probe.proxy import ProxyRoute


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 10.0
    first_token: float = 60.0
    total: float = 300.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to send: everything about a provider the probe needs, secrets included."""

    base_url: str
    flavor: ApiFlavor
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    ssl: ssl.SSLContext | bool = True
    # Everything else that must never reach a sample: header values, credentials in base_url.
    secrets: tuple[str, ...] = ()
    follow_redirects: bool = False
    # The forward proxy requests to base_url go through (monitor.probe.proxy.route_for), or None: direct.
    proxy: ProxyRoute | None = None

    @property
    def url(self) -> str:
        return api_url(self.base_url, self.flavor.path)

    def url_for(self, params: RequestParams) -> str:
        """The request URL: the API's path goes before any query in base_url, and the queries merge."""
        return api_url(self.base_url, self.flavor.path_for(params))

    def __repr__(self) -> str:  # never show the key
        return f"Endpoint({self.base_url!r}, {self.flavor.name})"
