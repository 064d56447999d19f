"""From configuration to what the probe needs: endpoints (with their secrets), targets, prompt specs."""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

from monitor.config.models import Config
from monitor.probe.api_base import LeastReasoning, is_openai_hosted
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.endpoint import Endpoint, Timeouts
from monitor.probe.prompts import PromptSpec
from monitor.probe.proxy import DIRECT, ProxyEnvironment, route_for
from monitor.probe.runner import ProbeTarget
from monitor.probe.settings import PromptProfile, Provider, Target
from monitor.redact import mask_url, url_credentials


def ssl_option(*, verify: bool, ca_file: str | None) -> ssl.SSLContext | bool:
    if not verify:
        return False
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    return True


def endpoint_for(provider: Provider, proxies: ProxyEnvironment) -> Endpoint:
    timeouts = provider.timeout_s
    proxy = route_for(provider.base_url, provider.proxy, proxies)
    return Endpoint(
        base_url=provider.base_url,
        flavor=FLAVORS[provider.api],
        api_key=provider.secret(),
        headers=dict(provider.headers),
        timeouts=Timeouts(connect=timeouts.connect, first_token=timeouts.first_token, total=timeouts.total),
        ssl=ssl_option(verify=provider.tls.verify, ca_file=str(provider.tls.ca_file) if provider.tls.ca_file else None),
        secrets=(*provider.secrets(), *proxies.secrets()),
        follow_redirects=provider.follow_redirects,
        proxy=proxy,
    )


def least_reasoning(reasoning: str, effort: str | None, *, base_url: str) -> LeastReasoning | None:
    if reasoning != "least":
        return None
    return LeastReasoning(effort=effort, openai_hosted=is_openai_hosted(base_url))


def request_params(target: Target, provider: Provider) -> RequestParams:
    return RequestParams(
        model=target.model,
        max_tokens=target.params.max_tokens,
        temperature=target.params.temperature,
        extra_body=dict(target.params.extra_body),
        include_usage=provider.include_usage,
        least_reasoning=least_reasoning(
            target.params.reasoning, target.params.reasoning_effort, base_url=provider.base_url
        ),
    )


class Endpoints:
    """One Endpoint per provider, built once: SSL contexts are costly to create per request."""

    def __init__(self, config: Config, *, proxies: ProxyEnvironment) -> None:
        self._config = config
        self._proxies = proxies
        self._built: dict[str, Endpoint] = {}

    def target(self, name: str) -> ProbeTarget:
        target = self._config.targets[name]
        provider = self._config.providers[target.provider]
        endpoint = self._built.get(target.provider)
        if endpoint is None:
            endpoint = self._built[target.provider] = endpoint_for(provider, self._proxies)
        return ProbeTarget(
            name=name,
            provider=target.provider,
            endpoint=endpoint,
            params=request_params(target, provider),
            canary=target.canary,
        )

    def targets(self, names: Iterable[str]) -> tuple[ProbeTarget, ...]:
        return tuple(self.target(name) for name in names)


def prompt_spec(name: str, profile: PromptProfile, *, primed: bool = False) -> PromptSpec:
    return PromptSpec(
        name=name,
        tokens=profile.tokens,
        language=profile.language,
        cache=profile.cache,
        tool_call=profile.tool_call,
        primed=primed,
    )


def adhoc_target(
    *,
    url: str,
    api: str,
    model: str,
    api_key: str | None,
    max_tokens: int,
    extra_body: dict[str, Any],
    include_usage: bool,
    timeouts: Timeouts,
    reasoning: str = "default",
    reasoning_effort: str | None = None,
    verify: bool = True,
    ca_file: str | None = None,
    proxies: ProxyEnvironment | None = None,
) -> ProbeTarget:
    proxies = proxies if proxies is not None else ProxyEnvironment()
    secrets = (*url_credentials(url), *proxies.secrets())
    endpoint = Endpoint(
        base_url=url.rstrip("/"),
        flavor=FLAVORS[api],
        api_key=api_key,
        timeouts=timeouts,
        ssl=ssl_option(verify=verify, ca_file=ca_file),
        secrets=secrets,
        proxy=route_for(url, DIRECT, proxies),
    )
    params = RequestParams(
        model=model,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body=extra_body,
        include_usage=include_usage,
        least_reasoning=least_reasoning(reasoning, reasoning_effort, base_url=url),
    )
    # The URL names the provider in tables, metrics and the database: never with its credentials.
    provider = mask_url(url, (api_key, *secrets))
    return ProbeTarget(name=model, provider=provider, endpoint=endpoint, params=params)
