"""What the engine asks of tracing (docs/tracing.md): the trace context of the work in
progress, and spans of its own where work leaves a call's context (a task's dispatch).

The engine holds a `Tracing` only when the coordinator traces ([tracing] enabled): without
one it makes no span, reads no context and keeps none, so tracing off costs an `is None` per
place. The implementation over OpenTelemetry is the server's (server/tracing/); the engine
never imports OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from apiary.core.trace_context import TraceContext

Attributes = Mapping[str, str | int | bool]


class OpenSpan(Protocol):
    """A span started and not yet ended."""

    @property
    def context(self) -> TraceContext:
        """What envelopes sent as part of this span carry on."""
        ...

    def end(self, error_code: str = "", note: str = "") -> None:
        """End the span: failed with `error_code` (and `note`) when one is given."""
        ...


class Tracing(Protocol):
    def current(self) -> TraceContext | None:
        """The context of the span current in this task (an RPC's, say); None without one."""
        ...

    def annotate(self, attributes: Attributes) -> None:
        """Add `attributes` to the current span, if there is one."""
        ...

    def start(
        self, name: str, parent: TraceContext | None, attributes: Attributes, *, kind: str = ""
    ) -> OpenSpan:
        """A span named `name`, a child of `parent` (a new trace when it is None or not a
        valid context); `kind` "server" for work a client asked for, "" for internal work."""
        ...
