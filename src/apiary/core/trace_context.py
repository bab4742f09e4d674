"""W3C trace context (https://www.w3.org/TR/trace-context/) as Apiary carries it: the two
header values, kept as text from where they arrive (gRPC metadata, HTTP headers, the
apiary.v1 carrier fields) to where they go (docs/tracing.md).

Parsing and span making are OpenTelemetry's, at the edges (server/tracing/, sdk/tracing.py):
an invalid value is ignored there, as the W3C recommendation asks (the trace restarts), never
refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from apiary.core.value import value

TRACEPARENT: Final = "traceparent"
"""The header (and gRPC metadata key) naming the parent span: version-trace_id-span_id-flags."""
TRACESTATE: Final = "tracestate"
"""The header carrying vendors' trace state alongside `traceparent`."""


@value
class TraceContext:
    """A span's context as the W3C headers carry it."""

    traceparent: str
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        """The 32 hex digits of the trace ("" when `traceparent` is not version 00's form)."""
        parts = self.traceparent.split("-")
        return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""

    @property
    def span_id(self) -> str:
        """The 16 hex digits of the parent span ("" as for `trace_id`)."""
        parts = self.traceparent.split("-")
        return parts[2] if len(parts) == 4 and len(parts[2]) == 16 else ""

    def headers(self) -> dict[str, str]:
        """The context as headers (or metadata): `tracestate` only when there is one."""
        if self.tracestate:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self.tracestate}
        return {TRACEPARENT: self.traceparent}


def from_headers(headers: Mapping[str, str]) -> TraceContext | None:
    """The context `headers` (lower-case keys: gRPC metadata, HTTP headers) carry; None
    without a `traceparent`."""
    parent = headers.get(TRACEPARENT)
    if not parent:
        return None
    return TraceContext(parent, headers.get(TRACESTATE, ""))
