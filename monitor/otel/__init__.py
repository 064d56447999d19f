"""OpenTelemetry export: every probe as GenAI telemetry over OTLP (docs/opentelemetry.md).

`settings` (the `otel:` config section and the standard `OTEL_*` variables, resolved by a pure
function) and `semconv` (a sample's attributes, pure) import no SDK; `export` does, and is imported
only when export is on, from the optional extra `ttft-monitor[otel]`.
"""
