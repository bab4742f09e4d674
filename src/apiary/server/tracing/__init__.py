"""The coordinator's tracing (docs/tracing.md): the [tracing] table (`settings`), what the
coordinator asks of tracing (`server_tracing`), and, only when it is enabled, spans over the
OpenTelemetry SDK exported over OTLP (`otel`, which alone imports OpenTelemetry: with tracing
off the coordinator never loads it)."""
