"""The [tracing] table of the configuration file (docs/tracing.md):

[tracing]
enabled = true                               # default false: no span, no OpenTelemetry loaded
otlp_endpoint = "http://collector:4317"      # OTLP/gRPC; https:// for TLS
service_name = "apiary"
sample_ratio = 0.1                           # of new traces; a caller's decision is followed
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, Final

from apiary.errors import ValidationError
from apiary.server.config.values import typed_fields
from apiary.server.tracing.settings import TracingSettings

_TYPES: Final[dict[str, type]] = {
    "enabled": bool,
    "otlp_endpoint": str,
    "service_name": str,
    "sample_ratio": float,
}
_NEEDS: Final = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc")
"""What enabled tracing imports: the `tracing` extra (pip install 'apiary[tracing]')."""


def tracing_settings(values: Mapping[str, Any], source: str) -> TracingSettings:
    """TracingSettings from the [tracing] table; errors name the setting and `source`."""
    changes = typed_fields(values, _TYPES, "tracing.", source)
    settings = TracingSettings(**changes)
    endpoint = settings.otlp_endpoint
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ValidationError(
            f"{source}: tracing.otlp_endpoint must be an http:// or https:// URL "
            f"(the collector's OTLP/gRPC port, e.g. http://localhost:4317), not {endpoint!r}",
            {"field": "tracing.otlp_endpoint"},
        )
    if not settings.service_name.strip():
        raise ValidationError(
            f"{source}: tracing.service_name must not be empty", {"field": "tracing.service_name"}
        )
    if not 0.0 <= settings.sample_ratio <= 1.0:
        raise ValidationError(
            f"{source}: tracing.sample_ratio must be between 0 and 1, not {settings.sample_ratio}",
            {"field": "tracing.sample_ratio"},
        )
    if settings.enabled:
        missing = [name for name in _NEEDS if not _importable(name)]
        if missing:
            raise ValidationError(
                f"{source}: tracing.enabled needs the OpenTelemetry SDK and its OTLP exporter "
                f"({', '.join(missing)} missing): pip install 'apiary[tracing]'",
                {"field": "tracing.enabled"},
            )
    return settings


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
