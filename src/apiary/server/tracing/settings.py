"""The [tracing] table's settings (docs/tracing.md)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SERVICE_NAME = "apiary"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """[tracing]: spans exported over OTLP/gRPC when `enabled` (off by default)."""

    enabled: bool = False
    otlp_endpoint: str = ""
    """The collector, `http://host:4317` (plain) or `https://host:4317` (TLS); empty:
    OpenTelemetry's default (OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4317)."""
    service_name: str = DEFAULT_SERVICE_NAME
    """The spans' `service.name` resource attribute."""
    sample_ratio: float = 1.0
    """The share of new traces recorded (0 to 1); a trace a caller started follows the
    caller's sampling decision (its traceparent's flag)."""
