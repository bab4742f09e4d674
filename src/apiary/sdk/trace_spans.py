"""The SDK's spans over OpenTelemetry's API (docs/tracing.md), imported by `sdk/tracing.py`
only when they are needed: it loads OpenTelemetry."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from apiary import __version__
from apiary.core.trace_context import TraceContext

_PROPAGATOR = TraceContextTextMapPropagator()


def current_context() -> TraceContext | None:
    """The current span's context as the W3C headers carry it; None without a valid one."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    # What the propagator would inject, without its cost (every call asks).
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state
    return TraceContext(parent, state.to_header() if state else "")


def _fail(span: Span, code: str, note: str) -> None:
    span.set_attribute("apiary.error_code", code)
    span.set_status(Status(StatusCode.ERROR, f"{code}: {note}" if note else code))


def fail_current_span(code: str, note: str = "") -> None:
    """Mark the current span failed with protocol error `code`, if it records."""
    span = trace.get_current_span()
    if span.is_recording():
        _fail(span, code, note)


class AgentSpan:
    """A span of an agent's work on a delivery, a child of the context it carried."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    @classmethod
    def start(
        cls, parent: TraceContext, name: str, attributes: Mapping[str, str | int | bool]
    ) -> AgentSpan:
        tracer = trace.get_tracer("apiary.sdk", __version__)
        context = _PROPAGATOR.extract(parent.headers(), context=Context())
        return cls(
            tracer.start_span(name, context=context, kind=SpanKind.CONSUMER, attributes=attributes)
        )

    def within(self) -> AbstractContextManager[Span]:
        """The span current for the block (not ended at its end)."""
        return trace.use_span(self._span, end_on_exit=False)

    def fail(self, code: str, note: str = "") -> None:
        """Mark the work failed with protocol error `code`."""
        _fail(self._span, code, note)

    def end(self) -> None:
        self._span.end()


@contextmanager
def continued_span(
    parent: TraceContext, name: str, attributes: Mapping[str, str | int | bool]
) -> Iterator[AgentSpan]:
    """An `AgentSpan` current for the block, ended at its end (an exception that escapes it
    is recorded)."""
    span = AgentSpan.start(parent, name, attributes)
    try:
        with span.within():
            yield span
    finally:
        span.end()
