"""One proxy policy for every outbound client (monitor.probe.proxy), against a real forward proxy on loopback.

The destinations use names under `.proxied.test`, which only the proxy resolves (to the loopback
servers): a request that skipped the proxy fails to resolve, one that took it arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from monitor.alert.model import HttpRequest
from monitor.alert.transport import Transport
from monitor.config.errors import ConfigError
from monitor.config.loader import load_config
from monitor.metrics.push import push_groups
from monitor.probe.apis import FLAVORS, RequestParams
from monitor.probe.client import Endpoint, ProbeClient, Timeouts
from monitor.probe.plan import Endpoints
from monitor.probe.proxy import ProxyEnvironment, ProxyRoute, ProxySettings, bypassed, route_for
from monitor.probe.result import ErrorClass, Sample
from monitor.probe.server_metrics import scrape
from tests.support.forward_proxy import ForwardProxy

PASSWORD = "proxy-pw-Zq81xKc0vT"
TIMEOUTS = Timeouts(connect=2, first_token=3, total=5)
PARAMS = RequestParams(model="m", max_tokens=8, temperature=0.0, extra_body={}, include_usage=True)


# ---------------------------------------------------------------- the policy, as a table


def settings(**kwargs: object) -> ProxySettings:
    return ProxySettings.model_validate(kwargs)


ENV = ProxyEnvironment.from_environ(
    {"HTTP_PROXY": "http://env-proxy:3128", "HTTPS_PROXY": "http://env-tls-proxy:3128", "NO_PROXY": ".corp,10.0.0.0/8"}
)


@pytest.mark.parametrize(
    ("url", "proxy", "environment", "expected"),
    [
        pytest.param("http://api.example.com/v1", None, ENV, "http://env-proxy:3128", id="http takes HTTP_PROXY"),
        pytest.param("https://api.example.com/v1", None, ENV, "http://env-tls-proxy:3128", id="https: HTTPS_PROXY"),
        pytest.param("http://127.0.0.1:8000/v1", None, ENV, None, id="loopback is never proxied"),
        pytest.param("http://localhost:8000/v1", settings(url="http://p:1"), ENV, None, id="nor localhost, even set"),
        pytest.param("http://[::1]:8000/v1", None, ENV, None, id="nor ::1"),
        pytest.param("http://vllm.corp:8000/v1", None, ENV, None, id="NO_PROXY domain suffix"),
        pytest.param("http://corp:8000/v1", None, ENV, None, id="NO_PROXY domain itself"),
        pytest.param("http://notcorp:8000/v1", None, ENV, "http://env-proxy:3128", id="NO_PROXY on name boundaries"),
        pytest.param("http://10.1.2.3:8000/v1", None, ENV, None, id="NO_PROXY CIDR"),
        pytest.param("http://a.b/v1", settings(url="http://cfg:8080"), ENV, "http://cfg:8080", id="configured wins"),
        pytest.param("http://a.b/v1", settings(environment=False), ENV, None, id="environment off: direct"),
        pytest.param("http://x.corp/", settings(url="http://cfg:8080"), ENV, None, id="NO_PROXY applies to configured"),
        pytest.param(
            "http://x.corp/", settings(url="http://cfg:8080", environment=False), ENV, "http://cfg:8080", id="unless"
        ),
        pytest.param("http://a.b:9/", settings(no_proxy=["a.b:9"]), ENV, None, id="own no_proxy with port"),
        pytest.param("http://a.b:8/", settings(no_proxy=["a.b:9"]), ENV, "http://env-proxy:3128", id="other port"),
        pytest.param("http://a.b/", None, ProxyEnvironment(), None, id="no environment: direct"),
    ],
)
def test_each_destination_is_routed_by_one_rule(
    url: str, proxy: ProxySettings | None, environment: ProxyEnvironment, expected: str | None
) -> None:
    route = route_for(url, proxy, environment)
    assert (route.url if route else None) == expected


def test_the_environment_lower_case_wins_credentials_leave_the_url_and_socks_is_ignored_with_a_reason() -> None:
    env = ProxyEnvironment.from_environ(
        {
            "http_proxy": "http://user:s3cret-pass@lower:3128",
            "HTTP_PROXY": "http://upper:3128",
            "HTTPS_PROXY": "socks5://s:1080",
            "no_proxy": "*",
        }
    )
    assert env.http == "http://user:s3cret-pass@lower:3128" and env.https is None
    assert [name for name, _ in env.ignored] == ["HTTPS_PROXY"] and "SOCKS" in env.ignored[0][1]
    assert "s3cret-pass" in env.secrets()
    assert route_for("http://a.b/", None, env) is None  # `*`
    route = route_for("http://a.b/", None, ProxyEnvironment(http=env.http))
    assert route == ProxyRoute("http://lower:3128", "user", "s3cret-pass", "environment HTTP_PROXY")
    assert "s3cret-pass" not in repr(route)


@pytest.mark.parametrize(
    ("host", "entries", "expected"),
    [("a.example.com", ["example.com"], True), ("a.example.com", [".example.com"], True),
     ("a.example.com", ["*.example.com"], True), ("example.community", ["example.com"], False),
     ("192.168.1.5", ["192.168.0.0/16"], True), ("192.168.1.5", ["192.168.1.6"], False),
     ("::1", ["::1"], True), ("host", ["HOST"], False)],
)  # fmt: skip
def test_no_proxy_entries_match_as_curl_and_go_match_them(host: str, entries: list[str], expected: bool) -> None:
    assert bypassed(host, 80, [e.lower() if e != "HOST" else e for e in entries]) is expected


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        ({"url": "socks5://p:1080"}, "SOCKS proxies are not supported"),
        ({"url": "http://p:1", "password_env": "PROXY_PASSWORD"}, "needs its username"),
        ({"username": "u", "password_env": "NOT_SET_ANYWHERE"}, "NOT_SET_ANYWHERE is not set"),
    ],
)
def test_a_bad_proxy_section_is_one_line_naming_the_key_and_the_fix(
    tmp_path: Path, proxy: dict[str, object], message: str
) -> None:
    path = write_config(tmp_path, "http://127.0.0.1:1/v1", proxy)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    text = str(caught.value)
    assert "providers.p.proxy" in text and message in text, text


# ---------------------------------------------------------------- real clients through a real proxy


def sse_handler() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("he", "llo"):
            delta = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Callable, *, ssl_context: ssl.SSLContext | None = None) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


def write_config(tmp_path: Path, base_url: str, proxy: dict[str, object] | None) -> Path:
    provider: dict[str, object] = {"base_url": base_url, "api": "openai-chat", "timeout_s": {"connect": 2}}
    if proxy is not None:
        provider["proxy"] = proxy
    config = {
        "providers": {"p": provider},
        "targets": {"t": {"provider": "p", "model": "m"}},
        "prompts": {"s": {"tokens": 128}},
        "jobs": [{"name": "j", "schedule": "* * * * *", "targets": ["t"], "prompts": ["s"]}],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    return path


async def probe_config(path: Path, environ: dict[str, str], *, rounds: int = 1) -> list[Sample]:
    config = load_config(path, environ=environ)
    target = Endpoints(config, proxies=ProxyEnvironment.from_environ(environ)).target("t")
    samples = []
    async with ProbeClient() as client:
        for index in range(rounds):
            sample = Sample(target="t", model="m", api="openai-chat", prompt="p", round=index + 1)
            samples.append(await client.probe(target.endpoint, target.params, "hi", sample))
    return samples


async def test_a_probe_through_a_configured_proxy_with_a_password_says_so_and_keeps_the_password_out(
    serve: Callable[..., Awaitable[int]], tmp_path: Path
) -> None:
    port = await serve(sse_handler())
    async with ForwardProxy(hosts={"llm.proxied.test": ("127.0.0.1", port)}, credentials=("monitor", PASSWORD)) as fp:
        proxy: dict[str, object] = {"url": fp.url, "username": "monitor", "password_env": "PROXY_PASSWORD"}
        path = write_config(tmp_path, f"http://llm.proxied.test:{port}/v1", proxy)
        samples = await probe_config(path, {"PROXY_PASSWORD": PASSWORD}, rounds=2)
        wrong = await probe_config(path, {"PROXY_PASSWORD": "not-the-password"})
    first, second = samples
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert first.via_proxy and second.via_proxy
    # The connect phase is the proxy's (a fresh connection to it), then the pooled one is reused.
    assert first.connection_reused is False and first.connect_ms is not None and second.connection_reused is True
    assert [r.method for r in fp.requests][:1] == ["POST"]
    assert fp.requests[0].target == f"http://llm.proxied.test:{port}/v1/chat/completions"
    [refused] = wrong
    assert refused.error is ErrorClass.AUTH and refused.via_proxy
    assert "407" in (refused.error_message or "") and "proxy.password_env" in (refused.error_message or "")
    config = load_config(path, environ={"PROXY_PASSWORD": PASSWORD})
    assert PASSWORD in config.providers["p"].secrets()
    for shown in (repr(config), config.model_dump_json(), json.dumps([s.as_dict() for s in [*samples, *wrong]])):
        assert PASSWORD not in shown


async def test_the_environment_proxy_is_honoured_no_proxy_skips_it_and_loopback_never_takes_it(
    serve: Callable[..., Awaitable[int]], tmp_path: Path
) -> None:
    port = await serve(sse_handler())
    async with ForwardProxy(hosts={"llm.proxied.test": ("127.0.0.1", port)}) as fp:
        named = write_config(tmp_path, f"http://llm.proxied.test:{port}/v1", None)
        [through] = await probe_config(named, {"HTTP_PROXY": fp.url})
        assert through.ok and through.via_proxy and len(fp.requests) == 1
        [skipped] = await probe_config(named, {"HTTP_PROXY": fp.url, "NO_PROXY": ".proxied.test"})
        assert skipped.error is ErrorClass.DNS and not skipped.via_proxy  # went direct, so nothing resolved it
        off = write_config(tmp_path, f"http://llm.proxied.test:{port}/v1", {"environment": False})
        [direct] = await probe_config(off, {"HTTP_PROXY": fp.url})
        assert direct.error is ErrorClass.DNS and not direct.via_proxy
        loopback = write_config(tmp_path, f"http://127.0.0.1:{port}/v1", {"url": fp.url})
        [local] = await probe_config(loopback, {"HTTP_PROXY": fp.url})
        assert local.ok and not local.via_proxy
        assert len(fp.requests) == 1  # only the first went through it


@pytest.fixture(scope="module")
def named_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=llm.proxied.test",
         "-addext", "subjectAltName=DNS:llm.proxied.test", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_https_goes_through_a_connect_tunnel_with_tls_to_the_server(
    serve: Callable[..., Awaitable[int]], named_cert: tuple[Path, Path]
) -> None:
    cert, key = named_cert
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    port = await serve(sse_handler(), ssl_context=server_ctx)
    async with ForwardProxy(hosts={"llm.proxied.test": ("127.0.0.1", port)}) as fp:
        url = f"https://llm.proxied.test:{port}/v1"
        endpoint = Endpoint(
            url,
            FLAVORS["openai-chat"],
            timeouts=TIMEOUTS,
            ssl=ssl.create_default_context(cafile=str(cert)),
            proxy=route_for(url, None, ProxyEnvironment.from_environ({"HTTPS_PROXY": fp.url})),
        )
        async with ProbeClient() as client:
            sample = await client.probe(endpoint, PARAMS, "hi", Sample("t", "m", "openai-chat", "p", 1))
    assert sample.ok and sample.via_proxy, sample.error_message
    assert [(r.method, r.target) for r in fp.requests] == [("CONNECT", f"llm.proxied.test:{port}")]
    assert sample.connect_ms is not None and sample.tls_ms is not None  # to the proxy; TLS through the tunnel


async def test_a_loopback_receiver_is_never_sent_through_the_environment_proxy(
    serve: Callable[..., Awaitable[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(text="ok")

    port = await serve(hook)
    hosts = {"hooks.proxied.test": ("127.0.0.1", port)}
    async with ForwardProxy(answer_502=True) as bad, ForwardProxy(hosts=hosts) as fp:
        monkeypatch.setenv("HTTP_PROXY", bad.url)
        monkeypatch.setenv("http_proxy", bad.url)
        async with Transport(proxies=ProxyEnvironment.from_environ(os.environ)) as transport:
            local = await transport.send(HttpRequest("POST", f"http://127.0.0.1:{port}/hook", body=b"a"), timeout_s=3)
            named = await transport.send(
                HttpRequest("POST", f"http://hooks.proxied.test:{port}/hook", body=b"b"),
                timeout_s=3,
                proxy=ProxySettings(url=fp.url),
            )
    assert local.ok and local.status == 200, local.describe()
    assert named.ok and named.status == 200, named.describe()
    assert bad.requests == [] and [r.target for r in fp.requests] == [f"http://hooks.proxied.test:{port}/hook"]
    assert received == [b"a", b"b"]


async def test_the_pushgateway_push_and_a_server_metrics_scrape_follow_the_environment_proxy(
    serve: Callable[..., Awaitable[int]],
) -> None:
    pushed: list[str] = []

    async def gateway(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(text='vllm:num_requests_waiting{model_name="m"} 3\n')
        pushed.append(request.path)
        await request.read()
        return web.Response(status=200)

    port = await serve(gateway)
    registry = CollectorRegistry()
    Counter("pushed_things", "x", registry=registry).inc()
    async with ForwardProxy(hosts={"push.proxied.test": ("127.0.0.1", port)}) as fp:
        proxies = ProxyEnvironment.from_environ({"HTTP_PROXY": fp.url})
        gateway_url = f"http://push.proxied.test:{port}"
        [result] = await push_groups(gateway_url, registry, location="here", jobs={"j": set()}, proxies=proxies)
        async with aiohttp.ClientSession() as session:
            metrics_url = f"http://push.proxied.test:{port}/metrics"
            reading = await scrape(session, metrics_url, proxy=route_for(metrics_url, None, proxies))
            unproxied = await scrape(session, metrics_url)
    assert result.ok, result.answer
    assert pushed == ["/metrics/job/ttft-monitor/probe_job/j/location/here"]
    assert isinstance(reading, dict) and "vllm:num_requests_waiting" in reading
    assert isinstance(unproxied, str)  # the name resolves only through the proxy
    assert [r.method for r in fp.requests] == ["PUT", "GET"]
    await asyncio.sleep(0)
