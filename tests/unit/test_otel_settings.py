"""The `otel:` section and the standard OTEL_* variables, resolved (pure), and the conventions' names."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config.loader import load_config
from monitor.otel import semconv
from monitor.otel.settings import OtelConfig, OtelSettingsError, read_header_files, resolve
from monitor.probe.result import ErrorClass, Sample

BASE = "http://collector:4318"


@pytest.mark.parametrize(
    ("config", "environ", "metrics", "traces", "logs"),
    [
        ({}, {}, None, None, None),
        ({"endpoint": BASE}, {}, f"{BASE}/v1/metrics", None, f"{BASE}/v1/logs"),
        ({"endpoint": BASE + "/", "traces": True}, {}, f"{BASE}/v1/metrics", f"{BASE}/v1/traces", f"{BASE}/v1/logs"),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}, f"{BASE}/v1/metrics", None, f"{BASE}/v1/logs"),
        # A per-signal URL is used as given, and wins over the general one for its signal.
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9/x"},
            "http://m:9/x",
            None,
            f"{BASE}/v1/logs",
        ),
        ({}, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:9/x"}, "http://m:9/x", None, None),
        # The config wins over the environment.
        (
            {"endpoint": BASE, "logs": False},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:1"},
            f"{BASE}/v1/metrics",
            None,
            None,
        ),
        # Only logs configured in the environment: incidents are exported, metrics are not.
        ({}, {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://l:1/v1/logs"}, None, None, "http://l:1/v1/logs"),
        # OTEL_{SIGNAL}_EXPORTER=none turns that signal off; otlp is the default and keeps it.
        (
            {"endpoint": BASE, "traces": True},
            {"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "otlp"},
            None,
            f"{BASE}/v1/traces",
            f"{BASE}/v1/logs",
        ),
        ({"endpoint": BASE}, {"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}, None, None, None),
        ({"endpoint": BASE}, {"OTEL_SDK_DISABLED": "true"}, None, None, None),
    ],
)
def test_export_is_on_where_an_endpoint_is_set(
    config: dict, environ: dict, metrics: str | None, traces: str | None, logs: str | None
) -> None:
    resolved = resolve(OtelConfig(**config), environ)
    if metrics is None and traces is None and logs is None:
        assert resolved is None
        return
    assert resolved is not None and resolved.on
    assert resolved.endpoints == {"metrics": metrics, "traces": traces, "logs": logs}


def test_each_signal_takes_its_own_timeout_from_the_environment_and_the_config_wins_for_all() -> None:
    environ = {"OTEL_EXPORTER_OTLP_TIMEOUT": "4000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "1500"}
    resolved = resolve(OtelConfig(endpoint=BASE, traces=True), environ)
    assert resolved is not None
    assert (resolved.timeout_for("metrics"), resolved.timeout_for("traces"), resolved.timeout_for("logs")) == (
        1.5,
        4.0,
        4.0,
    )
    assert resolved.close_bound_s == 1.5 + 4.0 + 4.0 + 1
    configured = resolve(OtelConfig(endpoint=BASE, timeout_s=2), environ)
    assert configured is not None and configured.timeout_for("metrics") == 2.0 == configured.timeout_for("logs")
    with pytest.raises(OtelSettingsError, match="OTEL_EXPORTER_OTLP_LOGS_TIMEOUT"):
        resolve(OtelConfig(endpoint=BASE), {"OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "soon"})


def test_an_exporter_other_than_otlp_or_none_is_refused_by_name() -> None:
    with pytest.raises(OtelSettingsError, match=r"OTEL_METRICS_EXPORTER='prometheus'.*otlp.*none"):
        resolve(OtelConfig(endpoint=BASE), {"OTEL_METRICS_EXPORTER": "prometheus"})


def test_headers_merge_config_over_per_signal_over_general_and_all_are_secrets() -> None:
    resolved = resolve(
        OtelConfig(endpoint=BASE, headers={"x-team": "from-config"}),
        {
            "OTEL_EXPORTER_OTLP_HEADERS": "x-team=general,authorization=Bearer%20abc",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-scope=metrics",
        },
        file_headers={"x-file": "from-file"},
    )
    assert resolved is not None
    assert resolved.headers["metrics"] == {
        "x-team": "from-config",
        "authorization": "Bearer abc",
        "x-scope": "metrics",
        "x-file": "from-file",
    }
    assert "x-scope" not in resolved.headers["logs"]
    assert set(resolved.secrets) == {"from-config", "Bearer abc", "metrics", "from-file"}


def test_timeouts_and_intervals_from_the_environment_are_milliseconds() -> None:
    resolved = resolve(
        OtelConfig(endpoint=BASE),
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_METRIC_EXPORT_INTERVAL": "15000"},
    )
    assert resolved is not None
    assert (resolved.timeout_s, resolved.export_interval_s) == (2.5, 15.0)
    configured = resolve(
        OtelConfig(endpoint=BASE, timeout_s=1, export_interval_s=5), {"OTEL_EXPORTER_OTLP_TIMEOUT": "9"}
    )
    assert configured is not None
    assert (configured.timeout_s, configured.export_interval_s) == (1, 5)


def test_resource_attributes_and_service_name() -> None:
    resolved = resolve(
        OtelConfig(endpoint=BASE, resource_attributes={"deployment.environment.name": "prod"}),
        {"OTEL_RESOURCE_ATTRIBUTES": "service.namespace=llm,deployment.environment.name=dev", "OTEL_SERVICE_NAME": "x"},
        service_version="1.2",
    )
    assert resolved is not None
    assert resolved.resource == {
        "service.namespace": "llm",
        "deployment.environment.name": "prod",
        "service.name": "x",
        "service.version": "1.2",
    }


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTLP protocol 'grpc' is not supported; set otel.protocol"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a number of milliseconds"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "Bearer hunter2"}, "OTEL_EXPORTER_OTLP_HEADERS: an entry is not key=value"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_and_never_quoting_a_header(environ: dict, message: str) -> None:
    with pytest.raises(OtelSettingsError) as caught:
        resolve(OtelConfig(endpoint=BASE), environ)
    assert str(caught.value).startswith(message)
    assert "hunter2" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_environment_endpoint_that_is_no_url_is_refused() -> None:
    with pytest.raises(OtelSettingsError, match="the OTLP metrics endpoint from the environment"):
        resolve(OtelConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})


def test_header_files_are_read_and_a_missing_one_names_its_key(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("file-secret\n")
    assert read_header_files({"x-key": tmp_path / "key"}) == {"x-key": "file-secret"}
    with pytest.raises(OtelSettingsError, match=r"^otel.header_files.x-key: secret file .* does not exist"):
        read_header_files({"x-key": tmp_path / "missing"})


def test_the_config_section_masks_headers_and_refuses_unknown_keys_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text('otel: {endpoint: "http://c:4318", headers: {x-key: hunter2}}\n')
    config = load_config(path, environ={})
    assert config.otel.headers == {"x-key": "hunter2"}
    assert "hunter2" not in repr(config.otel) and "hunter2" not in str(config.model_dump())
    path.write_text('otel: {endpoint: "collector:4318", protocol: grpc}\n')
    from monitor.config.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    text = str(caught.value)
    assert "otel.endpoint" in text and "otel.protocol" in text and "Traceback" not in text


@pytest.mark.parametrize(
    ("api", "url", "provider", "operation"),
    [
        ("openai-chat", "https://api.openai.com/v1", "openai", "chat"),
        ("openai-chat", "https://my-res.openai.azure.com/openai", "azure.ai.openai", "chat"),
        ("openai-chat", "http://vllm:8000/v1", "openai", "chat"),
        ("openai-completions", "http://sglang:30000/v1", "openai", "text_completion"),
        ("openai-responses", "https://api.openai.com/v1", "openai", "chat"),
        ("openai-chat", "https://api.deepseek.com/v1", "deepseek", "chat"),
        ("anthropic-messages", "https://api.anthropic.com/v1", "anthropic", "chat"),
        ("gemini", "https://generativelanguage.googleapis.com/v1beta", "gcp.gemini", "generate_content"),
        ("gemini", "https://europe-west4-aiplatform.googleapis.com/v1", "gcp.vertex_ai", "generate_content"),
        ("gemini", "http://gateway:8080/v1beta", "gcp.gen_ai", "generate_content"),
    ],
)
def test_provider_and_operation_names_are_the_conventions_well_known_values(
    api: str, url: str, provider: str, operation: str
) -> None:
    attrs = semconv.Endpoint(api=api, base_url=url).attributes()
    assert attrs["gen_ai.provider.name"] == provider
    assert attrs["gen_ai.operation.name"] == operation


def test_a_failed_sample_carries_its_error_class_and_never_its_message() -> None:
    sample = Sample(target="t", model="m", api="openai-chat", prompt="p", round=0)
    sample.error = ErrorClass.RATE_LIMITED
    sample.error_message = "429 Too Many Requests for key sk-123"
    endpoint = semconv.Endpoint(api="openai-chat", base_url="https://api.openai.com/v1")
    attrs = semconv.genai_attributes(sample, endpoint.attributes())
    assert attrs["error.type"] == "rate_limited"
    assert attrs["server.port"] == 443
    assert not any("sk-123" in str(v) for v in attrs.values())


def test_credentials_in_an_endpoint_url_are_secrets_too() -> None:
    resolved = resolve(OtelConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:pa55word@otlp.example.com"})
    assert resolved is not None
    assert "pa55word" in resolved.secrets


def test_the_aggregation_buckets_upper_inclusive_and_delta_starts_again() -> None:
    from monitor.otel.aggregate import Aggregates, Instrument, key_of

    agg = Aggregates(
        [Instrument("h", "histogram", "s", "", (0.1, 1.0)), Instrument("c", "counter", "1", "")], start_ns=1
    )
    key = key_of({"b": 2, "a": "x"})
    assert key == (("a", "x"), ("b", 2))
    for value in (0.1, 0.5, 1.0, 3.0):
        agg.record("h", key, value)
    agg.add("c", key, 2)
    snap = agg.snapshot(now_ns=5, delta=True)
    state = snap.histograms["h"][key]
    assert (state.counts, state.count, state.min, state.max) == ([1, 2, 1], 4, 0.1, 3.0)
    assert state.sum == pytest.approx(4.6)
    assert snap.counters["c"][key] == 2 and (snap.start_ns, snap.end_ns) == (1, 5)
    after = agg.snapshot(now_ns=9, delta=True)
    assert after.points() == 0 and after.start_ns == 5


def test_recording_many_values_at_once_is_recording_each() -> None:
    from monitor.otel.aggregate import Aggregates, Instrument, key_of

    bounds = (0.01, 0.02, 0.04)
    one, many = (Aggregates([Instrument("h", "histogram", "s", "", bounds)], start_ns=1) for _ in range(2))
    key = key_of({"a": 1})
    gaps_ms = (5.0, 10.0, 30.0, 12.5, 100.0, 40.0)
    for gap in gaps_ms:
        one.record("h", key, gap / 1000)
    many.record_many("h", key, gaps_ms[:2], scale=1e-3)
    many.record_many("h", key, gaps_ms[2:], scale=1e-3)
    many.record_many("h", key, (), scale=1e-3)  # a single-token answer: nothing
    a = one.snapshot(now_ns=2, delta=False).histograms["h"][key]
    b = many.snapshot(now_ns=2, delta=False).histograms["h"][key]
    assert (b.counts, b.count, b.min, b.max) == (a.counts, a.count, a.min, a.max) == ([2, 1, 2, 1], 6, 0.005, 0.1)
    assert b.sum == pytest.approx(a.sum)


def test_otlp_sessions_follow_the_proxy_policy() -> None:
    from monitor.otel.export import otlp_session
    from monitor.probe.proxy import ProxyEnvironment

    environment = ProxyEnvironment.from_environ(
        {
            "HTTPS_PROXY": "http://proxy.internal:3128",
            "HTTP_PROXY": "http://proxy.internal:3128",
            "NO_PROXY": "otel.lan",
        }
    )
    remote = otlp_session("https://collector.example:4318/v1/metrics", environment)
    assert remote.trust_env is False  # requests' own reading of the environment would proxy loopback
    assert remote.proxies == {"http": "http://proxy.internal:3128", "https": "http://proxy.internal:3128"}
    assert otlp_session("http://127.0.0.1:4318/v1/metrics", environment).proxies == {}
    assert otlp_session("http://[::1]:4318/v1/metrics", environment).proxies == {}
    assert otlp_session("http://otel.lan:4318/v1/metrics", environment).proxies == {}
    assert otlp_session("http://collector.example:4318/v1/metrics", ProxyEnvironment()).proxies == {}


def test_every_exported_instrument_is_in_the_docs_table_with_its_kind_and_unit() -> None:
    from monitor.otel.export import instruments

    text = (Path(__file__).resolve().parents[2] / "docs" / "opentelemetry.md").read_text()
    section = text.split("## What is exported", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    for inst in instruments((0.1, 1.0)):
        # A row may list siblings after the first full name: `ttft_monitor.detector.baseline`, `.run_median`.
        leaf = "`." + inst.name.rsplit(".", 1)[1] + "`"
        row = next((r for r in rows if f"`{inst.name}`" in r or (leaf in r and inst.name.rsplit(".", 1)[0] in r)), None)
        assert row is not None, f"{inst.name} is exported but not in docs/opentelemetry.md, 'What is exported'"
        kind = {"counter": "counter", "histogram": "histogram", "gauge": "gauge"}[inst.kind]
        assert kind in row and f"`{inst.unit}`" in row, (inst.name, inst.kind, inst.unit, row)
